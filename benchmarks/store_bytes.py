"""Bytes per read-out token, layer and divergence kind: a JSONL sample store against Parquet (issue 13, item 4).

Generates a real sample store on the default model (``generate`` with every token read out at every layer, JSD
plus ``--also-divergences``), as JSONL — the store format before Parquet — and then writes the very same records
as Parquet stores, float32 (the default) and float16, through ``ShardWriter`` (zstd). For each store: the bytes of
the ``divergence`` values per token × layer (JSONL: the characters of the arrays; Parquet: the column chunks'
compressed size), and the whole store's bytes per generated token.

    python benchmarks/store_bytes.py --questions 4 --pool 4 --max-new-tokens 96 --out docs/benchmarks/store_bytes.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import pyarrow.parquet as pq


def column_bytes(store: Path, *columns: str) -> int:
    """The compressed bytes of ``columns`` (top-level names) in a Parquet store's shards."""
    total = 0
    for shard in store.glob("part-*.parquet"):
        meta = pq.ParquetFile(shard).metadata
        for g in range(meta.num_row_groups):
            group = meta.row_group(g)
            for c in range(group.num_columns):
                chunk = group.column(c)
                if chunk.path_in_schema.split(".")[0] in columns:
                    total += chunk.total_compressed_size
    return total


def _store_bytes(path: Path) -> int:
    """A store's bytes: a JSONL file and its manifest, or a Parquet store directory."""
    if path.is_file():
        from depthlens.stores.files import manifest_path

        return path.stat().st_size + manifest_path(path).stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--task", default="reasoning_gym:chain_sum")
    parser.add_argument("--questions", type=int, default=4)
    parser.add_argument("--pool", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--also", default="kl,cosine", help="further divergence kinds stored beside JSD")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    from depthlens.config import GenerateRun, ReadoutConfig, SamplingConfig, StoreSpec
    from depthlens.evals.loading import load_task
    from depthlens.models.load import load
    from depthlens.stores.samples import SAMPLES, iter_samples, samples_path
    from depthlens.stores.shard_writer import ShardWriter
    from depthlens.studies.generate import generate

    lm = load(args.model, device="cpu")
    tmp = Path(tempfile.mkdtemp(prefix="store-bytes-"))
    questions = load_task(args.task, args.questions, seed=0)
    also = tuple(k for k in args.also.split(",") if k)
    run = GenerateRun(
        StoreSpec(tmp / "jsonl", format="jsonl"),
        pool=args.pool,
        batch_size=args.pool,
        sampling=SamplingConfig(max_new_tokens=args.max_new_tokens, readout_tokens=None),
        readout=ReadoutConfig(also=also),
    )
    generate(lm, run, questions)
    records = list(iter_samples(tmp / "jsonl"))
    manifest = json.loads((tmp / "jsonl" / f"{SAMPLES}.manifest.json").read_text())
    for width in ("float32", "float16"):
        store = {"format": "parquet", "float16": width == "float16"}
        with ShardWriter(
            tmp / width, {**manifest, "store": store}, resume=False, shard_rows=args.pool
        ) as writer:
            for record in records:
                writer.write(record)
    tokens = sum(r["token_count"] for r in records)
    cells = tokens * lm.n_layers
    json_cells = sum(len(json.dumps(r["divergence"])) for r in records)
    result = {
        "model": args.model,
        "layers": lm.n_layers,
        "task": args.task,
        "responses": len(records),
        "generated_tokens": tokens,
        "divergence_kinds": ["jsd", *also],
        "divergence_bytes_per_token_layer": {
            "jsonl": round(json_cells / cells, 2),
            "parquet_float32": round(column_bytes(tmp / "float32", "divergence") / cells, 2),
            "parquet_float16": round(column_bytes(tmp / "float16", "divergence") / cells, 2),
        },
        "store_bytes_per_generated_token": {
            "jsonl": round(_store_bytes(samples_path(tmp / "jsonl", "jsonl")) / tokens, 1),
            "parquet_float32": round(_store_bytes(tmp / "float32") / tokens, 1),
            "parquet_float16": round(_store_bytes(tmp / "float16") / tokens, 1),
        },
    }
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()

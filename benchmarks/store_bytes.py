"""Bytes per read-out token per layer per divergence kind: JSONL against Parquet float32 / float16 (issue 13, item 4).

Scores N records of T completion tokens with ``--tokens`` on the real default model into JSONL, a float32 and a
float16 Parquet store, and divides the divergence column's stored size by T × L (JSONL: the characters of the
``divergence`` arrays, 6 decimals; Parquet: the column chunks' compressed size, zstd).

    python benchmarks/store_bytes.py --records 8 --tokens 64 --out docs/benchmarks/store_bytes.json
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
from pathlib import Path

import pyarrow.parquet as pq


def _column_bytes(store: Path, column: str) -> int:
    total = 0
    for shard in store.glob("part-*.parquet"):
        meta = pq.ParquetFile(shard).metadata
        for g in range(meta.num_row_groups):
            group = meta.row_group(g)
            for c in range(group.num_columns):
                chunk = group.column(c)
                if chunk.path_in_schema.split(".")[0] == column:
                    total += chunk.total_compressed_size
    return total


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--records", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    from depthlens.models.load import load
    from depthlens.studies.records import iter_jsonl
    from depthlens.studies.score import score_file

    lm = load(args.model, device="cpu")
    rng = random.Random(0)
    vocab = len(lm.tokenizer)
    tmp = Path(tempfile.mkdtemp(prefix="store-bytes-"))
    src = tmp / "in.jsonl"
    src.write_text("".join(json.dumps({"id": f"r{i}", "prompt_ids": [rng.randrange(3, vocab) for _ in range(16)],
                                       "completion_ids": [rng.randrange(3, vocab) for _ in range(args.tokens)]})
                           + "\n" for i in range(args.records)))  # fmt: skip
    score_file(lm, src, tmp / "s.jsonl", tokens=True)
    score_file(lm, src, tmp / "f32", tokens=True, float16=False)
    score_file(lm, src, tmp / "f16", tokens=True, float16=True)
    cells = args.records * args.tokens * lm.n_layers
    json_bytes = sum(len(json.dumps(r["divergence"])) for r in iter_jsonl(tmp / "s.jsonl"))
    result = {
        "model": args.model, "layers": lm.n_layers, "records": args.records, "tokens": args.tokens,
        "json_bytes_per_cell": json_bytes / cells,
        "parquet_float32_bytes_per_cell": _column_bytes(tmp / "f32", "divergence") / cells,
        "parquet_float16_bytes_per_cell": _column_bytes(tmp / "f16", "divergence") / cells,
        "whole_file_bytes": {"jsonl": (tmp / "s.jsonl").stat().st_size,
                             "parquet_float32": sum(p.stat().st_size for p in (tmp / "f32").glob("*.parquet")),
                             "parquet_float16": sum(p.stat().st_size for p in (tmp / "f16").glob("*.parquet"))},
    }  # fmt: skip
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()

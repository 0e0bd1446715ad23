"""What a reader's verification costs (issue 41): reading a whole Parquet store through ``iter_store`` — every
page's CRC checked, every ranged column range-checked (``stores.validate``) — against the same read without them
(``iter_store`` with both switched off, as readers read before).

The store is shaped like a sample store's responses: ``--shards`` shards of ``--rows`` responses, ``--tokens``
read-out tokens each with ``[tokens × layers]`` float32 JSD rows and the per-token floats. Medians over
``--repeats`` reads (the files in the page cache: the cost measured is the checking, not the disk).

    python benchmarks/store_verify.py --shards 8 --rows 16 --tokens 128 --layers 30 --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from depthlens.stores import layout
from depthlens.stores.parquet import iter_store
from depthlens.stores.shard_writer import ShardWriter
from depthlens.stores.validate import bounds, table_fault


def _records(rng: np.random.Generator, first: int, rows: int, tokens: int, layers: int) -> list[dict]:
    return [
        {
            "id": f"q#{first + i}",
            "token_count": tokens,
            "token_ids": rng.integers(0, 49152, tokens).tolist(),
            "log_prob": (-rng.random(tokens)).tolist(),
            "entropy": rng.random(tokens).tolist(),
            "divergence": rng.random((tokens, layers)).round(5).tolist(),
        }
        for i in range(rows)
    ]


def _unchecked(store: Path) -> int:
    """``iter_store`` as before issue 41: the same read with the page CRCs and range checks switched off."""
    import depthlens.stores.parquet as parquet

    def read_table(path: Path, fix: str) -> pa.Table:
        return pq.read_table(path)

    saved = parquet.table_fault, layout.read_table
    parquet.table_fault, layout.read_table = (lambda *_: None), read_table
    try:
        return sum(1 for _ in iter_store(store))
    finally:
        parquet.table_fault, layout.read_table = saved


def _median(read, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        read()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "store"
        manifest = {"n_layers": args.layers, "readout": {"divergence": "jsd"}}
        with ShardWriter(store, manifest, resume=False) as writer:
            for s in range(args.shards):
                for record in _records(rng, s * args.rows, args.rows, args.tokens, args.layers):
                    writer.write(record)
                writer.flush()
        plain = _median(lambda: _unchecked(store), args.repeats)
        verified = _median(lambda: sum(1 for _ in iter_store(store)), args.repeats)
        tables = [pq.read_table(p) for p in sorted(store.glob("part-*.parquet"))]
        ranges = bounds(manifest)
        ranged = _median(lambda: [table_fault(t, ranges) for t in tables], args.repeats)
        crc = _median(
            lambda: [pq.read_table(p, page_checksum_verification=True) for p in sorted(store.glob("part-*"))],
            args.repeats,
        )
        bare = _median(lambda: [pq.read_table(p) for p in sorted(store.glob("part-*"))], args.repeats)
    values = args.shards * args.rows * args.tokens * (args.layers + 3)
    print(
        f"{args.shards} shards × {args.rows} rows × {args.tokens} tokens × {args.layers} layers: {values:,} values"
    )
    print(f"iter_store without CRCs and ranges (before): {plain * 1e3:8.1f} ms")
    print(
        f"read through iter_store (CRC + ranges):     {verified * 1e3:8.1f} ms  ({verified / plain - 1:+.1%})"
    )
    print(f"  of which: page CRCs {max(crc - bare, 0) * 1e3:.1f} ms, range checks {ranged * 1e3:.1f} ms")


if __name__ == "__main__":
    main()

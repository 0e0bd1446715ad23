"""What a Parquet store's commit costs (issue 34): per shard, the whole commit through ``ShardWriter.write_table``
(encode, sha256, write + fsync under the hidden name, manifest write + fsync + rename + directory fsync, the
rename that publishes it), and, inside it, the sha256 of the shard's bytes; the write lock taken and released.

Shards are shaped like a generation batch of a sample store: ``--rows`` responses of ``--tokens`` read-out tokens
with ``[tokens × layers]`` float32 divergences and the per-token floats (random values: zstd cannot shrink them,
the worst case for bytes). Medians and the spread over ``--shards`` commits, repeated ``--repeats`` times.

    python benchmarks/store_commit.py --rows 16 --tokens 128 --layers 30 --shards 20 --repeats 3

Run it with another depthlens first on PYTHONPATH to time that one's commit (a depthlens from before the lock
reports no lock time).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np


def _records(rng: np.random.Generator, first: int, rows: int, tokens: int, layers: int) -> list[dict]:
    return [
        {
            "id": f"q#{first + i}",
            "token_count": tokens,
            "token_ids": rng.integers(0, 49152, tokens).tolist(),
            "log_prob": rng.random(tokens).tolist(),
            "entropy": rng.random(tokens).tolist(),
            "divergence": rng.random((tokens, layers)).round(5).tolist(),
        }
        for i in range(rows)
    ]


def _median(values: list[float]) -> str:
    return (
        f"{statistics.median(values) * 1e3:.2f} ms (min {min(values) * 1e3:.2f}, max {max(values) * 1e3:.2f})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--shards", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="Write the numbers as JSON here.")
    args = parser.parse_args()
    from depthlens.stores.parquet import to_table
    from depthlens.stores.shard_writer import ShardWriter

    try:
        from depthlens.stores.lock import store_lock
    except ImportError:  # a depthlens from before the lock (to compare its commit): nothing to time
        store_lock = None

    rng = np.random.default_rng(0)
    tables = [
        to_table(_records(rng, i * args.rows, args.rows, args.tokens, args.layers))
        for i in range(args.shards)
    ]
    commit, digest, lock, size = [], [], [], 0
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory(dir=".") as tmp:
            store = Path(tmp) / "store"
            with ShardWriter(store, {"benchmark": 1}, resume=False) as writer:
                for table in tables:
                    start = time.perf_counter()
                    writer.write_table(table)
                    commit.append(time.perf_counter() - start)
            for shard in sorted(store.glob("part-*.parquet")):
                data = shard.read_bytes()
                size = len(data)
                start = time.perf_counter()
                hashlib.sha256(data).hexdigest()
                digest.append(time.perf_counter() - start)
            for _ in range(args.shards if store_lock is not None else 0):
                start = time.perf_counter()
                with store_lock(store):
                    pass
                lock.append(time.perf_counter() - start)
    result = {
        "shard_bytes": size,
        "commit": _median(commit),
        "sha256": _median(digest),
        "lock": _median(lock) if lock else None,
        "settings": vars(args) | {"out": str(args.out)},
    }
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()

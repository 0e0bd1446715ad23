"""Per sample store, its compact per-response table (``depthlens.studies.compact``): model, task, question, text,
answer and grade under the store's rules and under the final-result fallback, length and depth — so that every
number of a study can be re-voted and re-tested without the model (docs/findings.md §6; docs/data/README.md).

Usage (from the repository, in its venv):
    python examples/compact_table.py runs/study docs/data           # one <model>-<task>.csv per store under runs/study
    python examples/compact_table.py runs/study docs/data --gzip    # .csv.gz instead

Then check a table: ``depthlens.studies.compact.table_one_from_rows(read_compact(path))`` gives Table 1's DTR and
token-count rows as `depthlens correlate` computed them from the store.
"""

from __future__ import annotations

import sys
from pathlib import Path

from depthlens.stores.samples import read_manifest
from depthlens.studies.compact import compact_rows, write_compact
from depthlens.studies.report import find_stores, slug
from depthlens.studies.stored import Store


def main(run_dir: Path, out_dir: Path, gzip: bool) -> None:
    for store in find_stores(run_dir):
        rows = compact_rows(store)
        name = slug(Store(store, read_manifest(store), [], 0)) + (".csv.gz" if gzip else ".csv")
        path = write_compact(rows, out_dir / name)
        right = sum(r["correct"] for r in rows)
        fallback = sum(r["correct_fallback"] for r in rows)
        print(
            f"{store}: {len(rows)} responses, right {right} (store's rules) / {fallback} (final-result) "
            f"→ {path} ({path.stat().st_size / 1e3:.0f} kB)"
        )


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--gzip"]
    if len(args) != 2:
        sys.exit(__doc__)
    main(Path(args[0]), Path(args[1]), "--gzip" in sys.argv[1:])

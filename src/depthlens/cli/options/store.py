"""Where a command reads and writes: inputs, stores, resuming, the formats, and Ray's actors."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from depthlens.cli.options.base import finite

__all__ = [
    "BlockRows", "Cpus", "ExportOut", "Float16", "Gpus", "InFile", "OptionalOutDir", "OutDir", "Overwrite",
    "OverwriteOut", "Quick", "Quiet", "RayAddress", "RayOpt", "ResultsOut", "ResultsStore", "Resume", "ResumeOut",
    "RunDir", "SampleStores", "SkipBad", "StoreArg", "StoreFormatOpt", "Stores", "StudyOut", "Verify", "Workers",
]  # fmt: skip

InFile = Annotated[
    Path,
    typer.Option(
        "--in",
        exists=True,
        readable=True,
        help="Input records, prompt/messages/prompt_ids + completion: JSONL, a .parquet file with those columns, "
        "or a Parquet store (e.g. a sample store's samples/).",
    ),
]
ResultsOut = Annotated[
    Path,
    typer.Option(
        "--out", help="Results store: a directory (sharded Parquet), or a file named *.jsonl (JSONL)."
    ),
]
OutDir = Annotated[Path, typer.Option("--out", file_okay=False, help="Store directory (created).")]
OptionalOutDir = Annotated[
    Path | None, typer.Option("--out", file_okay=False, help="Store directory (created).")
]
StudyOut = Annotated[Path, typer.Option("--out", file_okay=False, help="Directory for tables and figures.")]
ExportOut = Annotated[
    Path, typer.Option("--out", "-o", help="The JSONL file to write (its manifest beside it).")
]
Resume = Annotated[bool, typer.Option("--resume", help="Continue an interrupted store.")]
Overwrite = Annotated[bool, typer.Option("--overwrite", help="Replace an existing store.")]
ResumeOut = Annotated[bool, typer.Option("--resume", help="Continue an interrupted run into the same --out.")]
OverwriteOut = Annotated[bool, typer.Option("--overwrite", help="Replace an existing --out.")]
SkipBad = Annotated[
    bool, typer.Option("--skip-bad", help="Skip malformed or unusable records and list them.")
]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="No summary table at the end.")]
Float16 = Annotated[
    bool, typer.Option("--float16", help="Per-token floats as float16 in a Parquet store (default float32).")
]
StoreFormatOpt = Annotated[
    str | None,
    typer.Option(
        "--store",
        help="The responses' format: 'parquet' (sharded, the default for a new store) or 'jsonl'; a resumed "
        "store keeps its own.",
    ),
]
Verify = Annotated[
    bool, typer.Option("--verify", help="Also check every shard's sha256 against the store's manifest.")
]
Quick = Annotated[
    bool, typer.Option("--quick", help="Check sizes and row counts only, not every shard's sha256.")
]

# Stores named as arguments.
Stores = Annotated[
    list[Path], typer.Argument(help="Sample stores (or folders of them) from `depthlens generate`.")
]
RunDir = Annotated[Path, typer.Argument(help="A store, or a folder of stores, from `depthlens generate`.")]
StoreArg = Annotated[
    Path, typer.Argument(help="A sample store, a Parquet results store (directory) or a JSONL store.")
]
ResultsStore = Annotated[
    Path, typer.Argument(help="A results store: a Parquet store directory or a JSONL file.")
]
SampleStores = Annotated[
    list[Path], typer.Argument(file_okay=False, help="Sample store(s) written by generate or thinkn.")
]

# Ray (depthlens[ray]): `score --ray`, `generate --ray`, `thinkn --ray`.
RayOpt = Annotated[
    bool, typer.Option("--ray", help="Run on Ray actors into a Parquet store (needs depthlens[ray]).")
]
RayAddress = Annotated[
    str | None,
    typer.Option(
        "--ray-address",
        envvar="RAY_ADDRESS",
        help="Join this Ray cluster (implies --ray); without it --ray starts a local Ray on 127.0.0.1.",
    ),
]
Workers = Annotated[int, typer.Option(min=1, help="Ray actors, each holding the model once.")]
Cpus = Annotated[
    float, typer.Option(min=0.01, callback=finite, help="CPUs per Ray actor (its torch threads).")
]
Gpus = Annotated[
    float, typer.Option(min=0.0, callback=finite, help="GPUs per Ray actor (1: one actor per GPU).")
]
BlockRows = Annotated[int, typer.Option(min=1, help="Records per Ray block, and per shard at most.")]

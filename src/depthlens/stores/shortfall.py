"""A store that holds fewer records than its run set out to write (issue 59): a sample store with fewer responses
than its manifest's questions × pool (an online run: fewer questions decided than asked), a ``score`` store with
fewer records than the input it hashed (less those ``--skip-bad`` skipped). Its records are whole — nothing a
reader refuses — but a vote or an export of it covers less than the run did, so every door says so in one line:
``depthlens check`` (its own exit status, 3), the readers that vote or export from it (a warning, once per process
and state), and the explorer (a notice).

While another command writes the store, the line says so (it is short by design then): ``check`` and the explorer
note it, and it is not incomplete."""

from __future__ import annotations

import contextlib
import contextvars
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeGuard

from depthlens.stores.lock import writer

DECISIONS = "online.jsonl"  # an online run's decisions, one line per question decided (``studies.online``)
_log = logging.getLogger("depthlens.stores")
_said: set[str] = set()
_quiet: contextvars.ContextVar[bool] = contextvars.ContextVar("quiet_shortfall", default=False)


def expected(manifest: dict[str, Any], out_dir: Path | None) -> tuple[int, str] | None:
    """How many records the run that wrote a store set out to write, and what they are (``responses (2 questions
    × pool 4)``), from its manifest; None where it does not say. ``out_dir``: a sample store's directory (its
    online decisions are there), None for any other store."""
    questions, pool = manifest.get("questions"), manifest.get("pool")
    if out_dir is not None and isinstance(questions, list) and "online" in manifest:
        return len(questions), f"questions decided (of {len(questions)} asked)"
    if out_dir is not None and isinstance(questions, list) and _whole(pool):
        return len(questions) * pool, f"responses ({len(questions)} questions × pool {pool})"
    hashes = manifest.get("input_hashes")
    if out_dir is None and isinstance(hashes, dict):
        skipped = manifest.get("skipped")
        left = len(hashes) - (len(skipped) if isinstance(skipped, list) else 0)
        return left, "records of its input" + (f" (less {len(skipped)} skipped)" if skipped else "")
    return None


def _whole(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def held_count(manifest: dict[str, Any], out_dir: Path | None, records: int) -> int:
    """What counts against ``expected``: the ``records`` read, or an online run's questions decided."""
    if out_dir is not None and "online" in manifest:
        path = out_dir / DECISIONS
        try:
            with path.open("rb") as f:
                return sum(1 for raw in f if raw.endswith(b"\n") and raw.strip())
        except OSError:
            return 0
    return records


def shortfall(store: Path, manifest: dict[str, Any], records: int, out_dir: Path | None = None) -> str | None:
    """The one line every door says of the results store ``store`` holding ``records`` whole records when its run
    set out to write more (see the module), or None: whole, or its manifest does
    not say how many. ``out_dir``: the sample store's directory where ``store`` holds its responses."""
    wanted = expected(manifest, out_dir)
    if wanted is None:
        return None
    total, what = wanted
    held = held_count(manifest, out_dir, records)
    if held >= total:
        return None
    shown = out_dir if out_dir is not None else store
    who = writer(store)
    if who is not None:
        return f"{shown}: {held} of {total} {what} so far: a run is writing it now ({who})"
    return f"{shown}: incomplete, {held} of {total} {what}; `--resume` finishes it, or it was cut by hand"


def say(line: str | None) -> None:
    """Warn ``line`` once per process (a reader reads a store several times in one command)."""
    if line is None or _quiet.get() or line in _said:
        return
    _said.add(line)
    _log.warning(line)


def forget() -> None:
    """Say each shortfall again (a new command in the same process: ``cli.app.main``)."""
    _said.clear()


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Within: readers say no shortfall (``depthlens check`` reports it itself)."""
    token = _quiet.set(True)
    try:
        yield
    finally:
        _quiet.reset(token)

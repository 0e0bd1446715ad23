"""What every store shares whatever its format: manifests written whole (temporary name, fsync, rename), one-line
errors for failed writes, and how a resumed run's settings are compared with the stored ones."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from depthlens.errors import StoreError, named


@dataclasses.dataclass(frozen=True)
class ResumeRules:
    """How a resumed run's settings are compared with its store's manifest.

    Attributes:
        defaults: per settings entry of the manifest (e.g. ``readout``), the values a field had before it existed
            — so a store written by an older depthlens, whose manifest lacks a newer field, still resumes when
            this run leaves that field at its default.
        free: top-level manifest keys that may differ on resume (they do not change a record's result); the
            manifest takes this run's values.
        extend: list-valued keys that may grow on resume (the stored list must be a prefix of this run's).
    """

    defaults: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    free: tuple[str, ...] = ()
    extend: tuple[str, ...] = ()

    @property
    def movable(self) -> set[str]:
        """Settings a resumed run may change (reported to the user when it does)."""
        return {*self.free, *self.extend}


def manifest_path(out: Path) -> Path:
    return out.with_name(out.name + ".manifest.json")


def read_json(path: Path, what: str, fix: str) -> dict[str, Any]:
    """A whole JSON object from ``path`` (a manifest, a summary); a cut or foreign file raises StoreError."""
    try:
        data = json.loads(path.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        detail = f"{exc.msg} at line {exc.lineno}" if isinstance(exc, json.JSONDecodeError) else "not text"
        raise StoreError(f"{path}: the {what} is cut or is not JSON ({detail}); {fix}") from None
    if not isinstance(data, dict):
        raise StoreError(f"{path}: the {what} is not a JSON object; {fix}")
    return data


def write_json(path: Path, data: object) -> None:
    """Write ``data`` whole or not at all: to a temporary name, fsynced, then renamed over ``path``."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # hidden from Parquet readers; one per process
    try:
        with tmp.open("w", encoding="utf-8") as f:
            f.write(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise write_error(path, exc) from exc
        raise


class WriteFailed(StoreError):
    """A file that could not be written — a full disk above all — as one sentence naming it: what happened, what
    is kept and what to do. The layer that knows what the failure leaves says it (``kept``, ``keeping``); by
    default what finished before is kept and ``--resume`` continues."""

    def __init__(self, path: Path, cause: OSError, kept: str | None = None) -> None:
        self.path, self.cause = path, cause
        self.full = cause.errno == errno.ENOSPC
        what = "the disk is full" if self.full else f"could not write ({cause.strerror or cause})"
        if kept is None:
            kept = (
                f"what finished before is kept — free some space, then rerun the command with {named('resume')}"
                if self.full
                else "check the path and its permissions"
            )
        super().__init__(f"{path}: {what}; {kept}")

    def keeping(self, kept: str) -> WriteFailed:
        """The same failure, saying ``kept`` (what is left, and what to do) instead."""
        return WriteFailed(self.path, self.cause, kept)

    @property
    def remedy(self) -> str:
        """What frees the way: space, or the path's permissions."""
        return "free some space" if self.full else "check the path and its permissions"


def write_error(path: Path, exc: OSError) -> WriteFailed:
    """An OSError while writing ``path`` as a one-line error (a full disk above all)."""
    return WriteFailed(path, exc)


def _flatten(value: object, prefix: str = "") -> dict[str, object]:
    if isinstance(value, dict):
        flat: dict[str, object] = {}
        for k, v in value.items():
            flat.update(_flatten(v, f"{prefix}{k}."))
        return flat or {prefix[:-1]: {}}
    return {prefix[:-1]: value}


PERFORMANCE_ONLY = frozenset({"readout.memory_mb", "readout.compile", "engine.threads"})
"""Settings that change how the work is cut or run, not what a record holds (float32 rounding aside: the compiled
kernel's sums and another thread count reorder float32 additions): a store resumes, and its shards read, whatever
they were."""


def settings_differ(previous: dict[str, Any], current: dict[str, Any], ignore: Collection[str]) -> list[str]:
    """``key: stored X, now Y`` for each setting (dotted, nested) that differs, ``ignore``d and
    ``PERFORMANCE_ONLY`` keys left out."""
    old, new = _flatten(previous), _flatten(current)
    lines = []
    for key in sorted(set(old) | set(new)):
        if key in ignore or key.split(".")[0] in ignore or key in PERFORMANCE_ONLY:
            continue
        if old.get(key, "(absent)") != new.get(key, "(absent)"):
            lines.append(f"{key}: stored {old.get(key, '(absent)')!r}, this run {new.get(key, '(absent)')!r}")
    return lines


def _comparable(
    stored: dict[str, Any],
    manifest: dict[str, Any],
    defaults: Mapping[str, Mapping[str, Any]] | None,
    extend: Collection[str],
) -> dict[str, Any]:
    """The stored settings as this run would have written them: newer fields at their ``defaults``, ``extend``ed
    lists grown to this run's when the stored one is a prefix, keys this run leaves out (e.g. ``n_layers`` before
    the model is loaded) dropped."""
    previous = {k: v for k, v in stored.items() if k in manifest}
    for key, values in (defaults or {}).items():
        # a field, or a whole entry (e.g. ``engine``), that did not exist when the store was written
        if key in manifest and isinstance(previous.get(key, {}), dict):
            previous[key] = {**values, **previous.get(key, {})}
    for key in extend:
        old, new = previous.get(key), manifest.get(key)
        if isinstance(old, list) and isinstance(new, list) and new[: len(old)] == old:
            previous[key] = new
    return previous


def changed_settings(
    stored: dict[str, Any], manifest: dict[str, Any], rules: ResumeRules, ignore: Collection[str]
) -> list[str]:
    """The ``free`` / ``extend`` settings a resumed run changed, as ``key: stored X, this run Y`` lines."""
    movable = rules.movable
    return [
        line
        for line in settings_differ(stored, manifest, ignore)
        if line.split(":")[0] in movable or line.split(".")[0] in movable
    ]


def resume_check(
    out: Path,
    meta: Path,
    exists: bool,
    manifest: dict[str, Any] | None,
    resume: bool,
    overwrite: bool,
    rules: ResumeRules,
    ignore: Collection[str],
) -> bool:
    """Whether writing the store ``out`` (its manifest ``meta``; ``exists`` when it holds records) resumes it;
    raise StoreError when it may not be written at all. ``manifest`` holds this run's settings (only its keys are
    compared: the model's layer count can be left out before loading; None skips the comparison); the settings in
    ``ignore`` and ``rules.free`` are not compared. A refusal names every setting that differs."""
    if exists and resume:
        if not meta.exists():
            raise StoreError(f"{out} has no manifest ({meta.name}); it was not written by depthlens")
        if manifest is not None:
            stored = read_json(meta, "manifest", "use --overwrite to start again, or a new --out")
            previous = _comparable(stored, manifest, rules.defaults, rules.extend)
            mismatch = settings_differ(previous, manifest, {*ignore, *rules.free})
            if mismatch:
                raise StoreError(
                    f"cannot resume {out}: "
                    + "; ".join(mismatch)
                    + f" — use the stored settings, or a new {named('out')}"
                )
        return True
    if exists and not overwrite:
        raise StoreError(
            f"{out} already exists; pass {named('resume')} to continue it or {named('overwrite')} to replace it"
        )
    return False

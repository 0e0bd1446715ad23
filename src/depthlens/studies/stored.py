"""A sample store read whole for the studies: every graded response with the per-token values the metrics need
(``load_store``), through the store's one reader (``stores.samples.read_responses``)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import torch

from depthlens.stores.samples import (
    REQUIRED,
    damaged,
    kind_field,
    read_manifest,
    read_responses,
    stored_kinds,
)


@dataclasses.dataclass(frozen=True, eq=False)  # identity equality: fields are arrays
class StoredResponse:
    """One graded response with the per-token values the metrics need."""

    question_id: str
    correct: bool
    token_count: int
    token_ids: list[int]  # to label heatmaps without re-reading the store
    log_prob: np.ndarray  # [T]
    entropy: np.ndarray  # [T]
    self_certainty: np.ndarray  # [T]
    divergence: dict[str, torch.Tensor]  # kind → [R, L], R = read-out tokens (all of T for full readout)
    cut: bool = False  # stopped at the token cap (``finish`` "length"), not by itself


@dataclasses.dataclass(frozen=True)
class Store:
    path: Path
    manifest: dict[str, Any]
    responses: list[StoredResponse]
    failed: int

    @property
    def model(self) -> str:
        return str(self.manifest.get("model", "?"))

    @property
    def task(self) -> str:
        name = str((self.manifest.get("task") or {}).get("name", "?"))
        return name.removeprefix("reasoning_gym:")

    @property
    def label(self) -> str:
        return f"{self.model} · {self.task}"

    @property
    def n_layers(self) -> int:
        return int(self.manifest["n_layers"])

    @property
    def kinds(self) -> tuple[str, ...]:
        return stored_kinds(self.manifest)

    @property
    def readout_tokens(self) -> int | None:
        """The read-out window (None = every token): DTR beyond it cannot be computed from this store."""
        return self.manifest.get("sampling", {}).get("readout_tokens")

    @property
    def accuracy(self) -> float:
        return float(np.mean([r.correct for r in self.responses])) if self.responses else float("nan")

    def questions(self) -> dict[str, list[StoredResponse]]:
        groups: dict[str, list[StoredResponse]] = {}
        for r in self.responses:
            groups.setdefault(r.question_id, []).append(r)
        return groups


def load_store(path: str | Path) -> Store:
    """Read a sample store for the studies; a damaged or foreign store raises StoreError naming the record."""
    path = Path(path)
    manifest = read_manifest(path)
    kinds = stored_kinds(manifest)
    n_layers = int(manifest["n_layers"])
    fields = {k: kind_field(k, manifest) for k in kinds}
    responses, failed = [], 0
    for where, record in read_responses(path, (*REQUIRED, *fields.values())):
        if record.get("status") == "failed":
            failed += 1
            continue
        try:
            responses.append(
                StoredResponse(
                    question_id=str(record["question_id"]),
                    correct=bool(record["correct"]),
                    token_count=int(record["token_count"]),
                    token_ids=list(record.get("token_ids", [])),
                    log_prob=np.asarray(record["log_prob"], dtype=np.float64),
                    entropy=np.asarray(record["entropy"], dtype=np.float64),
                    self_certainty=np.asarray(record["self_certainty"], dtype=np.float64),
                    divergence={
                        k: torch.tensor(record[f], dtype=torch.float32).reshape(-1, n_layers)
                        for k, f in fields.items()
                    },
                    cut=record.get("finish") == "length",
                )
            )
        except (TypeError, ValueError, OverflowError, RuntimeError) as exc:
            raise damaged(where, exc) from None
    return Store(path, manifest, responses, failed)

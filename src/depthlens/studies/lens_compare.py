"""Which lens, which rule (issue 43): score stores of the same responses read under different lenses or settling
rules, set side by side.

Each arm is one ``depthlens score`` store; its manifest stamps the lens (``readout.lens``, ``lens_digest``) and the
rule (``dtr.settle``, g, ρ). Per arm: mean DTR and settling depth, the settling-depth distribution (per token where
the store holds ``--tokens``, else per response), the Spearman rank agreement of responses by DTR with the first
arm (on the responses both scored), and — given the sample store the responses came from — Table 1's correlation
of DTR with accuracy (``studies.correlation.correlate``, the same statistics as ``depthlens correlate``). Fitted
lenses (tuned, Jacobian) add their stamps' held-out KL per layer, logit against the fitted one (the tuned-lens
paper's figure).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from depthlens.config import CorrelationConfig, LensSpec
from depthlens.errors import InputError, StoreError
from depthlens.stats.correlation import spearman
from depthlens.studies.correlation import Correlation, correlate


@dataclasses.dataclass(frozen=True)
class Arm:
    """One score store: its label (lens · rule), its per-response DTR and settling depths."""

    path: Path
    lens: str
    settle: str
    n_layers: int
    dtr: dict[str, float]  # response id → DTR
    depth: dict[str, float]  # response id → mean settling depth
    token_depths: np.ndarray  # every token's settling depth, where the store holds them (else empty)

    @property
    def label(self) -> str:
        spec = LensSpec.parse(self.lens)
        lens = "logit" if spec.path is None else f"{spec.kind} ({Path(spec.path).name})"
        return f"{lens} · {self.settle}"


def load_arm(path: Path) -> Arm:
    """A score store read for the comparison (StoreError naming it when it is not one)."""
    from depthlens.stores.parquet import iter_store, store_manifest

    manifest = store_manifest(path)
    if "readout" not in manifest or "dtr" not in manifest:
        raise StoreError(f"{path}: not a `depthlens score` store (no readout / dtr settings in its manifest)")
    dtr, depth, tokens = {}, {}, []
    for record in iter_store(path):
        if record.get("dtr") is not None:
            dtr[str(record["id"])] = float(record["dtr"])
            depth[str(record["id"])] = float(record["mean_settling_depth"])
        tokens += list(record.get("settling_depth") or [])
    return Arm(
        path,
        str(manifest["readout"].get("lens", "logit")),
        str(manifest["dtr"].get("settle", "jsd")),
        int(manifest["n_layers"]),
        dtr,
        depth,
        np.asarray(tokens, dtype=np.float64),
    )


def outcomes(samples: Path) -> dict[str, tuple[str, bool]]:
    """Response id → (question id, correct) from the sample store the scored responses came from."""
    from depthlens.stores.samples import read_responses

    out = {}
    for _, record in read_responses(samples, ("id", "question_id", "correct")):
        if record.get("status") != "failed":
            out[str(record["id"])] = (str(record["question_id"]), bool(record["correct"]))
    return out


def accuracy_correlation(
    arm: Arm, graded: dict[str, tuple[str, bool]], cfg: CorrelationConfig
) -> Correlation:
    """Table 1's statistics of DTR against accuracy for ``arm``'s responses found in ``graded``."""
    groups: dict[str, list[tuple[float, bool]]] = {}
    for rid, value in arm.dtr.items():
        if rid in graded:
            question, correct = graded[rid]
            groups.setdefault(question, []).append((value, correct))
    per_question = [
        (np.array([v for v, _ in pairs]), np.array([float(c) for _, c in pairs])) for pairs in groups.values()
    ]
    return correlate("dtr", per_question, cfg)


def lens_kl(arms: Sequence[Arm]) -> dict[str, dict[str, list[float]]]:
    """Per fitted lens of the arms (by its spec): the stamp's held-out KL per layer, the logit lens's and the
    fitted one's (``tuned`` or ``jacobian``)."""
    from depthlens.readout.lenses import resolve_lens

    out = {}
    for arm in arms:
        if LensSpec.parse(arm.lens).path is None or arm.lens in out:
            continue
        stamp = resolve_lens(arm.lens).stamp or {}  # the lens resolved: its stamp read
        kl = stamp.get("heldout_kl")
        if kl is not None:  # a hand-made lens (tests' identity translators) has no fit to report
            out[arm.lens] = kl
    return out


def _quartiles(values: np.ndarray) -> list[float | None]:
    if values.size == 0:
        return [None, None, None]
    return [float(q) for q in np.quantile(values, [0.25, 0.5, 0.75])]


def compare_arms(
    arms: Sequence[Arm],
    graded: dict[str, tuple[str, bool]] | None = None,
    cfg: CorrelationConfig = CorrelationConfig(),
) -> list[dict[str, Any]]:
    """One row per arm: responses, mean DTR, mean settling depth and its quartiles, Spearman ρ of DTR with the first
    arm on the shared responses, and (``graded``) the correlation of DTR with accuracy: the paper's binned r, ρ and
    the point-biserial r, each with its question-resampled 95 % interval and p."""
    if not arms:
        raise InputError("lens compare: give at least one score store")
    first = arms[0]
    if any(a.n_layers != first.n_layers for a in arms):
        raise InputError(
            "lens compare: the stores were scored by models of different depths; compare one model's"
        )
    rows = []
    for arm in arms:
        shared = sorted(set(arm.dtr) & set(first.dtr))
        depths = arm.token_depths if arm.token_depths.size else np.asarray(list(arm.depth.values()))
        row: dict[str, Any] = {
            "arm": arm.label,
            "store": str(arm.path),
            "responses": len(arm.dtr),
            "mean_dtr": float(np.mean(list(arm.dtr.values()))) if arm.dtr else None,
            "mean_settling_depth": float(np.mean(list(arm.depth.values()))) if arm.depth else None,
            "depth_quartiles": _quartiles(depths),
            "depth_of": "tokens" if arm.token_depths.size else "responses",
            "shared": len(shared),
            "spearman_vs_first": spearman([first.dtr[i] for i in shared], [arm.dtr[i] for i in shared])
            if len(shared) > 2
            else None,
        }
        if graded is not None:
            c = accuracy_correlation(arm, graded, cfg)
            row.update(  # Table 1's statistics, as `depthlens correlate` reports them
                accuracy_binned_r=c.binned_r,
                accuracy_binned_r_ci=list(c.binned_r_ci),
                accuracy_binned_r_p=c.binned_r_p,
                accuracy_binned_questions=c.questions_used,
                accuracy_spearman=c.spearman,
                accuracy_spearman_ci=list(c.spearman_ci),
                accuracy_spearman_p=c.spearman_p,
                accuracy_point_biserial=c.point_biserial,
                accuracy_point_biserial_ci=list(c.point_biserial_ci),
                accuracy_point_biserial_p=c.point_biserial_p,
                accuracy_note=c.note,
            )
        rows.append(row)
    return rows

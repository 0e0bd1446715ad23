"""Fit a Jacobian lens (docs/definitions.md §1; ``readout.jacobian`` holds the artifact and the per-prompt
estimator): average each prompt's J over ``JacobianFitConfig.prompts`` corpus windows, write the published
artifact with depthlens's stamp in its metadata, resumable from a checkpoint.

The checkpoint (``OUT.checkpoint.pt``, beside the artifact) is the reference implementation's running-sum schema —
``jacobian_sum`` {block: [d, d]}, ``n_done``, ``next_idx``, ``source_layers``, ``target_layer``, ``skip_first`` —
plus depthlens's ``metadata`` naming the fit it belongs to (model fingerprint, corpus, windows, seed), so
``--resume`` goes on with the very prompts an uninterrupted fit would have read, and refuses another fit's. A fit
stopped by ``max_seconds`` writes the lens of the prompts done and keeps its checkpoint.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
import resource
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from depthlens.config import JACOBIAN_SKIP_FIRST, JacobianFitConfig
from depthlens.errors import InputError, named
from depthlens.models.load import LoadedModel
from depthlens.models.precision import precision_of
from depthlens.readout.jacobian import dim_batch_for, prompt_jacobian, save_artifact
from depthlens.readout.lens import LogitLens
from depthlens.readout.lens_files import file_digest, hidden_size, model_fingerprint
from depthlens.readout.stream import TokenSequence
from depthlens.studies.lens_fit import collect_states, heldout_readout, stdlib_corpus

STAMP_FORMAT = "depthlens-jacobian-lens-1"


@dataclasses.dataclass(frozen=True)
class Prompts:
    """The fit's prompts (token ids, each ``max_tokens`` long or shorter), the held-out ones and the corpus's
    name."""

    train: list[list[int]]
    heldout: list[list[int]]
    corpus: str

    def digest(self) -> str:
        """The prompts' identity: a checkpoint is only resumed on the same ones."""
        text = repr((self.corpus, self.train, self.heldout)).encode()
        return hashlib.sha256(text).hexdigest()[:16]


def jacobian_prompts(lm: LoadedModel, source: Path | None, cfg: JacobianFitConfig) -> Prompts:
    """``cfg.heldout`` + ``cfg.prompts`` windows of ``cfg.max_tokens`` tokens, drawn (seeded) from the records of
    ``source`` (each record's prompt and completion, cut to the window) or the offline standard-library corpus the
    tuned-lens fit reads (each window begins with the tokens a text gets first, e.g. BOS)."""
    from depthlens.stores.formats import read_inputs
    from depthlens.studies.score_inputs import tokenize

    if source is not None:
        records, _ = read_inputs(source)
        seqs = [tokenize(lm, r.data, f"record {r.id!r}") for r in records]
        windows = [[*s.prompt_ids, *s.completion_ids][: cfg.max_tokens] for s in seqs]
        corpus = f"records:{source}"
    else:
        if lm.tokenizer is None:
            raise InputError(
                f"{lm.name} has no tokenizer for the corpus; give token-id records with {named('in')}"
            )
        first = list(lm.tokenizer("")["input_ids"])  # what every text starts with (BOS, or nothing)
        width = cfg.max_tokens - len(first)
        windows = []
        for text in stdlib_corpus():
            ids = lm.tokenizer(text, add_special_tokens=False)["input_ids"]
            windows += [first + ids[i : i + width] for i in range(0, len(ids) - width + 1, width)]
        corpus = "corpus:python-stdlib-docstrings"
    windows = [w for w in windows if len(w) >= JACOBIAN_SKIP_FIRST + 2]
    random.Random(cfg.seed).shuffle(windows)
    if len(windows) < cfg.heldout + 1:
        raise InputError(
            f"{len(windows)} prompts of ≥ {JACOBIAN_SKIP_FIRST + 2} tokens in {corpus}: a J-lens fit needs "
            f"{cfg.heldout} held out and at least one to fit; give more text, or a smaller {named('heldout')}"
        )
    held, train = windows[: cfg.heldout], windows[cfg.heldout : cfg.heldout + cfg.prompts]
    return Prompts(train, held, corpus)


def checkpoint_path(out: Path) -> Path:
    """Where the fit of the artifact ``out`` keeps its running sum."""
    return out.with_name(out.name + ".checkpoint.pt")


def _identity(lm: LoadedModel, prompts: Prompts, cfg: JacobianFitConfig) -> dict[str, Any]:
    return {
        "model_hash": model_fingerprint(lm),
        "corpus": prompts.corpus,
        "prompts_digest": prompts.digest(),
        "max_tokens": cfg.max_tokens,
        "seed": cfg.seed,
    }


def read_checkpoint(path: Path, identity: dict[str, Any]) -> dict[str, Any]:
    """The checkpoint at ``path`` (weights only), refused naming ``resume`` when it belongs to another fit."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    theirs = (state.get("metadata") or {}).get("depthlens_fit", {})
    wrong = [f"{k} {theirs.get(k)!r} ≠ {v!r}" for k, v in identity.items() if theirs.get(k) != v]
    if wrong:
        raise InputError(
            setting="resume",
            value=True,
            requirement=f"{path} belongs to another fit ({', '.join(wrong)}); fit with the settings it was "
            "started with, or remove it to start over",
        )
    return state


def _save_checkpoint(path: Path, sums: torch.Tensor, done: int, identity: dict[str, Any]) -> None:
    state = {
        "jacobian_sum": {block: sums[block].cpu() for block in range(sums.shape[0])},
        "n_done": done,
        "next_idx": done,
        "source_layers": list(range(sums.shape[0])),
        "target_layer": sums.shape[0],
        "skip_first": JACOBIAN_SKIP_FIRST,
        "metadata": {"depthlens_fit": identity},
    }
    tmp = path.with_name(f".{path.name}.tmp")
    torch.save(state, tmp)
    tmp.replace(path)  # whole or not at all: a SIGTERM mid-write leaves the previous checkpoint


def heldout_kl(lm: LoadedModel, prompts: Sequence[Sequence[int]], weight: torch.Tensor) -> tuple[dict, dict]:
    """Mean KL(p_L ‖ p_l) per layer 1..L−1 and the DTR of the held-out prompts' positions V (those the estimator
    reads), through the logit lens and the J-lens ``weight`` [L−1, d, d]."""
    seqs = [
        TokenSequence(list(p[: JACOBIAN_SKIP_FIRST + 1]), list(p[JACOBIAN_SKIP_FIRST + 1 :])) for p in prompts
    ]
    states = collect_states(lm, seqs, max_tokens=sum(len(p) for p in prompts))
    lens = LogitLens(lm.parts, vocab_size=len(lm.tokenizer) if lm.tokenizer is not None else None)
    zero = torch.zeros(weight.shape[:2], device=weight.device)
    kl, dtr = heldout_readout(lens, states, weight, zero)
    return {"logit": kl["logit"], "jacobian": kl["tuned"]}, {"logit": dtr["logit"], "jacobian": dtr["tuned"]}


Progress = Callable[
    [int, int, float], None
]  # (prompts done, prompts in all, seconds per prompt this session)


def run_prompts(
    lm: LoadedModel,
    prompts: Prompts,
    cfg: JacobianFitConfig,
    checkpoint: Path,
    state: dict | None,
    progress: Progress,
) -> tuple[torch.Tensor, int, dict[str, Any]]:
    """The running sum over the prompts from the checkpoint's on, until all are done or ``max_seconds`` runs out
    (after one prompt at least, so a lens is always written):
    (sum [L−1, d, d], prompts done, its cost: cotangents per backward, wall and CPU seconds per prompt)."""
    d, n = hidden_size(lm), lm.n_layers - 1
    sums = torch.zeros(n, d, d, dtype=torch.float32, device=lm.device)
    done = 0
    if state is not None:
        sums += torch.stack([state["jacobian_sum"][b].float() for b in range(n)]).to(lm.device)
        done = int(state["n_done"])
    identity = _identity(lm, prompts, cfg)
    dim_batch = dim_batch_for(lm, cfg.max_tokens, cfg.memory_mb)
    started, cpu, first = time.monotonic(), time.process_time(), done
    while done < len(prompts.train) and (done == first or time.monotonic() - started < cfg.max_seconds):
        sums += prompt_jacobian(lm, prompts.train[done], dim_batch)
        done += 1
        if done % cfg.checkpoint_every == 0 or done == len(prompts.train):
            _save_checkpoint(checkpoint, sums, done, identity)
        progress(done, len(prompts.train), (time.monotonic() - started) / (done - first))
    ran = max(1, done - first)
    cost = {
        "dim_batch": dim_batch,
        "seconds_per_prompt": round((time.monotonic() - started) / ran, 1),  # this session's (a resumed fit:
        "cpu_seconds_per_prompt": round((time.process_time() - cpu) / ran, 1),  # since it resumed)
    }
    return sums, done, cost


def _stamp(
    lm: LoadedModel, prompts: Prompts, cfg: JacobianFitConfig, done: int, cost: dict[str, Any]
) -> dict[str, Any]:
    """depthlens's stamp of a J-lens fit (held-out KL aside): the model, the corpus, the positions, the prompts,
    the settings and what it cost."""
    return {
        "format": STAMP_FORMAT,
        "model": lm.name,
        "model_hash": model_fingerprint(lm),
        "n_layers": lm.n_layers,
        "d": hidden_size(lm),
        "precision": precision_of(lm),
        "corpus": prompts.corpus,
        "positions": {
            "skip_first": JACOBIAN_SKIP_FIRST,
            "exclude_last": True,
            "prompt_tokens": cfg.max_tokens,
        },
        "prompts": {"fitted": done, "asked": len(prompts.train), "heldout": len(prompts.heldout)},
        "heldout_tokens": sum(len(p) - JACOBIAN_SKIP_FIRST - 1 for p in prompts.heldout),
        "fit": {**cfg.to_dict(), "dim_batch": cost["dim_batch"]},
        "seconds_per_prompt": cost["seconds_per_prompt"],  # this session's (a resumed fit: since it resumed)
        "cpu_seconds_per_prompt": cost["cpu_seconds_per_prompt"],
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
    }


def fit_jacobian(
    lm: LoadedModel,
    prompts: Prompts,
    out: str | Path,
    cfg: JacobianFitConfig = JacobianFitConfig(),
    *,
    resume: bool = False,
    progress: Progress = lambda done, total, seconds: None,
) -> dict[str, Any]:
    """Fit a J-lens for ``lm`` on ``prompts`` and write the artifact ``out``; returns its stamp (with the file's
    ``digest``). ``resume``: go on from ``out``'s checkpoint (else a checkpoint there is started over)."""
    out = Path(out)
    checkpoint = checkpoint_path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    state = (
        read_checkpoint(checkpoint, _identity(lm, prompts, cfg)) if resume and checkpoint.exists() else None
    )
    if state is None:
        checkpoint.unlink(missing_ok=True)
    sums, done, cost = run_prompts(lm, prompts, cfg, checkpoint, state, progress)
    weight = sums / done
    kl, dtr = heldout_kl(lm, prompts.heldout, weight)
    stamp = {**_stamp(lm, prompts, cfg, done, cost), "heldout_kl": kl, "heldout_dtr": dtr}
    metadata = {  # TransformerLens's provenance keys (none it checks against its own model), then ours
        "estimator": "jacobian_lens",
        "corpus": prompts.corpus,
        "n_prompts": done,
        "skip_first_positions": JACOBIAN_SKIP_FIRST,
        "max_seq_len": cfg.max_tokens,
        "target_layer": lm.n_layers - 1,
        "fit_dtype": str(next(lm.model.parameters()).dtype).removeprefix("torch."),
        "dim_batch": cost["dim_batch"],
        "depthlens": stamp,
    }
    save_artifact(out, weight, done, metadata, getattr(torch, cfg.dtype))
    if done >= len(prompts.train):  # finished: nothing left to resume (a fit stopped by max_seconds keeps it)
        checkpoint.unlink(missing_ok=True)
    return {**stamp, "digest": file_digest(out)}

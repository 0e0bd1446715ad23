"""Fit a tuned lens (Belrose et al. 2023): per layer an affine translator A_l h + b_l, read through the final norm
and the unembedding, trained to minimise KL(p_L ‖ p_l) on the model's own tokens.

Two stages: the least-squares map of h_l onto the last block's state h_L (closed form, float64, a small ridge),
then a bounded number of Adam steps on the KL itself (bounded by steps and wall time). Whole sequences are kept
apart for the held-out KL, which the stamp records per layer for the logit and the tuned lens. The fit is
resumable: ``checkpoint.pt`` holds the translators, the optimiser's state and the step; minibatches are drawn
from a generator seeded by (seed, step), so a resumed fit draws what an uninterrupted one would.
"""

from __future__ import annotations

import dataclasses
import errno
import io
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from depthlens.config import DTRConfig, LensFitConfig
from depthlens.errors import named
from depthlens.metrics.divergence import js_divergence
from depthlens.metrics.dtr import deep_flags, settling_depth
from depthlens.models.load import LoadedModel, frozen
from depthlens.models.precision import precision_of
from depthlens.readout.lens import LogitLens
from depthlens.readout.stream import TokenSequence
from depthlens.readout.tuned import CHECKPOINT, hidden_size, model_fingerprint, save_lens, write_whole
from depthlens.stores.files import WriteFailed
from depthlens.studies.footprint import check_lens_fit

EVAL_ROWS = 256  # held-out tokens per unembedding product


@dataclasses.dataclass(frozen=True)
class States:
    """Residual states of N token positions: ``hidden`` [L−1, N, d] after blocks 1..L−1 and ``last`` [N, d],
    the last block's output before the final norm (float32, on the model's device)."""

    hidden: torch.Tensor
    last: torch.Tensor
    sequences: int = 0  # how many sequences they were read from

    @property
    def n_tokens(self) -> int:
        return int(self.last.shape[0])


@torch.inference_mode()
def collect_states(lm: LoadedModel, sequences: Sequence[TokenSequence], max_tokens: int) -> States:
    """The states at the positions that predict each sequence's completion tokens (as the readout reads them),
    at most ``max_tokens`` in all. The last block's raw output is taken at the final norm's input."""
    captured: list[torch.Tensor] = []
    hook = lm.parts.final_norm.register_forward_pre_hook(lambda _, args: captured.append(args[0]))
    hidden: list[torch.Tensor] = []
    last: list[torch.Tensor] = []
    n, used = 0, 0
    try:
        for seq in sequences:
            if n >= max_tokens or not seq.completion_ids:
                continue
            ids = torch.tensor([[*seq.prompt_ids, *seq.completion_ids]], device=lm.device)
            captured.clear()
            out = lm.model(input_ids=ids[:, :-1], output_hidden_states=True, use_cache=False)
            lo = len(seq.prompt_ids) - 1
            hi = min(ids.shape[1] - 1, lo + max_tokens - n)
            hidden.append(torch.stack([h[0, lo:hi].float() for h in out.hidden_states[1:-1]]))
            last.append(captured[-1][0, lo:hi].float())
            n, used = n + hi - lo, used + 1
    finally:
        hook.remove()
    if not last:
        raise ValueError("no completion tokens to fit a lens on: give sequences with completions")
    return States(torch.cat(hidden, dim=1), torch.cat(last), used)


def least_squares(x: torch.Tensor, y: torch.Tensor, ridge: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The affine map y ≈ A x + b minimising the squared error (ridge ``ridge`` × the mean square of centred x):
    (A [d, d], b [d]) in float32, solved in float64."""
    x64, y64 = x.double(), y.double()
    mx, my = x64.mean(0), y64.mean(0)
    xc, yc = x64 - mx, y64 - my
    gram = xc.T @ xc
    lam = ridge * float(gram.diagonal().mean())
    a_t = torch.linalg.solve(
        gram + lam * torch.eye(gram.shape[0], dtype=gram.dtype, device=gram.device), xc.T @ yc
    )
    return a_t.T.float(), (my - mx @ a_t).float()


def layer_logprobs(
    lens: LogitLens, states: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor
) -> torch.Tensor:
    """log p_l [..., V] of states [..., d] read through the translator (weight [d, d], bias [d]) and ``lens``."""
    dtype = lens.parts.unembed_weight.dtype
    return torch.log_softmax(lens.logits((states @ weight.T + bias).to(dtype)), dim=-1)


def kl_to_final(final_logprobs: torch.Tensor, logprobs: torch.Tensor) -> torch.Tensor:
    """KL(p_L ‖ p_l) per row, in nats."""
    return (final_logprobs.exp() * (final_logprobs - logprobs)).sum(-1)


def final_logprobs(lens: LogitLens, last: torch.Tensor) -> torch.Tensor:
    """log p_L of raw last-block states: the model's own output distribution."""
    with torch.no_grad():
        return torch.log_softmax(lens.logits(last.to(lens.parts.unembed_weight.dtype)), dim=-1)


@torch.no_grad()
def heldout_kl(
    lens: LogitLens, states: States, weight: torch.Tensor, bias: torch.Tensor
) -> dict[str, list[float]]:
    """Mean KL(p_L ‖ p_l) per layer 1..L−1 on ``states``, for the logit lens and through the translators."""
    return heldout_readout(lens, states, weight, bias)[0]


@torch.no_grad()
def heldout_readout(
    lens: LogitLens, states: States, weight: torch.Tensor, bias: torch.Tensor, dtr: DTRConfig = DTRConfig()
) -> tuple[dict[str, list[float]], dict[str, float]]:
    """In one pass over ``states``: the mean KL(p_L ‖ p_l) per layer 1..L−1, and the held-out tokens' DTR (JSD
    settling at ``dtr``'s g and ρ, as ``score`` reads them) — each for the logit lens and through the translators."""
    n_layers = states.hidden.shape[0]  # L − 1: layer L is the model's own output
    eye = torch.eye(weight.shape[-1], device=weight.device)
    zero = torch.zeros(weight.shape[-1], device=weight.device)
    sums = {"logit": [0.0] * n_layers, "tuned": [0.0] * n_layers}
    jsd: dict[str, list[torch.Tensor]] = {"logit": [], "tuned": []}  # per chunk [rows, L − 1], bits
    for lo in range(0, states.n_tokens, EVAL_ROWS):
        target = final_logprobs(lens, states.last[lo : lo + EVAL_ROWS])
        columns: dict[str, list[torch.Tensor]] = {"logit": [], "tuned": []}
        for layer in range(n_layers):
            rows = states.hidden[layer, lo : lo + EVAL_ROWS]
            for name, (w, b) in {"logit": (eye, zero), "tuned": (weight[layer], bias[layer])}.items():
                logprobs = layer_logprobs(lens, rows, w, b)
                sums[name][layer] += float(kl_to_final(target, logprobs).sum())
                columns[name].append(js_divergence(logprobs, target).float().cpu())
        for name, cols in columns.items():
            jsd[name].append(torch.stack(cols, dim=1))
    kl = {name: [round(v / states.n_tokens, 6) for v in values] for name, values in sums.items()}
    depth = {}
    for name, chunks in jsd.items():
        table = torch.cat(chunks)
        table = torch.cat([table, torch.zeros(len(table), 1)], dim=1)  # D at layer L is 0
        deep = deep_flags(settling_depth(table, dtr.g), n_layers + 1, dtr.rho, dtr.deep_rule)
        depth[name] = round(float(deep.double().mean()), 4)
    return kl, depth


SHORT_FIT = 50  # KL steps below which a fit is short (the default is 200)
DTR_MOVED = 0.1  # a change of held-out DTR this large is worth a word


def fit_warning(stamp: dict[str, Any], cfg: LensFitConfig) -> str | None:
    """A sentence when the fit is short or stopped by ``max_seconds`` and moves the held-out tokens' DTR by
    ``DTR_MOVED`` or more: depths read through such a lens describe the fit as much as the model."""
    depth, steps = stamp.get("heldout_dtr"), int(stamp["steps"])
    if not depth or (steps >= SHORT_FIT and steps >= cfg.steps):
        return None
    if abs(depth["tuned"] - depth["logit"]) < DTR_MOVED:
        return None
    why = f"--max-seconds {cfg.max_seconds:g} ran out" if steps < cfg.steps else f"fewer than {SHORT_FIT}"
    return (
        f"the fit stopped after {steps} KL steps ({why}) and moves the held-out tokens' DTR from "
        f"{depth['logit']:.2f} (logit lens) to {depth['tuned']:.2f}: an unconverged lens changes which tokens "
        "count as deep; fit longer (--steps, --max-seconds; --resume goes on) before reading depths through it"
    )


def init_translators(train: States, ridge: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The least-squares start: per layer, the affine map of h_l onto h_L. [L−1, d, d], [L−1, d]."""
    maps = [least_squares(train.hidden[layer], train.last, ridge) for layer in range(train.hidden.shape[0])]
    return torch.stack([a for a, _ in maps]), torch.stack([b for _, b in maps])


def kl_step(
    lens: LogitLens, train: States, weight: torch.Tensor, bias: torch.Tensor, cfg: LensFitConfig, step: int
) -> torch.Tensor:
    """One minibatch's mean KL(p_L ‖ p_l) over a random draw of layers; seeded by (seed, step)."""
    gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
    rows = torch.randint(train.n_tokens, (min(cfg.batch_tokens, train.n_tokens),), generator=gen)
    n_layers = train.hidden.shape[0]
    layers = torch.randperm(n_layers, generator=gen)[: min(cfg.layers_per_step, n_layers)]
    rows = rows.to(train.last.device)
    target = final_logprobs(lens, train.last[rows])
    losses = [
        kl_to_final(target, layer_logprobs(lens, train.hidden[j, rows], weight[j], bias[j])).mean()
        for j in layers.tolist()
    ]
    return torch.stack(losses).mean()


def fit_translators(
    lens: LogitLens,
    train: States,
    cfg: LensFitConfig,
    checkpoint: Path | None = None,
    progress: Callable[[int, float], None] = lambda step, loss: None,
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The translators after the least-squares start and up to ``cfg.steps`` KL steps (fewer when
    ``cfg.max_seconds`` runs out): (weight, bias, steps done). With ``checkpoint`` the state is saved there every
    ``cfg.checkpoint_every`` steps and at the end, and a fit found there goes on from its step."""
    state = (
        torch.load(checkpoint, weights_only=True) if checkpoint is not None and checkpoint.exists() else None
    )
    if state is None:
        weight, bias = init_translators(train, cfg.ridge)
    else:
        weight, bias = state["weight"].to(train.last.device), state["bias"].to(train.last.device)
    weight, bias = weight.clone().requires_grad_(True), bias.clone().requires_grad_(True)
    optimiser = torch.optim.Adam([weight, bias], lr=cfg.lr)
    step = 0
    if state is not None:
        optimiser.load_state_dict(state["optimiser"])
        step = int(state["step"])

    def save() -> None:
        if checkpoint is not None:  # whole or not at all: a full disk keeps the checkpoint before
            buffer = io.BytesIO()
            state = {"weight": weight.detach(), "bias": bias.detach(), "optimiser": optimiser.state_dict()}
            torch.save({**state, "step": step}, buffer)
            try:
                write_whole({checkpoint: buffer.getvalue()})
            except OSError as exc:
                raise WriteFailed(
                    checkpoint,
                    exc,
                    f"the checkpoint before it is kept — {_remedy(exc)}, then rerun the command with "
                    f"{named('resume')}: it goes on from there",
                ) from None

    deadline = time.monotonic() + cfg.max_seconds
    while step < cfg.steps and time.monotonic() < deadline:
        optimiser.zero_grad()
        loss = kl_step(lens, train, weight, bias, cfg, step)
        loss.backward()
        optimiser.step()
        step += 1
        progress(step, float(loss.detach()))
        if step % cfg.checkpoint_every == 0:
            save()
    save()
    return weight.detach(), bias.detach(), step


def _remedy(exc: OSError) -> str:
    return "free some space" if exc.errno == errno.ENOSPC else "check the path and its permissions"


def split(sequences: Sequence[TokenSequence], heldout: float, seed: int) -> tuple[list, list]:
    """(training, held-out) sequences: a seeded shuffle, the last ``heldout`` share kept apart (at least one)."""
    order = torch.randperm(len(sequences), generator=torch.Generator().manual_seed(seed)).tolist()
    n_held = max(1, round(heldout * len(sequences))) if len(sequences) > 1 else 0
    held = sorted(order[len(order) - n_held :])
    train = [sequences[i] for i in sorted(order[: len(order) - n_held])]
    return train, [sequences[i] for i in held]


def fit_lens(
    lm: LoadedModel,
    sequences: Sequence[TokenSequence],
    out: str | Path,
    cfg: LensFitConfig = LensFitConfig(),
    *,
    data: str = "",
    resume: bool = False,
    progress: Callable[[int, float], None] = lambda step, loss: None,
) -> dict[str, Any]:
    """Fit a tuned lens for ``lm`` on ``sequences`` and write it to the folder ``out`` (``readout.tuned``); returns
    its stamp. ``resume``: go on from ``out``'s checkpoint (else a checkpoint there is started over)."""
    out = Path(out)
    if len(sequences) < 2:
        raise ValueError("a lens fit needs at least 2 sequences: one is kept apart for the held-out KL")
    check_lens_fit(lm, cfg.max_tokens, cfg.batch_tokens, cfg.layers_per_step)  # before a state is read
    out.mkdir(parents=True, exist_ok=True)
    checkpoint = out / CHECKPOINT
    if not resume and checkpoint.exists():
        checkpoint.unlink()
    train_seqs, held_seqs = split(sequences, cfg.heldout, cfg.seed)
    n_held = max(1, round(cfg.max_tokens * cfg.heldout))
    train = collect_states(lm, train_seqs, cfg.max_tokens - n_held)
    held = collect_states(lm, held_seqs, n_held)
    lens = LogitLens(lm.parts, vocab_size=len(lm.tokenizer) if lm.tokenizer is not None else None)
    started = time.monotonic()
    # gradients for the translators only: none accumulated on the model's weights (a wrapped model's may require it)
    with torch.enable_grad(), frozen(lm.model):
        weight, bias, steps = fit_translators(lens, train, cfg, checkpoint, progress)
    kl, depth = heldout_readout(lens, held, weight, bias)
    stamp = {
        "model": lm.name,
        "model_hash": model_fingerprint(lm),
        "n_layers": lm.n_layers,
        "precision": precision_of(lm),
        "d": hidden_size(lm),
        "data": data,
        "tokens": {"train": train.n_tokens, "heldout": held.n_tokens},
        "sequences": {"train": train.sequences, "heldout": held.sequences},
        "steps": steps,
        "kl_seconds": round(time.monotonic() - started, 1),
        "fit": cfg.to_dict(),
        "heldout_kl": kl,
        "heldout_dtr": depth,
    }
    try:
        saved = save_lens(out, weight.cpu(), bias.cpu(), stamp)
    except OSError as exc:  # the final write: the fit is in its checkpoint, and --resume writes it out
        raise WriteFailed(
            Path(exc.filename or out),
            exc,
            f"the lens was not written ({out} holds what it held before; nothing half-written is left) and the fit "
            f"is kept in {checkpoint} — {_remedy(exc)}, then rerun the command with {named('resume')}: it writes the "
            "lens from there",
        ) from None
    if steps >= cfg.steps:  # finished: nothing left to resume (a fit stopped by --max-seconds keeps it)
        checkpoint.unlink(missing_ok=True)
    return saved


CORPUS_MODULES = (
    "argparse", "bisect", "collections", "contextlib", "csv", "dataclasses", "datetime", "decimal", "difflib",
    "email", "enum", "fractions", "functools", "heapq", "http", "inspect", "itertools", "json", "logging", "math",
    "os", "pathlib", "pickle", "random", "re", "shutil", "statistics", "string", "subprocess", "textwrap",
    "threading", "typing", "unittest", "urllib", "uuid", "zipfile",
)  # fmt: skip
"""The offline corpus's sources: the docstrings of these standard-library modules and their public members — English
prose and code that ship with every Python, so a fit needs no download."""


def stdlib_corpus() -> list[str]:
    """The docstrings of ``CORPUS_MODULES`` and their public members, in a fixed order (at least 200 characters)."""
    import importlib
    import inspect

    texts: list[str] = []
    for name in CORPUS_MODULES:
        module = importlib.import_module(name)
        members = [module, *(getattr(module, m) for m in sorted(vars(module)) if not m.startswith("_"))]
        for obj in members:
            doc = inspect.getdoc(obj) if inspect.ismodule(obj) or callable(obj) else None
            if doc and len(doc) >= 200 and doc not in texts:
                texts.append(doc)
    return texts


def lens_sequences(
    lm: LoadedModel, source: Path | None, window: int = 128
) -> tuple[list[TokenSequence], str]:
    """The fit's sequences and how to name their data: the records of ``source`` (JSONL or a sample store — the
    model's own generations on the offline tasks: their completion tokens), else the standard-library corpus cut
    into ``window``-token pieces (each read after its first token)."""
    from depthlens.stores.formats import read_inputs
    from depthlens.studies.score_inputs import tokenize

    if source is not None:
        records, _ = read_inputs(source)
        return [tokenize(lm, r.data, f"record {r.id!r}") for r in records], f"records:{source}"
    if lm.tokenizer is None:
        raise ValueError(f"{lm.name} has no tokenizer for the corpus; give token-id records")
    seqs = []
    for text in stdlib_corpus():
        ids = lm.tokenizer(text, add_special_tokens=False)["input_ids"]
        seqs += [
            TokenSequence(ids[i : i + 1], ids[i + 1 : i + window]) for i in range(0, len(ids) - 8, window)
        ]
    return seqs, "corpus:python-stdlib-docstrings"

"""Online Think@n and the online DeepConf peer: decide while decoding. Pure: no model, no I/O.

The policy is described in docs/architecture.md (online Think@n).

Per question, responses are taken in sampling order (index 0, 1, 2, … — the order of their seeds):

1. Warm-up: responses 0..w−1 run to their end; τ = np.percentile(their signals, 100·(1 − keep)), or the fixed
   ``threshold`` where one is given.
2. Then batches of ``batch_size`` responses (the last one cut to ``max_n``): each is stopped where the policy says
   (``stop_point``) and then casts no vote, or runs to its end and votes.
3. After the warm-up and after each batch: stop if the leading answer holds ≥ β of the answered votes
   (consensus), or once ``max_n`` responses were started.

Signals: ``dtr`` — a response's DTR over its first ℓ tokens, decided at token ℓ (it continues iff ≥ τ; one that
ended before ℓ is judged on what it produced); ``confidence`` — DeepConf's running group confidence, checked at
every token t ≥ window: the response stops at the first t where the mean confidence of tokens t−window+1..t is
below τ (their logits processor forces EOS as token t; the count is the same). A response shorter than the
window is never stopped, as in their code. The warm-up signal is the prefix DTR (``dtr``) or the lowest group
confidence of the whole trace (``confidence``, their ``min_window``).

Vote: plain majority of the voters' answers; a tie goes to the higher summed signal, then to the answer seen
first (``methods.vote``). Cost = every generated token, warm-up and stopped responses included.

``run_policy`` drives the loop through a ``sample`` callback, so the live run (studies/online.py, which
generates) and ``replay`` (which reads a stored pool) share every decision; a response stopped at token t
looks the same to the policy whether it was generated to t or cut there, so replaying a live run's own store
reproduces it exactly.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from depthlens.config import OnlineConfig
from depthlens.config.voting import Signal
from depthlens.errors import InputError, named
from depthlens.voting.methods import Response, trace_confidence, vote
from depthlens.voting.trials import _std

Sampler = Callable[[Sequence[int], float | None], list[Response]]
"""``sample(indices, tau)``: the responses at these sampling positions, each as the policy sees it — in full
when ``tau`` is None (warm-up), else cut at ``stop_point(response, tau, cfg)`` where that is not None."""


@dataclasses.dataclass(frozen=True)
class Decision:
    """What the policy did with one response, and the vote after its batch."""

    index: int  # position in sampling order
    phase: str  # "warm-up" or "online"
    signal: float
    threshold: float | None  # None during the warm-up
    tokens: int  # generated tokens, the cost of this response
    stopped_at: int | None  # the token count where the policy stopped it; None = it ran to its end
    reason: str  # "warm-up", "cleared τ", "below τ"
    votes: bool
    key: str | None
    leader: str | None  # the leading answer once its batch was counted
    share: float  # the leader's share of the answered votes
    answered: int  # answered votes so far

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class OnlineOutcome:
    answer: str | None
    correct: bool
    tokens: int
    started: int
    threshold: float
    stop: str  # "consensus" or "max-n"
    decisions: tuple[Decision, ...]


def _prefix_dtr(r: Response, cfg: OnlineConfig) -> float:
    return r.prefix_dtr(cfg.decision_prefix)


def _lowest_group(r: Response, cfg: OnlineConfig) -> float:
    return trace_confidence(r.confidence, "lowest", cfg.window)


def _stop_at_prefix(r: Response, tau: float, cfg: OnlineConfig) -> int | None:
    return None if r.prefix_dtr(cfg.decision_prefix) >= tau else min(cfg.decision_prefix, r.length)


def _stop_below_group(r: Response, tau: float, cfg: OnlineConfig) -> int | None:
    if r.length < cfg.window:
        return None
    sums = np.cumsum(np.concatenate([[0.0], r.confidence]))
    groups = (sums[cfg.window :] - sums[: -cfg.window]) / cfg.window  # group ending at token window + j
    below = np.flatnonzero(groups < tau)
    if len(below) == 0:
        return None
    return int(below[0]) + cfg.window


@dataclasses.dataclass(frozen=True)
class OnlineSignal:
    """One online signal, a registry row: a response's signal over what it generated (the warm-up's, which sets
    τ), where the policy stops a response given τ, the name of its method family, and whether the decision falls
    at token ℓ (every response is paused there and only the kept ones continue) or at any token."""

    family: str
    value: Callable[[Response, OnlineConfig], float]
    stop: Callable[[Response, float, OnlineConfig], int | None]
    decides_at_prefix: bool


SIGNALS: dict[Signal, OnlineSignal] = {
    "dtr": OnlineSignal("online think@n", _prefix_dtr, _stop_at_prefix, decides_at_prefix=True),
    "confidence": OnlineSignal("online deepconf", _lowest_group, _stop_below_group, decides_at_prefix=False),
}


def signal(r: Response, cfg: OnlineConfig) -> float:
    """A response's signal over what it generated: prefix DTR, or its lowest group confidence."""
    return SIGNALS[cfg.signal].value(r, cfg)


def threshold(signals: Sequence[float], keep: float) -> float:
    """τ: the warm-up signals' (100·(1 − keep))-th percentile, linear interpolation (DeepConf's rule)."""
    return float(np.percentile(np.asarray(signals, dtype=np.float64), 100 * (1 - keep)))


def stop_point(r: Response, tau: float, cfg: OnlineConfig) -> int | None:
    """Where the policy stops a response (its token count then), or None when it runs to its end."""
    return SIGNALS[cfg.signal].stop(r, tau, cfg)


def cut(r: Response, tokens: int) -> Response:
    """The first ``tokens`` tokens of a response, as a run that stopped it there saw it (no answer)."""
    return Response(None, False, tokens, r.deep[:tokens], r.self_certainty[:tokens], r.confidence[:tokens])


def _tally(
    pool: dict[int, Response], voters: list[int], signals: dict[int, float]
) -> tuple[str | None, int | None, float, int]:
    """(leading answer, its first voter, its share of the answered votes, answered votes)."""
    answered = [i for i in voters if pool[i].key is not None]
    if not answered:
        return None, None, 0.0, 0
    ordered = sorted(answered)
    key, first = vote(
        [pool[i] for i in ordered],
        range(len(ordered)),
        [1.0] * len(ordered),
        [signals[i] for i in ordered],
    )
    share = sum(pool[i].key == key for i in answered) / len(answered)
    return key, ordered[first] if first is not None else None, share, len(answered)


def _tau(cfg: OnlineConfig, warmup: list[float]) -> float:
    """τ: the fixed ``threshold`` where one is given, else the percentile of the warm-up's signals."""
    return cfg.threshold if cfg.threshold is not None else threshold(warmup, cfg.keep)


def run_policy(cfg: OnlineConfig, sample: Sampler) -> OnlineOutcome:
    """One question's online run: warm-up, threshold, batches of early-stopped responses, consensus stop."""
    seen: dict[int, Response] = {}
    signals: dict[int, float] = {}
    voters: list[int] = []
    decisions: list[Decision] = []
    tau: float | None = None
    started = 0
    while True:
        if tau is None:
            indices = list(range(cfg.warmup))
        else:
            indices = list(range(started, min(started + cfg.batch_size, cfg.max_n)))
        got = sample(indices, tau)
        if len(got) != len(indices):
            raise InputError(f"the sampler returned {len(got)} responses for {len(indices)} positions")
        pending = []
        for i, r in zip(indices, got, strict=True):
            seen[i] = r
            signals[i] = signal(r, cfg)
            stop = None if tau is None else stop_point(r, tau, cfg)
            if stop is None:
                voters.append(i)
            reason = "warm-up" if tau is None else "cleared τ" if stop is None else "below τ"
            pending.append((i, r, stop, reason))
        started += len(indices)
        warm = tau is None
        if tau is None:  # the warm-up sets τ once; every batch after it is decided online
            tau = _tau(cfg, [signals[i] for i in indices])
        leader, first, share, answered = _tally(seen, voters, signals)
        for i, r, stop, reason in pending:
            decisions.append(
                Decision(
                    i,
                    "warm-up" if warm else "online",
                    signals[i],
                    None if warm else tau,
                    r.length,
                    stop,
                    reason,
                    stop is None,
                    r.key if stop is None else None,
                    leader,
                    share,
                    answered,
                )
            )
        consensus = answered > 0 and share >= cfg.consensus
        if consensus or started >= cfg.max_n:
            correct = first is not None and seen[first].correct
            return OnlineOutcome(
                leader,
                correct,
                sum(r.length for r in seen.values()),
                started,
                tau,
                "consensus" if consensus else "max-n",
                tuple(decisions),
            )


def replay(pool: Sequence[Response], cfg: OnlineConfig) -> OnlineOutcome:
    """The online policy over a stored pool in its sampling order, without the model.

    Each response must be whole where the policy lets it run (a ``generate`` store, or the live run's own
    store), and read out over ℓ tokens for the ``dtr`` signal.
    A pool shorter than ``max_n`` is enough when consensus stops sampling before it runs out (a live run's
    own store); otherwise the replay fails rather than pretend a smaller budget.
    """

    def sample(indices: Sequence[int], tau: float | None) -> list[Response]:
        if indices and indices[-1] >= len(pool):
            raise InputError(
                f"replaying {named('max_n')} {cfg.max_n} needs response {len(pool) + 1} of a question, but its pool "
                f"has "
                f"{len(pool)}; lower {named('max_n')} or generate a larger {named('pool')}"
            )
        out = []
        for i in indices:
            stop = None if tau is None else stop_point(pool[i], tau, cfg)
            out.append(pool[i] if stop is None else cut(pool[i], stop))
        return out

    return run_policy(cfg, sample)


@dataclasses.dataclass(frozen=True)
class OnlineSummary:
    """One policy replayed over every question, mean ± std (ddof = 1) over sampling orders."""

    signal: str
    consensus: float
    max_n: int
    accuracy_mean: float
    accuracy_std: float
    cost_mean: float  # generated tokens per question
    cost_std: float
    started_mean: float  # responses started per question
    consensus_rate: float  # share of questions stopped by consensus, mean over orders
    trials: int
    questions: int

    def to_dict(self) -> dict[str, float | int | str]:
        return dataclasses.asdict(self)


def sampling_order(pool_size: int, seed: int, trial: int, question: int) -> list[int]:
    """Trial 0 keeps the stored order (the live run's); trial t > 0 a permutation seeded by (seed, t, question)."""
    if trial == 0:
        return list(range(pool_size))
    return np.random.default_rng([seed, trial, question]).permutation(pool_size).tolist()


@dataclasses.dataclass(frozen=True, eq=False)  # identity equality: fields are arrays
class ReplayOutcomes:
    """Every question's outcome in every sampling order: arrays [orders, questions] (questions sorted), the rows a
    paired comparison with offline methods on the same questions needs (``stats.paired``)."""

    questions: tuple[str, ...]
    accuracy: np.ndarray
    cost: np.ndarray
    started: np.ndarray
    consensus: np.ndarray  # 1 where sampling stopped by consensus


def replay_outcomes(
    pools: Mapping[str, Sequence[Response]], cfg: OnlineConfig, trials: int, seed: int = 0
) -> ReplayOutcomes:
    """``replay`` over ``trials`` sampling orders of every question's pool (order 0 = as stored)."""
    if not pools:
        raise InputError("no questions with responses to replay")
    questions = sorted(pools)
    shape = (trials, len(questions))
    out = ReplayOutcomes(tuple(questions), *(np.zeros(shape) for _ in range(4)))
    for trial in range(trials):
        for qi, q in enumerate(questions):
            pool = pools[q]
            o = replay([pool[i] for i in sampling_order(len(pool), seed, trial, qi)], cfg)
            out.accuracy[trial, qi], out.cost[trial, qi] = o.correct, o.tokens
            out.started[trial, qi], out.consensus[trial, qi] = o.started, o.stop == "consensus"
    return out


def replay_trials(
    pools: Mapping[str, Sequence[Response]], cfg: OnlineConfig, trials: int, seed: int = 0
) -> OnlineSummary:
    """``replay`` over ``trials`` sampling orders of every question's pool (order 0 = as stored)."""
    return summarise_replay(replay_outcomes(pools, cfg, trials, seed), cfg)


def summarise_replay(outcomes: ReplayOutcomes, cfg: OnlineConfig) -> OnlineSummary:
    """Mean ± std over sampling orders of the per-order means over questions."""
    accuracy, cost = outcomes.accuracy.mean(1).tolist(), outcomes.cost.mean(1).tolist()
    return OnlineSummary(
        cfg.signal,
        cfg.consensus,
        cfg.max_n,
        float(np.mean(accuracy)),
        _std(accuracy),
        float(np.mean(cost)),
        _std(cost),
        float(np.mean(outcomes.started.mean(1))),
        float(np.mean(outcomes.consensus.mean(1))),
        outcomes.accuracy.shape[0],
        len(outcomes.questions),
    )

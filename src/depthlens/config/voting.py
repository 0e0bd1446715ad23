"""Voting over sampled pools (Think@n and its peers), online Think@n, and the correlation study's protocol
(docs/definitions.md §4, §5, §8)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar, Literal

from depthlens.config.base import (
    MOST_BATCH,
    MOST_RESPONSES,
    Config,
    check_choice,
    check_repeats,
    check_seed,
    invalid,
)
from depthlens.config.readout import PREFIX_TOKENS
from depthlens.errors import named

TieBreak = Literal["uniform", "summed-dtr"]
"""How a vote tied at the top is scored (docs/definitions.md §5). ``uniform``: each tied answer is as likely, so
the draw earns the share of right ones among them (an exact expectation; no DTR in the baselines).
``summed-dtr``: the tied answer whose voters have the highest summed prefix DTR wins, then the one given first."""


@dataclasses.dataclass(frozen=True)
class VotingConfig(Config):
    """Think@n and its comparators over a pool of sampled responses (docs/definitions.md §5).

    Attributes:
        n: responses drawn per question per trial.
        eta: the share of the n kept by Think@n, Short@n, Long@n and Self-Certainty@n (ceil(η·n)); DeepConf-low/-high
            keep their own 10 % / 90 %.
        rank_prefix: ℓ_prefix, the generated tokens whose DTR (or self-certainty) ranks the responses; None = the
            whole response (the full-length ablation). The ``--prefix`` of ``thinkn``.
        trials: resamplings of n from each question's pool; accuracy and cost are mean and draw s.d.
            over them (the spread of re-draws from one pool, not an error bar).
        seed: seeds the draws of the trials.
        deepconf_window: DeepConf's group (sliding window) and tail length, in tokens; their code's 2,048 by
            default, so a response shorter than that scores its mean under every trace score.
        tie_break: how a vote tied at the top is scored (see ``TieBreak``), for every method but DeepConf's,
            which keep their authors' rule (the answer seen first).
    """

    n: int = 16
    eta: float = 0.5
    rank_prefix: int | None = PREFIX_TOKENS
    trials: int = 10
    seed: int = 0
    deepconf_window: int = 2048
    tie_break: TieBreak = "uniform"

    DICT_KEYS: ClassVar[dict[str, str]] = {"rank_prefix": "prefix"}  # a summary's ``voting.prefix``

    def __post_init__(self) -> None:
        if not 1 <= self.n <= MOST_RESPONSES:
            raise invalid(
                "VotingConfig",
                "n",
                self.n,
                f"must be in 1..{MOST_RESPONSES:,} responses per question (no pool holds more)",
            )
        if not (0 < self.eta <= 1):
            raise invalid("VotingConfig", "eta", self.eta, "must be in (0, 1]", "the share of n kept")
        if self.rank_prefix is not None and self.rank_prefix < 1:
            raise invalid(
                "VotingConfig", "rank_prefix", self.rank_prefix, "must be ≥ 1 token", "or None for all"
            )
        check_repeats("VotingConfig", "trials", self.trials)
        check_seed("VotingConfig", "seed", self.seed)
        if self.deepconf_window < 1:
            raise invalid("VotingConfig", "deepconf_window", self.deepconf_window, "must be ≥ 1 token")
        check_choice("VotingConfig", "tie_break", self.tie_break, TieBreak)


@dataclasses.dataclass(frozen=True)
class CorrelationConfig(Config):
    """The correlation study's protocol (docs/definitions.md §4).

    Attributes:
        bins: quantile bins of the metric per question (the paper: 5).
        seeds: repetitions of the per-question subsampling and tie-breaking; binned r is averaged over them.
        n: responses drawn per question per seed; None = the whole pool (then only tie-breaking varies).
        bootstrap: resamples of questions for the 95 % confidence intervals of the unbinned statistics.
        permutations: shuffles of correctness within questions for the within-question r's p-value.
        min_responses: fewer usable responses than this → no statistic, a "too few" note instead.
        min_questions: fewer questions with both right and wrong responses than this → no binned r.
        min_outcome: fewer right (or fewer wrong) responses than this → no statistic: r would hinge on them.
        seed: seeds every random choice of the study.
    """

    bins: int = 5
    seeds: int = 30
    n: int | None = None
    bootstrap: int = 1000
    permutations: int = 1000
    min_responses: int = 20
    min_questions: int = 3
    min_outcome: int = 5
    seed: int = 0

    def __post_init__(self) -> None:
        if not 3 <= self.bins <= MOST_RESPONSES:
            requirement = f"must be in 3..{MOST_RESPONSES:,} (no pool has more responses to bin)"
            raise invalid("CorrelationConfig", "bins", self.bins, requirement, "a correlation over bins")
        for name in ("seeds", "bootstrap", "permutations"):
            check_repeats("CorrelationConfig", name, getattr(self, name))
        if self.n is not None and self.n > MOST_RESPONSES:
            raise invalid(
                "CorrelationConfig", "n", self.n, f"must be at most {MOST_RESPONSES:,} (no pool holds more)"
            )
        if self.n is not None and self.n < self.bins:
            raise invalid(
                "CorrelationConfig",
                "n",
                self.n,
                f"must be ≥ {named('bins', self.bins)}",
                "draw ≥ bins responses",
            )
        for name, least in (("min_responses", 3), ("min_questions", 1), ("min_outcome", 1)):
            if getattr(self, name) < least:
                raise invalid("CorrelationConfig", name, getattr(self, name), f"must be ≥ {least}")
        check_seed("CorrelationConfig", "seed", self.seed)


Signal = Literal["dtr", "confidence"]
"""``dtr``: prefix DTR over the first ℓ generated tokens, decided at token ℓ; ``confidence``: DeepConf's
running group confidence (mean token confidence over the last ``window`` tokens), checked at every token once a
full window exists."""


@dataclasses.dataclass(frozen=True)
class OnlineConfig(Config):
    """Online Think@n and the online DeepConf peer (docs/definitions.md).

    Attributes:
        signal: what decides whether a response goes on (see ``Signal``).
        warmup: responses per question generated in full first; their signals set the threshold τ.
        max_n: the most responses started per question, warm-up included.
        consensus: β — sampling stops once the leading answer holds ≥ β of the answered votes, β in (0.5, 1].
        keep: τ = np.percentile(warm-up signals, 100·(1 − keep)) (linear interpolation, DeepConf's rule); the
            default keeps the same share as Think@n's η.
        decision_prefix: ℓ, the generated tokens whose DTR decides, at token ℓ, whether a response goes on
            (``dtr``); always a number (deciding needs a finite ℓ). The ``--prefix`` of ``thinkn --online``.
        window: DeepConf's group size in tokens (``confidence``); their default 2,048.
        batch_size: later responses started together; the consensus check runs after each such batch, so a
            replay with the same batch size makes the same decisions.
        threshold: a fixed τ (as the llama.cpp DeepConf fork's ``deepconf_threshold``) instead of the warm-up's
            percentile; the warm-up still runs and votes. None = from the warm-up.
    """

    signal: Signal = "dtr"
    warmup: int = 4
    max_n: int = 16
    consensus: float = 0.95
    keep: float = 0.5
    decision_prefix: int = PREFIX_TOKENS
    window: int = 2048
    batch_size: int = 4
    threshold: float | None = None

    DICT_KEYS: ClassVar[dict[str, str]] = {"decision_prefix": "prefix"}  # a manifest's ``online.prefix``

    def __post_init__(self) -> None:
        check_choice("OnlineConfig", "signal", self.signal, Signal)
        if self.warmup < 1:
            raise invalid(
                "OnlineConfig", "warmup", self.warmup, "generate at least 1 warm-up response to set τ"
            )
        if self.max_n > MOST_RESPONSES:
            raise invalid(
                "OnlineConfig", "max_n", self.max_n, f"must be at most {MOST_RESPONSES:,} per question"
            )
        if self.warmup >= self.max_n:
            raise invalid(
                "OnlineConfig",
                "warmup",
                self.warmup,
                f"must be below {named('max_n', self.max_n)} (the warm-up alone would use the whole budget); "
                f"raise {named('max_n')} or lower {named('warmup')}",
            )
        if not (0.5 < self.consensus <= 1):
            raise invalid(
                "OnlineConfig",
                "consensus",
                self.consensus,
                "must lie in (0.5, 1]: the leading answer's share of the votes that stops sampling (a share ≤ 0.5 "
                "is not a majority)",
            )
        if not (0 < self.keep <= 1):
            requirement = "must lie in (0, 1] (the share of warm-up signals above τ)"
            raise invalid("OnlineConfig", "keep", self.keep, requirement)
        if self.decision_prefix < 1:
            raise invalid(
                "OnlineConfig",
                "decision_prefix",
                self.decision_prefix,
                "must be ≥ 1 token for online Think@n",
            )
        if self.window < 1:
            raise invalid("OnlineConfig", "window", self.window, "must be ≥ 1 token")
        if not 1 <= self.batch_size <= MOST_BATCH:
            raise invalid("OnlineConfig", "batch_size", self.batch_size, f"must be in 1..{MOST_BATCH:,}")
        if self.threshold is not None and not math.isfinite(self.threshold):
            raise invalid("OnlineConfig", "threshold", self.threshold, "must be a finite number, or None")

    def to_dict(self) -> dict[str, Any]:
        # Without a fixed τ the dict is the one stores written before ``threshold`` existed hold (their resume).
        data = super().to_dict()
        if data["threshold"] is None:
            del data["threshold"]
        return data

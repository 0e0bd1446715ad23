"""The expectation over every draw (voting.exact) and the η cut's ties (voting.ranked), against brute force.

Brute force here is written without the arrays: every draw of n from the pool (itertools), every order of the drawn
responses as the tie-break of the ranked methods (itertools.permutations: an order's first responses win a tie at the
cut), every subset for random@n, and each kept set voted by ``methods.tally`` one at a time. Pools are small (6, n 4)
and built so that the ranking scores, the lengths and the votes tie often.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from depthlens.config import VotingConfig
from depthlens.voting.exact import exact_outcomes, question_expectations
from depthlens.voting.methods import METHODS, RANKINGS, Response, tally, tiebreak_values
from depthlens.voting.ranked import strata_scores
from depthlens.voting.trials import run_trials

PREFIX = 2


def _pool(seed: int, size: int = 6) -> list[Response]:
    """Responses whose prefix DTR (0, ½, 1 over 2 tokens), length, answer and self-certainty tie often; confidences
    distinct enough for DeepConf's percentile and weights, one grade per answer key as grading gives."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(size):
        deep = rng.integers(0, 2, PREFIX).astype(bool)
        length = int(rng.choice([3, 4, 6]))
        key = [None, "a", "b", "c"][int(rng.integers(4))]
        sc = float(rng.choice([0.1, 0.2]))
        conf = rng.uniform(0.5, 3.0, length)
        full = np.concatenate([deep, rng.integers(0, 2, length - PREFIX).astype(bool)])
        out.append(Response(key, key == "a", length, full, np.full(length, sc), conf))
    return out


def _scores(name: str, drawn: list[Response], cfg: VotingConfig) -> list[float]:
    """Each drawn response's ranking score, computed one response at a time (strata: by hand, below)."""
    if name == "think@n":
        return [r.prefix_dtr(cfg.rank_prefix) for r in drawn]
    if name == "self-certainty@n":
        return [r.prefix_self_certainty(cfg.rank_prefix) for r in drawn]
    if name == "long@n":
        return [float(r.length) for r in drawn]
    if name == "short@n":
        return [-float(r.length) for r in drawn]
    return _strata_by_hand(drawn, cfg)


def _strata_by_hand(drawn: list[Response], cfg: VotingConfig) -> list[float]:
    return _strata_by_hand_values([r.prefix_dtr(cfg.rank_prefix) for r in drawn], [r.length for r in drawn])


def _strata_by_hand_values(dtr: list[float], lengths: list[float]) -> list[float]:
    """Think@n within length strata's score (definitions.md §5), one response at a time: strata cut at the draw's
    length quantiles, the prefix DTR's average rank within its stratum, (rank − ½) / the stratum's size."""
    parts = max(1, min(4, len(dtr) // 2))
    cuts = [float(np.quantile(lengths, q / parts)) for q in range(1, parts)]
    stratum = [sum(length > c for c in cuts) for length in lengths]
    dtr = [round(d, 12) for d in dtr]
    out = []
    for i in range(len(dtr)):
        peers = [j for j in range(len(dtr)) if stratum[j] == stratum[i]]
        rank = sum(dtr[j] < dtr[i] for j in peers) + (sum(dtr[j] == dtr[i] for j in peers) + 1) / 2
        out.append((rank - 0.5) / len(peers))
    return out


def _brute_ranked(name: str, drawn: list[Response], cfg: VotingConfig) -> dict[str, float]:
    """The ranked method on one draw: the mean over every order of the drawn responses as the cut's tie-break."""
    k = math.ceil(cfg.eta * len(drawn))
    scores = [round(s, 12) for s in _scores(name, drawn, cfg)]
    credit, tied, unanswered, cost = [], [], [], []
    for order in itertools.permutations(range(len(drawn))):
        place = {i: p for p, i in enumerate(order)}
        kept = sorted(sorted(range(len(drawn)), key=lambda i: (-scores[i], place[i]))[:k])
        t = tally(drawn, kept, [1.0] * k, tiebreak_values(drawn, kept, cfg), cfg.tie_break)
        credit.append(t.credit)
        tied.append(float(t.tied))
        unanswered.append(float(t.answer is None))
        cost.append(_cost(name, drawn, kept, cfg))
    cut = sorted(scores, reverse=True)
    cut_tied = float(k < len(drawn) and cut[k - 1] == cut[k])
    means = {"accuracy": credit, "tied": tied, "unanswered": unanswered, "cost": cost}
    return {**{f: float(np.mean(v)) for f, v in means.items()}, "cut_tied": cut_tied}


def _cost(name: str, drawn: list[Response], kept: list[int], cfg: VotingConfig) -> float:
    rest = [i for i in range(len(drawn)) if i not in kept]
    finished = sum(drawn[i].length for i in kept)
    if name in ("long@n", "think-strata@n"):
        return float(sum(r.length for r in drawn))
    if name == "short@n":
        longest = max(drawn[i].length for i in kept)
        return finished + sum(min(drawn[i].length, longest) for i in rest)
    return finished + sum(min(drawn[i].length, cfg.rank_prefix) for i in rest)


def _brute_random(drawn: list[Response], cfg: VotingConfig) -> dict[str, float]:
    k = math.ceil(cfg.eta * len(drawn))
    chosen = [list(s) for s in itertools.combinations(range(len(drawn)), k)]
    votes = [tally(drawn, s, [1.0] * k, tiebreak_values(drawn, s, cfg), cfg.tie_break) for s in chosen]
    return {
        "accuracy": float(np.mean([v.credit for v in votes])),
        "tied": float(np.mean([v.tied for v in votes])),
        "unanswered": float(np.mean([v.answer is None for v in votes])),
        "cost": float(np.mean([_cost("random@n", drawn, s, cfg) for s in chosen])),
    }


def _brute(name: str, pool: list[Response], cfg: VotingConfig) -> dict[str, float]:
    """``name``'s expectation over every draw of n from ``pool``, one draw and one vote at a time."""
    per = []
    for picks in itertools.combinations(range(len(pool)), cfg.n):
        drawn = [pool[i] for i in picks]
        if name in RANKINGS:
            per.append(_brute_ranked(name, drawn, cfg))
        elif name == "random@n":
            per.append(_brute_random(drawn, cfg))
        else:  # one vote per draw, the method's own
            o = METHODS[name](drawn, cfg)
            per.append({"accuracy": o.accuracy, "tied": o.tied, "unanswered": o.no_answer, "cost": o.cost})
    return {f: float(np.mean([p[f] for p in per])) for f in per[0]}


CASES = [(seed, rule) for seed in range(6) for rule in ("uniform", "summed-dtr")]


@pytest.mark.parametrize(("seed", "rule"), CASES)
def test_every_method_is_the_expectation_over_every_draw_and_order(seed, rule):
    pool = _pool(seed)
    cfg = VotingConfig(n=4, eta=0.5, rank_prefix=PREFIX, tie_break=rule, deepconf_window=2)
    got, draws, every, random_subsets = question_expectations(pool, cfg, list(METHODS))
    assert (draws, every, random_subsets) == (
        15,
        True,
        (15, True),
    )  # C(6, 4) draws; C(6, 2) subsets of the pool
    for name in METHODS:
        want = _brute(name, pool, cfg)
        for field, value in want.items():
            assert got[name][field] == pytest.approx(value, abs=1e-12), (name, field)


def test_the_pools_tie_at_the_cut_and_in_the_vote():
    """The brute-force cases above are not vacuous: ties at the η cut and at the top of the vote occur in them."""
    cut, top = set(), set()
    for seed, _ in CASES[::2]:
        cfg = VotingConfig(n=4, eta=0.5, rank_prefix=PREFIX, deepconf_window=2)
        got = question_expectations(_pool(seed), cfg, list(METHODS))[0]
        cut |= {m for m in RANKINGS if got[m]["cut_tied"] > 0}
        top |= {m for m in METHODS if got[m]["tied"] > 0}
    assert cut == set(RANKINGS) and {"cons@n", "think@n", "random@n", "short@n"} <= top


@pytest.mark.parametrize("seed", range(4))
def test_one_draw_of_a_ranked_method_is_its_expectation_over_the_tied_orders(seed):
    """The trials' path (``METHODS[name]`` on one draw) gives the same expectation over the cut's tied orders, and
    keeps one of those orders (the earlier of tied responses) as the answer a deployed run would give."""
    pool = _pool(seed, 5)
    cfg = VotingConfig(n=5, eta=0.5, rank_prefix=PREFIX)
    for name in RANKINGS:
        want, outcome = _brute_ranked(name, pool, cfg), METHODS[name](pool, cfg)
        assert outcome.accuracy == pytest.approx(want["accuracy"], abs=1e-12), name
        assert outcome.cost == pytest.approx(want["cost"], abs=1e-12), name
        assert outcome.cut_tied == want["cut_tied"] and len(outcome.kept) == 3
        if not want["cut_tied"]:
            assert outcome.orders == 1


def test_strata_scores_match_their_definition():
    rng = np.random.default_rng(3)
    for n in (2, 3, 4, 8, 9):
        dtr = rng.choice([0.0, 0.25, 0.5], (5, n))
        length = rng.choice([10.0, 20.0, 30.0], (5, n))
        fast = strata_scores(dtr, length)
        for row in range(5):
            assert fast[row].tolist() == pytest.approx(
                _strata_by_hand_values(dtr[row].tolist(), length[row].tolist())
            )


def test_exact_outcomes_beside_the_trials_in_the_summaries():
    pools = {f"q{i}": _pool(10 + i) for i in range(3)}
    cfg = VotingConfig(n=4, eta=0.5, rank_prefix=PREFIX, trials=3, deepconf_window=2)
    exact = exact_outcomes(pools, cfg, ["cons@n", "think@n", "random@n"])
    assert (
        exact.questions == ("q0", "q1", "q2") and exact.draws.tolist() == [15, 15, 15] and exact.every.all()
    )
    for qi, q in enumerate(exact.questions):
        assert exact.accuracy["think@n"][qi] == pytest.approx(_brute("think@n", pools[q], cfg)["accuracy"])
    from depthlens.voting.trials import trial_outcomes

    summaries = {s.method: s for s in trial_outcomes(pools, cfg, ["cons@n", "think@n"]).summaries(exact)}
    think = summaries["think@n"]
    assert think.accuracy_exact == pytest.approx(float(exact.accuracy["think@n"].mean()))
    assert think.draws_exact == 45 and think.draws_all is True and think.cut_tie_share_exact is not None
    assert summaries["cons@n"].cut_tie_share_exact is None  # no cut: not a ranked method
    # without ``exact`` the summaries are the trials' alone
    assert {s.method: s.accuracy_exact for s in run_trials(pools, cfg, ["cons@n"])} == {"cons@n": None}


def test_past_the_limit_the_draws_are_sampled_seeded_and_counted(monkeypatch):
    import depthlens.voting.exact as exact_module

    monkeypatch.setattr(exact_module, "MOST_DRAWS", 10)  # C(6, 4) = 15 > 10: sampled
    monkeypatch.setattr(exact_module, "SAMPLED_DRAWS", 200)
    pool = _pool(1)
    cfg = VotingConfig(n=4, eta=0.5, rank_prefix=PREFIX)
    got, draws, every, _ = question_expectations(pool, cfg, ["think@n"], [0, 0])
    assert (draws, every) == (200, False)
    assert got == question_expectations(pool, cfg, ["think@n"], [0, 0])[0]  # seeded
    exact = _brute("think@n", pool, cfg)["accuracy"]
    assert got["think@n"]["accuracy"] == pytest.approx(exact, abs=0.15)  # 200 draws of 15: near, not equal

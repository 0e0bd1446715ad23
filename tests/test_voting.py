"""Answers, every voting method on hand-built pools, exact costs, tie rules, random@n and trials."""

from __future__ import annotations

import dataclasses
import itertools
import math
import threading

import numpy as np
import pytest

from depthlens.config import VotingConfig
from depthlens.errors import ConfigError, InputError
from depthlens.evals.answers import ExtractionConfig, answers_equivalent, extract_answer, vote_key
from depthlens.voting.methods import (
    METHODS,
    Response,
    percentile_kept,
    random_at_n,
    tally,
    trace_confidence,
    vote,
)
from depthlens.voting.subsets import MOST_SUBSETS
from depthlens.voting.trials import ablation, draw, run_trials

NUMBER = ExtractionConfig()
LAST_NUMBER = ExtractionConfig(fallback="last-number")
WORD = ExtractionConfig("string", fallback="last-number")  # the fallback never applies to a string task
LIST = ExtractionConfig("list", tags=True)
LETTER = ExtractionConfig("letter", choices=4)


@pytest.mark.parametrize(
    ("text", "config", "finished", "expected"),
    [
        (r"so \boxed{3} then \boxed{\frac{1}{2}}.", NUMBER, True, (r"\frac{1}{2}", "boxed")),
        (r"\boxed{x^{2}+\{1\}}", NUMBER, True, (r"x^{2}+\{1\}", "boxed")),
        (r"the answer is \boxed{}-1.", NUMBER, True, ("-1", "phrase")),  # an empty box is no answer
        (r"\boxed 7 done", NUMBER, True, ("7", "boxed")),
        (r"cut \boxed{12", NUMBER, False, None),  # a box the token cap cut open
        ("we get 1,234 apples.", NUMBER, True, None),  # a bare number is not a stated answer
        ("we get 1,234 apples.", LAST_NUMBER, True, ("1,234", "last-number")),
        ("we get 1,234 apples", LAST_NUMBER, False, None),  # never from cut-off text
        ("So the final answer is 42 apples.\nDone", NUMBER, True, ("42", "phrase")),
        ("**Final Answer:** $\\frac{3}{4}$", NUMBER, False, (r"\frac{3}{4}", "phrase")),
        ("The answer is 12", NUMBER, False, None),  # its line was cut: 12 may be 125...
        ("The answer is 12.", NUMBER, False, ("12", "phrase")),
        ("The answer is:\n1. First, add", NUMBER, True, None),  # a numbered step is not an answer
        ("no digits here", LAST_NUMBER, True, None),
        (
            "1. Add 2 and 3\n2. Get 5\n3. Done",
            LAST_NUMBER,
            True,
            ("5", "last-number"),
        ),  # step numbers skipped
        ("Steps:\n1. Identify\n2. Reverse", LAST_NUMBER, True, None),
        ("1. Identify the word\n2. Reverse it: 3 letters", WORD, True, None),
        ("The answer is: olleh.", WORD, False, ("olleh", "phrase")),
        (r"\boxed{\text{olleh}}", WORD, True, ("olleh", "boxed")),
        ("<answer>Hart, find, tax</answer> and 7", LIST, False, ("Hart, find, tax", "tag")),
        ("<answer>Hart, find", LIST, False, None),  # an unclosed tag
        ("<answer>answer here</answer>", LIST, True, None),  # the native prompt's own example, copied
        ("<answer>answer here</answer>", ExtractionConfig(tags=True), True, None),
        ("The answer is: the sum", NUMBER, True, None),  # a number task takes numbers
        (r"The final answer is \boxed{(C)}.", LETTER, True, ("C", "boxed")),
        (r"The final answer is \boxed{B}", LETTER, True, ("B", "boxed")),
        (r"\boxed{\text{(D)}}", LETTER, True, ("D", "boxed")),
        ("so the answer is (A), not 5", LETTER, True, ("A", "phrase")),
        ("I pick (B) ... then (C)", LETTER, True, ("C", "letter")),
        ("D) Neutron", LETTER, True, ("D", "letter")),
        ('The answer to the question "How?" is "nus."', WORD, True, ("nus", "phrase")),
        ("I pick (B) ... then (C)", LETTER, False, None),  # the last mention of a cut-off text
        (r"\boxed{(E)}", LETTER, True, None),  # not one of four choices
        ("The answer is 5", LETTER, True, None),  # a letter task takes letters only
    ],
)
def test_extract_answer(text, config, finished, expected):
    found = extract_answer(text, config, finished)
    assert (None if found is None else (found.text, found.source)) == expected


def test_vote_keys_merge_equal_answers():
    assert len({vote_key(a) for a in ["-4", "-4.0", "−4", "$-4$", "-4.", "x = -4"]}) == 1
    assert vote_key(r"\frac{1}{2}") == vote_key("0.5") == vote_key("1/2")
    assert vote_key("1,000") == vote_key("1000")
    assert vote_key(r"\text{ yes }") == "yes"
    assert vote_key("3") != vote_key("4")


def test_answers_equivalent_on_and_off_the_main_thread():
    assert answers_equivalent(r"\frac{1}{2}", "0.5") is True
    assert answers_equivalent("3", "4") is False
    results = {}

    # Math-Verify's SIGALRM timeout would raise on this thread; the worker process must take over. The timeout is
    # generous because this checks the verdicts, not the time: at 5 s a machine loaded 15x timed "2x" vs "x+x" out
    # (None, counted as wrong), which is the product working as designed, not a wrong answer.
    def worker():
        results["v"] = tuple(
            answers_equivalent(p, g, timeout_s=120) for p, g in (("2x", "x+x"), ("7", "8"), ("1/2", ".5"))
        )

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert results["v"] == (True, False, True)


def _r(key, correct, length, deep, sc=0.0, conf=1.0):
    deep = np.asarray(deep, dtype=bool)
    return Response(key, correct, length, deep, np.full(length, sc), np.full(length, conf))


def test_vote_tie_rule_highest_summed_dtr_then_first():
    pool = [
        _r("1", False, 4, [0, 0]),
        _r("2", True, 4, [1, 1]),
        _r("1", False, 4, [0]),
        _r("2", True, 4, [1]),
    ]
    # two votes each: "2" has the higher summed DTR
    assert vote(pool, [0, 1, 2, 3], [1.0] * 4, [0.0, 1.0, 0.0, 1.0]) == ("2", 1)
    # DTR tied too: the answer given first
    assert vote(pool, [0, 1, 2, 3], [1.0] * 4, [0.5] * 4) == ("1", 0)
    assert vote([_r(None, False, 3, [])], [0], [1.0], [0.0]) == (None, None)


def test_every_method_on_a_hand_built_pool():
    # lengths 10, 20, 30, 40; prefix DTR 1.0, 0.0, 0.5, 0.25 over ℓ = 4; answers a, b, b, a
    pool = [
        _r("a", True, 10, [1, 1, 1, 1], sc=0.1, conf=5.0),
        _r("b", False, 20, [0, 0, 0, 0], sc=0.9, conf=1.0),
        _r("b", False, 30, [1, 1, 0, 0], sc=0.8, conf=2.0),
        _r("a", True, 40, [1, 0, 0, 0], sc=0.2, conf=4.0),
    ]
    # the ties below pinned to summed DTR
    cfg = VotingConfig(n=4, eta=0.5, rank_prefix=4, tie_break="summed-dtr")
    out = {name: method(pool, cfg) for name, method in METHODS.items()}
    assert out["mean@n"].accuracy == 0.5 and out["mean@n"].cost == 100
    # Cons@n: a (DTR 1.25) vs b (0.5), two votes each → a
    assert out["cons@n"].answer == "a" and out["cons@n"].accuracy == 1.0 and out["cons@n"].cost == 100
    # Think@n keeps DTR 1.0 and 0.5 (responses 0, 2); rejected stop at 4 tokens: 10 + 30 + 4 + 4
    assert out["think@n"].kept == (0, 2) and out["think@n"].cost == 48
    assert out["think@n"].cost_paper == 10 + 30 + 4 * 0.5 * 4
    assert out["think@n"].answer == "a"  # one vote each; a has the higher prefix DTR
    # Self-Certainty@n keeps 0.9 and 0.8 (responses 1, 2): both answer b
    assert out["self-certainty@n"].kept == (1, 2) and out["self-certainty@n"].answer == "b"
    assert out["self-certainty@n"].accuracy == 0.0
    # Long@n keeps 40 and 30; Short@n keeps 10 and 20 and stops the rest at 20 tokens
    assert out["long@n"].kept == (2, 3) and out["long@n"].cost == 100
    assert out["short@n"].kept == (0, 1) and out["short@n"].cost == 10 + 20 + 20 + 20
    assert out["short@n"].cost_paper == 10 + 20 + 20 * 0.5 * 4
    # DeepConf (their η, not Think@n's): unfiltered, all four vote, a 5 + 4 vs b 1 + 2
    assert out["deepconf-mean@n"].kept == (0, 1, 2, 3) and out["deepconf-mean@n"].answer == "a"
    assert out["deepconf-mean@n"].cost == 100
    # low: score ≥ np.percentile([5, 1, 2, 4], 90) = 4.7 → response 0; high: ≥ the 10th percentile, 1.3
    assert out["deepconf-low-mean@n"].kept == (0,) and out["deepconf-high-mean@n"].kept == (0, 2, 3)
    assert out["deepconf-high-mean@n"].answer == "a"


def test_deepconf_weights_can_outvote_a_majority():
    pool = [
        _r("x", False, 5, [0], conf=1.0),
        _r("x", False, 5, [0], conf=1.0),
        _r("y", True, 5, [0], conf=3.0),
    ]
    assert METHODS["deepconf-mean@n"](pool, VotingConfig(n=3, eta=1.0)).answer == "y"
    assert METHODS["cons@n"](pool, VotingConfig(n=3, eta=1.0)).answer == "x"


def test_trace_confidence_variants():
    conf = np.array([5.0, 5.0, 1.0, 1.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0, 3.0, 3.0])
    assert trace_confidence(conf, "mean", 2) == pytest.approx(conf.mean())
    assert trace_confidence(conf, "tail", 2) == pytest.approx(3.0)
    # 11 windows of 2; their code averages int(0.1 · 11) = 1 lowest group: (1 + 1) / 2
    assert trace_confidence(conf, "bottom10", 2) == pytest.approx(1.0)
    assert trace_confidence(conf, "lowest", 2) == pytest.approx(1.0)
    # 21 windows of 2 → the 2 lowest: (1 + 1) / 2 and (5 + 1) / 2 (or (1 + 5) / 2)
    longer = np.concatenate([conf, np.full(10, 5.0)])
    assert trace_confidence(longer, "bottom10", 2) == pytest.approx(2.0)
    # a trace no longer than the window scores its mean under every score
    for kind in ("tail", "bottom10", "lowest"):
        assert trace_confidence(conf, kind, 2048) == pytest.approx(conf.mean())


def test_deepconf_filter_is_their_percentile_with_ties_kept():
    scores = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
    assert len(percentile_kept(scores, 0.9)) == 7  # not ⌈0.9 · 8⌉ = 8
    assert percentile_kept(scores, 0.1) == [7]
    assert percentile_kept([2.0, 2.0, 2.0, 1.0], 0.1) == [0, 1, 2]  # ties at the cut all stay


def test_deepconf_drops_unanswered_before_scoring_and_ties_go_to_the_first_seen():
    pool = [
        _r(None, False, 5, [0], conf=9.0),  # most confident, but no answer: not scored, not counted
        _r("x", False, 5, [0], conf=2.0),
        _r("y", True, 5, [1], conf=2.0),
        _r("y", True, 5, [1], conf=1.0),
    ]
    cfg = VotingConfig(n=4)
    low = METHODS["deepconf-low-mean@n"](pool, cfg)
    assert low.kept == (1, 2) and low.answer == "x"  # 2 vs 2: the first seen, although y has the higher DTR
    assert METHODS["deepconf-mean@n"](pool, cfg).answer == "y"  # 3 vs 2
    assert METHODS["deepconf-low-lowest@n"]([_r(None, False, 3, [0])], cfg).answer is None


def test_no_answers_means_wrong():
    pool = [_r(None, False, 3, [1, 1, 1]), _r(None, False, 3, [0, 0, 0])]
    for name, method in METHODS.items():
        outcome = method(pool, VotingConfig(n=2, rank_prefix=3))
        assert outcome.accuracy == 0.0 and outcome.answer is None, name
        assert outcome.voted == (name != "mean@n")


def test_responses_without_an_answer_never_win():
    # three unanswered responses outnumber the one answer, and carry the higher DTR and confidence
    pool = [_r(None, False, 4, [1, 1], conf=9.0)] * 3 + [_r("7", True, 4, [0, 0], conf=1.0)]
    for name, method in METHODS.items():
        outcome = method(pool, VotingConfig(n=4, eta=1.0, rank_prefix=2))
        if name == "random@n":  # one subset (η = 1), reported as its expectation, no single answer
            assert (outcome.accuracy, outcome.no_answer, outcome.subsets) == (1.0, 0.0, 1)
        elif name != "mean@n":
            assert (outcome.answer, outcome.accuracy) == ("7", 1.0), name


def test_deepconf_drops_traces_without_an_answer_before_ranking():
    # the two most confident traces have no answer; DeepConf-low keeps the more confident of the answered two
    pool = [
        _r(None, False, 5, [0], conf=9.0),
        _r("x", False, 5, [0], conf=1.0),
        _r(None, False, 5, [0], conf=8.0),
        _r("y", True, 5, [0], conf=2.0),
    ]
    outcome = METHODS["deepconf-low-mean@n"](pool, VotingConfig(n=4))  # top 10 % of the answered two
    assert outcome.kept == (3,) and outcome.answer == "y" and outcome.cost == 20
    # ranked over all four (as before this rule), the top half would be two unanswered traces: no answer
    assert METHODS["think@n"](pool, VotingConfig(n=4, eta=0.5, rank_prefix=1)).kept == (0, 1)


def test_trials_count_votes_without_an_answer():
    answered = [_r("1", True, 2, [1, 1]), _r("1", True, 2, [1, 1])]
    silent = [_r(None, False, 2, [1, 1]), _r(None, False, 2, [1, 1])]
    summaries = {s.method: s for s in run_trials({"a": answered, "b": silent}, VotingConfig(n=2, trials=3))}
    assert summaries["cons@n"].accuracy_mean == 0.5 and summaries["cons@n"].no_answer == 1.0
    assert summaries["mean@n"].no_answer == 0.0  # Mean@n does not vote


def test_prefix_longer_than_the_readout_is_an_error():
    pool = [_r("a", True, 100, [1] * 10), _r("b", False, 100, [0] * 10)]
    with pytest.raises(InputError, match="readout_tokens"):
        METHODS["think@n"](pool, VotingConfig(n=2, rank_prefix=50))


def test_voting_config_errors():
    with pytest.raises(ConfigError, match=r"^n=0: .* \(VotingConfig.n\)"):
        VotingConfig(n=0)
    for eta in (0.0, 1.5):
        with pytest.raises(ConfigError, match="eta"):
            VotingConfig(eta=eta)


def test_draws_are_reproducible_and_without_replacement():
    a = draw(10, 4, seed=0, trial=3, question=1)
    assert a == draw(10, 4, seed=0, trial=3, question=1)
    assert len(set(a)) == 4 and a != draw(10, 4, seed=0, trial=4, question=1)


def _pools(rng, questions=5, size=8):
    pools = {}
    for q in range(questions):
        pools[f"q{q}"] = [
            _r(
                str(rng.integers(3)),
                bool(rng.integers(2)),
                int(rng.integers(5, 40)),
                rng.integers(0, 2, 50),
                sc=float(rng.random()),
                conf=float(rng.random()),
            )
            for _ in range(size)
        ]
    return pools


def test_trials_mean_and_std(monkeypatch):
    pools = _pools(np.random.default_rng(0))
    cfg = VotingConfig(n=4, trials=6, rank_prefix=5)  # responses are 5–40 tokens: rejected ones stop early
    summary = {s.method: s for s in run_trials(pools, cfg)}
    assert set(summary) == set(METHODS)
    assert summary["think@n"].cost_mean < summary["cons@n"].cost_mean
    assert summary["cons@n"].trials == 6 and summary["cons@n"].questions == 5
    # std over trials, recomputed by hand for Mean@n
    per_trial = []
    for t in range(6):
        acc = [
            np.mean([pools[q][i].correct for i in draw(8, 4, 0, t, qi)]) for qi, q in enumerate(sorted(pools))
        ]
        per_trial.append(np.mean(acc))
    assert summary["mean@n"].accuracy_mean == pytest.approx(np.mean(per_trial))
    assert summary["mean@n"].accuracy_std == pytest.approx(np.std(per_trial, ddof=1))


def test_trials_need_a_pool_of_n():
    with pytest.raises(InputError, match="lower n"):
        run_trials(_pools(np.random.default_rng(1), size=3), VotingConfig(n=4))
    with pytest.raises(InputError, match="unknown method"):
        run_trials(_pools(np.random.default_rng(1)), VotingConfig(n=4), ["best@n"])


def test_ablation_grid_reuses_the_pool():
    rows = ablation(
        _pools(np.random.default_rng(2)), VotingConfig(n=4, trials=2), prefixes=(10, None), etas=(0.5, 1.0)
    )
    assert len(rows) == 2 * 2 * 2
    full_all = [r for r in rows if r["prefix"] == "full" and r["eta"] == 1.0 and r["method"] == "think@n"]
    assert full_all[0]["cost_vs_cons"] == pytest.approx(1.0)  # keeping everything costs what Cons@n does


# A vote under each rule: (answers, grades, prefix DTRs) → the credit each rule gives, and whether the top tied.
TIES = [
    # a 2 – b 2, a right: uniform half credit; summed DTR: b (1 + 1 > 0 + 0) is wrong
    (["a", "b", "a", "b"], [True, False, True, False], [0, 1, 0, 1], 0.5, 0.0, True),
    # a three-way tie with one right: a third; summed DTR picks c, the right one
    (["a", "b", "c"], [False, False, True], [0, 0, 1], 1 / 3, 1.0, True),
    # DTR tied too: summed DTR falls back to the answer given first (a, wrong)
    (["a", "b"], [False, True], [1, 1], 0.5, 0.0, True),
    # no tie: both rules agree
    (["a", "a", "b"], [True, True, False], [0, 0, 1], 1.0, 1.0, False),
]


@pytest.mark.parametrize(("keys", "grades", "dtrs", "uniform", "summed", "tied"), TIES)
def test_a_tie_under_each_rule(keys, grades, dtrs, uniform, summed, tied):
    pool = [_r(k, c, 2, [d, d]) for k, c, d in zip(keys, grades, dtrs, strict=True)]
    for rule, credit in (("uniform", uniform), ("summed-dtr", summed)):
        cfg = VotingConfig(n=len(pool), eta=1.0, rank_prefix=2, tie_break=rule)
        for name in ("cons@n", "think@n", "long@n", "short@n", "self-certainty@n", "random@n"):
            outcome = METHODS[name](pool, cfg)
            assert outcome.accuracy == pytest.approx(credit), (rule, name)
            assert outcome.tied == (1.0 if tied else 0.0), (rule, name)


def test_tally_rules_and_deepconf_keeps_the_first_seen():
    pool = [_r("x", False, 2, [1, 1]), _r("y", True, 2, [0, 0])]
    assert tally(pool, [0, 1], [1.0, 1.0], [1.0, 0.0], "uniform").credit == 0.5
    assert tally(pool, [0, 1], [1.0, 1.0], [1.0, 0.0], "first").answer == "x"
    assert tally(pool, [0, 1], [1.0, 1.0], [0.0, 1.0], "summed-dtr").answer == "y"
    # DeepConf: equal weights tie; the first seen wins under either setting
    for rule in ("uniform", "summed-dtr"):
        outcome = METHODS["deepconf-mean@n"](pool, VotingConfig(n=2, tie_break=rule))
        assert (outcome.answer, outcome.accuracy, outcome.tied) == ("x", 0.0, 1.0)


def _brute_random(pool, cfg):
    """random@n by brute force: Cons@n (η = 1, same tie rule) on every subset of ⌈η·n⌉, averaged."""
    k = math.ceil(cfg.eta * len(pool))
    whole = VotingConfig(n=k, eta=1.0, rank_prefix=cfg.rank_prefix, tie_break=cfg.tie_break)
    outcomes = [
        METHODS["cons@n"]([pool[i] for i in s], whole) for s in itertools.combinations(range(len(pool)), k)
    ]
    return (
        np.mean([o.accuracy for o in outcomes]),
        np.mean([o.tied for o in outcomes]),
        np.mean([o.no_answer for o in outcomes]),
        len(outcomes),
    )


@pytest.mark.parametrize("rule", ["uniform", "summed-dtr"])
@pytest.mark.parametrize(
    ("n", "eta", "seed"), [(5, 0.5, 0), (6, 0.5, 1), (8, 0.5, 2), (7, 0.3, 3), (8, 0.75, 4)]
)
def test_random_at_n_is_the_exact_expectation_over_subsets(rule, n, eta, seed):
    rng = np.random.default_rng(seed)
    keys = [None, "1", "2", "3"]
    pool = [
        _r(keys[int(rng.integers(4))], False, int(rng.integers(3, 9)), rng.integers(0, 2, 4))
        for _ in range(n)
    ]
    pool = [dataclasses.replace(r, correct=r.key == "2") for r in pool]  # one grade per answer, as graded
    cfg = VotingConfig(n=n, eta=eta, rank_prefix=4, tie_break=rule)
    outcome = random_at_n(pool, cfg)
    accuracy, tied, no_answer, count = _brute_random(pool, cfg)
    assert outcome.accuracy == pytest.approx(accuracy, abs=1e-12)
    assert outcome.tied == pytest.approx(tied, abs=1e-12)
    assert outcome.no_answer == pytest.approx(no_answer, abs=1e-12)
    assert outcome.subsets == count
    # cost: Think@n's protocol with each response kept with chance k/n, by hand
    k = math.ceil(eta * n)
    expected = sum(k / n * r.length + (1 - k / n) * min(r.length, 4) for r in pool)
    assert outcome.cost == pytest.approx(expected)
    assert outcome.cost_paper == pytest.approx(k / n * sum(r.length for r in pool) + 4 * eta * n)


def test_random_at_n_samples_past_ten_thousand_subsets_and_says_how_many():
    rng = np.random.default_rng(5)
    pool = [_r(str(int(rng.integers(3))), False, 5, [0, 1]) for _ in range(16)]
    pool = [dataclasses.replace(r, correct=r.key == "0") for r in pool]
    cfg = VotingConfig(n=16, eta=0.5, rank_prefix=2)  # C(16, 8) = 12,870 > 10⁴
    assert math.comb(16, 8) > MOST_SUBSETS
    a = random_at_n(pool, cfg, draw=(0, 0))
    assert a.subsets == MOST_SUBSETS
    assert a == random_at_n(pool, cfg, draw=(0, 0))  # seeded
    assert a.accuracy != random_at_n(pool, cfg, draw=(1, 0)).accuracy  # each draw samples its own
    # the sample's mean is near the exact expectation (12,870 subsets; s.e. of a 0/½/1 mean over 10⁴ ≤ 0.005)
    exact = _brute_random(pool, cfg)[0]
    assert a.accuracy == pytest.approx(exact, abs=0.03)
    summary = {s.method: s for s in run_trials({"q": pool}, VotingConfig(n=16, trials=2), ["random@n"])}
    assert summary["random@n"].subsets == MOST_SUBSETS


def test_trials_count_tie_draws():
    pool = [_r("a", True, 2, [1, 1]), _r("b", False, 2, [0, 0])]  # every draw of 2 is a 1–1 tie
    for rule, cons in (("uniform", 0.5), ("summed-dtr", 1.0)):
        cfg = VotingConfig(n=2, trials=3, rank_prefix=2, tie_break=rule)
        summary = {s.method: s for s in run_trials({"q1": pool, "q2": pool}, cfg)}
        assert summary["cons@n"].tie_draws == 6 and summary["cons@n"].accuracy_mean == cons
        assert summary["random@n"].tie_draws == 0  # one vote of ⌈0.5·2⌉ = 1: never tied
        assert summary["mean@n"].tie_draws == 0


def test_tie_break_is_validated():
    with pytest.raises(ConfigError, match="tie_break"):
        VotingConfig(tie_break="coin")

"""Think@n's selection under two lenses on the same responses (issue 43; docs/findings.md §7).

Two sample stores of the same responses, read out under different lenses (``generate`` with the same task, seeds
and pool, another ``--lens``): checks that their token ids are equal response by response, then votes Think@n on
the draws ``thinkn --from`` makes (trials of n per question, ``voting.trials.draw``) in both and prints Think@n's
accuracy under each lens, the paired test of the two over questions (``stats.paired.paired_test`` on per-question
accuracies, trials averaged), the share of draws whose kept set differs, the Spearman ρ of the prefix DTRs between
the lenses (all responses, and within each question), and how often the Think@n cut falls on a tie.

Usage: python examples/lens_thinkn_compare.py LOGIT_STORE TUNED_STORE [--n 8 --prefix 50 --trials 10 --eta 0.5]
       [--g-second G]   (the second store's deep flags re-derived at threshold G from its stored divergences)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from depthlens.config import DTRConfig, VotingConfig
from depthlens.stats.paired import paired_test
from depthlens.stores.samples import read_manifest, read_responses
from depthlens.studies.thinkn import response_from_record
from depthlens.voting.methods import METHODS, Response
from depthlens.voting.trials import draw


def load(
    store: str, g: float | None = None
) -> tuple[dict[str, Any], dict[str, tuple[dict[str, Any], Response]]]:
    """The store's manifest and its usable responses by id: (record, Response with the store's own DTR rule, or
    its rule with threshold ``g`` where given)."""
    manifest = read_manifest(Path(store))
    dtr = DTRConfig.from_dict({**manifest["dtr"], **({} if g is None else {"g": g})})
    out = {}
    for _, record in read_responses(Path(store)):
        if record.get("status") != "failed":
            out[record["id"]] = (record, response_from_record(record, int(manifest["n_layers"]), dtr))
    return manifest, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("first")
    ap.add_argument("second")
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--prefix", type=int, default=50)
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--eta", type=float, default=0.5)
    ap.add_argument("--g-second", type=float, help="the second store's g (bits); default: its manifest's")
    a = ap.parse_args()
    stores = {}
    for path, g in ((a.first, None), (a.second, a.g_second)):
        manifest, responses = load(path, g)
        stores[f"{manifest['readout']['lens']} ({path})"] = responses
    (la, first), (lb, second) = stores.items()
    print(f"lenses: {la} | {lb}")
    if set(first) != set(second):
        sys.exit(f"the stores hold other responses ({len(set(first) ^ set(second))} ids in one only)")
    same = sum(list(first[i][0]["token_ids"]) == list(second[i][0]["token_ids"]) for i in first)
    print(f"responses {len(first)}; token ids equal in {same}")
    if same != len(first):
        sys.exit("token ids differ: these are not the same responses")

    voting = VotingConfig(n=a.n, rank_prefix=a.prefix, trials=a.trials, eta=a.eta)
    questions = sorted({r["question_id"] for r, _ in first.values()})  # thinkn's order (trial_outcomes sorts)
    pools = {
        q: sorted(
            (i for i in first if first[i][0]["question_id"] == q), key=lambda s: int(s.rsplit("#", 1)[1])
        )
        for q in questions
    }
    acc = {lens: np.zeros((a.trials, len(questions))) for lens in stores}
    differ, overlap, tied, kept_size = 0, [], dict.fromkeys(stores, 0), 0
    for t in range(a.trials):
        for qi, q in enumerate(questions):
            drawn = [pools[q][i] for i in draw(len(pools[q]), a.n, voting.seed, t, qi)]
            kept = {}
            for lens, s in stores.items():
                rs = [s[i][1] for i in drawn]
                outcome = METHODS["think@n"](rs, voting)
                acc[lens][t, qi], kept[lens] = outcome.accuracy, set(outcome.kept)
                kept_size = len(outcome.kept)
                ranked = sorted((r.prefix_dtr(a.prefix) for r in rs), reverse=True)
                tied[lens] += (
                    kept_size < len(ranked) and abs(ranked[kept_size - 1] - ranked[kept_size]) < 1e-12
                )
            differ += kept[la] != kept[lb]
            overlap.append(len(kept[la] & kept[lb]))
    draws = a.trials * len(questions)
    for lens in stores:
        per_trial = acc[lens].mean(1)
        print(
            f"think@n under {lens}: accuracy {per_trial.mean():.4f} ± {np.std(per_trial, ddof=1):.4f} (trials)"
        )
    test = paired_test(acc[lb].mean(0), acc[la].mean(0), rng=0)
    print(
        f"think@n second − first over {test.questions} questions: {100 * test.difference:+.1f} points "
        f"[{100 * test.low:+.1f}, {100 * test.high:+.1f}], p {test.p:.3g}, {test.wins} won / {test.losses} lost, "
        f"s.d. {100 * test.sd:.1f} points"
    )
    print(
        f"draws whose kept set differs: {differ}/{draws} = {differ / draws:.3f}; "
        f"kept sets share {np.mean(overlap):.2f} of {kept_size} responses on average"
    )
    ids = sorted(first)
    da = np.array([first[i][1].prefix_dtr(a.prefix) for i in ids])
    db = np.array([second[i][1].prefix_dtr(a.prefix) for i in ids])
    rho = float(stats.spearmanr(da, db).statistic)
    z, se = np.arctanh(min(rho, 0.999999)), 1 / np.sqrt(len(ids) - 3)
    print(
        f"prefix-{a.prefix} DTR: mean {da.mean():.3f} | {db.mean():.3f}; zero in {np.mean(da == 0):.3f} | "
        f"{np.mean(db == 0):.3f}; Spearman ρ {rho:.3f} over {len(ids)} responses (Fisher 95 % "
        f"{np.tanh(z - 1.96 * se):.3f}–{np.tanh(z + 1.96 * se):.3f}, responses taken as independent)"
    )
    within = []
    for q in questions:
        x = np.array([first[i][1].prefix_dtr(a.prefix) for i in pools[q]])
        y = np.array([second[i][1].prefix_dtr(a.prefix) for i in pools[q]])
        if np.ptp(x) > 0 and np.ptp(y) > 0:
            within.append(float(stats.spearmanr(x, y).statistic))
    print(
        f"within-question Spearman ρ: median {np.median(within):.3f}, quartiles {np.quantile(within, 0.25):.3f}–"
        f"{np.quantile(within, 0.75):.3f} over {len(within)} questions"
    )
    print(
        "draws whose Think@n cut falls on a tie (broken by pool order): "
        + "; ".join(f"{lens} {tied[lens]}/{draws}" for lens in stores)
    )


if __name__ == "__main__":
    main()

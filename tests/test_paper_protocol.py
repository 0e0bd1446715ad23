"""examples/paper_protocol.py, the paper's Table 2 protocol in one command, run at toy size: the tiny llama on a
reasoning-gym family with the hf backend (the recipe's default is vLLM on a GPU), n = 4 of a pool of 6 — the same
script and the same commands as at n = 48."""

from __future__ import annotations

import csv
import json
import runpy
import shlex
import sys
from pathlib import Path

import pytest

from tests.conftest import save_chat_model

SCRIPT = Path(__file__).parent.parent / "examples" / "paper_protocol.py"


def test_the_protocol_runs_end_to_end_at_toy_size(tmp_path, monkeypatch):
    model = save_chat_model(tmp_path / "model")
    monkeypatch.setenv(
        "DEPTHLENS", shlex.join([sys.executable, "-c", "from depthlens.cli.app import main; main()"])
    )
    protocol = runpy.run_path(str(SCRIPT))
    out = tmp_path / "run"
    args = [str(out), "--model", str(model), "--tasks", "reasoning_gym:chain_sum", "--task-config"]
    args += ["min_terms=2,max_terms=2,max_digits=1", "--questions", "3", "--n", "4", "--pool", "6"]
    args += [
        "--max-new-tokens",
        "12",
        "--temperature",
        "1.0",
        "--top-p",
        "1.0",
        "--backend",
        "hf",
        "--device",
        "cpu",
    ]
    protocol["main"](args)
    store = out / "reasoning_gym_chain_sum"
    summary = json.loads((store / "thinkn-n4-eta0.5-l50.json").read_text())
    methods = {m["method"]: m for m in summary["methods"]}
    # every method, each exact over all C(6, 4) = 15 draws of each of the 3 questions, Think@n's control beside it
    assert {
        "think@n",
        "cons@n",
        "random@n",
        "short@n",
        "think-strata@n",
        "self-certainty@n",
    } <= methods.keys()
    assert all(
        m["draws_exact"] == 45 and m["draws_all"] and m["accuracy_exact"] is not None
        for m in methods.values()
    )
    assert summary["control"]["vs"] == "random@n" and "excludes_0" in summary["control"]
    assert summary["per_question"]["basis"] == "exact"
    with (out / f"correlation-{store.name}" / "correlation.csv").open() as f:
        assert "r_within_partial" in next(csv.DictReader(f))  # length held fixed
    report = (out / "report" / "report.md").read_text()
    assert "Think@n − random@n, the control" in report and "exact expectation over every draw" in report


def test_the_defaults_are_the_papers_and_bad_settings_are_refused():
    protocol = runpy.run_path(str(SCRIPT))
    args = protocol["parse"](["runs/p"])
    lines = [" ".join(c) for c in protocol["commands"](args)]
    assert "--backend vllm" in lines[0] and "--pool 64" in lines[0] and "--task aime2024" in lines[0]
    assert "thinkn --from runs/p/aime2024 --n 48 --eta 0.5 --prefix 50 --trials 10 --methods all" in lines[1]
    assert (
        lines[-1] == "report runs/p" and len(lines) == 7
    )  # two tasks × (generate, thinkn, correlate), report
    with pytest.raises(SystemExit, match="smaller than --n"):
        protocol["commands"](protocol["parse"](["runs/p", "--pool", "40"]))

"""Errors that say "did you mean" (issue 52, item 5): task names, --task-config keys, input paths; a JSONL line
without an id; input errors before torch is imported."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from depthlens.config import TaskSpec
from depthlens.errors import InputError, close_names, did_you_mean, missing_path
from depthlens.evals.loading import check_task, load_task, parse_task_config
from depthlens.stores.inputs import read_records
from tests.test_cli import run


def test_close_names_match_spelling_and_dropped_underscores():
    names = ["chain_sum", "decimal_chain_sum", "basic_arithmetic"]
    assert close_names("chainsum", names) == ["chain_sum"]
    assert close_names("Chain-Sum", names) == ["chain_sum"]
    assert close_names("basic_arithmetik", names) == ["basic_arithmetic"]
    assert did_you_mean("zzz", names) == ""
    assert (
        did_you_mean("chainsum", names, prefix="reasoning_gym:") == "; did you mean reasoning_gym:chain_sum?"
    )


def test_task_names_suggest_the_near_one():
    with pytest.raises(InputError, match=r"dataset 'chainsum'; did you mean reasoning_gym:chain_sum\?"):
        load_task("reasoning_gym:chainsum", 2)
    with pytest.raises(InputError, match=r"unknown task 'chain_sum'; did you mean reasoning_gym:chain_sum\?"):
        load_task("chain_sum", 2)
    with pytest.raises(InputError, match=r"unknown task 'aime2023'; did you mean aime2025 or aime2024\?"):
        check_task(TaskSpec("aime2023"))


def test_task_config_keys_are_checked_against_the_config_class():
    with pytest.raises(InputError) as info:
        load_task("reasoning_gym:chain_sum", 2, config=parse_task_config("min_term=2"))
    message = str(info.value)
    assert message.startswith("task_config min_term=2: reasoning-gym dataset 'chain_sum' has no setting")
    assert "did you mean min_terms or max_terms?" in message
    assert "(its settings: min_terms, max_terms, min_digits, max_digits, allow_negation)" in message
    assert "__init__" not in message and "unexpected keyword" not in message
    with pytest.raises(InputError, match="seed is set by task_seed"):
        check_task(TaskSpec("reasoning_gym:chain_sum", task_config="seed=3"))
    assert len(load_task("reasoning_gym:chain_sum", 2, config=parse_task_config("min_terms=2"))) == 2


def test_a_missing_file_names_the_near_files_beside_it(tmp_path):
    (tmp_path / "questions.jsonl").write_text("")
    (tmp_path / "other.txt").write_text("")
    message = missing_path(tmp_path / "questons.jsonl", "task data")
    assert message.endswith(f"does not exist; did you mean {tmp_path}/questions.jsonl?")
    assert missing_path(tmp_path / "nothing-like-it.csv", "task data").endswith("does not exist")
    assert "nor does its folder" in missing_path(tmp_path / "no" / "x.jsonl", "task data")
    with pytest.raises(InputError, match=r"did you mean .*/questions.jsonl\?"):
        check_task(TaskSpec(str(tmp_path / "questons.jsonl")))


def test_a_jsonl_line_without_an_id_is_refused_or_skipped(tmp_path):
    path = tmp_path / "in.jsonl"
    lines = [
        {"id": "a", "prompt_ids": [1], "completion_ids": [2]},
        {"prompt_ids": [1], "completion_ids": [3]},
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    with pytest.raises(
        InputError, match=r"in.jsonl:2: no 'id'; give each record a unique id, e.g. \"id\": \"line-2\""
    ):
        read_records(path)
    records, bad = read_records(path, skip_bad=True)
    assert [r.id for r in records] == ["a"] and [b.line for b in bad] == [2]


def test_the_cli_suggests_a_near_input_file(monkeypatch, capsys, tmp_path):
    (tmp_path / "inputs.jsonl").write_text("")
    code, _, err = run(
        monkeypatch, capsys, "score", "--in", tmp_path / "input.jsonl", "--out", tmp_path / "o"
    )
    assert code == 2
    assert f"path '{tmp_path}/input.jsonl' does not exist; did you mean {tmp_path}/inputs.jsonl?" in err


@pytest.mark.parametrize(
    "args",
    [
        ["score", "--in", "noid.jsonl", "--out", "o"],
        ["generate", "--task", "questons.jsonl", "--out", "g"],
        ["generate", "--task", "reasoning_gym:chain_sum", "--task-config", "min_term=2", "--out", "g"],
    ],
)
def test_input_errors_come_before_torch_is_imported(tmp_path, args):
    (tmp_path / "noid.jsonl").write_text(json.dumps({"prompt_ids": [1], "completion_ids": [2]}) + "\n")
    script = (
        "import sys\nfrom depthlens.cli.app import main\n"
        f"sys.argv = ['depthlens', *{args!r}]\n"
        "try:\n    main()\nexcept SystemExit as exit:\n    print(exit.code, 'torch' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.stdout.split() == ["2", "False"], done.stderr
    assert "error:" in done.stderr

"""The command line, called in-process: outputs, exit codes and the exact error lines."""

from __future__ import annotations

import json
import sys

import pytest

from depthlens.cli.app import main
from depthlens.stores.jsonl import iter_jsonl
from tests.conftest import tiny_model


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-llama")
    tiny_model("llama").save_pretrained(path)
    return path


def run(monkeypatch, capsys, *args, columns: str = "400"):
    monkeypatch.setattr(sys, "argv", ["depthlens", *map(str, args)])
    monkeypatch.setenv("COLUMNS", columns)  # 400: one error per line, unwrapped
    with pytest.raises(SystemExit) as info:
        main()
    out, err = capsys.readouterr()
    return info.value.code, out, err


def _input(tmp_path, *extra):
    lines = [json.dumps({"id": "a", "prompt_ids": [4, 5, 6], "completion_ids": [7, 8, 9, 10]}), *extra]
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_score_writes_records(monkeypatch, capsys, tmp_path, tiny_dir):
    src, out = _input(tmp_path), tmp_path / "out.jsonl"
    code, _, err = run(
        monkeypatch,
        capsys,
        "score",
        "--model",
        tiny_dir,
        "--in",
        src,
        "--out",
        out,
        "--tokens",
        "--prefix",
        "2",
        "--divergence",
        "kl",
        "--device",
        "cpu",
    )
    assert code in (0, None), err
    (record,) = iter_jsonl(out)
    assert record["token_count"] == 4 and len(record["divergence"]) == 4 and "dtr_prefix" in record
    assert len(record["tcb"]) == 4 and record["tcb_min"] == min(record["tcb"])
    assert f"wrote {out}" in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--rho", "1.5"], "error: --rho 1.5: must be in (0, 1]"),
        (["--epsilon", "0"], "error: --epsilon 0.0: must be a finite number > 0"),
        (["--v-eff", "x"], "error: --v-eff x: must be one of ipr, exp-entropy"),
        (["--g", "-1"], "error: --g -1.0: must be a finite number ≥ 0"),
        (
            ["--divergence", "js"],
            "error: --divergence js: must be one of jsd, jsd-nat, kl, cosine",
        ),
        (["--deep-rule", "x"], "error: --deep-rule x: must be one of spec, paper-literal"),
        (
            ["--device", "cuda:7"],
            "error: device 'cuda:7' asked for, but CUDA is not available here; use --device cpu",
        ),
    ],
)
def test_invalid_options_exit_2_with_the_reason(monkeypatch, capsys, tmp_path, tiny_dir, args, message):
    src = _input(tmp_path)
    code, _, err = run(
        monkeypatch, capsys, "score", "--model", tiny_dir, "--in", src, "--out", tmp_path / "o.jsonl", *args
    )
    assert code == 2
    assert message in " ".join(err.split()), err


def test_malformed_line_exit_2_naming_the_line(monkeypatch, capsys, tmp_path, tiny_dir):
    src = _input(tmp_path, "{oops")
    code, _, err = run(
        monkeypatch, capsys, "score", "--model", tiny_dir, "--in", src, "--out", tmp_path / "o.jsonl"
    )
    assert code == 2
    assert f"error: {src}:2: not valid JSON" in err and "--skip-bad" in err
    code, _, err = run(
        monkeypatch,
        capsys,
        "score",
        "--model",
        tiny_dir,
        "--in",
        src,
        "--out",
        tmp_path / "o.jsonl",
        "--skip-bad",
        "--overwrite",
    )
    assert code in (0, None)
    assert f"skipped line 2: {src}:2: not valid JSON" in " ".join(err.split())


def test_unknown_model_is_one_line(monkeypatch, capsys, tmp_path):
    code, _, err = run(
        monkeypatch,
        capsys,
        "score",
        "--model",
        tmp_path / "missing.gguf",
        "--in",
        _input(tmp_path),
        "--out",
        tmp_path / "o.jsonl",
    )
    assert code == 2
    assert err.strip() == f"error: GGUF file '{tmp_path / 'missing.gguf'}' does not exist"


def test_models_lists_the_catalogue(monkeypatch, capsys):
    code, out, _ = run(monkeypatch, capsys, "models")
    assert code in (0, None)
    for name in ("smollm2-135m-instruct (default)", "qwen2.5-coder-0.5b-instruct", "gemma3-270m"):
        assert name in out
    code, _, err = run(monkeypatch, capsys, "models", "--install", "llama-70b")
    assert code == 2 and "'llama-70b' is not in the offline catalogue" in err

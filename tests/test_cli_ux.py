"""A new user's first hour, at 80 columns: early checks, fast failures, readable tokens, the summary, warnings,
flags named in errors, and docs that stay inside the repository. Every assertion matches the text a user sees."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from depthlens.models import catalogue
from depthlens.models.tokens import piece_bytes, readable, token_texts
from depthlens.stores.jsonl import iter_jsonl
from tests.conftest import tiny_model
from tests.test_cli import run

ROOT = Path(__file__).resolve().parent.parent
BOGUS = "no-such-model-anywhere"
NOT_FOUND = (
    f"error: could not load model '{BOGUS}': not a catalogue name ({', '.join(catalogue.CATALOGUE)}), "
    "not a local directory or .gguf file, and not in the local Hugging Face cache "
)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-llama-ux")
    tiny_model("llama").save_pretrained(path)
    return path


def run80(monkeypatch, capsys, *args):
    """The command line in-process, as a terminal of 80 columns would show it."""
    code, out, err = run(monkeypatch, capsys, *args, columns="80")
    return code or 0, out, err


def cli(*args, **env):
    """The installed command in a fresh process (what a user's shell runs), not a terminal, 80 columns."""
    environ = {**os.environ, "COLUMNS": "80", "PYTHONPATH": str(ROOT / "src"), **env}
    done = subprocess.run(
        [sys.executable, "-c", "from depthlens.cli.app import main; main()", *map(str, args)],
        capture_output=True,
        text=True,
        env=environ,
        timeout=120,
        check=False,
    )
    return done.returncode, done.stdout, done.stderr


def _input(tmp_path, *records):
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


RECORD = {"id": "a", "prompt_ids": [4, 5, 6], "completion_ids": [7, 8, 9, 10]}


# 1. Checks that need no model come before it loads: with a model name that points nowhere, the input's or the
# output's error is the one reported.
@pytest.mark.parametrize(
    ("lines", "exists", "flags", "message"),
    [
        (['{"id": 1}'], False, [], "error: {src}:1: needs 'prompt' + 'completion', 'messages' + 'completion', or "
         "'prompt_ids' + 'completion_ids'; found keys ['id'] (pass --skip-bad to skip such lines)"),
        ([json.dumps(RECORD)] * 2, False, [], "error: {src}:2: id 'a' already used on line 1 (pass --skip-bad to skip "
         "such lines)"),
        ([json.dumps(RECORD)], True, [], "error: {out} already exists; pass --resume to continue it or --overwrite "
         "to replace it"),
        ([json.dumps(RECORD)], True, ["--resume"], "error: {out} has no manifest (out.jsonl.manifest.json); it was "
         "not written by depthlens"),
    ],
)  # fmt: skip
def test_input_and_output_errors_come_before_the_model(
    monkeypatch, capsys, tmp_path, lines, exists, flags, message
):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("\n".join(lines) + "\n")
    if exists:
        out.write_text("{}\n")
    code, _, err = run80(monkeypatch, capsys, "score", "--in", src, "--out", out, "--model", BOGUS, *flags)
    assert code == 2
    assert " ".join(err.split()) == message.format(src=src, out=out)


def test_resume_with_other_settings_is_refused_before_the_model(monkeypatch, capsys, tmp_path, tiny_dir):
    src, out = _input(tmp_path, RECORD), tmp_path / "out.jsonl"
    code, _, err = run80(monkeypatch, capsys, "score", "--in", src, "--out", out, "--model", tiny_dir, "-q")
    assert code == 0, err
    # Same model name, other --g: refused; the manifest names the model, so the check needs no weights.
    os.rename(tiny_dir, tmp_path / "moved")  # loading it now would fail: the refusal must come first
    try:
        code, _, err = run80(
            monkeypatch,
            capsys,
            "score",
            "--in",
            src,
            "--out",
            out,
            "--model",
            tiny_dir,
            "--resume",
            "--g",
            "0.3",
        )
    finally:
        os.rename(tmp_path / "moved", tiny_dir)
    assert code == 2
    assert " ".join(err.split()) == (
        f"error: cannot resume {out}: dtr.g: stored 0.5, this run 0.3 — use the stored settings, or a new --out"
    )


def test_generate_checks_its_store_before_the_model(monkeypatch, capsys, tmp_path):
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "samples.jsonl").write_text("{}\n")
    code, _, err = run80(monkeypatch, capsys, "generate", "--out", tmp_path / "store", "--model", BOGUS)
    assert code == 2
    samples = tmp_path / "store" / "samples.jsonl"
    assert " ".join(err.split()) == (
        f"error: {samples} already exists; pass --resume to continue it or --overwrite to replace it"
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["tcb", "prompts", "--templates", "bare,nah"], "error: --templates bare,nah: unknown nah; known: bare, paper, "
         "terse, expert"),
        (["thinkn", "--methods", "think@n,vote@n"], "error: --methods think@n,vote@n: unknown vote@n; known: mean@n, "
         "cons@n, think@n, random@n, self-certainty@n, long@n, short@n, think-strata@n, deepconf-mean@n, "
         "deepconf-tail@n, deepconf-bottom10@n, deepconf-lowest@n, deepconf-low-mean@n, deepconf-low-tail@n, "
         "deepconf-low-bottom10@n, deepconf-low-lowest@n, "
         "deepconf-high-mean@n, deepconf-high-tail@n, deepconf-high-bottom10@n, deepconf-high-lowest@n"),
        (["heatmap", "--completion", "x", "--token", "-1"], "error: --token -1: give a token index, 0 or more"),
    ],
)  # fmt: skip
def test_study_options_are_checked_before_the_model(monkeypatch, capsys, tmp_path, args, message):
    code, _, err = run80(monkeypatch, capsys, *args, "--out", tmp_path / "o", "--model", BOGUS)
    assert code == 2
    assert " ".join(err.split()) == message


# 2. A name that points nowhere fails at once, saying why; no hub retries.
def test_unknown_model_fails_at_once_offline(tmp_path):
    src = _input(tmp_path, RECORD)
    code, out, err = cli(
        "score", "--in", src, "--out", tmp_path / "o.jsonl", "--model", BOGUS, HF_HUB_OFFLINE="1"
    )
    assert (code, out) == (2, "")
    assert " ".join(err.split()) == NOT_FOUND + "(HF_HUB_OFFLINE is set)"


def test_unknown_model_fails_at_once_when_the_hub_is_unreachable(tmp_path):
    src = _input(tmp_path, RECORD)
    # Port 9 (discard) on this machine refuses at once: the same answer as a machine without internet.
    code, _, err = cli(
        "score",
        "--in",
        src,
        "--out",
        tmp_path / "o.jsonl",
        "--model",
        BOGUS,
        HF_ENDPOINT="http://127.0.0.1:9",
        HF_HUB_OFFLINE="",
    )
    assert code == 2
    assert " ".join(err.split()) == NOT_FOUND + "(the Hugging Face Hub (127.0.0.1) is unreachable)"


def test_install_progress_reports_bytes_then_tensors():
    """The catalogue's progress protocol: the amounts a display shows, in the order it gets them."""
    from depthlens.models.catalogue import _conversion_steps

    seen: list[tuple[int, int, str]] = []
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    with _conversion_steps(lambda done, total, unit: seen.append((done, total, unit))):
        assert list(
            gguf_utils.tqdm(["a", "b", "c"], desc="Converting and de-quantizing GGUF tensors...")
        ) == [
            "a",
            "b",
            "c",
        ]
    assert seen == [(1, 3, "tensors"), (2, 3, "tensors"), (3, 3, "tensors")]
    assert gguf_utils.tqdm.__module__.startswith("tqdm")  # restored


# 3. Readable tokens.
@pytest.mark.parametrize(
    ("piece", "byte_level", "label"),
    [
        ("ĠcafÃ©", True, "␣café"),
        ("Ã¯ve", True, "ïve"),
        ("Ċ", True, "↵"),
        ("ĉok", True, "⇥ok"),
        ("ĠðŁĺ", True, "␣⟨f0⟩⟨9f⟩⟨98⟩"),  # the first three bytes of 😀; the fourth is the next token
        ("▁naïve", False, "␣naïve"),
        ("<0xE2>", False, "⟨e2⟩"),
        ("<0x0A>", False, "↵"),
    ],
)
def test_token_labels_are_readable(piece, byte_level, label):
    assert readable(piece_bytes(piece, byte_level)) == label


def test_token_labels_of_a_tokenizer_without_byte_pieces():
    from tests.conftest import CharTokenizer

    assert token_texts(CharTokenizer(), [3, 13, 14]) == ["0", "␣", "."]


@pytest.mark.integration
def test_scored_tokens_are_readable_and_ids_exact(real_model):
    from depthlens.studies.score import score

    [record] = score(real_model, [{"id": "x", "prompt": "Say:", "completion": " café naïve\n"}], tokens=True)
    assert record["tokens"] == ["␣café", "␣na", "ïve", "↵"]
    assert real_model.tokenizer.decode(record["token_ids"]) == " café naïve\n"
    assert token_texts(real_model.tokenizer, record["token_ids"]) == record["tokens"]


# 4. The summary at the end of score, and --quiet.
def test_score_ends_with_a_summary(monkeypatch, capsys, tmp_path, tiny_dir):
    src = _input(tmp_path, RECORD, {"id": "b", "prompt_ids": [4], "completion_ids": [11, 12]})
    out = tmp_path / "out.jsonl"
    code, stdout, err = run80(monkeypatch, capsys, "score", "--in", src, "--out", out, "--model", tiny_dir)
    assert code == 0, err
    a, b = iter_jsonl(out)
    n_layers = json.loads((tmp_path / "out.jsonl.manifest.json").read_text())["n_layers"]
    most, least = max((a, b), key=lambda r: r["dtr"]), min((a, b), key=lambda r: r["dtr"])  # ties: the first
    rows = [
        ("records", "2"),
        ("tokens", "6"),
        ("mean DTR", f"{(a['dtr'] + b['dtr']) / 2:.3f}"),
        (
            "mean settling depth",
            f"{(a['mean_settling_depth'] + b['mean_settling_depth']) / 2:.1f} of {n_layers} layers",
        ),
        ("most deep", f"{most['id']} (DTR {most['dtr']:.3f}, {most['token_count']} tokens)"),
        ("least deep", f"{least['id']} (DTR {least['dtr']:.3f}, {least['token_count']} tokens)"),
    ]
    lines = stdout.splitlines()
    assert lines[0].strip() == "score summary"
    cells = [tuple(c.strip() for c in line.strip("│").split("│")) for line in lines if line.startswith("│")]
    assert cells == rows
    assert err.rstrip().endswith(f"wrote {out}")
    code, stdout, _ = run80(
        monkeypatch, capsys, "score", "--in", src, "--out", out, "--model", tiny_dir, "--overwrite", "--quiet"
    )
    assert code == 0 and stdout == ""


# 5. 80 columns, flags in errors, --version, -h, boolean flags.
def test_models_table_fits_80_columns():
    code, out, _ = cli("models")
    assert code == 0
    assert max(len(line) for line in out.splitlines()) <= 80
    assert "│ smollm2-135m-instruct (default)" in out


def test_help_shows_flags_and_whole_defaults():
    code, out, _ = cli("score", "-h")
    assert code == 0 and max(len(line) for line in out.splitlines()) <= 80
    lines = out.splitlines()
    assert any(
        line.split() == ["--tokens", "Also", "write", "per-token", "tokens,", "settling,", "deep"]
        for line in lines
    )
    assert "[default: smollm2-135m-instruct]" in out
    assert "-h, --help" in out and "docs/definitions.md" in out


def test_version():
    from depthlens import __version__

    assert cli("--version")[:2] == (0, f"depthlens {__version__}\n")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--rho", "1.5"], "error: --rho 1.5: must be in (0, 1]"),
        (["--g", "-1"], "error: --g -1.0: must be a finite number ≥ 0"),
        (["--epsilon", "0"], "error: --epsilon 0.0: must be a finite number > 0"),
        (["--divergence", "js"], "error: --divergence js: must be one of jsd, jsd-nat, kl, cosine"),
        (["--deep-rule", "x"], "error: --deep-rule x: must be one of spec, paper-literal"),
        (
            ["--g", "nan"],
            "error: invalid value for '--g': must be a finite number, not nan; see `depthlens score --help`",
        ),
        (
            ["--rho", "inf"],
            "error: invalid value for '--rho': must be a finite number, not inf; see `depthlens score --help`",
        ),
        (
            ["--epsilon", "-inf"],
            "error: invalid value for '--epsilon': must be a finite number, not -inf; see `depthlens score --help`",
        ),
    ],
)
def test_errors_name_the_flag(monkeypatch, capsys, tmp_path, args, message):
    src = _input(tmp_path, RECORD)
    code, _, err = run80(
        monkeypatch, capsys, "score", "--in", src, "--out", tmp_path / "o.jsonl", "-m", BOGUS, *args
    )
    assert code == 2
    assert err.strip().splitlines()[-1] == message


def test_thinkn_table_fits_80_columns(monkeypatch, capsys, tmp_path, tiny_chat):
    from tests.test_thinkn import _store

    _store(tiny_chat, tmp_path / "s", pool=2)
    code, out, err = run80(
        monkeypatch,
        capsys,
        "thinkn",
        "--from",
        tmp_path / "s",
        "--n",
        "2",
        "--trials",
        "1",
        "--methods",
        "all",
    )
    assert code == 0, err
    assert max(len(line) for line in out.splitlines()) <= 80
    assert "│ deepconf-high-bottom10@n │" in out  # the longest method name, whole


def test_thinkn_prints_the_papers_methods_first_and_folds_deepconf(monkeypatch, capsys, tmp_path, tiny_chat):
    """Issue 42: Think@n and Cons@n lead the table, random@n (issue 48: Think@n's control) after them; DeepConf's 12
    variants print as one line per filter unless --methods all; n defaults to what the stored pool allows, and says
    so."""
    from tests.test_thinkn import _store

    _store(tiny_chat, tmp_path / "s", pool=2)
    code, out, err = run80(monkeypatch, capsys, "thinkn", "--from", tmp_path / "s", "--trials", "1")
    assert code == 0, err
    said = " ".join(err.split())  # rich wraps at 80 columns
    assert "n = 2: the pool in" in said and "holds 2 responses per question" in said
    rows = [line.split("│")[1].strip() for line in out.splitlines() if line.startswith("│")]
    table = rows[: rows.index("deepconf-high-*@n (4)") + 1]
    # issue 56: Short@n (length alone) and Think@n within length strata beside random@n, Think@n's controls
    assert table[:8] == [
        "think@n",
        "cons@n",
        "random@n",
        "short@n",
        "think-strata@n",
        "mean@n",
        "long@n",
        "self-certainty@n",
    ]
    assert table[8:] == ["deepconf-*@n (4)", "deepconf-low-*@n (4)", "deepconf-high-*@n (4)"]
    assert "12 variants folded into 3 lines" in said and "deepconf-low-tail@n" not in out
    assert max(len(line) for line in out.splitlines()) <= 80


# 6. Docs stand on their own.
def test_nothing_points_outside_the_repository():
    needles = ("../shared", "SPEC.md", "SPEC §", "seed 00", "seeds/")
    hits = [
        f"{path.relative_to(ROOT)}: {needle}"
        for folder in ("src", "docs", "examples", "benchmarks")
        for path in (ROOT / folder).rglob("*")
        if path.suffix in (".py", ".md", ".sh")
        for needle in needles
        if needle in path.read_text(encoding="utf-8")
    ] + [f"README.md: {n}" for n in needles if n in (ROOT / "README.md").read_text(encoding="utf-8")]
    assert hits == []
    definitions = (ROOT / "docs" / "definitions.md").read_text(encoding="utf-8")
    assert "arXiv:2602.10816" in definitions and "Think Deep, Not Just Long" in definitions


# 7. Degenerate runs warn, one line each, and still write their results.
@pytest.mark.parametrize(
    ("args", "warnings"),
    [
        (["--g", "2"], ["warning: --g 2 is not below the largest jsd divergence (1 bit): every token settles at "
                        "layer 1 and DTR is 0",
                        "warning: no token of the whole input is deep-thinking at --g 2 --rho 0.85: DTR is 0 for "
                        "every record and ranks nothing; choose another --g or --rho"]),
        (["--g", "0.7", "--divergence", "jsd-nat"], ["warning: --g 0.7 is not below the largest jsd-nat divergence "
                                                     "(ln 2 ≈ 0.693 nats): every token settles at layer 1 and DTR is 0",
                                                     "warning: no token of the whole input is deep-thinking at --g 0.7 "
                                                     "--rho 0.85: DTR is 0 for every record and ranks nothing; choose "
                                                     "another --g or --rho"]),
        (["--g", "0", "--divergence", "kl", "--no-final-norm"],
         ["warning: --no-final-norm with --divergence kl: without the final norm, kl has no common scale with g, so "
          "settling and DTR may be all or nothing; the ablation is meant for jsd",
          "warning: every token of the whole input is deep-thinking at --g 0 --rho 0.85: DTR is 1 for every record "
          "and ranks nothing; choose another --g or --rho"]),
    ],
)  # fmt: skip
def test_degenerate_settings_warn(monkeypatch, capsys, tmp_path, tiny_dir, args, warnings):
    src, out = _input(tmp_path, RECORD), tmp_path / "out.jsonl"
    code, _, err = run80(
        monkeypatch, capsys, "score", "--in", src, "--out", out, "--model", tiny_dir, "-q", *args
    )
    assert code == 0, err
    assert [line for line in err.splitlines() if line.startswith("warning:")] == warnings
    assert len(list(iter_jsonl(out))) == 1


def test_empty_input_warns_and_writes_an_empty_output(monkeypatch, capsys, tmp_path, tiny_dir):
    src, out = tmp_path / "empty.jsonl", tmp_path / "out.jsonl"
    src.write_text("")
    code, stdout, err = run80(monkeypatch, capsys, "score", "--in", src, "--out", out, "--model", tiny_dir)
    assert code == 0, err
    assert " ".join(err.split()).startswith(f"warning: {src} has no records; {out} will be empty")
    assert out.read_text() == "" and "│ records │ 0" in " ".join(stdout.split())

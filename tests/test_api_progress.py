"""What the Python verbs show while they run and what they leave behind (issue 52, items 2 and 6): an opening line
and ``tqdm.auto`` bars on stderr, fed by the runs' own events and silent with ``progress=False``; a temporary store
removed however the call ends, a named one kept."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import ClassVar, Literal

import pytest
from tqdm import auto

import depthlens
from depthlens.sampling.choose import vllm_available
from depthlens.studies import generate as generation
from tests.test_api import SMALL, TASK

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def lm():
    from depthlens.models.load import wrap
    from tests.conftest import CharTokenizer, tiny_model

    return wrap(tiny_model("llama"), CharTokenizer(), name="tiny-llama")


class Recorded(auto.tqdm):
    """``tqdm.auto.tqdm`` as a notebook would get it (a widget there, text here), each bar kept to read its count."""

    made: ClassVar[list[Recorded]] = []

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        Recorded.made.append(self)


@pytest.fixture
def bars(monkeypatch):
    """The bars the verbs make, by name: their final count and total (as in a notebook: bars, not lines)."""
    from depthlens.api import progress

    Recorded.made = []
    monkeypatch.setattr(auto, "tqdm", Recorded)
    monkeypatch.setattr(progress, "interactive", lambda: True)
    return lambda: {bar.desc: (bar.n, bar.total) for bar in Recorded.made}


def test_generate_says_what_it_runs_and_counts_responses_and_tokens(lm, bars, capsys):
    table = depthlens.generate(lm, TASK, pool=4, batch_size=4, readout_tokens=None, **SMALL)
    err = capsys.readouterr().err
    first = err.splitlines()[0]
    assert first == (
        "depthlens.generate: backend hf, 8 responses (2 questions × pool 4) of up to 10 tokens, every token read "
        "out (readout_tokens all), on cpu, 1 thread"
    )
    tokens = sum(table.column("token_count").to_pylist())
    assert bars() == {"responses": (8, 8), "tokens": (tokens, None)}  # the sampler's on_token, summed
    assert "responses: 100%" in err and f"tokens: {tokens} tokens" in err


def test_generate_states_a_readout_window(lm, capsys):
    depthlens.generate(lm, TASK, pool=2, batch_size=2, readout_tokens=4, threads=2, **SMALL)
    first = capsys.readouterr().err.splitlines()[0]
    assert first.endswith("the first 4 tokens read out (readout_tokens), on cpu, 2 threads")


def test_the_opening_line_counts_one_question_and_names_the_top_k(lm, capsys):
    depthlens.generate(
        lm, TASK, pool=2, batch_size=2, readout_tokens=4, layer_top_k=3, **{**SMALL, "questions": 1}
    )
    first = capsys.readouterr().err.splitlines()[0]
    assert "2 responses (1 question × pool 2)" in first
    assert "the first 4 tokens read out (readout_tokens) with each layer's top-3, on cpu" in first
    depthlens.score(lm, [{"id": "a", "prompt": "1 2", "completion": "3"}], tokens=True, layer_top_k=2)
    first = capsys.readouterr().err.splitlines()[0]
    assert "1 record, every completion token read out with each layer's top-2, on cpu" in first


def test_score_counts_records_and_tokens(lm, bars, capsys):
    records = [
        {"id": "a", "prompt": "1 2", "completion": "3 4 5"},
        {"id": "b", "prompt": "7", "completion": "8"},
    ]
    table = depthlens.score(lm, records, threads=1)
    first = capsys.readouterr().err.splitlines()[0]
    assert (
        first == "depthlens.score: backend hf, 2 records, every completion token read out, on cpu, 1 thread"
    )
    assert bars() == {"records": (2, 2), "tokens": (sum(table.column("token_count").to_pylist()), None)}


def test_online_counts_questions(lm, bars, capsys):
    table = depthlens.online(lm, TASK, warmup=2, max_n=4, batch_size=2, prefix=4, **SMALL)
    first = capsys.readouterr().err.splitlines()[0]
    assert first.startswith("depthlens.online: backend hf, 2 questions × up to 4 responses (warm-up 2)")
    counted = bars()
    assert counted["questions"] == (2, 2)
    assert counted["tokens"][0] == sum(table.column("tokens").to_pylist())  # the tokens the policy spent


def test_think_at_n_counts_trials(lm, bars, capsys):
    pool = depthlens.generate(lm, TASK, pool=4, batch_size=4, progress=False, **SMALL)
    assert capsys.readouterr().err == ""
    depthlens.think_at_n(pool, n=4, trials=3, methods=["cons@n", "think@n"])
    assert capsys.readouterr().err.startswith(
        "depthlens.think_at_n: 2 questions' pools, 3 trials of n = 4 each, 2 methods"
    )
    assert bars() == {"trials": (3, 3)}


def test_progress_false_shows_nothing(lm, bars, capsys):
    records = [{"id": "a", "prompt": "1 2", "completion": "3 4 5"}]
    pool = depthlens.generate(lm, TASK, pool=4, batch_size=4, progress=False, **SMALL)
    depthlens.think_at_n(pool, n=4, trials=2, progress=False)
    depthlens.online(lm, TASK, warmup=2, max_n=4, batch_size=2, prefix=4, progress=False, **SMALL)
    depthlens.score(lm, records, progress=False)
    assert capsys.readouterr() == ("", "") and bars() == {}


@pytest.mark.skipif(
    not vllm_available(), reason="needs the vllm extra (the backend is checked before it starts)"
)
def test_a_vllm_engine_start_is_told_only_with_progress_on(lm, monkeypatch, capsys):
    """The engine's start line (``sampling.choose.say`` for the CLI) goes through the verb's display: silent with
    ``progress=False``. The engine itself is stood in for: what is checked is where its line goes."""
    from depthlens.sampling.vllm import generator

    class Starting:
        def __init__(self, *args, progress, **kwargs) -> None:
            progress("starting the vLLM engine")
            raise RuntimeError("not started here")

    monkeypatch.setattr(generator, "EngineGenerator", Starting)
    for shown in (True, False):
        with pytest.raises(RuntimeError, match="not started here"):
            depthlens.generate(lm, TASK, pool=2, backend="vllm", progress=shown, **SMALL)
        err = capsys.readouterr().err
        assert ("starting the vLLM engine" in err) is shown and (err == "") is not shown


def test_progress_is_a_typed_keyword():
    import inspect

    for verb in (depthlens.generate, depthlens.score, depthlens.online, depthlens.think_at_n):
        param = inspect.signature(verb, eval_str=True).parameters["progress"]
        assert (param.kind, param.default) == (param.KEYWORD_ONLY, True), verb
        assert param.annotation == bool | Literal["bars", "lines"], verb
    with pytest.raises(depthlens.DepthlensError, match=r"progres=…"):
        depthlens.score(None, [], progres=False)  # a misspelling is refused, naming it


# ---------------------------------------------------------------------------------------------------------------
# Progress in a log: plain lines where stderr is no terminal (a script's output, a job's log), for the verbs and the
# command line alike — one per item or every 5 %, no cursor escapes.


def test_a_verb_in_a_log_says_plain_lines(lm, capsys):
    table = depthlens.generate(lm, TASK, pool=2, batch_size=1, **SMALL)  # stderr is captured: no terminal
    err = capsys.readouterr().err
    assert "\r" not in err and "\x1b" not in err
    counts = [line for line in err.splitlines()[1:] if line.startswith("responses ")]
    tokens = sum(table.column("token_count").to_pylist())
    assert counts[-1].startswith(f"responses 4/4 (100 %), tokens {tokens}; ")
    assert [c.split(",")[0] for c in counts] == [f"responses {i}/4 ({25 * i} %)" for i in range(1, 5)]


def test_progress_lines_come_every_5_percent_or_half_minute():
    from depthlens.api.progress import Lines

    said: list[str] = []
    with Lines(said.append, every_s=3600) as lines:
        done, tokens = lines.add_task("responses", total=200), lines.add_task("tokens")
        for _ in range(200):
            lines.advance(tokens, 7)
            lines.advance(done)
    assert len(said) == 20 and said[0].startswith("responses 10/200 (5 %), tokens 70; ")
    assert said[-1].startswith("responses 200/200 (100 %), tokens 1,400; ")
    quiet: list[str] = []
    with Lines(quiet.append, every_s=0.0) as lines:  # a slow item: the time says where it is
        tokens = lines.add_task("tokens")
        lines.advance(tokens, 3)
    assert quiet[0].startswith("tokens 3; ")


def test_the_command_line_in_a_log_says_plain_lines_too():
    import io

    from rich.console import Console

    from depthlens.cli.progress import make_progress

    log = io.StringIO()
    with make_progress(Console(file=log, width=200)) as progress:  # a file: no terminal
        questions = progress.add_task("questions", total=3)
        for _ in range(3):
            progress.advance(questions)
    said = [line.split(";")[0] for line in log.getvalue().splitlines()]
    assert said == ["questions 1/3 (33 %)", "questions 2/3 (67 %)", "questions 3/3 (100 %)"]
    assert "\x1b" not in log.getvalue()


# ---------------------------------------------------------------------------------------------------------------
# The temporary store: removed however the call ends; a named one kept.


@pytest.fixture
def scratch_dir(tmp_path, monkeypatch):
    """Where tempfile makes the verbs' temporary stores during the test."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)
    return tmp_path


def _fails_on_second_question(monkeypatch, error: BaseException) -> None:
    real, calls = generation.generate_question, []

    def second_fails(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise error
        return real(*args, **kwargs)

    monkeypatch.setattr(generation, "generate_question", second_fails)


@pytest.mark.parametrize("error", [KeyboardInterrupt(), RuntimeError("a sampler's bug")], ids=type)
def test_a_temporary_store_goes_however_the_call_ends(lm, scratch_dir, monkeypatch, error):
    _fails_on_second_question(monkeypatch, error)
    with pytest.raises(type(error)):
        depthlens.generate(lm, TASK, pool=2, batch_size=2, progress=False, **SMALL)
    assert not list(scratch_dir.glob("depthlens-*"))


def test_a_named_store_is_kept_as_far_as_it_got(lm, tmp_path, monkeypatch):
    _fails_on_second_question(monkeypatch, KeyboardInterrupt())
    out = tmp_path / "kept"
    with pytest.raises(KeyboardInterrupt):
        depthlens.generate(lm, TASK, pool=2, batch_size=2, out=out, progress=False, **SMALL)
    assert depthlens.responses(out).num_rows == 2  # the first question's pool


SIGTERMED = """
import os, signal, sys
sys.path.insert(0, {root!r})
import depthlens
from depthlens.models.load import wrap
from depthlens.sampling.choose import vllm_available
from depthlens.studies import generate as generation
from tests.conftest import CharTokenizer, tiny_model

real = generation.generate_question

def terminated(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGTERM)  # as `timeout` or a job scheduler stops a script
    return real(*args, **kwargs)

generation.generate_question = terminated
lm = wrap(tiny_model("llama"), CharTokenizer(), name="tiny-llama")
depthlens.generate(lm, {task!r}, pool=2, batch_size=2, progress=False, **{small!r})
print("not reached")
"""


def test_sigterm_removes_the_temporary_store_and_ends_the_process(scratch_dir):
    script = SIGTERMED.format(root=str(ROOT), task=TASK, small=SMALL)
    env = {**os.environ, "TMPDIR": str(scratch_dir), "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 128 + signal.SIGTERM, done.stderr
    assert "not reached" not in done.stdout and "Traceback" not in done.stderr
    assert not list(scratch_dir.glob("depthlens-*"))

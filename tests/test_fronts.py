"""One setting, three fronts: the library's error names the setting (``lens``, ``eta``), and each front spells it
its own way — ``--lens`` on the command line, ``lens=`` in Python, ``depthlens.think.eta`` in a server request.
A run is built in one place for every front (``studies.runs``), so one call is refused alike everywhere; every
message helper and warning the library writes names settings, never a front's flags. The Python verbs' keywords
are spelt out, typed, in their signatures, and a mistyped one is refused."""

from __future__ import annotations

import ast
import importlib.util
import inspect
import re
from pathlib import Path

import pytest

import depthlens
from depthlens.config import DTRConfig, VotingConfig
from depthlens.errors import ConfigError, InputError
from tests.test_cli import run


def test_the_command_line_names_the_flag(monkeypatch, capsys, tmp_path):
    code, _, err = run(monkeypatch, capsys, "generate", "--out", tmp_path / "s", "--lens", "tuned")
    assert code == 2
    assert "error: --lens tuned: must be logit, tuned:PATH or jacobian:PATH" in err
    assert "ReadoutConfig" not in err and "lens=" not in err


def test_python_names_the_keyword():
    with pytest.raises(ConfigError) as raised:
        depthlens.score(None, [], lens="tuned")
    assert str(raised.value) == "depthlens.score(lens='tuned'): must be logit, tuned:PATH or jacobian:PATH"
    with pytest.raises(InputError, match=r"^depthlens\.score\(lens='tuned:/nowhere'\): no fitted lens there"):
        depthlens.score(None, [], lens="tuned:/nowhere")
    with pytest.raises(ConfigError, match=r"^eta=1\.5: must be in \(0, 1\] \(VotingConfig\.eta"):
        VotingConfig(eta=1.5)  # a config built by hand: its keyword


@pytest.mark.skipif(importlib.util.find_spec("pydantic") is None, reason="needs the serve extra")
def test_a_request_names_its_field():
    from depthlens.config import ServeConfig
    from depthlens.serve.errors import ApiError
    from depthlens.serve.job import build_job
    from depthlens.serve.schema import CompletionRequest

    body = {"model": "m", "prompt": [1, 2], "depthlens": {"think": {"eta": 1.5}}}
    with pytest.raises(ApiError) as raised:
        build_job(CompletionRequest.model_validate(body), None, 256, ServeConfig("m"))
    assert raised.value.param == "depthlens.think.eta"
    assert raised.value.message == "depthlens.think.eta 1.5: must be in (0, 1]"


def test_the_verbs_spell_their_settings_out_typed():
    generate = inspect.signature(depthlens.generate, eval_str=True).parameters
    assert generate["temperature"].kind is inspect.Parameter.KEYWORD_ONLY
    assert generate["temperature"].annotation is float and generate["lens"].default == "logit"
    assert {"backend", "max_new_tokens", "questions", "divergence"} <= set(generate)
    assert {"eta", "trials", "g"} <= set(inspect.signature(depthlens.think_at_n).parameters)
    with pytest.raises(
        InputError, match=r"depthlens\.score\(temprature=…\): no such setting; known: .*divergence"
    ):
        depthlens.score(None, [], temprature=0.5)
    with pytest.raises(InputError, match=r"depthlens\.score\(rho='high'\): must be float \(DTRConfig\.rho\)"):
        depthlens.score(None, [], rho="high")
    with pytest.raises(InputError, match=r"depthlens\.generate\(pool='8'\): must be int$"):
        depthlens.generate(None, "reasoning_gym:chain_sum", pool="8")  # the verb's own keywords too


def test_prefix_is_three_settings_each_with_one_meaning_of_none():
    """ℓ_prefix is ``DTRConfig.dtr_prefix_tokens`` (None: no prefix), ``VotingConfig.rank_prefix`` (None: the
    whole response) and ``OnlineConfig.decision_prefix`` (never None). Every front keeps its one spelling — a
    verb's ``prefix=`` is its own config's, ``--prefix`` each command's — and their dicts keep the key ``prefix``
    that stores, summaries and server responses hold (either name reads back)."""
    from depthlens.api.keywords import VERBS
    from depthlens.cli.flags import flag_for
    from depthlens.config import DTRConfig, OnlineConfig

    assert VERBS["think_at_n"].fields()["prefix"] == (VotingConfig, "rank_prefix")
    assert VERBS["online"].fields()["prefix"] == (OnlineConfig, "decision_prefix")
    assert VERBS["score"].fields()["prefix"] == (DTRConfig, "dtr_prefix_tokens")
    with pytest.raises(InputError, match=r"prefix=…, rank_prefix=…\): the same setting twice"):
        depthlens.think_at_n("nowhere", prefix=5, rank_prefix=6)
    with pytest.raises(ConfigError, match=r"^depthlens\.online\(prefix=0\): must be ≥ 1 token"):
        depthlens.online(None, [], prefix=0)  # named by the keyword given
    with pytest.raises(ConfigError, match=r"^depthlens\.online\(decision_prefix=0\): must be ≥ 1 token"):
        depthlens.online(None, [], decision_prefix=0)  # the field's own name is taken, and named back
    with pytest.raises(InputError, match=r"^depthlens\.online\(prefix=None\): must be int"):
        depthlens.online(None, [], prefix=None)
    configs = {
        "rank_prefix": VotingConfig(rank_prefix=None),
        "decision_prefix": OnlineConfig(decision_prefix=7),
    }
    configs["dtr_prefix_tokens"] = DTRConfig(dtr_prefix_tokens=3)
    for field, config in configs.items():
        data = config.to_dict()
        assert field not in data and data["prefix"] == getattr(config, field)
        assert type(config).from_dict(data) == config
        renamed = {(field if k == "prefix" else k): v for k, v in data.items()}
        assert type(config).from_dict(renamed) == config
        assert flag_for(type(config).__name__, field) == flag_for(None, field) == "--prefix"
    generate = inspect.signature(depthlens.generate).parameters
    assert "prefix" in generate and "dtr_prefix_tokens" not in generate  # its own prefix= is that setting


# ---- one run builder for every front ---------------------------------------------------------------------------


def _jsonl_task(tmp_path: Path) -> Path:
    path = tmp_path / "q.jsonl"
    path.write_text('{"id": "q", "question": "1 + 1", "answer": 2}\n')
    return path


def test_a_task_shorter_than_asked_is_refused_on_every_front(monkeypatch, capsys, tmp_path):
    """``questions`` beyond what a JSONL or hub task holds: refused on the command line, and now in Python too
    (which once cut the task to what it had, silently)."""
    task = _jsonl_task(tmp_path)
    with pytest.raises(InputError) as raised:
        depthlens.generate(None, str(task), questions=5)
    assert str(raised.value) == (
        f"depthlens.generate(questions=5): task {str(task)!r} has 1; leave out questions to ask all of them, or "
        "ask for 1 or fewer"
    )
    with pytest.raises(InputError, match=r"^depthlens\.online\(questions=5\): task .* has 1"):
        depthlens.online(None, str(task), questions=5)
    code, _, err = run(
        monkeypatch, capsys, "generate", "--out", tmp_path / "s", "--task", task, "--questions", "5"
    )
    assert (
        code == 2 and f"error: --questions 5: task {str(task)!r} has 1; leave out --questions to ask" in err
    )


def test_a_vllm_readout_refuses_the_top_k_rule_before_any_engine(monkeypatch, capsys, tmp_path):
    """``settle='topk:K'`` needs the transformers readout: refused by the run's builder, before a vLLM engine (or
    even a model) is touched — the model here is None."""
    with pytest.raises(InputError) as raised:
        depthlens.score(None, [], backend="vllm", settle="topk:5")
    assert str(raised.value) == "settle='topk:5' reads out on the transformers path only: use backend='hf'"
    with pytest.raises(InputError, match=r"^backend='vllm' computes no TCB fields .*; add tcb=False$"):
        depthlens.score(None, [], backend="vllm", tcb=True)
    src = tmp_path / "in.jsonl"
    src.write_text('{"id": "a", "prompt_ids": [1], "completion_ids": [2]}\n')
    args = ("score", "--in", src, "--out", tmp_path / "o", "--backend", "vllm", "--settle", "topk:5")
    code, _, err = run(monkeypatch, capsys, *args)
    assert (
        code == 2
        and "error: --settle topk:5 reads out on the transformers path only: use --backend hf" in err
    )


@pytest.mark.skipif(importlib.util.find_spec("pydantic") is None, reason="needs the serve extra")
def test_a_window_shorter_than_a_decision_is_refused_on_every_front(monkeypatch, capsys, tmp_path):
    """A read-out window shorter than the prefix a vote decides at: the server once widened it; now a 400 naming
    the body's field, as the command line and Python refuse it (``studies.runs.check_window``)."""
    from depthlens.config import ServeConfig
    from depthlens.serve.errors import ApiError
    from depthlens.serve.job import build_job
    from depthlens.serve.schema import CompletionRequest

    def job(options: dict):
        request = {"model": "m", "prompt": [1, 2], "max_tokens": 64, "depthlens": options}
        body = CompletionRequest.model_validate(request)
        return build_job(body, None, 256, ServeConfig("m"))

    with pytest.raises(ApiError) as raised:
        job({"readout_tokens": 8, "online": {"prefix": 20}})
    assert raised.value.param == "depthlens.readout_tokens" and raised.value.status == 400
    assert raised.value.message.startswith(
        "depthlens.readout_tokens 8: must be at least depthlens.online.prefix 20 (the prefix DTR needs every "
        "prefix token read out); raise depthlens.readout_tokens or lower depthlens.online.prefix"
    )
    with pytest.raises(ApiError) as raised:
        job({"readout_tokens": 8, "think": {"n": 2, "prefix": 20}})
    assert (
        raised.value.param == "depthlens.readout_tokens"
        and "depthlens.think.prefix 20" in raised.value.message
    )
    assert job({"online": {"prefix": 60}}).sampling.readout_tokens == 60  # not asked: the default widened
    with pytest.raises(
        ApiError
    ) as raised:  # ℓ past the reply's end: the online check, as on the command line
        job({"online": {"prefix": 80}})
    assert (
        raised.value.param == "depthlens.online.prefix"
        and "must be at most max_tokens 64" in raised.value.message
    )
    with pytest.raises(
        InputError, match=r"^depthlens\.online\(readout_tokens=8\): must be at least prefix=20"
    ):
        depthlens.online(None, [], prefix=20, readout_tokens=8)
    code, _, err = run(
        monkeypatch,
        capsys,
        "thinkn",
        "--online",
        "--out",
        tmp_path / "o",
        "--prefix",
        "20",
        "--readout-tokens",
        "8",
    )
    assert code == 2 and "error: --readout-tokens 8: must be at least --prefix 20 (the prefix DTR" in err
    code, _, err = run(
        monkeypatch, capsys, "thinkn", "--out", tmp_path / "t", "--prefix", "20", "--readout-tokens", "8"
    )  # offline Think@n: refused before sampling, not when the vote finds too few tokens
    assert code == 2 and "error: --readout-tokens 8: must be at least --prefix 20 (Think@n ranks" in err


# ---- the shape that keeps one front door: thin commands, settings named by the library -----------------------

SRC = Path(__file__).parent.parent / "src" / "depthlens"
FLAG = re.compile(r"(?<![\w`-])--[a-z][a-z0-9-]+")


def _functions(path: Path) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def test_commands_are_thin():
    """No command-line function over 60 lines, none reading its ``locals()`` by name (option groups instead:
    ``cli.groups``), and no command module importing another (shared run helpers live in ``cli.runs`` …)."""
    long, local, imports = [], [], []
    for path in sorted((SRC / "cli").rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        long += [f"{path.name}:{f.name}" for f in _functions(path) if f.end_lineno - f.lineno + 1 > 60]
        calls = [n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Call)]
        local += [path.name for c in calls if getattr(c.func, "id", None) == "locals"]
        if path.name.endswith("_cmd.py"):
            imports += [f"{path.name}: {m}" for m in re.findall(r"depthlens\.cli\.(\w+_cmd)\b", text)]
            imports += [
                f"{path.name}: {m}" for m in re.findall(r"from depthlens\.cli import .*\b(\w+_cmd)\b", text)
            ]
    assert not long and not local and not imports, (long, local, imports)


ERRORS = {
    "DepthlensError", "ConfigError", "InputError", "StoreError", "ClusterError", "ModelNotFoundError",
    "ModelInstallError", "UnsupportedArchitectureError", "NonFiniteError", "DepthlensWarning", "BadRecord",
}  # fmt: skip
FRONTS_OWN = ("ApiError", "BadQuery")  # the server's and the explorer's HTTP errors name their launch flags


def _name(call: ast.Call) -> str | None:
    return getattr(call.func, "id", getattr(call.func, "attr", None))


def _spoken() -> list[tuple[str, ast.AST, str]]:
    """Everything the library says to a user, outside the command line: each raise, each error or warning built
    (``InputError(…)``, ``DepthlensWarning(…)``), each ``warnings.warn`` — and what each message helper they call
    returns (``too_few``, a remedy text): (module, node, source)."""
    trees = {p.relative_to(SRC).as_posix(): p.read_text(encoding="utf-8") for p in sorted(SRC.rglob("*.py"))}
    helpers = {
        n.name: (rel, n)
        for rel, text in trees.items()
        for n in ast.walk(ast.parse(text))
        if isinstance(n, ast.FunctionDef)
    }
    said, called = [], set()
    for rel, text in trees.items():
        if rel.startswith("cli/"):
            continue
        for node in ast.walk(ast.parse(text)):
            message = node.exc if isinstance(node, ast.Raise) else node
            if isinstance(node, ast.Call) and _name(node) not in (*ERRORS, "warn"):
                continue
            if not isinstance(node, (ast.Raise, ast.Call)) or message is None:
                continue
            if isinstance(message, ast.Call) and _name(message) in FRONTS_OWN:
                continue
            said.append((rel, node, ast.get_source_segment(text, message) or ""))
            called |= {_name(c) for c in ast.walk(message) if isinstance(c, ast.Call)} & set(helpers)
    for name in sorted(called):
        rel, fn = helpers[name]
        if rel.startswith("cli/"):
            continue
        for ret in (n for n in ast.walk(fn) if isinstance(n, ast.Return) and n.value is not None):
            if not (isinstance(ret.value, ast.Call) and _name(ret.value) in FRONTS_OWN):
                said.append((rel, ret, ast.get_source_segment(trees[rel], ret.value) or ""))
    return said


def test_the_library_names_settings_not_flags():
    """Outside the fronts (``cli/``; the server's and the explorer's own HTTP errors, which name their launch
    flags) nothing the library says — an error raised or built, a warning, a message helper's text — names a
    command-line flag: it names the setting (``errors.named``), and each front spells it; a command to run, in
    backticks, is quoted whole."""
    spelt = sorted(
        {
            f"{rel}:{node.lineno}"
            for rel, node, source in _spoken()
            if FLAG.search(re.sub(r"`[^`]*`", "", source))
        }
    )
    assert not spelt, spelt
    helpers = {rel for rel, node, _ in _spoken() if isinstance(node, ast.Return)}
    assert "studies/thinkn.py" in helpers  # the scan reaches the helpers (too_few), not the raises alone


def _fronts(said) -> tuple[str, str, str]:
    """``said`` as the command line, a Python caller and a server request read it."""
    from depthlens.api.keywords import python_line
    from depthlens.cli.flags import flag_line

    server = said.phrased(spell=lambda s: f"depthlens.{s}")
    return flag_line(said), python_line("score", said), server


def test_every_message_helper_speaks_each_front_in_its_own_words(tmp_path):
    """The texts the issue found speaking the command line to Python callers, each phrased by all three fronts:
    a setting set to a value keeps its punctuation (``--n 3`` / ``n=3``), an on/off one reads as its flag or its
    call (``--skip-bad`` / ``skip_bad=True``, ``--no-final-norm`` / ``final_norm=False``)."""
    from depthlens.config import ReadoutConfig
    from depthlens.evals.grading import AnswerSummary
    from depthlens.studies.runs import degenerate
    from depthlens.studies.score_inputs import BadRecord
    from depthlens.studies.thinkn import StoreInfo, too_few

    answers = AnswerSummary("depthlens-answers-2", "paper", "none", {}, 0, 0, [])
    info = StoreInfo({"pool": 8}, 2, 6, [], [], {}, answers, most_usable=3)
    few = InputError(too_few("runs/a", info, 4))
    cli, python, server = _fronts(few)
    assert cli.endswith("use --n 3 or less, or generate a store with a larger --pool")
    assert python.endswith("use n=3 or less, or generate a store with a larger pool")
    assert server.endswith("use depthlens.n 3 or less, or generate a store with a larger depthlens.pool")
    cli, python, _ = _fronts(BadRecord("record 'a' is too long"))
    assert cli == "record 'a' is too long (pass --skip-bad to skip such records)"
    assert python == "record 'a' is too long (pass skip_bad=True to skip such records)"
    (no_norm,) = degenerate(ReadoutConfig(divergence="kl", final_norm=False), DTRConfig())
    assert _fronts(no_norm)[:2] == (
        "--no-final-norm with --divergence kl: without the final norm, kl has no common scale with g, so settling "
        "and DTR may be all or nothing; the ablation is meant for jsd",
        "final_norm=False with divergence='kl': without the final norm, kl has no common scale with g, so "
        "settling and DTR may be all or nothing; the ablation is meant for jsd",
    )
    (high_g,) = degenerate(ReadoutConfig(), DTRConfig(g=2.0))
    assert _fronts(high_g)[0].startswith("--g 2 is not below the largest jsd divergence (1 bit)")
    assert _fronts(high_g)[1].startswith("g=2 is not below the largest jsd divergence (1 bit)")
    with pytest.raises(InputError) as raised:
        depthlens.score(None, [], layer_top_k=3)
    assert (
        str(raised.value)
        == "depthlens.score(layer_top_k=3): each layer's top-k is kept per token: add tokens=True"
    )
    from depthlens.viz.heatmap import draw_logit_lens

    with pytest.raises(InputError) as raised:
        draw_logit_lens({"id": "r"}, tmp_path / "x.png")
    assert _fronts(raised.value)[0].endswith("score it with --tokens --layer-top-k K to draw the logit lens")
    assert str(raised.value).endswith("score it with tokens=True layer_top_k=K to draw the logit lens")


def test_the_per_layer_refusals_speak_each_front_in_its_own_words():
    """The per-layer quantities (issue 58) are refused by the checks every front's run makes
    (``check_per_layer``, ``check_track``, ``stats_need_hf``); an on/off setting reads as its flag on the command
    line (``--layer-target``), a list as the flag takes it (``--track 3,101``), a value as JSON writes it in a
    request (``true``); a setting no flag sets (``layer_stats``) reads as Python's everywhere."""
    from depthlens.cli.flags import flag_line
    from depthlens.config import ReadoutConfig
    from depthlens.config.readout import check_per_layer, check_track
    from depthlens.metrics.layer_quantities import stats_need_hf

    said = {}
    for name, call in {
        "target": lambda: check_per_layer(ReadoutConfig(layer_target=True), tokens=False),
        "track": lambda: check_per_layer(ReadoutConfig(track=(3, 9)), tokens=False),
        "past": lambda: check_track((3, 101), 101, "tiny"),
        "stats": lambda: stats_need_hf({"m": abs}, "vllm"),
    }.items():
        with pytest.raises((InputError, ConfigError)) as raised:
            call()
        said[name] = raised.value
    assert flag_line(said["target"]) == (
        "--layer-target: the target trajectory is kept per token and layer: add --tokens"
    )
    assert _fronts(said["target"])[1] == (
        "depthlens.score(layer_target=True): the target trajectory is kept per token and layer: add tokens=True"
    )
    assert flag_line(said["track"]) == "--track 3,9: tracked ids are kept per token and layer: add --tokens"
    assert (
        flag_line(said["past"]) == "--track 3,101: token id 101 is past tiny's vocabulary of 101 (ids 0..100)"
    )
    assert _fronts(said["past"])[1] == (
        "depthlens.score(track=[3, 101]): token id 101 is past tiny's vocabulary of 101 (ids 0..100)"
    )
    assert _fronts(said["stats"])[1] == (
        "depthlens.score(layer_stats=['m']): a statistic runs in the transformers readout: use backend='hf'"
    )
    if importlib.util.find_spec("starlette") is not None:
        from depthlens.serve.errors import depthlens_error

        assert depthlens_error(said["target"], "depthlens").message == (
            "depthlens.layer_target true: the target trajectory is kept per token and layer: add depthlens.tokens true"
        )
        refused = depthlens_error(said["past"], "depthlens")
        assert (refused.param, refused.message) == (
            "depthlens.track",
            "depthlens.track [3, 101]: token id 101 is past tiny's vocabulary of 101 (ids 0..100)",
        )


def test_a_warning_is_a_value_every_front_shows_in_its_own_words(tiny_llama, capsys):
    """The degenerate settings warn from the library (no longer the command line only): Python reads them through
    ``warnings`` in its spelling; a setting's warning raised deep in a run (the compiled readout falling back)
    reaches the command line as a ``warning:`` line naming its flag."""
    from depthlens.cli.app import _setting_warnings
    from depthlens.errors import DepthlensWarning, named

    records = [{"id": "a", "prompt_ids": [3, 4], "completion_ids": [5, 6]}]
    with pytest.warns(DepthlensWarning, match=r"^g=2 is not below the largest jsd divergence"):
        depthlens.score(tiny_llama, records, g=2.0, progress=False)
    import warnings

    with _setting_warnings():
        warnings.warn(DepthlensWarning(f"pass {named('compile', 'off')} to skip the attempt"), stacklevel=1)
    assert capsys.readouterr().err.strip() == "warning: pass --compile off to skip the attempt"
    assert (
        str(DepthlensWarning(f"pass {named('compile', 'off')} to skip it")) == "pass compile='off' to skip it"
    )


def test_a_settling_rule_a_pool_cannot_apply_is_refused_by_name():
    """A stored pool settles by the top-K rule from each layer's stored top-k ids: asking a pool that holds none
    for ``settle='topk:K'`` is refused by name, not voted under the divergence rule."""
    from depthlens.studies.resolve import check_stored_settle

    pool = {"model": "m", "n_layers": 4, "pool": 2, "questions": [], "dtr": {}, "readout": {"layer_top_k": 0}}
    with pytest.raises(
        InputError, match=r"settle='topk:5'.*holds none; leave out settle \(the store's rule\)"
    ):
        check_stored_settle(pool, DTRConfig(settle="topk:5"), "the pool")

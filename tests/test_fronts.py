"""One setting, three fronts: the library's error names the setting (``lens``, ``eta``), and each front spells it
its own way — ``--lens`` on the command line, ``lens=`` in Python, ``depthlens.think.eta`` in a server request.
The Python verbs' keywords are spelt out, typed, in their signatures, and a mistyped one is refused."""

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
    generate = inspect.signature(depthlens.generate).parameters
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


def test_prefix_is_three_settings_each_with_one_meaning_of_none():
    """ℓ_prefix is ``DTRConfig.dtr_prefix_tokens`` (None: no prefix), ``VotingConfig.rank_prefix`` (None: the
    whole response) and ``OnlineConfig.decision_prefix`` (never None). Every front keeps its one spelling — a
    verb's ``prefix=`` is its own config's, ``--prefix`` each command's — and their dicts keep the key ``prefix``
    that stores, summaries and server responses hold (either name reads back)."""
    from depthlens.cli.flags import flag_for
    from depthlens.config import DTRConfig, OnlineConfig
    from depthlens.studies.resolve import split

    assert split("think_at_n", {"prefix": 5}, VotingConfig, DTRConfig) == [{"rank_prefix": 5}, {}]
    assert split("online", {"prefix": 5}, OnlineConfig, DTRConfig) == [{"decision_prefix": 5}, {}]
    assert split("score", {"prefix": 5}, DTRConfig) == [{"dtr_prefix_tokens": 5}]
    with pytest.raises(InputError, match=r"prefix=…, rank_prefix=…\): the same setting twice"):
        split("think_at_n", {"prefix": 5, "rank_prefix": 6}, VotingConfig)
    with pytest.raises(ConfigError, match=r"^depthlens\.online\(prefix=0\): must be ≥ 1 token"):
        depthlens.online(None, [], prefix=0)  # named by the keyword given
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
    assert "rank_prefix" in inspect.signature(depthlens.think_at_n).parameters


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


def test_the_library_names_settings_not_flags():
    """Outside the fronts (``cli/``; the server's and the explorer's own HTTP errors, which name their launch
    flags) a raised error names a setting (``errors.named``), never its command-line flag; a command to run, in
    backticks, is quoted whole."""
    spelt = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel.startswith("cli/"):
            continue
        text = path.read_text(encoding="utf-8")
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, ast.Raise) or node.exc is None:
                continue
            call = node.exc.func if isinstance(node.exc, ast.Call) else None
            if getattr(call, "id", getattr(call, "attr", None)) in ("ApiError", "BadQuery"):
                continue
            source = re.sub(r"`[^`]*`", "", ast.get_source_segment(text, node.exc) or "")
            if FLAG.search(source):
                spelt.append(f"{rel}:{node.lineno}")
    assert not spelt, spelt


def test_a_settling_rule_a_pool_cannot_apply_is_refused_by_name():
    """A stored pool settles by the top-K rule from each layer's stored top-k ids: asking a pool that holds none
    for ``settle='topk:K'`` is refused by name, not voted under the divergence rule."""
    from depthlens.studies.resolve import check_stored_settle

    pool = {"model": "m", "n_layers": 4, "pool": 2, "questions": [], "dtr": {}, "readout": {"layer_top_k": 0}}
    with pytest.raises(
        InputError, match=r"settle='topk:5'.*holds none; leave out settle \(the store's rule\)"
    ):
        check_stored_settle(pool, DTRConfig(settle="topk:5"), "the pool")

"""One setting, three fronts: the library's error names the setting (``lens``, ``eta``), and each front spells it
its own way — ``--lens`` on the command line, ``lens=`` in Python, ``depthlens.think.eta`` in a server request.
The Python verbs' keywords are spelt out, typed, in their signatures, and a mistyped one is refused."""

from __future__ import annotations

import importlib.util
import inspect

import pytest

import depthlens
from depthlens.config import VotingConfig
from depthlens.errors import ConfigError, InputError
from tests.test_cli import run


def test_the_command_line_names_the_flag(monkeypatch, capsys, tmp_path):
    code, _, err = run(monkeypatch, capsys, "generate", "--out", tmp_path / "s", "--lens", "tuned")
    assert code == 2
    assert "error: --lens tuned: must be logit or tuned:PATH" in err
    assert "ReadoutConfig" not in err and "lens=" not in err


def test_python_names_the_keyword():
    with pytest.raises(ConfigError) as raised:
        depthlens.score(None, [], lens="tuned")
    assert str(raised.value) == "depthlens.score(lens='tuned'): must be logit or tuned:PATH"
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

"""The server's parts that need no server: streamed text and stop strings, request checks, error bodies, the
depth object, the tokens-saved estimate. In-process, milliseconds each."""

from __future__ import annotations

import importlib.util
import math
import signal
import socket

import pytest
import torch

pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("fastapi", "pydantic")), reason="needs the serve extra"
)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer

    from tests.serving import save_tiny_chat

    return AutoTokenizer.from_pretrained(save_tiny_chat(tmp_path_factory.mktemp("units-model")))


def _stream(tokenizer, text: str, stop: tuple[str, ...]) -> tuple[list[str], object]:
    from depthlens.serve.text import TextStream

    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    stream = TextStream(tokenizer, stop)
    pieces = [stream.feed(ids[: k + 1]) for k in range(len(ids))]
    pieces.append(stream.feed(ids, final=True))
    return pieces, stream


def test_streamed_text_joins_to_the_whole_and_never_leaks_a_stop_string(tokenizer):
    pieces, stream = _stream(tokenizer, "the answer is 42. END more", ("END",))
    assert "".join(pieces) == "the answer is 42. " and stream.stopped
    # "E" and "EN" could become the stop string: they are held back until they do
    sent = ["".join(pieces[: k + 1]) for k in range(len(pieces))]
    assert not any(s.endswith(("E", "EN")) for s in sent)
    pieces, stream = _stream(tokenizer, "EEE then E", ("END",))
    assert "".join(pieces) == "EEE then E" and not stream.stopped  # held back, then sent at the end


def test_incomplete_characters_are_held_back():
    from depthlens.serve.text import TextStream

    class Bytes:  # a byte-level tokenizer: one token per UTF-8 byte
        def decode(self, ids, skip_special_tokens=True):
            return bytes(ids).decode("utf-8", errors="replace")

    ids = list("naïve ∑".encode())
    stream = TextStream(Bytes(), ())
    pieces = [stream.feed(ids[: k + 1]) for k in range(len(ids))]
    assert "".join(pieces) == "naïve ∑" and not any("\ufffd" in p for p in pieces)


def _settings(**kw):
    from depthlens.config import ServeConfig

    return ServeConfig("m", **kw)


def _job(tokenizer, body: dict, chat: bool = False, context: int | None = 256, **settings):
    from depthlens.serve.job import build_job
    from depthlens.serve.schema import ChatRequest, CompletionRequest

    model = ChatRequest if chat else CompletionRequest
    return build_job(model.model_validate({"model": "m", **body}), tokenizer, context, _settings(**settings))


def test_a_request_becomes_its_job(tokenizer):
    job = _job(
        tokenizer,
        {
            "prompt": ["ab", "c"],
            "n": 2,
            "seed": 3,
            "stop": "x",
            "max_tokens": 9,
            "depthlens": {"prefix": 20, "readout_tokens": 8},
        },
    )
    assert job.prompts == ((14, 15), (16,))  # this tokenizer adds no BOS
    assert job.n == 2 and job.stop == ("x",) and job.seed == 3
    assert _job(tokenizer, {"prompt": [[1, 5, 6], [7]]}).prompts == ((1, 5, 6), (7,))
    assert job.sampling.max_new_tokens == 9
    assert (
        job.sampling.temperature == 0.6 and job.sampling.top_p == 0.95
    )  # the server's defaults, not OpenAI's
    assert (
        job.sampling.readout_tokens == 8
    )  # as asked: the DTR prefix scores the tokens read out (as Python's)
    assert _job(tokenizer, {"prompt": "x", "depthlens": {"prefix": 60}}).sampling.readout_tokens == 60  # the
    # server's window (50), a default the request did not choose, widened to the prefix it reads
    chat = _job(
        tokenizer, {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}, chat=True
    )
    assert tokenizer.decode(list(chat.prompts[0])) == "user: hi\nassistant: "  # the model's chat template
    assert chat.sampling.max_new_tokens == min(
        512, 256 - len(chat.prompts[0])
    )  # the chat default, in context
    deepconf = {"variant": "high", "warmup_samples": 3, "window_size": 64, "max_traces": 12}
    online = _job(tokenizer, {"prompt": "x", "depthlens": {"online": deepconf}})
    cfg = online.depth.online
    assert (cfg.signal, cfg.keep, cfg.warmup, cfg.window, cfg.max_n) == ("confidence", 0.9, 3, 64, 12)


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        (
            {"prompt": "x", "depthlens": {"online": {"variant": "low", "signal": "dtr"}}},
            400,
            "depthlens.online.signal",
        ),
        (
            {"prompt": "x", "depthlens": {"online": {"variant": "low", "eta": 0.3}}},
            400,
            "depthlens.online.eta",
        ),
        ({"prompt": "x", "depthlens": {"online": {"warmup": 8, "max_n": 8}}}, 400, "depthlens"),
        ({"prompt": "x", "depthlens": {"think": {"n": 4}, "online": {}}}, 400, "depthlens"),
        ({"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
        ({"prompt": "x", "temperature": -1}, 400, "temperature"),
        ({"prompt": []}, 400, "prompt"),
        ({"prompt": "x" * 300}, 400, "prompt"),
    ],
)
def test_requests_the_server_refuses(tokenizer, body, status, param):
    from depthlens.serve.errors import ApiError

    with pytest.raises(ApiError) as refused:
        _job(tokenizer, body)
    assert (refused.value.status, refused.value.param) == (status, param), refused.value.message
    assert refused.value.code  # every error names a code a client can branch on (issue 41)


@pytest.mark.parametrize(
    ("messages", "param", "code"),
    [
        ([{"role": "user"}], "messages[0].content", "missing_content"),
        (
            [{"role": "system", "content": "be brief"}, {"role": "user", "content": None}],
            "messages[1].content",
            "missing_content",
        ),
        (
            [{"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": []}],
            "messages[1].content",
            "missing_content",
        ),
        (
            [{"role": "assistant", "content": "x", "tool_calls": [{"id": "1", "type": "function"}]}],
            "messages[0].tool_calls",
            "unsupported",
        ),
    ],
)
def test_chat_messages_without_content_are_refused(tokenizer, messages, param, code):
    from depthlens.serve.errors import ApiError

    with pytest.raises(ApiError) as refused:
        _job(tokenizer, {"messages": messages}, chat=True)
    assert (refused.value.status, refused.value.param, refused.value.code) == (400, param, code)
    # an assistant turn echoed whole (tool_calls: [] beside its content) is a plain turn
    turns = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo", "tool_calls": []}]
    assert _job(tokenizer, {"messages": turns}, chat=True).prompts


def test_the_dialect_of_openai_and_vllm(tokenizer):
    """Fields other OpenAI-compatible servers take (issue 42): response_format text, vLLM's top_k / min_p
    (applied by both samplers; -1 = off as vLLM has it); json formats and out-of-range values refused by name."""
    from depthlens.serve.errors import ApiError

    job = _job(tokenizer, {"prompt": "x", "top_k": 5, "min_p": 0.1, "response_format": {"type": "text"}})
    assert (job.sampling.top_k, job.sampling.min_p) == (5, 0.1)
    assert _job(tokenizer, {"prompt": "x", "top_k": -1}).sampling.top_k == 0
    refused = [
        ({"response_format": {"type": "json_object"}}, "response_format", "unsupported"),
        ({"top_k": -2}, "top_k", "invalid_value"),
        ({"min_p": 1.5}, "min_p", "invalid_value"),
    ]
    for body, param, code in refused:
        with pytest.raises(ApiError) as error:
            _job(tokenizer, {"prompt": "x", **body})
        assert (error.value.status, error.value.param, error.value.code) == (400, param, code)


def test_a_request_is_refused_what_the_command_line_refuses_named_as_it_spells_it(tokenizer):
    """A negative seed is refused as ``--seed -1`` is (400 naming ``seed``), and an ℓ_prefix out of range is named
    by the request's own field (``depthlens.think.prefix``), never by a Python field or a flag."""
    from depthlens.serve.errors import ApiError

    refused = [
        ({"seed": -1}, "seed", "seed -1: must be an integer ≥ 0"),
        (
            {"depthlens": {"think": {"prefix": 0}}},
            "depthlens.think.prefix",
            "depthlens.think.prefix 0: must be ≥ 1",
        ),
        (
            {"depthlens": {"online": {"prefix": 0, "max_n": 6}}},
            "depthlens",
            "depthlens.online.prefix 0: must be ≥ 1 token",
        ),
    ]
    for body, param, message in refused:
        with pytest.raises(ApiError) as error:
            _job(tokenizer, {"prompt": "x", **body})
        assert (error.value.status, error.value.param) == (400, param), error.value.message
        assert error.value.message.startswith(message), error.value.message
        assert "--" not in error.value.message and "Config" not in error.value.message


def test_every_error_has_a_code():
    from depthlens.serve.errors import ApiError

    for status in (400, 401, 404, 405, 413, 422, 429, 500, 503):
        error = ApiError(status, "x").body()["error"]
        assert isinstance(error["code"], str) and error["code"], status


def test_schema_errors_name_the_field():
    from pydantic import ValidationError

    from depthlens.serve.errors import schema_error
    from depthlens.serve.schema import ChatRequest

    cases = [
        ({"messages": []}, 400, "messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, 400, "messages[0].role"),
        ({"messages": [{"role": "user"}], "n": 1.5}, 422, "n"),
        ({"messages": [{"role": "user"}], "tools": []}, 422, "tools"),
        ({}, 422, "model"),
    ]
    for body, status, param in cases:
        with pytest.raises(ValidationError) as exc:
            ChatRequest.model_validate({"model": "m", **body} if body else body)
        error = schema_error(exc.value)
        assert (error.status, error.param) == (status, param), (body, error.message)
        assert set(error.body()["error"]) == {"message", "type", "param", "code"}


def test_the_depth_object_follows_from_the_trace():
    from depthlens.config import DTRConfig
    from depthlens.sampling.backend import Trace
    from depthlens.serve.depth import summary

    rows = [[0.9, 0.8, 0.0], [0.2, 0.1, 0.0], [0.9, 0.6, 0.0], [0.7, 0.3, 0.0]]  # settle at 3, 1, 3, 2
    trace = Trace(
        seed=1,
        token_ids=[5, 6, 7, 8],
        finish="eos",
        log_prob=[-1.0, -2.0, -0.5, -0.5],
        entropy=[1.0] * 4,
        self_certainty=[0.5] * 4,
        confidence=[2.0, 3.0, 4.0, 5.0],
        divergence=rows,
    )
    d = summary(trace, 3, DTRConfig(g=0.5, rho=0.85, dtr_prefix_tokens=2), window=2, tokens=True)
    assert d["tokens"]["settling_depth"] == [3, 1, 3, 2] and d["tokens"]["deep"] == [True, False, True, False]
    assert d["dtr"] == 0.5 and d["dtr_prefix"] == 0.5 and d["mean_settling_depth"] == 2.25
    assert d["log_prob"] == -1.0 and d["neg_perplexity"] == pytest.approx(-math.e)
    assert d["confidence"] == 3.5 and d["deepconf"]["lowest"] == 2.5 and d["deepconf"]["tail"] == 4.5
    empty = summary(Trace(seed=2), 3, DTRConfig(), window=2, tokens=False)
    assert empty["dtr"] is None and empty["confidence"] is None and empty["token_count"] == 0


def test_engine_rows_are_taken_in_order_and_a_bad_request_fails_alone(tokenizer):
    """What the session gets from the engine's worker: each request's new rows after those it has; a gap or a NaN
    fails that request only (the rows themselves are checked against the transformers readout in
    test_serve_vllm)."""
    from depthlens.errors import NonFiniteError
    from depthlens.models.info import ModelInfo
    from depthlens.sampling.vllm.depth import EngineDepth, Gained
    from depthlens.sampling.vllm.engine import EngineError
    from depthlens.sampling.vllm.settings import Taken

    config = type("Config", (), {"num_hidden_layers": 3, "hidden_size": 64})()
    info = ModelInfo(name="tiny", source="tiny", tokenizer=tokenizer, config=config, end_ids=frozenset({2}))
    depth = EngineDepth(info)
    args = depth.request_args("r0", 5)
    settings = args["depthlens_readout"]
    assert args["depthlens_readout_tag"] == "r0" and settings["window"] == 5
    assert settings["vocab"] == len(tokenizer) and settings["kinds"] == ["jsd"] and settings["final_norm"]
    assert (
        settings["layer_top_k"] == 0
        and depth.request_args("r1", 5, 4)["depthlens_readout"]["layer_top_k"] == 4
    )
    rows = torch.rand(2, 1, 3)
    top_ids, top_probs = torch.randint(0, 9, (2, 3, 2), dtype=torch.int32), torch.rand(2, 3, 2)
    held = {
        "ok": Taken([3, 4], rows, None, top_ids, top_probs),
        "gap": Taken([5], rows[:1]),
        "nan": Taken([0, 1], rows.clone()),
        "none": Taken([], torch.zeros(0, 0, 3)),
    }
    held["nan"][1][1, 0, 2] = float("nan")
    asked = []

    class Engine:  # the driver's side of collective_rpc: rank 0 holds the rows, other ranks None
        def collective_rpc(self, method, args):
            asked.append((method, args))
            return [None, {tag: held[tag] for tag in args[0]}]

    got, failed = depth.take(Engine(), {"ok": 3, "gap": 2, "nan": 0, "none": 7})
    assert got == {"ok": Gained(rows.tolist(), top_ids.tolist(), top_probs.tolist())}
    assert set(failed) == {"gap", "nan"}
    assert isinstance(failed["gap"], EngineError) and "rows [5] after 2 rows" in str(failed["gap"])
    assert isinstance(failed["nan"], NonFiniteError) and "token 1" in str(failed["nan"])
    depth.release(Engine(), ["ok"])
    assert asked[-1] == ("depthlens_take", (["ok"],))


def test_saved_tokens_and_json_without_nan():
    from depthlens.serve.app import finite
    from depthlens.serve.jobs import _saved

    assert _saved([10, 20], [4, 4], 1) == (15 - 4) * 2 + 15  # mean finished length 15
    assert _saved([], [4], 3) == 0
    assert finite({"a": [1.0, float("nan")], "b": -math.inf, "c": torch.tensor(1).item()}) == {
        "a": [1.0, None],
        "b": None,
        "c": 1,
    }


def _cli(monkeypatch, capsys, *args):
    from tests.test_cli import run

    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        return run(monkeypatch, capsys, "serve", *args)
    finally:  # the command makes SIGTERM / SIGINT no-ops around its server: give the test process its own back
        for s, handler in handlers.items():
            signal.signal(s, handler)


def test_serve_refuses_bad_options_before_loading_anything(monkeypatch, capsys):
    import depthlens.cli.serve_cmd as serve_cmd

    code, _, err = _cli(monkeypatch, capsys, "--backend", "nope")
    assert code == 2 and "error: --backend 'nope' is not one of auto, hf, vllm" in err
    code, _, err = _cli(monkeypatch, capsys, "--readout-tokens", "many")
    assert code == 2 and "--readout-tokens 'many'" in err
    code, _, err = _cli(monkeypatch, capsys, "--model", "no-such-model-anywhere", "--backend", "hf")
    assert code == 2 and "could not load model 'no-such-model-anywhere'" in err
    monkeypatch.setattr(serve_cmd.importlib.util, "find_spec", lambda name: None)
    code, _, err = _cli(monkeypatch, capsys, "--backend", "hf")
    assert code == 2 and "pip install 'depthlens[serve]'" in err


@pytest.mark.skipif(not importlib.util.find_spec("vllm"), reason="needs the vllm extra")
def test_vllm_serve_loads_no_transformers_model(monkeypatch, capsys, tmp_path):
    """--backend vllm reads only the tokenizer and config: the engine holds the one copy of the weights."""
    import depthlens.cli.app as app
    import depthlens.cli.serve_cmd as serve_cmd
    from depthlens.models.info import ModelInfo
    from tests.serving import save_tiny_chat

    model = save_tiny_chat(tmp_path / "m")
    given = []
    monkeypatch.setattr(app, "load_model", lambda spec: pytest.fail(f"{spec.name}'s weights were loaded"))
    monkeypatch.setattr(
        serve_cmd, "_engine", lambda model, config, running, readout: given.append(model) or "engine"
    )
    monkeypatch.setattr(serve_cmd, "_run", lambda engine, tokenizer, *rest: given.append(tokenizer))
    code, _, err = _cli(monkeypatch, capsys, "--model", model, "--backend", "vllm", "--device", "cpu")
    assert code == 0, err
    info, tokenizer = given
    assert isinstance(info, ModelInfo) and info.model is None and info.n_layers == 3
    assert tokenizer is info.tokenizer  # prompts rendered and tokens decoded by the model's own


def test_auto_serves_on_vllm_where_it_can(monkeypatch, tmp_path):
    """A server's work has no end: auto is vllm where installed and able to load the model, not generate's
    job-size rule; a .gguf file, a missing extra or $DEPTHLENS_BACKEND give hf."""
    from depthlens.cli.serve_cmd import _backend
    from depthlens.sampling.choose import vllm_available

    monkeypatch.delenv("DEPTHLENS_BACKEND", raising=False)
    assert _backend("auto", str(tmp_path)) == ("vllm" if vllm_available() else "hf")
    assert _backend("auto", str(tmp_path / "model.gguf")) == "hf"
    monkeypatch.setenv("DEPTHLENS_BACKEND", "hf")
    assert _backend("auto", str(tmp_path)) == "hf"


@pytest.mark.parametrize(
    ("flag", "env", "installed", "model", "said"),
    [
        (
            "auto",
            None,
            True,
            "m",
            "engine: vllm (--backend auto: the vllm extra is installed, and one vLLM engine",
        ),
        (
            "auto",
            None,
            False,
            "m",
            "engine: hf (--backend auto: the vllm extra is not installed); transformers",
        ),
        ("auto", None, True, "m.gguf", "engine: hf (--backend auto: vLLM cannot load a .gguf file)"),
        ("auto", "hf", True, "m", "engine: hf (--backend auto, as $DEPTHLENS_BACKEND says)"),
        ("hf", None, True, "m", "engine: hf (as asked: --backend hf); transformers loads in seconds"),
    ],
)
def test_serve_says_which_engine_why_and_its_start_before_loading(
    monkeypatch, capsys, tmp_path, flag, env, installed, model, said
):
    """The engine a server runs, why, and what its start costs, on stderr before anything loads (issue 57, item 9:
    auto picked vLLM and a first start took 287 s with no word)."""
    import depthlens.cli.serve_cmd as serve_cmd
    import depthlens.sampling.choose as choose
    import depthlens.sampling.vllm.backend as vllm_backend

    monkeypatch.setattr(choose, "vllm_available", lambda: installed)
    monkeypatch.setattr(vllm_backend, "check_source", lambda model: None)
    if env is None:
        monkeypatch.delenv("DEPTHLENS_BACKEND", raising=False)
    else:
        monkeypatch.setenv("DEPTHLENS_BACKEND", env)

    def stop(engine, spec):
        from depthlens.errors import InputError

        raise InputError("stopped before loading")

    monkeypatch.setattr(serve_cmd, "load_for", stop)
    code, _, err = _cli(monkeypatch, capsys, "--model", str(tmp_path / model), "--backend", flag)
    assert code == 2 and "stopped before loading" in err
    line = " ".join(err.split())  # as one line, however the terminal wrapped it
    assert said in line and line.index("engine: ") < line.index("stopped before loading")
    if said.startswith("engine: vllm"):
        assert "takes ~31 s to start with its compile cache warm and minutes when it compiles afresh" in line
        assert "--backend hf starts in seconds" in line
    else:
        assert ("--backend vllm batches many clients' requests" in line) == installed


def test_a_port_in_use_is_one_error_line(monkeypatch, capsys, tmp_path):
    from tests.serving import save_tiny_chat

    model = save_tiny_chat(tmp_path / "m")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, _, err = _cli(
            monkeypatch, capsys, "--model", model, "--backend", "hf", "--device", "cpu", "--port", port
        )
    assert code == 2 and f"error: could not serve on 127.0.0.1:{port}" in err


def test_default_sampling_is_the_models_generation_config_else_depthlens(tokenizer):
    """A request without temperature / top_p samples at the model's generation_config (as vLLM's
    `--generation-config auto`) where it sets them, else at depthlens's 0.6 / 0.95 — never OpenAI's 1 / 1."""
    from types import SimpleNamespace

    from transformers import GenerationConfig, LlamaConfig

    from depthlens.models.info import sampling_defaults

    def model_with(config):
        return SimpleNamespace(model=SimpleNamespace(generation_config=config))

    assert sampling_defaults(model_with(GenerationConfig(do_sample=True, temperature=0.3, top_p=0.8))) == (
        0.3,
        0.8,
        "the model's generation_config",
    )
    assert sampling_defaults(model_with(GenerationConfig(do_sample=True, temperature=0.2)))[:2] == (0.2, 0.95)
    derived = GenerationConfig.from_model_config(
        LlamaConfig()
    )  # what a model without generation_config.json gets
    assert sampling_defaults(model_with(derived)) == (0.6, 0.95, "depthlens's defaults")
    assert sampling_defaults(model_with(None)) == (0.6, 0.95, "depthlens's defaults")
    job = _job(tokenizer, {"prompt": "x"}, temperature=0.3, top_p=0.8)
    assert job.sampling.temperature == 0.3 and job.sampling.top_p == 0.8
    given = _job(tokenizer, {"prompt": "x", "temperature": 1.0, "top_p": 1.0}, temperature=0.3, top_p=0.8)
    assert given.sampling.temperature == 1.0 and given.sampling.top_p == 1.0


@pytest.mark.parametrize("float32_lens", [True, False])
def test_the_served_readout_is_the_one_the_engine_runs(tokenizer, monkeypatch, float32_lens):
    """A response's ``read_with`` (and so ``/health``) reports the lens dtype from the settings every request
    hands the engine's worker (``request_readout``, the one builder), not from the options: ``--float32-lens``
    reaches the worker and is reported, and without it the engine's own dtype is."""
    import depthlens.sampling.vllm.engine as engine_module
    import depthlens.sampling.vllm.session as session_module
    from depthlens.config import EngineConfig, ReadoutConfig
    from depthlens.models.info import ModelInfo
    from depthlens.serve.engines import VLLMEngine, read_with

    class Session:  # the engine session, minus the engine: it keeps what the worker would be told
        def __init__(self, engine, depth, end_ids, n_layers):
            self.depth, self.max_model_len, self.failed, self.stats = depth, 256, None, {}

        def running(self):
            return 0

    class Started:  # a started vLLM engine as far as the server reads it: its dtype
        model_config = type("ModelConfig", (), {"dtype": torch.bfloat16})()

    monkeypatch.setattr(session_module, "EngineSession", Session)
    monkeypatch.setattr(engine_module, "readout_capture", lambda engine: "hooks")
    config = type("Config", (), {"num_hidden_layers": 3, "hidden_size": 64})()
    info = ModelInfo(name="tiny", source="tiny", tokenizer=tokenizer, config=config, end_ids=frozenset({2}))
    served = VLLMEngine(
        info, EngineConfig("vllm", float32_lens=float32_lens), ReadoutConfig(), llm_engine=Started()
    )
    sent = served.session.depth.request_args("r0", 4)["depthlens_readout"]
    assert sent["float32_lens"] is float32_lens
    assert read_with(served) == {
        "dtype": "bfloat16",
        "lens": "logit",
        "lens_dtype": "float32" if float32_lens else "bfloat16",
    }


def test_a_session_whose_engine_step_never_returns_still_answers_its_waiters_on_close():
    """``EngineSession.close`` after a step that hangs (an engine stuck inside ``step``): the stepping thread cannot
    run the failures it queues, so close fails the groups itself — a waiting caller gets ``GenerationCancelled``
    within the close's timeout instead of waiting forever (a hang seen once in a full suite run)."""
    import threading

    from depthlens.config import SamplingConfig
    from depthlens.sampling.backend import Trace
    from depthlens.sampling.live import GenerationCancelled
    from depthlens.sampling.vllm.groups import Group, GroupSpec, Sample
    from depthlens.sampling.vllm.session import EngineSession

    stuck = threading.Event()
    session = EngineSession.__new__(EngineSession)  # no engine: only what close and wait touch
    session.cond, session._inbox, session._closing, session.failed = threading.Condition(), [], False, None
    session.engine = type("Engine", (), {"engine_core": None})()
    session._thread = threading.Thread(target=stuck.wait, daemon=True)  # the step that never returns
    session._thread.start()
    group = Group(GroupSpec([1, 2], [0], SamplingConfig()), [Sample("t", Trace(seed=0))])
    session._groups = [group]
    raised: list[BaseException] = []

    def waiter() -> None:
        try:
            session.wait(group, lambda: False)
        except GenerationCancelled as exc:
            raised.append(exc)

    caller = threading.Thread(target=waiter, daemon=True)
    caller.start()
    session.close(timeout=0.2)
    caller.join(5)
    stuck.set()
    assert not caller.is_alive() and len(raised) == 1 and "did not stop" in str(raised[0])

"""The per-layer quantities on every front (issue 58 items 4–6): ``--layer-target``, ``--track ID,…`` and
``--layer-entropy`` on ``score``, ``generate`` and ``heatmap`` (which draws the trajectory); ``layer_target=``,
``track=``, ``layer_entropy=``, ``layer_stats=`` and ``hidden_layers=`` on the Python verbs; a request's
``depthlens.layer_target`` / ``track`` / ``layer_entropy`` on the server; Ray's score checked before its store.
Every front's values equal ``studies.score.score``'s for the same tokens; every refusal speaks its front's words
(tests/test_fronts.py holds the three spellings side by side)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import depthlens
from depthlens.config import ReadoutConfig
from depthlens.errors import ConfigError, InputError
from depthlens.stores.jsonl import iter_jsonl
from depthlens.stores.samples import iter_samples, read_manifest
from depthlens.studies.score import score
from tests.test_api import SMALL, TASK
from tests.test_cli import _input, run, tiny_dir  # noqa: F401  (tiny_dir: a fixture)
from tests.tolerance import assert_float32_equal, wrong_layer

TRACK = (3, 9)
READOUT = ReadoutConfig(layer_target=True, track=TRACK, layer_entropy=True)
FLAGS = ("--layer-target", "--track", "3,9", "--layer-entropy")
PER_LAYER = {"layer_target": True, "track": list(TRACK), "layer_entropy": True}
SHAPES = {  # field → the shape of one read-out token's value beyond [L]
    "layer_target_logprobs": (),
    "layer_target_ranks": (),
    "layer_track_logprobs": (2,),
    "layer_track_ranks": (2,),
    "layer_entropy": (),
}
RECORDS = [{"id": "a", "prompt": "1 2", "completion": "3 4 5"}]


def assert_same_values(actual: dict, expected: dict, what: str) -> None:
    """Every per-layer field of ``actual`` equals ``expected``'s: ranks exactly, log-probabilities and entropies
    within float32 (stores and results round to 6 decimals)."""
    for field in SHAPES:
        if field.endswith("_ranks"):
            assert np.array_equal(np.asarray(actual[field]), np.asarray(expected[field])), f"{what}: {field}"
        else:
            mutants = (
                [("a layer off", wrong_layer(actual[field]))] if field == "layer_target_logprobs" else []
            )
            assert_float32_equal(
                actual[field], expected[field], rounded=True, what=f"{what}: {field}", mutants=mutants
            )


# ---- the command line ------------------------------------------------------------------------------------------


def test_score_command_stores_them_as_score_reads_them(monkeypatch, capsys, tmp_path, tiny_dir):  # noqa: F811
    from depthlens.models.load import load

    src, out = _input(tmp_path), tmp_path / "out.jsonl"
    args = [
        "score",
        "--model",
        tiny_dir,
        "--in",
        src,
        "--device",
        "cpu",
        "--no-tcb",
        "--out",
        out,
        "--tokens",
    ]
    code, _, err = run(monkeypatch, capsys, *args, *FLAGS)
    assert code in (0, None), err
    (record,) = iter_jsonl(out)
    for field, tail in SHAPES.items():
        assert np.asarray(record[field]).shape == (4, 3, *tail), field
    readout = json.loads((tmp_path / "out.jsonl.manifest.json").read_text())["readout"]
    assert {k: readout[k] for k in PER_LAYER} == PER_LAYER
    lm = load(str(tiny_dir), device="cpu")
    [expected] = score(lm, [json.loads(src.read_text())], readout=READOUT, tokens=True, tcb=None)
    assert_same_values(record, expected, "score --layer-target --track --layer-entropy")


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            ["--layer-target"],
            "--layer-target: the target trajectory is kept per token and layer: add --tokens",
        ),
        (["--track", "3,9"], "--track 3,9: tracked ids are kept per token and layer: add --tokens"),
        (
            ["--layer-entropy"],
            "--layer-entropy: each layer's entropy is kept per token and layer: add --tokens",
        ),
        (
            ["--tokens", "--track", "3,x"],
            "--track '3,x': give token ids, comma-separated (e.g. --track 791,1462)",
        ),
        (["--tokens", "--track", "3,3"], "--track 3,3: must name each token id once"),
        (["--tokens", "--track", "-1"], "--track -1: must be token ids (whole numbers ≥ 0)"),
    ],
)
def test_score_command_refuses_what_it_cannot_keep_by_flag(monkeypatch, capsys, tmp_path, extra, message):
    src = _input(tmp_path)
    code, _, err = run(
        monkeypatch, capsys, "score", "--model", "x", "--in", src, "--out", tmp_path / "o", *extra
    )
    assert code == 2 and f"error: {message}\n" in err, err
    assert not (tmp_path / "o").exists()


def test_a_tracked_id_past_the_vocabulary_is_refused_before_anything_is_written(
    monkeypatch,
    capsys,
    tmp_path,
    tiny_dir,  # noqa: F811
):
    src, out = _input(tmp_path), tmp_path / "o"
    args = [
        "score",
        "--model",
        tiny_dir,
        "--in",
        src,
        "--out",
        out,
        "--device",
        "cpu",
        "--tokens",
        "--no-tcb",
    ]
    code, _, err = run(monkeypatch, capsys, *args, "--track", "3,101")
    assert code == 2 and "error: --track 3,101: token id 101 is past" in err and "vocabulary of 101" in err, (
        err
    )
    assert not out.exists()


def test_generate_command_stores_them_for_the_read_out_tokens(monkeypatch, capsys, tmp_path):
    from tests.conftest import save_chat_model

    model, out = save_chat_model(tmp_path / "chat"), tmp_path / "pool"
    args = [
        "generate",
        "--model",
        model,
        "--device",
        "cpu",
        "--task",
        TASK,
        "--questions",
        "1",
        "--pool",
        "2",
    ]
    small = ["--max-new-tokens", "6", "--readout-tokens", "4", "--task-config", SMALL["task_config"]]
    code, _, err = run(monkeypatch, capsys, *args, *small, "--out", out, *FLAGS)
    assert code in (0, None), err
    assert {k: read_manifest(out)["readout"][k] for k in PER_LAYER} == PER_LAYER
    for record in iter_samples(out):
        for field, tail in SHAPES.items():
            assert np.asarray(record[field]).shape == (min(4, record["token_count"]), 3, *tail), field
    code, _, err = run(monkeypatch, capsys, *args, *small, "--out", tmp_path / "bad", "--track", "3,101")
    assert code == 2 and "error: --track 3,101: token id 101 is past" in err, err  # before the weights load
    assert not (tmp_path / "bad").exists()


def test_heatmap_draws_the_trajectory_unless_told_not_to(monkeypatch, capsys, tmp_path):
    from tests.conftest import save_chat_model

    model = save_chat_model(tmp_path / "chat")
    args = ["heatmap", "--model", model, "--device", "cpu", "--prompt", "1 2", "--completion", "3 4 5"]
    code, _, err = run(monkeypatch, capsys, *args, "--out", tmp_path / "a", "--track", "3,9")
    assert code in (0, None), err
    record = json.loads((tmp_path / "a" / "record.json").read_text())
    assert record["track"] == [3, 9] and len(record["track_tokens"]) == 2
    assert np.asarray(record["layer_track_ranks"]).shape == (5, 3, 2)
    png = (tmp_path / "a" / "trajectory.png").read_bytes()
    assert png[:4] == b"\x89PNG" and len(png) > 5000 and "trajectory.png" in err
    code, _, err = run(monkeypatch, capsys, *args, "--out", tmp_path / "b", "--no-layer-target")
    assert code in (0, None), err
    assert not (tmp_path / "b" / "trajectory.png").exists()
    assert "layer_target_ranks" not in json.loads((tmp_path / "b" / "record.json").read_text())


@pytest.mark.integration
def test_heatmap_trajectory_on_the_default_model(real_model, monkeypatch, capsys, tmp_path):
    """The classic plot on SmolLM2: the trajectory's last layer is the model's own distribution, so the read-out
    tokens' mean log-probability there is the record's ``log_prob``; " Paris" is tracked by its id."""
    paris = real_model.tokenizer(" Paris", add_special_tokens=False)["input_ids"]
    args = [
        "heatmap",
        "--prompt",
        "The capital of France is",
        "--completion",
        " Paris. It is",
        "--out",
        tmp_path,
    ]
    code, _, err = run(monkeypatch, capsys, *args, "--track", ",".join(map(str, paris)))
    assert code in (0, None), err
    record = json.loads((tmp_path / "record.json").read_text())
    logprobs = np.asarray(record["layer_target_logprobs"])
    assert logprobs.shape == (len(record["tokens"]), 30) and record["track_tokens"] == ["␣Paris"]
    assert_float32_equal(
        logprobs[:, -1].mean(), record["log_prob"], rounded=True, what="layer L's mean log_prob"
    )
    assert record["layer_target_ranks"][0][-1] == 0  # " Paris" is the model's own first choice at layer L
    assert (tmp_path / "trajectory.png").stat().st_size > 20_000


# ---- Python ----------------------------------------------------------------------------------------------------


def _top2(logprobs):
    return logprobs.topk(2, dim=-1).values


def test_the_score_verb_returns_each_quantity_as_an_array(tiny_chat):
    table = depthlens.score(
        tiny_chat, RECORDS, tokens=True, **PER_LAYER, layer_stats={"top2": _top2}, hidden_layers=[0, 3]
    )
    frame = depthlens.to_pandas(table)
    T, L = len(frame["token_ids"][0]), tiny_chat.n_layers
    for field, tail in {**SHAPES, "layer_stat_top2": (2,), "hidden_states": (2,)}.items():
        width = (tiny_chat.model.config.hidden_size,) if field == "hidden_states" else ()
        assert frame[field][0].shape == ((T, *tail, *width) if field == "hidden_states" else (T, L, *tail)), (
            field
        )
    [expected] = score(
        tiny_chat, RECORDS, readout=READOUT, tokens=True, layer_stats={"top2": _top2}, hidden_layers=[0, 3]
    )
    assert_same_values(table.to_pylist()[0], expected, "depthlens.score")
    assert_float32_equal(frame["layer_stat_top2"][0], expected["layer_stat_top2"], rounded=True, what="stat")
    assert np.array_equal(frame["hidden_states"][0], expected["hidden_states"])
    assert frame["layer_target_ranks"][0].dtype.kind == "i"


def test_the_generate_and_online_verbs_keep_them_in_their_stores(tiny_chat, tmp_path):
    out = tmp_path / "pool"
    table = depthlens.generate(
        tiny_chat, TASK, pool=2, readout_tokens=4, out=out, **PER_LAYER, layer_stats={"top2": _top2}, **SMALL
    )
    assert read_manifest(out)["layer_stats"] == {"top2": 2}
    for row, stored in zip(table.to_pylist(), iter_samples(out), strict=True):
        assert row["layer_target_ranks"] == stored["layer_target_ranks"]
        assert np.asarray(row["layer_stat_top2"]).shape == (min(4, row["token_count"]), 3, 2)
        same = {"id": "x", "prompt_ids": row["prompt_ids"], "completion_ids": row["token_ids"][:4]}
        [scored] = score(tiny_chat, [same], readout=READOUT, tokens=True, tcb=None)
        assert_same_values(row, scored, "depthlens.generate")
    live = tmp_path / "live"
    depthlens.online(tiny_chat, TASK, out=live, warmup=2, max_n=3, prefix=4, layer_target=True, **SMALL)
    sampled = [r for r in iter_jsonl(live / "samples.jsonl") if r.get("token_count")]
    assert sampled and all(np.asarray(r["layer_target_ranks"]).shape[1] == 3 for r in sampled)


@pytest.mark.parametrize(
    ("call", "error", "said"),
    [
        (
            lambda lm: depthlens.score(lm, RECORDS, layer_stats={"m": _top2}),
            InputError,
            "depthlens.score(layer_stats=['m']): each statistic is kept per token and layer: add tokens=True",
        ),
        (
            lambda lm: depthlens.score(lm, RECORDS, tokens=True, backend="vllm", layer_stats={"m": _top2}),
            InputError,
            "depthlens.score(layer_stats=['m']): a statistic runs in the transformers readout: use backend='hf'",
        ),
        (
            lambda lm: depthlens.score(lm, RECORDS, tokens=True, backend="vllm", hidden_layers=[1]),
            InputError,
            "depthlens.score(hidden_layers=[1]): hidden states are taken by the transformers readout: use "
            "backend='hf'",
        ),
        (
            lambda lm: depthlens.score(lm, RECORDS, hidden_layers=[1], out="nowhere"),
            InputError,
            "depthlens.score(hidden_layers=[1]): hidden states are returned, never stored: score them with out=None",
        ),
        (
            lambda lm: depthlens.score(lm, RECORDS, hidden_layers=[9]),
            InputError,
            "depthlens.score(hidden_layers=[9]): layer 9 is out of range: layers are 0..3 (0 the embeddings, l "
            "block l's output, 3 the last hidden state)",
        ),
        (
            lambda lm: depthlens.generate(lm, TASK, track=[3, 101], **SMALL),
            ConfigError,
            "depthlens.generate(track=[3, 101]): token id 101 is past tiny-llama's vocabulary of 101 (ids 0..100)",
        ),
        (
            lambda lm: depthlens.generate(lm, TASK, backend="vllm", layer_stats={"m": _top2}, **SMALL),
            InputError,
            "depthlens.generate(layer_stats=['m']): a statistic runs in the transformers readout: use backend='hf'",
        ),
    ],
)
def test_the_verbs_refuse_in_python_words_before_any_engine(tiny_chat, call, error, said):
    with pytest.raises(error) as raised:
        call(tiny_chat)
    assert str(raised.value) == said


# ---- the server ------------------------------------------------------------------------------------------------


@pytest.fixture
def served(tiny_chat):
    from fastapi.testclient import TestClient

    from depthlens.config import ServeConfig
    from depthlens.serve.app import create_app
    from depthlens.serve.engines import HFEngine

    with TestClient(create_app(HFEngine(tiny_chat), tiny_chat.tokenizer, ServeConfig("tiny"))) as client:
        yield client


def _rows(stream_lines) -> dict[str, list]:
    """Each per-layer field of a stream's read-out rows, concatenated in order (their offsets checked)."""
    out: dict[str, list] = {field: [] for field in SHAPES}
    for line in stream_lines:
        if not line.startswith("data: {"):
            continue
        choice = (json.loads(line[6:])["choices"] or [{}])[0]
        readout = (choice.get("depthlens") or {}).get("readout")
        if readout:
            assert readout["offset"] == len(out["layer_target_ranks"])
            for field in SHAPES:
                out[field].extend(readout[field])
    return out


def test_a_request_gets_them_per_token_and_in_stream_rows(served, tiny_chat):
    pytest.importorskip("pydantic")
    body = {
        "model": "tiny",
        "prompt": [1, 5, 6],
        "max_tokens": 6,
        "seed": 3,
        "depthlens": {"tokens": True, **PER_LAYER},
    }
    reply = served.post("/v1/completions", json=body)
    assert reply.status_code == 200, reply.text
    tokens = reply.json()["choices"][0]["depthlens"]["tokens"]
    record = {"id": "x", "prompt_ids": [1, 5, 6], "completion_ids": tokens["token_ids"]}
    [scored] = score(tiny_chat, [record], readout=READOUT, tokens=True, tcb=None)
    assert_same_values(tokens, scored, "served")
    with served.stream("POST", "/v1/completions", json={**body, "stream": True}) as stream:
        rows = _rows(stream.iter_lines())
    assert rows["layer_target_ranks"] == tokens["layer_target_ranks"]
    assert_float32_equal(rows["layer_track_logprobs"], tokens["layer_track_logprobs"], what="streamed")
    plain = served.post("/v1/completions", json={**body, "depthlens": {"tokens": True}})
    assert "layer_target_ranks" not in plain.json()["choices"][0]["depthlens"]["tokens"]  # none unless asked


@pytest.mark.parametrize(
    ("depthlens_options", "param", "said"),
    [
        ({"layer_target": True}, "depthlens.layer_target", "depthlens.layer_target true: the target trajectory is "
         "kept per token and layer: add depthlens.tokens true"),
        ({"track": [3]}, "depthlens.track", "depthlens.track [3]: tracked ids are kept per token and layer: add "
         "depthlens.tokens true"),
        ({"layer_entropy": True}, "depthlens.layer_entropy", "depthlens.layer_entropy true: each layer's entropy is "
         "kept per token and layer: add depthlens.tokens true"),
        ({"tokens": True, "track": [3, 101]}, "depthlens.track", "depthlens.track [3, 101]: token id 101 is past the "
         "model's vocabulary of 101 (ids 0..100)"),
        ({"tokens": True, "track": [3, 3]}, "depthlens.track", "depthlens.track [3, 3]: must name each token id once"),
    ],
)  # fmt: skip
def test_a_request_is_refused_naming_its_field(served, depthlens_options, param, said):
    reply = served.post(
        "/v1/completions", json={"model": "tiny", "prompt": [1, 5], "depthlens": depthlens_options}
    )
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert (error["param"], error["code"], error["message"]) == (param, "invalid_value", said)


# ---- Ray -------------------------------------------------------------------------------------------------------


def test_ray_score_refuses_a_tracked_id_past_the_vocabulary_before_its_store(tmp_path):
    """Checked on the model's tokenizer and config, before the store is written or Ray is started."""
    from depthlens.config import ModelSpec, RayConfig, ScoreRun, StoreSpec
    from depthlens.scale.score import score_on_ray
    from tests.conftest import save_chat_model

    model = save_chat_model(tmp_path / "chat")
    run = ScoreRun(_input(tmp_path), StoreSpec(tmp_path / "o"), ReadoutConfig(track=(3, 101)), tokens=True)
    with pytest.raises(ConfigError, match=r"track=\[3, 101\]: token id 101 is past .*vocabulary of 101"):
        score_on_ray(ModelSpec(str(model)), run, RayConfig())
    assert not (tmp_path / "o").exists()

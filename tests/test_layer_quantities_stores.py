"""The per-layer quantities in the stores (issue 58 items 4–5): ``run_score`` and ``generate`` keep the target
trajectory, tracked ids, entropy and a caller's statistic in both formats (fixed-size lists: values float32, ranks
int32), stamp them in the manifest, refuse a resume with other settings and a bad setting before anything is
written, and every reader — ``depthlens check`` included — refuses a damaged value by name."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from depthlens.config import GenerateRun, ReadoutConfig, SamplingConfig, ScoreRun, StoreSpec
from depthlens.errors import ConfigError, InputError, StoreError
from depthlens.evals.tasks import Question
from depthlens.metrics.layer_quantities import StatisticError
from depthlens.stores.arrow import to_pandas, to_table
from depthlens.stores.check import check
from depthlens.stores.parquet import iter_store, store_manifest
from depthlens.stores.records import per_layer_problem
from depthlens.stores.samples import iter_samples, read_manifest, read_responses
from depthlens.stores.validate import bounds, record_fault, table_fault
from depthlens.studies.generate import generate
from depthlens.studies.score import run_score, score
from tests.tolerance import assert_float32_equal

ROWS = [
    {"id": f"r{i}", "prompt_ids": [4, 5 + i, 6], "completion_ids": [7, 8, 9 + i, 11, 12]} for i in range(3)
]
QUESTIONS = [Question(f"q{i}", f"{i} + {i}", str(2 * i)) for i in range(2)]
TRACK = (3, 9)
READOUT = ReadoutConfig(layer_target=True, track=TRACK, layer_entropy=True)
STATS = {"top2": lambda lp: lp.topk(2, dim=-1).values}
FIELDS = {
    "layer_target_logprobs": (),
    "layer_target_ranks": (),
    "layer_track_logprobs": (2,),
    "layer_track_ranks": (2,),
    "layer_entropy": (),
    "layer_stat_top2": (2,),
}


def _source(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return src


@pytest.mark.parametrize("name", ["scores.jsonl", "scores"])
def test_score_stores_the_per_layer_quantities_and_resume_refuses_others(tiny_llama, tmp_path, name):
    src, out = _source(tmp_path), tmp_path / name
    run_score(tiny_llama, ScoreRun(src, StoreSpec(out), READOUT, tokens=True), layer_stats=STATS)
    manifest = store_manifest(out)
    assert manifest["readout"]["layer_target"] and manifest["readout"]["track"] == list(TRACK)
    assert manifest["layer_stats"] == {"top2": 2} and manifest["vocab_rows"] == 101
    stored = list(iter_store(out))
    direct = score(tiny_llama, ROWS, readout=READOUT, tokens=True, layer_stats=STATS)
    L = tiny_llama.n_layers
    for record, want in zip(stored, direct, strict=True):
        for field, tail in FIELDS.items():
            assert np.asarray(record[field]).shape == (5, L, *tail), field
            if field.endswith("_ranks"):
                assert record[field] == want[field]
            else:
                assert_float32_equal(record[field], want[field], rounded=True, what=field)
    if name == "scores":  # Parquet: fixed-size lists, ranks int32 and values float32
        table = pq.read_table(next(out.glob("part-*.parquet")))
        assert table.schema.field("layer_target_ranks").type == pa.list_(pa.list_(pa.int32(), L))
        assert table.schema.field("layer_track_logprobs").type == pa.list_(
            pa.list_(pa.list_(pa.float32(), 2), L)
        )
        frame = to_pandas(table)
        assert frame["layer_target_ranks"][0].shape == (5, L) and frame["layer_track_ranks"][0].shape == (
            5,
            L,
            2,
        )
    other_track = ReadoutConfig(layer_target=True, track=(3,), layer_entropy=True)
    refusals = {
        r"readout.layer_target: stored True, this run False": (
            ReadoutConfig(track=TRACK, layer_entropy=True),
            STATS,
        ),
        r"readout.track: stored \[3, 9\], this run \[3\]": (other_track, STATS),
        r"layer_stats.top2: stored 2, this run '\(absent\)'": (READOUT, None),
    }
    for said, (readout, stats) in refusals.items():
        with pytest.raises(StoreError, match=said):
            run_score(
                tiny_llama,
                ScoreRun(src, StoreSpec(out, resume=True), readout, tokens=True),
                layer_stats=stats,
            )
    run_score(tiny_llama, ScoreRun(src, StoreSpec(out, resume=True), READOUT, tokens=True), layer_stats=STATS)
    assert [r["id"] for r in iter_store(out)] == [r["id"] for r in ROWS]  # the same settings resume


@pytest.mark.parametrize(
    ("settings", "error", "said"),
    [
        ({"readout": ReadoutConfig(track=(3, 101))}, ConfigError, r"track=\[3, 101\]: token id 101 is past"),
        ({"layer_stats": {"nan": lambda lp: lp.sum(-1) * math.nan}}, StatisticError, r"\['nan'\]: returned NaN"),
        ({"layer_stats": {"raises": lambda lp: lp.nope}}, StatisticError, r"\['raises'\]: raised AttributeError"),
        ({"layer_stats": {"shape": lambda lp: lp}}, StatisticError, r"\['shape'\]: returned shape \[2, 101\]: m = 101"),
    ],
)  # fmt: skip
def test_a_bad_setting_is_refused_before_anything_is_written(
    tiny_llama, tiny_chat, tmp_path, settings, error, said
):
    src = _source(tmp_path)
    readout = settings.get("readout", READOUT)
    stats = settings.get("layer_stats")
    with pytest.raises(error, match=said):
        run_score(
            tiny_llama, ScoreRun(src, StoreSpec(tmp_path / "s"), readout, tokens=True), layer_stats=stats
        )
    assert not (tmp_path / "s").exists()
    run = GenerateRun(
        StoreSpec(tmp_path / "g"), pool=1, sampling=SamplingConfig(max_new_tokens=3), readout=readout
    )
    with pytest.raises(error, match=said):
        generate(tiny_chat, run, QUESTIONS, layer_stats=stats)
    assert not (tmp_path / "g").exists()


def test_statistics_are_refused_on_the_vllm_engine_by_name(tiny_llama, tmp_path):
    from depthlens.config import EngineConfig

    run = ScoreRun(
        _source(tmp_path), StoreSpec(tmp_path / "s"), READOUT, tokens=True, engine=EngineConfig("vllm")
    )
    with pytest.raises(
        InputError, match=r"layer_stats=\['top2'\]: a statistic runs in the transformers readout"
    ):
        run_score(tiny_llama, run, layer_stats=STATS)
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_generate_stores_the_quantities_of_the_read_out_tokens(tiny_chat, tmp_path, fmt):
    sampling = SamplingConfig(max_new_tokens=6, readout_tokens=4, temperature=1.0)
    store = tmp_path / fmt

    def run(readout: ReadoutConfig, resume: bool = False, stats=STATS):
        spec = StoreSpec(store, resume=resume, format=fmt)
        return generate(
            tiny_chat,
            GenerateRun(spec, pool=2, sampling=sampling, readout=readout),
            QUESTIONS,
            layer_stats=stats,
        )

    run(READOUT)
    manifest = read_manifest(store)
    assert manifest["readout"]["track"] == list(TRACK) and manifest["layer_stats"] == {"top2": 2}
    records = [r for _, r in read_responses(store)]  # every record checked, the per-layer fields included
    for record in records:
        n = min(4, record["token_count"])
        for field, tail in FIELDS.items():
            assert np.asarray(record[field]).shape == (n, tiny_chat.n_layers, *tail), field
        prompt, tokens = record["prompt_ids"], record["token_ids"][:n]
        same = {"id": "x", "prompt_ids": prompt, "completion_ids": tokens}
        [scored] = score(tiny_chat, [same], readout=READOUT, tokens=True, tcb=None, layer_stats=STATS)
        assert record["layer_target_ranks"] == scored["layer_target_ranks"]
        assert_float32_equal(
            record["layer_target_logprobs"], scored["layer_target_logprobs"], rounded=True, what="stored"
        )
    with pytest.raises(StoreError, match=r"readout.track: stored \[3, 9\], this run \[9\]"):
        run(ReadoutConfig(layer_target=True, track=(9,), layer_entropy=True), resume=True)
    with pytest.raises(StoreError, match=r"layer_stats.top2: stored 2"):
        run(READOUT, resume=True, stats=None)
    assert run(READOUT, resume=True).skipped == 4
    assert [r["layer_track_ranks"] for r in iter_samples(store)] == [r["layer_track_ranks"] for r in records]


def _damaged(tmp_path, tiny_chat, change):
    """A JSONL sample store with per-layer fields whose first record ``change`` edits in place."""
    store = tmp_path / "samples"
    run = GenerateRun(
        StoreSpec(store, format="jsonl"), pool=2, sampling=SamplingConfig(max_new_tokens=4), readout=READOUT
    )
    generate(tiny_chat, run, QUESTIONS[:1])
    path = store / "samples.jsonl"
    lines = path.read_text().splitlines()
    record = json.loads(lines[0])
    change(record)
    path.write_text("\n".join([json.dumps(record), *lines[1:]]) + "\n")
    return store


def _positive(record: dict) -> None:
    record["layer_target_logprobs"][0][1] = 0.5


def _past_vocabulary(record: dict) -> None:
    record["layer_track_ranks"][0][0][1] = 101


def _narrow(record: dict) -> None:
    for row in record["layer_target_ranks"]:
        row.pop()


DAMAGE = [
    (_positive, r"layer_target_logprobs holds 0.5, not log-probabilities \(finite, ≤ 0\)"),
    (_past_vocabulary, r"layer_track_ranks holds 101.0, not ranks \(whole numbers in 0..100\)"),
    (_narrow, r"layer_target_ranks holds 'an array of shape \[\d+, 2\]', not \[T, 3\] ranks"),
    (
        lambda r: r["layer_entropy"][0].pop(),
        r"layer_entropy holds 'rows of unequal lengths', not \[T, 3\] entropies",
    ),
    (
        lambda r: r.pop("layer_entropy"),
        r"no layer_entropy, which the manifest's readout asks of every record",
    ),
]


@pytest.mark.parametrize(("change", "said"), DAMAGE)
def test_a_damaged_value_is_refused_by_every_reader_and_by_check(tiny_chat, tmp_path, change, said):
    store = _damaged(tmp_path, tiny_chat, change)
    with pytest.raises(StoreError, match=said):
        list(read_responses(store))
    [report] = check(store)
    assert any(re.search(said, p.detail) for p in report.problems), [p.detail for p in report.problems]


def test_the_ranges_know_the_vocabulary_layers_and_widths():
    manifest = {
        "n_layers": 3,
        "vocab_rows": 50,
        "readout": {"layer_target": True, "track": [4, 7], "layer_entropy": True},
        "layer_stats": {"one": 0, "two": 2},
    }
    ranges = bounds(manifest)
    good = {
        "layer_target_logprobs": [[-1.0, -0.5, -0.0]],
        "layer_target_ranks": [[0, 49, 3]],
        "layer_track_logprobs": [[[-1.0, -2.0]] * 3],
        "layer_track_ranks": [[[0, 4]] * 3],
        "layer_entropy": [[0.0, 1.0, math.log(50)]],
        "layer_stat_one": [[-1e6, 0.0, 1e6]],
        "layer_stat_two": [[[1.0, 2.0]] * 3],
    }
    assert record_fault(good, ranges) is None
    damaged = {
        "layer_target_ranks": [[0, 50, 3]],  # rank past V − 1
        "layer_target_logprobs": [[-1.0, float("nan"), 0.0]],  # not finite
        "layer_entropy": [[0.0, 1.0, math.log(50) + 0.1]],  # above ln V
        "layer_stat_one": [[1.0, float("inf"), 0.0]],
        "layer_stat_two": [[1.0, 2.0, 3.0]],  # [L] where [L, 2] is stored
        "layer_track_logprobs": [[[-1.0, -2.0, -3.0]] * 3],  # three tracked ids for two
    }
    for field, value in damaged.items():
        fault = record_fault({**good, field: value}, ranges)
        assert fault is not None and fault.field == field, field
    table = to_table([good])  # a shard whose rows have another width is refused as a whole column
    assert table_fault(table, ranges) is None
    wide = to_table([{**good, "layer_stat_two": [[[1.0, 2.0, 3.0]] * 3]}])
    assert table_fault(wide, ranges).field == "layer_stat_two"
    record = {"divergence": [[0.1] * 3], "token_count": 1, **good}
    assert per_layer_problem(record, manifest) is None
    past = {**manifest, "readout": {**manifest["readout"], "track": [4, 70]}}
    assert per_layer_problem(record, past).startswith("the manifest's readout.track holds 70")
    assert per_layer_problem({**record, "divergence": [[0.1] * 3] * 2}, manifest).startswith(
        "layer_target_logprobs holds 1 rows for 2 read-out tokens"
    )


def test_hidden_states_reach_a_table_as_one_array():
    """A table (the Python verbs' ``to_table``) keeps ``hidden_states`` as a float32 [T × k × d] array per row;
    ``to_pandas`` gives the (T, k, d) array back."""
    states = np.arange(5 * 2 * 4, dtype=np.float32).reshape(5, 2, 4) / 7
    frame = to_pandas(
        to_table([{"id": "a", "hidden_states": states}, {"id": "b", "hidden_states": states[:2]}])
    )
    back = frame["hidden_states"]
    assert back[0].shape == (5, 2, 4) and back[0].dtype == np.float32 and back[1].shape == (2, 2, 4)
    np.testing.assert_array_equal(back[0], states)


def test_a_pool_read_out_nowhere_holds_no_rows_and_reads_clean(tiny_chat, tmp_path):
    """``readout_tokens=0`` with the per-layer settings: no token read out, no rows, and nothing reported missing."""
    sampling = SamplingConfig(max_new_tokens=3, readout_tokens=0)
    run = GenerateRun(StoreSpec(tmp_path / "s", format="jsonl"), pool=1, sampling=sampling, readout=READOUT)
    generate(tiny_chat, run, QUESTIONS[:1])
    [(_, record)] = list(read_responses(tmp_path / "s"))
    assert record["divergence"] == [] and "layer_target_ranks" not in record

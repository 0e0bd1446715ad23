"""Fuzzed readers: whatever bytes a file holds and whatever numbers an option gets, depthlens gives a result or a
DepthlensError (one `error:` line from the CLI) — never another exception."""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from depthlens.config import (
    CorrelationConfig,
    DTRConfig,
    ReadoutConfig,
    SamplingConfig,
    TCBConfig,
    VotingConfig,
)
from depthlens.errors import DepthlensError
from depthlens.evals.loading import parse_task_config
from depthlens.stores.inputs import read_records
from depthlens.stores.samples import SAMPLES, STORE_VERSION, read_manifest
from depthlens.studies.stored import load_store
from depthlens.studies.thinkn import load_pools

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
# Records near the accepted shapes, so the fuzzing reaches past the first key check.
near_records = st.fixed_dictionaries(
    {},
    optional={
        "id": json_values,
        "prompt": json_values,
        "completion": json_values,
        "messages": st.lists(
            st.fixed_dictionaries({}, optional={"role": json_values, "content": json_values})
        ),
        "prompt_ids": st.lists(st.integers()) | json_values,
        "completion_ids": st.lists(st.integers()) | json_values,
    },
)
lines = st.lists(
    st.one_of(
        st.binary(max_size=40),
        near_records.map(lambda r: json.dumps(r).encode()),
        json_values.map(lambda v: json.dumps(v).encode()),
    ),
    max_size=5,
)


def _file(content: bytes) -> Path:
    directory = Path(tempfile.mkdtemp())
    path = directory / "in.jsonl"
    path.write_bytes(content)
    return path


def _outcome(call: object) -> object:
    try:
        return call()  # type: ignore[operator]
    except DepthlensError as exc:
        return exc


@FUZZ
@given(lines, st.booleans())
def test_jsonl_input_reader(raw_lines, skip_bad):
    content = b"\n".join(raw_lines) + b"\n"
    path = _file(content)
    result = _outcome(lambda: read_records(path, skip_bad=skip_bad))
    if not isinstance(result, DepthlensError):
        records, bad = result
        assert all(isinstance(r.data, dict) for r in records)
        assert len(records) + len(bad) <= content.count(b"\n")


def _manifest(n_layers: object = 3) -> dict:
    return {
        "store_version": STORE_VERSION,
        "model": "m",
        "n_layers": n_layers,
        "questions": ["q0"],
        "pool": 2,
        "dtr": DTRConfig().to_dict(),
        "readout": ReadoutConfig().to_dict(),
    }


good_sample = {
    "id": "q0#0",
    "question_id": "q0",
    "sample": 0,
    "status": "ok",
    "token_count": 1,
    "vote_key": "1",
    "correct": True,
    "log_prob": [-0.1],
    "entropy": [0.2],
    "self_certainty": [0.3],
    "confidence": [0.4],
    "divergence": [[0.5, 0.2, 0.0]],
}
samples = st.lists(
    st.one_of(
        st.binary(max_size=30),
        st.dictionaries(st.sampled_from(sorted(good_sample)), json_values).map(
            lambda d: json.dumps({**good_sample, **d}).encode()
        ),
    ),
    max_size=4,
)


@FUZZ
@given(samples, st.booleans())
def test_store_readers(raw_lines, torn):
    path = _file(b"")
    store = path.parent
    body = b"\n".join(raw_lines) + (b"" if torn else b"\n")
    (store / SAMPLES).write_bytes(body)
    (store / f"{SAMPLES}.manifest.json").write_text(json.dumps(_manifest()))
    _outcome(lambda: load_pools(store, DTRConfig(), 1))
    _outcome(lambda: load_store(store))


@FUZZ
@given(
    st.one_of(
        st.binary(max_size=200),
        json_values.map(lambda v: json.dumps(v).encode()),
        st.dictionaries(st.sampled_from(sorted(_manifest())), json_values).map(
            lambda d: json.dumps({**_manifest(), **d}).encode()
        ),
    )
)
def test_manifest_reader(raw):
    path = _file(b"")
    store = path.parent
    (store / SAMPLES).write_text(json.dumps(good_sample) + "\n")
    (store / f"{SAMPLES}.manifest.json").write_bytes(raw)
    manifest = _outcome(lambda: read_manifest(store))
    if isinstance(manifest, dict):
        _outcome(lambda: load_pools(store, DTRConfig(), 1))
        _outcome(lambda: load_store(store))


numbers = st.one_of(st.floats(), st.integers(min_value=-(10**6), max_value=10**6), st.none())


@FUZZ
@given(numbers, numbers, numbers, numbers)
def test_numeric_options(a, b, c, d):
    """Every config takes any numbers: a valid setting, or a ConfigError (nan and inf included)."""
    for build in (
        lambda: DTRConfig(g=a, rho=b, dtr_prefix_tokens=c if isinstance(c, int) else None),
        lambda: TCBConfig(epsilon=a, power_iterations=d if isinstance(d, int) else 1),
        lambda: SamplingConfig(temperature=a, top_p=b, max_new_tokens=c if isinstance(c, int) else 1),
        lambda: VotingConfig(n=c if isinstance(c, int) else 1, eta=a, trials=d if isinstance(d, int) else 1),
        lambda: ReadoutConfig(memory_mb=c if isinstance(c, int) else 16),
        lambda: CorrelationConfig(bins=c if isinstance(c, int) else 5, n=d if isinstance(d, int) else None),
    ):
        try:
            config = build()
        except DepthlensError:
            continue
        except TypeError:  # None where a number is required: typer never passes one
            continue
        for value in config.to_dict().values():
            assert not (isinstance(value, float) and math.isnan(value))


@FUZZ
@given(st.text(max_size=30))
def test_task_config_parser(text):
    _outcome(lambda: parse_task_config(text))

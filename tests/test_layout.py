"""The one-room-per-concern layout: old import paths still resolve (with a warning naming the new home), the sample
store has one reader whose errors name the real file, and variants are registry rows."""

from __future__ import annotations

import importlib
import warnings
from typing import get_args

import pytest

from depthlens.config import SamplingConfig, Signal, StoreFormat
from depthlens.errors import StoreError
from depthlens.evals.tasks import Question
from depthlens.stores.formats import FORMATS, REGISTRY
from depthlens.stores.parquet import rewrite_store, store_manifest
from depthlens.stores.samples import SHARDS, samples_path
from depthlens.studies.generate import generate_store
from depthlens.studies.online import ordered_pools
from depthlens.studies.stored import load_store
from depthlens.studies.thinkn import load_pools
from depthlens.voting.online import SIGNALS

MOVED = [  # (old module, name, where it lives now)
    ("depthlens.studies.records", "iter_jsonl", "depthlens.stores.jsonl"),
    ("depthlens.studies.records", "read_records", "depthlens.stores.inputs"),
    ("depthlens.studies.records", "write_json", "depthlens.stores.files"),
    ("depthlens.studies.parquet_store", "ShardWriter", "depthlens.stores.parquet"),
    ("depthlens.studies.stores", "open_results", "depthlens.stores.formats"),
    ("depthlens.studies.tasks", "load_task", "depthlens.evals.loading"),
    ("depthlens.studies.tasks", "grade", "depthlens.evals.grading"),
    ("depthlens.studies.store_answers", "AnswerSummary", "depthlens.evals.grading"),
    ("depthlens.voting.answers", "extract_answer", "depthlens.evals.answers"),
    ("depthlens.sampling.generate", "HFGenerator", "depthlens.sampling.hf"),
    ("depthlens.sampling.generate", "Trace", "depthlens.sampling.backend"),
    ("depthlens.sampling.generate", "make_backend", "depthlens.sampling.choose"),
    ("depthlens.sampling.generate", "resolve_backend", "depthlens.sampling.choose"),
    ("depthlens.sampling.vllm_backend", "VLLMGenerator", "depthlens.sampling.vllm.backend"),
    ("depthlens.sampling.vllm_backend", "EngineError", "depthlens.sampling.vllm.backend"),
    ("depthlens.sampling.vllm_backend", "check_source", "depthlens.sampling.vllm.backend"),
    ("depthlens.studies.ray_score", "connect", "depthlens.scale.ray"),
    ("depthlens.studies.thinkn", "generate_store", "depthlens.studies.generate"),
    ("depthlens.studies.thinkn", "samples_path", "depthlens.stores.samples"),
    ("depthlens.studies.correlation", "load_store", "depthlens.studies.stored"),
    ("depthlens.viz.report", "find_stores", "depthlens.studies.report"),
    ("depthlens.viz.study", "draw_accuracy_cost", "depthlens.viz.cost"),
]


@pytest.mark.parametrize(("old", "name", "home"), MOVED, ids=[f"{o}.{n}" for o, n, _ in MOVED])
def test_old_import_paths_resolve_to_the_new_home_with_a_warning(old, name, home):
    with pytest.warns(DeprecationWarning, match=rf"{old}\.{name} moved to {home}"):
        found = getattr(importlib.import_module(old), name)
    assert found is getattr(importlib.import_module(home), name)
    with warnings.catch_warnings(), pytest.raises(AttributeError):
        warnings.simplefilter("ignore")
        _ = importlib.import_module(old).no_such_name


def test_variants_are_registry_rows():
    assert set(SIGNALS) == set(get_args(Signal))
    assert set(FORMATS) == set(REGISTRY) == set(get_args(StoreFormat))
    assert FORMATS[0] == "parquet"  # the default for a new store


def test_the_one_reader_names_the_shard_and_row_of_a_damaged_record(tiny_chat, tmp_path):
    """Voting, the studies and the online replay read a store through one reader; a Parquet store's damaged
    record is named by its shard and row, not as a samples.jsonl line."""
    questions = [Question("q", "1 + 1 =", "2", answer_type="number")]
    sampling = SamplingConfig(temperature=1.0, top_p=1.0, max_new_tokens=4, readout_tokens=None)
    generate_store(tiny_chat, tmp_path / "s", questions, pool=2, sampling=sampling)
    shards = samples_path(tmp_path / "s", "parquet")
    assert shards == tmp_path / "s" / SHARDS
    rewrite_store(shards, store_manifest(shards), lambda r: {k: v for k, v in r.items() if k != "vote_key"})
    for read in (
        lambda p: load_pools(p, tiny_chat_dtr()),
        load_store,
        lambda p: ordered_pools(p, tiny_chat_dtr()),
    ):
        with pytest.raises(
            StoreError, match=r"samples/part-000001\.parquet row 1: missing field\(s\) \['vote_key'\]"
        ):
            read(tmp_path / "s")


def tiny_chat_dtr():
    from depthlens.config import DTRConfig

    return DTRConfig()

"""The one-room-per-concern layout: the sample store has one reader whose errors name the real file, and variants
are registry rows."""

from __future__ import annotations

from typing import get_args

import pytest

from depthlens.config import GenerateRun, SamplingConfig, Signal, StoreFormat, StoreSpec
from depthlens.errors import StoreError
from depthlens.evals.tasks import Question
from depthlens.stores.formats import FORMATS, REGISTRY
from depthlens.stores.parquet import store_manifest
from depthlens.stores.samples import SHARDS, samples_path
from depthlens.stores.shard_writer import rewrite_store
from depthlens.studies.generate import generate
from depthlens.studies.online import ordered_pools
from depthlens.studies.stored import load_store
from depthlens.studies.thinkn import load_pools
from depthlens.voting.online import SIGNALS


def test_variants_are_registry_rows():
    assert set(SIGNALS) == set(get_args(Signal))
    assert set(FORMATS) == set(REGISTRY) == set(get_args(StoreFormat))
    assert FORMATS[0] == "parquet"  # the default for a new store


def test_the_one_reader_names_the_shard_and_row_of_a_damaged_record(tiny_chat, tmp_path):
    """Voting, the studies and the online replay read a store through one reader; a Parquet store's damaged
    record is named by its shard and row, not as a samples.jsonl line."""
    questions = [Question("q", "1 + 1 =", "2", answer_type="number")]
    sampling = SamplingConfig(temperature=1.0, top_p=1.0, max_new_tokens=4, readout_tokens=None)
    generate(tiny_chat, GenerateRun(StoreSpec(tmp_path / "s"), pool=2, sampling=sampling), questions)
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

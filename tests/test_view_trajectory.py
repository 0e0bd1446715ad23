"""The explorer with the target trajectory (issue 58 item 4): a response of a store written with ``layer_target``
sends the read-out token's log-probability and rank at every layer as stored (``layer_target``: [T × L] float32
and int32), beside its top-k; a store without them sends none. The page's cell list (tests/test_view_browser.py)
shows them."""

from __future__ import annotations

import base64
from pathlib import Path

import numpy as np
import pytest

from depthlens.config import GenerateRun, ReadoutConfig, SamplingConfig, StoreSpec
from depthlens.evals.tasks import Question
from depthlens.stores.samples import iter_samples
from tests.conftest import save_chat_model

pytest.importorskip("starlette.testclient", reason="the view extra is not installed")


def trajectory_store(root: Path, top_k: int = 3, target: bool = True) -> Path:
    """A Parquet sample store of the tiny chat model (saved where the explorer loads its tokenizer) with the target
    trajectory (``target``) and, given ``top_k``, each layer's top-k: 2 questions × 2 responses, every token read
    out."""
    from depthlens.models.load import load
    from depthlens.studies.generate import generate

    out = root / f"trajectory-k{top_k}-{'target' if target else 'plain'}"
    if out.exists():
        return out
    model = root / "tiny-chat"
    if not model.exists():
        save_chat_model(model)
    lm = load(str(model), device="cpu", dtype="float32")
    sampling = SamplingConfig(max_new_tokens=12, readout_tokens=None, temperature=1.0)
    readout = ReadoutConfig(layer_top_k=top_k, layer_target=target)
    questions = [Question(f"q{i}", f"{i} + {i}", str(2 * i)) for i in range(2)]
    generate(lm, GenerateRun(StoreSpec(out), pool=2, sampling=sampling, readout=readout), questions)
    return out


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    root = tmp_path_factory.mktemp("view-trajectory")
    return trajectory_store(root), trajectory_store(root, top_k=0), trajectory_store(root, target=False)


def test_a_response_sends_the_target_trajectory_as_stored(stores):
    from tests.test_view import client

    with_top, alone, without = stores
    for store in (with_top, alone):
        explorer, api = client(store)
        assert not explorer.store.notices
        record = max(iter_samples(store), key=lambda r: r["token_count"])
        shown = api.get("/api/response", params={"id": record["id"]}).json()
        target = shown["layer_target"]
        logprobs = np.frombuffer(base64.b64decode(target["logprobs"]), dtype="<f4")
        ranks = np.frombuffer(base64.b64decode(target["ranks"]), dtype="<i4")
        stored = np.asarray(record["layer_target_logprobs"], dtype=np.float32)
        assert stored.shape == (record["token_count"], shown["n_layers"])
        assert logprobs.tolist() == stored.ravel().tolist()
        assert ranks.tolist() == np.ravel(record["layer_target_ranks"]).tolist()
        assert (shown["layer_top"] is None) == (store == alone)
    _, api = client(without)
    shown = api.get("/api/response", params={"id": next(iter_samples(without))["id"]}).json()
    assert shown["layer_target"] is None and shown["layer_top"] is not None

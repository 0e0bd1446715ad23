"""Each layer's top-k (``--layer-top-k``, issue 52 item 1) on a tiny random-init model: the score path and the
sampler agree, both store formats keep it as [T][L][K], manifests stamp K, a resume refuses another K, and the
readers refuse a damaged top-k."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch

from depthlens.config import GenerateRun, ReadoutConfig, SamplingConfig, ScoreRun, StoreSpec
from depthlens.errors import InputError, StoreError
from depthlens.evals.tasks import Question
from depthlens.metrics.layer_top import layer_top_k
from depthlens.metrics.token_table import reduce_readout
from depthlens.readout.stream import TokenSequence, iter_readout
from depthlens.sampling.hf import HFGenerator
from depthlens.sampling.step_layout import StepLayout
from depthlens.stores.parquet import iter_store, store_manifest
from depthlens.stores.records import layer_top_problem
from depthlens.stores.samples import iter_samples, read_manifest, read_responses
from depthlens.studies.generate import generate
from depthlens.studies.regrade import regrade_store
from depthlens.studies.score import run_score

K = 3
PROMPT = [1, 5, 9, 14, 20, 7]
ROWS = [
    {"id": f"r{i}", "prompt_ids": [4, 5 + i, 6], "completion_ids": [7, 8, 9 + i, 11, 12]} for i in range(3)
]
QUESTIONS = [Question(f"q{i}", f"{i} + {i}", str(2 * i)) for i in range(2)]


def _direct(lm, seq: TokenSequence) -> tuple[np.ndarray, np.ndarray]:
    """Each layer's top-k of every completion token from one plain forward: hidden states through the final norm
    and the unembedding (the model's own logits at layer L). [T, L, K] each."""
    ids = torch.tensor([list(seq.prompt_ids) + list(seq.completion_ids)])
    with torch.no_grad():  # the caller's own model keeps its grad flags (wrap): the reference too
        out = lm.model(input_ids=ids, output_hidden_states=True)
        at = slice(len(seq.prompt_ids) - 1, ids.shape[1] - 1)  # position i predicts token i + 1
        layers = [lm.parts.unembed(lm.parts.final_norm(h[0, at])) for h in out.hidden_states[1:-1]]
    logits = torch.stack([*layers, out.logits[0, at]], dim=1)  # [T, L, V]
    top_ids, top_probs = layer_top_k(logits, K)
    return top_ids.numpy(), top_probs.numpy()


@pytest.mark.parametrize("name", ["scores.jsonl", "scores"])
def test_score_stores_each_layers_top_k_and_resume_refuses_another_k(tiny_llama, tmp_path, name):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    out = tmp_path / name
    run_score(tiny_llama, ScoreRun(src, StoreSpec(out), ReadoutConfig(layer_top_k=K), tokens=True))
    records = list(iter_store(out))
    assert store_manifest(out)["readout"]["layer_top_k"] == K
    for row, record in zip(ROWS, records, strict=True):
        ids, probs = np.asarray(record["layer_top_ids"]), np.asarray(record["layer_top_probs"])
        assert ids.shape == probs.shape == (5, tiny_llama.n_layers, K)
        want_ids, want_probs = _direct(tiny_llama, TokenSequence(row["prompt_ids"], row["completion_ids"]))
        np.testing.assert_array_equal(ids, want_ids)
        np.testing.assert_allclose(probs, want_probs, atol=1e-5)
        assert not np.array_equal(ids[:, 0], ids[:, -1])  # layer 1 predicts other tokens than layer L here
    with pytest.raises(StoreError, match=r"readout.layer_top_k: stored 3, this run 2"):
        run_score(
            tiny_llama,
            ScoreRun(src, StoreSpec(out, resume=True), ReadoutConfig(layer_top_k=2), tokens=True),
        )
    plain = tmp_path / ("plain.jsonl" if name.endswith(".jsonl") else "plain")
    run_score(tiny_llama, ScoreRun(src, StoreSpec(plain), tokens=True))
    assert all("layer_top_ids" not in r for r in iter_store(plain))  # none unless asked
    assert [r["divergence"] for r in iter_store(plain)] == [r["divergence"] for r in records]


def test_score_refuses_layer_top_k_without_per_token_rows(tmp_path):
    with pytest.raises(InputError, match=r"layer_top_k.*add tokens"):
        ScoreRun(tmp_path / "in.jsonl", StoreSpec(tmp_path / "o"), ReadoutConfig(layer_top_k=2))


def test_the_sampler_reads_the_same_top_k_in_the_pass_that_samples(tiny_chat):
    sampling = SamplingConfig(max_new_tokens=8, readout_tokens=6)
    generator = HFGenerator(tiny_chat, sampling, ReadoutConfig(layer_top_k=K, also=("kl",)))
    traces = generator.sample(PROMPT, [3, 4])
    plain = HFGenerator(tiny_chat, sampling, ReadoutConfig(also=("kl",))).sample(PROMPT, [3, 4])
    for trace, other in zip(traces, plain, strict=True):
        # the top-k changes nothing else the step row carries
        assert (trace.token_ids, trace.divergence, trace.also) == (
            other.token_ids,
            other.divergence,
            other.also,
        )
        assert trace.log_prob == other.log_prob and other.layer_top_ids == []
        seq = TokenSequence(PROMPT, trace.token_ids[:6])
        table = reduce_readout(
            iter_readout(tiny_chat, [seq], ReadoutConfig()), 1, tiny_chat.n_layers, "jsd", layer_top=K
        )[0]
        assert np.asarray(trace.layer_top_ids).shape == (6, tiny_chat.n_layers, K)
        np.testing.assert_array_equal(trace.layer_top_ids, table.layer_top_ids.numpy())
        np.testing.assert_allclose(trace.layer_top_probs, table.layer_top_probs.numpy(), atol=1e-5)


def test_the_step_layout_decodes_what_it_packs():
    """The sampler's one packed row per response (``sampling.step_layout.StepLayout``): every part comes back
    from the offsets that packed it, on a read-out step and on one past the window."""
    layout = StepLayout(n_scores=4, kinds=("jsd", "kl"), n_layers=3, top_k=2)
    tokens = torch.tensor([7, 40_000])
    scores = [torch.tensor([-0.5, -1.5]) * (i + 1) for i in range(4)]
    layers = [torch.rand(2, 3), torch.rand(2, 3) + 1]
    top = (torch.randint(0, 50_000, (2, 3, 2)), torch.rand(2, 3, 2))
    nonfinite = torch.tensor([0, 2])
    row = layout.pack(tokens, scores, layers, top, nonfinite).numpy()
    assert row.shape == (2, layout.width(read=True)) == (2, 1 + 4 + 2 * 3 + 2 * 3 * 2 + 1)
    np.testing.assert_array_equal(layout.token_ids(row), tokens.numpy())
    np.testing.assert_array_equal(layout.scores(row), torch.stack(scores, dim=1).numpy())
    np.testing.assert_array_equal(layout.layers(row), torch.stack(layers, dim=1).numpy())
    ids, probs = layout.top(row)
    np.testing.assert_array_equal(ids, top[0].numpy())
    np.testing.assert_array_equal(probs, top[1].double().numpy())
    np.testing.assert_array_equal(layout.nonfinite(row), [0, 2])
    past = layout.pack(tokens, scores).numpy()  # a step past the read-out window: token and scores only
    assert past.shape == (2, layout.width(read=False)) and (layout.token_ids(past) == [7, 40_000]).all()
    with pytest.raises(ValueError, match="no top-k was given"):
        layout.pack(tokens, scores, layers, None, nonfinite)


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_generate_stores_the_top_k_of_the_read_out_tokens(tiny_chat, tmp_path, fmt):
    sampling = SamplingConfig(max_new_tokens=6, readout_tokens=4)
    store = tmp_path / fmt

    def run(k: int, resume: bool = False):
        spec = StoreSpec(store, resume=resume, format=fmt)
        readout = ReadoutConfig(layer_top_k=k)
        return generate(tiny_chat, GenerateRun(spec, pool=2, sampling=sampling, readout=readout), QUESTIONS)

    run(K)
    assert read_manifest(store)["readout"]["layer_top_k"] == K
    records = [r for _, r in read_responses(store)]  # every record checked, its top-k included
    assert len(records) == 4
    for record in records:
        ids = np.asarray(record["layer_top_ids"])
        assert ids.shape == (min(4, record["token_count"]), tiny_chat.n_layers, K)
        probs = np.asarray(record["layer_top_probs"])
        assert (np.diff(probs, axis=-1) <= 0).all() and ((probs >= 0) & (probs <= 1)).all()
    with pytest.raises(StoreError, match=r"readout.layer_top_k: stored 3, this run 1"):
        run(1, resume=True)
    assert run(K, resume=True).skipped == 4
    assert [r["layer_top_ids"] for r in iter_samples(store)] == [r["layer_top_ids"] for r in records]
    regrade_store(store)  # a store rewritten whole keeps them, as every reader checks them
    regraded = [r for _, r in read_responses(store)]
    assert [r["layer_top_ids"] for r in regraded] == [r["layer_top_ids"] for r in records]
    for after, before in zip(regraded, records, strict=True):
        np.testing.assert_allclose(after["layer_top_probs"], before["layer_top_probs"], atol=1e-6)


def test_a_damaged_top_k_is_refused_by_name():
    """Its presence is the sample store's check (``records.layer_top_problem``); its shape and values are every
    store's (``stores.meaning``)."""
    from depthlens.stores.meaning import Facts
    from depthlens.stores.meaning import record_problem as meaning_problem

    manifest = {"n_layers": 2, "readout": {"layer_top_k": 2}, "vocab_rows": 50}
    good = {
        "token_count": 1,
        "divergence": [[0.1, 0.0]],
        "layer_top_ids": [[[4, 9], [9, 4]]],
        "layer_top_probs": [[[0.5, 0.2], [0.6, 0.1]]],
    }
    assert layer_top_problem(good, manifest) is None and meaning_problem(good, Facts.of(manifest)) is None
    cases = {
        "token 0, layer 1: layer_top_probs are not in descending order": {
            "layer_top_probs": [[[0.2, 0.5], [0.6, 0.1]]]
        },
        "token 0, layer 1: layer_top_ids holds token id 50, past the model's vocabulary of 50": {
            "layer_top_ids": [[[4, 50], [9, 4]]]
        },
        r"shape \[1, 2, 1\], not \[T, L, K\] = \[1, 2, 2\]": {"layer_top_ids": [[[4], [9]]]},
        "token 0, layer 2: layer_top_ids holds token id 9 twice": {"layer_top_ids": [[[4, 9], [9, 9]]]},
        r"token 0, layer 2: layer_top_probs sum to 1.1, more than 1 \(K = 2": {
            "layer_top_probs": [[[0.5, 0.2], [0.6, 0.5]]]
        },
    }
    for said, change in cases.items():
        record = {**good, **change}
        assert re.search(said, meaning_problem(record, Facts.of(manifest)) or ""), said
    missing = {k: v for k, v in good.items() if not k.startswith("layer_top")}
    assert layer_top_problem(missing, manifest) == "no layer_top_ids for layer_top_k 2"


def test_an_on_demand_read_gives_the_top_k_as_one_array():
    """The explorer's reader (``stores.access.arrow_row``) returns a Parquet ``[T][L][K]`` cell as a (T, L, K) array,
    as it returns ``[T × L]`` as (T, L) — not an object array of arrays."""
    import pyarrow as pa

    from depthlens.stores.access import arrow_row

    ids = np.arange(2 * 3 * K, dtype=np.int32).reshape(2, 3, K)
    column = pa.array([ids.tolist()], type=pa.list_(pa.list_(pa.list_(pa.int32(), K), 3)))
    divergence = pa.array([[[0.5, 0.25, 0.0]] * 2], type=pa.list_(pa.list_(pa.float32(), 3)))
    row = arrow_row(pa.table({"layer_top_ids": column, "divergence": divergence}))
    assert row["layer_top_ids"].shape == (2, 3, K) and row["layer_top_ids"].dtype == np.int32
    np.testing.assert_array_equal(row["layer_top_ids"], ids)
    assert row["divergence"].shape == (2, 3)


def test_a_pool_sampled_under_the_top_k_rule_settles_as_score_does(tiny_chat, tmp_path):
    """``settle='topk:2'`` on a generation keeps each layer's top-2 ids (its readout's ``layer_top_k`` raised to 2)
    and stores the top-K settling depth derived from them; ``score --settle topk:2 --tokens`` of the same tokens,
    which settles from the logits themselves, gives the same depths wherever no layer's 2nd and 3rd tokens are
    within float32 rounding of each other (a near-tie may swap them between an incremental decode and a full
    forward); voting reads the same flags; and a pool that holds no ids is refused the rule by name."""
    from depthlens.api.votes import think_at_n
    from depthlens.config import DTRConfig
    from depthlens.metrics.dtr import deep_from_divergence
    from depthlens.studies.resolve import check_stored_settle
    from tests.test_cli_ux import cli
    from tests.tolerance import separated

    store = tmp_path / "pool"
    sampling = SamplingConfig(max_new_tokens=8, readout_tokens=None)
    run = GenerateRun(StoreSpec(store), pool=3, sampling=sampling, dtr=DTRConfig(settle="topk:2"))
    assert run.readout.layer_top_k == 2
    generate(tiny_chat, run, QUESTIONS)
    manifest = read_manifest(store)
    assert manifest["readout"]["layer_top_k"] == 2 and manifest["dtr"]["settle"] == "topk:2"
    records = [r for _, r in read_responses(store)]
    src = tmp_path / "in.jsonl"
    lines = [
        {"id": r["id"], "prompt_ids": r["prompt_ids"], "completion_ids": r["token_ids"]} for r in records
    ]
    src.write_text("".join(json.dumps(line) + "\n" for line in lines))
    scored = tmp_path / "scores.jsonl"
    rule = DTRConfig(settle="topk:2")
    run_score(
        tiny_chat, ScoreRun(src, StoreSpec(scored), ReadoutConfig(layer_top_k=3), rule, None, tokens=True)
    )
    compared = 0
    for record, score in zip(records, iter_store(scored), strict=True):
        # tokens whose 2nd and 3rd probabilities stand apart at every layer: their top-2 sets cannot swap
        stable = separated(np.asarray(score["layer_top_probs"]))[..., 1:3].all(axis=(1, 2))
        stored, expected = np.asarray(record["settling_depth"]), np.asarray(score["settling_depth"])
        np.testing.assert_array_equal(stored[stable], expected[stable])
        compared += int(stable.sum())
        deep = deep_from_divergence(record["divergence"], tiny_chat.n_layers, rule, record["layer_top_ids"])
        assert deep.tolist() == record["deep"]  # voting's flags are the stored ones
    assert compared >= sum(len(r["token_ids"]) for r in records) // 2  # most tokens are compared
    assert not all((np.asarray(r["settling_depth"]) == 1).all() for r in records)  # not trivially settled
    with pytest.raises(
        InputError, match=r"settle='topk:4'\): the top-4 rule settles from each layer's top 4"
    ):
        think_at_n(store, settle="topk:4", progress=False)  # the pool holds 2 per layer
    with pytest.raises(InputError, match=r"holds none; leave out settle"):
        check_stored_settle({"readout": {"layer_top_k": 0}}, rule, "the pool")  # a jsd pool
    voted = think_at_n(store, n=2, trials=2, progress=False)  # the store's own rule, from its ids
    assert voted.num_rows > 0
    from depthlens.studies.thinkn import load_pools
    from tests.test_view import client

    explorer, _ = client(store)  # the explorer's voting index settles from the same ids (a shard pass)
    mine, _ = explorer.index.pools(1)
    theirs, _ = load_pools(store, rule, n=1)
    assert sorted(mine) == sorted(theirs)
    for question, pool in mine.items():
        assert [r.deep.tolist() for r in pool] == [r.deep.tolist() for r in theirs[question]]
    code, _, err = cli("thinkn", "--from", store, "--n", "2", "--settle", "topk:4")
    assert code == 2, err  # the command line's spelling of the same refusal
    assert "--settle topk:4: the top-4 rule settles from each layer's top 4 token ids" in err, err

"""docs/logit-lens.md's TransformerLens and nnsight lines, run as the doc writes them (issue 57, item 10), each
where its package is installed: every layer's top-5 equals depthlens's ``layer_top_ids`` / ``layer_top_probs`` on
the catalogue's SmolLM2 — ids equal up to ties, probabilities within ``PROB_RTOL`` of their value.

The tolerance, derived: a softmax's p_i moves by p_i·(Δz_i − Σ_j p_j Δz_j), at most 2·p_i·max|Δz| for logits that
drift by Δz. Two float32 implementations of one model drift by ≤ 5e-5 in the logits on SmolLM2 (measured here at
the final layer: TransformerLens 4.3's bridge, which runs attention eagerly, 4.9e-5 from transformers' default
attention; nnsight, which runs the model itself, 0); ``LOGIT_DRIFT`` allows 20× that. A lens read one position
off or one layer off moves the probabilities by far more (the mutants below must fail).
"""

from __future__ import annotations

import importlib.util
import linecache
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from depthlens.models import catalogue

DOC = Path(__file__).resolve().parents[1] / "docs" / "logit-lens.md"
SECTION = "## Beside TransformerLens and nnsight"
LOGIT_DRIFT = 1e-3
PROB_RTOL = 2 * LOGIT_DRIFT
# Near 0, absolutely: depthlens keeps exp(log_softmax(z)) and a peer softmax(z), rounded apart in float32 (measured
# 5.4e-7 against nnsight, which runs the very same model; 4.4e-6 against TransformerLens, inside PROB_RTOL · p).
PROB_ATOL = 1e-6


def doc_blocks() -> list[str]:
    """The section's python blocks, in order: depthlens's setup, TransformerLens, nnsight."""
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index(SECTION) : text.index("\n## ", text.index(SECTION) + 1)]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def run_block(index: int, name: str, namespace: dict) -> None:
    """Run the doc's block ``index`` in ``namespace``, its source registered as a file's (nnsight reads a trace's
    ``with`` body back from the source it was compiled from)."""
    source = doc_blocks()[index]
    filename = f"<{DOC.name}: {name}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    exec(compile(source, filename, "exec"), namespace)  # the doc's own lines, as written


@pytest.fixture(scope="module")
def setup() -> dict:
    """The doc's first block run once: depthlens's top-5 of the text, the token ids, the weights' folder."""
    if not catalogue.is_installed(catalogue.DEFAULT_MODEL):
        pytest.skip(f"{catalogue.DEFAULT_MODEL} not installed; run `make model`")
    namespace: dict = {}
    run_block(0, "depthlens", namespace)
    return namespace


def _agree(setup: dict, probs: torch.Tensor) -> tuple[int, float]:
    """Compare a peer's [L, positions, V] probabilities with depthlens's rows; (cells whose ids differ where the
    peer does not tie them, the largest |Δp| relative to the tolerance)."""
    ids, mine = setup["top_ids"].astype(np.int64), setup["top_probs"].astype(np.float64)
    at = len(setup["prompt"]) - 1  # completion token t is read from position at + t
    theirs = probs[:, at : at + ids.shape[0]].permute(1, 0, 2).double()  # [T, L, V]
    peer_p, peer_ids = theirs.topk(ids.shape[-1], dim=-1)
    tol = PROB_ATOL + PROB_RTOL * peer_p.numpy()
    worst = float((np.abs(mine - peer_p.numpy()) / tol).max())
    mine_in_peer = theirs.gather(-1, torch.from_numpy(ids)).numpy()  # the peer's p of depthlens's ids
    differ = ids != peer_ids.numpy()
    tied = np.abs(mine_in_peer - peer_p.numpy()) <= tol
    return int((differ & ~tied).sum()), worst


def _check(setup: dict, probs: torch.Tensor) -> None:
    ids = setup["top_ids"]
    assert probs.shape[:2] == (ids.shape[1], len(setup["prompt"]) + ids.shape[0])  # L layers, every position
    other, worst = _agree(setup, probs)
    assert other == 0 and worst <= 1.0, (other, worst)
    one_off = torch.roll(probs, 1, dims=1)  # read one position off
    layer_off = torch.cat([probs[1:], probs[-1:]])  # read one layer up
    for wrong in (one_off, layer_off):
        other, worst = _agree(setup, wrong)
        assert other > 0 and worst > 100.0


@pytest.mark.skipif(
    importlib.util.find_spec("transformer_lens") is None, reason="transformer-lens not installed"
)
def test_the_docs_transformerlens_lines_equal_depthlens(setup):
    namespace = dict(setup)
    run_block(1, "TransformerLens", namespace)
    _check(setup, namespace["tl_probs"])
    assert namespace["tl_top"].indices.shape == (setup["top_ids"].shape[1], namespace["ids"].shape[1], 5)


@pytest.mark.skipif(importlib.util.find_spec("nnsight") is None, reason="nnsight not installed")
def test_the_docs_nnsight_lines_equal_depthlens(setup):
    namespace = dict(setup)
    run_block(2, "nnsight", namespace)
    _check(setup, namespace["nn_probs"])
    assert namespace["nn_top"].indices.shape == (setup["top_ids"].shape[1], namespace["ids"].shape[1], 5)

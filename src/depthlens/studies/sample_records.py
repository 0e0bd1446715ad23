"""One sampled response as a sample store keeps it (``stores.samples``'s schema): its tokens, text, graded answer
and the per-token values voting and the studies read, its depth from the divergences before rounding; or, where
its generation failed, a record saying so (kept, never dropped)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from depthlens.config import AnswerConfig, DTRConfig, depth_prefix
from depthlens.evals.grading import answer_fields
from depthlens.evals.tasks import Question
from depthlens.metrics.dtr import response_depth
from depthlens.models.load import LoadedModel
from depthlens.sampling.backend import PER_TOKEN, Trace
from depthlens.stores.names import divergence_field
from depthlens.stores.samples import STORED_DIGITS, stored, stored_rows
from depthlens.studies.layer_settings import stored_layer_values


def sample_record(
    lm: LoadedModel,
    question: Question,
    index: int,
    trace: Trace,
    dtr: DTRConfig,
    rules: AnswerConfig = AnswerConfig(),
    timeout_s: int = 5,
    prompt: Sequence[int] = (),
) -> dict[str, Any]:
    """One stored response: tokens, text, graded answer, and the per-token values voting and studies need.

    ``prompt_ids`` (the prompt as fed) and ``token_ids`` make the line a ``depthlens score`` input by itself.
    Per-token floats are kept as ``stores.samples.stored`` rounds them; the depth fields
    (``stores.samples.DEPTH_FIELDS``) come from the divergences before rounding, as ``score`` and the server
    compute them.
    """
    text = lm.tokenizer.decode(trace.token_ids, skip_special_tokens=True) if lm.tokenizer else ""
    depth = response_depth(trace.divergence, lm.n_layers, dtr, depth_prefix(dtr), trace.layer_top_ids)
    return {
        "id": f"{question.id}#{index}",
        "question_id": question.id,
        "sample": index,
        "seed": trace.seed,
        "status": "ok",
        "finish": trace.finish,
        "token_count": len(trace),
        "text": text,
        "prompt_ids": list(prompt),
        "token_ids": trace.token_ids,
        **answer_fields(question, text, trace.finish, rules, timeout_s),
        **{key: depth.pop(key) for key in ("dtr", "dtr_prefix", "mean_settling_depth")},
        **{key: stored(getattr(trace, key)) for key in PER_TOKEN},
        "divergence": stored_rows(trace.divergence),
        **depth,  # settling_depth, deep: per read-out token
        **{divergence_field(kind): stored_rows(rows) for kind, rows in trace.also.items()},
        **layer_top_fields(trace),
        **stored_layer_values(trace.layer_values, STORED_DIGITS),
    }


def layer_top_fields(trace: Trace) -> dict[str, Any]:
    """Each read-out token's top-k per layer as a store keeps it (ids, probabilities rounded as every stored
    float); none when the run asked for none (``ReadoutConfig.layer_top_k`` 0)."""
    if not trace.layer_top_ids:
        return {}
    probs = [stored_rows(layers) for layers in trace.layer_top_probs]
    return {"layer_top_ids": trace.layer_top_ids, "layer_top_probs": probs}


def failed_record(question: Question, index: int, seed: int, error: str) -> dict[str, Any]:
    """A response whose generation failed: kept in the store (and reported), never silently dropped."""
    return {
        "id": f"{question.id}#{index}",
        "question_id": question.id,
        "sample": index,
        "seed": seed,
        "status": "failed",
        "error": error,
    }

"""The slow, obvious readout every fast path is tested against (and the benchmarks' naive baseline).

One full forward with ``output_hidden_states``, then every layer's full distribution for every completion token
materialised at once: a [L, T, V] float32 tensor. Correct by inspection; unusable at scale (docs/definitions.md §7).
"""

from __future__ import annotations

import torch

from depthlens.config import Divergence
from depthlens.metrics.divergence import layer_divergence
from depthlens.models.load import LoadedModel
from depthlens.readout.stream import TokenSequence


@torch.inference_mode()
def reference_divergences(
    lm: LoadedModel, seq: TokenSequence, kind: Divergence = "jsd", final_norm: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """(D [T, L], final log-probs [T, V]) for one sequence, the naive way."""
    ids = torch.tensor([list(seq.prompt_ids) + list(seq.completion_ids)], device=lm.device)
    out = lm.model(input_ids=ids, output_hidden_states=True)
    p = len(seq.prompt_ids)
    rows = slice(p - 1, p - 1 + len(seq.completion_ids))
    parts = lm.parts
    vocab = len(lm.tokenizer) if lm.tokenizer is not None else out.logits.shape[-1]
    final = torch.log_softmax(out.logits[0, rows, :vocab].float(), -1)  # [T, V]
    normed = torch.stack(
        [parts.final_norm(h[0, rows]) if final_norm else h[0, rows] for h in out.hidden_states[1:-1]]
    )  # [L-1, T, d]
    logits = parts.unembed(normed)[..., :vocab].float()  # [L-1, T, V]: the tensor the streaming path avoids
    if parts.logit_post is not None:
        logits = parts.logit_post(logits)
    logprobs = torch.log_softmax(logits, -1)
    last = out.hidden_states[-1][0, rows]
    columns = [
        layer_divergence(kind, final, logprobs[i], last.float(), normed[i].float())
        for i in range(len(normed))
    ]
    columns.append(torch.zeros(len(final)))
    return torch.stack(columns, dim=1), final

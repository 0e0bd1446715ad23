"""The deep-thinking paper's baselines (definitions.md §3), from the final layer's distribution only. Pure functions.

Per-token quantities are computed chunk by chunk (``token_baselines``); sequence scores from them
(``sequence_baselines``). Self-certainty is KL(U ‖ p) with U uniform over the V tokens (Kang et al. 2025).
"""

from __future__ import annotations

import math

import torch

from depthlens.metrics.divergence import zero_nan


def token_entropy(final_logprobs: torch.Tensor) -> torch.Tensor:
    """Entropy H(p_t) of each row's distribution; [c, V] → [c] (nats)."""
    return -zero_nan(final_logprobs.exp() * final_logprobs).sum(-1)  # runs inside the sampler at every step


def token_self_certainty(final_logprobs: torch.Tensor) -> torch.Tensor:
    """Self-certainty KL(U ‖ p_t) of each row's distribution; [c, V] → [c] (nats)."""
    # KL(U ‖ p) = Σ_v (1/V)(log(1/V) − log p_v) = −log V − mean_v log p_v
    return -math.log(final_logprobs.shape[-1]) - final_logprobs.mean(dim=-1)


def token_baselines(final_logprobs: torch.Tensor, target_ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-token log p(y_t), entropy H(p_t) and self-certainty for a chunk; [c, V], [c] → each [c] (nats)."""
    return {
        "log_prob": final_logprobs.gather(-1, target_ids[:, None].to(final_logprobs.device)).squeeze(-1),
        "entropy": token_entropy(final_logprobs),
        "self_certainty": token_self_certainty(final_logprobs),
    }


def distribution_scores(final_logprobs: torch.Tensor, confidence_top_k: int) -> dict[str, torch.Tensor]:
    """What a row's distribution says whatever token is drawn from it: entropy, self-certainty and DeepConf
    confidence; [c, V] → each [c] (nats). A sampler that sees the logits before it draws computes these."""
    return {
        "entropy": token_entropy(final_logprobs),
        "self_certainty": token_self_certainty(final_logprobs),
        "confidence": token_confidence(final_logprobs, confidence_top_k),
    }


def token_confidence(final_logprobs: torch.Tensor, k: int) -> torch.Tensor:
    """DeepConf's token confidence, −(1/k) Σ of the k largest log p_t(v) (Fu et al. 2025); [c, V] → [c], nats.

    High when the distribution is peaked (the top-k beyond the first carry tiny, very negative log-probs).
    """
    k = min(k, final_logprobs.shape[-1])
    return -final_logprobs.topk(k, dim=-1).values.mean(dim=-1)


def sequence_baselines(log_prob: torch.Tensor, entropy: torch.Tensor, self_certainty: torch.Tensor) -> dict:
    """The six baseline scores of one response from its per-token values (each [T]); None-valued when T = 0."""
    n = int(log_prob.numel())
    if n == 0:
        return {
            "token_count": 0,
            "reverse_token_count": 0,
            "log_prob": None,
            "log_prob_sum": None,
            "neg_perplexity": None,
            "neg_entropy": None,
            "self_certainty": None,
        }
    mean_log_prob = float(log_prob.double().mean())
    return {
        "token_count": n,
        "reverse_token_count": -n,
        "log_prob": mean_log_prob,
        "log_prob_sum": float(log_prob.double().sum()),
        "neg_perplexity": -math.exp(-mean_log_prob),
        "neg_entropy": -float(entropy.double().mean()),
        "self_certainty": float(self_certainty.double().mean()),
    }

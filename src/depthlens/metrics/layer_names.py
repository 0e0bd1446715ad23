"""The names of the per-layer quantities besides the divergence (``metrics.layer_quantities``), one per quantity
across the walk, the stores, the server and the Python API. No torch here: the stores read these names."""

from __future__ import annotations

TARGET_LOGPROBS = "layer_target_logprobs"
TARGET_RANKS = "layer_target_ranks"
TRACK_LOGPROBS = "layer_track_logprobs"
TRACK_RANKS = "layer_track_ranks"
ENTROPY = "layer_entropy"
STAT_PREFIX = "layer_stat_"
FIXED_FIELDS = (TARGET_LOGPROBS, TARGET_RANKS, TRACK_LOGPROBS, TRACK_RANKS, ENTROPY)
"""The built-in per-layer fields (a statistic's is ``STAT_PREFIX`` + its name)."""


def is_per_layer(field: str) -> bool:
    """Whether ``field`` (a record's field, a store's column) is one of ``metrics.layer_quantities``'s."""
    return field in FIXED_FIELDS or field.startswith(STAT_PREFIX)


def is_rank(field: str) -> bool:
    """Whether ``field`` holds ranks (whole numbers in [0, V)) rather than floats."""
    return field in (TARGET_RANKS, TRACK_RANKS)

"""How close two float32 results must be to count as one computation, whatever the CPU (docs/reliability.md).

The same readout run on another CPU (AVX2, AVX-512, AMX kernels), with another thread count or another batch shape
reduces its float32 sums in another order, so it differs in the last bits. Two results of one computation agree
to a relative ``FLOAT32_RTOL`` of their magnitude, never exactly: measured worst 6.9e-6 (a KL of 14.56 nats read
out alone vs with other responses on an Intel Xeon with AMX, issue 27), ≤ 3.4e-7 on an AMD EPYC under every
kernel and thread setting tried. Values a store keeps to 5 decimals differ by up to one unit of the 5th decimal
more (``ROUNDED_5``), however close the floats were before rounding.

A real error is far outside these bounds: a token read out at the wrong layer or one position off changes a
divergence by 1e-2 to tens of nats. ``assert_float32_equal`` checks that too, where it is given a way to make
that error (``mutants``): a tolerance that lets a wrong layer or a dropped token pass is a broken test.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

FLOAT32_RTOL = 5e-5  # 7× the worst relative difference measured across CPUs, thread counts and batch shapes
FLOAT32_ATOL = 1e-5  # for values near 0 (a divergence at the last layers): a few float32 ulps of their inputs
ROUNDED_5 = 1e-5  # two values rounded to 5 decimals each: up to one unit of the last kept digit apart


def float32_close(actual: object, expected: object, *, rounded: bool = False) -> bool:
    """Whether ``actual`` and ``expected`` agree as two float32 runs of one computation (``rounded``: both were
    stored to 5 decimals)."""
    a, b = np.asarray(actual, dtype=np.float64), np.asarray(expected, dtype=np.float64)
    if a.shape != b.shape:
        return False
    atol = FLOAT32_ATOL + (ROUNDED_5 if rounded else 0.0)
    return bool(np.all(np.abs(a - b) <= atol + FLOAT32_RTOL * np.abs(b)))


def assert_float32_equal(
    actual: object,
    expected: object,
    *,
    rounded: bool = False,
    what: str = "",
    mutants: Iterable[tuple[str, object]] = (),
) -> None:
    """Assert ``actual`` equals ``expected`` within float32 reordering (and 5-decimal rounding if ``rounded``),
    and that each of ``mutants`` — (name, a deliberately wrong version of ``actual``) — does not."""
    a, b = np.asarray(actual, dtype=np.float64), np.asarray(expected, dtype=np.float64)
    worst = float(np.max(np.abs(a - b), initial=0.0)) if a.shape == b.shape else float("inf")
    assert float32_close(a, b, rounded=rounded), (
        f"{what}: differ by up to {worst:.3g} (shapes {a.shape}, {b.shape})"
    )
    for name, wrong in mutants:
        assert not float32_close(wrong, b, rounded=rounded), f"{what}: the tolerance lets {name} pass"


def shifted(rows: object) -> np.ndarray:
    """Rows [T, L] as if one token had been dropped: each row replaced by the next (the last repeated)."""
    a = np.asarray(rows, dtype=np.float64)
    return np.concatenate([a[1:], a[-1:]]) if len(a) > 1 else a + 1.0


def wrong_layer(rows: object) -> np.ndarray:
    """Rows [T, L] as if read out one layer off: each layer's column replaced by the next layer's."""
    a = np.asarray(rows, dtype=np.float64)
    return np.concatenate([a[..., 1:], a[..., -1:]], axis=-1)

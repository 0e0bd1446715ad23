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

from collections.abc import Iterable, Sequence

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


def _floats(value: object) -> bool:
    """Whether ``value`` is a float or a (nested) list holding one: what a store rounds from float32 work."""
    if isinstance(value, float):
        return True
    return isinstance(value, list) and any(_floats(v) for v in value)


def assert_same_records(actual: Sequence[dict], expected: Sequence[dict], *, what: str = "records") -> None:
    """Two stores' records written by two runs of one computation (two engines, processes or batch shapes):
    every field equal exactly — ids, token ids, texts, statuses, answers — except the stored floats, which agree
    within float32 rounding plus one 5th-decimal unit (``rounded``). A record's divergence rows must still fail
    as a dropped token and as a wrong layer (``mutants``), so the tolerance cannot hide a misaligned readout."""
    assert [r.get("id") for r in actual] == [r.get("id") for r in expected], f"{what}: other records"
    for a, b in zip(actual, expected, strict=True):
        assert a.keys() == b.keys(), f"{what} {a.get('id')}: fields {sorted(a.keys() ^ b.keys())} differ"
        exact = {k: v for k, v in a.items() if not (_floats(v) or _floats(b[k]))}
        assert exact == {k: b[k] for k in exact}, f"{what} {a.get('id')}: " + ", ".join(
            k for k in exact if exact[k] != b[k]
        )
        for key in a.keys() - exact.keys():
            rows, wrong = a[key], []
            if key.startswith("divergence") and len(rows) > 1:
                wrong = [("a dropped token", shifted(rows)), ("a wrong layer", wrong_layer(rows))]
            assert_float32_equal(
                rows, b[key], rounded=True, what=f"{what} {a.get('id')} {key}", mutants=wrong
            )


def separated(probs: object) -> np.ndarray:
    """Which ranks of top-k probabilities [..., K] (each row descending) stand apart from both neighbours by more
    than two runs' float32 rounding: at those ranks two runs of one computation list the same token id; elsewhere
    a near-tie may list its tokens in either order."""
    p = np.asarray(probs, dtype=np.float64)
    apart = (p[..., :-1] - p[..., 1:]) > 2 * (FLOAT32_ATOL + FLOAT32_RTOL * p[..., :-1])
    edge = np.ones_like(apart[..., :1])
    return np.concatenate([edge, apart], axis=-1) & np.concatenate([apart, edge], axis=-1)

"""The token × layer drawers as a notebook uses them (issue 57, item 6): drawn into the caller's Axes with its
Figure returned, a chosen subset of layers and tokens, SVG on request, and a 64-token record that stays readable
(every token labelled, no two labels overlapping, each cell's token inside its cell)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from matplotlib.figure import Figure

import depthlens
from depthlens.errors import InputError
from depthlens.viz import grid

T, L, K = 64, 30, 3


def _record(tokens: int = T, layers: int = L) -> dict:
    """A scored record with each layer's top-k, shaped as ``score --tokens --layer-top-k 3`` writes it."""
    rng = np.random.default_rng(0)
    divergence = rng.random((tokens, layers))
    divergence[:, -1] = 0.0
    probs = -np.sort(-rng.random((tokens, layers, K)) / K, axis=-1)
    return {
        "id": "r",
        "tokens": [f"␣tok{t}" for t in range(tokens)],
        "divergence": divergence.tolist(),
        "settling_depth": rng.integers(1, layers + 1, tokens).tolist(),
        "deep": (rng.random(tokens) > 0.5).tolist(),
        "dtr": 0.5,
        "layer_top_probs": probs.tolist(),
        "layer_top_tokens": [
            [[f"w{t}.{la}", "x", "y"] for la in range(1, layers + 1)] for t in range(tokens)
        ],
    }


DRAWERS = {
    "heatmap": (depthlens.draw_divergence_heatmap, "divergence", lambda r: np.asarray(r["divergence"])),
    "lens": (
        depthlens.draw_logit_lens,
        "top-1 probability",
        lambda r: np.asarray(r["layer_top_probs"])[..., 0],
    ),
}


def _image(ax) -> np.ndarray:
    (image,) = ax.images
    return np.asarray(image.get_array())


def _labels(ticks) -> list[str]:
    return [t.get_text() for t in ticks]


@pytest.mark.parametrize("kind", sorted(DRAWERS))
def test_drawn_into_the_callers_axes_and_its_figure_returned(kind):
    draw, bar, values = DRAWERS[kind]
    record = _record(tokens=12)
    fig = Figure(figsize=(14, 5))
    left, right = fig.subplots(1, 2)
    right.plot([0, 1], [0, 1])  # the caller's own drawing beside it is left alone
    assert draw(record, ax=left) is fig
    np.testing.assert_array_equal(_image(left), values(record).T)  # layers up, tokens across
    assert not right.images and len(right.lines) == 1
    assert any(a.get_ylabel() == bar for a in fig.axes if a not in (left, right))  # its colour bar beside it


@pytest.mark.parametrize("kind", sorted(DRAWERS))
def test_a_chosen_subset_of_layers_and_tokens_is_drawn(kind):
    draw, _, values = DRAWERS[kind]
    record = _record(tokens=20)
    layers, tokens = [1, 5, 29, 30], [*range(3, 7), 15]
    fig = draw(record, layers=layers, tokens=tokens)
    (ax,) = [a for a in fig.axes if a.images]
    np.testing.assert_array_equal(_image(ax), values(record)[np.ix_(tokens, [la - 1 for la in layers])].T)
    assert _labels(ax.get_xticklabels()) == [record["tokens"][t] for t in tokens]
    assert _labels(ax.get_yticklabels()) == [str(la) for la in layers]
    assert [line.get_xdata()[0] for line in ax.lines] == [3.5]  # a white line where token 7..14 are left out
    if kind == "lens":  # each drawn cell's own token, and only those
        shown = {t.get_text() for t in ax.texts}
        assert shown == {f"w{t}.{la}" for t in tokens for la in layers}
    else:  # a settling depth is marked where its layer is drawn
        marks = sum(len(c.get_offsets()) for c in ax.collections)
        assert marks == sum(record["settling_depth"][t] in layers for t in tokens)
    ranged = draw(record, layers=range(25, 31), tokens=range(10))
    (ax,) = [a for a in ranged.axes if a.images]
    assert _image(ax).shape == (6, 10)


@pytest.mark.parametrize(
    ("setting", "value", "said"),
    [
        ("layers", 0, "layers=0: layer 0 is outside the record: the record's layers are 1..30"),
        ("layers", [3, 3], "layers=[3, 3]: names a layer twice"),
        ("tokens", range(60, 70), "tokens=range(60, 70): token 64 is outside the record"),
        ("tokens", [], "tokens=[]: names no token"),
        ("tokens", "0:5", "tokens='0:5': give a token index, a range or a list"),
        ("tokens", [1.5], "tokens=[1.5]: 1.5 is not a token index"),
    ],
)
def test_a_subset_outside_the_record_is_refused_by_its_name(setting, value, said):
    with pytest.raises(InputError) as caught:
        depthlens.draw_logit_lens(_record(), **{setting: value})
    assert str(caught.value).startswith(said)


def test_svg_by_suffix_or_format_with_its_text_as_text(tmp_path):
    record = _record(tokens=8)
    fig = depthlens.draw_logit_lens(record, tmp_path / "lens.svg")
    assert isinstance(fig, Figure)
    svg = (tmp_path / "lens.svg").read_text()
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg
    assert "w3.17" in svg and "␣tok5" in svg  # cells and labels searchable, not glyph outlines
    depthlens.draw_divergence_heatmap(record, tmp_path / "heatmap", format="svg")
    assert "<svg" in (tmp_path / "heatmap").read_text()
    depthlens.draw_divergence_heatmap(record, tmp_path / "heatmap.png")
    assert (tmp_path / "heatmap.png").read_bytes().startswith(b"\x89PNG")
    with pytest.raises(InputError, match=r"^format='svg': the path x.png says png"):
        depthlens.draw_logit_lens(record, tmp_path / "x.png", format="svg")
    with pytest.raises(InputError, match=r"^path='.*x.jpeg': end it in .png, .svg, .pdf"):
        depthlens.draw_logit_lens(record, tmp_path / "x.jpeg")
    assert not (tmp_path / "x.png").exists() and not (tmp_path / "x.jpeg").exists()


def test_nothing_is_left_in_pyplot_and_its_backend_is_the_callers():
    import matplotlib
    import matplotlib.pyplot as plt

    backend = matplotlib.get_backend()
    for draw, _, _ in DRAWERS.values():
        draw(_record(tokens=4))
    assert plt.get_fignums() == [] and matplotlib.get_backend() == backend


def _renderer(fig):
    """The figure laid out and drawn once (constrained layout places the panels at draw time), and its renderer."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return canvas.get_renderer()


def _overlap(boxes) -> bool:
    return any(a.overlaps(b) for a, b in itertools.combinations(boxes, 2))


@pytest.mark.parametrize("kind", sorted(DRAWERS))
def test_a_64_token_record_stays_readable(kind, tmp_path):
    """Two panels of 32 tokens (not one 60-inch strip): every token labelled at 8 pt, no two labels overlapping,
    the lens's cell texts at a legible size and each inside its own cell."""
    draw, _, _ = DRAWERS[kind]
    fig = draw(_record(), tmp_path / f"{kind}.png")
    panels = [a for a in fig.axes if a.images]
    assert len(panels) == 2 and max(fig.get_size_inches()) <= grid.MAX_WIDTH
    renderer = _renderer(fig)
    labelled = []
    for ax in panels:
        ticks = [t for t in ax.get_xticklabels() if t.get_text()]
        labelled += [t.get_text() for t in ticks]
        assert all(t.get_fontsize() >= grid.LABEL_PT for t in ticks)
        assert not _overlap([t.get_window_extent(renderer) for t in ticks])
        assert not _overlap([t.get_window_extent(renderer) for t in ax.get_yticklabels() if t.get_text()])
        if kind == "lens":
            assert len(ax.texts) == 32 * L
            width = ax.get_window_extent(renderer).width / 32
            assert all(t.get_fontsize() >= 6 for t in ax.texts)
            assert all(t.get_window_extent(renderer).width < width for t in ax.texts)
    assert labelled == [f"␣tok{t}" for t in range(T)]
    assert (tmp_path / f"{kind}.png").stat().st_size > 10_000


def test_a_long_record_keeps_to_a_page_and_thins_what_cannot_be_read():
    """600 tokens: at most four panels 40 inches wide; the lens's cells too small for legible text are left as
    colour only, and the token labels that would overlap are thinned out."""
    fig = depthlens.draw_logit_lens(_record(tokens=600, layers=8))
    panels = [a for a in fig.axes if a.images]
    assert len(panels) == grid.MAX_PANELS and fig.get_size_inches()[0] <= grid.MAX_WIDTH
    assert all(not ax.texts for ax in panels)
    renderer = _renderer(fig)
    for ax in panels:
        shown = [t for t in ax.get_xticklabels() if t.get_text()]
        assert 0 < len(shown) <= 150 and not _overlap([t.get_window_extent(renderer) for t in shown])

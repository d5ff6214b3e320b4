"""Attention distance against hand-computed values, the head table and the distance figure."""

import itertools
import math

import numpy as np
import pytest
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg

from attnconv import MultiHeadSelfAttention2d
from attnconv.viz.distance import (
    add_distances,
    attention_distance,
    distance_comparison_figure,
    distance_figure,
    distance_map,
    format_head_table,
    layer_distances,
    uniform_distance,
)
from attnconv.viz.maps import compute_attention


def hard_layer(centers):
    layer = MultiHeadSelfAttention2d(4, len(centers), hard=True)
    with torch.no_grad():
        layer.position.centers.copy_(torch.tensor(centers, dtype=torch.float32))
    return layer


def test_hard_head_at_offset_1_2_is_sqrt5_away_from_the_borders():
    h, w = 7, 8
    probs = compute_attention(hard_layer([[1.0, 2.0]]), (h, w)).probs[0]
    per_query = distance_map(probs, (h, w))[0].numpy()
    expected = np.empty((h, w))
    for r in range(h):
        for c in range(w):
            # the hard head attends to the pixel nearest q + Δ inside the image
            kr, kc = min(r + 1, h - 1), min(c + 2, w - 1)
            expected[r, c] = math.hypot(kr - r, kc - c)
    np.testing.assert_allclose(per_query, expected, atol=1e-12)
    np.testing.assert_allclose(per_query[: h - 1, : w - 2], math.sqrt(5), atol=1e-12)
    assert float(attention_distance(probs, (h, w))[0]) == pytest.approx(expected.mean(), abs=1e-12)


def test_uniform_attention_is_the_mean_pairwise_distance():
    h, w = 3, 4
    probs = torch.full((1, h * w, h * w), 1.0 / (h * w), dtype=torch.float64)
    pixels = [(r, c) for r in range(h) for c in range(w)]
    mean = np.mean([math.dist(p, q) for p in pixels for q in pixels])
    assert float(attention_distance(probs, (h, w))[0]) == pytest.approx(mean, abs=1e-9)


def test_layer_distances_and_head_table_rows():
    layers = [hard_layer([[0.0, 0.0], [0.0, 1.0]]), hard_layer([[3.0, 4.0]])]
    distances = layer_distances(compute_attention(layers, (20, 20)))
    assert [d.shape[0] for d in distances] == [2, 1]
    assert float(distances[0][0]) == 0.0
    assert float(distances[0][1]) == pytest.approx(19 / 20)  # the last column stays in place
    interior = 5.0 * (17 * 16) / 400  # Δ = (3, 4): 17 rows × 16 cols of queries see the full offset
    assert float(distances[1][0]) > interior
    rows = add_distances([{"layer": 1, "head": 0, "spread": 2.0}], distances)
    assert rows == [
        {
            "layer": 1,
            "head": 0,
            "spread": 2.0,
            "attention_distance": pytest.approx(float(distances[1][0])),
        }
    ]
    all_rows = add_distances([], distances)
    assert [(r["layer"], r["head"]) for r in all_rows] == [(0, 0), (0, 1), (1, 0)]
    text = format_head_table(all_rows).splitlines()
    assert text[0].split() == ["layer", "head", "distance"]
    assert [float(line.split()[2]) for line in text[1:]] == pytest.approx(
        [float(d) for layer in distances for d in layer], abs=5e-4
    )


def test_distance_figure_plots_every_head():
    distances = [torch.tensor([1.0, 2.0, 3.0]), torch.tensor([0.5, 4.0, 2.5])]
    fig = distance_figure(distances, stem=2)
    ax = fig.axes[0]
    points = sorted(float(c.get_offsets()[0][1]) for c in ax.collections)
    assert points == sorted([1.0, 2.0, 3.0, 0.5, 4.0, 2.5])
    (mean_line,) = ax.lines
    np.testing.assert_allclose(mean_line.get_ydata(), [2.0, 7.0 / 3.0])
    assert "input pixels" in [a.get_ylabel() for a in fig.axes[0].child_axes]


def test_uniform_distance_is_the_mean_distance_between_two_tokens():
    tokens = list(itertools.product(range(14), range(14)))
    brute = sum(math.dist(a, b) for a in tokens for b in tokens) / len(tokens) ** 2
    assert uniform_distance((14, 14)) == pytest.approx(brute, abs=1e-9)
    assert round(brute, 2) == 7.28
    assert uniform_distance((1, 3)) == pytest.approx((4 * 1 + 2 * 2) / 9)


def test_distance_figure_shows_every_dot_the_uniform_line_and_a_whole_title():
    # heads near and above the uniform distance: the dots that used to be cut off at the top
    distances = [torch.tensor([7.9, 7.2, 6.8]), torch.tensor([7.5, 8.1, 7.0])]
    title = "Attention distance per head\nlearned-content-fashion (shipped), mean over 64 images"
    fig = distance_figure(distances, stem=2, title=title, grid=(14, 14))
    FigureCanvasAgg(fig).draw()
    ax = fig.axes[0]
    (uniform,) = [line for line in ax.lines if line.get_gid() == "uniform"]
    assert list(uniform.get_ydata()) == pytest.approx([uniform_distance((14, 14))] * 2)
    frame = ax.get_window_extent()
    radius = math.sqrt(28) / 2 * fig.dpi / 72  # scatter size s=28 points²
    for dots in ax.collections:
        x, y = ax.transData.transform(dots.get_offsets()[0])
        assert frame.x0 + radius <= x <= frame.x1 - radius
        assert frame.y0 + radius <= y <= frame.y1 - radius
    heading = fig._suptitle.get_window_extent()
    assert fig.bbox.x0 <= heading.x0 and heading.x1 <= fig.bbox.x1 and heading.y1 <= fig.bbox.y1
    legend = fig.legends[0].get_window_extent()
    assert not legend.overlaps(heading) and not legend.overlaps(frame)
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "uniform attention (7.28 on 14×14)" in labels


def test_distance_comparison_puts_each_model_in_its_panel_on_one_scale():
    models = {
        "local": [torch.tensor([1.0, 1.5, 2.0]), torch.tensor([2.5, 3.0, 1.0])],
        "global": [torch.tensor([7.0, 8.5]), torch.tensor([6.0, 7.5]), torch.tensor([7.2, 7.3])],
    }
    fig = distance_comparison_figure(models, grid=(14, 14))
    FigureCanvasAgg(fig).draw()
    axes = [ax for ax in fig.axes if ax.get_title()]
    assert [ax.get_title() for ax in axes] == ["local", "global"]
    assert axes[0].get_ylim() == axes[1].get_ylim() and axes[0].get_ylim()[1] >= 8.5
    for ax, distances in zip(axes, models.values(), strict=True):
        points = sorted(float(c.get_offsets()[0][1]) for c in ax.collections)
        assert points == pytest.approx(sorted(torch.cat(distances).tolist()))
        (mean_line,) = [line for line in ax.lines if line.get_gid() != "uniform"]
        np.testing.assert_allclose(mean_line.get_ydata(), [float(d.mean()) for d in distances])
        (uniform,) = [line for line in ax.lines if line.get_gid() == "uniform"]
        assert uniform.get_ydata()[0] == pytest.approx(uniform_distance((14, 14)))
        assert len(ax.get_xticks()) == len(distances)
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels.count("head 2") == 1 and "layer mean" in labels
    with pytest.raises(ValueError, match="at least one model"):
        distance_comparison_figure({})


def test_models_of_different_grids_each_get_their_own_uniform_line_and_legend_entry():
    """Fashion-MNIST's 14×14 tokens beside fashion-mnist-anywhere's 16×16: each panel's dashed line
    is its own grid's uniform distance, and the legend names both lines once."""
    models = {
        "fashion": [torch.tensor([7.0, 6.0]), torch.tensor([6.5, 7.5])],
        "anywhere": [torch.tensor([8.0, 8.4]), torch.tensor([8.2, 7.9])],
    }
    fig = distance_comparison_figure(models, grid={"fashion": (14, 14), "anywhere": (16, 16)})
    FigureCanvasAgg(fig).draw()
    axes = [ax for ax in fig.axes if ax.get_title()]
    for ax, grid in zip(axes, [(14, 14), (16, 16)], strict=True):
        (uniform,) = [line for line in ax.lines if line.get_gid() == "uniform"]
        assert uniform.get_ydata()[0] == pytest.approx(uniform_distance(grid))
    assert axes[0].get_ylim()[1] >= uniform_distance((16, 16))
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels.count("uniform attention (7.28 on 14×14)") == 1
    assert labels.count("uniform attention (8.33 on 16×16)") == 1
    assert labels.count("head 1") == 1
    single = distance_comparison_figure({"only": models["anywhere"]}, grid=(16, 16))
    FigureCanvasAgg(single).draw()
    for artist in (single._suptitle, single.legends[0]):  # one panel: title and legend still fit
        box = artist.get_window_extent()
        assert single.bbox.x0 <= box.x0 and box.x1 <= single.bbox.x1
    with pytest.raises(ValueError, match="one token grid per model"):
        distance_comparison_figure(models, grid={"fashion": (14, 14)})


def test_bad_shapes():
    with pytest.raises(ValueError, match=r"\(heads, 4, 4\)"):
        distance_map(torch.zeros(1, 3, 3), (2, 2))

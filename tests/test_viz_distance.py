"""Attention distance against hand-computed values, the head table and the distance figure."""

import math

import numpy as np
import pytest
import torch

from attnconv import MultiHeadSelfAttention2d
from attnconv.viz.distance import (
    add_distances,
    attention_distance,
    distance_figure,
    distance_map,
    format_head_table,
    layer_distances,
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


def test_bad_shapes():
    with pytest.raises(ValueError, match=r"\(heads, 4, 4\)"):
        distance_map(torch.zeros(1, 3, 3), (2, 2))

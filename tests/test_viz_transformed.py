"""attnconv.viz.transformed: a transformed network's attention on its layers' own grids, its
attention distance and tap masses, and its figures (contours from a query with the start taps,
content gates, distance by depth)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from attnconv.models import create_model
from attnconv.models.checkpoint import build_model
from attnconv.models.presets import TCNN_FASHION_LAYERS
from attnconv.viz.transformed import (
    LayerAttention,
    attention_distance,
    gate_figure,
    gaussian_attention,
    layer_measures,
    tap_mass,
    transformed_attention,
    transformed_contour_figure,
    transformed_distance_figure,
    uniform_distance,
)
from viz_helpers import transformed_checkpoint

TAPS = [(i, j) for i in (-1, 0, 1) for j in (-1, 0, 1)]  # head i·3 + j started on tap (i, j)


@pytest.fixture(scope="module")
def moved():
    """The small T-CNN (16×16 images) with moved heads and open gates, in eval mode."""
    return build_model(transformed_checkpoint()).eval()


def sharp(spread: float = 40.0):
    """The small T-CNN as transformed, its heads on the taps with a spread so large that each is
    one-hot on its tap (to float64's rounding), gates shut."""
    checkpoint = transformed_checkpoint(moved=False)
    model = build_model(checkpoint).double().eval()
    with torch.no_grad():
        for layer in model.transformed_layers().values():
            layer.position.spread.fill_(spread)
    return model


def test_the_gaussian_heads_on_their_taps_are_one_hot_on_the_taps_of_each_query():
    """On each layer's own grids: output pixel (r, c) of a stride-s layer sits on input pixel
    (s·r, s·c) (3×3, padding 1), and head h attends to that pixel plus its tap."""
    model = sharp()
    layers = gaussian_attention(model)
    assert [layer.name for layer in layers] == list(TCNN_FASHION_LAYERS)
    grids = [((4, 4), (8, 8))] + [((4, 4), (4, 4))] * 3 + [((2, 2), (4, 4))] + [((2, 2),) * 2] * 3
    assert [(layer.query_grid, layer.key_grid) for layer in layers] == grids
    for layer, stride in zip(layers, [2, 1, 1, 1, 2, 1, 1, 1], strict=True):
        (h_out, w_out), (h, w) = layer.query_grid, layer.key_grid
        assert layer.query_rows.tolist() == [stride * r for r in range(h_out)]
        assert layer.query_cols.tolist() == [stride * c for c in range(w_out)]
        expected = torch.zeros(9, h_out * w_out, h * w, dtype=torch.float64)
        for head, (dr, dc) in enumerate(TAPS):
            for r in range(h_out):
                for c in range(w_out):
                    row, col = stride * r + dr, stride * c + dc
                    if 0 <= row < h and 0 <= col < w:  # else its mass is on the padding
                        expected[head, r * w_out + c, row * w + col] = 1.0
        torch.testing.assert_close(layer.probs, expected, atol=1e-12, rtol=0)
        assert layer.description == "Gaussian heads alone"
        # one-hot on its own tap from every interior query: tap mass the identity, tap score 1
        measures = layer_measures(layer)
        if (h, w) == (2, 2):  # no query of a 2×2 input has all its 3×3 taps inside it
            with pytest.raises(ValueError, match="no query of its 2x2 input has every kernel tap"):
                tap_mass(layer)
            assert math.isnan(measures["tap_score"]) and math.isnan(measures["tap_coverage"])
            continue
        torch.testing.assert_close(tap_mass(layer), torch.eye(9, dtype=torch.float64), atol=1e-12,
                                   rtol=0)  # fmt: skip
        assert measures["tap_score"] == pytest.approx(1.0) and measures["tap_coverage"] == 1.0


def hand_layer() -> LayerAttention:
    """A stride-2 layer by hand: 2×2 queries on input pixels (0, 0), (0, 2), (2, 0), (2, 2) of a
    4×4 input; head 0 on key (3, 3) from every query, head 1 half on its own query pixel (the
    rest on padding), head 2 uniform."""
    probs = torch.zeros(3, 4, 16, dtype=torch.float64)
    probs[0, :, 15] = 1.0
    for q, (r, c) in enumerate([(0, 0), (0, 2), (2, 0), (2, 2)]):
        probs[1, q, r * 4 + c] = 0.5
    probs[2] = 1 / 16
    return LayerAttention(
        "hand", probs, (2, 2), (4, 4), torch.tensor([0, 2]), torch.tensor([0, 2]),
        torch.tensor([[0.0, 0.0], [0.0, 1.0], [1.0, 0.0]]), (16, 16), "by hand",
    )  # fmt: skip


def test_attention_distance_is_from_each_query_pixel_with_rows_renormalised():
    layer = hand_layer()
    queries = [(0, 0), (0, 2), (2, 0), (2, 2)]
    to_corner = sum(math.hypot(3 - r, 3 - c) for r, c in queries) / 4
    uniform = sum(math.hypot(kr - r, kc - c) for r, c in queries for kr in range(4)
                  for kc in range(4)) / 64  # fmt: skip
    torch.testing.assert_close(
        attention_distance(layer), torch.tensor([to_corner, 0.0, uniform], dtype=torch.float64)
    )
    assert uniform_distance(layer) == pytest.approx(uniform)
    assert layer.pixel_scale == 4.0  # a 16×16 image over a 4×4 input
    assert layer_measures(layer)["attention_distance_image"] == pytest.approx(
        4.0 * (to_corner + uniform) / 3
    )
    # every query has its taps (0, 0), (0, 1), (1, 0) inside; none is on key (3, 3)
    mass = tap_mass(layer)
    torch.testing.assert_close(mass[0], torch.zeros(3, dtype=torch.float64))
    torch.testing.assert_close(mass[1], torch.tensor([1.0, 0, 0], dtype=torch.float64))
    torch.testing.assert_close(mass[2], torch.full((3,), 1 / 16, dtype=torch.float64))
    assert [layer.query_for_image_pixel(p) for p in [(0, 0), (7, 8), (15, 15)]] == [
        (0, 0), (0, 1), (1, 1)
    ]  # fmt: skip


def test_attention_on_images_is_each_layers_attention_on_its_input_averaged(moved):
    """Against the first transformed layer's input computed by hand (stem, stages 0 and 1), and
    with the gates shut the attention of every image is the Gaussian heads'."""
    images = torch.rand(10, 1, 16, 16)  # two chunks of CHUNK = 8
    layers = transformed_attention(moved, images)
    assert layers[0].description == "mean over 10 images"
    network = moved.network
    with torch.no_grad():
        x = F.relu(network.bn1(network.conv1(network.normalize(images))))
        x = network.stages[1](network.stages[0](x))
        first = network.stages[2][0].conv1
        expected = first.attention(x).double().mean(dim=0)
    torch.testing.assert_close(layers[0].probs, expected, atol=1e-6, rtol=0)
    gaussian = gaussian_attention(moved)
    for layer, alone in zip(layers, gaussian, strict=True):
        assert (layer.probs - alone.probs).abs().max() > 1e-3  # the gates let content in
        assert layer.probs.sum(dim=-1).max() <= 1 + 1e-6
    shut = build_model(transformed_checkpoint(moved=False)).eval()
    for layer, alone in zip(transformed_attention(shut, images), gaussian_attention(shut),
                            strict=True):  # fmt: skip
        torch.testing.assert_close(layer.probs, alone.probs, atol=1e-6, rtol=0)
    with pytest.raises(TypeError, match="expected a TransformedNetwork, got ResNet"):
        transformed_attention(create_model("resnet18", widths=(4, 4, 4, 4)), images)


def test_gate_figure_shows_every_gate_and_each_layers_mean(moved):
    fig = gate_figure(moved)
    (image,) = [im for ax in fig.axes for im in ax.images if im.get_gid() == "gates"]
    expected = np.array([[0.1 * h for h in range(9)]] * 8)  # transformed_checkpoint's gates
    np.testing.assert_allclose(image.get_array(), expected, atol=1e-6)
    bars = {p.get_gid(): p.get_width() for ax in fig.axes for p in ax.patches}
    assert bars == pytest.approx({f"mean-gate-layer{l}": 0.4 for l in range(8)}, abs=1e-6)
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert texts.count("0.80") == 8 and texts.count("0.40") == 16  # heads 8 and 4, the means
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels == [f"{i}: {name}" for i, name in enumerate(TCNN_FASHION_LAYERS)]


def test_contour_figure_outlines_each_head_on_its_tap_and_marks_the_taps():
    layers = gaussian_attention(sharp())
    fig = transformed_contour_figure(layers, pixel=(8, 9))
    ax = fig.axes[0]  # stages.2.0.conv1: 8×8 input, 4×4 output; pixel (8, 9) → output (2, 2)
    assert "query (2, 2)" in ax.get_title()
    for head, (dr, dc) in enumerate(TAPS):
        row, col = 4 + dr, 4 + dc  # the query sits on input pixel (4, 4)
        (tap,) = [line for line in ax.lines if line.get_gid() == f"layer0-tap{head}"]
        assert (tap.get_xdata()[0], tap.get_ydata()[0]) == (col, row)
        (outline,) = [c for c in ax.collections if c.get_gid() == f"layer0-head{head}-mass0.5"]
        corners = {tuple(p) for segment in outline.get_segments() for p in segment}
        assert corners == {(col + x, row + y) for x in (-0.5, 0.5) for y in (-0.5, 0.5)}
    ax = fig.axes[7]  # a 2×2 layer: pixel (8, 9) → output (1, 1), on input (1, 1)
    assert "query (1, 1)" in ax.get_title()
    assert "not drawn (all on the padding): heads 2, 5\u20138" in ax.get_title()
    with pytest.raises(ValueError, match=r"query pixel \(16, 0\) lies outside the 16x16 image"):
        transformed_contour_figure(layers, pixel=(16, 0))


def test_distance_figure_dots_are_the_distances_and_dashes_the_uniform_ones(moved):
    layers = transformed_attention(moved, torch.rand(3, 1, 16, 16))
    fig = transformed_distance_figure(layers)
    ax = fig.axes[0]
    dots = np.concatenate([c.get_offsets()[:, 1] for c in ax.collections])
    expected = np.concatenate([attention_distance(layer).numpy() for layer in layers])
    np.testing.assert_allclose(np.sort(dots), np.sort(expected), rtol=1e-6)
    for index, layer in enumerate(layers):
        (dash,) = [line for line in ax.lines if line.get_gid() == f"uniform-layer{index}"]
        assert dash.get_ydata()[0] == pytest.approx(uniform_distance(layer))
    # each layer's mean is a dash of its own: the layers' pixels differ in size (a stride-2
    # layer's input is twice as fine as the next one's), so no line joins the means
    (means,) = [line for line in ax.lines if line.get_label() == "layer mean"]
    assert means.get_linestyle() == "None"
    expected_means = [float(attention_distance(layer).mean()) for layer in layers]
    np.testing.assert_allclose(means.get_ydata(), expected_means, rtol=1e-6)
    scales = {layer.pixel_scale for layer in layers}
    assert len(scales) > 1  # the premise: 16x16 images, layers on 8x8 and 4x4 grids
    ticks = [tick.get_text() for tick in ax.get_xticklabels()]
    for tick, layer in zip(ticks, layers, strict=True):
        assert tick.endswith(f"\n1 px = {layer.pixel_scale:.3g} image px"), tick

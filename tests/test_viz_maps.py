"""Attention maps: probabilities against closed forms, averaging over images, the map grid."""

import re

import numpy as np
import pytest
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg

from attnconv import MultiHeadSelfAttention2d
from attnconv.errors import UserError
from attnconv.viz.maps import (
    FLOOR,
    AttentionMaps,
    attention_layers,
    compute_attention,
    format_probability,
    map_grid_figure,
    query_index,
)
from attnconv.viz.style import MIN_CONTRAST, contrast_ratio
from viz_helpers import small_model


def gaussian_map(center, s, query, grid):
    """softmax over keys of −½ s² ‖k − q − Δ‖², written out with numpy."""
    rows, cols = np.mgrid[0 : grid[0], 0 : grid[1]]
    score = -0.5 * s**2 * ((rows - query[0] - center[0]) ** 2 + (cols - query[1] - center[1]) ** 2)
    p = np.exp(score - score.max())
    return p / p.sum()


def test_position_only_maps_match_closed_form():
    layer = MultiHeadSelfAttention2d(4, 2)
    centers, spreads = [[1.5, -0.5], [-2.0, 3.0]], [0.7, 1.3]
    with torch.no_grad():
        layer.position.centers.copy_(torch.tensor(centers))
        layer.position.spread.copy_(torch.tensor(spreads))
    maps = compute_attention([layer, layer], (5, 7))
    assert maps.grid == (5, 7) and maps.stem == 1 and len(maps.probs) == 2
    for query in [(0, 0), (2, 3), (4, 6)]:
        per_head = maps.query_maps(query)[1]
        for head in range(2):
            np.testing.assert_allclose(
                per_head[head].numpy(),
                gaussian_map(centers[head], spreads[head], query, (5, 7)),
                atol=1e-6,
            )


def test_model_maps_are_on_the_token_grid():
    model, _ = small_model("quadratic", image_size=(8, 12), stem=2)
    maps = compute_attention(model, (8, 12))
    assert maps.grid == (4, 6) and maps.stem == 2
    for layer, probs in zip(model.attention_layers(), maps.probs, strict=True):
        torch.testing.assert_close(probs, layer.attention_probs(4, 6))


def test_content_maps_average_the_images():
    model, _ = small_model("learned-content")
    images = torch.rand(5, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    maps = compute_attention(model, (8, 8), images)
    with torch.no_grad():
        _, per_image = model(images, return_attention=True)
    assert maps.description == "mean over 5 images"
    for mean, probs in zip(maps.probs, per_image, strict=True):
        torch.testing.assert_close(mean, probs.mean(dim=0), atol=1e-6, rtol=1e-5)
    single = compute_attention(model, (8, 8), images[2:3])
    torch.testing.assert_close(single.probs[0], per_image[0][2], atol=1e-6, rtol=1e-5)
    # different images attend differently: the average is not any single image's attention
    assert (per_image[0][0] - per_image[0][1]).abs().max() > 1e-2


def test_content_needs_images_and_the_model():
    model, _ = small_model("learned-content")
    with pytest.raises(ValueError, match="pass images"):
        compute_attention(model, (8, 8))
    with pytest.raises(ValueError, match="whole model"):
        compute_attention(model.attention_layers(), (8, 8), torch.rand(1, 1, 8, 8))
    with pytest.raises(ValueError, match="images are 6x6"):
        compute_attention(model, (8, 8), torch.rand(1, 1, 6, 6))


def test_attention_layers_accepts_models_layers_and_lists():
    layer = MultiHeadSelfAttention2d(4, 2)
    assert attention_layers(layer) == [layer]
    assert attention_layers([layer, layer]) == [layer, layer]
    with pytest.raises(TypeError, match="attention_layers"):
        attention_layers(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="no attention layers"):
        attention_layers([])


def test_query_index_row_major_and_bounds():
    assert query_index((2, 3), (4, 5)) == 13
    with pytest.raises(ValueError, match="outside"):
        query_index((4, 0), (4, 5))


def test_map_grid_shows_each_heads_map_zoomed_around_the_query():
    layer = MultiHeadSelfAttention2d(4, 3)
    with torch.no_grad():
        layer.position.spread.fill_(0.8)
    maps = compute_attention([layer, layer], (9, 10))
    query, window = (2, 7), 2
    fig = map_grid_figure(maps, query=query, window=window)
    axes = np.array(fig.axes[:6]).reshape(2, 3)  # then the colour bar
    expected = maps.query_maps(query)
    for layer_index in range(2):
        for head in range(3):
            ax = axes[layer_index, head]
            np.testing.assert_allclose(ax.images[0].get_array(), expected[layer_index][head])
            assert ax.get_xlim() == (4.5, 9.5)  # columns 5..9 (clipped at the border)
            assert ax.get_ylim() == (4.5, -0.5)  # rows 0..4, downward
            (marker,) = ax.patches
            assert (marker.get_x(), marker.get_y()) == (6.5, 1.5)


def test_map_grid_with_image_column_and_pruned_layers():
    maps = AttentionMaps(
        [torch.full((2, 4, 4), 0.25), torch.full((1, 4, 4), 0.25)], (2, 2), "uniform", stem=3
    )
    image = torch.rand(3, 6, 6)
    fig = map_grid_figure(maps, query=(1, 0), image=image)
    axes = np.array(fig.axes[:6]).reshape(2, 3)
    np.testing.assert_allclose(
        axes[0, 0].images[0].get_array(), image.permute(1, 2, 0).numpy(), atol=1e-7
    )
    (outline,) = axes[0, 0].patches
    assert (outline.get_x(), outline.get_y(), outline.get_width()) == (-0.5, 2.5, 3)
    assert not axes[1, 2].axison  # layer 1 has one head only


def sharp_and_flat(grid=(10, 10)):
    """Two layers: a sharp head and a near-uniform one each, centred on the query."""
    layers = []
    for spreads in ([1.5, 0.02], [0.7, 0.05]):
        layer = MultiHeadSelfAttention2d(4, 2)
        with torch.no_grad():
            layer.position.centers.zero_()
            layer.position.spread.copy_(torch.tensor(spreads))
        layers.append(layer)
    return compute_attention(layers, grid)


def significant_digits(text: str) -> int:
    return len(text.replace(".", "").lstrip("0"))


@pytest.mark.parametrize(
    ("value", "text"),
    [(0.00552, "0.00552"), (0.0055, "0.00550"), (0.174, "0.174"), (0.012, "0.0120"), (1.0, "1.00")],
)
def test_probabilities_are_printed_with_three_significant_digits(value, text):
    assert format_probability(value) == text


def test_map_captions_give_the_maximum_and_its_multiple_of_uniform_in_dark_text():
    maps = sharp_and_flat()
    query = (5, 5)
    fig = map_grid_figure(maps, query=query)
    FigureCanvasAgg(fig).draw()
    expected = maps.query_maps(query)
    for layer in range(2):
        for head in range(2):
            ax = fig.axes[2 * layer + head]
            peak = float(expected[layer][head].max())
            match = re.fullmatch(r"max (\S+) = (\S+)/N", ax.get_xlabel())
            assert match, ax.get_xlabel()
            assert significant_digits(match.group(1)) == 3
            assert float(match.group(1)) == pytest.approx(peak, rel=5e-3)
            assert float(match.group(2)) == pytest.approx(100 * peak, abs=0.051, rel=0.01)
            # under the map, on the figure's white, not on the map's colours
            label = ax.xaxis.label
            assert label.get_window_extent().y1 <= ax.get_window_extent().y0
            assert contrast_ratio(label.get_color(), fig.get_facecolor()) >= MIN_CONTRAST
            # per-map scale: from 0 to the map's own maximum, at least FLOOR/N
            assert ax.images[0].get_clim() == pytest.approx((0.0, max(peak, FLOOR / 100)))
    assert fig.axes[1].get_xlabel().endswith("= 1.0/N")  # the near-uniform head says so
    bar = fig.axes[-1]
    assert [t.get_text() for t in bar.get_yticklabels()] == ["0", "max\n(≥ 4/N)"]
    assert "1/N = 0.0100" in " ".join(fig.get_suptitle().split())


def test_near_uniform_maps_stay_in_the_dark_colours_of_every_scale():
    maps = sharp_and_flat()
    query = (5, 5)
    sharp, flat = (float(m.max()) for m in maps.query_maps(query)[0])
    assert flat * 100 < 1.3 < FLOOR < sharp * 100
    for scale in ("map", "shared"):
        fig = map_grid_figure(maps, query=query, scale=scale)
        image = fig.axes[1].images[0]
        assert image.get_clim()[1] >= FLOOR / 100
        # its brightest token takes at most 1.3/FLOOR of the colour scale, not its top
        assert float(image.norm(flat)) <= 1.3 / FLOOR
        title = " ".join(fig.get_suptitle().split())
        assert f"at least {FLOOR:g}/N so that near-uniform maps stay dark" in title
    # a peaked map's own scale still reaches its maximum
    assert map_grid_figure(maps, query=query).axes[0].images[0].get_clim()[1] == sharp


def test_a_windowed_map_gives_the_maximum_of_the_window():
    # head 0's largest value lies outside the window around the query, head 1's inside it
    values = torch.full((2, 10, 10), 0.5 / 96)
    values[0, 0, 0], values[0, 5, 6] = 0.3, 0.2
    values[1, 5, 4], values[1, 9, 9] = 0.4, 0.1
    values[:, 5, 5] = 0.0
    probs = torch.zeros(2, 100, 100)
    probs[:, 55] = values.reshape(2, 100)
    maps = AttentionMaps([probs], (10, 10), "made up")
    fig = map_grid_figure(maps, query=(5, 5), window=2)
    for ax, peak in zip(fig.axes[:2], (0.2, 0.4), strict=True):
        match = re.fullmatch(r"window max (\S+) = (\S+)/N", ax.get_xlabel())
        assert match, ax.get_xlabel()
        assert float(match.group(1)) == pytest.approx(peak)
        assert ax.images[0].get_clim() == pytest.approx((0.0, peak))
    shared = map_grid_figure(maps, query=(5, 5), window=2, scale="shared")
    assert shared.axes[0].images[0].get_clim() == pytest.approx((0.0, 0.4))
    assert "window ±2 tokens" in " ".join(shared.get_suptitle().split())
    whole = map_grid_figure(maps, query=(5, 5))
    assert whole.axes[0].get_xlabel().startswith("max 0.300 ")


def inside(box, frame) -> bool:
    return frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1


@pytest.mark.parametrize("heads", [1, 3, 4, 9, 12])
def test_titles_and_labels_fit_inside_the_figure_for_any_head_count(heads):
    generator = torch.Generator().manual_seed(heads)
    probs = [torch.softmax(torch.randn(heads, 196, 196, generator=generator), -1)] * 2
    # analyze's maps of a ViT: an image column and a long description
    maps = AttentionMaps(probs, (14, 14), "test 0: Ankle boot, class token excluded", stem=16)
    for image in (torch.rand(3, 224, 224), None):
        fig = map_grid_figure(maps, image=image)
        FigureCanvasAgg(fig).draw()
        frame = fig.bbox
        (title,) = [t for t in fig.texts if t.get_text() == fig.get_suptitle()]
        assert title.get_text().count("\n") >= 1
        assert inside(title.get_window_extent(), frame), (heads, title.get_window_extent())
        bar = fig.axes[-1]
        for ax in fig.axes:
            texts = [ax.title, ax.xaxis.label, ax.yaxis.label]
            texts += bar.get_yticklabels() if ax is bar else []
            for text in texts:
                if text.get_text():
                    assert inside(text.get_window_extent(), frame), (heads, text.get_text())


def test_shared_scale_is_one_colour_scale_with_the_uniform_level_on_its_bar():
    maps = sharp_and_flat()
    query = (5, 5)
    fig = map_grid_figure(maps, query=query, scale="shared")
    top = max(float(m.max()) for m in maps.query_maps(query))
    assert top > FLOOR / 100  # the sharp head's peak, above the floor
    for ax in fig.axes[:4]:
        assert ax.images[0].get_clim() == pytest.approx((0.0, top))
    bar = fig.axes[-1]
    assert bar.get_ylim() == pytest.approx((0.0, top))
    levels = [line.get_ydata()[0] for line in bar.lines]
    assert levels and all(level == pytest.approx(1 / 100) for level in levels)
    assert [t.get_text() for t in bar.texts] == ["1/N"]
    with pytest.raises(UserError, match="scale must be one of map, shared"):
        map_grid_figure(maps, query=query, scale="log")

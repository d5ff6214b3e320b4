"""Attention maps: probabilities against closed forms, averaging over images, the map grid."""

import numpy as np
import pytest
import torch

from attnconv import MultiHeadSelfAttention2d
from attnconv.viz.maps import (
    AttentionMaps,
    attention_layers,
    compute_attention,
    map_grid_figure,
    query_index,
)
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
    axes = np.array(fig.axes).reshape(2, 3)
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
    axes = np.array(fig.axes).reshape(2, 3)
    np.testing.assert_allclose(
        axes[0, 0].images[0].get_array(), image.permute(1, 2, 0).numpy(), atol=1e-7
    )
    (outline,) = axes[0, 0].patches
    assert (outline.get_x(), outline.get_y(), outline.get_width()) == (-0.5, 2.5, 3)
    assert not axes[1, 2].axison  # layer 1 has one head only

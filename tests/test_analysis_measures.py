"""Patch attention (class tokens excluded), its average over images, and the head and layer
tables: values worked out by hand."""

from __future__ import annotations

import math
import re

import pytest
import torch

from attnconv.analysis import measures
from attnconv.analysis.measures import (
    excluded_tokens,
    format_layer_table,
    head_rows,
    layer_rows,
    measure_patch_attention,
    patch_attention,
)
from attnconv.analysis.record import Recording
from attnconv.analysis.third_party import import_timm
from attnconv.viz.maps import AttentionMaps


def random_probs(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    logits = torch.randn(*shape, generator=torch.Generator().manual_seed(seed))
    return torch.softmax(3 * logits, dim=-1)


def test_patch_attention_drops_the_prefix_and_renormalises():
    # layer 0: one class token in front of a 2x2 grid; layer 1: no prefix token
    first = random_probs((2, 3, 5, 5), 0)
    second = random_probs((2, 3, 4, 4), 1)
    recording = Recording([first, second], [1, 0], (2, 2), 8, "timm-vit", torch.zeros(2))
    patches, prefix_mass = patch_attention(recording)
    for b in range(2):
        for h in range(3):
            for q in range(4):
                row = first[b, h, 1 + q]
                expected = row[1:] / (1 - row[0])  # the class token's share spread back
                torch.testing.assert_close(patches[0][b, h, q], expected)
            # the mean over the four patch queries of what they give the class token
            torch.testing.assert_close(prefix_mass[0][b, h], first[b, h, 1:, 0].mean())
    torch.testing.assert_close(patches[1], second)
    assert torch.equal(prefix_mass[1], torch.zeros(2, 3))


def test_excluded_tokens_are_said():
    assert excluded_tokens([0, 0]) == ""
    assert excluded_tokens([0, 1]) == "class token excluded"
    assert excluded_tokens([5, 5]) == "the 5 class/register tokens excluded"


def test_average_over_chunks_equals_the_mean_of_the_images(monkeypatch):
    timm = import_timm()
    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", img_size=32, depth=2).eval()
    images = torch.randn(5, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    labels = [f"image {i}" for i in range(5)]
    monkeypatch.setattr(measures, "CHUNK", 2)  # chunks of 2, 2 and 1
    measured = measure_patch_attention(model, images, labels, keep=3)
    one_by_one = [patch_attention(record(model, images[i : i + 1])) for i in range(5)]
    for layer in range(2):
        mean = torch.stack([patches[layer][0] for patches, _ in one_by_one]).mean(dim=0)
        torch.testing.assert_close(measured.average.probs[layer], mean)
        prefix = torch.stack([mass[layer][0] for _, mass in one_by_one]).mean(dim=0)
        torch.testing.assert_close(measured.prefix_attention[layer], prefix)
        for i, maps in enumerate(measured.per_image):
            torch.testing.assert_close(maps.probs[layer], one_by_one[i][0][layer][0])
    assert [m.description for m in measured.per_image] == [
        f"image {i}, class token excluded" for i in range(3)
    ]
    assert measured.average.description == "mean over 5 images, class token excluded"
    assert measured.average.grid == (2, 2) and measured.average.stem == 16


def record(model, images):
    from attnconv.analysis import record_attention

    return record_attention(model, images)


def one_hot_heads(offsets: list[tuple[int, int]], grid: tuple[int, int]) -> torch.Tensor:
    """(heads, N, N): head h puts all its attention on query + offsets[h], clipped to the grid."""
    h, w = grid
    probs = torch.zeros(len(offsets), h * w, h * w)
    for head, (dr, dc) in enumerate(offsets):
        for r in range(h):
            for c in range(w):
                kr, kc = min(max(r + dr, 0), h - 1), min(max(c + dc, 0), w - 1)
                probs[head, r * w + c, kr * w + kc] = 1.0
    return probs


def test_head_and_layer_tables_of_a_convolution_like_layer():
    # layer 0: nine heads on the taps of a 3x3 convolution, in a shuffled order; layer 1: all
    # heads uniform. On a 5x5 grid of 4-pixel patches.
    taps = [(dr, dc) for dr in (-1, 0, 1) for dc in (-1, 0, 1)]
    order = [4, 0, 8, 2, 6, 1, 3, 5, 7]
    grid = (5, 5)
    conv = one_hot_heads([taps[i] for i in order], grid)
    uniform = torch.full((9, 25, 25), 1 / 25)
    maps = AttentionMaps([conv, uniform], grid, "test", stem=4)
    prefix = [torch.zeros(9), torch.linspace(0, 0.8, 9)]
    rows = head_rows(maps, prefix)
    assert len(rows) == 18 and [(r["layer"], r["head"]) for r in rows[:2]] == [(0, 0), (0, 1)]
    for head, (dr, dc) in enumerate(taps[i] for i in order):
        row = rows[head]
        assert (row["grid_tap_row"], row["grid_tap_col"]) == (dr, dc)
        assert row["grid_tap_mass"] == pytest.approx(1.0)
        # |offset| away from the border; at it the key is clipped onto the grid, nearer
        expected = (
            sum(
                math.hypot(min(max(r + dr, 0), 4) - r, min(max(c + dc, 0), 4) - c)
                for r in range(5)
                for c in range(5)
            )
            / 25
        )
        assert row["attention_distance"] == pytest.approx(expected)
        assert row["attention_distance_pixels"] == pytest.approx(4 * expected)
        assert row["prefix_attention"] == 0.0
    # a uniform head: mean pairwise distance of the 25 patches
    rr, cc = torch.meshgrid(torch.arange(5.0), torch.arange(5.0), indexing="ij")
    points = torch.stack([rr.flatten(), cc.flatten()], dim=1).double()
    mean_distance = torch.cdist(points, points).mean().item()
    for head in range(9):
        row = rows[9 + head]
        assert row["attention_distance"] == pytest.approx(mean_distance)
        assert row["prefix_attention"] == pytest.approx(0.1 * head)
    layers = layer_rows(maps, prefix)
    assert layers[0]["grid_kernel"] == 3 and layers[0]["grid_score"] == pytest.approx(1.0)
    assert layers[0]["grid_coverage"] == 1.0
    assert layers[1]["grid_score"] == pytest.approx(1 / 25)
    assert layers[1]["attention_distance"] == pytest.approx(mean_distance)
    assert layers[1]["attention_distance_pixels"] == pytest.approx(4 * mean_distance)
    assert layers[1]["prefix_attention"] == pytest.approx(0.4)
    table = format_layer_table(layers, prefix=True).splitlines()
    assert re.split(r"\s{2,}", table[0].strip()) == [
        "layer",
        "heads",
        "distance (patches)",
        "distance (px)",
        "grid score",
        "to class/register tokens",
    ]
    assert table[2].split() == [
        "1",
        "9",
        f"{mean_distance:.2f}",
        f"{4 * mean_distance:.1f}",
        "0.040",
        "0.400",
    ]
    assert "class/register" not in format_layer_table(layers, prefix=False)


def test_heads_without_a_tap_have_empty_tap_cells():
    grid = (4, 4)
    probs = one_hot_heads([(0, 0), (0, 1), (1, 0), (1, 1), (0, 0)], grid)  # 5 heads: K = 1
    rows = head_rows(AttentionMaps([probs], grid, "test", stem=2))
    assigned = [r for r in rows if r["grid_tap_row"] is not None]
    assert len(assigned) == 1 and (assigned[0]["grid_tap_row"], assigned[0]["grid_tap_col"]) == (
        0,
        0,
    )
    assert assigned[0]["head"] in (0, 4)
    assert all(r["grid_tap_mass"] is None for r in rows if r is not assigned[0])

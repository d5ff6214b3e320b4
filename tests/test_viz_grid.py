"""Grid score on constructed heads: Theorem 1's construction scores 1, degenerate layouts score low."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnconv import MultiHeadSelfAttention2d
from attnconv.viz.grid import default_kernel_size, grid_score, layer_grid_scores, tap_mass
from attnconv.viz.maps import compute_attention


def one_hot_heads(offsets, grid):
    """``(heads, N, N)``: head ``h`` puts all its mass on ``query + offsets[h]``, wrapped around
    the grid's edges (a torus), so a head never lands on a tap other than its own."""
    h, w = grid
    probs = torch.zeros(len(offsets), h * w, h * w, dtype=torch.float64)
    for head, (d1, d2) in enumerate(offsets):
        for q1 in range(h):
            for q2 in range(w):
                k1, k2 = (q1 + d1) % h, (q2 + d2) % w
                probs[head, q1 * w + q2, k1 * w + k2] = 1.0
    return probs


TAPS_3X3 = [(i, j) for i in (-1, 0, 1) for j in (-1, 0, 1)]


def test_theorem_construction_scores_one_whatever_the_head_order():
    grid = (7, 6)
    for order in (TAPS_3X3, TAPS_3X3[::-1], TAPS_3X3[4:] + TAPS_3X3[:4]):
        result = grid_score(one_hot_heads(order, grid), grid)
        assert result.kernel_size == 3
        assert result.score == pytest.approx(1.0)
        assert result.coverage == pytest.approx(1.0)
        # The assignment gives each tap the head that sits on it.
        assert [order[head] for head in result.assignment] == TAPS_3X3


def test_all_heads_on_one_tap_cover_one_ninth():
    grid = (6, 6)
    result = grid_score(one_hot_heads([(0, 1)] * 9, grid), grid)
    assert result.score == pytest.approx(1 / 9)
    assert result.coverage == pytest.approx(1 / 9)


def test_dilated_grid_is_not_a_3x3_kernel_but_is_a_5x5_subset():
    grid = (9, 9)
    dilated = [(2 * i, 2 * j) for i, j in TAPS_3X3]
    result = grid_score(one_hot_heads(dilated, grid), grid)
    assert result.score == pytest.approx(1 / 9)  # only the centre head lands on a 3×3 tap
    assert result.coverage == pytest.approx(1 / 9)
    as_5x5 = grid_score(one_hot_heads(dilated, grid), grid, kernel_size=5)
    assert as_5x5.score == pytest.approx(9 / 25)  # 9 heads on 9 of the 25 taps
    assert as_5x5.coverage == pytest.approx(9 / 25)


def test_uniform_attention_scores_one_over_n():
    grid = (5, 5)
    n = 25
    probs = torch.full((9, n, n), 1.0 / n, dtype=torch.float64)
    result = grid_score(probs, grid)
    assert result.score == pytest.approx(1 / n)
    assert result.coverage == 0.0
    torch.testing.assert_close(result.tap_mass, torch.full((9, 3, 3), 1.0 / n))


def test_half_mass_counts_as_covered_and_extra_heads_are_ignored():
    grid = (6, 6)
    sharp = one_hot_heads(TAPS_3X3, grid)
    blurred = 0.5 * sharp + 0.5 * one_hot_heads([(0, 0)] * 9, grid)
    extra = one_hot_heads([(2, 2)] * 3, grid)
    result = grid_score(torch.cat([blurred, extra]), grid)
    assert default_kernel_size(12) == 3 and result.kernel_size == 3
    # Eight heads keep half their mass on their own tap; the centre head has all of it.
    assert result.score == pytest.approx((8 * 0.5 + 1.0) / 9)
    assert result.coverage == pytest.approx(1.0)
    assert all(head < 9 for head in result.assignment)


@settings(max_examples=20, deadline=None)
@given(
    h=st.integers(3, 6),
    w=st.integers(3, 6),
    heads=st.integers(1, 10),
    seed=st.integers(0, 2**16),
)
def test_tap_mass_matches_a_loop_over_queries(h, w, heads, seed):
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(heads, h * w, h * w, generator=generator, dtype=torch.float64)
    probs = logits.softmax(dim=-1)
    mass = tap_mass(probs, (h, w), 3)
    expected = torch.zeros(heads, 3, 3, dtype=torch.float64)
    queries = [(q1, q2) for q1 in range(1, h - 1) for q2 in range(1, w - 1)]
    for q1, q2 in queries:
        for i, d1 in enumerate((-1, 0, 1)):
            for j, d2 in enumerate((-1, 0, 1)):
                expected[:, i, j] += probs[:, q1 * w + q2, (q1 + d1) * w + q2 + d2]
    torch.testing.assert_close(mass, expected / len(queries))
    score = grid_score(probs, (h, w))
    assert 0.0 <= score.score <= 1.0


def test_layer_of_hard_gaussian_heads_on_the_taps_scores_one():
    layer = MultiHeadSelfAttention2d(4, 9, positional="gaussian", hard=True)
    with torch.no_grad():
        layer.position.centers.copy_(torch.tensor(TAPS_3X3, dtype=torch.float32))
    maps = compute_attention(layer, (8, 8))
    (result,) = layer_grid_scores(maps)
    assert result.score == pytest.approx(1.0) and result.coverage == 1.0


def test_bad_shapes_are_reported():
    with pytest.raises(ValueError, match="must be"):
        tap_mass(torch.zeros(2, 10, 10), (3, 3), 3)
    with pytest.raises(ValueError, match="odd"):
        tap_mass(torch.zeros(2, 9, 9), (3, 3), 2)
    with pytest.raises(ValueError, match="no query"):
        tap_mass(torch.zeros(2, 4, 4), (2, 2), 3)

"""Mass contours: regions checked against a brute-force reference, outlines and figure content."""

import numpy as np
import pytest
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg

from attnconv import MultiHeadSelfAttention2d
from attnconv.viz.contours import contour_figure, mass_region, mass_threshold, region_outline
from attnconv.viz.maps import AttentionMaps, compute_attention
from attnconv.viz.style import palette_color


def reference_region(values: np.ndarray, mass: float) -> np.ndarray:
    """Smallest top-k set holding ``mass`` of the total, found by trying k = 1, 2, ... (no ties)."""
    order = np.argsort(-values, axis=None)
    total = values.sum()
    for k in range(1, values.size + 1):
        chosen = order[:k]
        if values.ravel()[chosen].sum() >= mass * total * (1 - 1e-9):
            mask = np.zeros(values.size, dtype=bool)
            mask[chosen] = True
            return mask.reshape(values.shape)
    raise AssertionError("unreachable")


def edges_of(pixels: set[tuple[int, int]]) -> set[tuple]:
    """Boundary edges of a set of pixels, as frozensets of endpoint pairs in (x=col, y=row)."""
    edges: dict[frozenset, int] = {}
    for r, c in pixels:
        corners = [(c - 0.5, r - 0.5), (c + 0.5, r - 0.5), (c + 0.5, r + 0.5), (c - 0.5, r + 0.5)]
        for a, b in zip(corners, corners[1:] + corners[:1], strict=True):
            key = frozenset([a, b])
            edges[key] = edges.get(key, 0) + 1
    return {key for key, count in edges.items() if count == 1}


def segment_set(segments: np.ndarray) -> set[frozenset]:
    return {frozenset([tuple(map(float, s[0])), tuple(map(float, s[1]))]) for s in segments}


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("mass", [0.5, 0.9, 0.3])
def test_mass_region_matches_brute_force(seed, mass):
    values = np.random.default_rng(seed).exponential(size=(6, 7)) ** 3
    region = mass_region(values, mass)
    np.testing.assert_array_equal(region, reference_region(values, mass))
    assert values[region].sum() >= mass * values.sum()
    assert mass_threshold(values, mass) == values[region].min()


def test_ties_at_the_threshold_are_all_included():
    values = np.array([[0.25, 0.25], [0.25, 0.25]])
    assert mass_region(values, 0.5).all()


@pytest.mark.parametrize("layer_kwargs", [{"hard": True}, {}])
def test_sharp_head_region_is_its_centre_pixel_only(layer_kwargs):
    layer = MultiHeadSelfAttention2d(4, 2, **layer_kwargs)
    with torch.no_grad():
        layer.position.centers.copy_(torch.tensor([[1.0, 2.0], [-2.0, 0.0]]))
        layer.position.spread.fill_(10.0)  # inverse std: very sharp when not hard
    maps = compute_attention(layer, (7, 9))
    query = (3, 3)
    for head, (dr, dc) in enumerate([(1, 2), (-2, 0)]):
        values = maps.query_maps(query)[0][head]
        for mass in (0.5, 0.9):
            region = mass_region(values, mass)
            assert set(zip(*np.nonzero(region), strict=True)) == {(3 + dr, 3 + dc)}


def test_outline_of_single_pixel_and_l_shape():
    mask = np.zeros((4, 5), dtype=bool)
    mask[2, 3] = True
    assert segment_set(region_outline(mask)) == edges_of({(2, 3)})
    pixels = {(0, 0), (1, 0), (2, 0), (2, 1)}
    mask = np.zeros((3, 3), dtype=bool)
    for p in pixels:
        mask[p] = True
    segments = region_outline(mask)
    assert len(segments) == 4 * len(pixels) - 2 * 3  # three shared edges
    assert segment_set(segments) == edges_of(pixels)


def test_contour_figure_draws_exactly_the_regions():
    layers = [MultiHeadSelfAttention2d(4, 3, hard=True) for _ in range(2)]
    centers = [[[1.0, 2.0], [0.0, -1.0], [-2.0, -2.0]], [[0.0, 0.0], [2.0, 1.0], [-1.0, 3.0]]]
    for layer, c in zip(layers, centers, strict=True):
        with torch.no_grad():
            layer.position.centers.copy_(torch.tensor(c))
    query = (3, 4)
    fig = contour_figure(compute_attention(layers, (7, 8)), query=query)
    axes = fig.axes
    for layer_index, layer_centers in enumerate(centers):
        ax = axes[layer_index]
        by_gid = {coll.get_gid(): coll for coll in ax.collections}
        assert len(by_gid) == 3 * 2
        for head, (dr, dc) in enumerate(layer_centers):
            target = {(query[0] + int(dr), query[1] + int(dc))}
            for mass in (0.5, 0.9):
                coll = by_gid[f"layer{layer_index}-head{head}-mass{mass:g}"]
                assert segment_set(np.asarray(coll.get_segments())) == edges_of(target)
                np.testing.assert_allclose(
                    coll.get_colors()[0][:3], _rgb(palette_color(head)), atol=1e-6
                )
        squares = [p for p in ax.patches if p.get_width() == 1]
        assert [(p.get_x(), p.get_y()) for p in squares] == [(query[1] - 0.5, query[0] - 0.5)]


def test_gaussian_contours_are_nested_and_hold_their_mass():
    layer = MultiHeadSelfAttention2d(4, 4)
    with torch.no_grad():
        layer.position.spread.fill_(0.6)
    maps = compute_attention(layer, (9, 9))
    for head in range(4):
        values = maps.query_maps((4, 4))[0][head].numpy()
        inner, outer = mass_region(values, 0.5), mass_region(values, 0.9)
        assert (inner <= outer).all() and outer.sum() > inner.sum()
        assert values[inner].sum() >= 0.5 and values[outer].sum() >= 0.9


def test_bad_input():
    with pytest.raises(ValueError, match="mass"):
        mass_threshold(np.ones(3), 1.5)
    with pytest.raises(ValueError, match="non-negative"):
        mass_threshold(np.array([1.0, -1.0]), 0.5)
    maps = AttentionMaps([torch.full((1, 4, 4), 0.25)], (2, 2), "uniform")
    with pytest.raises(ValueError, match="outside the 2x2"):
        contour_figure(maps, query=(2, 0))


def _rgb(hex_color: str) -> list[float]:
    return [int(hex_color[i : i + 2], 16) / 255 for i in (1, 3, 5)]


def test_palette_has_nine_distinct_colours_then_cycles():
    assert len({palette_color(h) for h in range(9)}) == 9
    assert palette_color(9) == palette_color(0)


def test_head_numbers_on_the_same_tap_do_not_overprint():
    # heads 0, 2 and 11 attend to the same key (one tap), head 1 to another
    layer = MultiHeadSelfAttention2d(4, 12, hard=True)
    with torch.no_grad():
        layer.position.centers.copy_(torch.tensor([[0.0, 3.0]] * 12))
        layer.position.centers[[0, 2, 11]] = torch.tensor([1.0, 1.0])
        layer.position.centers[1] = torch.tensor([-2.0, 0.0])
    query = (4, 4)
    fig = contour_figure(compute_attention(layer, (9, 9)), query=query)
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    ax = fig.axes[0]
    labels = {text.get_gid(): text for text in ax.texts if text.get_gid()}
    assert sorted(labels) == sorted(f"layer0-head{h}-label" for h in range(12))
    assert all(labels[f"layer0-head{h}-label"].get_text() == str(h) for h in range(12))
    boxes = {gid: text.get_bbox_patch().get_window_extent(renderer) for gid, text in labels.items()}
    gids = sorted(boxes)
    for i, a in enumerate(gids):
        for b in gids[i + 1 :]:
            assert not boxes[a].overlaps(boxes[b]), (a, b)
    # the numbers of one tap sit in a row, centred on the tap's token, in head order
    tap = ax.transData.transform((query[1] + 1, query[0] + 1))
    row = [boxes[f"layer0-head{h}-label"] for h in (0, 2, 11)]
    assert row[0].x1 <= row[1].x0 and row[1].x1 <= row[2].x0
    assert abs((row[0].x0 + row[2].x1) / 2 - tap[0]) < 2
    assert all(abs((box.y0 + box.y1) / 2 - tap[1]) < 2 for box in row)
    # a head alone on its tap is labelled at it
    alone = boxes["layer0-head1-label"]
    centre = ax.transData.transform((query[1], query[0] - 2))
    assert abs((alone.x0 + alone.x1) / 2 - centre[0]) < 2
    assert abs((alone.y0 + alone.y1) / 2 - centre[1]) < 2

"""Mass contours: regions checked against a brute-force reference, outlines and figure content."""

import numpy as np
import pytest
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg

from attnconv import MultiHeadSelfAttention2d
from attnconv.viz.contours import (
    DIFFUSE,
    MAX_AREA,
    SCATTERED,
    contour_figure,
    head_regions,
    is_one_piece,
    mass_region,
    mass_threshold,
    outlined_heads,
    region_outline,
)
from attnconv.viz.maps import AttentionMaps, compute_attention
from attnconv.viz.style import MIN_CONTRAST, contrast_ratio, palette_color


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
        by_gid = {c.get_gid(): c for c in ax.collections if c.get_gid() != "token-grid"}
        assert len(by_gid) == 3 * 2
        for head, (dr, dc) in enumerate(layer_centers):
            target = {(query[0] + int(dr), query[1] + int(dc))}
            for mass in (0.5, 0.9):
                coll = by_gid[f"layer{layer_index}-head{head}-mass{mass:g}"]
                assert segment_set(np.asarray(coll.get_segments())) == edges_of(target)
                np.testing.assert_allclose(
                    coll.get_colors()[0][:3], _rgb(palette_color(head)), atol=1e-6
                )
        (marker,) = [line for line in ax.lines if line.get_marker() == "X"]
        assert (marker.get_xdata()[0], marker.get_ydata()[0]) == (query[1], query[0])
        assert not ax.patches  # the query is marked at its centre, hiding no outline


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


def label_boxes(fig, ax):
    """Display boxes of the head numbers of ``ax`` by gid, after drawing ``fig``."""
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    labels = {text.get_gid(): text for text in ax.texts if text.get_gid()}
    return labels, {
        gid: t.get_bbox_patch().get_window_extent(renderer) for gid, t in labels.items()
    }


def marker_box(fig, ax):
    """Display box of the query marker (the black X)."""
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    (marker,) = [line for line in ax.lines if line.get_marker() == "X"]
    return marker.get_window_extent(canvas.get_renderer())


def test_head_numbers_on_the_same_tap_do_not_overprint():
    # heads 0, 2 and 11 attend to the same key (one tap), head 1 to another
    layer = MultiHeadSelfAttention2d(4, 12, hard=True)
    with torch.no_grad():
        layer.position.centers.copy_(torch.tensor([[0.0, 3.0]] * 12))
        layer.position.centers[[0, 2, 11]] = torch.tensor([1.0, 1.0])
        layer.position.centers[1] = torch.tensor([-2.0, 0.0])
    query = (4, 4)
    fig = contour_figure(compute_attention(layer, (9, 9)), query=query)
    ax = fig.axes[0]
    labels, boxes = label_boxes(fig, ax)
    assert sorted(labels) == sorted(f"layer0-head{h}-label" for h in range(12))
    assert all(labels[f"layer0-head{h}-label"].get_text() == str(h) for h in range(12))
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


def test_head_numbers_leave_the_query_free_and_stay_readable():
    # nine hard heads on the 3×3 taps around the query: the centre tap's number would cover the
    # query marker, and the neighbours' numbers crowd each other
    layer = MultiHeadSelfAttention2d(4, 9, hard=True)
    taps = [[float(r), float(c)] for r in (-1, 0, 1) for c in (-1, 0, 1)]
    with torch.no_grad():
        layer.position.centers.copy_(torch.tensor(taps))
    fig = contour_figure(compute_attention(layer, (7, 7)), query=(3, 3))
    ax = fig.axes[0]
    labels, boxes = label_boxes(fig, ax)
    query_box = marker_box(fig, ax)
    frame = ax.get_window_extent()
    assert len(boxes) == 9
    for gid, box in boxes.items():
        assert not box.overlaps(query_box), gid
        assert frame.x0 <= box.x0 and box.x1 <= frame.x1
        assert frame.y0 <= box.y0 and box.y1 <= frame.y1
        text = labels[gid]
        ratio = contrast_ratio(text.get_color(), text.get_bbox_patch().get_facecolor())
        assert ratio >= MIN_CONTRAST, (gid, ratio)
    gids = sorted(boxes)
    for i, a in enumerate(gids):
        for b in gids[i + 1 :]:
            assert not boxes[a].overlaps(boxes[b]), (a, b)
    # head 4 attends to the query itself: its number moved off the marker, but stays next to it
    box = boxes["layer0-head4-label"]
    x, y = ax.transData.transform((3.0, 3.0))
    gap = np.hypot(max(box.x0 - x, 0, x - box.x1), max(box.y0 - y, 0, y - box.y1))
    assert 0 < gap <= box.height


def gaussian_layer(spreads):
    """Isotropic Gaussian heads centred on the query with the given inverse std each."""
    layer = MultiHeadSelfAttention2d(4, len(spreads))
    with torch.no_grad():
        layer.position.centers.zero_()
        layer.position.spread.copy_(torch.tensor(spreads))
    return layer


def test_only_concentrated_regions_are_outlined():
    # sharp, medium (compact 50% but wide 90% region) and near-uniform heads
    layer = gaussian_layer([2.0, 0.6, 0.05, 0.01])
    grid, query = (12, 12), (6, 6)
    maps = compute_attention(layer, grid)
    per_head = maps.query_maps(query)[0].double().numpy()
    expected = set()
    for head, values in enumerate(per_head):
        for mass in (0.5, 0.9):
            size = reference_region(values, mass).sum()  # brute force, not the code under test
            if size <= MAX_AREA * mass * values.size:
                expected.add(f"layer0-head{head}-mass{mass:g}")
    # the test is about all three cases: both, only the 50% and no region of a head drawn
    assert {"layer0-head0-mass0.5", "layer0-head0-mass0.9", "layer0-head1-mass0.5"} <= expected
    assert "layer0-head1-mass0.9" not in expected
    assert not {g for g in expected if g.startswith(("layer0-head2", "layer0-head3"))}
    fig = contour_figure(maps, query=query)
    ax = fig.axes[0]
    assert {c.get_gid() for c in ax.collections} == expected | {"token-grid"}
    assert {t.get_gid() for t in ax.texts if t.get_gid()} == {
        "layer0-head0-label",
        "layer0-head1-label",
    }
    assert ax.get_title() == "layer 0\nnot drawn (diffuse): heads 2\u20133"
    assert "at most 25% of the tokens uniform attention spreads that mass over" in (
        " ".join(fig.get_suptitle().split())
    )
    assert "(18 for 50%, 32 for 90%, of 144 tokens)" in " ".join(fig.get_suptitle().split())
    everything = contour_figure(maps, query=query, max_area=1 / 0.5)
    assert len(everything.axes[0].collections) == 8 + 1


def test_one_panel_per_layer_in_a_square_grid():
    layers = [gaussian_layer([1.0, 2.0]) for _ in range(4)]
    fig = contour_figure(compute_attention(layers, (6, 6)))
    assert len(fig.axes) == 4  # 2×2: no empty panels
    FigureCanvasAgg(fig).draw()
    corners = {(round(ax.get_position().x0, 3), round(ax.get_position().y0, 3)) for ax in fig.axes}
    assert len({x for x, _ in corners}) == 2 and len({y for _, y in corners}) == 2


def made_up_maps(per_head: list[np.ndarray], query: tuple[int, int]) -> AttentionMaps:
    """One layer whose heads attend from ``query`` as the ``(h, w)`` maps ``per_head`` say (every
    other query attends uniformly)."""
    h, w = per_head[0].shape
    probs = torch.full((len(per_head), h * w, h * w), 1 / (h * w))
    for head, values in enumerate(per_head):
        probs[head, query[0] * w + query[1]] = torch.tensor(values / values.sum()).reshape(-1)
    return AttentionMaps([probs], (h, w), "made up")


def peaked(grid, spots, rest=0.02):
    """A map with weight 1 on each token of ``spots`` and ``rest`` on every other token."""
    values = np.full(grid, rest)
    for spot in spots:
        values[spot] = 1.0
    return values


def test_is_one_piece_joins_tokens_touching_at_an_edge_or_corner():
    region = np.zeros((5, 5), dtype=bool)
    region[1, 1] = region[2, 2] = region[2, 3] = True  # a diagonal step and an edge
    assert is_one_piece(region)
    region[4, 0] = True
    assert not is_one_piece(region)


def test_peaked_heads_are_drawn_and_lattice_or_diffuse_heads_named_instead():
    grid, query = (12, 12), (6, 6)
    lattice = [(r, c) for r in (1, 5, 9) for c in (1, 5, 9)]  # nine separate tokens
    heads = [
        peaked(grid, [(2, 3)], rest=0.0005),  # one token: its 50% and 90% regions
        peaked(grid, lattice, rest=0.001),  # a lattice
        np.ones(grid),  # uniform: diffuse
        peaked(grid, [(8, 8), (8, 9), (9, 8), (9, 9)], rest=0.01),  # a 2x2 spot, 90% too wide
    ]
    maps = made_up_maps(heads, query)
    assert [head_regions(v, (0.5, 0.9), MAX_AREA)[1] for v in heads] == [
        None, SCATTERED, DIFFUSE, None
    ]  # fmt: skip
    fig = contour_figure(maps, query=query)
    ax = fig.axes[0]
    drawn = {c.get_gid() for c in ax.collections} - {"token-grid"}
    assert drawn == {"layer0-head0-mass0.5", "layer0-head0-mass0.9", "layer0-head3-mass0.5"}
    outline = next(c for c in ax.collections if c.get_gid() == "layer0-head3-mass0.5")
    square = {(r, c) for r in (8, 9) for c in (8, 9)}
    assert segment_set(np.asarray(outline.get_segments())) == edges_of(square)
    assert ax.get_title() == (
        "layer 0\nnot drawn (diffuse): head 2\nnot drawn (several spots): head 1"
    )
    rule = " ".join(fig.get_suptitle().split())
    assert "Outlined: regions in one piece (tokens touching at an edge or corner)" in rule
    assert "Heads left out (diffuse, several spots) are named under each panel's title" in rule
    assert rule.endswith("2 of 4 heads are outlined; the maps show the others.")  # 0 and 3
    labels, _ = label_boxes(fig, ax)
    assert sorted(labels) == ["layer0-head0-label", "layer0-head3-label"]
    (title,) = [t for t in fig.texts if t.get_text() == fig.get_suptitle()]
    for box in (title.get_window_extent(), fig.legends[0].get_window_extent()):
        assert fig.bbox.x0 <= box.x0 and box.x1 <= fig.bbox.x1, box  # one panel: a narrow figure
        assert fig.bbox.y0 <= box.y0 and box.y1 <= fig.bbox.y1, box
    assert outlined_heads(maps, query) == 2
    assert outlined_heads(made_up_maps(heads[1:3], query), query) == 0


def test_numbers_of_crowded_peaked_heads_do_not_overlap():
    # twelve heads, each on its own token of a 3x4 block beside the query: their numbers fan out
    grid, query = (9, 9), (4, 3)
    spots = [(r, c) for r in (3, 4, 5) for c in (4, 5, 6, 7)]
    maps = made_up_maps([peaked(grid, [spot], rest=0.001) for spot in spots], query)
    fig = contour_figure(maps, query=query)
    ax = fig.axes[0]
    _, boxes = label_boxes(fig, ax)
    assert len(boxes) == 12
    frame = ax.get_window_extent()
    query_box = marker_box(fig, ax)
    gids = sorted(boxes)
    for i, a in enumerate(gids):
        assert not boxes[a].overlaps(query_box), a
        assert frame.x0 <= boxes[a].x0 and boxes[a].x1 <= frame.x1
        assert frame.y0 <= boxes[a].y0 and boxes[a].y1 <= frame.y1
        for b in gids[i + 1 :]:
            assert not boxes[a].overlaps(boxes[b]), (a, b)

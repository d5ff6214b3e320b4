"""Head numbers placed on a panel: no overlaps, clear of markers, inside the panel, readable."""

import math

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg

from attnconv.viz.labels import HeadAnchor, Marker, Panel, label_panels, query_marker
from attnconv.viz.style import MIN_CONTRAST, contrast_ratio, new_figure, palette_color


def panel(limits=(0, 10)):
    fig = new_figure(3, 3)
    ax = fig.subplots()
    ax.set_xlim(*limits)
    ax.set_ylim(*limits)
    return fig, ax


def boxes_of(fig, ax):
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    texts = {t.get_gid(): t for t in ax.texts}
    return texts, {gid: t.get_bbox_patch().get_window_extent(renderer) for gid, t in texts.items()}


def test_crowded_numbers_do_not_overlap_and_stay_in_the_panel():
    fig, ax = panel()
    # twelve heads within a token of each other, next to the panel's corner and the query
    anchors = [HeadAnchor(h, 1.0 + 0.3 * (h % 4), 1.0 + 0.3 * (h // 4)) for h in range(12)]
    label_panels(fig, [Panel(ax, anchors, "p-", [query_marker(1.5, 1.5)])])
    texts, boxes = boxes_of(fig, ax)
    assert sorted(boxes) == sorted(f"p-head{h}-label" for h in range(12))
    frame = ax.get_window_extent()
    x, y = ax.transData.transform((1.5, 1.5))
    half = query_marker(0, 0).size / 2 * fig.dpi / 72
    gids = sorted(boxes)
    for i, gid in enumerate(gids):
        box = boxes[gid]
        assert (
            frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1
        )
        assert box.x1 <= x - half or box.x0 >= x + half or box.y1 <= y - half or box.y0 >= y + half
        for other in gids[i + 1 :]:
            assert not box.overlaps(boxes[other]), (gid, other)
        head = int(gid.split("head")[1].split("-")[0])
        text = texts[gid]
        assert text.get_bbox_patch().get_facecolor()[:3] == pytest.approx(
            tuple(int(palette_color(head)[i : i + 2], 16) / 255 for i in (1, 3, 5))
        )
        assert (
            contrast_ratio(text.get_color(), text.get_bbox_patch().get_facecolor()) >= MIN_CONTRAST
        )


def test_a_number_far_from_its_anchor_has_a_line_back_to_it():
    fig, ax = panel()
    anchors = [HeadAnchor(0, 5.0, 5.0), HeadAnchor(1, 8.0, 8.0)]
    # a big marker over head 0's anchor pushes its number away; head 1 stays on its anchor
    label_panels(fig, [Panel(ax, anchors, "p-", [Marker(5.0, 5.0, 60.0)])])
    texts, boxes = boxes_of(fig, ax)
    moved, kept = texts["p-head0-label"], texts["p-head1-label"]
    assert moved.arrow_patch is not None and tuple(moved.xy) == (5.0, 5.0)
    assert kept.arrow_patch is None
    x, y = ax.transData.transform((8.0, 8.0))
    assert boxes["p-head1-label"].contains(x, y)
    x, y = ax.transData.transform((5.0, 5.0))
    centre = boxes["p-head0-label"]
    assert (
        math.hypot((centre.x0 + centre.x1) / 2 - x, (centre.y0 + centre.y1) / 2 - y)
        >= 30 * fig.dpi / 72
    )

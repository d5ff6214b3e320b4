"""Head numbers on a figure panel, placed so that none overlaps another or the query marker.

Each number sits in a small box filled with its head's colour, the text in black or white,
whichever contrasts more (``style.text_color_on``), so light colours stay readable. Heads that
point at the same spot (their anchors fall on the same token) are written side by side as one
group, in head order. A group goes at its anchor if it fits there; else at the nearest free spot
on rings around the anchor, with a thin line in the head's colour back to the anchor.

Placement works in display coordinates, so it needs the figure's final layout: ``label_panels``
runs the layout once, places the numbers of every panel, and then fixes the layout (the figure's
layout engine is switched off, so saving it moves nothing).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.text import Annotation
from matplotlib.transforms import Bbox

from attnconv.viz.style import QUERY_MARKER, palette_color, text_color_on

FONTSIZE = 7.5
# Space between the boxes of one group and around every box, in points.
GAP_PT = 1.5
# Rings of candidate spots around the anchor: radii in box heights, spots per ring.
RINGS = 8
SPOTS_PER_RING = 12


@dataclass(frozen=True)
class HeadAnchor:
    """Where head ``head``'s number belongs: ``(x, y)`` in the axes' data coordinates."""

    head: int
    x: float
    y: float


@dataclass(frozen=True)
class Marker:
    """A marker no number may cover: centred on ``(x, y)`` (data), ``size`` points across."""

    x: float
    y: float
    size: float


def query_marker(x: float, y: float) -> Marker:
    """The query marker (``style.QUERY_MARKER``) drawn at data point ``(x, y)``."""
    return Marker(x, y, QUERY_MARKER["markersize"] + 2 * QUERY_MARKER["markeredgewidth"])


@dataclass(frozen=True)
class Panel:
    """The numbers of one panel: ``anchors`` on ``ax``, gids prefixed ``gid_prefix``, covering
    none of the ``avoid`` markers."""

    ax: Axes
    anchors: Sequence[HeadAnchor]
    gid_prefix: str
    avoid: Sequence[Marker] = ()


def label_panels(fig: Figure, panels: Sequence[Panel]) -> list[dict[int, Annotation]]:
    """Lay ``fig`` out, write the head numbers of every panel (``place_head_labels``), then keep
    that layout. Call it last, when everything else of the figure is drawn."""
    # Twice: constrained layout measures the panels' titles where the previous layout put them,
    # and the first one moves them (three-line titles would overlap the row above).
    fig.draw_without_rendering()
    fig.draw_without_rendering()
    labels = [place_head_labels(p.ax, p.anchors, p.gid_prefix, p.avoid) for p in panels]
    fig.set_layout_engine("none")
    return labels


def place_head_labels(
    ax: Axes, anchors: Sequence[HeadAnchor], gid_prefix: str, avoid: Sequence[Marker] = ()
) -> dict[int, Annotation]:
    """Write every head's number near its anchor on ``ax`` without overlaps (module docstring),
    for the figure's current layout (``label_panels`` makes it the final one).

    ``avoid``: markers no number may cover (e.g. the query's). Each number is an ``Annotation``
    with gid ``f"{gid_prefix}head{h}-label"``; returns them by head.
    """
    fig = ax.figure
    renderer = fig.canvas.get_renderer()
    points = fig.dpi / 72.0  # display pixels per point
    gap = GAP_PT * points
    frame = ax.get_window_extent(renderer)
    taken: list[Bbox] = [_grown(_marker_box(ax, marker), gap / 2) for marker in avoid]
    labels: dict[int, Annotation] = {}
    for group in _groups(anchors):
        anchor = ax.transData.transform([(item.x, item.y) for item in group]).mean(axis=0)
        sizes = [_box_size(ax, item, renderer) for item in group]
        width = sum(w for w, _ in sizes) + gap * (len(sizes) - 1)
        height = max(h for _, h in sizes)
        spot = _free_spot(anchor, width, height, frame, taken, gap)
        placed = Bbox.from_bounds(spot[0] - width / 2, spot[1] - height / 2, width, height)
        # set off from its anchor by more than its height: lines in the heads' colours lead back
        moved = _distance(placed, anchor) > height
        left = placed.x0
        for (w, _), item in zip(sizes, group, strict=True):
            own = ax.transData.transform((item.x, item.y))
            offset = ((left + w / 2 - own[0]) / points, (spot[1] - own[1]) / points)
            labels[item.head] = _label(ax, item, gid_prefix, offset, lead=moved)
            left += w + gap
        taken.append(_grown(placed, gap / 2))
    return labels


def _marker_box(ax: Axes, marker: Marker) -> Bbox:
    """Display box of ``marker``."""
    x, y = ax.transData.transform((marker.x, marker.y))
    half = marker.size / 2 * ax.figure.dpi / 72
    return Bbox.from_extents(x - half, y - half, x + half, y + half)


def _box_size(ax: Axes, item: HeadAnchor, renderer) -> tuple[float, float]:
    """Width and height (display) of head ``item.head``'s number in its box."""
    probe = _label(ax, item, "probe-", (0.0, 0.0), lead=False)
    probe.update_bbox_position_size(renderer)
    box = probe.get_bbox_patch().get_window_extent(renderer)
    probe.remove()
    return box.width, box.height


def _groups(anchors: Sequence[HeadAnchor]) -> list[list[HeadAnchor]]:
    """Anchors on the same token (rounded data coordinates), each group in head order, groups in
    order of their first head."""
    by_token: dict[tuple[int, int], list[HeadAnchor]] = {}
    for item in sorted(anchors, key=lambda a: a.head):
        by_token.setdefault((math.floor(item.x + 0.5), math.floor(item.y + 0.5)), []).append(item)
    return list(by_token.values())


def _label(
    ax: Axes, item: HeadAnchor, gid_prefix: str, offset: tuple[float, float], lead: bool
) -> Annotation:
    """Head ``item.head``'s number, ``offset`` points from its anchor (a line back to the anchor
    when ``lead``)."""
    color = palette_color(item.head)
    text = ax.annotate(
        str(item.head),
        xy=(item.x, item.y),
        xytext=offset,
        textcoords="offset points",
        color=text_color_on(color),
        fontsize=FONTSIZE,
        fontweight="bold",
        ha="center",
        va="center",
        zorder=6,
        annotation_clip=False,
        bbox={"boxstyle": "round,pad=0.15", "facecolor": color, "edgecolor": "none"},
        arrowprops=(
            {"arrowstyle": "-", "color": color, "linewidth": 0.8, "shrinkA": 0, "shrinkB": 1}
            if lead
            else None
        ),
    )
    text.set_in_layout(False)
    text.set_gid(f"{gid_prefix}head{item.head}-label")
    return text


def _free_spot(
    anchor: np.ndarray, width: float, height: float, frame: Bbox, taken: list[Bbox], gap: float
) -> tuple[float, float]:
    """The centre (display) nearest ``anchor`` of a ``width × height`` box inside ``frame`` that
    overlaps nothing in ``taken``; the least-overlapping spot when none is free."""
    step = height + gap
    spots = [(0.0, 0.0)]
    for ring in range(1, RINGS + 1):
        count = SPOTS_PER_RING * ring
        for k in range(count):
            angle = math.pi / 2 + 2 * math.pi * k / count  # start above the anchor
            spots.append((ring * step * math.cos(angle), ring * step * math.sin(angle)))
    best, best_overlap = None, math.inf
    for dx, dy in spots:
        centre = (float(anchor[0]) + dx, float(anchor[1]) + dy)
        box = Bbox.from_bounds(centre[0] - width / 2, centre[1] - height / 2, width, height)
        if not _inside(box, frame):
            continue
        overlap = sum(_overlap_area(box, other) for other in taken)
        if overlap == 0:
            return centre
        if overlap < best_overlap:
            best, best_overlap = centre, overlap
    return best if best is not None else (float(anchor[0]), float(anchor[1]))


def _distance(box: Bbox, point: np.ndarray) -> float:
    """Distance from ``point`` to the nearest point of ``box`` (0 inside), display units."""
    dx = max(box.x0 - point[0], 0.0, point[0] - box.x1)
    dy = max(box.y0 - point[1], 0.0, point[1] - box.y1)
    return math.hypot(dx, dy)


def _inside(box: Bbox, frame: Bbox) -> bool:
    return frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1


def _overlap_area(a: Bbox, b: Bbox) -> float:
    width = min(a.x1, b.x1) - max(a.x0, b.x0)
    height = min(a.y1, b.y1) - max(a.y0, b.y0)
    return width * height if width > 0 and height > 0 else 0.0


def _grown(box: Bbox, margin: float) -> Bbox:
    return Bbox.from_extents(box.x0 - margin, box.y0 - margin, box.x1 + margin, box.y1 + margin)

"""Probability-mass contours of attention heads (the paper's Gaussian figure).

A head's ``m``-mass region for a query is the smallest set of key tokens, taken in decreasing order
of probability, that holds at least a fraction ``m`` of the attention (ties at the threshold are all
included, so the region is well defined). The figure draws each region's outline along token
edges, so what is drawn is exactly the region: for a hard head (all mass on one token) the 50% and
90% contours are the outline of that one token. A diffuse head's regions spread over most of the
grid and their outlines would tile it, so the figure outlines only concentrated regions
(``is_concentrated``) and names the heads it leaves out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from matplotlib.axes import Axes
from matplotlib.collections import LineCollection
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from torch import Tensor

from attnconv.viz.labels import HeadAnchor, Panel, label_panels, query_marker
from attnconv.viz.maps import AttentionMaps, default_query, query_index
from attnconv.viz.style import (
    QUERY_MARKER,
    new_figure,
    palette_color,
    panel_axes,
    panel_grid,
    wrap_text,
)

MASSES: tuple[float, ...] = (0.5, 0.9)
LINESTYLES: tuple[str, ...] = ("solid", "dashed", "dotted", "dashdot")
# A head's m-region is outlined only if it covers at most this fraction of the m·N tokens that
# uniform attention spreads the mass m over (``is_concentrated``): diffuse heads would tile the grid.
MAX_AREA = 0.25
# Relative slack when comparing cumulative sums with the target mass (float rounding).
_MASS_RTOL = 1e-6


def mass_threshold(values: Tensor | np.ndarray, mass: float) -> float:
    """Smallest value ``t`` such that the entries ``≥ t`` hold at least ``mass`` of the total.

    ``values`` are non-negative (any shape); ``0 < mass ≤ 1``.
    """
    if not 0.0 < mass <= 1.0:
        raise ValueError(f"mass must be in (0, 1], got {mass}")
    flat = _as_array(values).ravel()
    if flat.size == 0 or (flat < 0).any() or not np.isfinite(flat).all():
        raise ValueError("values must be a non-empty array of finite non-negative numbers")
    total = flat.sum()
    if total <= 0:
        raise ValueError("values sum to zero: no mass to enclose")
    ordered = np.sort(flat)[::-1]
    cumulative = np.cumsum(ordered)
    index = int(np.searchsorted(cumulative, mass * total * (1 - _MASS_RTOL)))
    return float(ordered[min(index, ordered.size - 1)])


def mass_region(values: Tensor | np.ndarray, mass: float) -> np.ndarray:
    """Boolean mask of the ``mass`` region of ``values`` (shape of ``values``)."""
    array = _as_array(values)
    return array >= mass_threshold(array, mass)


def region_outline(mask: np.ndarray) -> np.ndarray:
    """Boundary of a boolean ``(h, w)`` mask along pixel edges.

    Returns segments ``(S, 2, 2)`` as ``[[x0, y0], [x1, y1]]`` in image coordinates (``x`` = column,
    ``y`` = row, pixel ``(r, c)`` covers ``[c − ½, c + ½] × [r − ½, r + ½]``), one per unit edge
    between a pixel inside the mask and one outside it (or the grid border).
    """
    mask = np.asarray(mask, dtype=bool)
    if mask.ndim != 2:
        raise ValueError(f"mask must be 2-D (h, w), got shape {mask.shape}")
    padded = np.pad(mask, 1)
    segments = []
    # Horizontal edges: between rows r−1 and r (padded rows r and r+1), at y = r − ½.
    rows, cols = np.nonzero(padded[:-1, 1:-1] != padded[1:, 1:-1])
    segments += [((c - 0.5, r - 0.5), (c + 0.5, r - 0.5)) for r, c in zip(rows, cols, strict=True)]
    # Vertical edges: between columns c−1 and c, at x = c − ½.
    rows, cols = np.nonzero(padded[1:-1, :-1] != padded[1:-1, 1:])
    segments += [((c - 0.5, r - 0.5), (c - 0.5, r + 0.5)) for r, c in zip(rows, cols, strict=True)]
    return np.array(segments, dtype=np.float64).reshape(-1, 2, 2)


def is_concentrated(region: np.ndarray, mass: float, max_area: float) -> bool:
    """Whether a ``mass`` region (boolean mask over the ``N`` key tokens) is worth outlining: it
    covers at most ``max_area · mass · N`` tokens, a ``max_area`` fraction of the tokens that
    uniform attention spreads that mass over."""
    return int(np.count_nonzero(region)) <= max_area * mass * region.size


def contour_figure(
    maps: AttentionMaps,
    query: tuple[int, int] | None = None,
    masses: Sequence[float] = MASSES,
    title: str | None = None,
    max_area: float = MAX_AREA,
) -> Figure:
    """One panel per layer (``style.panel_grid``): every head's mass contours around ``query`` on
    the token grid.

    Head ``h`` is drawn in ``palette_color(h)``; the i-th mass uses line style ``LINESTYLES[i]``.
    A diffuse head would outline most of the grid, so a head's ``m``-region is drawn only when it
    is concentrated (``is_concentrated`` with ``max_area``; 1 draws every region); each panel's
    title lists the heads with no region drawn, and the figure says the rule. Every drawn head's
    number (``labels.place_head_labels``) sits at the probability-weighted centre of its smallest
    drawn region, or near it without covering another number or the query token's marker (a black
    X). Each outline is a ``LineCollection`` with gid ``"layer{l}-head{h}-mass{m}"``.
    """
    query = default_query(maps.grid) if query is None else tuple(int(v) for v in query)
    query_index(query, maps.grid)
    if not 1 <= len(masses) <= len(LINESTYLES):
        raise ValueError(f"give 1 to {len(LINESTYLES)} masses, got {list(masses)}")
    if not 0 < max_area <= 1 / min(masses):
        raise ValueError(f"max_area must be in (0, {1 / min(masses):g}], got {max_area}")
    per_layer = maps.query_maps(query)
    h, w = maps.grid
    rows, columns = panel_grid(len(per_layer))
    fig = new_figure(3.4 * columns, 3.6 * rows + 1.2)
    axes = panel_axes(fig, len(per_layer))
    anchors: list[list[HeadAnchor]] = []
    for layer, layer_maps in enumerate(per_layer):
        ax = axes[layer]
        layer_anchors, diffuse, _ = draw_head_contours(  # every map of a layer holds mass
            ax, layer_maps, query, masses, max_area, f"layer{layer}-"
        )
        anchors.append(layer_anchors)
        panel = f"layer {layer}"
        if diffuse:
            panel += f"\nnot drawn (diffuse): {_heads_text(diffuse)}"
        ax.set_title(panel, fontsize=9)
        ax.set_xlabel("column (token)", fontsize=8)
        ax.set_ylabel("row (token)", fontsize=8)
    handles = legend_handles(max(m.shape[0] for m in per_layer), masses, "query token")
    fig.legend(
        handles=handles,
        loc="outside lower center",
        ncol=min(len(handles), 6),
        fontsize=8,
        frameon=False,
    )
    heading = title or f"Attention mass contours for query token {query} ({maps.description})"
    fig.suptitle(
        heading + "\n" + wrap_text(_rule_text(masses, max_area, h * w), fig, 10),
        fontsize=10,
    )
    marker = query_marker(query[1], query[0])
    label_panels(
        fig,
        [
            Panel(ax, layer_anchors, f"layer{layer}-", [marker])
            for layer, (ax, layer_anchors) in enumerate(zip(axes, anchors, strict=True))
        ],
    )
    return fig


def draw_head_contours(
    ax: Axes,
    layer_maps: Tensor,
    query: tuple[float, float],
    masses: Sequence[float] = MASSES,
    max_area: float = MAX_AREA,
    gid_prefix: str = "",
) -> tuple[list[HeadAnchor], list[int], list[int]]:
    """Onto ``ax``: the thin grid of the ``(heads, h, w)`` maps' pixels, the query marker at
    ``query = (row, col)`` and every head's concentrated ``masses`` regions outlined (head ``h``
    in ``palette_color(h)``, the i-th mass in ``LINESTYLES[i]``; gid
    ``"{gid_prefix}head{h}-mass{m}"``), limits on the grid. Returns the anchors of the drawn heads'
    numbers (at each one's peak), the heads left out as diffuse and those left out because their
    map holds no mass (a transformed layer's head whose attention is all on the padding)."""
    h, w = layer_maps.shape[1:]
    ax.add_collection(token_grid_lines(h, w))
    ax.plot(query[1], query[0], zorder=7, **QUERY_MARKER)
    anchors, diffuse, empty = [], [], []
    for head in range(layer_maps.shape[0]):
        values = _as_array(layer_maps[head])
        if not values.sum() > 0:
            empty.append(head)
            continue
        color = palette_color(head)
        drawn = []
        for mass, style in zip(masses, LINESTYLES, strict=False):
            region = mass_region(values, mass)
            if not is_concentrated(region, mass, max_area):
                continue
            lines = LineCollection(
                region_outline(region),
                colors=color,
                linestyles=style,
                linewidths=2.0 if mass == masses[0] else 1.3,
                zorder=4,
            )
            lines.set_gid(f"{gid_prefix}head{head}-mass{mass:g}")
            ax.add_collection(lines)
            drawn.append(region)
        if not drawn:
            diffuse.append(head)
            continue
        peak = np.unravel_index(np.argmax(values), values.shape)
        anchors.append(HeadAnchor(head, float(peak[1]), float(peak[0])))
    ax.set_xlim(-0.5, w - 0.5)
    ax.set_ylim(h - 0.5, -0.5)
    ax.set_aspect("equal")
    ax.tick_params(labelsize=7)
    return anchors, diffuse, empty


def legend_handles(heads: int, masses: Sequence[float], query: str) -> list[Line2D]:
    """The legend of a contour figure: a line per head colour, one per mass's line style, and the
    query marker (labelled ``query``)."""
    handles = [
        Line2D([], [], color=palette_color(k), linewidth=2, label=f"head {k}") for k in range(heads)
    ]
    handles += [
        Line2D([], [], color="0.3", linestyle=style, label=f"{mass:.0%} of the mass")
        for mass, style in zip(masses, LINESTYLES, strict=False)
    ]
    handles.append(Line2D([], [], label=query, **QUERY_MARKER))
    return handles


def token_grid_lines(h: int, w: int) -> LineCollection:
    """Thin light lines along the token edges of an ``h × w`` grid (one collection: cheaper to
    lay out than a tick per edge)."""
    rows = [((-0.5, r - 0.5), (w - 0.5, r - 0.5)) for r in range(h + 1)]
    cols = [((c - 0.5, -0.5), (c - 0.5, h - 0.5)) for c in range(w + 1)]
    lines = LineCollection(rows + cols, colors="0.9", linewidths=0.5, zorder=0)
    lines.set_gid("token-grid")
    return lines


def _rule_text(masses: Sequence[float], max_area: float, tokens: int) -> str:
    """The figure's statement of which regions are drawn."""
    sizes = ", ".join(f"{math.floor(max_area * m * tokens)} for {m:.0%}" for m in masses)
    return (
        f"Only concentrated regions are outlined: at most {max_area:.0%} of the tokens uniform "
        f"attention spreads that mass over ({sizes}, of {tokens} tokens)."
    )


def _heads_text(heads: Sequence[int]) -> str:
    """``"head 3"``, ``"heads 0, 2–5, 8"``: runs of consecutive heads as ranges."""
    runs: list[list[int]] = []
    for head in heads:
        if runs and head == runs[-1][-1] + 1:
            runs[-1].append(head)
        else:
            runs.append([head])
    parts = [str(r[0]) if len(r) == 1 else f"{r[0]}\u2013{r[-1]}" for r in runs]
    return ("head " if len(heads) == 1 else "heads ") + ", ".join(parts)


def _as_array(values: Tensor | np.ndarray) -> np.ndarray:
    if isinstance(values, Tensor):
        return values.detach().double().cpu().numpy()
    return np.asarray(values, dtype=np.float64)

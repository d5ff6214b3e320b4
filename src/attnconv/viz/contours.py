"""Probability-mass contours of attention heads (the paper's Gaussian figure).

A head's ``m``-mass region for a query is the smallest set of key tokens, taken in decreasing order
of probability, that holds at least a fraction ``m`` of the attention (ties at the threshold are all
included, so the region is well defined). The figure draws each region's outline along token
edges, so what is drawn is exactly the region: for a hard head (all mass on one token) the 50% and
90% contours are the outline of that one token. A contour shows a head well when its region is
one compact spot. A diffuse head's regions spread over most of the grid and their outlines would
tile it; a head that attends to several separate spots (a lattice, rows and columns) has regions
in pieces whose outlines, with those of the other heads, pile into a lattice no one can read. So
the figure outlines only regions that are concentrated (``is_concentrated``) and in one piece
(``is_one_piece``), names the heads it leaves out and why, and points to the maps, which show
them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from matplotlib.axes import Axes
from matplotlib.collections import LineCollection
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from scipy import ndimage
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
# Width of a legend entry in inches ("50% of the mass" at 8 points, its line and the gap):
# the legend takes as many columns as fit the figure's width.
LEGEND_ENTRY_WIDTH = 1.3
# Why a head's contours are not drawn (``head_regions``), as the panels name it.
DIFFUSE = "diffuse"
SCATTERED = "several spots"
NO_MASS = "all on the padding"


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
    """Whether a ``mass`` region (boolean mask over the ``N`` key tokens) is small enough to
    outline: it covers at most ``max_area · mass · N`` tokens, a ``max_area`` fraction of the
    tokens that uniform attention spreads that mass over."""
    return int(np.count_nonzero(region)) <= max_area * mass * region.size


def is_one_piece(region: np.ndarray) -> bool:
    """Whether the tokens of a boolean ``(h, w)`` region form one piece, each touching another
    at an edge or a corner (8-connected)."""
    return ndimage.label(region, structure=np.ones((3, 3)))[1] == 1


def head_regions(
    values: Tensor | np.ndarray, masses: Sequence[float], max_area: float
) -> tuple[list[tuple[float, np.ndarray]], str | None]:
    """The regions of one head's ``(h, w)`` map worth outlining, ``(mass, region)`` for each of
    ``masses`` whose region is concentrated (``max_area``) and in one piece, and, when there are
    none, why: ``NO_MASS`` (the map holds no mass), ``SCATTERED`` (some region is concentrated,
    but in pieces: several spots, a lattice) or ``DIFFUSE``."""
    values = _as_array(values)
    if not values.sum() > 0:
        return [], NO_MASS
    concentrated = [
        (mass, region)
        for mass in masses
        if is_concentrated(region := mass_region(values, mass), mass, max_area)
    ]
    drawn = [(mass, region) for mass, region in concentrated if is_one_piece(region)]
    if drawn:
        return drawn, None
    return [], SCATTERED if concentrated else DIFFUSE


def outlined_heads(
    maps: AttentionMaps,
    query: tuple[int, int] | None = None,
    masses: Sequence[float] = MASSES,
    max_area: float = MAX_AREA,
) -> int:
    """How many heads, over all layers, ``contour_figure`` outlines for ``query`` (0: its panels
    would be empty)."""
    query = default_query(maps.grid) if query is None else tuple(int(v) for v in query)
    query_index(query, maps.grid)
    return sum(
        head_regions(layer_maps[head], masses, max_area)[1] is None
        for layer_maps in maps.query_maps(query)
        for head in range(layer_maps.shape[0])
    )


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
    A head's ``m``-region is drawn only when a contour shows it well (``head_regions``):
    concentrated (``is_concentrated`` with ``max_area``; 1 / min(masses) lets every size through)
    and in one piece (``is_one_piece``). Each panel's title lists the heads with no region drawn
    and why (diffuse, in several spots), and the figure says how many heads it outlines, the rule
    and that the maps show the others (a model whose heads spread wide, as most content models'
    do, gets a figure with few outlines that says why). Every drawn head's number (``labels.place_head_labels``) sits at the peak of its
    map, or near it without covering another number or the query token's marker (a black X).
    Each outline is a ``LineCollection`` with gid ``"layer{l}-head{h}-mass{m}"``.
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
    left_out = 0
    for layer, layer_maps in enumerate(per_layer):
        ax = axes[layer]
        layer_anchors, not_drawn = draw_head_contours(
            ax, layer_maps, query, masses, max_area, f"layer{layer}-"
        )
        anchors.append(layer_anchors)
        left_out += sum(len(heads) for heads in not_drawn.values())
        ax.set_title("\n".join([f"layer {layer}", *not_drawn_lines(not_drawn)]), fontsize=9)
        ax.set_xlabel("column (token)", fontsize=8)
        ax.set_ylabel("row (token)", fontsize=8)
    handles = legend_handles(masses, "query token")
    fig.legend(
        handles=handles,
        loc="outside lower center",
        ncol=min(len(handles), max(1, int(fig.get_figwidth() / LEGEND_ENTRY_WIDTH))),
        fontsize=8,
        frameon=False,
    )
    heading = title or f"Attention mass contours for query token {query} ({maps.description})"
    rule = rule_text(masses, max_area, "tokens", h * w)
    heads = sum(layer_maps.shape[0] for layer_maps in per_layer)
    outlined = f"{heads - left_out} of {heads} heads are outlined; the maps show the others."
    fig.suptitle(wrap_text(f"{heading}\n{rule} {outlined}", fig, 10), fontsize=10)
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
) -> tuple[list[HeadAnchor], dict[str, list[int]]]:
    """Onto ``ax``: the thin grid of the ``(heads, h, w)`` maps' pixels, the query marker at
    ``query = (row, col)`` and the regions of every head that ``head_regions`` keeps outlined
    (head ``h`` in ``palette_color(h)``, the i-th mass in ``LINESTYLES[i]``; gid
    ``"{gid_prefix}head{h}-mass{m}"``), limits on the grid. Returns the anchors of the drawn heads'
    numbers (at each one's peak) and the heads left out by why (``DIFFUSE``, ``SCATTERED``,
    ``NO_MASS``: a transformed layer's head whose attention is all on the padding), in that order,
    only the reasons that apply."""
    h, w = layer_maps.shape[1:]
    ax.add_collection(token_grid_lines(h, w))
    ax.plot(query[1], query[0], zorder=7, **QUERY_MARKER)
    styles = dict(zip(masses, LINESTYLES, strict=False))
    anchors: list[HeadAnchor] = []
    not_drawn: dict[str, list[int]] = {DIFFUSE: [], SCATTERED: [], NO_MASS: []}
    for head in range(layer_maps.shape[0]):
        values = _as_array(layer_maps[head])
        drawn, why = head_regions(values, masses, max_area)
        if why is not None:
            not_drawn[why].append(head)
            continue
        for mass, region in drawn:
            lines = LineCollection(
                region_outline(region),
                colors=palette_color(head),
                linestyles=styles[mass],
                linewidths=2.0 if mass == masses[0] else 1.3,
                zorder=4,
            )
            lines.set_gid(f"{gid_prefix}head{head}-mass{mass:g}")
            ax.add_collection(lines)
        peak = np.unravel_index(np.argmax(values), values.shape)
        anchors.append(HeadAnchor(head, float(peak[1]), float(peak[0])))
    ax.set_xlim(-0.5, w - 0.5)
    ax.set_ylim(h - 0.5, -0.5)
    ax.set_aspect("equal")
    ax.tick_params(labelsize=7)
    return anchors, {why: heads for why, heads in not_drawn.items() if heads}


def not_drawn_lines(not_drawn: dict[str, list[int]]) -> list[str]:
    """A panel title's lines naming the heads ``draw_head_contours`` left out, one per reason:
    ``"not drawn (diffuse): heads 0, 2–5"``."""
    return [f"not drawn ({why}): {_heads_text(heads)}" for why, heads in not_drawn.items()]


def legend_handles(masses: Sequence[float], query: str) -> list[Line2D]:
    """The legend of a contour figure: one line per mass's line style and the query marker
    (labelled ``query``). Heads need no entry: each drawn head's number sits on its panel in a
    box of its colour."""
    handles = [
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


def rule_text(
    masses: Sequence[float], max_area: float, unit: str, tokens: int | None = None
) -> str:
    """A contour figure's statement of which regions it outlines, on grids of ``unit``
    (``"tokens"``, ``"pixels"``): with ``tokens``, the largest region of each mass on that
    many."""
    sizes = ""
    if tokens is not None:
        each = ", ".join(f"{math.floor(max_area * m * tokens)} for {m:.0%}" for m in masses)
        sizes = f" ({each}, of {tokens} {unit})"
    return (
        f"Outlined: regions in one piece ({unit} touching at an edge or corner) and concentrated, "
        f"at most {max_area:.0%} of the {unit} uniform attention spreads that mass over{sizes}. "
        "Heads left out (diffuse, several spots) are named under each panel's title."
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

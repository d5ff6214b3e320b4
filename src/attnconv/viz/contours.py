"""Probability-mass contours of attention heads (the paper's Gaussian figure).

A head's ``m``-mass region for a query is the smallest set of key tokens, taken in decreasing order
of probability, that holds at least a fraction ``m`` of the attention (ties at the threshold are all
included, so the region is well defined). The figure draws each region's outline along token
edges, so what is drawn is exactly the region: for a hard head (all mass on one token) the 50% and
90% contours are the outline of that one token.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from matplotlib.collections import LineCollection
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle
from torch import Tensor

from attnconv.viz.maps import AttentionMaps, default_query, query_index
from attnconv.viz.style import QUERY_COLOR, new_figure, palette_color

MASSES: tuple[float, ...] = (0.5, 0.9)
LINESTYLES: tuple[str, ...] = ("solid", "dashed", "dotted", "dashdot")
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


def contour_figure(
    maps: AttentionMaps,
    query: tuple[int, int] | None = None,
    masses: Sequence[float] = MASSES,
    title: str | None = None,
) -> Figure:
    """One panel per layer: every head's mass contours around ``query`` on the token grid.

    Head ``h`` is drawn in ``palette_color(h)`` with its number written at the centre of mass of its
    attention (``_label_heads``); the i-th mass uses line style ``LINESTYLES[i]``; the query token is
    a black square. Each outline is a ``LineCollection`` with gid ``"layer{l}-head{h}-mass{m}"``.
    """
    query = default_query(maps.grid) if query is None else tuple(int(v) for v in query)
    query_index(query, maps.grid)
    if not 1 <= len(masses) <= len(LINESTYLES):
        raise ValueError(f"give 1 to {len(LINESTYLES)} masses, got {list(masses)}")
    per_layer = maps.query_maps(query)
    h, w = maps.grid
    columns = min(len(per_layer), 3)
    rows = -(-len(per_layer) // columns)
    fig = new_figure(3.6 * columns, 3.6 * rows + 0.9)
    axes = fig.subplots(rows, columns, squeeze=False).ravel()
    rr, cc = np.mgrid[0:h, 0:w]
    for layer, layer_maps in enumerate(per_layer):
        ax = axes[layer]
        ax.set_xticks(np.arange(-0.5, w, 1), minor=True)
        ax.set_yticks(np.arange(-0.5, h, 1), minor=True)
        ax.grid(which="minor", color="0.9", linewidth=0.5)
        ax.tick_params(which="minor", length=0)
        ax.add_patch(Rectangle((query[1] - 0.5, query[0] - 0.5), 1, 1, color=QUERY_COLOR, zorder=3))
        centres = []  # (x, y) centre of mass of each head's attention
        for head in range(layer_maps.shape[0]):
            values = _as_array(layer_maps[head])
            color = palette_color(head)
            for mass, style in zip(masses, LINESTYLES, strict=False):
                lines = LineCollection(
                    region_outline(mass_region(values, mass)),
                    colors=color,
                    linestyles=style,
                    linewidths=2.0 if mass == masses[0] else 1.3,
                    zorder=4,
                )
                lines.set_gid(f"layer{layer}-head{head}-mass{mass:g}")
                ax.add_collection(lines)
            weight = values / values.sum()
            centres.append(((weight * cc).sum(), (weight * rr).sum()))
        _label_heads(ax, layer, centres)
        ax.set_xlim(-0.5, w - 0.5)
        ax.set_ylim(h - 0.5, -0.5)
        ax.set_aspect("equal")
        ax.set_title(f"layer {layer}", fontsize=10)
        ax.set_xlabel("column (token)", fontsize=8)
        ax.set_ylabel("row (token)", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in axes[len(per_layer) :]:
        ax.set_axis_off()
    heads = max(m.shape[0] for m in per_layer)
    handles = [
        Line2D([], [], color=palette_color(k), linewidth=2, label=f"head {k}") for k in range(heads)
    ]
    handles += [
        Line2D([], [], color="0.3", linestyle=style, label=f"{mass:.0%} of the mass")
        for mass, style in zip(masses, LINESTYLES, strict=False)
    ]
    handles.append(
        Line2D([], [], color=QUERY_COLOR, marker="s", linestyle="none", label="query token")
    )
    fig.legend(
        handles=handles,
        loc="outside lower center",
        ncol=min(len(handles), 2 * columns + 1),
        fontsize=8,
        frameon=False,
    )
    fig.suptitle(
        title or f"Attention mass contours for query token {query} ({maps.description})",
        fontsize=11,
    )
    return fig


# Width of a head number in points: per digit (fontsize 8, bold), plus the gap between numbers.
_DIGIT_PT = 5.5
_GAP_PT = 3.0


def _label_heads(ax, layer: int, centres: list[tuple[float, float]]) -> None:
    """Write each head's number at the centre of mass ``(x, y)`` of its attention, as a text with gid
    ``"layer{l}-head{h}-label"``. Heads whose centres fall on the same token (the same tap) would
    print on top of each other: their numbers are set side by side, centred on their mean centre.
    """
    taps: dict[tuple[int, int], list[int]] = {}
    for head, (x, y) in enumerate(centres):
        taps.setdefault((int(np.floor(y + 0.5)), int(np.floor(x + 0.5))), []).append(head)
    for heads in taps.values():
        x = float(np.mean([centres[head][0] for head in heads]))
        y = float(np.mean([centres[head][1] for head in heads]))
        widths = [_DIGIT_PT * len(str(head)) + _GAP_PT for head in heads]
        left = -sum(widths) / 2
        for head, width in zip(heads, widths, strict=True):
            text = ax.annotate(
                str(head),
                xy=(x, y),
                xytext=(left + width / 2, 0),
                textcoords="offset points",
                color=palette_color(head),
                fontsize=8,
                fontweight="bold",
                ha="center",
                va="center",
                zorder=5,
                bbox={
                    "boxstyle": "round,pad=0.1",
                    "facecolor": "white",
                    "alpha": 0.7,
                    "linewidth": 0,
                },
            )
            text.set_gid(f"layer{layer}-head{head}-label")
            left += width


def _as_array(values: Tensor | np.ndarray) -> np.ndarray:
    if isinstance(values, Tensor):
        return values.detach().double().cpu().numpy()
    return np.asarray(values, dtype=np.float64)

r"""Attention distance: how far from the query a head looks (the locality measure of ConViT).

For a head with probabilities $P_{q,k}$ the distance of query $q$ is
$\sum_k P_{q,k} \lVert k - q \rVert$ (Euclidean, in tokens of the grid the layer sees); a head's
attention distance is its mean over all queries. A convolution-like head attending to the token at
offset $\Delta$ has distance $\lVert \Delta \rVert$ away from the borders.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from matplotlib.figure import Figure
from torch import Tensor

from attnconv.viz.maps import AttentionMaps
from attnconv.viz.style import new_figure, palette_color


def pairwise_distances(grid: tuple[int, int], dtype: torch.dtype = torch.float64) -> Tensor:
    r"""``(N, N)`` Euclidean distances $\lVert k - q \rVert$ between the tokens of
    ``grid = (h, w)``."""
    h, w = grid
    rows = torch.arange(h, dtype=dtype).repeat_interleave(w)
    cols = torch.arange(w, dtype=dtype).repeat(h)
    return torch.hypot(rows[:, None] - rows[None, :], cols[:, None] - cols[None, :])


def distance_map(probs: Tensor, grid: tuple[int, int]) -> Tensor:
    """Expected distance to the attended token for every query: ``(heads, N, N)`` → ``(heads, h, w)``."""
    n = grid[0] * grid[1]
    if probs.dim() != 3 or probs.shape[1:] != (n, n):
        raise ValueError(
            f"probs must be (heads, {n}, {n}) for a {grid[0]}x{grid[1]} grid, "
            f"got shape {tuple(probs.shape)}"
        )
    expected = (probs.double().cpu() * pairwise_distances(grid)).sum(dim=-1)
    return expected.reshape(probs.shape[0], *grid)


def attention_distance(probs: Tensor, grid: tuple[int, int]) -> Tensor:
    """Mean over queries of the expected distance, per head: ``(heads, N, N)`` → ``(heads,)`` tokens."""
    return distance_map(probs, grid).flatten(1).mean(dim=1)


def layer_distances(maps: AttentionMaps) -> list[Tensor]:
    """Attention distance of every head of every layer: one ``(heads,)`` tensor per layer."""
    return [attention_distance(p, maps.grid) for p in maps.probs]


def add_distances(rows: list[dict[str, Any]], distances: Sequence[Tensor]) -> list[dict[str, Any]]:
    """Rows of a head table (keys ``layer``, ``head``) with ``attention_distance`` filled in.

    ``rows=[]`` gives one row per head holding only ``layer``, ``head`` and the distance.
    """
    if not rows:
        rows = [
            {"layer": layer, "head": head}
            for layer, d in enumerate(distances)
            for head in range(d.shape[0])
        ]
    return [
        {**row, "attention_distance": float(distances[row["layer"]][row["head"]])} for row in rows
    ]


HEAD_COLUMNS: dict[str, tuple[str, str]] = {
    "layer": ("layer", "{:d}"),
    "head": ("head", "{:d}"),
    "center_row": ("center_row", "{:.3f}"),
    "center_col": ("center_col", "{:.3f}"),
    "spread": ("spread", "{:.4f}"),
    "condition_number": ("condition", "{:.3g}"),
    "degenerate": ("degenerate", "{}"),
    "attention_distance": ("distance", "{:.3f}"),
}


def format_head_table(rows: Sequence[dict[str, Any]]) -> str:
    """The head table as right-aligned text, one line per head, with the ``HEAD_COLUMNS``
    present in ``rows`` (``distance`` is the attention distance in tokens)."""
    if not rows:
        raise ValueError("no heads to tabulate")
    keys = [key for key in HEAD_COLUMNS if key in rows[0]]
    headers = [HEAD_COLUMNS[key][0] for key in keys]
    cells = [[HEAD_COLUMNS[key][1].format(_value(row[key])) for key in keys] for row in rows]
    widths = [max(len(headers[i]), *(len(line[i]) for line in cells)) for i in range(len(keys))]
    return "\n".join(
        " ".join(text.rjust(width) for text, width in zip(line, widths, strict=True))
        for line in [headers, *cells]
    )


def _value(value: Any) -> Any:
    return ("yes" if value else "no") if isinstance(value, bool) else value


def uniform_distance(grid: tuple[int, int]) -> float:
    """Attention distance (tokens) of a head that attends uniformly over ``grid = (h, w)``: the
    mean distance between two tokens, 7.28 on 14×14. Heads near it look everywhere alike."""
    return float(pairwise_distances(grid).mean())


def _draw_distances(
    ax: Any,
    distances: Sequence[Tensor],
    grid: tuple[int, int] | None,
    top: float,
    join_means: bool = True,
) -> None:
    """Onto ``ax``: a dot per head (in its colour) at its layer, the layer means as a black line
    (``join_means``; else as a black dash per layer, for layers whose distances are in different
    units), the uniform distance of ``grid`` dashed (when given); y from 0 to ``top``."""
    layers = np.arange(len(distances))
    offsets = np.linspace(-0.25, 0.25, max(d.shape[0] for d in distances))
    labelled: set[int] = set()
    for layer, d in enumerate(distances):
        for head, value in enumerate(d.tolist()):
            ax.scatter(
                layer + offsets[head],
                value,
                color=palette_color(head),
                s=28,
                edgecolors="black",
                linewidths=0.4,
                zorder=3,
                label=None if head in labelled else f"head {head}",
            )
            labelled.add(head)
    ax.plot(
        layers,
        [float(d.mean()) for d in distances],
        color="black",
        marker="_",
        markersize=16,
        linewidth=1,
        linestyle="-" if join_means else "none",
        label="layer mean",
        zorder=2,
    )
    if grid is not None:
        uniform = uniform_distance(grid)
        line = ax.axhline(
            uniform,
            color="0.35",
            linestyle="--",
            linewidth=1,
            zorder=1,
            label=f"uniform attention ({uniform:.2f} on {grid[0]}×{grid[1]})",
        )
        line.set_gid("uniform")
    ax.set_xticks(layers)
    ax.set_xlim(-0.5, len(distances) - 0.5)
    ax.set_xlabel("layer")
    ax.set_ylim(0, top)
    ax.grid(axis="y", color="0.9")


def _top(distances: Sequence[Tensor], grid: tuple[int, int] | None) -> float:
    """The y limit: room above the highest dot (a marker is about 0.04 of the axes tall) and the
    uniform line."""
    top = max(float(d.max()) for d in distances)
    if grid is not None:
        top = max(top, uniform_distance(grid))
    return top * 1.1 if top > 0 else 1.0


def distance_figure(
    distances: Sequence[Tensor],
    stem: int = 1,
    title: str | None = None,
    grid: tuple[int, int] | None = None,
) -> Figure:
    """Attention distance of each head (a dot in its colour) against the layer, with the mean of
    each layer as a black line. ``grid`` (the token grid) adds a dashed line at the distance of
    uniform attention (``uniform_distance``). ``stem`` > 1 adds a right axis in input pixels.
    Every dot lies inside the axes; the title may have several lines."""
    fig = new_figure(6.4, 4.8)
    ax = fig.subplots()
    _draw_distances(ax, distances, grid, _top(distances, grid))
    ax.set_ylabel("attention distance (tokens)")
    if stem > 1:
        secondary = ax.secondary_yaxis("right", functions=(lambda d: d * stem, lambda p: p / stem))
        secondary.set_ylabel("input pixels")
    fig.legend(fontsize=7, loc="outside lower center", ncol=6, frameon=False)
    fig.suptitle(title or "Mean distance between query and attended tokens, per head", fontsize=10)
    return fig


def distance_comparison_figure(
    models: dict[str, Sequence[Tensor]],
    grid: tuple[int, int] | Mapping[str, tuple[int, int]] | None = None,
    title: str | None = None,
) -> Figure:
    """Attention distance by depth of several models side by side, one panel per model (named by
    its key) on one y scale in tokens: each model's per-layer ``(heads,)`` distances drawn as
    ``distance_figure`` draws them. ``grid``: the token grid the models share, or each model's
    (keyed as ``models``, for models of different image sizes side by side), whose uniform
    distance each panel draws dashed; the legend names every grid's line once."""
    if not models:
        raise ValueError("distance_comparison_figure needs at least one model")
    grids = dict(grid) if isinstance(grid, Mapping) else dict.fromkeys(models, grid)
    if set(grids) != set(models):
        raise ValueError(
            f"grid must give one token grid per model: models {sorted(models)}, grids "
            f"{sorted(grids)}"
        )
    top = max(_top(distances, grids[name]) for name, distances in models.items())
    # one panel: as wide as distance_figure
    fig = new_figure(max(2.2 + 2.6 * len(models), 6.4), 4.2)
    axes = fig.subplots(1, len(models), sharey=True, squeeze=False)[0]
    for ax, (name, distances) in zip(axes, models.items(), strict=True):
        _draw_distances(ax, distances, grids[name], top)
        ax.set_title(name, fontsize=9)
    axes[0].set_ylabel("attention distance (tokens)")
    legend: dict[str, Any] = {}  # label: handle, the first panel's of each label
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            legend.setdefault(label, handle)
    fig.legend(
        list(legend.values()), list(legend), fontsize=7, loc="outside lower center", ncol=6,
        frameon=False,
    )  # fmt: skip
    fig.suptitle(
        title or "Attention distance per head and layer (one dot per head, mean as a line)",
        fontsize=10,
    )
    return fig

"""Figures of the attention rollout and of the class token's attention, drawn over the image
(``attnconv.analysis.rollout`` computes both).

Each map is one value per patch, drawn as a block of ``stem × stem`` pixels over the image in
grey, so that a reader sees where on the image the weight lies. All the maps of a figure share
one colour scale, from 0 to the largest value among them but at least ``maps.FLOOR/N`` (``N``
patches), with the uniform level ``1/N`` marked on the colour bar: maps that are all near-uniform
(random weights, early layers) stay in the scale's lower colours instead of taking its brightest
ones.
"""

from __future__ import annotations

from collections.abc import Sequence

from matplotlib.figure import Figure
from torch import Tensor

from attnconv.viz.maps import _colorbar, label_peak, outline_token, scale_top
from attnconv.viz.style import MAP_CMAP, new_figure, panel_grid, wrap_text

# Opacity of a map drawn over its image.
OVERLAY_ALPHA = 0.65
# What a rollout map's colours are: a row of a product of row-stochastic matrices, each entry the
# share of the token's output that traces back to a patch (not one layer's attention probability).
ROLLOUT_LABEL = "share of the token's rollout row (all maps)"


def rollout_rows(
    rollout: Tensor, prefix: int, grid: tuple[int, int], query: int | None = None
) -> tuple[Tensor, float]:
    """The rollout map of one token: ``rollout (T, T)``'s row of the class token (``query``
    None; token 0) or of patch ``query`` (row-major index among the ``N = h·w`` patches), at the
    patch columns, renormalised to sum to one; ``(h, w)`` and the share of the row the patches
    held before renormalising (the rest stays with the prefix tokens, the class token mostly
    with itself)."""
    row = rollout[0 if query is None else prefix + query].double()
    patches = row[prefix:]
    share = float(patches.sum())
    return (patches / share).reshape(grid).float(), share


def _gray(image: Tensor):
    """``(C, H, W)`` in ``[0, 1]`` as an ``(H, W)`` grey image (luminance for colour images)."""
    pixels = image.detach().float().cpu().clamp(0, 1)
    if pixels.shape[0] == 3:
        weights = pixels.new_tensor([0.2126, 0.7152, 0.0722]).view(3, 1, 1)
        return (pixels * weights).sum(dim=0).numpy()
    return pixels.mean(dim=0).numpy()


def draw_overlay(
    ax,
    values: Tensor,
    image: Tensor | None,
    stem: int,
    vmax: float,
    tokens: int,
    query: tuple[int, int] | None = None,
) -> None:
    """Map ``values (h, w)`` on ``ax`` over ``image (C, h·stem, w·stem)`` in grey (or alone),
    colours from 0 to ``vmax``, its maximum printed under it as a multiple of ``1/tokens``; with
    ``query``, that patch is outlined and left out of the maximum."""
    h, w = values.shape
    extent = (-0.5, w * stem - 0.5, h * stem - 0.5, -0.5)  # pixel edges, rows downwards
    if image is not None:
        ax.imshow(_gray(image), cmap="gray", vmin=0, vmax=1, extent=extent, interpolation="nearest")
    ax.imshow(
        values.numpy(),
        cmap=MAP_CMAP,
        vmin=0.0,
        vmax=vmax,
        extent=extent,
        interpolation="nearest",
        alpha=OVERLAY_ALPHA if image is not None else 1.0,
    )
    others = values if query is None else _without(values, query)
    peak = float(others.max())
    if query is not None:
        outline_token(ax, query, stem, "white", 1.2)
    label_peak(ax, "max" if query is None else "max elsewhere", peak, tokens)
    ax.set_xticks([])
    ax.set_yticks([])


def _without(values: Tensor, query: tuple[int, int]) -> Tensor:
    """``values (h, w)`` with the query patch set to 0."""
    others = values.clone()
    others[query] = 0
    return others


def colour_top(maps: Sequence[Tensor], query: tuple[int, int] | None = None) -> float:
    """The top of the shared colour scale of ``maps`` (each ``(h, w)``): their largest value
    (outside the ``query`` patch, which the residual makes the largest of a patch's rollout), at
    least ``maps.FLOOR / N`` (``maps.scale_top``)."""
    if query is not None:
        maps = [_without(m, query) for m in maps]
    return scale_top(max(float(m.max()) for m in maps), maps[0].numel())


def rollout_figure(
    maps: Sequence[Tensor],
    images: Sequence[Tensor | None],
    captions: Sequence[str],
    stem: int,
    title: str,
    query: tuple[int, int] | None = None,
) -> Figure:
    """One panel per rollout map ``(h, w)`` (``rollout_rows``), each over its image ``(C, H, W)``
    (None: the map alone, e.g. the mean over images), with its caption as the panel's title; one
    colour scale for all of them (module docstring), its bar labelled ``ROLLOUT_LABEL``, and
    ``title`` above, wrapped to the width.
    ``query``: the patch whose rollout the maps are, outlined and left out of the colour scale
    (its own share, mostly the residual's, would make every other patch dark)"""
    if not maps or not len(maps) == len(images) == len(captions):
        raise ValueError(f"need as many images and captions as maps, got {len(maps)} maps")
    rows, columns = panel_grid(len(maps))
    fig = new_figure(2.2 * columns + 1.4, 2.6 * rows + 1.2)
    fig.get_layout_engine().set(hspace=0.06)  # a panel's "max" line apart from the next title
    axes = list(fig.subplots(rows, columns, squeeze=False).ravel())
    for ax in axes[len(maps) :]:
        fig.delaxes(ax)
    vmax = colour_top(maps, query)
    tokens = maps[0].numel()
    for ax, values, image, caption in zip(axes, maps, images, captions, strict=False):
        draw_overlay(ax, values, image, stem, vmax, tokens, query)
        ax.set_title(caption, fontsize=8)
    _colorbar(fig, axes[: len(maps)], "shared", (0.0, vmax), tokens, ROLLOUT_LABEL)
    fig.suptitle(wrap_text(title, fig, 9), fontsize=9)
    return fig


def class_token_figure(
    per_layer: Sequence[Tensor | None],
    grid: tuple[int, int],
    stem: int,
    image: Tensor | None,
    title: str,
) -> Figure:
    """Layer × head grid of what the class token attends to: ``per_layer[l]`` is ``(heads, N)``
    (None: layer ``l`` has no class token yet, left out), drawn over ``image`` ``(C, H, W)`` (or
    alone), with a last column of the mean over the heads; one colour scale for all the maps and
    ``title`` above, wrapped to the width."""
    layers = [(index, probs) for index, probs in enumerate(per_layer) if probs is not None]
    if not layers:
        raise ValueError("no layer has a class token")
    heads = max(probs.shape[0] for _, probs in layers)
    fig = new_figure(1.25 * (heads + 1) + 1.3, 1.35 * len(layers) + 1.1)
    axes = fig.subplots(len(layers), heads + 1, squeeze=False)
    maps = [
        [probs[head].reshape(grid) for head in range(probs.shape[0])]
        + [probs.mean(dim=0).reshape(grid)]
        for _, probs in layers
    ]
    vmax = colour_top([m for row in maps for m in row])
    tokens = grid[0] * grid[1]
    drawn = []
    for row, ((layer, probs), row_maps) in enumerate(zip(layers, maps, strict=True)):
        for column in range(heads + 1):
            ax = axes[row, column]
            head = column if column < probs.shape[0] else None
            if column < heads and head is None:
                ax.set_axis_off()  # a pruned layer's missing head
                continue
            values = row_maps[-1] if column == heads else row_maps[head]
            draw_overlay(ax, values, image, stem, vmax, tokens)
            drawn.append(ax)
            if row == 0:
                ax.set_title("mean of heads" if column == heads else f"head {column}", fontsize=9)
            if column == 0:
                ax.set_ylabel(f"layer {layer}", fontsize=9)
    _colorbar(fig, drawn, "shared", (0.0, vmax), tokens)
    fig.suptitle(wrap_text(title, fig, 9), fontsize=9)
    return fig

"""What the heads of a transformed network (T-CNN, ``TransformedNetwork``) attend to, and its
figures: the content gates per layer and head, and the attention distance by depth.

Each transformed layer attends from the pixels of its *output* grid ``h_out × w_out`` (the
queries) over the pixels of its *input* grid ``h × w`` (the keys): a stride-2 layer of
resnet-fashion-small attends from 7×7 queries over 14×14 keys. Output pixel ``(r, c)`` sits on
its receptive field's centre tap, input pixel ``(r·s₁ + a₁ − top, c·s₂ + a₂ − left)``
(``TransformedConv2d.query_pixels`` less the padding): the query's *position*, from which the
head's start tap, its centre and its attention distance are measured. Distances are in pixels of
the layer's input and, scaled by ``image size / input grid``, in pixels of the network's input
image.

A layer's attention to the image is ``TransformedConv2d.attention``: ``(1 − g_h)`` times the
Gaussian head over the zero-extended input, restricted to the image (a row sums to less than one
by the mass on padding), plus ``g_h`` times the content attention. The measures here renormalise
each query's row over the image, so that they describe where in the image a head looks.
"""

from __future__ import annotations

import copy
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator
from torch import Tensor

from attnconv.attention.transformed import TransformedConv2d
from attnconv.models.modes import evaluating
from attnconv.models.transformed import TransformedNetwork
from attnconv.viz.contours import (
    MASSES,
    MAX_AREA,
    draw_head_contours,
    legend_handles,
    not_drawn_lines,
    rule_text,
)
from attnconv.viz.distance import _draw_distances
from attnconv.viz.grid import assign_taps
from attnconv.viz.labels import Marker, Panel, label_panels, query_marker
from attnconv.viz.style import (
    new_figure,
    palette_color,
    panel_axes,
    panel_grid,
    text_color_on,
    wrap_text,
)

# Images per forward when averaging the attention over many images.
CHUNK = 8


@dataclass
class LayerAttention:
    """The attention of one transformed layer.

    Attributes:
        name: the layer's module name in the base network (``"stages.2.0.conv1"``).
        probs: ``(heads, N_out, N_in)`` float64, ``N_out = h_out·w_out`` queries (the output
            pixels, row-major) over ``N_in = h·w`` keys (the input pixels); see the module
            docstring for what a row sums to.
        query_grid: ``(h_out, w_out)``.
        key_grid: ``(h, w)``.
        query_rows: ``(h_out,)`` the input row of each output row's query (may lie in the padding).
        query_cols: ``(w_out,)`` likewise for the columns.
        taps: ``(heads, 2)`` the kernel tap each head started on (offset from the query, pixels).
        image_size: ``(H, W)`` of the network's input image.
        description: what the probabilities are (``"Gaussian heads alone"``,
            ``"mean over 16 images"``).
    """

    name: str
    probs: Tensor
    query_grid: tuple[int, int]
    key_grid: tuple[int, int]
    query_rows: Tensor
    query_cols: Tensor
    taps: Tensor
    image_size: tuple[int, int]
    description: str

    @property
    def heads(self) -> int:
        return int(self.probs.shape[0])

    @property
    def pixel_scale(self) -> float:
        """Image pixels per pixel of this layer's input (the mean of the two axes' ratios)."""
        return 0.5 * sum(i / k for i, k in zip(self.image_size, self.key_grid, strict=True))

    def query_positions(self) -> Tensor:
        """``(N_out, 2)`` float64: the input pixel (row, col) where each query sits."""
        rows = self.query_rows.double().repeat_interleave(self.query_grid[1])
        cols = self.query_cols.double().repeat(self.query_grid[0])
        return torch.stack([rows, cols], dim=1)

    def query_for_image_pixel(self, pixel: tuple[int, int]) -> tuple[int, int]:
        """The output pixel nearest to image pixel ``pixel = (row, col)``, the image scaled onto
        the output grid: ``⌊(p + ½)·h_out / H⌋`` on each axis."""
        return tuple(
            min(out - 1, max(0, int((p + 0.5) * out / size)))
            for p, out, size in zip(pixel, self.query_grid, self.image_size, strict=True)
        )

    def query_maps(self, query: tuple[int, int]) -> Tensor:
        """``(heads, h, w)``: every head's attention from output pixel ``query`` over the input."""
        index = query[0] * self.query_grid[1] + query[1]
        return self.probs[:, index, :].reshape(self.heads, *self.key_grid)


def _layer_inputs(model: TransformedNetwork, images: Tensor) -> dict[str, Tensor]:
    """The input ``(B, in, h, w)`` of every transformed layer when ``model`` (in eval mode)
    classifies ``images (B, C, H, W)``."""
    inputs: dict[str, Tensor] = {}
    hooks = [
        layer.register_forward_hook(
            lambda _m, args, _out, name=name: inputs.__setitem__(name, args[0].detach())
        )
        for name, layer in model.transformed_layers().items()
    ]
    try:
        with torch.no_grad(), evaluating(model):
            model(images)
    finally:
        for hook in hooks:
            hook.remove()
    return inputs


def _describe(
    name: str, layer: TransformedConv2d, probs: Tensor, key_grid: tuple[int, int],
    image_size: tuple[int, int], description: str,
) -> LayerAttention:  # fmt: skip
    (top, _), (left, _) = layer.padding
    rows, cols = layer.query_pixels(*key_grid)
    return LayerAttention(
        name=name,
        probs=probs,
        query_grid=layer.output_size(*key_grid),
        key_grid=key_grid,
        query_rows=(rows - top).cpu(),
        query_cols=(cols - left).cpu(),
        taps=layer.tap_offsets().detach().double().cpu(),
        image_size=image_size,
        description=description,
    )


def _check(model: object) -> TransformedNetwork:
    if not isinstance(model, TransformedNetwork):
        raise TypeError(f"expected a TransformedNetwork, got {type(model).__name__}")
    return model


@torch.no_grad()
def transformed_attention(model: TransformedNetwork, images: Tensor) -> list[LayerAttention]:
    """Every transformed layer's attention (content on, as the network computes it), averaged
    over ``images`` (float ``(B, C, H, W)`` in ``[0, 1]``, the network's input), ``CHUNK`` at a
    time, in network order."""
    _check(model)
    if not isinstance(images, Tensor) or images.dim() != 4 or images.shape[0] < 1:
        raise ValueError("images must be a float tensor (B, C, H, W) with at least one image")
    layers = model.transformed_layers()
    device = next(model.parameters()).device
    sums: dict[str, Tensor] = {}
    grids: dict[str, tuple[int, int]] = {}
    for start in range(0, images.shape[0], CHUNK):
        inputs = _layer_inputs(model, images[start : start + CHUNK].to(device))
        for name, x in inputs.items():
            total = layers[name].attention(x).double().sum(dim=0).cpu()
            sums[name] = sums[name] + total if name in sums else total
            grids[name] = (int(x.shape[2]), int(x.shape[3]))
    count = images.shape[0]
    description = "one image" if count == 1 else f"mean over {count} images"
    size = (int(images.shape[2]), int(images.shape[3]))
    return [
        _describe(name, layer, sums[name] / count, grids[name], size, description)
        for name, layer in layers.items()
    ]


@torch.no_grad()
def gaussian_attention(model: TransformedNetwork) -> list[LayerAttention]:
    """Every transformed layer's Gaussian heads alone (the positional attention, without the
    content its gates mix in: the same for every image), on the grids of the model's
    ``image_size``, in network order."""
    _check(model)
    parameter = next(model.parameters())
    probe = parameter.new_zeros(1, model.in_channels, *model.image_size)
    inputs = _layer_inputs(model, probe)
    result = []
    for name, layer in model.transformed_layers().items():
        gaussian = copy.deepcopy(layer)
        gaussian.gate = None  # attention() without content: the positional part alone
        probs = gaussian.attention(inputs[name])[0].double().cpu()
        grid = (int(inputs[name].shape[2]), int(inputs[name].shape[3]))
        result.append(
            _describe(name, layer, probs, grid, tuple(model.image_size), "Gaussian heads alone")
        )
    return result


def _key_distances(layer: LayerAttention) -> Tensor:
    """``(N_out, N_in)`` Euclidean distance (input pixels) from each query's position to each key."""
    h, w = layer.key_grid
    keys = torch.stack(
        [
            torch.arange(h, dtype=torch.float64).repeat_interleave(w),
            torch.arange(w, dtype=torch.float64).repeat(h),
        ],
        dim=1,
    )
    return torch.cdist(layer.query_positions(), keys)


def _renormalised(probs: Tensor) -> Tensor:
    """``probs (heads, N_out, N_in)`` with each row divided by its sum (rows of zeros stay)."""
    total = probs.sum(dim=-1, keepdim=True)
    return probs / torch.where(total > 0, total, torch.ones_like(total))


def attention_distance(layer: LayerAttention) -> Tensor:
    """``(heads,)`` each head's attention distance in pixels of the layer's input: for every query,
    the distance from its position to the keys weighted by its attention renormalised over the
    image, then the mean over the queries."""
    weighted = _renormalised(layer.probs.double()) * _key_distances(layer)
    return weighted.sum(dim=-1).mean(dim=-1)


def uniform_distance(layer: LayerAttention) -> float:
    """The attention distance (input pixels) of a head that attends to every input pixel alike:
    a head near it looks everywhere."""
    return float(_key_distances(layer).mean())


def tap_mass(layer: LayerAttention) -> Tensor:
    """``(heads, taps)``: each head's attention (renormalised over the image) on the input pixel
    at each kernel tap's offset from the query, averaged over the interior queries (those whose
    every tap lies inside the input). Tap ``t`` is the one head ``t`` started on, so column ``t``
    of head ``t`` is how much of its attention stayed on its own tap. ValueError if no query has
    all its taps inside."""
    h, w = layer.key_grid
    positions = layer.query_positions().round().long()  # (N_out, 2), whole pixels
    offsets = layer.taps.round().long()  # (taps, 2)
    keys = positions[:, None, :] + offsets[None, :, :]  # (N_out, taps, 2)
    inside = ((keys[..., 0] >= 0) & (keys[..., 0] < h) & (keys[..., 1] >= 0) & (keys[..., 1] < w))
    interior = inside.all(dim=1)
    if not interior.any():
        raise ValueError(
            f"{layer.name}: no query of its {h}x{w} input has every kernel tap inside the image"
        )
    index = (keys[..., 0] * w + keys[..., 1])[interior]  # (interior queries, taps)
    probs = _renormalised(layer.probs.double())[:, interior, :]  # (heads, interior, N_in)
    gathered = probs.gather(2, index[None].expand(layer.heads, -1, -1))
    return gathered.mean(dim=1)


def layer_measures(layer: LayerAttention) -> dict[str, float]:
    """One layer's ``attention_distance`` (mean over heads, input pixels),
    ``attention_distance_image`` (image pixels), ``uniform_distance`` (input pixels), and the
    grid score of its taps: ``tap_score`` (``viz.grid.assign_taps`` on [`tap_mass`][]: 1 when
    every tap has a head with all its attention on it) and ``tap_coverage``; both NaN when no
    query has all its taps inside the input."""
    distance = float(attention_distance(layer).mean())
    try:
        score, coverage, _ = assign_taps(tap_mass(layer))
    except ValueError:
        score = coverage = float("nan")
    return {
        "attention_distance": distance,
        "attention_distance_image": distance * layer.pixel_scale,
        "uniform_distance": uniform_distance(layer),
        "tap_score": score,
        "tap_coverage": coverage,
    }


def _layer_label(index: int, name: str) -> str:
    return f"{index}: {name}"


def gate_figure(model: TransformedNetwork, title: str | None = None) -> Figure:
    """The content gates of a transformed network: a heat map of layer (rows, named) × head
    (columns, each with the kernel tap it started on) with every gate written in its cell, and
    beside it each layer's mean gate as a bar (how much content attention the layer took up).
    The image's gid is ``"gates"``, each bar's ``"mean-gate-layer{l}"``."""
    _check(model)
    layers = model.transformed_layers()
    heads = max(layer.heads for layer in layers.values())
    gates = np.full((len(layers), heads), np.nan)
    for index, layer in enumerate(layers.values()):
        gates[index, : layer.heads] = layer.content_gates().detach().double().cpu().numpy()
    taps = next(iter(layers.values())).tap_offsets().round().int().tolist()
    fig = new_figure(2.0 + 0.55 * heads + 2.2, 1.6 + 0.38 * len(layers))
    grid = fig.add_gridspec(1, 2, width_ratios=[heads, 3.0], wspace=0.08)
    ax = fig.add_subplot(grid[0])
    image = ax.imshow(gates, cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
    image.set_gid("gates")
    for (row, col), value in np.ndenumerate(gates):
        if np.isfinite(value):
            color = text_color_on(image.cmap(image.norm(value)))
            ax.text(col, row, f"{value:.2f}", ha="center", va="center", fontsize=6.5, color=color)
    ax.set_xticks(
        range(heads),
        [f"{h}\n({r:+d},{c:+d})" for h, (r, c) in enumerate(taps[:heads])],
        fontsize=6.5,
    )
    ax.set_yticks(
        range(len(layers)),
        [_layer_label(i, name) for i, name in enumerate(layers)],
        fontsize=7,
    )
    ax.set_xlabel("head (the kernel tap it started on)", fontsize=8)
    bars = fig.add_subplot(grid[1], sharey=ax)
    means = np.nanmean(gates, axis=1)
    for index, mean in enumerate(means):
        (bar,) = bars.barh(index, mean, color="0.45", height=0.6)
        bar.set_gid(f"mean-gate-layer{index}")
        bars.text(mean + 0.02, index, f"{mean:.2f}", va="center", fontsize=7)
    bars.set_xlim(0.0, 1.0)
    bars.tick_params(labelleft=False, labelsize=7)
    bars.set_xlabel("mean gate", fontsize=8)
    bars.grid(axis="x", color="0.9")
    fig.colorbar(image, ax=[ax, bars], shrink=0.9, pad=0.02).set_label("content gate", fontsize=8)
    fig.suptitle(
        title
        or "Content gates: each head's share of content attention (0: its Gaussian head only)",
        fontsize=10,
    )
    return fig


def transformed_distance_figure(
    layers: Sequence[LayerAttention], title: str | None = None
) -> Figure:
    """Attention distance by depth: one dot per head (in its colour) at each transformed layer
    (network order), in pixels of the layer's input, each layer's mean as a black dash and the
    distance of uniform attention over its input as a grey dash (gid ``"uniform-layer{l}"``).
    The layers' pixels differ in size (a stage's input grid is half the one before), so the
    means are not joined by a line and each layer's label says how many image pixels its pixel
    spans."""
    distances = [attention_distance(layer) for layer in layers]
    uniforms = [uniform_distance(layer) for layer in layers]
    fig = new_figure(2.5 + 0.9 * len(layers), 5.0)
    ax = fig.subplots()
    top = max(max(float(d.max()) for d in distances), *uniforms)
    _draw_distances(ax, distances, None, top * 1.1 if top > 0 else 1.0, join_means=False)
    for index, uniform in enumerate(uniforms):
        (dash,) = ax.plot(
            [index - 0.4, index + 0.4], [uniform] * 2, color="0.35", linestyle="--", linewidth=1,
            label="uniform attention over the layer's input" if index == 0 else None, zorder=1,
        )  # fmt: skip
        dash.set_gid(f"uniform-layer{index}")
    ax.set_xticks(
        range(len(layers)),
        [
            f"{_layer_label(i, layer.name)}\n1 px = {layer.pixel_scale:.3g} image px"
            for i, layer in enumerate(layers)
        ],
        rotation=30,
        ha="right",
        fontsize=7,
    )
    ax.set_ylabel("attention distance (pixels of the layer's input)")
    fig.legend(fontsize=7, loc="outside lower center", ncol=6, frameon=False)
    fig.suptitle(
        title
        or "Attention distance per head and transformed layer "
        f"({layers[0].description}; rows renormalised over the image)",
        fontsize=10,
    )
    return fig


TAP_MARKER = 5  # points across the square that marks a head's start tap


def transformed_contour_figure(
    layers: Sequence[LayerAttention],
    pixel: tuple[int, int] | None = None,
    masses: Sequence[float] = MASSES,
    max_area: float = MAX_AREA,
    title: str | None = None,
) -> Figure:
    """One panel per transformed layer, on its input grid: every head's mass contours
    (``contours.draw_head_contours``: concentrated regions only, head ``h`` in its colour, gid
    ``"layer{l}-head{h}-mass{m}"``) from the output pixel nearest image pixel ``pixel = (row,
    col)`` (default: the image's centre; ``LayerAttention.query_for_image_pixel``), the query
    marker (a black X) where that output pixel's query sits and each head's start tap (its kernel
    tap from the query) as a hollow square in its colour (gid ``"layer{l}-tap{h}"``).
    UserError if ``pixel`` lies outside the image."""
    from attnconv.errors import UserError

    size = layers[0].image_size
    pixel = (size[0] // 2, size[1] // 2) if pixel is None else tuple(int(v) for v in pixel)
    if not (0 <= pixel[0] < size[0] and 0 <= pixel[1] < size[1]):
        raise UserError(f"query pixel {pixel} lies outside the {size[0]}x{size[1]} image")
    rows, columns = panel_grid(len(layers))
    fig = new_figure(3.4 * columns, 3.6 * rows + 1.2)
    axes = panel_axes(fig, len(layers))
    panels = []
    for index, (ax, layer) in enumerate(zip(axes, layers, strict=True)):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        query = layer.query_for_image_pixel(pixel)
        where = layer.query_positions()[query[0] * layer.query_grid[1] + query[1]].tolist()
        anchors, not_drawn = draw_head_contours(
            ax, layer.query_maps(query), where, masses, max_area, f"layer{index}-"
        )
        ends = [query_marker(where[1], where[0])]
        for head in range(layer.heads):
            row, col = (where[0] + layer.taps[head, 0].item(), where[1] + layer.taps[head, 1].item())
            (tap,) = ax.plot(
                col, row, "s", markerfacecolor="none", markeredgecolor=palette_color(head),
                markersize=TAP_MARKER, markeredgewidth=1.2, zorder=6,
            )  # fmt: skip
            tap.set_gid(f"layer{index}-tap{head}")
            ends.append(Marker(col, row, TAP_MARKER))
        (h_out, w_out), (h, w) = layer.query_grid, layer.key_grid
        heading = f"{index}: {layer.name}\n{h}×{w} input, {h_out}×{w_out} output, query {query}"
        ax.set_title("\n".join([heading, *not_drawn_lines(not_drawn)]), fontsize=8)
        ax.set_xlabel("column (pixel of the layer's input)", fontsize=7)
        ax.set_ylabel("row (pixel)", fontsize=7)
        panels.append(Panel(ax, anchors, f"layer{index}-", ends))
    handles = legend_handles(masses, "query")
    handles.append(
        Line2D([], [], marker="s", markerfacecolor="none", markeredgecolor="0.3",
               linestyle="none", label="kernel tap where the head started")
    )  # fmt: skip
    fig.legend(
        handles=handles, loc="outside lower center", ncol=min(len(handles), 6), fontsize=8,
        frameon=False,
    )  # fmt: skip
    rule = rule_text(masses, max_area, "pixels")
    fig.suptitle(
        (title or f"Attention mass contours of the transformed layers from image pixel {pixel} "
         f"({layers[0].description})") + "\n" + wrap_text(rule, fig, 10),
        fontsize=10,
    )  # fmt: skip
    label_panels(fig, panels)
    return fig


def head_rows(model: TransformedNetwork, layers: Sequence[LayerAttention]) -> list[dict]:
    """``attnconv heads``' rows of a transformed network (``transformed_head_table``) with each
    head's ``attention_distance`` (pixels of the layer's input), ``attention_distance_image``
    (image pixels) and ``tap_mass`` (its attention on the tap it started on, interior queries;
    NaN when none has every tap inside) measured on ``layers`` (``transformed_attention``)."""
    from attnconv.models.heads import transformed_head_table

    distances = [attention_distance(layer) for layer in layers]
    own = []
    for layer in layers:
        try:
            own.append(tap_mass(layer).diagonal())
        except ValueError:
            own.append(torch.full((layer.heads,), float("nan"), dtype=torch.float64))
    rows = transformed_head_table(model)
    for row in rows:
        index, head = row["layer"], row["head"]
        row["attention_distance"] = float(distances[index][head])
        row["attention_distance_image"] = row["attention_distance"] * layers[index].pixel_scale
        row["tap_mass"] = float(own[index][head])
    return rows


def layer_rows(model: TransformedNetwork, layers: Sequence[LayerAttention]) -> list[dict]:
    """One row per transformed layer: ``transformed_layer_summary`` (mean and largest distance
    moved from the taps, mean spread, mean gate), its grids (``input``, ``output``: ``"HxW"``) and
    ``layer_measures`` on ``layers``."""
    from attnconv.models.heads import transformed_head_table, transformed_layer_summary

    rows = transformed_layer_summary(transformed_head_table(model))
    for row, layer in zip(rows, layers, strict=True):
        row["input"] = "x".join(map(str, layer.key_grid))
        row["output"] = "x".join(map(str, layer.query_grid))
        row.update(layer_measures(layer))
    return rows


LAYER_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("layer", "layer", "{:d}"),
    ("name", "module", "{}"),
    ("input", "input", "{}"),
    ("output", "output", "{}"),
    ("mean_moved", "moved", "{:.3f}"),
    ("mean_gate", "gate", "{:.3f}"),
    ("attention_distance", "distance", "{:.2f}"),
    ("attention_distance_image", "distance (image px)", "{:.2f}"),
    ("uniform_distance", "uniform", "{:.2f}"),
    ("tap_score", "tap score", "{:.3f}"),
)


def format_layer_table(rows: Sequence[dict]) -> str:
    """``layer_rows`` as aligned text, with a line saying what the columns are."""
    cells = [[header for _, header, _ in LAYER_COLUMNS]]
    cells += [[form.format(row[key]) for key, _, form in LAYER_COLUMNS] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(LAYER_COLUMNS))]
    lines = [
        "  ".join(text.rjust(width) for text, width in zip(line, widths, strict=True))
        for line in cells
    ]
    about = textwrap.fill(
        "Per transformed layer: the mean distance its heads moved from their kernel taps "
        "(pixels) and their mean content gate; the attention distance (pixels of its input, and "
        "of the image) and that of uniform attention; the tap score (1: each tap has a head with "
        "all its attention on it).",
        100,
    )
    return "\n".join([about, *lines])

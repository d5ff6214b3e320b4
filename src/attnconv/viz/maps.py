"""Attention probabilities of a model's layers, and the layer × head grid of maps for one query.

Everything here works on the *token grid* ``h × w`` the attention layers see (``image / stem`` for
the image transformer). Pixels are ``(row, col)``, row-major: token ``(r, c)`` has index ``r·w + c``.
Layers and heads are numbered from 0, as in ``attnconv heads``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from torch import Tensor, nn

from attnconv.attention import MultiHeadSelfAttention2d
from attnconv.errors import UserError
from attnconv.models.modes import evaluating
from attnconv.viz.style import MAP_CMAP, new_figure, wrap_text

# Images per forward when averaging a content model's attention over many images.
CHUNK = 8


@dataclass
class AttentionMaps:
    """Attention probabilities of every layer on an ``h × w`` token grid.

    Attributes:
        probs: one tensor per layer, ``(heads, N, N)`` with ``N = h·w`` (rows are queries, each
            sums to one); layers may have different head counts (pruned models).
        grid: ``(h, w)``.
        description: what the probabilities are, e.g. ``"position-only"`` or
            ``"mean over 16 images"``; used in figure titles.
        stem: input pixels per token side (1 when the layers see the image directly).
    """

    probs: list[Tensor]
    grid: tuple[int, int]
    description: str
    stem: int = 1

    def query_maps(self, query: tuple[int, int]) -> list[Tensor]:
        """Attention of every head to every key for one query token: per layer ``(heads, h, w)``."""
        h, w = self.grid
        index = query_index(query, self.grid)
        return [p[:, index, :].reshape(p.shape[0], h, w) for p in self.probs]


def query_index(query: tuple[int, int], grid: tuple[int, int]) -> int:
    """Row-major index of token ``query = (row, col)`` on ``grid = (h, w)``; ValueError outside."""
    if len(query) != 2:
        raise ValueError(f"a query is a (row, col) pair, got {query!r}")
    row, col = (int(v) for v in query)
    h, w = grid
    if not (0 <= row < h and 0 <= col < w):
        raise UserError(f"query {(row, col)} lies outside the {h}x{w} token grid")
    return row * w + col


def default_query(grid: tuple[int, int]) -> tuple[int, int]:
    """The token at the centre of the grid (rounded down)."""
    return grid[0] // 2, grid[1] // 2


def attention_layers(
    source: nn.Module | Sequence[MultiHeadSelfAttention2d],
) -> list[MultiHeadSelfAttention2d]:
    """The attention layers of ``source``: a model with ``attention_layers()``, one
    ``MultiHeadSelfAttention2d``, or a sequence of them."""
    if isinstance(source, MultiHeadSelfAttention2d):
        return [source]
    if hasattr(source, "attention_layers"):
        layers = list(source.attention_layers())
    elif isinstance(source, Sequence) and not isinstance(source, str):
        layers = list(source)
    else:
        raise TypeError(
            "expected a model with attention_layers(), a MultiHeadSelfAttention2d or a list of "
            f"them, got {type(source).__name__}"
        )
    if not layers:
        raise ValueError(f"{type(source).__name__} has no attention layers")
    for layer in layers:
        if not isinstance(layer, MultiHeadSelfAttention2d):
            raise TypeError(f"expected MultiHeadSelfAttention2d layers, got {type(layer).__name__}")
    return layers


def token_grid(source: object, image_size: tuple[int, int]) -> tuple[int, int]:
    """The grid the attention layers see for an input of ``image_size = (H, W)``: the model's
    ``token_grid(H, W)`` when it has one, else ``image_size`` itself (bare layers)."""
    if len(image_size) != 2 or min(int(s) for s in image_size) < 1:
        raise ValueError(f"image_size must be a (height, width) pair, got {image_size!r}")
    if hasattr(source, "token_grid"):
        return tuple(int(s) for s in source.token_grid(int(image_size[0]), int(image_size[1])))
    return int(image_size[0]), int(image_size[1])


def is_position_only(source: nn.Module | Sequence[MultiHeadSelfAttention2d]) -> bool:
    """True when every attention layer's probabilities depend on positions only."""
    return all(layer.position_only for layer in attention_layers(source))


@torch.no_grad()
def compute_attention(
    source: nn.Module | Sequence[MultiHeadSelfAttention2d],
    image_size: tuple[int, int],
    images: Tensor | None = None,
) -> AttentionMaps:
    """Attention probabilities of every layer of ``source`` for inputs of ``image_size = (H, W)``.

    Position-only layers need no images (their attention is the same for every image; ``images``
    is not used). Models with content scores need ``images``, float ``(B, C, H, W)`` in ``[0, 1]``,
    and return the mean of the probabilities over the ``B`` images; ``source`` must then be a
    model whose ``forward(x, return_attention=True)`` returns ``(logits, [probs per layer])``.
    """
    layers = attention_layers(source)
    grid = token_grid(source, image_size)
    stem = int(getattr(source, "stem", 1))
    if all(layer.position_only for layer in layers):
        probs = [layer.attention_probs(*grid).float().cpu() for layer in layers]
        return AttentionMaps(probs, grid, "position-only", stem)
    if images is None:
        raise ValueError(
            "this model's attention depends on the image (content scores): pass images "
            "(B, C, H, W) in [0, 1]"
        )
    if not isinstance(source, nn.Module) or not hasattr(source, "attention_layers"):
        raise ValueError(
            "attention with content scores needs the whole model (its layers' inputs depend on "
            "the image); pass the model, not its layers"
        )
    if not isinstance(images, Tensor) or images.dim() != 4 or not images.is_floating_point():
        raise ValueError(
            "images must be a float tensor (B, C, H, W) in [0, 1], got "
            + (
                f"shape {tuple(images.shape)} {images.dtype}"
                if isinstance(images, Tensor)
                else type(images).__name__
            )
        )
    if tuple(images.shape[2:]) != (int(image_size[0]), int(image_size[1])):
        raise ValueError(
            f"images are {images.shape[2]}x{images.shape[3]} but image_size is {tuple(image_size)}"
        )
    device = next(source.parameters()).device
    sums: list[Tensor] | None = None
    with evaluating(source):
        for start in range(0, images.shape[0], CHUNK):
            _, batch_probs = source(images[start : start + CHUNK].to(device), return_attention=True)
            chunk_sums = [p.double().sum(dim=0).cpu() for p in batch_probs]
            sums = (
                chunk_sums
                if sums is None
                else [a + b for a, b in zip(sums, chunk_sums, strict=True)]
            )
    count = images.shape[0]
    description = "one image" if count == 1 else f"mean over {count} images"
    return AttentionMaps([(s / count).float() for s in sums], grid, description, stem)


def window_limits(center: int, radius: int | None, size: int) -> tuple[float, float]:
    """Axis limits (pixel edges) of the window ``center ± radius`` clipped to ``[0, size)``."""
    if radius is None:
        return -0.5, size - 0.5
    return max(center - radius, 0) - 0.5, min(center + radius, size - 1) + 0.5


SCALES: tuple[str, ...] = ("map", "shared")
# A colour scale reaches at least this multiple of the uniform level 1/N: a near-uniform map
# (maximum about 1/N) stays in the scale's lower colours instead of taking its brightest.
FLOOR = 4.0


def scale_top(peak: float, tokens: int) -> float:
    """Top of a colour scale for maps of ``tokens`` tokens whose largest value is ``peak``:
    ``peak``, at least ``FLOOR / tokens``."""
    return max(peak, FLOOR / tokens)


def format_probability(value: float) -> str:
    """A probability with three significant digits (``0.174``, ``0.00552``): small maxima stay
    readable where two decimals would print ``0.01``."""
    return f"{value:#.3g}".rstrip(".")


def uniform_multiple(value: float, tokens: int) -> str:
    """``value`` as a multiple of the uniform level ``1/tokens``: ``"34/N"``, ``"1.1/N"``."""
    times = value * tokens
    return f"{times:.0f}/N" if times >= 9.95 else f"{times:.1f}/N"


def map_grid_figure(
    maps: AttentionMaps,
    query: tuple[int, int] | None = None,
    window: int | None = None,
    image: Tensor | None = None,
    title: str | None = None,
    scale: str = "map",
) -> Figure:
    """Layer × head grid of attention maps for one query token, with a colour bar.

    ``scale="map"``: each map on its own colour scale from 0 to its maximum but at least
    ``FLOOR/N`` (``colour_top``; ``N`` key tokens), so that a near-uniform map stays dark instead
    of taking the brightest colours; its maximum is printed under it (``format_probability``)
    with its multiple of the uniform level ``1/N``. ``scale="shared"``: one scale from 0 to the
    largest value of all maps, at least ``FLOOR/N``; the colour bar marks ``1/N``. The query
    token is outlined. ``window`` zooms every map to the tokens within ``window`` rows and
    columns of the query (``±window``); the maximum printed and the colour scales are then those
    of the tokens shown. ``image`` (``(C, H, W)`` in ``[0, 1]``) is drawn in an extra first
    column with the query's pixels outlined. The title is wrapped to the figure's width.
    """
    query = default_query(maps.grid) if query is None else query
    query_index(query, maps.grid)
    if window is not None and window < 0:
        raise UserError(f"window must be a non-negative number of tokens, got {window}")
    if scale not in SCALES:
        raise UserError(f"scale must be one of {', '.join(SCALES)}, got {scale!r}")
    per_layer = maps.query_maps(query)
    heads = max(m.shape[0] for m in per_layer)
    columns = heads + (image is not None)
    fig = new_figure(1.25 * columns + 1.3, 1.4 * len(per_layer) + 1.0)
    axes = fig.subplots(len(per_layer), columns, squeeze=False)
    h, w = maps.grid
    tokens = h * w
    row_limits = window_limits(query[0], window, h)
    col_limits = window_limits(query[1], window, w)
    shown = (
        slice(int(row_limits[0] + 0.5), int(row_limits[1] + 0.5)),
        slice(int(col_limits[0] + 0.5), int(col_limits[1] + 0.5)),
    )
    shared = (0.0, scale_top(max(float(m[:, shown[0], shown[1]].max()) for m in per_layer), tokens))
    map_axes = []
    for layer, layer_maps in enumerate(per_layer):
        first = int(image is not None)
        if image is not None and layer == 0:
            _draw_image(axes[0, 0], image, query, maps.stem)
        elif image is not None:
            axes[layer, 0].set_axis_off()
        for head in range(heads):
            ax = axes[layer, first + head]
            if head >= layer_maps.shape[0]:
                ax.set_axis_off()
                continue
            map_axes.append(ax)
            values = layer_maps[head].numpy()
            peak = float(values[shown].max())
            vmin, vmax = shared if scale == "shared" else (0.0, scale_top(peak, tokens))
            ax.imshow(values, cmap=MAP_CMAP, vmin=vmin, vmax=vmax, interpolation="nearest")
            outline_token(ax, query, 1, "white", 1.2)
            ax.set_xlim(*col_limits)
            ax.set_ylim(row_limits[1], row_limits[0])
            label_peak(ax, "max" if window is None else "window max", peak, tokens)
            ax.set_xticks([])
            ax.set_yticks([])
            if layer == 0:
                ax.set_title(f"head {head}", fontsize=9)
            if head == 0:
                ax.set_ylabel(f"layer {layer}", fontsize=9)
    _colorbar(fig, map_axes, scale, shared, tokens)
    zoom = "" if window is None else f", window ±{window} tokens"
    floor = f"at least {FLOOR:g}/N so that near-uniform maps stay dark"
    colours = (
        f"colour: one scale for all maps, 0 to their largest value ({floor})"
        if scale == "shared"
        else f"colour: 0 to each map's maximum ({floor}), printed under it"
    )
    fig.suptitle(
        wrap_text(
            title
            or f"Attention from query token {tuple(query)} ({maps.description}{zoom})\n"
            f"{colours}; uniform attention is 1/N = {format_probability(1 / tokens)} "
            f"on each of the N = {tokens} tokens",
            fig,
            10,
        ),
        fontsize=10,
    )
    return fig


def _colorbar(
    fig: Figure,
    axes: list,
    scale: str,
    shared: tuple[float, float],
    tokens: int,
    label: str = "probability (all maps)",
):
    """The colour bar beside the maps: values (``label``: attention probabilities unless said)
    on the shared scale with ``1/N`` marked, or 0 to "max" for per-map scales (their top at least
    ``FLOOR/N``)."""
    if scale == "shared":
        mappable = ScalarMappable(Normalize(*shared), cmap=MAP_CMAP)
        bar = fig.colorbar(mappable, ax=axes, shrink=0.8, aspect=30, pad=0.01)
        bar.set_label(label, fontsize=8)
        uniform = 1 / tokens
        if uniform <= shared[1]:
            bar.ax.axhline(uniform, color="white", linewidth=1.5)
            bar.ax.axhline(uniform, color="black", linewidth=0.8, linestyle=(0, (2, 1)))
            bar.ax.annotate(
                "1/N",
                xy=(0, uniform),
                xycoords=("axes fraction", "data"),
                xytext=(-3, 0),
                textcoords="offset points",
                ha="right",
                va="center",
                fontsize=7,
            )
    else:
        mappable = ScalarMappable(Normalize(0.0, 1.0), cmap=MAP_CMAP)
        bar = fig.colorbar(mappable, ax=axes, shrink=0.8, aspect=30, pad=0.01)
        bar.set_ticks([0.0, 1.0], labels=["0", f"max\n(≥ {FLOOR:g}/N)"])
        bar.set_label("probability, each map's own scale", fontsize=8)
    bar.ax.tick_params(labelsize=7)
    return bar


def label_peak(ax, what: str, peak: float, tokens: int) -> None:
    """``WHAT p = k× uniform`` under a map of ``tokens`` tokens whose largest probability (of
    what ``what`` names) is ``peak``: dark text on the figure's white, readable whatever the
    map's colours."""
    ax.set_xlabel(
        f"{what} {format_probability(peak)} = {uniform_multiple(peak, tokens)}",
        fontsize=6.5,
        color="0.15",
        labelpad=1.5,
    )


def outline_token(ax, query: tuple[int, int], stem: int, color: str, linewidth: float) -> None:
    """Outline on ``ax`` the ``stem × stem`` pixels of token ``query`` (row, column), in a plot
    whose axes count pixels (``stem = 1``: a plot of tokens)."""
    ax.add_patch(
        Rectangle(
            (query[1] * stem - 0.5, query[0] * stem - 0.5),
            stem,
            stem,
            fill=False,
            edgecolor=color,
            linewidth=linewidth,
        )
    )


def _draw_image(ax, image: Tensor, query: tuple[int, int], stem: int) -> None:
    """The input image with the input pixels of the query token outlined."""
    pixels = image.detach().float().cpu().clamp(0, 1)
    if pixels.dim() != 3:
        raise ValueError(f"image must be (C, H, W), got shape {tuple(pixels.shape)}")
    array = pixels.permute(1, 2, 0).numpy()
    if array.shape[2] == 1:
        ax.imshow(array[:, :, 0], cmap="gray", vmin=0, vmax=1, interpolation="nearest")
    else:
        ax.imshow(array, interpolation="nearest")
    outline_token(ax, query, stem, "#EE7733", 1.5)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_title("image", fontsize=9)

"""Shared look of every figure: a colour-blind-safe palette, readable text colours, panel grids,
fonts, and saving to PNG and PDF."""

from __future__ import annotations

import math
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.font_manager import FontProperties

# Paul Tol's "muted" qualitative scheme: nine colours distinguishable under the common forms of
# colour blindness (Paul Tol's notes on colour schemes). Head h gets HEAD_COLORS[h % 9]; figures also
# write the head number next to each head, so more than nine heads stay readable.
HEAD_COLORS: tuple[str, ...] = (
    "#CC6677",
    "#332288",
    "#DDCC77",
    "#117733",
    "#88CCEE",
    "#882255",
    "#44AA99",
    "#999933",
    "#AA4499",
)
# Sequential colour map for attention maps: perceptually uniform and colour-blind safe.
MAP_CMAP = "viridis"
QUERY_COLOR = "black"
# The query token's marker: a black X with a white rim, drawn at the token's centre so that it
# hides neither the outlines on the token's edges nor what lies around it.
QUERY_MARKER = {
    "marker": "X",
    "markersize": 9,
    "markerfacecolor": QUERY_COLOR,
    "markeredgecolor": "white",
    "markeredgewidth": 1.0,
    "linestyle": "none",
}
# Smallest contrast ratio of text on its background (WCAG 2 level AA for normal text).
MIN_CONTRAST = 4.5
# Share of a figure's width left free on each side of a title (``wrap_text``).
TEXT_MARGIN = 0.02
# Most panels side by side in a figure of one panel per layer.
MAX_COLUMNS = 4


def palette_color(index: int) -> str:
    """Colour of head (or run) ``index`` (0-based); cycles after nine."""
    return HEAD_COLORS[index % len(HEAD_COLORS)]


def relative_luminance(color: str | tuple[float, ...]) -> float:
    """WCAG 2 relative luminance of a colour (any matplotlib colour spec), in ``[0, 1]``."""
    linear = [v / 12.92 if v <= 0.04045 else ((v + 0.055) / 1.055) ** 2.4 for v in to_rgb(color)]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


def contrast_ratio(a: str | tuple[float, ...], b: str | tuple[float, ...]) -> float:
    """WCAG 2 contrast ratio of two colours, from 1 (same luminance) to 21 (black on white)."""
    high, low = sorted((relative_luminance(a), relative_luminance(b)), reverse=True)
    return (high + 0.05) / (low + 0.05)


def text_color_on(background: str | tuple[float, ...]) -> str:
    """``"black"`` or ``"white"``, whichever contrasts more with ``background``."""
    return (
        "black"
        if contrast_ratio("black", background) >= contrast_ratio("white", background)
        else "white"
    )


def panel_grid(count: int) -> tuple[int, int]:
    """``(rows, columns)`` for ``count`` panels: no more rows than columns, at most
    ``MAX_COLUMNS`` columns (more rows only past ``MAX_COLUMNS²`` panels), as few empty cells as
    possible, then as square as possible: 3 → 1×3, 4 → 2×2, 6 → 2×3, 8 → 2×4, 12 → 3×4."""
    if count < 1:
        raise ValueError(f"need at least one panel, got {count}")
    widths = [c for c in range(1, min(count, MAX_COLUMNS) + 1) if math.ceil(count / c) <= c]
    if not widths:
        return math.ceil(count / MAX_COLUMNS), MAX_COLUMNS

    def cost(columns: int) -> tuple[int, int]:
        rows = math.ceil(count / columns)
        return rows * columns - count, columns - rows

    columns = min(widths, key=cost)
    return math.ceil(count / columns), columns


def panel_axes(fig: Figure, count: int) -> list:
    """``count`` axes on ``fig`` in a ``panel_grid(count)`` layout, row by row; the grid's spare
    cells get no axes (no empty panels)."""
    rows, columns = panel_grid(count)
    axes = list(fig.subplots(rows, columns, squeeze=False).ravel())
    for ax in axes[count:]:
        fig.delaxes(ax)
    return axes[:count]


def wrap_text(text: str, fig: Figure, fontsize: float) -> str:
    """``text`` broken at spaces into lines that fit the width of ``fig`` at ``fontsize`` points,
    less ``TEXT_MARGIN`` of it on each side, each line measured with the figure's renderer; the
    line breaks ``text`` already has are kept. A single word wider than that stays whole."""
    renderer = fig.canvas.get_renderer()
    font = FontProperties(size=fontsize)
    room = fig.bbox.width * (1 - 2 * TEXT_MARGIN)

    def fits(line: str) -> bool:
        return renderer.get_text_width_height_descent(line, font, ismath=False)[0] <= room

    lines: list[str] = []
    for paragraph in text.split("\n"):
        line = ""
        for word in paragraph.split():
            if line and not fits(f"{line} {word}"):
                lines.append(line)
                line = word
            else:
                line = f"{line} {word}" if line else word
        lines.append(line)
    return "\n".join(lines)


def new_figure(width: float, height: float) -> Figure:
    """A figure of ``width × height`` inches, not registered with pyplot (no global state), with
    an Agg canvas so that text can be measured before saving (``fig.canvas.get_renderer()``)."""
    fig = Figure(figsize=(width, height), layout="constrained")
    fig.set_dpi(100)
    FigureCanvasAgg(fig)
    return fig


def save_figure(fig: Figure, out_dir: str | Path, name: str, dpi: int = 150) -> list[Path]:
    """Write ``fig`` as ``out_dir/name.png`` and ``out_dir/name.pdf``, each atomically
    (``attnconv.runs.write_atomic``); returns both paths."""
    import io

    from attnconv.runs import write_atomic

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.png", out / f"{name}.pdf"]
    for path in paths:
        buffer = io.BytesIO()
        fig.savefig(buffer, dpi=dpi, format=path.suffix[1:])
        write_atomic(path, buffer.getbuffer())
    return paths

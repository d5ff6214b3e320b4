"""Shared look of every figure: a colour-blind-safe palette, fonts, and saving to PNG and PDF."""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure

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


def palette_color(index: int) -> str:
    """Colour of head (or run) ``index`` (0-based); cycles after nine."""
    return HEAD_COLORS[index % len(HEAD_COLORS)]


def new_figure(width: float, height: float) -> Figure:
    """A figure of ``width × height`` inches, not registered with pyplot (no global state)."""
    fig = Figure(figsize=(width, height), layout="constrained")
    fig.set_dpi(100)
    return fig


def save_figure(fig: Figure, out_dir: str | Path, name: str, dpi: int = 150) -> list[Path]:
    """Write ``fig`` as ``out_dir/name.png`` and ``out_dir/name.pdf``; returns both paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.png", out / f"{name}.pdf"]
    for path in paths:
        fig.savefig(path, dpi=dpi)
    return paths

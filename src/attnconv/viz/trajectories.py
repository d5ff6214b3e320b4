"""Gaussian attention centres over training, read from a run's ``checkpoints/epoch_*.pt``.

Only the ``centers`` parameters of the saved state dicts are read (``torch.load(mmap=True)``), so
no model is rebuilt and the rest of each checkpoint stays on disk.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from attnconv.errors import UserError
from attnconv.models.checkpoint import load_checkpoint
from attnconv.runs import RunDir
from attnconv.viz.labels import HeadAnchor, Marker, Panel, label_panels, query_marker
from attnconv.viz.style import QUERY_MARKER, new_figure, palette_color, panel_axes, panel_grid

CENTERS_SUFFIX = "centers"
END_MARKER = 6  # points across the circles of the first and last epochs


@dataclass
class CenterTrajectories:
    """Centres of every Gaussian head at several epochs.

    Attributes:
        epochs: the checkpoints' epochs, increasing.
        centers: one array per Gaussian layer, ``(epochs, heads, 2)`` offsets ``Δ`` (row, col)
            in tokens.
        layer_names: state-dict names of the layers' ``centers`` parameters.
        paths: the checkpoint files, in epoch order.
    """

    epochs: list[int]
    centers: list[np.ndarray]
    layer_names: list[str]
    paths: list[Path]


def epoch_checkpoints(run_dir: str | Path) -> list[Path]:
    """The ``RUN_DIR/checkpoints/epoch_*.pt`` files, sorted by name (= epoch)."""
    run = RunDir(run_dir)
    if not run.root.is_dir():
        raise FileNotFoundError(f"run directory {str(run.root)!r} does not exist")
    paths = run.epoch_checkpoints()
    if not paths:
        raise FileNotFoundError(
            f"no checkpoints/epoch_*.pt in {str(run.root)!r}: train with checkpoint_every set to "
            "keep per-epoch checkpoints"
        )
    return paths


def load_center_trajectories(run_dir: str | Path) -> CenterTrajectories:
    """Centres of every Gaussian head at each epoch checkpoint of ``run_dir``."""
    paths = epoch_checkpoints(run_dir)
    records = []
    for path in paths:
        checkpoint = load_checkpoint(path, mmap=True)
        state = checkpoint["model"]
        names = [name for name in state if name.rsplit(".", 1)[-1] == CENTERS_SUFFIX]
        if not names:
            raise UserError(
                f"{str(path)!r} has no Gaussian attention centres (preset "
                f"{checkpoint.get('preset')!r}); trajectories need a Gaussian model"
            )
        centers = [state[name].detach().double().numpy().copy() for name in names]
        records.append((int(checkpoint["epoch"]), names, centers, path))
    records.sort(key=lambda record: record[0])
    first_names, first_shapes = records[0][1], [c.shape for c in records[0][2]]
    for epoch, names, centers, path in records[1:]:
        if names != first_names or [c.shape for c in centers] != first_shapes:
            raise UserError(
                f"{str(path)!r} (epoch {epoch}) has different attention heads than "
                f"{str(records[0][3])!r}; a trajectory needs the same heads in every checkpoint"
            )
    return CenterTrajectories(
        epochs=[record[0] for record in records],
        centers=[
            np.stack([record[2][layer] for record in records]) for layer in range(len(first_names))
        ],
        layer_names=first_names,
        paths=[record[3] for record in records],
    )


def trajectory_figure(
    trajectories: CenterTrajectories,
    title: str | None = None,
    starts: Sequence[np.ndarray] | None = None,
    unit: str = "tokens",
    layer_titles: Sequence[str] | None = None,
) -> Figure:
    """One panel per layer: each head's centre ``Δ`` over the epochs, relative to the query.

    One panel per layer (``style.panel_grid``). Head ``h`` is a line in ``palette_color(h)``
    through its centres (column offset on x, row offset on y, rows downward), an open circle at the
    first epoch and a filled one at the last, where its number stands (``labels.place_head_labels``:
    beside it when numbers would overlap); the query token is the black X at the origin. Each
    head's line has gid ``"layer{l}-head{h}"``. ``starts``: per layer ``(heads, 2)``, where the
    heads started before the first epoch (a transformed network's kernel taps), each a hollow
    square (gid ``"layer{l}-start{h}"``) that the head's line starts from. ``unit``: of the
    offsets, in the axis labels; ``layer_titles``: the panels' titles (default ``"layer l"``).
    """
    layers = len(trajectories.centers)
    shapes = [c.shape[1:] for c in trajectories.centers]
    if starts is not None and [s.shape for s in starts] != shapes:
        raise ValueError("starts must hold one (heads, 2) array per layer of the trajectories")
    paths = [
        centers if starts is None else np.concatenate([starts[layer][None], centers])
        for layer, centers in enumerate(trajectories.centers)
    ]
    rows, columns = panel_grid(layers)
    fig = new_figure(3.4 * columns, 3.5 * rows + 0.9)
    axes = panel_axes(fig, layers)
    extent = max(1.5, float(max(np.abs(c).max() for c in paths)) + 0.7)
    for layer, centers in enumerate(paths):
        ax = axes[layer]
        ax.plot(0, 0, zorder=2, **QUERY_MARKER)
        for head in range(centers.shape[1]):
            color = palette_color(head)
            row, col = centers[:, head, 0], centers[:, head, 1]
            if starts is not None:  # the start, dotted to the first epoch's centre
                (tap_row, tap_col), row, col = centers[0, head], row[1:], col[1:]
                ax.plot([tap_col, col[0]], [tap_row, row[0]], color=color, linewidth=1.0,
                        linestyle=":", zorder=3)  # fmt: skip
                (start,) = ax.plot(
                    tap_col, tap_row, "s", markerfacecolor="none", markeredgecolor=color,
                    markersize=END_MARKER, zorder=4,
                )  # fmt: skip
                start.set_gid(f"layer{layer}-start{head}")
            (line,) = ax.plot(
                col, row, color=color, linewidth=1.5, marker=".", markersize=4, zorder=3
            )
            line.set_gid(f"layer{layer}-head{head}")
            ax.plot(
                col[0],
                row[0],
                "o",
                markerfacecolor="white",
                markeredgecolor=color,
                markersize=END_MARKER,
                zorder=4,
            )
            ax.plot(col[-1], row[-1], "o", color=color, markersize=END_MARKER, zorder=4)
        ax.set_xlim(-extent, extent)
        ax.set_ylim(extent, -extent)
        ax.set_aspect("equal")
        ticks = np.arange(-np.floor(extent), np.floor(extent) + 1)
        ax.set_xticks(ticks, minor=True)
        ax.set_yticks(ticks, minor=True)
        ax.grid(which="both", color="0.9", linewidth=0.5)
        ax.set_title(layer_titles[layer] if layer_titles else f"layer {layer}", fontsize=10)
        ax.set_xlabel(f"column offset ({unit})", fontsize=8)
        ax.set_ylabel(f"row offset ({unit})", fontsize=8)
        ax.tick_params(labelsize=7)
    handles = [
        Line2D(
            [],
            [],
            marker="o",
            markerfacecolor="white",
            markeredgecolor="0.3",
            linestyle="none",
            label=f"epoch {trajectories.epochs[0]}",
        ),
        Line2D(
            [],
            [],
            marker="o",
            color="0.3",
            linestyle="none",
            label=f"epoch {trajectories.epochs[-1]}",
        ),
        Line2D([], [], label="query token", **QUERY_MARKER),
    ]
    if starts is not None:
        handles.insert(
            0,
            Line2D([], [], marker="s", markerfacecolor="none", markeredgecolor="0.3",
                   linestyle="none", label="start (kernel tap)"),
        )  # fmt: skip
    fig.legend(
        handles=handles, loc="outside lower center", ncol=len(handles), fontsize=8, frameon=False
    )
    fig.suptitle(
        title
        or f"Gaussian attention centres over training, epochs "
        f"{trajectories.epochs[0]}–{trajectories.epochs[-1]} "
        f"({len(trajectories.epochs)} checkpoints)",
        fontsize=11,
    )
    panels = []
    for layer, (ax, centers) in enumerate(zip(axes, trajectories.centers, strict=True)):
        anchors = [
            HeadAnchor(head, float(centers[-1, head, 1]), float(centers[-1, head, 0]))
            for head in range(centers.shape[1])
        ]
        # numbers go beside the last centres, covering none of them
        ends = [Marker(a.x, a.y, END_MARKER) for a in anchors]
        panels.append(Panel(ax, anchors, f"layer{layer}-", [query_marker(0.0, 0.0), *ends]))
    label_panels(fig, panels)
    return fig

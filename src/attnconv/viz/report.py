"""Runs side by side: accuracy against epoch, and a summary table in the style of the paper's Table 1.

Reads the RUN folder written by ``attnconv train``: ``config.json``, ``metrics.jsonl`` (one JSON
object per epoch) and, once the run has finished, ``summary.json``. Accuracies are fractions in
``[0, 1]`` on disk and percentages in the table and the figure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from attnconv.errors import UserError
from attnconv.runs import MAX_JSON_BYTES, RunDir, parse_json, read_file
from attnconv.viz.style import new_figure, palette_color


@dataclass
class Run:
    """One training run: its folder, resolved config, per-epoch metrics and (if finished) summary."""

    path: Path
    config: dict[str, Any]
    metrics: list[dict[str, Any]]
    summary: dict[str, Any] | None

    @property
    def name(self) -> str:
        """The run folder's name."""
        return self.path.name

    @property
    def preset(self) -> str:
        return str((self.summary or {}).get("preset", self.config.get("preset", "?")))

    @property
    def dataset(self) -> str:
        return str((self.summary or {}).get("dataset", self.config.get("dataset", "?")))


# The numbers the report reads (each may also be missing or null): of an epoch record in
# metrics.jsonl besides its ``epoch``, and of summary.json.
METRIC_NUMBERS = ("step", "lr", "train_loss", "train_acc", "val_loss", "val_acc", "epoch_time_s",
                  "images_per_s")  # fmt: skip
SUMMARY_NUMBERS = ("parameters", "macs_per_image", "epochs", "best_val_acc", "best_epoch",
                   "test_acc", "test_loss", "train_time_s", "images_per_s")  # fmt: skip


def load_run(run_dir: str | Path) -> Run:
    """Read a run folder; FileNotFoundError without ``metrics.jsonl``; UserError naming the file
    (and line) for text that is not UTF-8 or JSON, an epoch record without an integer ``epoch``
    >= 1, or a value of ``METRIC_NUMBERS``/``SUMMARY_NUMBERS`` that is not a number."""
    path = Path(run_dir)
    if not path.is_dir():
        raise FileNotFoundError(f"run directory {str(path)!r} does not exist")
    run = RunDir(path)
    metrics_path = run.metrics
    if not metrics_path.is_file():
        raise FileNotFoundError(f"{str(path)!r} has no metrics.jsonl: not an attnconv run folder")
    metrics = []
    for number, line in enumerate(_read_text(metrics_path).splitlines(), start=1):
        if line.strip():
            where = f"{metrics_path}:{number}"
            record = _numbers(_parse_json(line, where), METRIC_NUMBERS, where)
            epoch = record.get("epoch")
            if not (isinstance(epoch, int) and not isinstance(epoch, bool) and epoch >= 1):
                raise UserError(
                    f"{where}: an epoch record needs an integer 'epoch' >= 1, got {_short(epoch)}"
                )
            metrics.append(record)
    config_path, summary_path = run.config, run.summary
    config = _parse_json(_read_text(config_path), str(config_path)) if config_path.is_file() else {}
    summary = None
    if summary_path.is_file():
        where = str(summary_path)
        summary = _numbers(_parse_json(_read_text(summary_path), where), SUMMARY_NUMBERS, where)
    return Run(path, config, metrics, summary)


def _read_text(path: Path) -> str:
    try:
        return read_file(path, MAX_JSON_BYTES, "file").decode("utf-8")
    except UnicodeDecodeError as err:
        raise UserError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from err


def _numbers(record: dict[str, Any], keys: Sequence[str], where: str) -> dict[str, Any]:
    """``record``, after checking that each of ``keys`` it holds is a number or null."""
    for key in keys:
        value = record.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise UserError(f"{where}: {key} must be a number, got {_short(value)}")
    return record


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _parse_json(text: str, where: str) -> dict[str, Any]:
    try:
        value = parse_json(text)
    except ValueError as err:  # malformed, or nested deeper than Python's reader goes
        raise UserError(f"{where}: not valid JSON ({err})") from err
    if not isinstance(value, dict):
        raise UserError(f"{where}: expected a JSON object, got {type(value).__name__}")
    return value


def run_labels(runs: Sequence[Run]) -> list[str]:
    """Names that tell ``runs`` apart: each run folder's name, with as many of its parent folders
    as it takes to differ from the others (``a/run`` and ``b/run`` for two folders named ``run``)."""
    parts = [run.path.resolve().parts for run in runs]
    depths = [1] * len(runs)
    while True:
        labels = [str(Path(*p[-d:])) for p, d in zip(parts, depths, strict=True)]
        clashing = [
            i
            for i, label in enumerate(labels)
            if labels.count(label) > 1 and depths[i] < len(parts[i])
        ]
        if not clashing:
            return labels
        for i in clashing:
            depths[i] += 1


def summary_row(run: Run, name: str | None = None) -> dict[str, Any]:
    """Table-1 numbers of a run (``None`` where unknown): ``run`` (``name``, by default the
    folder's name), ``preset``, ``dataset``,
    ``epochs`` (trained so far), ``parameters``, ``macs_per_image``, ``best_val_acc``,
    ``best_epoch``, ``test_acc``, ``train_time_s``.

    From ``summary.json`` when the run has finished; for a run in progress the best validation
    accuracy and its epoch come from ``metrics.jsonl`` and the training time is the sum of the
    epochs' ``epoch_time_s``.
    """
    summary = run.summary or {}
    scored = [m for m in run.metrics if m.get("val_acc") is not None]
    best = max(scored, key=lambda m: m["val_acc"]) if scored else None
    train_time = summary.get("train_time_s")
    if train_time is None and run.metrics and all("epoch_time_s" in m for m in run.metrics):
        train_time = sum(m["epoch_time_s"] for m in run.metrics)
    return {
        "run": run.name if name is None else name,
        "preset": run.preset,
        "dataset": run.dataset,
        "epochs": max((int(m["epoch"]) for m in run.metrics), default=0),
        "parameters": summary.get("parameters"),
        "macs_per_image": summary.get("macs_per_image"),
        "best_val_acc": summary.get("best_val_acc", best["val_acc"] if best else None),
        "best_epoch": summary.get("best_epoch", best["epoch"] if best else None),
        "test_acc": summary.get("test_acc"),
        "train_time_s": train_time,
    }


TABLE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("run", "run"),
    ("preset", "preset"),
    ("dataset", "dataset"),
    ("epochs", "epochs"),
    ("parameters", "params (M)"),
    ("macs_per_image", "MACs (G)"),
    ("best_val_acc", "best val (%)"),
    ("best_epoch", "at epoch"),
    ("test_acc", "test (%)"),
    ("train_time_s", "train time"),
)


def format_cell(key: str, value: Any) -> str:
    """How the table prints ``value`` of column ``key`` (``-`` when unknown)."""
    if value is None:
        return "-"
    if key == "parameters":
        return f"{value / 1e6:.2f}"
    if key == "macs_per_image":
        return f"{value / 1e9:.3f}"
    if key in ("best_val_acc", "test_acc"):
        return f"{100 * value:.2f}"
    if key == "train_time_s":
        return format_duration(value)
    return str(value)


def format_duration(seconds: float) -> str:
    """``h:mm:ss`` (hours unbounded)."""
    total = round(seconds)
    return f"{total // 3600}:{total % 3600 // 60:02d}:{total % 60:02d}"


def format_summary_table(rows: Sequence[dict[str, Any]]) -> str:
    """The summary rows as aligned text (markdown pipe table)."""
    headers = [header for _, header in TABLE_COLUMNS]
    cells = [[format_cell(key, row[key]) for key, _ in TABLE_COLUMNS] for row in rows]
    widths = [max(len(headers[i]), *(len(line[i]) for line in cells)) for i in range(len(headers))]

    def line(values: Sequence[str]) -> str:
        return "| " + " | ".join(v.rjust(w) for v, w in zip(values, widths, strict=True)) + " |"

    rule = "|" + "|".join("-" * (w + 1) + ":" for w in widths) + "|"
    return "\n".join([line(headers), rule, *(line(c) for c in cells)])


def test_point(run: Run) -> tuple[int, float] | None:
    """(epoch, test accuracy in %) of a finished run: training tests the checkpoint of the best
    validation accuracy, so the epoch is ``best_epoch``. None before the run has finished."""
    summary = run.summary or {}
    test, epoch = summary.get("test_acc"), summary.get("best_epoch")
    if test is None or epoch is None or not math.isfinite(test):
        return None
    return int(epoch), 100 * test


TEST_LABEL = "test accuracy of the best-validation checkpoint"


def report_figure(runs: Sequence[Run], title: str | None = None) -> Figure:
    """Validation accuracy (%) against epoch, one line per run in its own colour, labelled with a
    name that tells the runs apart (``run_labels``); a finished run's test accuracy is a star at the
    epoch of the checkpoint it was measured on (``test_point``). Epoch ticks are whole numbers.
    Each run's line has gid
    ``"val-{i}"`` and its star ``"test-{i}"``."""
    if not runs:
        raise UserError("no runs to plot")
    fig = new_figure(7.5, 4.5)
    ax = fig.subplots()
    stars = False
    for index, (run, name) in enumerate(zip(runs, run_labels(runs), strict=True)):
        color = palette_color(index)
        points = [
            (m["epoch"], 100 * m["val_acc"]) for m in run.metrics if m.get("val_acc") is not None
        ]
        label = f"{name} ({run.preset}), validation"
        if points:
            epochs, accuracy = zip(*points, strict=True)
            (line,) = ax.plot(epochs, accuracy, color=color, linewidth=1.5, label=label)
            line.set_gid(f"val-{index}")
        test = test_point(run)
        if test is not None:
            (star,) = ax.plot(
                [test[0]],
                [test[1]],
                marker="*",
                markersize=12,
                color=color,
                markeredgecolor="black",
                linestyle="none",
                label=None if points else f"{name} ({run.preset}), test",
            )
            star.set_gid(f"test-{index}")
            stars = True
    ax.set_xlabel("epoch")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # epochs are whole numbers
    ax.set_ylabel("accuracy (%)")
    ax.grid(color="0.9")
    handles, _ = ax.get_legend_handles_labels()
    if stars:
        # what a star means, in the colour of no run: each star has its run's colour
        handles.append(
            Line2D(
                [],
                [],
                color="white",
                marker="*",
                markersize=10,
                markeredgecolor="black",
                linestyle="none",
                label=TEST_LABEL,
            )
        )
    ax.legend(handles=handles, fontsize=8, loc="lower right")
    ax.set_title(title or "Accuracy against epoch", fontsize=11)
    return fig

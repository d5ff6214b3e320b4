"""What a run writes besides checkpoints: ``metrics.jsonl``, TensorBoard events, console lines.

Only the main rank logs. ``metrics.jsonl`` is rewritten whole (atomically) from the list of epoch
records after each checkpoint, so it always matches ``checkpoints/last.pt``, also after a resume.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from torch import nn
from tqdm import tqdm

from attnconv.models.modes import evaluating
from attnconv.runs import RunDir, write_text_atomic

# ``(model, (H, W)) -> matplotlib Figure``: what TensorBoard shows of a model with attention after
# each epoch (``attnconv.viz.figures.attention_figure``; train never imports viz itself).
EpochFigure = Callable[[nn.Module, tuple[int, int]], Any]


def format_duration(seconds: float) -> str:
    """``seconds`` as ``H:MM:SS`` (``3725.4`` -> ``1:02:05``), rounded to the second."""
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


def format_record(record: dict[str, Any], epochs: int, eta_s: float | None = None) -> str:
    """One console line for an epoch record of ``metrics.jsonl``; ``eta_s``: the seconds the
    rest of the run is expected to take, shown as ``ETA H:MM:SS`` (None: left out)."""
    line = (
        f"epoch {record['epoch']}/{epochs}  train loss {record['train_loss']:.4f} "
        f"acc {record['train_acc']:.4f} | val loss {record['val_loss']:.4f} "
        f"acc {record['val_acc']:.4f} | lr {record['lr']:.3g} | "
        f"{record['images_per_s']:.0f} img/s, {record['epoch_time_s']:.1f}s"
    )
    return line if eta_s is None else f"{line} | ETA {format_duration(eta_s)}"


def format_step(
    epoch: int,
    epochs: int,
    step: int,
    steps: int,
    loss: float,
    lr: float,
    images_per_s: float,
    eta_s: float,
) -> str:
    """The line a run prints every few optimizer steps where no progress bar can redraw: epoch
    ``epoch`` of ``epochs`` (1-based), optimizer step ``step`` of the run's ``steps``, the mean
    training loss of the epoch so far, the learning rate of the last update, images per second
    over the epoch so far and the seconds the rest of the run is expected to take."""
    return (
        f"epoch {epoch}/{epochs}  step {step}/{steps}  loss {loss:.4f} | lr {lr:.3g} | "
        f"{images_per_s:.0f} img/s | ETA {format_duration(eta_s)}"
    )


class RunLogger:
    """Console, ``metrics.jsonl`` and TensorBoard output of the main rank.

    Args:
        run: the run folder.
        epochs: the run's length (for console lines).
        enabled: False on the other ranks: every method is then a no-op.
        tensorboard: write ``run_dir/tensorboard`` event files: scalars, and for models with
            attention ``figure``'s figure every epoch.
        figure: draws the per-epoch figure (called in eval mode; the model's modes are restored);
            None: scalars only.
    """

    def __init__(
        self,
        run: RunDir,
        epochs: int,
        enabled: bool,
        tensorboard: bool,
        figure: EpochFigure | None = None,
    ) -> None:
        self.run, self.epochs, self.enabled, self.figure = run, epochs, enabled, figure
        self.writer = None
        if enabled and tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(run.tensorboard))

    def print(self, message: str) -> None:
        if self.enabled:
            tqdm.write(message)

    def step(self, step: int, loss: float, lr: float) -> None:
        """Per-step TensorBoard scalars (called every few steps)."""
        if self.writer is not None:
            self.writer.add_scalar("loss/train_step", loss, step)
            self.writer.add_scalar("lr", lr, step)

    def epoch(
        self,
        record: dict[str, Any],
        model: nn.Module,
        image_size: tuple[int, int],
        eta_s: float | None = None,
    ) -> None:
        """Console line and TensorBoard scalars (+ attention figure) for one finished epoch;
        ``eta_s``: the seconds the rest of the run is expected to take (``format_record``)."""
        if not self.enabled:
            return
        self.print(format_record(record, self.epochs, eta_s))
        if self.writer is None:
            return
        step = record["epoch"]
        for split in ("train", "val"):
            self.writer.add_scalar(f"loss/{split}", record[f"{split}_loss"], step)
            self.writer.add_scalar(f"accuracy/{split}", record[f"{split}_acc"], step)
        self.writer.add_scalar("images_per_s", record["images_per_s"], step)
        if self.figure is not None and hasattr(model, "attention_layers"):
            with evaluating(model):
                self.writer.add_figure("attention", self.figure(model, image_size), step)
        self.writer.flush()

    def metrics(self, records: list[dict[str, Any]]) -> None:
        """Rewrite ``metrics.jsonl``: one JSON object per finished epoch."""
        if not self.enabled:
            return
        write_text_atomic(self.run.metrics, "".join(json.dumps(r) + "\n" for r in records))

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()

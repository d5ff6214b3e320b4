"""What a run writes besides checkpoints: ``metrics.jsonl``, TensorBoard events, console lines.

Only the main rank logs. ``metrics.jsonl`` is rewritten whole (atomically) from the list of epoch
records after each checkpoint, so it always matches ``checkpoints/last.pt``, also after a resume.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import torch.distributed as dist
from torch import nn
from tqdm import tqdm

from attnconv.models.modes import evaluating
from attnconv.runs import RunDir, write_text_atomic
from attnconv.train import distributed
from attnconv.train.config import TrainConfig

# ``(model, (H, W)) -> matplotlib Figure``: what TensorBoard shows of a model with attention after
# each epoch (``attnconv.viz.figures.attention_figure``; train never imports viz itself).
EpochFigure = Callable[[nn.Module, tuple[int, int]], Any]


def note(message: str) -> None:
    """``message`` as a line on stderr, above any progress bar (every rank that calls it)."""
    tqdm.write(message, file=sys.stderr)


def format_duration(seconds: float) -> str:
    """``seconds`` as ``H:MM:SS`` (``3725.4`` -> ``1:02:05``), rounded to the second."""
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


def format_start(
    config: TrainConfig,
    parameters: int,
    steps_per_epoch: int,
    context: distributed.Context,
    threads: str,
    auto_precision: bool,
    resumed_at: tuple[int, int] | None,
) -> str:
    """The line a run starts with: preset, dataset, ``parameters``, steps per epoch, the device
    and process count of ``context`` (and the DDP backend), the ``threads`` it computes with and
    why (``attnconv.train.threads.choose_threads``), ``config.precision`` (``auto_precision``:
    chosen for the device) and, resuming, the ``(epoch, step)`` it resumes at (``epoch`` epochs
    trained)."""
    ddp = f" (DDP, {dist.get_backend()})" if context.distributed else ""
    line = (
        f"{config.preset} on {config.dataset}: {parameters:,} parameters, {steps_per_epoch} "
        f"steps/epoch of {config.batch_size} images, device {context.device} "
        f"x{context.world_size}{ddp}, {threads}, precision {config.precision}"
        + (" (auto)" if auto_precision else "")
    )
    if resumed_at is None:
        return line
    return f"{line}; resuming at epoch {resumed_at[0] + 1}, step {resumed_at[1]}"


def epoch_record(
    epoch: int,
    step: int,
    trained: dict[str, float],
    val_loss: float,
    val_acc: float,
    machine: str,
) -> dict[str, Any]:
    """The record of ``metrics.jsonl`` for epoch ``epoch`` (1-based), which ended at optimizer
    step ``step``: what its training gave (``trained``: ``lr`` of its last update, ``train_loss``,
    ``train_acc``, ``epoch_time_s``, ``images_per_s``), its validation loss and accuracy, and the
    ``machine`` it ran on (``attnconv.hardware.machine_description``)."""
    return {
        "epoch": epoch, "step": step,
        **{key: trained[key] for key in ("lr", "train_loss", "train_acc")},
        "val_loss": val_loss, "val_acc": val_acc,
        **{key: trained[key] for key in ("epoch_time_s", "images_per_s")},
        "machine": machine,
    }  # fmt: skip


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

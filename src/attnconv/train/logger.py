"""What a run writes besides checkpoints: ``metrics.jsonl``, TensorBoard events, console lines.

Only the main rank logs. ``metrics.jsonl`` is rewritten whole (atomically) from the list of epoch
records after each checkpoint, so it always matches ``checkpoints/last.pt``, also after a resume.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch import nn
from tqdm import tqdm

from attnconv.runs import write_atomic

# ``(model, (H, W)) -> matplotlib Figure``: what TensorBoard shows of a model with attention after
# each epoch (``attnconv.viz.figures.attention_figure``; train never imports viz itself).
EpochFigure = Callable[[nn.Module, tuple[int, int]], Any]


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` through a temporary file, fsync and a rename."""
    write_atomic(path, text.encode())


def write_json(path: Path, value: Any) -> None:
    """Write ``value`` as indented JSON, atomically."""
    write_text_atomic(path, json.dumps(value, indent=2) + "\n")


def format_record(record: dict[str, Any], epochs: int) -> str:
    """One console line for an epoch record of ``metrics.jsonl``."""
    return (
        f"epoch {record['epoch']}/{epochs}  train loss {record['train_loss']:.4f} "
        f"acc {record['train_acc']:.4f} | val loss {record['val_loss']:.4f} "
        f"acc {record['val_acc']:.4f} | lr {record['lr']:.3g} | "
        f"{record['images_per_s']:.0f} img/s, {record['epoch_time_s']:.1f}s"
    )


class RunLogger:
    """Console, ``metrics.jsonl`` and TensorBoard output of the main rank.

    Args:
        run_dir: the run folder.
        epochs: the run's length (for console lines).
        enabled: False on the other ranks: every method is then a no-op.
        tensorboard: write ``run_dir/tensorboard`` event files: scalars, and for models with
            attention ``figure``'s figure every epoch.
        figure: draws the per-epoch figure (called in eval mode; the model's mode is restored);
            None: scalars only.
    """

    def __init__(
        self,
        run_dir: Path,
        epochs: int,
        enabled: bool,
        tensorboard: bool,
        figure: EpochFigure | None = None,
    ) -> None:
        self.run_dir, self.epochs, self.enabled, self.figure = run_dir, epochs, enabled, figure
        self.writer = None
        if enabled and tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(run_dir / "tensorboard"))

    def print(self, message: str) -> None:
        if self.enabled:
            tqdm.write(message)

    def step(self, step: int, loss: float, lr: float) -> None:
        """Per-step TensorBoard scalars (called every few steps)."""
        if self.writer is not None:
            self.writer.add_scalar("loss/train_step", loss, step)
            self.writer.add_scalar("lr", lr, step)

    def epoch(self, record: dict[str, Any], model: nn.Module, image_size: tuple[int, int]) -> None:
        """Console line and TensorBoard scalars (+ attention figure) for one finished epoch."""
        if not self.enabled:
            return
        self.print(format_record(record, self.epochs))
        if self.writer is None:
            return
        step = record["epoch"]
        for split in ("train", "val"):
            self.writer.add_scalar(f"loss/{split}", record[f"{split}_loss"], step)
            self.writer.add_scalar(f"accuracy/{split}", record[f"{split}_acc"], step)
        self.writer.add_scalar("images_per_s", record["images_per_s"], step)
        if self.figure is not None and hasattr(model, "attention_layers"):
            was_training = model.training
            model.eval()
            try:
                self.writer.add_figure("attention", self.figure(model, image_size), step)
            finally:
                model.train(was_training)
        self.writer.flush()

    def metrics(self, records: list[dict[str, Any]]) -> None:
        """Rewrite ``metrics.jsonl``: one JSON object per finished epoch."""
        if not self.enabled:
            return
        write_text_atomic(
            self.run_dir / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in records)
        )

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()

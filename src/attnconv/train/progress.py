"""Progress: an epoch's running loss and accuracy, what a run shows of it while it trains, and how
long the rest will take.

On a terminal a bar redraws in place (images done, rate, the running loss and learning rate).
Where stderr is not a terminal (a log file, a pipe, nohup, a notebook) the bar cannot redraw, so a
line (``attnconv.train.logger.format_step``: loss, rate, images per second, ETA) says where the
run is every ``log_interval`` optimizer steps of the run.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch
from tqdm import tqdm

from attnconv.train import distributed
from attnconv.train.logger import format_step

CHECK_EVERY = 10  # steps of an epoch between loss-finiteness checks and progress-bar updates
# Optimizer steps between the progress lines of a run whose stderr is not a terminal (a log file,
# a pipe, nohup, a notebook), where the progress bar cannot redraw in place.
LOG_INTERVAL = 50
# An epoch's running sums, as a mid-epoch checkpoint carries them (``epoch_progress``, all ranks').
PROGRESS_KEYS: tuple[str, ...] = ("loss_sum", "correct", "seen")


class EpochSums:
    """An epoch's running sums on this rank, float64 on ``device``: summed training loss (mean
    loss · images), correct predictions, images; ``start`` (``PROGRESS_KEYS``) holds those of the
    steps before (rank 0 of an epoch resumed from a mid-epoch checkpoint: all ranks' sums)."""

    def __init__(self, start: dict[str, float], device: torch.device) -> None:
        self.device = device
        self.sums = torch.tensor(
            [start[key] for key in PROGRESS_KEYS], dtype=torch.float64, device=device
        )

    @torch.no_grad()
    def add(self, loss: torch.Tensor, logits: torch.Tensor, labels: torch.Tensor) -> None:
        """One batch: its mean ``loss``, ``logits`` ``(B, classes)`` and ``labels`` ``(B,)``."""
        count = labels.shape[0]
        self.sums += torch.stack(
            [
                loss.detach().double() * count,
                (logits.argmax(dim=1) == labels).sum().double(),
                torch.tensor(float(count), dtype=torch.float64, device=self.device),
            ]
        )

    def mean_loss(self) -> float:
        """The mean training loss of the epoch so far, over every rank (each rank calls it)."""
        loss_sum, seen = distributed.all_reduce_sum(
            self.sums[:1].tolist() + self.sums[2:].tolist(), self.device
        )
        return loss_sum / max(seen, 1.0)

    def totals(self) -> dict[str, float]:
        """The sums over every rank (each rank calls it), by ``PROGRESS_KEYS``."""
        totals = distributed.all_reduce_sum(self.sums.tolist(), self.device)
        return dict(zip(PROGRESS_KEYS, totals, strict=True))


class EpochProgress:
    """The progress of one (possibly resumed) epoch.

    Args:
        epoch: the epoch, 0-based, of ``epochs`` in the run.
        steps_per_epoch: optimizer steps of an epoch; ``start_batch`` of them done before (a
            resumed epoch).
        batch_size: images per optimizer step (all ranks).
        shown: this process shows progress (the main rank, with ``config.progress``).
        log_interval: optimizer steps of the run between lines off a terminal; 0: none.
        between_s: seconds an epoch takes besides its training steps (validation, checkpoints),
            part of the ETA.
        print_line: prints a line (``RunLogger.print``).
        clock: seconds, as ``time.perf_counter``; read as the epoch starts, for each line and as
            it ends.
    """

    def __init__(
        self,
        epoch: int,
        epochs: int,
        steps_per_epoch: int,
        start_batch: int,
        batch_size: int,
        *,
        shown: bool,
        log_interval: int,
        between_s: float,
        print_line: Callable[[str], None],
        clock: Callable[[], float],
    ) -> None:
        self.epoch, self.epochs, self.per_epoch = epoch, epochs, steps_per_epoch
        self.start_batch, self.batch_size, self.log_interval = start_batch, batch_size, log_interval
        self.between_s, self.print_line, self.clock = between_s, print_line, clock
        terminal = sys.stderr.isatty()
        self.lines = shown and not terminal
        self.bar = tqdm(
            total=steps_per_epoch * batch_size,
            initial=start_batch * batch_size,
            unit="img",
            unit_scale=True,
            desc=f"epoch {epoch + 1}/{epochs}",
            disable=not (shown and terminal),
            leave=False,
            file=sys.stderr,
            dynamic_ncols=True,
        )
        self.started = clock()

    def line_due(self, step: int) -> bool:
        """Whether a line is due after optimizer step ``step`` of the run (the same answer on
        every rank: the loss it shows is summed over them)."""
        return self.log_interval > 0 and step % self.log_interval == 0

    def advance(self) -> None:
        """One optimizer step done."""
        self.bar.update(self.batch_size)

    def show(self, step: int, loss: float, lr: float, line: bool) -> None:
        """After optimizer step ``step`` of the run: ``loss`` (the epoch's mean so far) and ``lr``
        (the rate of its update) on the bar, and with ``line`` the line off a terminal."""
        self.bar.set_postfix(loss=f"{loss:.4f}", lr=f"{lr:.3g}")
        if not (line and self.lines):
            return
        in_epoch = step - self.epoch * self.per_epoch
        per_step = (self.clock() - self.started) / (in_epoch - self.start_batch)
        total = self.epochs * self.per_epoch
        eta = (total - step) * per_step + (self.epochs - self.epoch) * self.between_s
        images_per_s = self.batch_size / per_step
        self.print_line(
            format_step(self.epoch + 1, self.epochs, step, total, loss, lr, images_per_s, eta)
        )

    def close(self) -> float:
        """Close the bar; the seconds the epoch's training steps took here."""
        self.bar.close()
        return self.clock() - self.started


def eta_s(
    epoch_time_s: float, steps_per_epoch: int, steps: int, between_s: float, epochs_left: int
) -> float:
    """The seconds ``epochs_left`` epochs will take at the pace of the one just trained: its
    training time ``epoch_time_s`` over ``steps`` steps (a resumed epoch ran only part of its
    ``steps_per_epoch``) scaled to a whole epoch, plus ``between_s``, what an epoch takes besides
    (validation, checkpoints)."""
    return epochs_left * (epoch_time_s * steps_per_epoch / steps + between_s)

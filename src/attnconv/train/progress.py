"""Progress: an epoch's running loss and accuracy, what a run shows of it while it trains, and how
long the rest will take.

On a terminal a bar redraws in place (images done, rate, the running loss and learning rate).
Where stderr is not a terminal (a log file, a pipe, nohup, a notebook) the bar cannot redraw, so a
line (``attnconv.train.logger.format_step``: loss, rate, images per second, ETA) says where the
run is every ``log_interval`` optimizer steps of the run, the first one after at most
``FIRST_LINE_S`` seconds of training.
"""

from __future__ import annotations

import math
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
# Seconds of training in a process after which its first progress report is due at the latest.
FIRST_LINE_S = 5.0
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


class Progress:
    """What a run shows while it trains (one per ``train`` call, all ranks): the bar of each epoch
    on a terminal, else lines (module docstring).

    A report is due after every ``log_interval`` optimizer steps of the run and, once, as soon as
    ``first_line_s`` seconds of training have passed here without one: a slow run shows where it
    is after a few seconds, not only at step ``log_interval`` (tcnn-fashion-small at ~4 s a step
    printed its first line after 3.4 minutes). Off a terminal a report is a line; on one it puts
    the running loss on the bar.

    Args:
        epochs, steps_per_epoch, batch_size: the run's (``batch_size``: images per optimizer step,
            all ranks).
        progress: ``config.progress``: reports at all (``log_interval`` 0: none either).
        main: this is the main rank: it shows the bar or prints the lines, and its clock says
            when the first report is due (the ranks agree on it through ``device``).
        log_interval: optimizer steps of the run between reports.
        print_line: prints a line (``RunLogger.print``).
        clock: seconds (``time.perf_counter``), read as each epoch starts and after each step.
        device: where the ranks of a distributed run sum their votes for a report.
        first_line_s: seconds of training in this process after which the first report is due.
    """

    def __init__(
        self,
        epochs: int,
        steps_per_epoch: int,
        batch_size: int,
        *,
        progress: bool,
        main: bool,
        log_interval: int,
        print_line: Callable[[str], None],
        clock: Callable[[], float],
        device: torch.device,
        first_line_s: float = FIRST_LINE_S,
    ) -> None:
        self.epochs, self.per_epoch, self.batch_size = epochs, steps_per_epoch, batch_size
        self.main, self.log_interval = main, log_interval
        self.print_line, self.clock, self.device = print_line, clock, device
        self.shown = main and progress
        self.terminal = sys.stderr.isatty()
        self.waiting = progress and log_interval > 0  # for the first report of this process
        self.first_due = math.inf  # the clock's reading when it is due, set as training starts
        self.first_line_s = first_line_s

    def start_epoch(self, epoch: int, start_batch: int, between_s: float) -> None:
        """Epoch ``epoch`` (0-based) starts training, ``start_batch`` of its steps done before
        (a resumed epoch); an epoch takes ``between_s`` seconds besides its training steps
        (validation, checkpoints: part of the ETA)."""
        self.epoch, self.start_batch, self.between_s = epoch, start_batch, between_s
        self.bar = tqdm(
            total=self.per_epoch * self.batch_size,
            initial=start_batch * self.batch_size,
            unit="img",
            unit_scale=True,
            desc=f"epoch {epoch + 1}/{self.epochs}",
            disable=not (self.shown and self.terminal),
            leave=False,
            file=sys.stderr,
            dynamic_ncols=True,
        )
        self.started = self.now = self.clock()
        self.first_due = min(self.first_due, self.started + self.first_line_s)

    def step(self, step: int) -> bool:
        """Optimizer step ``step`` of the run is done; whether a report is due after it. Every
        rank calls it after every step and gets the same answer (the loss a report shows is
        summed over the ranks): while the first report is awaited, the main rank's clock decides,
        summed over the ranks."""
        self.bar.update(self.batch_size)
        self.now = self.clock()
        due = self.log_interval > 0 and step % self.log_interval == 0
        if self.waiting and not due:
            late = self.main and self.now >= self.first_due
            due = distributed.all_reduce_sum([float(late)], self.device)[0] > 0
        self.waiting = self.waiting and not due
        return due

    def show(self, step: int, loss: float, lr: float, line: bool) -> None:
        """After optimizer step ``step`` of the run: ``loss`` (the epoch's mean so far) and ``lr``
        (the rate of its update) on the bar, and with ``line`` (a report) the line off a
        terminal: images per second and the ETA at the pace of the epoch so far."""
        self.bar.set_postfix(loss=f"{loss:.4f}", lr=f"{lr:.3g}")
        if not (line and self.shown and not self.terminal):
            return
        in_epoch = step - self.epoch * self.per_epoch
        per_step = (self.now - self.started) / (in_epoch - self.start_batch)
        total = self.epochs * self.per_epoch
        eta = (total - step) * per_step + (self.epochs - self.epoch) * self.between_s
        images_per_s = self.batch_size / per_step
        self.print_line(
            format_step(self.epoch + 1, self.epochs, step, total, loss, lr, images_per_s, eta)
        )

    def end_epoch(self) -> float:
        """Close the epoch's bar; the seconds its training steps took here."""
        self.bar.close()
        return self.now - self.started


def eta_s(
    epoch_time_s: float, steps_per_epoch: int, steps: int, between_s: float, epochs_left: int
) -> float:
    """The seconds ``epochs_left`` epochs will take at the pace of the one just trained: its
    training time ``epoch_time_s`` over ``steps`` steps (a resumed epoch ran only part of its
    ``steps_per_epoch``) scaled to a whole epoch, plus ``between_s``, what an epoch takes besides
    (validation, checkpoints)."""
    return epochs_left * (epoch_time_s * steps_per_epoch / steps + between_s)

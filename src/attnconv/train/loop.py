"""The training loop: SGD or AdamW with the preset's schedule, validation-based model selection,
exact resume.

``train(config, run_dir)`` runs one job (one process, or every rank of a ``torchrun`` launch)::

    for epoch in epochs:
        for batch in this rank's shards:  lr ← schedule(step); SGD/AdamW step (DDP averages grads)
            every checkpoint_steps steps: checkpoints/last.pt (mid-epoch, resumable)
        validate → metrics.jsonl, TensorBoard, checkpoints/last.pt, best.pt, epoch_NNNN.pt
    test the best (validation) checkpoint → summary.json

The main rank holds the run folder's lock (``attnconv.runs.locked_run``) for the whole job. A
diverged state is never saved (the run stops with NonFiniteLossError) and every kill point leaves
a resumable run (``checkpoint``). Everything random is a function of the config's seed and the
position in training (data order and augmentation: ``BatchLoader``; dropout: the torch RNG, saved
in every checkpoint; the attention routes it measured: ``routes.json``), so a run resumed from any
checkpoint on a CPU with as many threads ends with exactly the weights of an uninterrupted run
(``resume``, ``threads``). Also beside this room: ``build``, ``progress``, ``evaluation``.
"""

from __future__ import annotations

import math
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from attnconv.data import BatchLoader, load_splits
from attnconv.errors import UserError
from attnconv.hardware import machine_description
from attnconv.memory import reuse_freed_memory
from attnconv.models import count_parameters
from attnconv.models.checkpoint import save_checkpoint
from attnconv.models.presets import size_note
from attnconv.runs import RunDir, RunLock, locked_run, write_json
from attnconv.train import build, checkpoint, distributed, evaluation, progress, resume
from attnconv.train.build import check_data_fits, data_model_config
from attnconv.train.checkpoint import ROUTES_FILE
from attnconv.train.config import TrainConfig, save_config
from attnconv.train.evaluation import autocast, evaluation_sums, machines_of
from attnconv.train.logger import EpochFigure, RunLogger, epoch_record, format_start
from attnconv.train.progress import LOG_INTERVAL, PROGRESS_KEYS
from attnconv.train.resume import TrainingInterrupted, interrupted_advice, resumed_run
from attnconv.train.schedule import LRSchedule, build_schedule
from attnconv.train.threads import torch_threads, training_threads

# The names other modules and users' scripts import from here (some live in build, evaluation).
__all__ = ["LOG_INTERVAL", "ROUTES_FILE", "NonFiniteLossError", "Trainer", "autocast",
           "check_data_fits", "data_model_config", "evaluation_sums", "machines_of", "train",
           "train_in_plans"]  # fmt: skip


class NonFiniteLossError(RuntimeError):
    """Training diverged (a NaN or infinite loss or weight); the run stopped without saving that
    state, so ``checkpoints/last.pt`` holds the last finite one."""


def train(
    config: TrainConfig | None,
    run_dir: str | Path,
    resume: bool = False,
    *,
    epochs: int | None = None,
    init_checkpoint: dict[str, Any] | None = None,
    epoch_figure: EpochFigure | None = None,
    log_interval: int = LOG_INTERVAL,
    stop_after: int | None = None,
    threads: int | None = None,
) -> dict[str, Any]:
    """Train (or, with ``resume``, continue) the run in ``run_dir``; returns the summary dict
    (empty when ``stop_after`` ended it before its last epoch).

    Args:
        config: the run's config. A resumed run keeps the config saved in its
            ``checkpoints/last.pt`` (the one source of truth: ``config.json`` is a copy for people
            to read, rewritten from it): pass None, or a config equal to that one (UserError
            naming the keys that differ otherwise).
        epochs: only with ``resume``: the run's new length in epochs, to train a finished (or
            interrupted) run on to epoch ``epochs``; it must exceed the epochs it has trained.
            The schedule is re-planned over the new length
            (``attnconv.train.config.extended_config``).
        init_checkpoint: ``config.init`` already loaded (``load_checkpoint``), so that a caller
            that read it, e.g. for its dataset, does not load it again.
        epoch_figure: ``(model, (H, W)) -> matplotlib Figure`` drawn into TensorBoard after
            every epoch for models with attention (``attnconv.viz.figures.attention_figure``);
            None: scalars only.
        log_interval: where ``config.progress`` asks for progress but stderr is not a terminal
            (a log file, a pipe, a notebook), a line every ``log_interval`` optimizer steps of the
            run (``attnconv.train.logger.format_step``: loss, rate, images per second, ETA), the
            first after at most ``attnconv.train.progress.FIRST_LINE_S`` seconds; 0: none, only
            the line per epoch. A setting of this call, not of the run: a resume takes its own.
        stop_after: end this call once the run has trained this many epochs in all (>= 1),
            leaving it as an interrupted run with its checkpoint (no test, no summary), to be
            resumed, possibly with a new length: how ``train_in_plans`` repeats a run that was
            re-planned part-way. None, or the run's length: train to the end.
        threads: the threads torch computes with during this call (then put back); None: as
            many as the cores other work leaves idle, at most torch's count, or
            ``OMP_NUM_THREADS`` if set (``attnconv.train.threads``). Said in the start line.

    Joins the ``torchrun`` process group when launched by it; the main rank holds the run
    folder's lock throughout. Raises NonFiniteLossError if training diverges
    (``checkpoints/last.pt`` then still holds the last finite state), RunFolderError if another
    process holds the folder, a fresh run finds one there, the folder is deleted or replaced
    while the run writes it, or a write fails (disk full, read-only), and TrainingInterrupted (a
    KeyboardInterrupt saying what a resume continues from) on Ctrl-C.
    """
    run = RunDir(run_dir)
    resumed = None
    if resume:
        resumed, config = resumed_run(run, config, epochs)
    elif config is None:
        raise TypeError("train() needs a config unless it resumes a run")
    elif epochs is not None:
        raise TypeError(
            "train(epochs=...) extends a resumed run; a new run's length is config.epochs"
        )
    if log_interval < 0:
        raise UserError(f"log_interval must be >= 0 steps (0: no step lines), got {log_interval}")
    if stop_after is not None and stop_after < 1:
        raise UserError(f"stop_after must be >= 1 epoch, got {stop_after}")
    count, why = training_threads(threads)
    context = distributed.setup(config.device)
    locking = locked_run(run.root) if context.is_main else nullcontext()
    try:
        with torch_threads(count), locking as lock, checkpoint.kept_routes(run, context.is_main):
            trainer = Trainer(config, run.root, context, resumed, init_checkpoint, epoch_figure,
                              lock=lock, log_interval=log_interval, threads=why)  # fmt: skip
            return trainer.fit(stop_after)
    except KeyboardInterrupt as err:
        raise TrainingInterrupted(interrupted_advice(run)) from err
    finally:
        distributed.teardown()


def train_in_plans(
    config: TrainConfig,
    run_dir: str | Path,
    plans: list[tuple[int, int]],
    *,
    init_checkpoint: dict[str, Any] | None = None,
    **options: Any,
) -> dict[str, Any]:
    """Train ``config`` as a run that was re-planned part-way, and return its summary.

    ``plans``: ``(length, stop)`` per plan, oldest first (``attnconv.train.config.RecordedRun``):
    the run trains to epoch ``stop`` of a ``length``-epoch plan (``config.epochs`` is the first
    length), then ``train(resume=True, epochs=next length)`` re-plans it, and so on; the last
    plan runs to its end. A folder holding part of the run is continued from where it stands
    (the plan it is on is the number of re-plans its checkpoint records), a finished one is left
    alone. One plan: ``train`` (or resume) as usual. ``options``: ``train``'s keyword arguments.
    UserError when the plans do not chain, or the folder holds another run (with several plans:
    its saved config is not ``config``, where it writes and reports aside) or one that went past
    them.
    """
    return resume.run_plans(train, config, RunDir(run_dir), plans, init_checkpoint, options)


class Trainer:
    """One training job; see the module docstring. ``fit()`` runs it."""

    def __init__(
        self,
        config: TrainConfig,
        run_dir: Path,
        context: distributed.Context,
        resumed: dict[str, Any] | None,
        init_checkpoint: dict[str, Any] | None = None,
        epoch_figure: EpochFigure | None = None,
        *,
        lock: RunLock | None = None,
        log_interval: int = LOG_INTERVAL,
        threads: str = "",
    ) -> None:
        self.threads = threads  # the threads it computes with and why, for the start line
        self.between_s = 0.0  # seconds an epoch took besides training (progress.eta_s), here
        self.device = context.device
        if self.device.type == "cpu":
            reuse_freed_memory()  # no page faults for each step's large tensors: attnconv.memory
        self.requested_precision = config.precision
        self.config = config = build.resolved_precision(config, self.device, context.is_main)
        self.context, self.run = context, RunDir(run_dir)
        self.writer = checkpoint.RunWriter(self.run, lock)  # the main rank's, lock checked first
        resume.check_start(self.run, resumed, config, init_checkpoint is not None)
        with distributed.local_rank_zero_first(context):  # one download per machine
            self.data = load_splits(config.dataset, config.data_dir, config.val_size,
                                    seed=config.seed)  # fmt: skip

        torch.manual_seed(config.seed)  # the same initial weights on every rank
        model, self.architecture, self.arguments = build.run_model(
            config, self.data, resumed, self.run.last, init_checkpoint, context.is_main
        )
        self.model = model.to(self.device)
        torch.manual_seed(build.dropout_seed(config.seed, context.rank))
        if context.distributed and self.device.type == "cuda":
            self.model = nn.SyncBatchNorm.convert_sync_batchnorm(self.model)
        self.optimizer = self._build_optimizer()
        self.forward_model = build.forward_model(self.model, context, config.compile)

        shards = {"device": self.device, "rank": context.rank, "world_size": context.world_size}
        self.train_loader = BatchLoader(
            self.data.train, config.batch_size, train=True, flip=self.data.flip,
            pad=build.crop_pad(config, self.data), seed=config.seed,
            placement=self.data.placement, **shards,
        )  # fmt: skip
        self.val_loader = BatchLoader(self.data.val, config.batch_size, train=False, flip=False,
                                      **shards)  # fmt: skip
        self.steps_per_epoch = len(self.train_loader)
        self.schedule: LRSchedule = build_schedule(
            config.schedule, config.lr, config.epochs, self.steps_per_epoch,
            config.warmup_fraction, config.milestones, config.schedule_stepping,
        )  # fmt: skip
        self.planned_epochs, self.replans = resume.replans_of(resumed, config, self.run)
        self.epoch, self.step = 0, 0
        self.metrics: list[dict[str, Any]] = []
        self.epoch_sums = dict.fromkeys(PROGRESS_KEYS, 0.0)  # a mid-epoch checkpoint's, on rank 0
        if resumed is not None:
            restored = resume.restore(resumed, self.optimizer, context.rank, self.run.last,
                                      config.epochs, self.steps_per_epoch)  # fmt: skip
            self.epoch, self.step, self.metrics = restored.epoch, restored.step, restored.records
            self.epoch_sums = restored.sums or self.epoch_sums  # mid-epoch (rank 0): its sums
            self.writer.saved_step = self.step
            if context.is_main:  # the copies of last.pt a kill left missing or stale
                checkpoint.repair_copies(resumed, self.run, config.checkpoint_every, self.writer)
        self.logger = RunLogger(
            self.run, config.epochs, context.is_main, config.tensorboard, epoch_figure
        )
        self.progress = progress.Progress(
            config.epochs, self.steps_per_epoch, config.batch_size, progress=config.progress,
            main=context.is_main, log_interval=log_interval, print_line=self.logger.print,
            clock=time.perf_counter, device=self.device,
        )  # fmt: skip

    def _build_optimizer(self) -> torch.optim.Optimizer:
        return build.build_optimizer(self.model, self.config)

    def _checkpoint(self, epoch_progress: dict[str, float] | None) -> dict[str, Any]:
        """The run's state now (``epoch_progress``: the epoch's sums so far, mid-epoch)."""
        return {
            "preset": self.config.preset, "dataset": self.config.dataset,
            "architecture": self.architecture, "arguments": self.arguments,
            "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
            "rng": checkpoint.gathered_rng_states(self.context),
            "epoch": self.epoch, "step": self.step, "config": self.config.to_dict(),
            "replans": self.replans, "metrics": self.metrics, "epoch_progress": epoch_progress,
        }  # fmt: skip

    def _save(self, state: dict[str, Any], *paths: Path) -> None:
        """Write the checkpoint ``state`` to each of ``paths`` in turn (main rank); RunFolderError
        if a write fails, the files written before it staying valid."""
        if self.context.is_main:
            for path in paths:
                with self.writer.writing(path):
                    save_checkpoint(state, path)
                if path == self.run.last:
                    self.writer.saved_step = state["step"]

    def _diverged(self, what: str) -> None:
        raise NonFiniteLossError(
            f"training diverged at epoch {self.epoch + 1}, step {self.step}: {what}; stopping "
            f"without saving it ({self.writer.kept()}). Try a lower lr, grad_clip=1, or "
            f"precision=fp32."
        )

    def _running_loss(self, sums: progress.EpochSums) -> float:
        """The (all-rank) mean training loss so far this epoch; NonFiniteLossError if not finite."""
        loss = sums.mean_loss()
        if not math.isfinite(loss):
            self._diverged(f"the training loss is {loss}")
        return loss

    def _check_state(self, batch: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        """NonFiniteLossError unless the state to save is sound (``checkpoint.unsound_state``)."""
        what = checkpoint.unsound_state(self.model, batch, self.config.precision, self.device)
        if what is not None:
            self._diverged(what)

    def _train_epoch(self) -> dict[str, float]:
        """One (possibly resumed) epoch of training; returns its train loss/accuracy and timing."""
        config, epoch, per_epoch = self.config, self.epoch, self.steps_per_epoch
        start_batch = self.step - epoch * per_epoch
        sums = progress.EpochSums(self.epoch_sums, self.device)
        self.progress.start_epoch(epoch, start_batch, self.between_s)
        self.forward_model.train()
        for images, labels in self.train_loader.epoch(epoch, start_batch):
            lr = self.schedule(self.step)
            for group in self.optimizer.param_groups:
                group["lr"] = lr * group.get("lr_scale", 1.0)
            with autocast(config.precision, self.device):
                logits = self.forward_model(images)
                loss = F.cross_entropy(logits, labels)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if config.grad_clip is not None:
                nn.utils.clip_grad_norm_(self.model.parameters(), config.grad_clip)
            self.optimizer.step()
            self.step += 1
            sums.add(loss, logits, labels)
            in_epoch = self.step - epoch * per_epoch
            save = config.checkpoint_steps > 0 and in_epoch != per_epoch \
                and self.step % config.checkpoint_steps == 0  # fmt: skip
            # every rank reaches the same steps here: the running loss sums over the ranks
            line_due = self.progress.step(self.step)
            if save or line_due or in_epoch % progress.CHECK_EVERY == 0:
                running = self._running_loss(sums)
                self.writer.check_lock()  # before TensorBoard writes into the folder
                self.logger.step(self.step, running, lr)
                self.progress.show(self.step, running, lr, line=line_due)
            if save:  # a mid-epoch last.pt, with the epoch's sums so far
                totals = sums.totals()
                self._check_state((images, labels))
                self._save(self._checkpoint(totals), self.run.last)
        elapsed = self.progress.end_epoch()
        self._running_loss(sums)
        totals = sums.totals()
        self.epoch_sums = dict.fromkeys(PROGRESS_KEYS, 0.0)
        return {
            "lr": self.schedule(self.step - 1),
            "train_loss": totals["loss_sum"] / totals["seen"],
            "train_acc": totals["correct"] / totals["seen"],
            "epoch_time_s": elapsed,
            "images_per_s": (per_epoch - start_batch) * config.batch_size / elapsed,
        }

    def fit(self, stop_after: int | None = None) -> dict[str, Any]:
        """Train to the end (or to epoch ``stop_after``: see ``train``); the summary dict."""
        config, logger = self.config, self.logger
        if self.context.is_main:
            with self.writer.writing(self.run.config):
                save_config(config, self.run.config)
        with self.writer.writing(self.run.metrics):
            logger.metrics(self.metrics)
        logger.print(format_start(config, count_parameters(self.model), self.steps_per_epoch,
                                  self.context, self.threads, self.requested_precision == "auto",
                                  (self.epoch, self.step) if self.step else None))  # fmt: skip
        if self.planned_epochs != config.epochs:
            next_rate = self.schedule(self.step)
            logger.print(resume.replanned_note(config, self.planned_epochs, next_rate))
        size = size_note(config.preset, config.dataset, tuple(self.data.image_size), config.model)
        if size is not None:
            logger.print(size)
        end = config.epochs if stop_after is None else min(stop_after, config.epochs)
        try:
            while self.epoch < end:
                steps_left = self.steps_per_epoch * (self.epoch + 1) - self.step
                trained = self._train_epoch()
                trained_at = time.perf_counter()
                loss_sum, correct, seen = distributed.all_reduce_sum(  # every rank's shard
                    evaluation_sums(self.model, self.val_loader, config.precision), self.device
                )
                val_loss, val_acc = loss_sum / seen, correct / seen
                if not math.isfinite(val_loss):
                    self._diverged(f"the validation loss is {val_loss}")
                self._check_state()
                self.epoch += 1
                record = epoch_record(self.epoch, self.step, trained, val_loss, val_acc,
                                      machine_description(self.device))  # fmt: skip
                self.metrics.append(record)
                self.writer.check_lock()
                # what an epoch takes besides training: the epoch before's (the first one here:
                # this one's validation so far)
                between = self.between_s or time.perf_counter() - trained_at
                eta = progress.eta_s(record["epoch_time_s"], self.steps_per_epoch, steps_left,
                                     between, config.epochs - self.epoch)  # fmt: skip
                logger.epoch(record, self.model, self.data.image_size, eta)
                # last.pt first: a kill before a copy is written is repaired by the resume.
                copies = checkpoint.epoch_copies(
                    self.run, self.epoch, self.metrics, config.checkpoint_every
                )
                self._save(self._checkpoint(None), self.run.last, *copies)
                with self.writer.writing(self.run.metrics):
                    logger.metrics(self.metrics)
                self.between_s = time.perf_counter() - trained_at
            if self.epoch < config.epochs:
                logger.print(resume.stopped_note(self.run, self.epoch, config.epochs))
                return {}
            return self._finish()
        finally:
            logger.close()

    def _finish(self) -> dict[str, Any]:
        """Test the best checkpoint (main rank) and write ``summary.json``; RunFolderError if
        ``best.pt`` is not the epoch the metrics name as best."""
        summary: dict[str, Any] = {}
        if self.context.is_main:
            tested = evaluation.test_best(
                self.run.best, self.metrics, self.data.test, self.config, self.device
            )
            summary = evaluation.run_summary(self.config, self.model, self.metrics,
                                             self.steps_per_epoch, self.replans, self.run.best,
                                             tested, self.data.test)  # fmt: skip
            with self.writer.writing(self.run.summary):
                write_json(self.run.summary, summary)
            self.logger.print(evaluation.format_summary(summary, self.run.root))
        distributed.barrier()
        return summary

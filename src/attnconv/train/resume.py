"""Resume: reading a run back from its ``checkpoints/last.pt`` to continue it exactly.

The checkpoint is the one source of truth: the config saved in it (``config.json`` is a copy for
people to read), the optimizer state, every rank's RNG state, the epoch records, the position
(epoch and step, checked to be a point of the run) and, for a mid-epoch checkpoint, the running
sums of the epoch so far. A resume may re-plan the run's length (``train(..., epochs=N)``); each
re-plan is recorded, so that the run's summary can name the command that repeats it. Ctrl-C ends a
run with a ``TrainingInterrupted`` saying what a resume continues from.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from attnconv.errors import UserError
from attnconv.models.checkpoint import CheckpointError, load_checkpoint
from attnconv.runs import RunDir, RunFolderError, read_json
from attnconv.train.checkpoint import saved_position, set_rng_state
from attnconv.train.config import BOOKKEEPING_KEYS, TrainConfig, extended_config
from attnconv.train.logger import note
from attnconv.train.progress import PROGRESS_KEYS


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT) stopped training; the message says how to go on from what was saved."""


def interrupted_advice(run: RunDir) -> str:
    """What an interrupted run in ``run`` continues from, and the command that continues it."""
    position = saved_position(run.last)
    if position is None:
        return "no checkpoint was saved yet: start the run again with the same command"
    return (
        f"the last checkpoint is {run.last} (step {position[1]}): continue with: attnconv train "
        f"--resume {run.root}"
    )


def resumed_run(
    run: RunDir, given: TrainConfig | None, epochs: int | None
) -> tuple[dict[str, Any], TrainConfig]:
    """The last checkpoint of the run in ``run`` and the config it continues with: the one saved
    in it (``resumed_config``; ``given``, if not None, must equal it), re-planned to ``epochs``
    epochs if given (``attnconv.train.config.extended_config``)."""
    resumed = load_checkpoint(run.last)
    config = resumed_config(resumed, given, run)
    if epochs is not None:
        config = extended_config(config, epochs, trained=int(resumed["epoch"]))
    return resumed, config


def resumed_config(
    checkpoint: dict[str, Any], given: TrainConfig | None, run: RunDir
) -> TrainConfig:
    """The config saved in the run's last checkpoint; UserError if ``given`` differs from it.

    A ``config.json`` that differs (edited by hand) is named in a note and does not count.
    """
    if "config" not in checkpoint:
        raise CheckpointError(
            f"checkpoint {run.last} holds no training config; it cannot be resumed"
        )
    saved = TrainConfig.from_dict(checkpoint["config"])
    if given is not None and given != saved:
        keys = [k for k, v in given.to_dict().items() if saved.to_dict().get(k) != v]
        raise UserError(
            f"a resumed run keeps the config saved in {run.last}; the given config differs in "
            f"{', '.join(keys)}"
        )
    try:
        written = read_json(run.config, "the run's config", expect=None)
    except (OSError, ValueError):  # missing, unreadable, not JSON: written again below
        written = None
    if written != saved.to_dict():
        keys = sorted(
            k for k in {*saved.to_dict(), *(written or {})}
            if not isinstance(written, dict) or written.get(k) != saved.to_dict().get(k)
        )  # fmt: skip
        note(
            f"note: {run.config} differs from the config saved in {run.last}"
            f" ({', '.join(keys) if isinstance(written, dict) else 'unreadable'}); the run "
            f"continues with the checkpoint's, and config.json is rewritten from it"
        )
    return saved


def stopped_note(run: RunDir, epoch: int, epochs: int) -> str:
    """The line a run of ``epochs`` epochs in ``run`` ends with when ``train(stop_after=epoch)``
    stopped it after ``epoch``."""
    return (
        f"stopped after epoch {epoch} of {epochs} as asked; continue with: attnconv train "
        f"--resume {run.root}"
    )


def check_start(
    run: RunDir, resumed: dict[str, Any] | None, config: TrainConfig, init_loaded: bool
) -> None:
    """RunFolderError if a new run (``resumed`` None) finds a run in ``run``; CheckpointError if
    the checkpoint it resumes is of another preset than its config; ValueError if an ``--init``
    checkpoint was loaded (``init_loaded``) for a config without one."""
    if resumed is None and run.last.exists():
        raise RunFolderError(
            f"{run.root} already holds a run; continue it with --resume {run.root} or give "
            f"another --out"
        )
    if resumed is not None and resumed["preset"] != config.preset:
        raise CheckpointError(
            f"{run.last} is a checkpoint of preset "
            f"{resumed['preset']!r}, but the config saved in it says {config.preset!r}"
        )
    if init_loaded and config.init is None:
        raise ValueError("init_checkpoint is the loaded config.init; the config has no init")


def check_same_run(run: RunDir, saved: TrainConfig, config: TrainConfig) -> None:
    """UserError unless ``saved`` (a checkpoint's) is ``config`` but for its length and milestones
    (re-plans change them), where the run writes and reports, and an ``auto`` precision that
    the run resolved."""
    mine = {"epochs": saved.epochs, "milestones": saved.milestones}
    mine.update({key: getattr(saved, key) for key in BOOKKEEPING_KEYS})
    if config.precision == "auto":
        mine["precision"] = "auto"
    differ = [k for k, v in dataclasses.asdict(dataclasses.replace(config, **mine)).items()
              if dataclasses.asdict(saved)[k] != v]  # fmt: skip
    if differ:
        raise UserError(
            f"{run.root} holds another run (its config differs in {', '.join(differ)}); give "
            f"another folder, or continue that run with attnconv train --resume {run.root}"
        )


def run_plans(
    train: Callable[..., dict[str, Any]],
    config: TrainConfig,
    run: RunDir,
    plans: list[tuple[int, int]],
    init_checkpoint: dict[str, Any] | None,
    options: dict[str, Any],
) -> dict[str, Any]:
    """``attnconv.train.loop.train_in_plans``, given ``train`` (``attnconv.train.loop.train``):
    trains ``config`` in ``run`` to the end of the re-planned run ``plans``, continuing what the
    folder holds, and returns its summary. ``options``: ``train``'s keyword arguments."""
    _check_plans(plans, config.epochs)
    lengths, stops = [length for length, _ in plans], [stop for _, stop in plans]
    if len(plans) == 1:
        if run.summary.is_file():
            return read_json(run.summary, "the run's summary")
        if run.last.is_file():
            return train(None, run.root, resume=True, **options)
        return train(config, run.root, init_checkpoint=init_checkpoint, **options)
    while not run.summary.is_file():
        if not run.last.is_file():
            train(config, run.root, init_checkpoint=init_checkpoint, stop_after=stops[0], **options)
            continue
        part, trained = _plan_position(run, plans, config)
        if trained < stops[part] or part == len(plans) - 1:  # the last: to its end, tested
            train(None, run.root, resume=True, stop_after=stops[part], **options)
        else:
            train(None, run.root, resume=True, epochs=lengths[part + 1],
                  stop_after=stops[part + 1], **options)  # fmt: skip
    return read_json(run.summary, "the run's summary")


def _check_plans(plans: list[tuple[int, int]], first_length: int) -> None:
    """UserError unless ``plans`` (``(length, stop)`` per plan, oldest first) chain from a first
    plan of ``first_length`` epochs: each stop in ``[1, its length]``, each next length beyond the
    stop before, the last plan run to its end."""
    lengths, stops = [length for length, _ in plans], [stop for _, stop in plans]
    chained = (
        lengths[0] == first_length
        and stops[-1] == lengths[-1]
        and all(1 <= stop <= length for length, stop in plans)
        and all(lengths[i + 1] > stops[i] for i in range(len(plans) - 1))
    )
    if not chained:
        raise UserError(
            f"plans {plans} do not chain for a {first_length}-epoch first plan: each stop must "
            f"lie in [1, its length], each next length exceed the last stop, the last plan run "
            f"to its end"
        )


def _plan_position(
    run: RunDir, plans: list[tuple[int, int]], config: TrainConfig
) -> tuple[int, int]:
    """``(plan, epochs trained)`` of the part of a run of ``config`` re-planned as ``plans`` that
    ``run`` holds (the plan, 0-based, is the number of re-plans its checkpoint records);
    UserError if it holds another run (``check_same_run``) or one that went past the plans."""
    saved = load_checkpoint(run.last, mmap=True)
    check_same_run(run, TrainConfig.from_dict(saved["config"]), config)
    part, trained = len(saved.get("replans", [])), int(saved["epoch"])
    if part >= len(plans) or trained > plans[part][1]:
        raise UserError(
            f"{run.root} holds a run that went past the plans {plans} (plan {part + 1}, "
            f"epoch {trained}); train it with attnconv train --resume {run.root} instead"
        )
    return part, trained


def recorded_replans(checkpoint: dict[str, Any], run: RunDir) -> list[list[int]]:
    """A resumed run's earlier re-plans of its length (``train(..., epochs=N)``), oldest first,
    each ``[the length before it, the epochs trained then]`` (checkpoints written before attnconv
    recorded them: none); CheckpointError if the entry is malformed."""
    replans = checkpoint.get("replans", [])
    if not isinstance(replans, list) or not all(
        isinstance(pair, list)
        and len(pair) == 2
        and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in pair)
        for pair in replans
    ):
        raise CheckpointError(
            f"checkpoint {run.last} cannot be resumed: its 'replans' entry should be "
            f"a list of [epochs planned, epochs trained] pairs, got {replans!r}"
        )
    return [list(pair) for pair in replans]


def replans_of(
    resumed: dict[str, Any] | None, config: TrainConfig, run: RunDir
) -> tuple[int, list[list[int]]]:
    """``(planned epochs, re-plans)`` of a run with ``config``, ``resumed`` from ``run``'s last
    checkpoint or new (None): the length it had before ``train(..., epochs=N)`` re-planned it,
    and each re-plan, oldest first, ``[the length before it, the epochs trained then]``, this
    one's included."""
    if resumed is None:
        return config.epochs, []
    planned, replans = int(resumed["config"]["epochs"]), recorded_replans(resumed, run)
    if planned != config.epochs:
        replans.append([planned, int(resumed["epoch"])])
    return planned, replans


def replanned_note(config: TrainConfig, planned_epochs: int, next_rate: float) -> str:
    """The line saying how ``train(..., epochs=N)`` re-planned the schedule of a run planned for
    ``planned_epochs`` epochs to ``config``'s; ``next_rate``: the learning rate of its next
    update."""
    if config.schedule == "step":
        kept = ", ".join(map(str, config.milestones)) or "none"
        how = f"the step schedule keeps its milestones (epochs {kept})"
    else:
        how = f"the {config.schedule} schedule is re-planned over {config.epochs} epochs"
    return (
        f"the run's length goes from {planned_epochs} to {config.epochs} epochs: {how}; "
        f"the updates made keep their rates, the next one's is {next_rate:.3g}"
    )


@dataclasses.dataclass
class Restored:
    """Where a resumed run stands: ``epoch`` epochs and ``step`` optimizer steps trained, their
    epoch ``records``, and for a mid-epoch checkpoint the ``sums`` (``PROGRESS_KEYS``) of the
    epoch so far (None otherwise; on ranks other than 0, which holds the all-rank sums,
    always None)."""

    epoch: int
    step: int
    records: list[dict[str, Any]]
    sums: dict[str, float] | None


def restore(
    checkpoint: dict[str, Any],
    optimizer: torch.optim.Optimizer,
    rank: int,
    last: Path,
    epochs: int,
    steps_per_epoch: int,
) -> Restored:
    """Load ``checkpoint``'s optimizer state into ``optimizer`` and rank ``rank``'s RNG state into
    torch, and return where the run stands; CheckpointError (naming ``last``, the checkpoint's
    file) if an entry is malformed or the position is not a point of a run of ``epochs`` epochs of
    ``steps_per_epoch`` steps."""
    try:
        optimizer.load_state_dict(checkpoint["optimizer"])
        epoch, step = int(checkpoint["epoch"]), int(checkpoint["step"])
        records = [dict(record) for record in checkpoint["metrics"]]
        if not all(
            isinstance(r.get(key), int | float)
            for r in records
            for key in ("epoch", "step", "val_acc", "epoch_time_s")
        ):
            raise ValueError("an epoch record lacks epoch, step, val_acc or epoch_time_s")
        states = checkpoint["rng"]
        if rank < len(states):
            set_rng_state(states[rank])
        progress = checkpoint.get("epoch_progress")
        sums = None
        if progress is not None and rank == 0:  # all-rank sums, held by rank 0
            sums = {key: float(progress[key]) for key in PROGRESS_KEYS}
    except (KeyError, TypeError, ValueError, RuntimeError) as err:
        raise CheckpointError(
            f"checkpoint {last} cannot be resumed: its optimizer, rng, metrics or progress "
            f"entry is malformed ({type(err).__name__}: {str(err).splitlines()[0][:120]})"
        ) from err
    mid_epoch = checkpoint.get("epoch_progress") is not None
    check_position(last, epoch, step, len(records), epochs, steps_per_epoch, mid_epoch)
    return Restored(epoch, step, records, sums)


def check_position(
    last: Path,
    epoch: int,
    step: int,
    records: int,
    epochs: int,
    per_epoch: int,
    mid_epoch: bool,
) -> None:
    """CheckpointError unless ``epoch`` and ``step``, restored from ``last``, are a point of the
    run: ``epoch`` equal to the number of epoch ``records``, at most the run's ``epochs``, and the
    step of that epoch's end (or, ``mid_epoch``, one of the next epoch's steps)."""
    last_epoch = epochs - 1 if mid_epoch else epochs
    if records != epoch or epoch > last_epoch:
        raise CheckpointError(
            f"checkpoint {last} cannot be resumed: its epoch {epoch} does not fit its "
            f"{records} epoch record(s) and the run's {epochs} epochs; "
            f"the file was edited or damaged"
        )
    start = epoch * per_epoch
    if mid_epoch and not start < step < start + per_epoch:
        expected = f"a step between {start} and {start + per_epoch}"
    elif not mid_epoch and step != start:
        expected = f"step {start}"
    else:
        return
    raise CheckpointError(
        f"checkpoint {last} cannot be resumed: its step {step} does not fit its epoch {epoch} "
        f"({per_epoch} steps per epoch: expected {expected}); the file was edited or damaged"
    )

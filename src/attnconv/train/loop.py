"""The training loop: SGD or AdamW with the preset's schedule, validation-based model selection,
exact resume.

``train(config, run_dir)`` runs one job (one process, or every rank of a ``torchrun`` launch)::

    for epoch in epochs:
        for batch in this rank's shards:  lr ← schedule(step); SGD/AdamW step (DDP averages grads)
            every checkpoint_steps steps: checkpoints/last.pt (mid-epoch, resumable)
        validate → metrics.jsonl, TensorBoard, checkpoints/last.pt, best.pt, epoch_NNNN.pt
    test the best (validation) checkpoint → summary.json

The main rank holds the run folder's lock (``attnconv.runs.locked_run``) for the whole job. Before
anything is saved, the state is checked: every parameter and buffer finite, and the loss those
weights give finite (the validation loss at an epoch's end, the last batch's loss in eval mode
inside one); a diverged state stops the run with NonFiniteLossError and is never written. At an
epoch's end ``last.pt`` is written first and ``best.pt``/``epoch_NNNN.pt`` copy it; a resume
rewrites any of those a kill left missing or stale, so every kill point leaves a resumable run.

Everything random is a function of the config's seed and the position in training (data order and
augmentation: ``BatchLoader``; dropout: the torch RNG, saved in every checkpoint), so on a CPU a
run resumed from any checkpoint ends with exactly the weights of an uninterrupted run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import math
import sys
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from attnconv.data import BatchLoader, DataSplits, load_splits
from attnconv.errors import UserError
from attnconv.hardware import machine_description, resolve_precision
from attnconv.memory import reuse_freed_memory
from attnconv.models import MODELS, PRESETS, count_macs, count_parameters
from attnconv.models.checkpoint import (
    CheckpointError,
    build_model,
    load_checkpoint,
    rebuild,
    save_checkpoint,
)
from attnconv.models.modes import evaluating
from attnconv.models.presets import preset_arguments, size_note
from attnconv.models.pretrained import load_init_checkpoint
from attnconv.runs import (
    RunDir,
    RunFolderError,
    RunLock,
    is_full,
    locked_run,
    not_writable_hint,
    os_error_reason,
    write_json,
)
from attnconv.train import distributed
from attnconv.train.checkpoint import rng_state, set_rng_state
from attnconv.train.config import (
    BOOKKEEPING_KEYS,
    TrainConfig,
    extended_config,
    save_config,
    training_command,
)
from attnconv.train.logger import EpochFigure, RunLogger, format_step
from attnconv.train.schedule import LRSchedule, build_schedule

CHECK_EVERY = 10  # steps between loss-finiteness checks and progress-bar updates
# Optimizer steps between the progress lines of a run whose stderr is not a terminal (a log file,
# a pipe, nohup, a notebook), where the progress bar cannot redraw in place.
LOG_INTERVAL = 50


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
            run (``attnconv.train.logger.format_step``: loss, rate, images per second, ETA); 0:
            none, only the line per epoch. A setting of this call, not of the run: a resume
            takes its own.
        stop_after: end this call once the run has trained this many epochs in all (>= 1),
            leaving it as an interrupted run with its checkpoint (no test, no summary), to be
            resumed, possibly with a new length: how ``train_in_plans`` repeats a run that was
            re-planned part-way. None, or the run's length: train to the end.

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
        resumed = load_checkpoint(run.last)
        config = _resumed_config(resumed, config, run)
        if epochs is not None:
            config = extended_config(config, epochs, trained=int(resumed["epoch"]))
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
    context = distributed.setup(config.device)
    try:
        with locked_run(run.root) if context.is_main else nullcontext() as lock:
            trainer = Trainer(
                config,
                run.root,
                context,
                resumed,
                init_checkpoint,
                epoch_figure,
                lock=lock,
                log_interval=log_interval,
            )
            return trainer.fit(stop_after)
    except KeyboardInterrupt as err:
        raise TrainingInterrupted(_interrupted_advice(run)) from err
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
    run = RunDir(run_dir)
    lengths, stops = [length for length, _ in plans], [stop for _, stop in plans]
    chained = (
        lengths[0] == config.epochs
        and stops[-1] == lengths[-1]
        and all(1 <= stop <= length for length, stop in plans)
        and all(lengths[i + 1] > stops[i] for i in range(len(plans) - 1))
    )
    if not chained:
        raise UserError(
            f"plans {plans} do not chain for a {config.epochs}-epoch first plan: each stop must "
            f"lie in [1, its length], each next length exceed the last stop, the last plan run "
            f"to its end"
        )
    if len(plans) == 1:
        if run.summary.is_file():
            return json.loads(run.summary.read_text())
        if run.last.is_file():
            return train(None, run.root, resume=True, **options)
        return train(config, run.root, init_checkpoint=init_checkpoint, **options)
    while not run.summary.is_file():
        if not run.last.is_file():
            train(config, run.root, init_checkpoint=init_checkpoint, stop_after=stops[0], **options)
            continue
        saved = load_checkpoint(run.last, mmap=True)
        _check_same_run(run, TrainConfig.from_dict(saved["config"]), config)
        part, trained = len(saved.get("replans", [])), int(saved["epoch"])
        if part >= len(plans) or trained > stops[part]:
            raise UserError(
                f"{run.root} holds a run that went past the plans {plans} (plan {part + 1}, "
                f"epoch {trained}); train it with attnconv train --resume {run.root} instead"
            )
        if trained < stops[part] or part == len(plans) - 1:  # the last: to its end, tested
            train(None, run.root, resume=True, stop_after=stops[part], **options)
        else:
            train(None, run.root, resume=True, epochs=lengths[part + 1],
                  stop_after=stops[part + 1], **options)  # fmt: skip
    return json.loads(run.summary.read_text())


def _check_same_run(run: RunDir, saved: TrainConfig, config: TrainConfig) -> None:
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


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT) stopped training; the message says how to go on from what was saved."""


def _interrupted_advice(run: RunDir) -> str:
    position = _saved_position(run.last)
    if position is None:
        return "no checkpoint was saved yet: start the run again with the same command"
    return (
        f"the last checkpoint is {run.last} (step {position[1]}): continue with: attnconv train "
        f"--resume {run.root}"
    )


def _resumed_config(checkpoint: dict[str, Any], given: TrainConfig | None, run: RunDir) -> TrainConfig:
    """The config saved in the run's last checkpoint; UserError if ``given`` differs from it.

    A ``config.json`` that differs (edited by hand) is named in a note and does not count.
    """
    if "config" not in checkpoint:
        raise CheckpointError(f"checkpoint {run.last} holds no training config; it cannot be resumed")
    saved = TrainConfig.from_dict(checkpoint["config"])
    if given is not None and given != saved:
        keys = [k for k, v in given.to_dict().items() if saved.to_dict().get(k) != v]
        raise UserError(
            f"a resumed run keeps the config saved in {run.last}; the given config differs in "
            f"{', '.join(keys)}"
        )
    try:
        written = json.loads(run.config.read_text())
    except (OSError, ValueError):
        written = None
    if written != saved.to_dict():
        keys = sorted(
            k for k in {*saved.to_dict(), *(written or {})}
            if not isinstance(written, dict) or written.get(k) != saved.to_dict().get(k)
        )
        _warn(
            f"note: {run.config} differs from the config saved in {run.last}"
            f" ({', '.join(keys) if isinstance(written, dict) else 'unreadable'}); the run "
            f"continues with the checkpoint's, and config.json is rewritten from it"
        )
    return saved


def _replans(checkpoint: dict[str, Any], run: RunDir) -> list[list[int]]:
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


def _dropout_seed(seed: int, rank: int) -> int:
    digest = hashlib.sha256(f"dropout,{seed},{rank}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def data_model_config(data: DataSplits) -> dict[str, Any]:
    """The model constructor arguments a dataset fixes."""
    return {
        "num_classes": data.num_classes,
        "in_channels": data.channels,
        "image_size": tuple(data.image_size),
        "mean": tuple(data.mean),
        "std": tuple(data.std),
    }


def check_data_fits(
    arguments: dict[str, Any], data: DataSplits, source: str, same_size: bool = False
) -> None:
    """UserError if a model built with constructor ``arguments`` does not take ``data``'s images
    or classes; with ``same_size`` (measuring a trained model), also if its images are not of
    the size the model was built for (another size runs, resized positions or a smaller token
    grid, but the accuracy there is not the model's)."""
    expected = data_model_config(data)
    arguments = arguments.get("base_arguments", arguments)  # a transformed network's base
    for key in ("num_classes", "in_channels"):
        if arguments.get(key) != expected[key]:
            raise UserError(
                f"{source} has {key}={arguments.get(key)}, but dataset {data.name!r} has "
                f"{expected[key]}: use the dataset the model was trained on"
            )
    size = tuple(arguments.get("image_size", ()))
    if same_size and size != expected["image_size"]:
        built = "x".join(map(str, size))
        given = "x".join(map(str, expected["image_size"]))
        raise UserError(
            f"{source} was built for {built} images, but dataset {data.name!r} has {given}: its "
            f"accuracy there would not be the model's; use a dataset of {built} images"
        )


def autocast(precision: str, device: torch.device) -> AbstractContextManager:
    """``torch.autocast`` to bfloat16 for ``precision="bf16"`` (CPU or GPU); nothing for ``fp32``.

    ``precision`` is a resolved one (``attnconv.hardware.resolve_precision`` turns ``auto`` into
    ``fp32`` or ``bf16``); ValueError for anything else.
    """
    if precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    if precision == "fp32":
        return nullcontext()
    raise ValueError(f"autocast takes a resolved precision, fp32 or bf16, got {precision!r}")


def _warn(message: str) -> None:
    tqdm.write(message, file=sys.stderr)


@torch.no_grad()
def evaluation_sums(model: nn.Module, loader: BatchLoader, precision: str = "fp32") -> list[float]:
    """``[summed cross-entropy, correct predictions, images]`` of ``model`` over ``loader``.

    The model is run in eval mode (and put back in its previous mode).
    """
    totals = torch.zeros(3, dtype=torch.float64, device=loader.device)
    with evaluating(model):
        for images, labels in loader.epoch(0):
            with autocast(precision, loader.device):
                logits = model(images)
            totals += torch.stack(
                [
                    F.cross_entropy(logits.float(), labels, reduction="sum").double(),
                    (logits.argmax(dim=1) == labels).sum().double(),
                    torch.tensor(float(labels.shape[0]), dtype=torch.float64, device=loader.device),
                ]
            )
    return totals.tolist()


def _saved_position(path: Path) -> tuple[int, int] | None:
    """``(epoch, step)`` of the checkpoint at ``path``; None if it is missing or unreadable."""
    try:
        checkpoint = load_checkpoint(path, mmap=True)
        return int(checkpoint["epoch"]), int(checkpoint["step"])
    except (FileNotFoundError, CheckpointError, KeyError):
        return None


def machines_of(records: list[dict[str, Any]]) -> str:
    """The machine a run trained on, from its epoch records (``machine``, as
    ``attnconv.hardware.machine_description`` names it): that line where every epoch ran on one,
    else each machine with its epochs in order, ``"epochs 1–13: M1; epochs 14–22: M2"`` (a run
    moved between machines by ``--resume``). Epochs recorded before attnconv kept the machine
    per epoch count as ``not recorded``."""
    spans: list[list[Any]] = []  # [machine, first epoch, last epoch]
    for record in records:
        machine = record.get("machine") or "not recorded"
        if spans and spans[-1][0] == machine:
            spans[-1][2] = record["epoch"]
        else:
            spans.append([machine, record["epoch"], record["epoch"]])
    if len({machine for machine, _, _ in spans}) <= 1:
        return spans[0][0] if spans else "not recorded"
    return "; ".join(
        f"{f'epoch {first}' if first == last else f'epochs {first}–{last}'}: {machine}"
        for machine, first, last in spans
    )


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
    ) -> None:
        self.lock = lock  # the run folder's, held by the main rank: checked before each write
        self.log_interval = log_interval  # steps between progress lines off a terminal (train)
        # seconds the last finished epoch took outside its training steps (validation, TensorBoard
        # figure, checkpoints): the ETA's share per epoch; 0 until one has finished here
        self.between_s = 0.0
        self.device = context.device
        if self.device.type == "cpu":
            reuse_freed_memory()  # no page faults for each step's large tensors: attnconv.memory
        # "auto" becomes what this device runs fast; config.json and summary.json record it.
        precision = resolve_precision(
            config.precision, self.device, warn=_warn if context.is_main else lambda _: None
        )
        self.requested_precision = config.precision
        config = dataclasses.replace(config, precision=precision)
        self.config, self.context = config, context
        self.run = RunDir(run_dir)
        if resumed is None and self.run.last.exists():
            raise RunFolderError(
                f"{run_dir} already holds a run; continue it with --resume {run_dir} or give "
                f"another --out"
            )
        if resumed is not None and resumed["preset"] != config.preset:
            raise CheckpointError(
                f"{self.run.last} is a checkpoint of preset "
                f"{resumed['preset']!r}, but the config saved in it says {config.preset!r}"
            )
        if init_checkpoint is not None and config.init is None:
            raise ValueError("init_checkpoint is the loaded config.init; the config has no init")
        self.data = self._load_data()

        torch.manual_seed(config.seed)  # the same initial weights on every rank
        model, self.architecture, self.arguments = self._build_model(resumed, init_checkpoint)
        self.model = model.to(self.device)
        torch.manual_seed(_dropout_seed(config.seed, context.rank))

        if context.distributed and self.device.type == "cuda":
            self.model = nn.SyncBatchNorm.convert_sync_batchnorm(self.model)
        self.optimizer = self._build_optimizer()
        self.forward_model: nn.Module = self.model
        if context.distributed:
            self.forward_model = nn.parallel.DistributedDataParallel(
                self.model, device_ids=[self.device] if self.device.type == "cuda" else None
            )
        if config.compile:
            self.forward_model = torch.compile(self.forward_model)

        self.pad = config.pad
        if self.pad is None:  # a placed dataset moves its images already: no crop
            self.pad = 0 if self.data.placement else math.ceil(max(self.data.image_size) / 8)
        loader_args = {
            "device": self.device,
            "rank": context.rank,
            "world_size": context.world_size,
        }
        self.train_loader = BatchLoader(
            self.data.train,
            config.batch_size,
            train=True,
            flip=self.data.flip,
            pad=self.pad,
            seed=config.seed,
            placement=self.data.placement,
            **loader_args,
        )
        self.val_loader = BatchLoader(
            self.data.val, config.batch_size, train=False, flip=False, **loader_args
        )
        self.steps_per_epoch = len(self.train_loader)
        self.schedule: LRSchedule = build_schedule(
            config.schedule,
            config.lr,
            config.epochs,
            self.steps_per_epoch,
            config.warmup_fraction,
            config.milestones,
            config.schedule_stepping,
        )

        # the length the run had before train(..., epochs=N) re-planned it
        self.planned_epochs = config.epochs if resumed is None else int(resumed["config"]["epochs"])
        # each such re-plan, oldest first: [the length before it, the epochs trained then]
        self.replans: list[list[int]] = [] if resumed is None else _replans(resumed, self.run)
        if self.planned_epochs != config.epochs:
            self.replans.append([self.planned_epochs, int(resumed["epoch"])])
        self.epoch, self.step = 0, 0
        self.metrics: list[dict[str, Any]] = []
        self.progress = {"loss_sum": 0.0, "correct": 0.0, "seen": 0.0}
        self.saved_step: int | None = None  # the step of the newest last.pt on disk
        if resumed is not None:
            self._restore(resumed)
            self.saved_step = self.step
            if context.is_main:
                self._repair_epoch_copies(resumed)
        self.logger = RunLogger(
            self.run, config.epochs, context.is_main, config.tensorboard, epoch_figure
        )

    # ------------------------------------------------------------------ set-up

    def _load_data(self) -> DataSplits:
        """Load the dataset (one download per machine: local rank 0 first)."""
        config, context = self.config, self.context

        def load() -> DataSplits:
            return load_splits(config.dataset, config.data_dir, config.val_size, seed=config.seed)

        if context.local_rank != 0:
            distributed.barrier()
        data = load()
        if context.local_rank == 0:
            distributed.barrier()
        return data

    def _build_model(
        self, resumed: dict[str, Any] | None, init: dict[str, Any] | None
    ) -> tuple[nn.Module, str, dict[str, Any]]:
        """``(model, architecture, its full constructor arguments)`` (what checkpoints store)."""
        config = self.config
        if resumed is not None:
            last = self.run.last
            check_data_fits(resumed["arguments"], self.data, str(last))
            architecture, arguments = resumed["architecture"], dict(resumed["arguments"])
            return build_model(resumed, last), architecture, arguments
        if config.init is None:
            overrides = {**config.model, **data_model_config(self.data)}
            architecture, arguments = preset_arguments(config.preset, **overrides)
            try:
                return MODELS[architecture](**arguments), architecture, arguments
            except (TypeError, ValueError, RuntimeError) as err:  # RuntimeError: out of memory
                given = " ".join(f"model.{k}={v}" for k, v in config.model.items())
                reason = str(err).strip().splitlines()[0]  # torch's C++ errors add stack frames
                raise UserError(
                    f"{given or 'its preset arguments'}: the {config.preset!r} model cannot be "
                    f"built on {config.dataset} with {'it' if len(config.model) == 1 else 'them'} "
                    f"({reason})"
                ) from err
        return self._init_model(load_init_checkpoint(config.init) if init is None else init)

    def _init_model(self, init: dict[str, Any]) -> tuple[nn.Module, str, dict[str, Any]]:
        """The ``--init`` checkpoint's model, checked against the preset that fine-tunes it, with
        its degenerate heads pruned for a pruned preset."""
        from attnconv.models.heads import prune_degenerate_heads

        config = self.config
        target = PRESETS[config.preset]
        accepted = target.init_presets or tuple(
            name
            for name, p in PRESETS.items()
            if p.model == target.model
            and {k: v for k, v in p.model_kwargs.items() if k != "heads"}
            == {k: v for k, v in target.model_kwargs.items() if k != "heads"}
            and name != config.preset
        )
        if init["preset"] not in accepted:
            raise UserError(
                f"{config.init} is a checkpoint of preset {init['preset']!r}; preset "
                f"{config.preset!r} fine-tunes a model of preset {' or '.join(accepted)}"
            )
        if init["dataset"] != config.dataset:
            raise UserError(
                f"{config.init} was trained on {init['dataset']!r}, not on {config.dataset!r}"
            )
        check_data_fits(init["arguments"], self.data, str(config.init))
        architecture, arguments = init["architecture"], {**init["arguments"], **config.model}
        model = rebuild(
            architecture, arguments, init["model"], f"{config.init} with {config.model}"
        )
        if target.init_presets:  # fine-tuned as it is
            return model, architecture, arguments
        summary = prune_degenerate_heads(model)
        if self.context.is_main:
            tqdm.write(f"{config.init}: {summary}")
        return model, architecture, {**arguments, "heads": list(summary.heads)}

    def _build_optimizer(self) -> torch.optim.Optimizer:
        """SGD or AdamW over two groups, with and without weight decay; with
        ``attention_lr_scale ≠ 1`` and a model that has ``transform_parameters()``, those
        parameters form groups of their own whose ``lr_scale`` multiplies the schedule's rate."""
        no_decay = self.model.no_weight_decay_parameters(self.config.decay_exempt)
        named = list(self.model.named_parameters())
        scaled: set[str] = set()
        if self.config.attention_lr_scale != 1 and hasattr(self.model, "transform_parameters"):
            scaled = set(self.model.transform_parameters())
        groups = []
        for names, scale in ((scaled, self.config.attention_lr_scale), (None, 1.0)):
            chosen = [(n, p) for n, p in named if (n in scaled) == (names is not None)]
            for decays in (True, False):
                params = [p for n, p in chosen if (n not in no_decay) == decays]
                if names is not None and not params:
                    continue
                weight_decay = self.config.weight_decay if decays else 0.0
                groups.append({"params": params, "weight_decay": weight_decay, "lr_scale": scale})
        groups.sort(key=lambda group: group["lr_scale"] != 1.0)  # the plain groups first
        if self.config.optimizer == "adamw":
            return torch.optim.AdamW(groups, lr=self.config.lr, betas=(self.config.momentum, 0.999))
        return torch.optim.SGD(groups, lr=self.config.lr, momentum=self.config.momentum)

    def _restore(self, checkpoint: dict[str, Any]) -> None:
        last = self.run.last
        try:
            self.optimizer.load_state_dict(checkpoint["optimizer"])
            self.epoch, self.step = int(checkpoint["epoch"]), int(checkpoint["step"])
            self.metrics = [dict(record) for record in checkpoint["metrics"]]
            if not all(
                isinstance(r.get(key), int | float)
                for r in self.metrics
                for key in ("epoch", "step", "val_acc", "epoch_time_s")
            ):
                raise ValueError("an epoch record lacks epoch, step, val_acc or epoch_time_s")
            states = checkpoint["rng"]
            if self.context.rank < len(states):
                set_rng_state(states[self.context.rank])
            progress = checkpoint.get("epoch_progress")
            if progress is not None and self.context.is_main:  # all-rank sums, held by rank 0
                self.progress = {key: float(progress[key]) for key in self.progress}
        except (KeyError, TypeError, ValueError, RuntimeError) as err:
            raise CheckpointError(
                f"checkpoint {last} cannot be resumed: its optimizer, rng, metrics or progress "
                f"entry is malformed ({type(err).__name__}: {str(err).splitlines()[0][:120]})"
            ) from err
        self._check_position(checkpoint.get("epoch_progress") is not None)

    def _check_position(self, mid_epoch: bool) -> None:
        """CheckpointError unless the restored epoch and step are a point of this run: ``epoch``
        records, at most the run's epochs, and the step of that epoch's end (or, inside the next
        epoch, one of its steps)."""
        last, epoch, step, per_epoch = self.run.last, self.epoch, self.step, self.steps_per_epoch
        last_epoch = self.config.epochs - 1 if mid_epoch else self.config.epochs
        if len(self.metrics) != epoch or epoch > last_epoch:
            raise CheckpointError(
                f"checkpoint {last} cannot be resumed: its epoch {epoch} does not fit its "
                f"{len(self.metrics)} epoch record(s) and the run's {self.config.epochs} epochs; "
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

    def _best_record(self) -> dict[str, Any] | None:
        """The first epoch record with the highest validation accuracy (what best.pt holds)."""
        return max(self.metrics, key=lambda r: r["val_acc"], default=None)

    def _epoch_copies(self, epoch: int) -> list[Path]:
        """The files that, besides last.pt, hold the end-of-``epoch`` state."""
        paths = []
        best = self._best_record()
        if best is not None and best["epoch"] == epoch:
            paths.append(self.run.best)
        if self.config.checkpoint_every and epoch % self.config.checkpoint_every == 0:
            paths.append(self.run.epoch_checkpoint(epoch))
        return paths

    def _repair_epoch_copies(self, resumed: dict[str, Any]) -> None:
        """Write the copies of an end-of-epoch last.pt that a kill left missing or stale."""
        if resumed.get("epoch_progress") is not None or not self.metrics:
            return
        for path in self._epoch_copies(self.epoch):
            if _saved_position(path) != (self.epoch, self.step):
                with self._writing(path):
                    save_checkpoint(resumed, path)
                tqdm.write(
                    f"{path} was missing or older than last.pt (the previous run was "
                    f"stopped while saving): rewritten from last.pt",
                    file=sys.stderr,
                )

    # ------------------------------------------------------------------ checkpoints

    def _gathered_rng(self) -> list[dict[str, Any]]:
        state = rng_state()
        if not self.context.distributed:
            return [state]
        states: list[Any] = [None] * self.context.world_size
        dist.all_gather_object(states, state)
        return states

    def _checkpoint(self, epoch_progress: dict[str, float] | None) -> dict[str, Any]:
        return {
            "preset": self.config.preset,
            "dataset": self.config.dataset,
            "architecture": self.architecture,
            "arguments": self.arguments,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "rng": self._gathered_rng(),
            "epoch": self.epoch,
            "step": self.step,
            "config": self.config.to_dict(),
            "replans": self.replans,
            "metrics": self.metrics,
            "epoch_progress": epoch_progress,
        }

    def _save(self, checkpoint: dict[str, Any], *paths: Path) -> None:
        """Write ``checkpoint`` to each of ``paths`` in turn (main rank); RunFolderError if a write
        fails, the files written before it staying valid."""
        if self.context.is_main:
            for path in paths:
                with self._writing(path):
                    save_checkpoint(checkpoint, path)
                if path == self.run.last:
                    self.saved_step = checkpoint["step"]

    def _kept(self) -> str:
        """Which checkpoint holds the last good state, for error messages."""
        if self.saved_step is None:
            return "no checkpoint was saved yet"
        return f"the last good checkpoint is {self.run.last} (step {self.saved_step})"

    def _check_lock(self) -> None:
        """RunFolderError if the run folder was deleted or replaced (main rank; see RunLock)."""
        if self.lock is not None:
            self.lock.check()

    @contextmanager
    def _writing(self, path: Path) -> Iterator[None]:
        """Check the run folder is still this run's, then turn an OSError while writing ``path``
        into a one-line RunFolderError saying how to go on."""
        self._check_lock()
        try:
            yield
        except OSError as err:
            todo = "free space" if is_full(err) else not_writable_hint(self.run.root)
            if self.saved_step is None:
                then = "start the run again with the same command (there is nothing to resume)"
                kept = self._kept()
            else:
                then = f"continue with: attnconv train --resume {self.run.root}"
                kept = f"{self._kept()}, intact"
            raise RunFolderError(
                f"cannot write {path}: {os_error_reason(err)}; {kept}. "
                f"{todo[0].upper()}{todo[1:]}, then {then}"
            ) from err

    # ------------------------------------------------------------------ loop

    def _autocast(self) -> AbstractContextManager:
        return autocast(self.config.precision, self.device)

    def _check_finite(self, sums: torch.Tensor) -> float:
        """The (all-rank) mean training loss so far this epoch; NonFiniteLossError if not finite."""
        loss_sum, seen = distributed.all_reduce_sum(
            sums[:1].tolist() + sums[2:].tolist(), self.device
        )
        loss = loss_sum / max(seen, 1.0)
        if not math.isfinite(loss):
            self._diverged(f"the training loss is {loss}")
        return loss

    def _diverged(self, what: str) -> None:
        raise NonFiniteLossError(
            f"training diverged at epoch {self.epoch + 1}, step {self.step}: {what}; stopping "
            f"without saving it ({self._kept()}). Try a lower lr, grad_clip=1, or precision=fp32."
        )

    @torch.no_grad()
    def _check_state(
        self, images: torch.Tensor | None = None, labels: torch.Tensor | None = None
    ) -> None:
        """NonFiniteLossError unless the state about to be saved is sound: every floating-point
        parameter and buffer finite and, given a batch, the loss of the current weights on it (eval
        mode: no dropout, no RNG draws, no batch-norm updates) finite on every rank."""
        tensors = itertools.chain(self.model.named_parameters(), self.model.named_buffers())
        for name, tensor in tensors:
            if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                self._diverged(f"parameter {name} is no longer finite")
        if images is None or labels is None:
            return
        with evaluating(self.model), self._autocast():
            logits = self.model(images)
        loss_sum = F.cross_entropy(logits.float(), labels, reduction="sum").item()
        total, seen = distributed.all_reduce_sum([loss_sum, float(labels.shape[0])], self.device)
        if not math.isfinite(total):
            self._diverged(f"the updated weights give a loss of {total / seen} on their last batch")

    def _train_epoch(self) -> dict[str, float]:
        """One (possibly resumed) epoch of training; returns its train loss/accuracy and timing."""
        config, epoch = self.config, self.epoch
        start_batch = self.step - epoch * self.steps_per_epoch
        # Running sums on this rank: (loss · images, correct, images); rank 0 starts from the
        # all-rank sums of a mid-epoch checkpoint.
        sums = torch.tensor(
            [self.progress["loss_sum"], self.progress["correct"], self.progress["seen"]],
            dtype=torch.float64,
            device=self.device,
        )
        global_batch = config.batch_size
        # The bar redraws in place, so only on a terminal; in a file or a pipe (CI logs, nohup,
        # a notebook) a line every log_interval steps says where the run is instead.
        terminal = sys.stderr.isatty()
        live = self.context.is_main and config.progress and terminal
        step_lines = config.progress and not terminal
        total_steps = config.epochs * self.steps_per_epoch
        bar = tqdm(
            total=self.steps_per_epoch * global_batch,
            initial=start_batch * global_batch,
            unit="img",
            unit_scale=True,
            desc=f"epoch {epoch + 1}/{config.epochs}",
            disable=not live,
            leave=False,
            file=sys.stderr,
            dynamic_ncols=True,
        )
        self.forward_model.train()
        started = time.perf_counter()
        for images, labels in self.train_loader.epoch(epoch, start_batch):
            lr = self.schedule(self.step)
            for group in self.optimizer.param_groups:
                group["lr"] = lr * group.get("lr_scale", 1.0)
            with self._autocast():
                logits = self.forward_model(images)
                loss = F.cross_entropy(logits, labels)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if config.grad_clip is not None:
                nn.utils.clip_grad_norm_(self.model.parameters(), config.grad_clip)
            self.optimizer.step()
            self.step += 1
            with torch.no_grad():
                count = labels.shape[0]
                sums += torch.stack(
                    [
                        loss.detach().double() * count,
                        (logits.argmax(dim=1) == labels).sum().double(),
                        torch.tensor(float(count), dtype=torch.float64, device=self.device),
                    ]
                )
            bar.update(global_batch)
            in_epoch = self.step - epoch * self.steps_per_epoch
            last_batch = in_epoch == self.steps_per_epoch
            mid_checkpoint = (
                config.checkpoint_steps > 0
                and not last_batch
                and self.step % config.checkpoint_steps == 0
            )
            # every rank reaches the same steps here: _check_finite sums over the ranks
            line_due = self.log_interval > 0 and self.step % self.log_interval == 0
            if mid_checkpoint or line_due or in_epoch % CHECK_EVERY == 0:
                running = self._check_finite(sums)
                bar.set_postfix(loss=f"{running:.4f}", lr=f"{lr:.3g}")
                self._check_lock()  # before TensorBoard writes into the folder
                self.logger.step(self.step, running, lr)
                if line_due and step_lines:
                    seconds = time.perf_counter() - started
                    per_step = seconds / (in_epoch - start_batch)
                    eta = (total_steps - self.step) * per_step + (
                        config.epochs - epoch
                    ) * self.between_s
                    self.logger.print(
                        format_step(
                            epoch + 1,
                            config.epochs,
                            self.step,
                            total_steps,
                            running,
                            lr,
                            global_batch / per_step,
                            eta,
                        )
                    )
            if mid_checkpoint:
                totals = distributed.all_reduce_sum(sums.tolist(), self.device)
                progress = dict(zip(("loss_sum", "correct", "seen"), totals, strict=True))
                self._check_state(images, labels)
                self._save(self._checkpoint(progress), self.run.last)
        bar.close()
        self._check_finite(sums)
        elapsed = time.perf_counter() - started
        loss_sum, correct, seen = distributed.all_reduce_sum(sums.tolist(), self.device)
        self.progress = {"loss_sum": 0.0, "correct": 0.0, "seen": 0.0}
        done = (self.steps_per_epoch - start_batch) * global_batch
        return {
            "lr": self.schedule(self.step - 1),
            "train_loss": loss_sum / seen,
            "train_acc": correct / seen,
            "epoch_time_s": elapsed,
            "images_per_s": done / elapsed,
        }

    def evaluate(
        self, loader: BatchLoader, model: nn.Module, all_ranks: bool = True
    ) -> tuple[float, float]:
        """``(mean cross-entropy, accuracy)`` of ``model`` on ``loader``'s images.

        ``all_ranks``: the loader is sharded and the sums are reduced over every rank; else this
        rank evaluates alone.
        """
        sums = evaluation_sums(model, loader, self.config.precision)
        if all_ranks:
            sums = distributed.all_reduce_sum(sums, self.device)
        loss_sum, correct, seen = sums
        return loss_sum / seen, correct / seen

    def fit(self, stop_after: int | None = None) -> dict[str, Any]:
        """Train to the end (or to epoch ``stop_after``: see ``train``); the summary dict."""
        config, logger = self.config, self.logger
        if self.context.is_main:
            with self._writing(self.run.config):
                save_config(config, self.run.config)
        with self._writing(self.run.metrics):
            logger.metrics(self.metrics)
        logger.print(
            f"{config.preset} on {config.dataset}: {count_parameters(self.model):,} parameters, "
            f"{self.steps_per_epoch} steps/epoch of {config.batch_size} images, device "
            f"{self.device} x{self.context.world_size}"
            + (f" (DDP, {dist.get_backend()})" if self.context.distributed else "")
            + f", precision {config.precision}"
            + (" (auto)" if self.requested_precision == "auto" else "")
            + (f"; resuming at epoch {self.epoch + 1}, step {self.step}" if self.step else "")
        )
        if self.planned_epochs != config.epochs:
            logger.print(self._replanned_note())
        note = size_note(config.preset, config.dataset, tuple(self.data.image_size), config.model)
        if note is not None:
            logger.print(note)
        end = config.epochs if stop_after is None else min(stop_after, config.epochs)
        try:
            while self.epoch < end:
                steps_left = self.steps_per_epoch * (self.epoch + 1) - self.step
                record = self._train_epoch()
                trained = time.perf_counter()
                val_loss, val_acc = self.evaluate(self.val_loader, self.model)
                if not math.isfinite(val_loss):
                    self._diverged(f"the validation loss is {val_loss}")
                self._check_state()
                self.epoch += 1
                record = {
                    "epoch": self.epoch,
                    "step": self.step,
                    **record,
                    "val_loss": val_loss,
                    "val_acc": val_acc,
                    "machine": machine_description(self.device),
                }
                record = {
                    k: record[k]
                    for k in (
                        "epoch",
                        "step",
                        "lr",
                        "train_loss",
                        "train_acc",
                        "val_loss",
                        "val_acc",
                        "epoch_time_s",
                        "images_per_s",
                        "machine",
                    )
                }
                self.metrics.append(record)
                self._check_lock()
                # the epochs left at this epoch's pace: its training steps scaled to a whole
                # epoch (a resumed one ran only part), and what the epoch before took besides
                # (the first one here: this one's validation so far)
                between = self.between_s or time.perf_counter() - trained
                epoch_s = record["epoch_time_s"] * self.steps_per_epoch / steps_left + between
                eta = (config.epochs - self.epoch) * epoch_s
                logger.epoch(record, self.model, self.data.image_size, eta)
                # last.pt first: a kill before a copy is written is repaired by the resume.
                self._save(self._checkpoint(None), self.run.last, *self._epoch_copies(self.epoch))
                with self._writing(self.run.metrics):
                    logger.metrics(self.metrics)
                self.between_s = time.perf_counter() - trained
            if self.epoch < config.epochs:
                logger.print(
                    f"stopped after epoch {self.epoch} of {config.epochs} as asked; continue "
                    f"with: attnconv train --resume {self.run.root}"
                )
                return {}
            return self._finish()
        finally:
            logger.close()

    def _replanned_note(self) -> str:
        """The line saying how ``train(..., epochs=N)`` re-planned the schedule."""
        config = self.config
        if config.schedule == "step":
            kept = ", ".join(map(str, config.milestones)) or "none"
            how = f"the step schedule keeps its milestones (epochs {kept})"
        else:
            how = f"the {config.schedule} schedule is re-planned over {config.epochs} epochs"
        return (
            f"the run's length goes from {self.planned_epochs} to {config.epochs} epochs: {how}; "
            f"the updates made keep their rates, the next one's is {self.schedule(self.step):.3g}"
        )

    def _finish(self) -> dict[str, Any]:
        """Test the best checkpoint (main rank) and write ``summary.json``.

        RunFolderError if ``best.pt`` is not the epoch the metrics name as best.
        """
        summary: dict[str, Any] = {}
        best = self._best_record()
        if self.context.is_main:
            best_path = self.run.best
            checkpoint = load_checkpoint(best_path)
            if (checkpoint["epoch"], checkpoint["step"]) != (best["epoch"], best["step"]):
                raise RunFolderError(
                    f"{best_path} holds epoch {checkpoint['epoch']} (step {checkpoint['step']}), "
                    f"but the run's metrics name epoch {best['epoch']} (step {best['step']}) as "
                    f"the best; the folder was changed by hand or by an older attnconv: test a "
                    f"checkpoint with attnconv eval instead"
                )
            best_model = build_model(checkpoint, best_path).to(self.device)
            test_loader = BatchLoader(
                self.data.test, self.config.batch_size, device=self.device, train=False, flip=False
            )
            test_loss, test_acc = self.evaluate(test_loader, best_model, all_ranks=False)
            train_time = sum(r["epoch_time_s"] for r in self.metrics)
            summary = {
                "preset": self.config.preset,
                "dataset": self.config.dataset,
                "parameters": count_parameters(self.model),
                "macs_per_image": count_macs(self.model),
                "epochs": self.config.epochs,
                "precision": self.config.precision,
                "best_val_acc": best["val_acc"],
                "best_epoch": best["epoch"],
                "test_acc": test_acc,
                "test_loss": test_loss,
                "train_time_s": train_time,
                "images_per_s": self.config.epochs
                * self.steps_per_epoch
                * self.config.batch_size
                / train_time,
                "best_checkpoint": str(best_path),
                "replans": self.replans,
                "machine": machines_of(self.metrics),
                "command": training_command(self.config, self.replans),
            }
            with self._writing(self.run.summary):
                write_json(self.run.summary, summary)
            self.logger.print(
                f"best validation accuracy {best['val_acc']:.4f} at epoch {best['epoch']}; "
                f"test accuracy of that checkpoint {test_acc:.4f} (loss {test_loss:.4f}); "
                f"{train_time:.1f}s of training, {summary['images_per_s']:.0f} img/s; "
                f"run folder {self.run.root}"
            )
        distributed.barrier()
        return summary

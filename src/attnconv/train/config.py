"""The training configuration: plain typed values, resolved from a preset, a dataset and overrides.

``resolve_config("quadratic", epochs=10, overrides=["model.dropout=0"])`` starts from
``TrainConfig``'s defaults (the paper's recipe), applies the preset's recipe (its departures from
them, ``attnconv.PRESETS[name].recipe``), then the typed settings (``epochs=10``: Python values,
type-checked, as the command line's flags give them) and the free ``key=value`` overrides (strings
parsed by each field's type; of a key given twice there, the last counts), and checks every value.
Keys prefixed with ``model.`` override the preset's model constructor arguments. A key may not be
both a setting and an override.

When ``epochs`` is set but ``milestones`` is not, the step schedule's milestones are scaled in
proportion to the run length (``round(m · epochs / recipe epochs)``, those that fall at or past the
last epoch dropped), so a shortened ResNet run keeps the shape of the paper's schedule (decay after
27%, 50% and 83% of training). Setting ``schedule=cosine`` on a step preset drops its milestones.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import shlex
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnconv.errors import UserError
from attnconv.hardware import PRECISIONS
from attnconv.models.decay import DECAY_EXEMPTIONS
from attnconv.models.presets import MODELS, PRESETS, model_arguments
from attnconv.seeds import SEED_RULE, is_valid_seed
from attnconv.train.schedule import SCHEDULES, STEPPINGS

# Model arguments set from the dataset, never from the command line.
DATA_MODEL_ARGUMENTS: tuple[str, ...] = ("num_classes", "in_channels", "image_size", "mean", "std")
MODEL_PREFIX = "model."
# Datasets that ship inside a package (scikit-learn's digits): no data folder to point at.
EMBEDDED_DATASETS: tuple[str, ...] = ("digits",)


@dataclass
class TrainConfig:
    """Everything that defines a training run (saved in every checkpoint, and as
    ``RUN_DIR/config.json`` for people to read).

    The defaults are the paper's recipe ([the mathematics, §4][4-the-image-transformer]); a preset's
    ``recipe`` lists its departures from them. ``optimizer``: ``"sgd"`` (the paper's: SGD with
    ``momentum``) or ``"adamw"`` (AdamW with β = (``momentum``, 0.999) and decoupled
    ``weight_decay``: the recipe vision transformers without a convolutional bias are trained with).
    Units: ``lr`` per optimizer step; ``epochs``, ``milestones`` and ``checkpoint_every`` in epochs;
    ``checkpoint_steps`` in optimizer steps (mid-epoch saves of ``last.pt``; 0: off);
    ``milestones``: the epochs after which ``schedule="step"`` divides the rate by 10 (only for that
    schedule); ``pad``: the random-crop padding in pixels, ``None`` for ``⌈H / 8⌉`` (4 for CIFAR's
    32×32 as in the paper, 1 for the 8×8 digits; no crop on a dataset whose loader places its
    images, ``fashion-mnist-anywhere``); ``val_size`` a count of images (int) or a fraction of the
    training set (float), ``None`` for the dataset's default; ``grad_clip`` the largest gradient
    norm (``None``: no clipping); ``attention_lr_scale`` the factor on the learning rate of the
    parameters a transform adds to a network (head geometry, content gates, queries and keys: the
    model's ``transform_parameters()``; models without them ignore it), which start where the CNN
    left them no gradient to speak of; ``decay_exempt`` which parameters train without weight decay
    (``attnconv.models.decay``: ``"original"``, the paper's code, exempts only the Gaussian centres
    and spreads; configs saved before this setting existed resume with
    ``"norms-biases-positional"``, the rule they ran with); ``progress``: a progress bar on stderr
    when it is a terminal, elsewhere (a log file, a pipe, a notebook) a line every
    ``train(log_interval=...)`` steps; false: neither, only the line per epoch;
    ``schedule_stepping``: ``"step"`` changes the rate every update, ``"epoch"`` holds each epoch
    at the rate of its first step with the original code's warm-up (epoch 0 at rate 0;
    ``attnconv.train.schedule``); ``precision``
    ``auto`` (bfloat16 autocast where the device computes in bfloat16 natively, else float32; see
    ``attnconv.hardware``), ``fp32`` or ``bf16``. A run replaces ``auto`` by the precision it
    resolved to before saving the config, so a resumed run keeps the arithmetic it started with.
    """

    preset: str
    dataset: str
    data_dir: str | None = None
    val_size: int | float | None = None
    epochs: int = 300
    batch_size: int = 100
    lr: float = 0.1
    optimizer: str = "sgd"
    momentum: float = 0.9
    weight_decay: float = 1e-4
    attention_lr_scale: float = 1.0
    decay_exempt: str = "original"
    schedule: str = "cosine"
    schedule_stepping: str = "step"
    warmup_fraction: float = 0.05
    milestones: tuple[int, ...] = ()
    grad_clip: float | None = None
    precision: str = "auto"
    compile: bool = False
    device: str = "auto"
    seed: int = 0
    pad: int | None = None
    checkpoint_every: int = 0
    checkpoint_steps: int = 0
    init: str | None = None
    tensorboard: bool = True
    progress: bool = True
    model: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able values (tuples become lists)."""
        return json.loads(json.dumps(dataclasses.asdict(self)))

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> TrainConfig:
        """Rebuild a config saved by ``to_dict`` (checks every value again).

        Milestones that never took effect (under the cosine schedule, or at or past the last
        epoch), which configs saved by earlier versions hold, are dropped.
        """
        values = dict(values)
        preset = values.pop("preset", None)
        if preset is None:
            raise UserError("config has no 'preset' entry")
        if "milestones" in values:
            milestones = values["milestones"]
            if values.get("schedule") != "step":
                milestones = []
            elif isinstance(milestones, list) and isinstance(values.get("epochs"), int):
                milestones = [m for m in milestones if not isinstance(m, int) or m < values["epochs"]]
            values["milestones"] = milestones
        if values.get("dataset") in EMBEDDED_DATASETS:
            values["data_dir"] = None
        values.setdefault("decay_exempt", "norms-biases-positional")
        return resolve_config(preset, **values)


# SGD with momentum (the paper's), AdamW (β1 = momentum, β2 = 0.999, decoupled weight decay).
OPTIMIZERS: tuple[str, ...] = ("sgd", "adamw")
CONFIG_KEYS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(TrainConfig) if f.name != "model")
# Keys a preset's recipe may set: how to train, not where or on what.
RECIPE_KEYS: tuple[str, ...] = (
    "epochs", "batch_size", "lr", "optimizer", "momentum", "weight_decay", "attention_lr_scale",
    "decay_exempt", "schedule", "schedule_stepping",
    "warmup_fraction", "milestones", "grad_clip", "pad", "val_size",
)
_HINTS = typing.get_type_hints(TrainConfig)


def _model_hints(model: str) -> dict[str, Any]:
    return typing.get_type_hints(MODELS[model].__init__)


def model_override_keys(preset: str) -> tuple[str, ...]:
    """The ``model.KEY`` overrides a preset accepts (its constructor minus the dataset's keys)."""
    return tuple(k for k in model_arguments(PRESETS[preset].model) if k not in DATA_MODEL_ARGUMENTS)


def recipe_values(preset: str) -> dict[str, Any]:
    """The preset's recipe, checked: its keys ``RECIPE_KEYS``, its values of the fields' types
    (UserError naming the preset otherwise)."""
    recipe = dict(PRESETS[preset].recipe)
    unknown = sorted(set(recipe) - set(RECIPE_KEYS))
    if unknown:
        raise UserError(
            f"preset {preset!r}: recipe key(s) {', '.join(unknown)} are not training settings; "
            f"valid recipe keys: {', '.join(RECIPE_KEYS)}"
        )
    return {key: check_value(value, _HINTS[key], f"preset {preset!r} recipe {key}")
            for key, value in recipe.items()}


def resolve_config(
    preset: str,
    dataset: str | None = None,
    overrides: Mapping[str, Any] | Sequence[str] | None = None,
    **settings: Any,
) -> TrainConfig:
    """The full config of a run of ``preset``.

    Args:
        preset: a key of ``attnconv.PRESETS``.
        dataset: an ``attnconv.data.DATASETS`` name; ``None`` means the preset's dataset.
        overrides: the free overrides, ``{key: value}`` or ``["key=value", ...]``; string values
            are parsed by the field's type (bool: true/false, tuples: comma-separated, ``none``
            for optional values), others are type-checked.
        settings: typed values of ``TrainConfig`` fields (``epochs=10``, ``compile=True``;
            ``model={"dropout": 0.0}`` for model arguments), type-checked, never parsed.
    Raises:
        UserError: unknown preset, dataset or key (the message lists the valid ones), a key
            given twice, a value of the wrong type or out of range, or a setting that does nothing
            in this combination (milestones under the cosine schedule, ...).
    """
    if preset not in PRESETS:
        raise UserError(f"unknown preset {preset!r}; valid presets: {', '.join(PRESETS)}")
    recipe = recipe_values(preset)
    config = TrainConfig(preset=preset, dataset=PRESETS[preset].dataset, **recipe)
    recipe_epochs = config.epochs
    model_keys = model_override_keys(preset)
    model_hints = _model_hints(PRESETS[preset].model)
    if dataset is not None:
        if "dataset" in settings:
            raise UserError("the dataset is given twice (as the argument and a setting)")
        settings["dataset"] = dataset
    settled: set[str] = set()  # the keys of settings
    given: set[str] = set()

    def set_value(key: str, value: Any, parse: bool) -> None:
        if parse and key in settled:
            raise UserError(f"{key} is given twice (as a flag and as {key}=...); give it once")
        if not parse:
            settled.add(key)
        given.add(key)
        convert = coerce if parse else check_value
        if key.startswith(MODEL_PREFIX):
            name = key[len(MODEL_PREFIX) :]
            if name not in model_keys:
                raise UserError(
                    f"unknown model key {key!r} for preset {preset!r}; valid model keys: "
                    + ", ".join(MODEL_PREFIX + k for k in model_keys)
                )
            config.model[name] = convert(value, model_hints.get(name, Any), key)
        elif key == "preset":
            if value != preset:
                raise UserError(f"the preset is {preset!r}; it cannot be overridden to {value!r}")
        elif key in CONFIG_KEYS:
            setattr(config, key, convert(value, _HINTS[key], key))
        else:
            raise UserError(
                f"unknown config key {key!r}; valid keys: {', '.join(CONFIG_KEYS)}, and "
                f"model.KEY for the model's arguments ({', '.join(model_keys)})"
            )

    for key, value in settings.items():
        if key == "model":
            if not isinstance(value, Mapping):
                raise UserError(f"model: expected a mapping of model arguments, got {value!r}")
            for name, item in value.items():
                set_value(MODEL_PREFIX + name, item, parse=False)
        else:
            set_value(key, value, parse=False)
    for key, value in _override_items(overrides):
        set_value(key, value, parse=True)
    if "milestones" not in given:
        if "schedule" in given and config.schedule != "step":
            config.milestones = ()
        elif "epochs" in given and config.epochs != recipe_epochs:
            scaled = (round(m * config.epochs / recipe_epochs) for m in config.milestones)
            config.milestones = tuple(m for m in (max(1, m) for m in scaled) if m < config.epochs)
    check_config(config)
    return config


def _override_items(overrides: Mapping[str, Any] | Sequence[str] | None) -> list[tuple[str, Any]]:
    if overrides is None:
        return []
    if isinstance(overrides, Mapping):
        return list(overrides.items())
    items = []
    for text in overrides:
        key, sep, value = str(text).partition("=")
        if not sep or not key:
            raise UserError(f"expected an override of the form key=value, got {text!r}")
        items.append((key.strip(), value.strip()))
    return items


MAX_COUNT = 10**6  # epochs, images per batch: the most attnconv train's options take
MAX_PAD = 256  # pixels of the random crop's padding (the paper's: 4)


def check_config(config: TrainConfig) -> None:
    """UserError naming the first value out of its valid range, or a setting that would do
    nothing in this combination."""
    from attnconv.data import DATASETS
    from attnconv.data.datasets import PLACED_DATASETS

    def need(ok: bool, message: str) -> None:
        if not ok:
            raise UserError(message)

    need(config.dataset in DATASETS,
         f"unknown dataset {config.dataset!r}; valid datasets: {', '.join(DATASETS)}")
    need(config.data_dir is None or config.dataset not in EMBEDDED_DATASETS,
         f"data_dir does nothing for {config.dataset!r}: it ships with scikit-learn; leave "
         f"--data-dir out")
    need(config.epochs >= 1, f"epochs must be >= 1, got {config.epochs}")
    need(config.epochs <= MAX_COUNT, f"epochs must be <= {MAX_COUNT}, got {config.epochs}")
    need(1 <= config.batch_size <= MAX_COUNT,
         f"batch_size must be in [1, {MAX_COUNT}], got {config.batch_size}")
    need(config.lr > 0, f"lr must be > 0, got {config.lr}")
    need(config.optimizer in OPTIMIZERS,
         f"unknown optimizer {config.optimizer!r}; valid optimizers: {', '.join(OPTIMIZERS)}")
    need(0 <= config.momentum < 1, f"momentum must be in [0, 1), got {config.momentum}")
    need(config.weight_decay >= 0, f"weight_decay must be >= 0, got {config.weight_decay}")
    need(config.attention_lr_scale > 0,
         f"attention_lr_scale must be > 0, got {config.attention_lr_scale}")
    need(config.decay_exempt in DECAY_EXEMPTIONS,
         f"unknown decay_exempt {config.decay_exempt!r}; valid: {', '.join(DECAY_EXEMPTIONS)}")
    need(config.schedule in SCHEDULES,
         f"unknown schedule {config.schedule!r}; valid schedules: {', '.join(SCHEDULES)}")
    need(config.schedule_stepping in STEPPINGS,
         f"unknown schedule_stepping {config.schedule_stepping!r}; valid: {', '.join(STEPPINGS)}")
    need(0 <= config.warmup_fraction < 1,
         f"warmup_fraction must be in [0, 1), got {config.warmup_fraction}")
    need(config.schedule == "step" or not config.milestones,
         f"milestones apply to schedule=step only; the {config.schedule} schedule has none "
         f"(got milestones={','.join(map(str, config.milestones))})")
    need(all(1 <= m < config.epochs for m in config.milestones)
         and list(config.milestones) == sorted(config.milestones),
         f"milestones must be non-decreasing epochs in [1, epochs={config.epochs}) (a repeated "
         f"one divides the rate twice; one at or past the last epoch never takes effect), got "
         f"{config.milestones}")
    need(config.grad_clip is None or config.grad_clip > 0,
         f"grad_clip must be > 0 (or none for no clipping), got {config.grad_clip}")
    need(config.precision in PRECISIONS,
         f"unknown precision {config.precision!r}; valid: {', '.join(PRECISIONS)}")
    need(config.device == "auto" or config.device == "cpu" or config.device.startswith("cuda"),
         f"device must be auto, cpu, cuda or cuda:N, got {config.device!r}")
    need(is_valid_seed(config.seed), f"seed must be {SEED_RULE}, got {config.seed}")
    need(config.pad is None or 0 <= config.pad <= MAX_PAD,
         f"pad must be in [0, {MAX_PAD}] pixels, got {config.pad}")
    need(not config.pad or config.dataset not in PLACED_DATASETS,
         f"pad does nothing on {config.dataset!r}: placing every image anywhere on its canvas "
         f"replaces the random crop; leave pad out")
    need(config.checkpoint_every >= 0,
         f"checkpoint_every must be >= 0 epochs (0: off), got {config.checkpoint_every}")
    need(config.checkpoint_steps >= 0,
         f"checkpoint_steps must be >= 0 steps (0: off), got {config.checkpoint_steps}")
    need(config.val_size is None or config.val_size > 0,
         f"val_size must be > 0 (the best checkpoint is chosen on validation), got {config.val_size}")
    requires_init = PRESETS[config.preset].requires_init
    need(not requires_init or config.init is not None,
         f"preset {config.preset!r} fine-tunes a trained model: give --init CHECKPOINT")
    need(requires_init or config.init is None,
         f"preset {config.preset!r} trains from scratch; --init is only for presets that "
         f"fine-tune ({', '.join(n for n, p in PRESETS.items() if p.requires_init)})")


def extended_config(config: TrainConfig, epochs: int, trained: int) -> TrainConfig:
    """``config`` re-planned to ``epochs`` epochs in all, for a run that has finished ``trained``.

    This is ``attnconv train --resume RUN --epochs N``: the run continues as if it had been
    planned with ``epochs`` from the start. The updates already made keep the rates they had; the
    schedule of the updates to come is the new length's. Under ``cosine`` the warm-up and the decay
    span the new length, so a finished run's rate goes back up to what the longer plan has at that
    step (half the base rate at the midpoint when the length is doubled) and decays to zero at the
    new end. Under ``step`` the milestones are epoch numbers and stay where they are (the rate keeps
    its last value), except those at or past a shortened end, which are dropped.

    UserError unless ``trained < epochs``: a run cannot be shortened below what it has trained.
    """
    if epochs <= trained:
        raise UserError(
            f"the run has trained {trained} epoch(s); --epochs sets its new length in all, so it "
            f"must be more than {trained} (e.g. --epochs {trained + config.epochs} for "
            f"{config.epochs} more)"
        )
    milestones = tuple(m for m in config.milestones if m < epochs)
    extended = dataclasses.replace(config, epochs=epochs, milestones=milestones)
    check_config(extended)
    return extended


# Settings that say where a run reads and writes and how it reports, not what it computes.
BOOKKEEPING_KEYS: tuple[str, ...] = (
    "data_dir", "device", "checkpoint_every", "checkpoint_steps", "tensorboard", "progress",
)


def override_text(value: Any) -> str:
    """``value`` as a ``key=value`` override writes it (``coerce`` reads it back): tuples
    comma-separated, ``None`` as ``none``, booleans as ``true``/``false``."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (tuple, list)):
        return ",".join(override_text(item) for item in value)
    return str(value)


def training_command(config: TrainConfig, replans: Sequence[Sequence[int]] = ()) -> str:
    """The command line that trains ``config`` again: ``attnconv train --preset P`` with, as
    ``key=value``, every setting in which ``config`` departs from the preset's own
    (``resolve_config(preset)``), the ``BOOKKEEPING_KEYS`` aside.

    ``replans``: how ``attnconv train --resume RUN --epochs N`` changed the run's length, oldest
    first, each ``(the length before it, the epochs trained then)``. The first command then
    trains the first length into ``RUN`` and one resume per later length follows, joined by
    ``&&``; a re-plan made before the run had finished its length (an interrupted run) is marked
    ``(stopped after epoch T)``, which no command line repeats.
    """
    lengths = [planned for planned, _ in replans] + [config.epochs]
    first = dataclasses.replace(config, epochs=lengths[0])
    preset = PRESETS[config.preset]
    words = ["attnconv", "train", "--preset", config.preset]
    if config.dataset != preset.dataset:
        words += ["--dataset", config.dataset]
    start: dict[str, str] = {}  # the checkpoint a fine-tuning run starts from (pruned preset)
    if config.init is not None:
        start["init"] = config.init
        words += ["--init", shlex.quote(config.init)]
    overrides: list[str] = []
    baseline = resolve_config(config.preset, config.dataset, **start)
    for key in CONFIG_KEYS:
        if key in (*BOOKKEEPING_KEYS, "preset", "dataset", "init", "milestones"):
            continue
        if getattr(first, key) != getattr(baseline, key):
            overrides.append(f"{key}={override_text(getattr(first, key))}")
    overrides += [f"{MODEL_PREFIX}{key}={override_text(value)}" for key, value in config.model.items()]
    # the milestones only where the schedule and length do not already give them
    if resolve_config(config.preset, config.dataset, overrides, **start).milestones != first.milestones:
        overrides.append(f"milestones={override_text(first.milestones)}")
    command = " ".join(words + overrides)
    if replans:
        command += " --out RUN"
    for (planned, trained), length in zip(replans, lengths[1:], strict=True):
        if trained != planned:
            command += f" (stopped after epoch {trained})"
        command += f" && attnconv train --resume RUN --epochs {length}"
    return command


@dataclass(frozen=True)
class RecordedRun:
    """A run as ``training_command`` recorded it, read back (``read_training_command``).

    ``overrides``: the first plan's ``key=value`` settings (its length among them where it is not
    the preset's); ``lengths``: the run's length in epochs in each plan, oldest first (one per
    ``--resume RUN --epochs N`` after the first); ``stops``: the epochs trained when each plan
    ended (the plan's length but where the record says ``(stopped after epoch T)``; the last
    plan ran to its end).
    """

    preset: str
    dataset: str | None
    init: str | None
    overrides: tuple[str, ...]
    lengths: tuple[int, ...]
    stops: tuple[int, ...]

    @property
    def plans(self) -> list[tuple[int, int]]:
        """``(length, stop)`` per plan, oldest first, as ``attnconv.train.loop.train_in_plans``
        takes them."""
        return list(zip(self.lengths, self.stops, strict=True))


_STOPPED = re.compile(r"\(stopped after epoch (\d+)\)")


def read_training_command(command: str) -> RecordedRun:
    """Read back a command ``training_command`` wrote: ``attnconv train --preset P [--dataset D]
    [--init X] key=value ... [--out RUN [(stopped after epoch T)] && attnconv train --resume RUN
    --epochs N ...]``, after any other commands that prepared it (``attnconv transform ... &&``).
    UserError naming what it cannot read."""

    def fail(why: str) -> UserError:
        return UserError(f"cannot read the training command {command!r}: {why}")

    parts = [part.strip() for part in command.split(" && ")]
    starts = [i for i, part in enumerate(parts) if part.startswith("attnconv train --preset ")]
    if not starts:
        raise fail("no 'attnconv train --preset' in it")
    first, *resumes = parts[starts[0] :]
    stops: list[int | None] = []
    stopped = _STOPPED.search(first)
    stops.append(int(stopped.group(1)) if stopped else None)
    words = shlex.split(_STOPPED.sub("", first))[2:]
    flags: dict[str, str] = {}
    overrides: list[str] = []
    while words:
        word = words.pop(0)
        if word in ("--preset", "--dataset", "--init", "--out"):
            if not words:
                raise fail(f"{word} without a value")
            flags[word] = words.pop(0)
        elif "=" in word and not word.startswith("-"):
            overrides.append(word)
        else:
            raise fail(f"unexpected {word!r}")
    preset = flags["--preset"]
    base = resolve_config(preset, flags.get("--dataset"), overrides,
                          **({"init": flags["--init"]} if "--init" in flags else {}))  # fmt: skip
    lengths = [base.epochs]
    for part in resumes:
        stopped = _STOPPED.search(part)
        resumed = shlex.split(_STOPPED.sub("", part))
        if resumed[:4] != ["attnconv", "train", "--resume", flags.get("--out")] or len(resumed) != 6 \
                or resumed[4] != "--epochs" or not resumed[5].isdigit():  # fmt: skip
            raise fail(f"expected 'attnconv train --resume RUN --epochs N', got {part!r}")
        lengths.append(int(resumed[5]))
        stops.append(int(stopped.group(1)) if stopped else None)
    return RecordedRun(
        preset=preset,
        dataset=flags.get("--dataset"),
        init=flags.get("--init"),
        overrides=tuple(overrides),
        lengths=tuple(lengths),
        stops=tuple(length if stop is None else stop for length, stop in zip(lengths, stops, strict=True)),
    )


def recorded_config(
    recorded: RecordedRun,
    dataset: str | None = None,
    overrides: Mapping[str, Any] | Sequence[str] | None = None,
    **settings: Any,
) -> tuple[TrainConfig, list[tuple[int, int]]]:
    """The config of ``recorded``'s first plan and its plans ``(length, stop)``, to train the
    run again, with ``overrides`` and ``settings`` (as ``resolve_config`` takes them) in place of
    the recorded settings of the same keys. ``settings["epochs"]`` is the run's final length (the
    last plan's); the recorded init is not kept (a path on the machine that trained it: give
    ``init``). UserError when a key is given twice or the final length does not exceed the
    epochs trained before the last re-plan."""
    given = {key for key, _ in _override_items(overrides)} | set(settings)
    given |= {MODEL_PREFIX + name for name in settings.get("model", {})}
    epochs = settings.pop("epochs", None)
    plans = recorded.plans
    if epochs is not None:
        if len(plans) > 1 and epochs <= plans[-2][1]:
            raise UserError(
                f"the recorded run trained {plans[-2][1]} epoch(s) before its last re-plan; its "
                f"new length must exceed that, got epochs={epochs}"
            )
        plans[-1] = (epochs, epochs)
        if len(plans) == 1:
            settings["epochs"] = epochs
        else:
            given.discard("epochs")  # the first plan keeps its recorded length
    kept = [item for item in recorded.overrides if item.partition("=")[0] not in given]
    config = resolve_config(
        recorded.preset, dataset or recorded.dataset, [*kept, *_override_texts(overrides)],
        **settings,
    )  # fmt: skip
    return config, plans


def _override_texts(overrides: Mapping[str, Any] | Sequence[str] | None) -> list[str]:
    """``overrides`` as ``key=value`` strings (a mapping's values written by ``override_text``)."""
    if isinstance(overrides, Mapping):
        return [f"{key}={override_text(value)}" for key, value in overrides.items()]
    return [str(item) for item in overrides or ()]


def shipped_recipe(preset: str) -> RecordedRun:
    """How the shipped weights of ``preset`` were trained: their index entry's ``run.command``
    (``attnconv.models.pretrained``), read back. UserError for a preset that ships no weights,
    or whose weights record no command."""
    from attnconv.models.pretrained import pretrained_models

    shipped = pretrained_models()
    entry = shipped.get(preset)
    if entry is None or "command" not in entry.run:
        with_recipes = [name for name, info in shipped.items() if "command" in info.run]
        raise UserError(
            f"preset {preset!r} has no shipped recipe (no shipped weights record how they were "
            f"trained); presets with one: {', '.join(with_recipes)}"
        )
    return read_training_command(entry.run["command"])


def save_config(config: TrainConfig, path: str | Path) -> None:
    """Write ``config`` as indented JSON, atomically."""
    from attnconv.runs import write_json

    write_json(path, config.to_dict())


def load_config(path: str | Path) -> TrainConfig:
    """Read a ``config.json`` written by ``save_config`` (or by a run, for people to read: a
    resume uses the checkpoint's own copy)."""
    from attnconv.runs import read_json

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no training config at {path}")
    return TrainConfig.from_dict(read_json(path, "the training config"))


# ---------------------------------------------------------------------------- typed values

_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


def coerce(value: Any, hint: Any, key: str) -> Any:
    """``value`` as type ``hint``, for the free ``key=value`` overrides: strings are parsed, other
    values are checked (``check_value``).

    Supports ``bool``, ``int``, ``float``, ``str``, ``X | None``, ``X | Y``, ``tuple[X, ...]``,
    ``tuple[X, Y]`` and ``Sequence[X]`` (returned as tuples). UserError when it does not fit.
    """
    return _convert(value, hint, key, parse=True)


def check_value(value: Any, hint: Any, key: str) -> Any:
    """``value`` checked against type ``hint`` without parsing strings (an ``int`` is accepted as a
    ``float``, a list as a tuple, which it becomes); UserError when it does not fit."""
    return _convert(value, hint, key, parse=False)


def _convert(value: Any, hint: Any, key: str, parse: bool) -> Any:
    if hint is Any:
        return value
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    text = parse and isinstance(value, str)
    if origin in (typing.Union, types.UnionType):
        is_none = value is None or (text and value.lower() in ("none", "null"))
        if is_none and type(None) in args:
            return None
        for option in (a for a in args if a is not type(None)):
            try:
                return _convert(value, option, key, parse)
            except UserError:
                continue
        raise UserError(f"{key}: expected {_type_name(hint)}, got {value!r}")
    if origin in (tuple, Sequence) or hint in (tuple, Sequence):
        return _convert_sequence(value, args, hint, key, parse)
    if hint is bool:
        if isinstance(value, bool):
            return value
        if text and value.lower() in _TRUE + _FALSE:
            return value.lower() in _TRUE
    elif hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if text:
            try:
                return int(value)
            except ValueError:
                pass
    elif hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if math.isfinite(value):
                return float(value)
        elif text:
            try:
                number = float(value)
            except ValueError:
                number = math.nan
            if math.isfinite(number):
                return number
    elif hint is str:
        if isinstance(value, str):
            return value
    else:
        raise TypeError(f"{key}: cannot check values of type {hint!r}")  # a bug in the hints
    raise UserError(f"{key}: expected {_type_name(hint)}, got {value!r}")


def _convert_sequence(value: Any, args: tuple, hint: Any, key: str, parse: bool) -> tuple:
    if parse and isinstance(value, str):
        text = value.strip().strip("()[]").strip()
        items: Sequence[Any] = [] if not text else [part.strip() for part in text.split(",")]
    elif isinstance(value, (list, tuple)):
        items = value
    else:
        raise UserError(f"{key}: expected {_type_name(hint)}, got {value!r}")
    if not args:
        return tuple(items)
    if len(args) == 1 or (len(args) == 2 and args[1] is Ellipsis):
        return tuple(_convert(item, args[0], key, parse) for item in items)
    if len(items) != len(args):
        raise UserError(f"{key}: expected {_type_name(hint)} ({len(args)} values), got {value!r}")
    return tuple(_convert(item, arg, key, parse) for item, arg in zip(items, args, strict=True))


def _type_name(hint: Any) -> str:
    if isinstance(hint, type):
        return hint.__name__
    return str(hint).replace("typing.", "").replace("collections.abc.", "")

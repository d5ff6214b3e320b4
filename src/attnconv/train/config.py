"""The training configuration: plain typed values, resolved from a preset, a dataset and overrides.

``resolve_config("quadratic", overrides={"epochs": "10", "model.dropout": "0"})`` starts from the
preset's recipe (``attnconv.PRESETS[name].recipe``), applies the overrides (strings from the
command line are parsed according to each field's type; Python values are type-checked) and checks
every value. Keys prefixed with ``model.`` override the preset's model constructor arguments.

When ``epochs`` is overridden but ``milestones`` is not, the step-decay milestones are scaled in
proportion to the run length (``round(m · epochs / recipe.epochs)``), so a shortened ResNet run
keeps the shape of the paper's schedule (decay after 27%, 50% and 83% of training).
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnconv.hardware import PRECISIONS
from attnconv.models.presets import MODELS, PRESETS, SCHEDULES, model_arguments

# Model arguments set from the dataset, never from the command line.
DATA_MODEL_ARGUMENTS: tuple[str, ...] = ("num_classes", "in_channels", "image_size", "mean", "std")
MODEL_PREFIX = "model."


@dataclass
class TrainConfig:
    """Everything that defines a training run (saved as ``RUN_DIR/config.json``).

    Units: ``lr`` per step of SGD; ``epochs``, ``milestones`` and ``checkpoint_every`` in epochs;
    ``checkpoint_steps`` in optimizer steps (mid-epoch saves of ``last.pt``; 0: off); ``pad``: the
    random-crop padding in pixels, ``None`` for ``⌈H / 8⌉`` (4 for CIFAR's 32×32 as in the paper,
    1 for the 8×8 digits); ``val_size`` a count of images (int) or a fraction of the training set
    (float), ``None`` for the dataset's default; ``grad_clip`` the largest gradient norm (``None``:
    no clipping); ``progress``: a progress bar on stderr when it is a terminal (elsewhere, e.g. a
    log file, only the line per epoch); ``precision`` ``auto`` (bfloat16 autocast where the device
    computes in bfloat16 natively, else float32; see ``attnconv.hardware``), ``fp32`` or
    ``bf16``. A run replaces ``auto`` by the precision it resolved to before writing
    ``config.json``, so a resumed run keeps the arithmetic it started with.
    """

    preset: str = "quick"
    dataset: str = "digits"
    data_dir: str | None = None
    val_size: int | float | None = None
    epochs: int = 30
    batch_size: int = 64
    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 1e-4
    schedule: str = "cosine"
    warmup_fraction: float = 0.05
    milestones: tuple[int, ...] = (80, 150, 250)
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
        """Rebuild a config saved by ``to_dict`` (checks every value again)."""
        values = dict(values)
        preset = values.pop("preset", None)
        if preset is None:
            raise ValueError("config has no 'preset' entry")
        model = values.pop("model", {})
        overrides = {**values, **{MODEL_PREFIX + k: v for k, v in model.items()}}
        return resolve_config(preset, overrides=overrides)


CONFIG_KEYS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(TrainConfig) if f.name != "model")
_HINTS = typing.get_type_hints(TrainConfig)


def _model_hints(model: str) -> dict[str, Any]:
    return typing.get_type_hints(MODELS[model].__init__)


def model_override_keys(preset: str) -> tuple[str, ...]:
    """The ``model.KEY`` overrides a preset accepts (its constructor minus the dataset's keys)."""
    return tuple(k for k in model_arguments(PRESETS[preset].model) if k not in DATA_MODEL_ARGUMENTS)


def resolve_config(
    preset: str,
    dataset: str | None = None,
    overrides: Mapping[str, Any] | Sequence[str] | None = None,
) -> TrainConfig:
    """The full config of a run of ``preset``.

    Args:
        preset: a key of ``attnconv.PRESETS``.
        dataset: an ``attnconv.data.DATASETS`` name; ``None`` means the preset's recipe dataset.
        overrides: ``{key: value}`` or ``["key=value", ...]``; string values are parsed by the
            field's type (bool: true/false, tuples: comma-separated, ``none`` for optional values).
    Raises:
        ValueError: unknown preset, dataset or key (the message lists the valid ones), or a value
            out of range. TypeError: a value of the wrong type.
    """
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; valid presets: {', '.join(PRESETS)}")
    recipe = PRESETS[preset].recipe
    values: dict[str, Any] = {
        "preset": preset,
        "dataset": recipe.dataset,
        "epochs": recipe.epochs,
        "batch_size": recipe.batch_size,
        "lr": recipe.lr,
        "momentum": recipe.momentum,
        "weight_decay": recipe.weight_decay,
        "schedule": recipe.schedule,
        "warmup_fraction": recipe.warmup_fraction,
        "milestones": tuple(recipe.milestones),
    }
    config = TrainConfig(**values)
    items = _override_items(overrides)
    if dataset is not None:
        items.insert(0, ("dataset", dataset))
    model_hints = _model_hints(PRESETS[preset].model)
    model_keys = model_override_keys(preset)
    for key, value in items:
        if key.startswith(MODEL_PREFIX):
            name = key[len(MODEL_PREFIX) :]
            if name not in model_keys:
                raise ValueError(
                    f"unknown model key {key!r} for preset {preset!r}; valid model keys: "
                    + ", ".join(MODEL_PREFIX + k for k in model_keys)
                )
            config.model[name] = coerce(value, model_hints.get(name, Any), key)
        elif key == "preset":
            if value != preset:
                raise ValueError(f"the preset is {preset!r}; it cannot be overridden to {value!r}")
        elif key in CONFIG_KEYS:
            setattr(config, key, coerce(value, _HINTS[key], key))
        else:
            raise ValueError(
                f"unknown config key {key!r}; valid keys: {', '.join(CONFIG_KEYS)}, and "
                f"model.KEY for the model's arguments ({', '.join(model_keys)})"
            )
    keys = {key for key, _ in items}
    if "epochs" in keys and "milestones" not in keys and config.epochs != recipe.epochs:
        config.milestones = tuple(
            max(1, round(m * config.epochs / recipe.epochs)) for m in recipe.milestones
        )
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
            raise ValueError(f"expected an override of the form key=value, got {text!r}")
        items.append((key.strip(), value.strip()))
    return items


def check_config(config: TrainConfig) -> None:
    """ValueError naming the first value out of its valid range."""
    from attnconv.data import DATASETS

    def need(ok: bool, message: str) -> None:
        if not ok:
            raise ValueError(message)

    need(config.dataset in DATASETS,
         f"unknown dataset {config.dataset!r}; valid datasets: {', '.join(DATASETS)}")
    need(config.epochs >= 1, f"epochs must be >= 1, got {config.epochs}")
    need(config.batch_size >= 1, f"batch_size must be >= 1, got {config.batch_size}")
    need(config.lr > 0, f"lr must be > 0, got {config.lr}")
    need(0 <= config.momentum < 1, f"momentum must be in [0, 1), got {config.momentum}")
    need(config.weight_decay >= 0, f"weight_decay must be >= 0, got {config.weight_decay}")
    need(config.schedule in SCHEDULES,
         f"unknown schedule {config.schedule!r}; valid schedules: {', '.join(SCHEDULES)}")
    need(0 <= config.warmup_fraction < 1,
         f"warmup_fraction must be in [0, 1), got {config.warmup_fraction}")
    need(all(m >= 1 for m in config.milestones)
         and list(config.milestones) == sorted(config.milestones),
         f"milestones must be non-decreasing epochs >= 1 (a repeated one divides the rate "
         f"twice), got {config.milestones}")
    need(config.grad_clip is None or config.grad_clip > 0,
         f"grad_clip must be > 0 (or none for no clipping), got {config.grad_clip}")
    need(config.precision in PRECISIONS,
         f"unknown precision {config.precision!r}; valid: {', '.join(PRECISIONS)}")
    need(config.device == "auto" or config.device == "cpu" or config.device.startswith("cuda"),
         f"device must be auto, cpu, cuda or cuda:N, got {config.device!r}")
    need(config.seed >= 0, f"seed must be >= 0, got {config.seed}")
    need(config.pad is None or config.pad >= 0, f"pad must be >= 0 pixels, got {config.pad}")
    need(config.checkpoint_every >= 0,
         f"checkpoint_every must be >= 0 epochs (0: off), got {config.checkpoint_every}")
    need(config.checkpoint_steps >= 0,
         f"checkpoint_steps must be >= 0 steps (0: off), got {config.checkpoint_steps}")
    need(config.val_size is None or config.val_size > 0,
         f"val_size must be > 0 (the best checkpoint is chosen on validation), got {config.val_size}")
    requires_init = PRESETS[config.preset].recipe.requires_init
    need(not requires_init or config.init is not None,
         f"preset {config.preset!r} fine-tunes a trained model: give --init CHECKPOINT")
    need(requires_init or config.init is None,
         f"preset {config.preset!r} trains from scratch; --init is only for presets that "
         f"fine-tune ({', '.join(n for n, p in PRESETS.items() if p.recipe.requires_init)})")


def save_config(config: TrainConfig, path: str | Path) -> None:
    """Write ``config`` as indented JSON, atomically."""
    from attnconv.runs import write_json

    write_json(path, config.to_dict())


def load_config(path: str | Path) -> TrainConfig:
    """Read a ``config.json`` written by ``save_config``."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no training config at {path}")
    try:
        values = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON: {err}") from err
    if not isinstance(values, dict):
        raise ValueError(f"{path} must hold a JSON object, got {type(values).__name__}")
    return TrainConfig.from_dict(values)


# ---------------------------------------------------------------------------- typed values

_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


def coerce(value: Any, hint: Any, key: str) -> Any:
    """``value`` as type ``hint``: strings are parsed, other values are checked.

    Supports ``bool``, ``int``, ``float``, ``str``, ``X | None``, ``X | Y``, ``tuple[X, ...]``,
    ``tuple[X, Y]`` and ``Sequence[X]`` (returned as tuples). TypeError when it does not fit.
    """
    if hint is Any:
        return value
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        is_none = value is None or (isinstance(value, str) and value.lower() in ("none", "null"))
        if is_none and type(None) in args:
            return None
        for option in (a for a in args if a is not type(None)):
            try:
                return coerce(value, option, key)
            except TypeError:
                continue
        raise TypeError(f"{key}: expected {_type_name(hint)}, got {value!r}")
    if origin in (tuple, Sequence) or hint in (tuple, Sequence):
        return _coerce_sequence(value, args, hint, key)
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in _TRUE + _FALSE:
            return value.lower() in _TRUE
    elif hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                pass
    elif hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if math.isfinite(value):
                return float(value)
        elif isinstance(value, str):
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
        raise TypeError(f"{key}: cannot check values of type {hint!r}")
    raise TypeError(f"{key}: expected {_type_name(hint)}, got {value!r}")


def _coerce_sequence(value: Any, args: tuple, hint: Any, key: str) -> tuple:
    if isinstance(value, str):
        text = value.strip().strip("()[]").strip()
        items: Sequence[Any] = [] if not text else [part.strip() for part in text.split(",")]
    elif isinstance(value, (list, tuple)):
        items = value
    else:
        raise TypeError(f"{key}: expected {_type_name(hint)}, got {value!r}")
    if not args:
        return tuple(items)
    if len(args) == 1 or (len(args) == 2 and args[1] is Ellipsis):
        return tuple(coerce(item, args[0], key) for item in items)
    if len(items) != len(args):
        raise TypeError(f"{key}: expected {_type_name(hint)} ({len(args)} values), got {value!r}")
    return tuple(coerce(item, arg, key) for item, arg in zip(items, args, strict=True))


def _type_name(hint: Any) -> str:
    if isinstance(hint, type):
        return hint.__name__
    return str(hint).replace("typing.", "").replace("collections.abc.", "")

"""Checkpoints: atomic writes, safe loads, and rebuilding the model they hold.

A checkpoint is one ``torch.save``d dict (format ``attnconv-checkpoint``, version 2) holding only
tensors and plain values, so ``torch.load(path, weights_only=True)`` opens it without running code.
It says what it holds without consulting the current presets:

    format, version, architecture (a key of ``attnconv.models.MODELS``), arguments (every
    constructor argument: ``MODELS[architecture](**arguments)`` is the model), model (its
    state_dict), preset (the preset it was trained as), dataset;

and a training checkpoint adds optimizer (state_dict), rng ({"torch": uint8 tensor, "cuda":
[uint8 tensors]} per rank), epoch (completed epochs), step (completed optimizer steps), config
(TrainConfig.to_dict()), metrics (one dict per completed epoch) and, for a checkpoint taken inside
an epoch, epoch_progress (the running sums of that epoch's training loss/accuracy). The learning
rate schedule is not stored: it is a function of the config and the step.

Version 1 (before full arguments) stored ``model_config``, the ``create_model`` overrides of its
preset; ``load_checkpoint`` still reads it, merging them with the preset as this attnconv defines it.

Writes go through ``attnconv.runs.write_atomic``: a crash leaves either the old file or the new one,
never a truncated mix.
"""

from __future__ import annotations

import io
import pickle
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._device import _device_constructors

from attnconv.errors import UserError
from attnconv.models.presets import MODELS, preset_arguments
from attnconv.models.transformer import upgrade_arguments
from attnconv.runs import require_regular_file, write_atomic

FORMAT = "attnconv-checkpoint"
VERSION = 2
REQUIRED_KEYS = ("preset", "dataset", "architecture", "arguments", "model")
_VERSION_1_REQUIRED_KEYS = ("preset", "dataset", "model_config", "model")


class CheckpointError(UserError):
    """A checkpoint file that cannot be used: unreadable, unsafe, or not what it claims to be."""


def save_checkpoint(checkpoint: Mapping[str, Any], path: str | Path) -> None:
    """Write ``checkpoint`` (the entries of the module docstring) to ``path`` as a version-2 file,
    atomically.

    The bytes are serialised in memory first, so a full or read-only disk raises a plain OSError
    (with ``path`` as its ``filename``) and leaves the previous file at ``path`` intact. ValueError
    if an entry every reader needs is missing.
    """
    missing = [key for key in REQUIRED_KEYS if key not in checkpoint]
    if missing:
        raise ValueError(f"a checkpoint needs {', '.join(missing)} to be saved")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    torch.save({**checkpoint, "format": FORMAT, "version": VERSION}, buffer)
    write_atomic(path, buffer.getbuffer())


# The entries every reader relies on, and the optional ones a training checkpoint adds: their types.
_FIELD_TYPES: dict[str, type | tuple[type, ...]] = {
    "preset": str,
    "dataset": str,
    "architecture": str,
    "arguments": dict,
    "model": dict,
    "optimizer": dict,
    "rng": list,
    "epoch": int,
    "step": int,
    "config": dict,
    "metrics": list,
    "epoch_progress": (dict, type(None)),
}
_UNPRINTABLE = re.compile(r"[^\x20-\x7e]+")


def _printable(text: str, limit: int = 160) -> str:
    """``text`` on one line without control characters (terminal escapes), at most ``limit``."""
    text = _UNPRINTABLE.sub(" ", text).strip()
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _load_failure(path: Path, err: Exception) -> CheckpointError:
    if isinstance(err, pickle.UnpicklingError):
        return CheckpointError(
            f"checkpoint {path} holds Python objects other than tensors and plain values, which "
            f"could run code when loaded; it was refused. Use checkpoints written by attnconv "
            f"train from a source you trust"
        )
    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return CheckpointError(
        f"checkpoint {path} is corrupted or truncated and cannot be read ({_printable(first)}); "
        f"use another checkpoint of the run (checkpoints/last.pt, best.pt) or train it again"
    )


def _malformed(
    path: str | Path, key: str, value: Any, expected: tuple[type, ...]
) -> CheckpointError:
    return CheckpointError(
        f"checkpoint {path} has a malformed {key!r} entry (a {type(value).__name__}, expected "
        f"{' or '.join(t.__name__ for t in expected)}); it was not written by attnconv train"
    )


def check_fields(checkpoint: Mapping[str, Any], path: str | Path) -> None:
    """CheckpointError naming the first entry of ``checkpoint`` whose type is wrong, or whose
    value is out of range (a negative epoch or step count)."""
    for key, expected in _FIELD_TYPES.items():
        if key not in checkpoint:
            continue
        value = checkpoint[key]
        if not isinstance(value, expected) or isinstance(value, bool):
            raise _malformed(
                path, key, value, expected if isinstance(expected, tuple) else (expected,)
            )
    for key in ("epoch", "step"):
        if checkpoint.get(key, 0) < 0:
            raise CheckpointError(
                f"checkpoint {path} has {key}={checkpoint[key]}; expected a count >= 0 (of "
                f"completed {'epochs' if key == 'epoch' else 'optimizer steps'}): the file was "
                f"edited or damaged"
            )
    bad = [
        k
        for k, v in checkpoint["model"].items()
        if not (isinstance(k, str) and isinstance(v, torch.Tensor))
    ]
    bad += [k for k in checkpoint["arguments"] if not isinstance(k, str)]
    if bad:
        raise CheckpointError(
            f"checkpoint {path} has a malformed model entry {_printable(repr(bad[0]), 60)} (model "
            f"weights must map names to tensors, arguments names to values)"
        )


def _from_version_1(checkpoint: dict[str, Any], path: Path) -> dict[str, Any]:
    """A version-1 checkpoint with ``architecture`` and ``arguments`` in place of ``model_config``
    (its overrides merged with the preset as this attnconv defines it) and without the schedule
    description it carried. The ``version`` entry stays 1: it says what the file holds."""
    overrides = checkpoint["model_config"]
    if not isinstance(overrides, dict):
        raise _malformed(path, "model_config", overrides, (dict,))
    if not isinstance(checkpoint["preset"], str):
        raise _malformed(path, "preset", checkpoint["preset"], (str,))
    bad = [key for key in overrides if not isinstance(key, str)]
    if bad:
        raise CheckpointError(
            f"checkpoint {path} has a malformed model_config entry {_printable(repr(bad[0]), 60)}"
        )
    preset = _printable(checkpoint["preset"], 40)
    try:
        architecture, arguments = preset_arguments(checkpoint["preset"], **overrides)
    except (TypeError, ValueError) as err:
        raise CheckpointError(
            f"{path}: its model_config does not build a {preset!r} model ({_printable(str(err))});"
            f" a version-1 checkpoint is rebuilt from its preset, which this attnconv must have"
        ) from err
    upgraded = {k: v for k, v in checkpoint.items() if k not in ("model_config", "scheduler")}
    return {**upgraded, "architecture": architecture, "arguments": arguments}


def load_checkpoint(
    path: str | Path, map_location: str | torch.device = "cpu", mmap: bool = False
) -> dict[str, Any]:
    """Read a checkpoint with ``torch.load(weights_only=True)`` and check its format and types.

    Version-1 files come back in the version-2 form (``architecture`` and ``arguments``, see the
    module docstring) with ``version`` 1. ``mmap=True`` maps the tensors from the file instead of
    reading them all (for reading a few parameters out of many checkpoints).

    FileNotFoundError if ``path`` is missing; CheckpointError (a ValueError) naming the file if it
    is truncated, corrupted, unsafe (pickled objects), or not an attnconv checkpoint.
    """
    path = require_regular_file(path, "checkpoint")  # a FIFO or /dev/zero is named as such
    try:
        checkpoint = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except PermissionError:
        raise
    except Exception as err:  # truncated zip (an OSError too), bad pickle, unsafe global
        raise _load_failure(path, err) from err
    if not isinstance(checkpoint, dict) or checkpoint.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not an attnconv checkpoint (no format={FORMAT!r} entry)")
    version = checkpoint.get("version")
    if version not in (1, VERSION) or isinstance(version, bool):
        raise CheckpointError(
            f"checkpoint {path} has format version {_printable(repr(version), 40)}; this attnconv "
            f"reads versions 1 to {VERSION}"
        )
    required = _VERSION_1_REQUIRED_KEYS if version == 1 else REQUIRED_KEYS
    missing = [key for key in required if key not in checkpoint]
    if missing:
        raise CheckpointError(f"checkpoint {path} lacks {', '.join(missing)}")
    if version == 1:
        checkpoint = _from_version_1(checkpoint, path)
    check_fields(checkpoint, path)
    return checkpoint


def construct(
    architecture: str,
    arguments: Mapping[str, Any],
    source: str | Path,
    error: type[UserError] = CheckpointError,
) -> nn.Module:
    """``MODELS[architecture](**arguments)``, freshly initialised (train mode, CPU).

    ``error`` (a one-line message naming ``source``, the file) if this attnconv has no such
    architecture or the arguments do not build it. Arguments an earlier attnconv wrote are read
    in today's terms first (``transformer.upgrade_arguments``).
    """
    if architecture not in MODELS:
        raise error(
            f"{source} holds a model of architecture {_printable(architecture, 40)!r}, which this "
            f"attnconv does not have (it has {', '.join(MODELS)})"
        )
    if architecture == "image_transformer":
        arguments = upgrade_arguments(arguments)
    try:
        return MODELS[architecture](**arguments)
    except (TypeError, ValueError, RuntimeError) as err:  # RuntimeError: a failed allocation
        raise error(
            f"{source}: its arguments do not build a {architecture!r} model "
            f"({_printable(str(err))}); the file was not written by this attnconv"
        ) from err


CONSTRUCTION_SLACK = 64 << 20
"""Bytes a model's construction may allocate beyond twice its weights (temporaries, tables)."""


class _AllocationExceeded(Exception):
    """A model's construction passed its allocation limit; the message says how."""


class _AllocationLimit(TorchFunctionMode):
    """While active, counts the bytes of the tensors torch's factory functions make and raises
    ``_AllocationExceeded`` once they pass ``limit`` (right after the allocation, before anything
    is written to it, so memory the system lends lazily is never touched) or when the system
    refuses one."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit, self.left = limit, limit

    def __torch_function__(
        self, func: Callable, types: Any, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        if func not in _device_constructors():
            return func(*args, **(kwargs or {}))
        try:
            result = func(*args, **(kwargs or {}))
        except RuntimeError as err:  # a failed allocation: more than the machine can give
            raise _AllocationExceeded("more memory than this machine can give") from err
        if isinstance(result, torch.Tensor):
            self.left -= result.numel() * result.element_size()
            if self.left < 0:
                raise _AllocationExceeded(f"more than {self.limit:,} bytes")
        return result


def rebuild(
    architecture: str,
    arguments: Mapping[str, Any],
    state: Mapping[str, torch.Tensor],
    source: str | Path,
    error: type[UserError] = CheckpointError,
) -> nn.Module:
    """The saved model: ``MODELS[architecture](**arguments)`` with the weights ``state`` loaded
    (train mode, CPU). Checkpoints and the shipped pretrained weights are both rebuilt here.

    ``error`` naming ``source`` if a weight is not finite (NaN or infinite: damaged, or saved
    after training diverged, which ``attnconv train`` never does), the arguments describe a model
    much larger than the weights (its construction would allocate more than twice their bytes
    and ``CONSTRUCTION_SLACK``, or more than the machine gives; it is stopped before the memory
    is used), the model cannot be built (``construct``), or ``state`` does not fit it exactly (a
    missing, unexpected or differently shaped tensor).
    """
    for name, tensor in state.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise error(
                f"{source}: weight {_printable(name, 80)} holds NaN or infinite values; the file "
                f"is damaged or was saved from a diverged run"
            )
    held = sum(t.numel() * t.element_size() for t in state.values())
    limit = 2 * held + CONSTRUCTION_SLACK
    try:
        with _AllocationLimit(limit):
            model = construct(architecture, arguments, source, error)
    except _AllocationExceeded as err:
        raise error(
            f"{source}: its arguments describe a model far larger than its {held:,} bytes of "
            f"weights (building it would allocate {err}); the file is damaged or was edited"
        ) from None
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as err:  # shapes differ
        lines = str(err).strip().splitlines()[1:] or [str(err)]  # line 0: "Error(s) in ..."
        detail = lines[0]
    else:
        if not missing and not unexpected:
            return model
        detail = f"missing: {', '.join(missing) or 'none'}; unexpected: {', '.join(unexpected) or 'none'}"
    raise error(
        f"{source}: its weights do not fit the {architecture!r} model its arguments describe "
        f"({_printable(detail)}); the file is damaged or was edited"
    )


def build_model(checkpoint: Mapping[str, Any], source: str | Path = "the checkpoint") -> nn.Module:
    """The model of a checkpoint dict from ``load_checkpoint`` (train mode, CPU), see ``rebuild``."""
    return rebuild(checkpoint["architecture"], checkpoint["arguments"], checkpoint["model"], source)


def load_model(
    path: str | Path, map_location: str | torch.device = "cpu"
) -> tuple[nn.Module, dict[str, Any]]:
    """``(model in eval mode on map_location, checkpoint dict)`` from checkpoint ``path``.

    The model is ``MODELS[checkpoint["architecture"]](**checkpoint["arguments"])`` (pruned models
    carry their heads per layer there) with the saved weights.
    """
    checkpoint = load_checkpoint(path, map_location)
    return build_model(checkpoint, path).to(map_location).eval(), checkpoint


def checkpoint_name(checkpoint: Mapping[str, Any]) -> str:
    """A checkpoint's preset and how far it was trained, as lines and figure titles name it:
    ``"P, epoch N"`` for one that ``attnconv train`` saved after epoch N; the network that
    ``attnconv transform`` writes has trained no epoch since its transform, ``"P, transformed, not
    fine-tuned"``; another without an epoch, ``"P, no epoch recorded"``."""
    preset = checkpoint["preset"]
    if "epoch" in checkpoint:
        return f"{preset}, epoch {checkpoint['epoch']}"
    if checkpoint.get("architecture") == "transformed":
        return f"{preset}, transformed, not fine-tuned"
    return f"{preset}, no epoch recorded"

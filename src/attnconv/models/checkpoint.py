"""Training checkpoints: atomic writes, safe loads, and rebuilding the model.

A checkpoint is one ``torch.save``d dict (format ``attnconv-checkpoint``, version 1) holding only
tensors and plain values, so ``torch.load(path, weights_only=True)`` opens it without running code:

    format, version, preset, dataset, model_config (create_model overrides incl. num_classes),
    model (state_dict), optimizer (state_dict), scheduler (LRSchedule.state_dict()),
    rng ({"torch": uint8 tensor, "cuda": [uint8 tensors]}), epoch (completed epochs),
    step (completed optimizer steps), config (TrainConfig.to_dict()), metrics (one dict per
    completed epoch), and, for a checkpoint taken inside an epoch, epoch_progress (the running
    sums of that epoch's training loss/accuracy).

Writes go to a temporary file in the same folder, are flushed to disk, then renamed over the
target: a crash leaves either the old file or the new one, never a truncated mix.
"""

from __future__ import annotations

import io
import pickle
import re
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnconv.errors import UserError
from attnconv.runs import write_atomic

FORMAT = "attnconv-checkpoint"
VERSION = 1
REQUIRED_KEYS = ("preset", "dataset", "model_config", "model")


def save_checkpoint(checkpoint: dict[str, Any], path: str | Path) -> None:
    """Write ``checkpoint`` to ``path`` atomically (temporary file, fsync, rename).

    The bytes are serialised in memory first, so a full or read-only disk raises a plain OSError
    (with ``path`` as its ``filename``) and leaves the previous file at ``path`` intact.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    torch.save({"format": FORMAT, "version": VERSION, **checkpoint}, buffer)
    write_atomic(path, buffer.getbuffer())


class CheckpointError(UserError):
    """A checkpoint file that cannot be used: unreadable, unsafe, or not what it claims to be."""


# The entries every reader relies on, and the optional ones a training checkpoint adds: their types.
_FIELD_TYPES: dict[str, type | tuple[type, ...]] = {
    "preset": str,
    "dataset": str,
    "model_config": dict,
    "model": dict,
    "optimizer": dict,
    "scheduler": dict,
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


def check_fields(checkpoint: dict[str, Any], path: str | Path) -> None:
    """CheckpointError naming the first entry of ``checkpoint`` whose type is wrong."""
    for key, expected in _FIELD_TYPES.items():
        if key not in checkpoint:
            continue
        value = checkpoint[key]
        if not isinstance(value, expected) or isinstance(value, bool):
            names = expected if isinstance(expected, tuple) else (expected,)
            raise CheckpointError(
                f"checkpoint {path} has a malformed {key!r} entry (a {type(value).__name__}, "
                f"expected {' or '.join(t.__name__ for t in names)}); it was not written by "
                f"attnconv train"
            )
    bad = [
        k
        for k, v in checkpoint["model"].items()
        if not (isinstance(k, str) and isinstance(v, torch.Tensor))
    ]
    bad += [k for k in checkpoint["model_config"] if not isinstance(k, str)]
    if bad:
        raise CheckpointError(
            f"checkpoint {path} has a malformed model entry {_printable(repr(bad[0]), 60)} (model "
            f"weights must map names to tensors, model_config names to values)"
        )


def load_checkpoint(
    path: str | Path, map_location: str | torch.device = "cpu", mmap: bool = False
) -> dict[str, Any]:
    """Read a checkpoint with ``torch.load(weights_only=True)`` and check its format and types.

    ``mmap=True`` maps the tensors from the file instead of reading them all (for reading a few
    parameters out of many checkpoints).

    FileNotFoundError if ``path`` is missing; CheckpointError (a ValueError) naming the file if it
    is truncated, corrupted, unsafe (pickled objects), or not an attnconv checkpoint.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    try:
        checkpoint = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except PermissionError:
        raise
    except Exception as err:  # truncated zip (an OSError too), bad pickle, unsafe global
        raise _load_failure(path, err) from err
    if not isinstance(checkpoint, dict) or checkpoint.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not an attnconv checkpoint (no format={FORMAT!r} entry)")
    if checkpoint.get("version") != VERSION:
        raise CheckpointError(
            f"checkpoint {path} has format version {_printable(repr(checkpoint.get('version')), 40)}"
            f"; this attnconv reads version {VERSION}"
        )
    missing = [key for key in REQUIRED_KEYS if key not in checkpoint]
    if missing:
        raise CheckpointError(f"checkpoint {path} lacks {', '.join(missing)}")
    check_fields(checkpoint, path)
    return checkpoint


def build_model(checkpoint: dict[str, Any], source: str | Path = "the checkpoint") -> nn.Module:
    """The checkpoint's model (train mode, CPU) with its weights loaded.

    CheckpointError naming ``source`` (the file) if its model config does not build a model or
    its weights do not fit that model.
    """
    from attnconv.models import create_model

    try:
        model = create_model(checkpoint["preset"], **checkpoint["model_config"])
    except (TypeError, ValueError) as err:
        raise CheckpointError(
            f"{source}: its model_config does not build a {_printable(checkpoint['preset'], 40)!r}"
            f" model ({_printable(str(err))}); the file was not written by this attnconv"
        ) from err
    try:
        model.load_state_dict(checkpoint["model"])
    except RuntimeError as err:
        detail = str(err).strip().splitlines()[1:] or [str(err)]  # line 0: "Error(s) in ..."
        raise CheckpointError(
            f"{source}: its weights do not fit the model its config describes "
            f"({_printable(detail[0])}); the file is damaged or was edited"
        ) from err
    return model


def load_model(
    path: str | Path, map_location: str | torch.device = "cpu"
) -> tuple[nn.Module, dict[str, Any]]:
    """``(model in eval mode on map_location, checkpoint dict)`` from checkpoint ``path``.

    The model is rebuilt with ``create_model(checkpoint["preset"], **checkpoint["model_config"])``
    (pruned models carry their heads per layer there) and its weights loaded.
    """
    checkpoint = load_checkpoint(path, map_location)
    return build_model(checkpoint, path).to(map_location).eval(), checkpoint


def rng_state() -> dict[str, Any]:
    """The global torch RNG states (CPU, and every CUDA device when CUDA is initialised)."""
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "cuda": []}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore states saved by ``rng_state``."""
    torch.set_rng_state(state["torch"].cpu())
    if state["cuda"]:
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])

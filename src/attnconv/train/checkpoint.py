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

import os
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

FORMAT = "attnconv-checkpoint"
VERSION = 1
REQUIRED_KEYS = ("preset", "dataset", "model_config", "model")


def save_checkpoint(checkpoint: dict[str, Any], path: str | Path) -> None:
    """Write ``checkpoint`` to ``path`` atomically (temporary file, fsync, rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"format": FORMAT, "version": VERSION, **checkpoint}
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_directory(path.parent)


def _fsync_directory(folder: Path) -> None:
    """Make the rename durable (POSIX); a no-op where folders cannot be opened."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def load_checkpoint(
    path: str | Path, map_location: str | torch.device = "cpu", mmap: bool = False
) -> dict[str, Any]:
    """Read a checkpoint with ``torch.load(weights_only=True)`` and check its format.

    ``mmap=True`` maps the tensors from the file instead of reading them all (for reading a few
    parameters out of many checkpoints).

    FileNotFoundError if ``path`` is missing; ValueError naming the file if it is truncated,
    corrupted, or not an attnconv checkpoint.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    try:
        checkpoint = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except Exception as err:  # truncated zip, bad pickle, unsafe global: all "unreadable"
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(
            f"checkpoint {path} is corrupted or truncated and cannot be read ({reason})"
        ) from err
    if not isinstance(checkpoint, dict) or checkpoint.get("format") != FORMAT:
        raise ValueError(f"{path} is not an attnconv checkpoint (no format={FORMAT!r} entry)")
    if checkpoint.get("version") != VERSION:
        raise ValueError(
            f"checkpoint {path} has format version {checkpoint.get('version')!r}; this attnconv "
            f"reads version {VERSION}"
        )
    missing = [key for key in REQUIRED_KEYS if key not in checkpoint]
    if missing:
        raise ValueError(f"checkpoint {path} lacks {', '.join(missing)}")
    return checkpoint


def build_model(checkpoint: dict[str, Any]) -> nn.Module:
    """The checkpoint's model (train mode, CPU) with its weights loaded."""
    from attnconv.models import create_model

    model = create_model(checkpoint["preset"], **checkpoint["model_config"])
    model.load_state_dict(checkpoint["model"])
    return model


def load_model(
    path: str | Path, map_location: str | torch.device = "cpu"
) -> tuple[nn.Module, dict[str, Any]]:
    """``(model in eval mode on map_location, checkpoint dict)`` from checkpoint ``path``.

    The model is rebuilt with ``create_model(checkpoint["preset"], **checkpoint["model_config"])``
    (pruned models carry their heads per layer there) and its weights loaded.
    """
    checkpoint = load_checkpoint(path, map_location)
    return build_model(checkpoint).to(map_location).eval(), checkpoint


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

"""The training state a checkpoint carries besides the model and optimizer: the RNG states.

Saving, loading and rebuilding checkpoints live in ``attnconv.models.checkpoint`` (also reachable
as ``attnconv.train.load_model`` and friends); ``attnconv.train.checkpoint.load_model``, the name
the README gave before, still works for one release and warns.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from attnconv.errors import warn_deprecated

_MOVED = ("load_model",)


def rng_state() -> dict[str, Any]:
    """The global torch RNG states (CPU, and every CUDA device when CUDA is initialised)."""
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "cuda": []}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore states saved by ``rng_state``.

    A run moved between machines (trained on a GPU, resumed on a CPU, or on fewer GPUs) gets the
    CPU state and the states of the CUDA devices it has, with a warning naming what was left
    out; the training data's order and augmentation do not depend on these states (they are
    drawn from ``(seed, epoch, batch)``), only dropout does.
    """
    torch.set_rng_state(state["torch"].cpu())
    saved = [s.cpu() for s in state["cuda"]]
    here = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for device, device_state in enumerate(saved[:here]):
        torch.cuda.set_rng_state(device_state, device)
    if len(saved) > here:
        warnings.warn(
            f"the checkpoint holds the RNG states of {len(saved)} CUDA device(s) and this "
            f"machine has {here}: the states of devices {here}..{len(saved) - 1} are not "
            "restored (dropout masks differ from an uninterrupted run; the data order does not)",
            stacklevel=2,
        )


def __getattr__(name: str) -> Any:
    if name not in _MOVED:
        raise AttributeError(f"module 'attnconv.train.checkpoint' has no attribute {name!r}")
    warn_deprecated(
        f"attnconv.train.checkpoint.{name}",
        f"attnconv.train.checkpoint.{name} moved to attnconv.models.checkpoint.{name} "
        f"(also attnconv.train.{name}); the old name goes in the next release",
    )
    from attnconv.models import checkpoint

    return getattr(checkpoint, name)

"""A training run's checkpoints: the state they carry besides the model and optimizer (the RNG
states of every rank), the check that the state is sound before it is saved, and writing them into
the run folder.

Before anything is saved, the state is checked (``unsound_state``): every parameter and buffer
finite, and the loss those weights give finite (the validation loss at an epoch's end, the last
batch's loss in eval mode inside one); a diverged state stops the run with
``NonFiniteLossError`` and is never written.

The main rank writes through a ``RunWriter``: each write first checks that the folder is still this
run's (its lock), and a failed write (disk full, read-only) is one RunFolderError naming the last
good checkpoint and how to go on. At an epoch's end ``last.pt`` is written first and ``best.pt`` and
``epoch_NNNN.pt`` copy it (``epoch_copies``); a resume rewrites the copies a kill left missing or
stale (``repair_copies``). Beside them the run keeps the attention routes its layers measured
(``kept_routes``), taken again on resume.

Saving, loading and rebuilding checkpoints live in ``attnconv.models.checkpoint`` (also reachable
as ``attnconv.train.load_model`` and friends); ``attnconv.train.checkpoint.load_model``, the name
the README gave before, still works for one release and warns.
"""

from __future__ import annotations

import itertools
import math
import warnings
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from attnconv.attention import routes
from attnconv.errors import warn_deprecated
from attnconv.models import checkpoint as stored  # the module: its names are not this one's
from attnconv.models.modes import evaluating
from attnconv.runs import (
    RunDir,
    RunFolderError,
    RunLock,
    is_full,
    not_writable_hint,
    os_error_reason,
)
from attnconv.train import distributed
from attnconv.train.evaluation import autocast, best_record
from attnconv.train.logger import note

_MOVED = ("load_model",)
ROUTES_FILE = "routes.json"
"""The run folder's file of the attention routes its layers measured (``attention/routes.py``)."""


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


def gathered_rng_states(context: distributed.Context) -> list[dict[str, Any]]:
    """Every rank's ``rng_state()``, by rank (one process: its own, alone)."""
    state = rng_state()
    if not context.distributed:
        return [state]
    states: list[Any] = [None] * context.world_size
    dist.all_gather_object(states, state)
    return states


def kept_routes(run: RunDir, is_main: bool) -> AbstractContextManager:
    """Keeps the attention routes the run's layers measure in its ``ROUTES_FILE`` and takes those
    kept before again (a resumed run computes on the same routes: bit-identical weights on the
    same machine); on the main rank (``is_main``), nothing on the others."""
    return routes.cache_file(run.root / ROUTES_FILE) if is_main else nullcontext()


def saved_position(path: Path) -> tuple[int, int] | None:
    """``(epoch, step)`` of the checkpoint at ``path``; None if it is missing or unreadable."""
    try:
        checkpoint = stored.load_checkpoint(path, mmap=True)
        return int(checkpoint["epoch"]), int(checkpoint["step"])
    except (FileNotFoundError, stored.CheckpointError, KeyError):
        return None


@torch.no_grad()
def unsound_state(
    model: nn.Module,
    batch: tuple[torch.Tensor, torch.Tensor] | None,
    precision: str,
    device: torch.device,
) -> str | None:
    """What makes ``model``'s state, about to be saved, unsound, or None: a floating-point
    parameter or buffer that is not finite, or, given a ``batch`` (images ``(B, C, H, W)``,
    labels ``(B,)``), the loss of the current weights on it not finite on some rank (eval mode: no
    dropout, no RNG draws, no batch-norm updates; in the run's resolved ``precision``). Every rank
    calls it."""
    for name, tensor in itertools.chain(model.named_parameters(), model.named_buffers()):
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            return f"parameter {name} is no longer finite"
    if batch is None:
        return None
    images, labels = batch
    with evaluating(model), autocast(precision, device):
        logits = model(images)
    loss_sum = F.cross_entropy(logits.float(), labels, reduction="sum").item()
    total, seen = distributed.all_reduce_sum([loss_sum, float(labels.shape[0])], device)
    if not math.isfinite(total):
        return f"the updated weights give a loss of {total / seen} on their last batch"
    return None


class RunWriter:
    """The main rank's writes into its run folder.

    Args:
        run: the run folder.
        lock: its lock, held by this process (``attnconv.runs.locked_run``); None: not checked.
    """

    def __init__(self, run: RunDir, lock: RunLock | None) -> None:
        self.run, self.lock = run, lock
        self.saved_step: int | None = None  # the step of the newest last.pt on disk

    def kept(self) -> str:
        """Which checkpoint holds the last good state, for error messages."""
        if self.saved_step is None:
            return "no checkpoint was saved yet"
        return f"the last good checkpoint is {self.run.last} (step {self.saved_step})"

    def check_lock(self) -> None:
        """RunFolderError if the run folder was deleted or replaced (see RunLock)."""
        if self.lock is not None:
            self.lock.check()

    @contextmanager
    def writing(self, path: Path) -> Iterator[None]:
        """Check the run folder is still this run's, then turn an OSError while writing ``path``
        into a one-line RunFolderError saying how to go on."""
        self.check_lock()
        try:
            yield
        except OSError as err:
            todo = "free space" if is_full(err) else not_writable_hint(self.run.root)
            if self.saved_step is None:
                then = "start the run again with the same command (there is nothing to resume)"
                kept = self.kept()
            else:
                then = f"continue with: attnconv train --resume {self.run.root}"
                kept = f"{self.kept()}, intact"
            raise RunFolderError(
                f"cannot write {path}: {os_error_reason(err)}; {kept}. "
                f"{todo[0].upper()}{todo[1:]}, then {then}"
            ) from err


def epoch_copies(
    run: RunDir, epoch: int, records: list[dict[str, Any]], checkpoint_every: int
) -> list[Path]:
    """The files that, besides ``last.pt``, hold the state at the end of ``epoch`` (1-based):
    ``best.pt`` if ``records`` (the epoch records so far) name it the best, and ``epoch_NNNN.pt``
    every ``checkpoint_every`` epochs (0: never)."""
    paths = []
    best = best_record(records)
    if best is not None and best["epoch"] == epoch:
        paths.append(run.best)
    if checkpoint_every and epoch % checkpoint_every == 0:
        paths.append(run.epoch_checkpoint(epoch))
    return paths


def repair_copies(
    resumed: dict[str, Any], run: RunDir, checkpoint_every: int, writer: RunWriter
) -> None:
    """Write the copies (``epoch_copies``) of ``resumed``, the run's ``last.pt``, that a kill left
    missing or stale, saying so on stderr; nothing for a mid-epoch ``last.pt``."""
    if resumed.get("epoch_progress") is not None or not resumed["metrics"]:
        return
    position = (int(resumed["epoch"]), int(resumed["step"]))
    for path in epoch_copies(run, position[0], resumed["metrics"], checkpoint_every):
        if saved_position(path) != position:
            with writer.writing(path):
                stored.save_checkpoint(resumed, path)
            note(
                f"{path} was missing or older than last.pt (the previous run was "
                f"stopped while saving): rewritten from last.pt"
            )


def __getattr__(name: str) -> Any:
    if name not in _MOVED:
        raise AttributeError(f"module 'attnconv.train.checkpoint' has no attribute {name!r}")
    warn_deprecated(
        f"attnconv.train.checkpoint.{name}",
        f"attnconv.train.checkpoint.{name} moved to attnconv.models.checkpoint.{name} "
        f"(also attnconv.train.{name}); the old name goes in the next release",
    )
    return getattr(stored, name)

"""Process-group set-up for ``torchrun`` launches, and the device each process trains on.

``torchrun --nproc_per_node N -m attnconv train ...`` starts N processes with ``RANK``,
``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` in their environment; each
joins the process group and trains under DistributedDataParallel, N = 1 included (a one-GPU
``torchrun`` is a DDP job of one rank, as in nanoGPT: the way to smoke-test NCCL on one GPU). A
plain ``attnconv train`` has none of them and runs as the single rank 0 of 1, without a group.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist

from attnconv.errors import UserError


@dataclass(frozen=True)
class Context:
    """Where this process sits: ``rank`` of ``world_size`` processes, on ``device``."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    launched: bool = False
    """True when ``torchrun`` started this process (``RANK`` in the environment)."""

    @property
    def is_main(self) -> bool:
        """True on rank 0, the process that logs and writes files."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        """True in a process group (every ``torchrun`` launch): the model trains under DDP."""
        return self.launched or self.world_size > 1


def select_device(name: str, local_rank: int = 0) -> torch.device:
    """``"auto"``: the ``local_rank``-th CUDA device if CUDA is available, else the CPU.

    ``"cpu"``, ``"cuda"`` (the ``local_rank``-th GPU) and ``"cuda:N"`` are taken as given;
    ValueError if CUDA is asked for and not available.
    """
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise UserError(f"device {name!r} asked for, but CUDA is not available here")
        return torch.device(name if ":" in name else f"cuda:{local_rank}")
    if name != "cpu":
        raise UserError(f"device must be auto, cpu, cuda or cuda:N, got {name!r}")
    return torch.device("cpu")


def setup(device: str = "auto") -> Context:
    """Join the process group described by the environment (if any) and pick the device.

    Backend: NCCL when the device is a GPU, gloo on the CPU. Every rank of a job must ask for the
    same kind of device.
    """
    launched = "RANK" in os.environ
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    chosen = select_device(device, local_rank)
    if (launched or world_size > 1) and not dist.is_initialized():
        if chosen.type == "cuda":
            torch.cuda.set_device(chosen)
        dist.init_process_group(backend="nccl" if chosen.type == "cuda" else "gloo")
    return Context(rank=rank, world_size=world_size, local_rank=local_rank, device=chosen,
                   launched=launched)


def teardown() -> None:
    """Leave the process group, if one was joined."""
    if dist.is_initialized():
        dist.destroy_process_group()


def all_reduce_sum(values: list[float], device: torch.device) -> list[float]:
    """Sum ``values`` over all ranks (identity when not distributed), in float64."""
    if not dist.is_initialized():
        return list(values)
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(tensor)
    return tensor.tolist()


def barrier() -> None:
    """Wait for every rank (no-op when not distributed)."""
    if dist.is_initialized():
        dist.barrier()


@contextmanager
def local_rank_zero_first(context: Context) -> Iterator[None]:
    """Run the body on each machine's local rank 0 first, then on its other ranks (e.g. a
    download, made once per machine and read by the others)."""
    if context.local_rank != 0:
        barrier()
    yield
    if context.local_rank == 0:
        barrier()

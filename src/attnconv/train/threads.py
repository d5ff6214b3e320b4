"""How many threads a training run computes with on the CPU, and why.

PyTorch starts one intra-op thread per core. Where other work keeps the cores busy, those threads
wait for each other and spin: on a 2-core machine running another training job,
``attnconv train --preset quick --epochs 1`` took 37.9 s of CPU time with torch's 2 threads
against 9.2 s with one (``OMP_NUM_THREADS=1``), 4× the CPU for the same epoch. So a run takes as
many threads as the cores others leave idle, read from the load average, unless told
(``--threads``, ``OMP_NUM_THREADS``).

The thread count changes how some sums are split, so a run resumed with another count continues
within float rounding of the uninterrupted one, not bit for bit: give ``--threads`` to repeat a
run exactly.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from attnconv.errors import UserError


def choose_threads(
    asked: int | None, *, available: int, cpus: int, load: float | None, env: str | None
) -> tuple[int, str]:
    """``(threads, why)``: the threads a run computes with and, for its start line, why.

    Args:
        asked: the count asked for (``--threads``); it wins. UserError below 1.
        available: torch's count now (one per core by default, ``OMP_NUM_THREADS``, or what the
            caller set with ``torch.set_num_threads``): never exceeded unless asked.
        cpus: the cores this process may run on.
        load: the load average over the last minute (runnable processes), None where unknown.
        env: ``OMP_NUM_THREADS`` if set (then ``available`` is kept: the user chose it).

    Without ``asked`` or ``env``, the count is the cores left idle, ``cpus - load`` rounded to
    the nearest (at least 1, at most ``available``).
    """
    if asked is not None:
        if isinstance(asked, bool) or not isinstance(asked, int) or asked < 1:
            raise UserError(f"threads must be an int >= 1, got {asked!r}")
        return asked, f"{_threads(asked)} as asked"
    if env is not None:
        return available, f"{_threads(available)} (OMP_NUM_THREADS={env})"
    if load is None:
        return available, f"{_threads(available)} (load unknown)"
    idle = max(1, math.floor(cpus - load + 0.5))
    threads = min(available, idle)
    why = f"{_threads(threads)} ({cpus} cores, load {load:.1f}"
    if threads < available:
        return threads, f"{why}: fewer than torch's {available}, set with --threads N)"
    return threads, f"{why})"


def _threads(count: int) -> str:
    return f"{count} thread" + ("" if count == 1 else "s")


@functools.cache
def load_at_start() -> float | None:
    """The 1-minute load average when this process first asks, or None where the system has
    none. Read once: later this process's own training counts in it."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def usable_cpus() -> int:
    """The cores this process may run on (its CPU affinity where the system has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def training_threads(asked: int | None = None) -> tuple[int, str]:
    """``choose_threads`` for this process on this machine."""
    return choose_threads(
        asked,
        available=torch.get_num_threads(),
        cpus=usable_cpus(),
        load=load_at_start(),
        env=os.environ.get("OMP_NUM_THREADS"),
    )


@contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """torch computes with ``count`` threads inside the block, with the count it had after."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)

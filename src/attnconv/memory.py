"""Keeping freed CPU memory for reuse: glibc's allocator settings for training on a CPU.

PyTorch's CPU allocator is the C library's ``malloc``. glibc serves every request above its mmap
threshold (at most 32 MiB on 64-bit Linux) with a fresh ``mmap`` and gives it back to the kernel
on ``free``, so each new activation or gradient of that size is faulted in page by page and
zero-filled by the kernel before PyTorch writes it. A training step allocates and frees dozens of
such tensors (the paper's ``quadratic`` model at batch 100: 41 MB per hidden state, 164 MB per
feed-forward activation), and at those sizes the faults cost more than the element-wise
operations that use the memory: measured on a 2-core AMD EPYC, LayerNorm, GELU and the
element-wise products ran 2–8× slower at batch 100 than at batch 50 per image, and the whole
float32 step took 15.7 s instead of 13.6 s (``python benchmarks/train.py`` prints both).

[`reuse_freed_memory`][] switches glibc to serving large requests from its heap and keeping
freed memory there (``M_MMAP_MAX = 0``, a trim threshold of 2 GiB), so the next step reuses
pages that are already mapped. The process then keeps its peak memory until it exits, which is
what a training process does anyway. It changes the allocator of the whole process, so it is
called by ``attnconv train`` and the benchmarks on CPU devices, never on import. Elsewhere (macOS,
musl, Windows) it does nothing.
"""

from __future__ import annotations

import ctypes
import functools

# mallopt parameters, from glibc's <malloc.h>
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
KEEP_FREED_BYTES = 2**31 - 1
"""Free memory at the top of the heap that glibc keeps instead of returning it to the kernel (the
largest value ``mallopt`` takes, 2 GiB)."""


@functools.cache
def _mallopt() -> ctypes._CFuncPtr | None:
    """glibc's ``mallopt`` from the running process, or None where the C library is not glibc."""
    try:
        libc = ctypes.CDLL(None)  # the symbols already loaded: the process's own C library
        libc.gnu_get_libc_version  # only glibc has it  # noqa: B018
        mallopt = libc.mallopt
    except (OSError, TypeError, AttributeError):  # TypeError: Windows takes no None here
        return None
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return mallopt


def reuse_freed_memory() -> bool:
    """Serve large allocations from glibc's heap and keep freed memory for reuse (see the module
    docstring). Returns True if glibc took the settings, False where there is no glibc."""
    mallopt = _mallopt()
    if mallopt is None:
        return False
    return mallopt(_M_MMAP_MAX, 0) == 1 and mallopt(_M_TRIM_THRESHOLD, KEEP_FREED_BYTES) == 1

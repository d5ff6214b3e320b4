"""What the machine can do fast: native bfloat16, the CPU's vector units and caches, a one-line
description.

``resolve_precision("auto", device)`` turns the ``precision`` setting of ``attnconv train``,
``attnconv eval``, the demo and the benchmarks into the one that runs:

- ``"bf16"`` (bfloat16 autocast) where the device computes in bfloat16 natively: a CUDA device
  whose ``torch.cuda.is_bf16_supported(including_emulation=False)`` is true (Ampere and later),
  or a CPU with AMX-BF16 (Intel Sapphire Rapids and later) or AVX512-BF16 (Intel Cooper Lake,
  AMD Zen 4 and later). On an Intel Xeon with AMX (one thread, batch 100, CPU time, each
  precision on the attention routes measured for it, ``attention/routes.py``) a bfloat16
  training step was 2.66× as fast as a float32 one for ``quadratic``, 2.30× for ``learned``
  and 1.51–1.53× for ``quadratic-fashion`` and ``learned-fashion``; on the routes the rules
  chose before (the separable factors, whose small products the matrix unit does not run) the
  Fashion presets gained 1.23–1.26×;
- ``"fp32"`` everywhere else. Without those instructions bfloat16 is converted to float32 and back
  around every operation: on an AVX2 CPU (AMD Zen 3) bfloat16 training measured 17× (``quadratic``)
  and 26× (``resnet18``) slower than float32.

An explicit ``"bf16"`` on hardware without it still runs, after one warning line on stderr.
``cpu_features()`` is the single hardware query (tests replace it).
"""

from __future__ import annotations

import functools
import platform
import sys
from collections.abc import Callable
from pathlib import Path

import torch

PRECISIONS: tuple[str, ...] = ("auto", "fp32", "bf16")
# The CPU features a benchmark line names, as (key of cpu_features(), printed name).
FEATURE_NAMES: tuple[tuple[str, str], ...] = (
    ("avx2", "AVX2"),
    ("avx512_f", "AVX-512"),
    ("avx512_bf16", "AVX512-BF16"),
    ("amx_bf16", "AMX-BF16"),
)


def cpu_features() -> dict[str, bool]:
    """``{"avx2", "avx512_f", "avx512_bf16", "amx_bf16": bool}`` of this process's CPU.

    Read through PyTorch's cpuinfo (``torch.cpu.get_capabilities``, torch >= 2.8; older versions
    have one private query per feature). Features PyTorch cannot report count as absent.
    """
    names = [key for key, _ in FEATURE_NAMES]
    get_capabilities = getattr(torch.cpu, "get_capabilities", None)
    if get_capabilities is not None:
        capabilities = get_capabilities()
        return {key: bool(capabilities.get(key, False)) for key in names}
    queries = {
        "avx2": "_is_avx2_supported",
        "avx512_f": "_is_avx512_supported",
        "avx512_bf16": "_is_avx512_bf16_supported",
        "amx_bf16": "_is_amx_tile_supported",
    }
    return {key: bool(getattr(torch.cpu, queries[key], lambda: False)()) for key in names}


def native_bf16(device: torch.device) -> tuple[bool, str]:
    """``(True, why)`` if ``device`` computes in bfloat16 natively, else ``(False, why not)``."""
    if device.type == "cuda":
        if torch.cuda.is_bf16_supported(including_emulation=False):
            return True, f"{torch.cuda.get_device_name(device)} computes in bfloat16"
        return False, f"{torch.cuda.get_device_name(device)} has no native bfloat16 (pre-Ampere)"
    if device.type == "cpu":
        features = cpu_features()
        found = [
            name
            for key, name in FEATURE_NAMES
            if key in ("avx512_bf16", "amx_bf16") and features[key]
        ]
        if found:
            return True, f"the CPU has {' and '.join(found)}"
        return False, "the CPU has neither AMX-BF16 nor AVX512-BF16"
    return False, f"no bfloat16 support known for device type {device.type!r}"


def compute_dtype(dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The dtype to run matrix products of ``dtype`` tensors in on ``device``.

    ``dtype`` itself, except where the device would emulate it: bfloat16 without
    ``native_bf16(device)`` and float16 on a CPU compute in float32 (on an AVX2 CPU, AMD Zen 3,
    the content attention's batched bfloat16 products measured 5–14× slower than float32 ones on
    one thread, and float32 is also the more accurate).
    """
    if dtype == torch.bfloat16 and not native_bf16(device)[0]:
        return torch.float32
    if dtype == torch.float16 and device.type == "cpu":
        return torch.float32
    return dtype


def resolve_precision(
    requested: str, device: torch.device, warn: Callable[[str], None] | None = None
) -> str:
    """The precision that runs, ``"fp32"`` or ``"bf16"``, for a requested ``auto|fp32|bf16``.

    ``auto`` picks ``bf16`` where ``native_bf16(device)`` holds, else ``fp32``. An explicit
    ``bf16`` without native support is kept, and ``warn`` (default: print to stderr) gets one line
    saying it will be slow and why. ValueError for any other value.
    """
    if requested not in PRECISIONS:
        raise ValueError(f"unknown precision {requested!r}; valid: {', '.join(PRECISIONS)}")
    if requested == "fp32":
        return "fp32"
    native, why = native_bf16(device)
    if requested == "auto":
        return "bf16" if native else "fp32"
    if not native:
        (warn or _print_stderr)(
            f"warning: precision bf16 on {device.type} will be slow: {why}, so every bfloat16 "
            f"operation is emulated through float32 (precision auto or fp32 runs at full speed)"
        )
    return "bf16"


def _print_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def cpu_model() -> str:
    """The CPU's marketing name (``/proc/cpuinfo``'s model name on Linux)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


CACHE_FOLDER = Path("/sys/devices/system/cpu/cpu0/cache")
"""Where Linux describes the caches of the first core (``index*/level``, ``type``, ``size``)."""


@functools.cache
def cache_bytes(level: int) -> int | None:
    """Bytes of the level-``level`` data (or unified) cache of one core, as Linux reports it
    (``CACHE_FOLDER``); ``None`` where it does not (another system, a container hiding it)."""
    for index in sorted(CACHE_FOLDER.glob("index*")):
        try:
            if int((index / "level").read_text()) != level:
                continue
            if (index / "type").read_text().strip() == "Instruction":
                continue
            size = (index / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        units = {"K": 2**10, "M": 2**20, "G": 2**30}
        if size[-1:] in units and size[:-1].isdigit():
            return int(size[:-1]) * units[size[-1]]
        if size.isdigit():
            return int(size)
    return None


def machine_key() -> str:
    """What a measured choice holds for (``attention/routes.py``'s cache file): the CPU model, its
    features and L2 cache, and the torch build. A GPU is named in each choice's own key."""
    features = cpu_features()
    flags = ", ".join(name for key, name in FEATURE_NAMES if features[key])
    l2 = cache_bytes(2)
    cache = "" if l2 is None else f", L2 {l2 // 2**10} KiB"
    return f"{cpu_model()} ({flags or 'no AVX2'}{cache}), torch {torch.__version__}"


def machine_description(device: torch.device | str) -> str:
    """One line naming what a benchmark ran on: CPU model and features, threads, torch, device.

    E.g. ``CPU AMD EPYC (AVX2 yes, AVX-512 yes, AVX512-BF16 yes, AMX-BF16 no), 2 threads,
    torch 2.13.0+cpu, device cpu, auto precision bf16``.
    """
    device = torch.device(device)
    features = cpu_features()
    flags = ", ".join(f"{name} {'yes' if features[key] else 'no'}" for key, name in FEATURE_NAMES)
    line = (
        f"CPU {cpu_model()} ({flags}), {torch.get_num_threads()} threads, "
        f"torch {torch.__version__}, device {device}"
    )
    if device.type == "cuda":
        line += f" ({torch.cuda.get_device_name(device)})"
    return line + f", auto precision {resolve_precision('auto', device)}"

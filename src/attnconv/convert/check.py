"""Numerical checks of the construction: the configuration battery and the spread sweep.

Errors are max-norm relative errors, ``max |attention − conv| / max |conv|``, on random weights and
inputs; the backward error is the largest such error over the gradients with respect to the input,
the kernel and the bias, for a random upstream gradient.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from attnconv.convert.theorem import conv_to_attention
from attnconv.errors import UserError

TOLERANCE: dict[torch.dtype, float] = {torch.float64: 1e-12, torch.float32: 1e-5}

# (conv class, constructor arguments, finite spread or None for hard attention)
BATTERY: tuple[tuple[type[nn.Module], dict[str, Any], float | None], ...] = (
    (nn.Conv2d, {"kernel_size": 3, "padding": 1}, None),
    (nn.Conv2d, {"kernel_size": 1, "bias": False}, None),
    (nn.Conv2d, {"kernel_size": 2, "padding": "valid"}, None),
    (nn.Conv2d, {"kernel_size": 4, "padding": "same"}, None),
    (nn.Conv2d, {"kernel_size": (2, 5), "stride": (2, 1), "padding": (1, 2)}, None),
    (nn.Conv2d, {"kernel_size": 5, "stride": 2, "padding": 2}, None),
    (nn.Conv2d, {"kernel_size": 7, "stride": 2, "padding": 3, "bias": False}, None),
    (nn.Conv2d, {"kernel_size": 3, "dilation": 2, "padding": 2}, None),
    (nn.Conv2d, {"kernel_size": (4, 3), "dilation": (2, 3), "padding": "same"}, None),
    (nn.Conv2d, {"kernel_size": 3, "stride": 3, "dilation": 2, "padding": 4}, None),
    (nn.Conv2d, {"kernel_size": 3, "padding": 1, "padding_mode": "circular"}, None),
    (nn.Conv2d, {"kernel_size": 4, "padding": "same", "padding_mode": "circular"}, None),
    (nn.Conv2d, {"kernel_size": 3, "stride": 2, "padding": 1, "groups": 2}, None),
    (nn.Conv2d, {"kernel_size": 3, "padding": 1, "groups": "depthwise", "bias": False}, None),
    (nn.Conv2d, {"kernel_size": 5, "padding": 2, "groups": "depthwise", "out": 8}, None),
    (nn.Conv2d, {"kernel_size": 3, "padding": 1}, 30.0),
    (nn.Conv2d, {"kernel_size": 3, "stride": 2, "padding": 1, "groups": 2}, 30.0),
    (nn.Conv1d, {"kernel_size": 3, "padding": 1}, None),
    (nn.Conv1d, {"kernel_size": 4, "padding": "same", "dilation": 2}, None),
    (nn.Conv1d, {"kernel_size": 5, "stride": 2, "groups": 2, "bias": False}, None),
    (nn.Conv1d, {"kernel_size": 3, "padding": 2, "padding_mode": "circular"}, None),
)
IN_CHANNELS, OUT_CHANNELS = 4, 6


@dataclass(frozen=True)
class CheckResult:
    """One row of the battery: a configuration, its errors and whether they are in tolerance."""

    conv: str
    kernel_size: tuple[int, ...]
    stride: tuple[int, ...]
    dilation: tuple[int, ...]
    padding: str
    groups: int
    heads: int
    spread: float | None
    dtype: torch.dtype
    max_abs_error: float  # forward, in output units
    rel_error: float  # forward
    grad_rel_error: float  # largest over input, kernel and bias gradients
    passed: bool


def build_conv(
    conv_cls: type[nn.Module], spec: dict[str, Any], dtype: torch.dtype, seed: int
) -> nn.Module:
    """A battery convolution with seeded random weights (``groups="depthwise"``: one per input)."""
    spec = dict(spec)
    out_channels = spec.pop(
        "out", OUT_CHANNELS if spec.get("groups") != "depthwise" else IN_CHANNELS
    )
    if spec.get("groups") == "depthwise":
        spec["groups"] = IN_CHANNELS
    torch.manual_seed(seed)
    return conv_cls(IN_CHANNELS, out_channels, **spec).to(dtype)


def relative_error(value: Tensor, reference: Tensor) -> float:
    """``max |value − reference| / max |reference|`` (0 when both are zero)."""
    scale = reference.abs().max().item()
    diff = (value - reference).abs().max().item()
    return diff / scale if scale > 0 else diff


def compare(
    conv: nn.Module, spread: float | None, x: Tensor, seed: int
) -> tuple[float, float, float]:
    """Forward max abs and relative error, and the backward relative error, of the construction."""
    module = conv_to_attention(conv, spread)
    x_conv = x.clone().requires_grad_(True)
    x_attn = x.clone().requires_grad_(True)
    with warnings.catch_warnings():  # PyTorch's note on its own padding="same" copies
        warnings.filterwarnings("ignore", message="Using padding='same'")
        reference = conv(x_conv)
    value = module(x_attn)
    upstream = torch.randn(
        reference.shape, generator=torch.Generator().manual_seed(seed), dtype=reference.dtype
    )
    (reference * upstream).sum().backward()
    (value * upstream).sum().backward()
    pairs = [(x_attn.grad, x_conv.grad), (module.weight.grad, conv.weight.grad)]
    if conv.bias is not None:
        pairs.append((module.bias.grad, conv.bias.grad))
    max_abs = (value - reference).abs().max().item()
    return (
        max_abs,
        relative_error(value.detach(), reference.detach()),
        max(relative_error(a, b) for a, b in pairs),
    )


def run_battery(seed: int = 0) -> list[CheckResult]:
    """Every ``BATTERY`` configuration in float64 and float32, forward and backward."""
    results = []
    for index, (conv_cls, spec, spread) in enumerate(BATTERY):
        for dtype in (torch.float64, torch.float32):
            conv = build_conv(conv_cls, spec, dtype, seed + index)
            generator = torch.Generator().manual_seed(seed + index)
            shape = (2, IN_CHANNELS, 17) if conv_cls is nn.Conv1d else (2, IN_CHANNELS, 9, 10)
            x = torch.randn(shape, generator=generator, dtype=dtype)
            max_abs, rel, grad_rel = compare(conv, spread, x, seed + index)
            padding = conv.padding if isinstance(conv.padding, str) else str(tuple(conv.padding))
            if conv.padding_mode != "zeros":
                padding += f" {conv.padding_mode}"
            results.append(
                CheckResult(
                    conv=conv_cls.__name__,
                    kernel_size=tuple(conv.kernel_size),
                    stride=tuple(conv.stride),
                    dilation=tuple(conv.dilation),
                    padding=padding,
                    groups=conv.groups,
                    heads=int(torch.tensor(conv.kernel_size).prod()),
                    spread=spread,
                    dtype=dtype,
                    max_abs_error=max_abs,
                    rel_error=rel,
                    grad_rel_error=grad_rel,
                    passed=max(rel, grad_rel) <= TOLERANCE[dtype],
                )
            )
    return results


def format_battery(results: list[CheckResult]) -> str:
    """The battery as a plain-text table, one configuration and dtype per line."""
    header = (
        "conv", "kernel", "stride", "dilation", "padding", "groups", "heads", "s", "dtype",
        "max abs err", "rel err", "grad rel err", "tol", "result",
    )  # fmt: skip
    rows = [
        (
            r.conv,
            "×".join(map(str, r.kernel_size)),
            "×".join(map(str, r.stride)),
            "×".join(map(str, r.dilation)),
            r.padding,
            str(r.groups),
            str(r.heads),
            "∞" if r.spread is None else f"{r.spread:g}",
            str(r.dtype).removeprefix("torch."),
            f"{r.max_abs_error:.2e}",
            f"{r.rel_error:.2e}",
            f"{r.grad_rel_error:.2e}",
            f"{TOLERANCE[r.dtype]:.0e}",
            "pass" if r.passed else "FAIL",
        )
        for r in results
    ]
    table = [header, *rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) for row in table
    )


@dataclass(frozen=True)
class SweepResult:
    """Error of the finite-spread construction against the convolution, as ``s`` grows."""

    spreads: list[float]
    errors: list[float]  # forward relative error at each spread
    threshold: float
    smallest_spread: float | None  # smallest s (to ±1e-3) with error < threshold, None if none


def spread_sweep(
    spreads: list[float] | None = None, threshold: float = 1e-6, seed: int = 0
) -> SweepResult:
    r"""Relative error of a 3×3 convolution's finite-spread construction (float64) against ``s``.

    ``spreads`` defaults to 0.5, 1.0, …, 12. The smallest spread under ``threshold`` is found by
    bisection between the last grid spread above it and the first one below (the error decreases
    with $s$: the leaked mass falls like $\exp(-s^2/2)$).
    """
    spreads = [0.5 * i for i in range(1, 25)] if spreads is None else sorted(spreads)
    if not spreads or spreads[0] <= 0:
        raise UserError(f"spreads must be positive numbers, got {spreads}")
    if not threshold > 0:
        raise UserError(f"threshold must be positive, got {threshold}")
    conv = build_conv(nn.Conv2d, {"kernel_size": 3, "padding": 1}, torch.float64, seed)
    x = torch.randn(2, IN_CHANNELS, 12, 12, generator=torch.Generator().manual_seed(seed),
                    dtype=torch.float64)  # fmt: skip
    with torch.no_grad():
        reference = conv(x)

        def error(s: float) -> float:
            return relative_error(conv_to_attention(conv, s)(x), reference)

        errors = [error(s) for s in spreads]
        below = [i for i, e in enumerate(errors) if e < threshold]
        smallest = None
        if below:
            first = below[0]
            low, high = (0.0 if first == 0 else spreads[first - 1]), spreads[first]
            while high - low > 1e-3:
                middle = 0.5 * (low + high)
                low, high = (low, middle) if error(middle) < threshold else (middle, high)
            smallest = high
    return SweepResult(spreads, errors, threshold, smallest)


def format_sweep(result: SweepResult) -> str:
    """The sweep as a table of ``s`` and the relative error, then the smallest ``s`` in tolerance."""
    lines = ["spread s   rel err vs conv (3×3 conv, float64)"]
    lines += [f"{s:8.2f}   {e:.3e}" for s, e in zip(result.spreads, result.errors, strict=True)]
    if result.smallest_spread is None:
        lines.append(f"no spread up to {result.spreads[-1]:g} has error < {result.threshold:g}")
    else:
        lines.append(
            f"smallest s with error < {result.threshold:g}: {result.smallest_spread:.3f} (±0.001)"
        )
    return "\n".join(lines)

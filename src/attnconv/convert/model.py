"""Convert a whole network: every ``Conv1d``/``Conv2d`` becomes its attention equivalent."""

from __future__ import annotations

import copy
from dataclasses import dataclass

from torch import nn

from attnconv.convert.theorem import AttentionConv, conv_to_attention


@dataclass(frozen=True)
class Replacement:
    """One converted convolution: where it sits and what it became."""

    name: str  # qualified module name in the network
    conv: str  # "Conv1d" or "Conv2d"
    kernel_size: tuple[int, ...]
    stride: tuple[int, ...]
    dilation: tuple[int, ...]
    groups: int
    heads: int
    params_before: int  # kernel + bias of the convolution
    params_after: int  # all parameters of the attention module (kernel, bias, centres, spreads)


def convert_model(model: nn.Module, spread: float | None = None) -> nn.Module:
    """A deep copy of ``model`` with every ``nn.Conv1d``/``nn.Conv2d`` replaced by attention.

    Each convolution becomes :func:`conv_to_attention`'s module (hard attention, or the finite
    ``spread`` for all of them); everything else is copied untouched, training mode included.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"expected an nn.Module, got {type(model).__name__}")
    converted = copy.deepcopy(model)
    if isinstance(converted, (nn.Conv1d, nn.Conv2d)):
        return _converted(converted, spread)
    targets = [
        (name, module)
        for name, module in converted.named_modules()
        if isinstance(module, (nn.Conv1d, nn.Conv2d))
    ]
    for name, conv in targets:
        parent_name, _, child = name.rpartition(".")
        setattr(converted.get_submodule(parent_name), child, _converted(conv, spread))
    return converted


def conversion_summary(model: nn.Module) -> list[Replacement]:
    """What :func:`convert_model` replaced in ``model`` (a converted network), in module order."""
    rows = []
    for name, module in model.named_modules():
        if isinstance(module, AttentionConv):
            before = module.weight.numel() + (0 if module.bias is None else module.bias.numel())
            rows.append(
                Replacement(
                    name=name or "(model)",
                    conv="Conv1d" if module.one_d else "Conv2d",
                    kernel_size=tuple(module.kernel_size),
                    stride=tuple(module.stride),
                    dilation=tuple(module.dilation),
                    groups=module.groups,
                    heads=module.heads,
                    params_before=before,
                    params_after=sum(p.numel() for p in module.parameters()),
                )
            )
    return rows


def format_summary(rows: list[Replacement]) -> str:
    """A plain-text table of :func:`conversion_summary` with a total line."""
    header = (
        "layer",
        "conv",
        "kernel",
        "stride",
        "dilation",
        "groups",
        "heads",
        "params",
        "→ attn",
    )
    lines = [
        (
            r.name,
            r.conv,
            "×".join(map(str, r.kernel_size)),
            "×".join(map(str, r.stride)),
            "×".join(map(str, r.dilation)),
            str(r.groups),
            str(r.heads),
            f"{r.params_before:,}",
            f"{r.params_after:,}",
        )
        for r in rows
    ]
    total = (
        f"total ({len(rows)} layers)",
        "",
        "",
        "",
        "",
        "",
        str(sum(r.heads for r in rows)),
        f"{sum(r.params_before for r in rows):,}",
        f"{sum(r.params_after for r in rows):,}",
    )
    table = [header, *lines, total]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    return "\n".join(
        "  ".join(
            cell.ljust(w) if i == 0 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in table
    )


def _converted(conv: nn.Conv1d | nn.Conv2d, spread: float | None) -> AttentionConv:
    module = conv_to_attention(conv, spread)
    module.train(conv.training)
    return module

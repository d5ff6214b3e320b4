"""Geometry of Gaussian attention heads, and pruning of degenerate ones.

A head is *degenerate* (the ``quadratic-generalized-pruned`` experiment) when its Gaussian has
collapsed: its spread (geometric-mean inverse standard deviation, in 1/tokens) is below
``min_spread`` (the head averages the whole image almost uniformly), or its covariance
condition number exceeds ``max_condition`` (the head has degenerated into a line).

A transformed network's heads (``TransformedNetwork``, T-CNN) started on their convolution's
kernel taps: ``transformed_head_table`` says where each started, where it is now, how far it moved,
its spread and its content gate, and ``transformed_layer_summary`` the means per layer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from torch import nn

from attnconv.attention import MultiHeadSelfAttention2d
from attnconv.attention.positional import grid_centers
from attnconv.errors import UserError
from attnconv.models.complexity import count_parameters
from attnconv.models.transformed import TransformedNetwork

MIN_SPREAD = 0.05
MAX_CONDITION = 1000.0


def gaussian_layers(model: nn.Module) -> list[tuple[int, MultiHeadSelfAttention2d]]:
    """``(layer index, layer)`` for the model's Gaussian attention layers; the index counts every
    attention layer of ``model.attention_layers()``. UserError (a ValueError) if there are none."""
    if not hasattr(model, "attention_layers"):
        raise UserError(
            f"{type(model).__name__} has no attention layers (expected an ImageTransformer)"
        )
    layers = [
        (index, layer)
        for index, layer in enumerate(model.attention_layers())
        if layer.has_centers
    ]
    if not layers:
        kinds = sorted({str(layer.positional) for layer in model.attention_layers()})
        raise UserError(
            f"head geometry needs Gaussian attention (positional 'gaussian' or "
            f"'gaussian_full'); this model's layers use {', '.join(kinds)}"
        )
    return layers


def head_table(
    model: nn.Module, min_spread: float = MIN_SPREAD, max_condition: float = MAX_CONDITION
) -> list[dict[str, Any]]:
    r"""One row per Gaussian head: ``layer``, ``head``, ``center_row``, ``center_col`` (offset
    $\Delta$ in tokens), ``spread`` ($\det(\Sigma)^{-1/4}$: geometric-mean inverse std, 1/tokens),
    ``condition_number`` (of the covariance $\Sigma$) and ``degenerate`` (see module docstring); for
    a layer started on the kernel taps (``positional_init="grid"``) also ``moved``, the distance
    of the centre from the head's tap (tokens)."""
    rows = []
    for index, layer in gaussian_layers(model):
        geometry = layer.head_geometry()
        taps = None
        if getattr(layer.position, "init", None) == "grid":
            taps = grid_centers(layer.heads).to(geometry["centers"])
        covariance = geometry["covariance"].double()
        for head in range(layer.heads):
            determinant = float(covariance[head].det())
            spread = 0.0 if not math.isfinite(determinant) else determinant**-0.25
            condition = float(geometry["condition_number"][head])
            rows.append(
                {
                    "layer": index,
                    "head": head,
                    "center_row": float(geometry["centers"][head, 0]),
                    "center_col": float(geometry["centers"][head, 1]),
                    "spread": spread,
                    "condition_number": condition,
                    "degenerate": spread < min_spread or condition > max_condition,
                }
            )
            if taps is not None:
                rows[-1]["moved"] = float((geometry["centers"][head] - taps[head]).norm())
    return rows


def transformed_head_table(model: nn.Module) -> list[dict[str, Any]]:
    r"""One row per head of every transformed layer of a ``TransformedNetwork``, in network order:
    ``layer`` (index among the transformed layers), ``name`` (the layer's module name), ``head``,
    ``tap_row``/``tap_col`` (the kernel tap the head started on: offset from the query, pixels of
    the layer's input), ``center_row``/``center_col`` (its centre now, pixels), ``moved``
    ($\lVert \text{centre} - \text{tap} \rVert$, pixels), ``spread`` ($|s|$, the inverse standard
    deviation, 1/pixels), ``std`` ($1/|s|$, pixels; ``inf`` for $s = 0$) and ``gate`` (its share of
    content attention, in ``[0, 1]``; 0 for layers without content). UserError for another model.
    """
    if not isinstance(model, TransformedNetwork):
        raise UserError(
            f"{type(model).__name__} is not a transformed network (expected a TransformedNetwork)"
        )
    rows = []
    for index, (name, layer) in enumerate(model.transformed_layers().items()):
        geometry = layer.head_geometry()
        taps = layer.tap_offsets().detach().double()
        centers = geometry["centers"].double()
        moved = (centers - taps).norm(dim=1)
        spread = layer.position.spread.detach().double().abs()
        for head in range(layer.heads):
            s = float(spread[head])
            rows.append(
                {
                    "layer": index,
                    "name": name,
                    "head": head,
                    "tap_row": int(taps[head, 0]),
                    "tap_col": int(taps[head, 1]),
                    "center_row": float(centers[head, 0]),
                    "center_col": float(centers[head, 1]),
                    "moved": float(moved[head]),
                    "spread": s,
                    "std": 1.0 / s if s > 0 else math.inf,
                    "gate": float(geometry["gates"][head]),
                }
            )
    return rows


def transformed_layer_summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per layer of ``transformed_head_table`` rows: ``layer``, ``name``, ``heads``,
    ``mean_moved`` (pixels), ``max_moved`` (pixels), ``mean_spread`` (1/pixels) and ``mean_gate``
    (how much content attention the layer took up, in ``[0, 1]``)."""
    layers: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        layers.setdefault(row["layer"], []).append(row)
    return [
        {
            "layer": index,
            "name": heads[0]["name"],
            "heads": len(heads),
            "mean_moved": sum(r["moved"] for r in heads) / len(heads),
            "max_moved": max(r["moved"] for r in heads),
            "mean_spread": sum(r["spread"] for r in heads) / len(heads),
            "mean_gate": sum(r["gate"] for r in heads) / len(heads),
        }
        for index, heads in sorted(layers.items())
    ]


def find_degenerate_heads(
    model: nn.Module, min_spread: float = MIN_SPREAD, max_condition: float = MAX_CONDITION
) -> dict[int, list[int]]:
    """``{layer index: [degenerate head indices]}`` for layers with at least one such head."""
    found: dict[int, list[int]] = {}
    for row in head_table(model, min_spread, max_condition):
        if row["degenerate"]:
            found.setdefault(row["layer"], []).append(row["head"])
    return found


@dataclass(frozen=True)
class PruneSummary:
    """What ``prune_degenerate_heads`` removed. ``heads`` is the new per-layer head count (pass
    it as ``heads=`` to ``create_model`` to rebuild the pruned architecture)."""

    removed: dict[int, list[int]]
    heads: list[int]
    parameters_before: int
    parameters_after: int

    def __str__(self) -> str:
        removed = sum(len(h) for h in self.removed.values())
        per_layer = ", ".join(f"layer {i}: {h}" for i, h in sorted(self.removed.items()))
        return (
            f"pruned {removed} degenerate head(s) ({per_layer or 'none'}); heads per layer "
            f"{self.heads}; parameters {self.parameters_before:,} -> {self.parameters_after:,}"
        )


def prune_degenerate_heads(
    model: nn.Module, min_spread: float = MIN_SPREAD, max_condition: float = MAX_CONDITION
) -> PruneSummary:
    """Remove every degenerate head from ``model`` in place (``layer.prune_heads``).

    ValueError (and the model left unchanged) if every head of some layer is degenerate. The
    pruned layers get new parameter tensors: build the optimizer after pruning.
    """
    degenerate = find_degenerate_heads(model, min_spread, max_condition)
    layers = model.attention_layers()
    for index, heads in degenerate.items():
        if len(heads) == layers[index].heads:
            raise UserError(
                f"all {len(heads)} heads of attention layer {index} are degenerate; pruning "
                f"would leave the layer without heads (nothing was pruned)"
            )
    before = count_parameters(model)
    for index, heads in degenerate.items():
        layer = layers[index]
        layer.prune_heads([h for h in range(layer.heads) if h not in heads])
    return PruneSummary(
        removed=degenerate,
        heads=[layer.heads for layer in layers],
        parameters_before=before,
        parameters_after=count_parameters(model),
    )

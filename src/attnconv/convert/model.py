"""Convert a whole network: every convolution Theorem 1 covers becomes its attention equivalent.

Theorem 1 covers ``nn.Conv1d``/``nn.Conv2d`` as their own ``forward`` computes them. A layer is
converted when its class runs that ``forward`` (and ``_conv_forward``) unchanged, it has no forward
hooks, its weight is a plain parameter (not ``torch.nn.utils.parametrize``d, not lazy) and its
``padding_mode`` is supported. Any other convolution is left in place with its reason
(:func:`layers_left`), unless a *rule* for its class says how to reproduce its forward as attention:
:func:`standardized_weight` (weight-standardised convolutions) and :func:`dynamic_same_padding`
(TensorFlow ``"SAME"`` padding computed in ``forward``) are provided; any callable
``rule(conv, spread) -> nn.Module`` can be passed.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.nn.utils import parametrize

from attnconv.convert.theorem import (
    SUPPORTED_PADDING_MODES,
    AttentionConv,
    Standardize,
    conv_to_attention,
)
from attnconv.models.modes import evaluating

Rule = Callable[[nn.Module, float | None], nn.Module]
"""``rule(conv, spread) -> module``: the attention module reproducing ``conv``'s own forward."""

PROBE_TOLERANCE: dict[torch.dtype, float] = {torch.float64: 1e-10, torch.float32: 1e-5}
"""Largest relative error :func:`convert_model`'s probe accepts, by the output's dtype."""


class ConversionError(RuntimeError):
    """``convert_model(strict=True)`` left a layer, or the probe found a different function."""


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


@dataclass(frozen=True)
class LeftLayer:
    """A convolution :func:`convert_model` left in place, and why."""

    name: str  # qualified module name in the network
    kind: str  # the layer's class name
    reason: str


def standardized_weight(eps: float = 1e-5) -> Rule:
    """Rule for weight-standardised convolutions: ``W ← (W − mean) / sqrt(var + eps)`` per output
    channel (biased variance over its inputs and taps), recomputed in each forward as the layer
    does, then the convolution (:class:`~attnconv.convert.theorem.Standardize`)."""

    def rule(conv: nn.Module, spread: float | None) -> AttentionConv:
        return AttentionConv(conv, spread, weight_transform=Standardize(eps))

    return rule


def dynamic_same_padding(conv: nn.Module, spread: float | None) -> AttentionConv:
    """Rule for convolutions that pad as TensorFlow's ``"SAME"`` in ``forward``: per axis
    ``max((⌈n/s⌉ − 1)·s + (k − 1)·d + 1 − n, 0)`` zeros, half before (rounded down), for each
    input size ``n``; the layer's own ``padding`` must be 0."""
    return AttentionConv(conv, spread, dynamic_same=True)


def convert_model(
    model: nn.Module,
    spread: float | None = None,
    *,
    rules: Mapping[type, Rule] | None = None,
    strict: bool = False,
    probe: Tensor | None = None,
) -> nn.Module:
    """A deep copy of ``model`` with every convolution Theorem 1 covers replaced by attention.

    Args:
        model: any network (or a single convolution).
        spread: ``None`` (hard attention, exact) or the finite spread of every converted layer.
        rules: ``{class: rule}`` for convolution subclasses with their own ``forward``; the first
            class of a layer's MRO found here decides. Overrides the plain conversion too.
        strict: raise :class:`ConversionError` naming every layer that would be left in place,
            instead of leaving it.
        probe: an input of ``model``; both networks are run on it (eval mode, no autograd; their
            training flags are restored) and :class:`ConversionError` is raised when the largest
            relative error of the outputs exceeds :data:`PROBE_TOLERANCE` (for the probe's dtype). The error is stored on
            the result as ``conversion_probe_error``.
    Everything else is copied untouched, training mode included; :func:`conversion_summary` and
    :func:`layers_left` say what was replaced and what was left. What is shared stays shared: a
    convolution used in several places becomes one attention module used in the same places
    (the same parameters, trained as one), and a convolution whose weight or bias is also another
    module's parameter is left in place, since converting it alone would untie them.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"expected an nn.Module, got {type(model).__name__}")
    rules = {} if rules is None else dict(rules)
    for cls, rule in rules.items():
        if not (isinstance(cls, type) and callable(rule)):
            raise TypeError(
                f"rules maps classes to callables rule(conv, spread), got {cls!r}: {rule!r}"
            )
    converted = copy.deepcopy(model)  # keeps what is shared shared (deepcopy's memo)
    places: dict[int, list[str]] = {}  # every name of each module, also of one used twice
    for name, module in converted.named_modules(remove_duplicate=False):
        places.setdefault(id(module), []).append(name)
    targets, left = [], []
    for name, module, rule, reason in _survey(converted, rules):
        if reason is None:
            targets.append((module, rule or conv_to_attention))
        else:
            left.append(LeftLayer(name, type(module).__name__, reason))
    if strict and left:
        raise ConversionError(
            "convert_model(strict=True): these layers cannot be converted exactly:\n"
            + "\n".join(f"  {r.name} ({r.kind}): {r.reason}" for r in left)
        )
    for conv, rule in targets:
        module = rule(conv, spread)
        module.train(conv.training)
        for name in places[id(conv)]:  # one module in every place the convolution held
            if not name:
                converted = module
                continue
            parent_name, _, child = name.rpartition(".")
            setattr(converted.get_submodule(parent_name), child, module)
    if probe is not None:
        error = probe_error(model, converted, probe)
        dtype = probe.dtype if probe.is_floating_point() else torch.float32
        tolerance = PROBE_TOLERANCE.get(dtype, PROBE_TOLERANCE[torch.float32])
        if not error <= tolerance:
            raise ConversionError(
                f"the converted model differs from the original on the probe: relative error "
                f"{error:.3g} > {tolerance:g} ({dtype}); layers left: "
                + (", ".join(r.name for r in left) or "none")
            )
        converted.conversion_probe_error = error
    return converted


def layers_left(model: nn.Module, rules: Mapping[type, Rule] | None = None) -> list[LeftLayer]:
    """The convolutions of ``model`` that :func:`convert_model` leaves in place, with reasons.

    On a converted network: what was left. On an original: what would be (with ``rules``).
    """
    return [
        LeftLayer(name, type(module).__name__, reason)
        for name, module, _, reason in _survey(model, {} if rules is None else rules)
        if reason is not None
    ]


def _survey(
    model: nn.Module, rules: Mapping[type, Rule]
) -> list[tuple[str, nn.Module, Rule | None, str | None]]:
    """``(name, module, rule, reason left)`` of each convolution of ``model``, once per module
    (at its first name, ``(model)`` for the root) however many places use it; ``rule``: the first
    of ``rules`` for a class of its MRO, ``reason``: None if it can be converted."""
    owners: dict[int, list[str]] = {}  # parameter -> the modules holding it
    for name, module in model.named_modules():
        for param in module._parameters.values():
            if param is not None:
                owners.setdefault(id(param), []).append(name or "(model)")
    rows = []
    for name, module in model.named_modules():
        if not isinstance(module, (nn.Conv1d, nn.Conv2d)):
            continue
        name = name or "(model)"
        rule = next((rules[c] for c in type(module).__mro__ if c in rules), None)
        reason = _reason_left(module, rule is not None)
        for kind, param in module._parameters.items():
            others = [] if param is None else [n for n in owners[id(param)] if n != name]
            if reason is None and others:
                reason = (
                    f"its {kind} is also a parameter of {', '.join(others)} (converting it "
                    f"alone would untie them)"
                )
        rows.append((name, module, rule, reason))
    return rows


@torch.no_grad()
def probe_error(original: nn.Module, converted: nn.Module, probe: Tensor) -> float:
    """``max |converted(probe) − original(probe)| / max |original(probe)|`` over all outputs.

    Both run in eval mode without autograd; their training flags are restored afterwards.
    Outputs may be a tensor or a (nested) tuple/list/dict of tensors of the same structure.
    """
    outputs = []
    for net in (original, converted):
        with evaluating(net):
            outputs.append(_tensors(net(probe)))
    reference, value = outputs
    if len(reference) != len(value) or any(
        a.shape != b.shape for a, b in zip(reference, value, strict=False)
    ):
        raise ConversionError(
            f"the converted model's outputs have shapes {[tuple(t.shape) for t in value]}, "
            f"the original's {[tuple(t.shape) for t in reference]}"
        )
    scale = max(float(t.abs().max()) for t in reference)
    diff = max(
        float((a.double() - b.double()).abs().max()) for a, b in zip(value, reference, strict=True)
    )
    return diff / scale if scale > 0 else diff


def _reason_left(module: nn.Module, has_rule: bool) -> str | None:
    """Why ``module`` (a Conv1d/Conv2d instance) cannot be converted, or None if it can."""
    if isinstance(module.weight, nn.parameter.UninitializedParameter):
        return "uninitialized lazy parameters (run one forward first)"
    if parametrize.is_parametrized(module):
        return "parametrized weight (torch.nn.utils.parametrize): recomputed in each forward"
    if module._forward_hooks or module._forward_pre_hooks:
        return "forward hooks registered on the layer (they could change its function)"
    if module.padding_mode not in SUPPORTED_PADDING_MODES:
        return f"padding_mode {module.padding_mode!r} not supported"
    if has_rule:
        return None
    base = nn.Conv1d if isinstance(module, nn.Conv1d) else nn.Conv2d
    cls = type(module)
    overridden = [
        m for m in ("forward", "_conv_forward") if getattr(cls, m) is not getattr(base, m)
    ]
    if overridden:
        return (
            f"{cls.__name__} overrides {' and '.join(overridden)} of nn.{base.__name__}: not the "
            f"convolution Theorem 1 covers; pass rules={{{cls.__name__}: rule}} that reproduces it"
        )
    return None


def _tensors(output: object) -> list[Tensor]:
    """The tensors of a model output (a tensor, or nested tuples/lists/dicts), in order."""
    if isinstance(output, Tensor):
        return [output]
    if isinstance(output, Mapping):
        return [t for v in output.values() for t in _tensors(v)]
    if isinstance(output, (tuple, list)):
        return [t for v in output for t in _tensors(v)]
    raise TypeError(
        f"model outputs must be tensors (or tuples/lists/dicts of them), got {type(output).__name__}"
    )


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


def format_summary(
    rows: list[Replacement], left: list[LeftLayer] = (), error: float | None = None
) -> str:
    """A plain-text table of :func:`conversion_summary` with a total line, then the layers left
    in place with their reasons (:func:`layers_left`) and the probe's relative ``error``."""
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
    text = [
        "  ".join(
            cell.ljust(w) if i == 0 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in table
    ]
    if left:
        text.append(f"left in place ({len(left)} layers):")
        text += [f"  {r.name}  {r.kind}: {r.reason}" for r in left]
    if error is not None:
        text.append(f"probe: largest relative error {error:.3g}")
    return "\n".join(text)

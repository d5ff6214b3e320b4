"""Convert a whole network: every convolution Theorem 1 covers becomes its attention equivalent.

Theorem 1 covers ``nn.Conv1d``/``nn.Conv2d`` as their own ``forward`` computes them. A layer is
converted when it is called as any module is (no ``__call__`` override), its class runs that
``forward`` (and ``_conv_forward``) unchanged and nothing replaces them on the instance or, for
every convolution, on ``nn.Conv1d``/``nn.Conv2d`` themselves, it has no forward or backward hooks
(nor does the process, ``register_module_forward_hook`` and the like) and no hooks on its weight
or bias, its weight is a plain parameter (not ``torch.nn.utils.parametrize``d, not lazy) that no
other tensor of the network shares, its ``padding_mode`` is supported and its padding is the one
it was built with (torch keeps the pads of a padding mode other than zeros from construction), and
the network holds it only in its module tree (not also in a
list or attribute that ``forward`` could call). Any other convolution (``ConvTranspose*d`` and
``Conv3d`` included, and, seen through a probe input, modules that call ``torch.conv2d`` and the
like themselves) is left in place with its reason ([`layers_left`][]), unless a *rule* for its
class says how to reproduce its forward as attention: [`standardized_weight`][]
(weight-standardised convolutions), [`scaled_standardized_weight`][] (NFNet's scaled weight
standardisation) and [`dynamic_same_padding`][] (TensorFlow ``"SAME"`` padding computed in
``forward``) are provided; any callable ``rule(conv, spread) -> nn.Module`` can be passed.
"""

from __future__ import annotations

import copy
import functools
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.nn.modules.conv import _ConvNd
from torch.nn.utils import parametrize
from torch.overrides import TorchFunctionMode

from attnconv.convert.theorem import (
    SUPPORTED_PADDING_MODES,
    AttentionConv,
    ScaledStandardize,
    Standardize,
    conv_to_attention,
)
from attnconv.models.modes import evaluating

Rule = Callable[[nn.Module, float | None], nn.Module]
"""``rule(conv, spread) -> module``: the attention module reproducing ``conv``'s own forward."""

PROBE_TOLERANCE: dict[torch.dtype, float] = {torch.float64: 1e-10, torch.float32: 1e-5}
"""Largest relative error [`convert_model`][]'s probe accepts, by the output's dtype."""

CONVOLUTION_FUNCTIONS = frozenset({
    torch.conv1d, torch.conv2d, torch.conv3d, torch.conv_transpose1d, torch.conv_transpose2d,
    torch.conv_transpose3d, torch.convolution,
})  # fmt: skip
"""The torch functions that compute a convolution (``F.conv2d`` is ``torch.conv2d``)."""

_MODULE_INTERNALS = frozenset(vars(nn.Module()))  # registries and hook tables of every module


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
    """A convolution [`convert_model`][] left in place, and why."""

    name: str  # qualified module name in the network
    kind: str  # the layer's class name
    reason: str


def standardized_weight(eps: float | None = None) -> Rule:
    """Rule for weight-standardised convolutions (BiT's ``StdConv2d``): ``W ← (W − mean) /
    sqrt(var + eps)`` per output channel (biased variance over its inputs and taps), recomputed in
    each forward as the layer does, then the convolution
    ([`Standardize`][attnconv.convert.theorem.Standardize]).

    ``eps``: the layer's own ``eps`` attribute when None; a given ``eps`` must equal the layer's
    if it has one (ValueError otherwise). A layer with a true ``same_pad`` attribute (timm's
    ``StdConv2dSame``) pads as TensorFlow's ``"SAME"`` ([`dynamic_same_padding`][]). Not for
    NFNet's scaled layers, which also multiply by a gain: [`scaled_standardized_weight`][].
    """

    def rule(conv: nn.Module, spread: float | None) -> AttentionConv:
        own = getattr(conv, "eps", None)
        kind = type(conv).__name__
        if eps is None and own is None:
            raise ValueError(f"{kind} has no eps attribute: pass standardized_weight(eps)")
        if eps is not None and own is not None and float(own) != float(eps):
            raise ValueError(f"{kind} has eps={own:g}, the rule's eps is {eps:g}")
        transform = Standardize(own if eps is None else eps)
        dynamic = bool(getattr(conv, "same_pad", False))
        return AttentionConv(conv, spread, weight_transform=transform, dynamic_same=dynamic)

    return rule


def scaled_standardized_weight(conv: nn.Module, spread: float | None) -> AttentionConv:
    r"""Rule for NFNet's scaled weight-standardised convolutions (timm's ``ScaledStdConv2d`` and
    ``ScaledStdConv2dSame``):
    $W \leftarrow (W - \operatorname{mean} W) / \sqrt{\operatorname{var} W + \varepsilon} \cdot g \cdot c$
    per output channel (biased variance over its inputs and taps; $\varepsilon$ = ``eps``; $g$ =
    ``gain``: the layer's trainable ``(Cout, 1, 1, 1)`` parameter, kept trainable as the converted
    layer's ``gain``; $c$ = ``scale``: the layer's constant $\gamma \cdot \text{fan\_in}^{-1/2}$),
    recomputed in each forward ([`ScaledStandardize`][attnconv.convert.theorem.ScaledStandardize]),
    then the convolution, padded as TensorFlow's ``"SAME"`` where the layer's ``same_pad`` is true.
    """
    gain, scale, eps = (getattr(conv, name, None) for name in ("gain", "scale", "eps"))
    if not (isinstance(gain, nn.Parameter) and isinstance(scale, (int, float)) and eps is not None):
        raise ValueError(
            f"{type(conv).__name__} has no gain parameter, scale and eps (as timm's "
            f"ScaledStdConv2d has): not a scaled weight-standardised convolution"
        )
    expected = (conv.out_channels,) + (1,) * (conv.weight.dim() - 1)
    if tuple(gain.shape) != expected:
        raise ValueError(
            f"{type(conv).__name__}'s gain has shape {tuple(gain.shape)}, expected {expected}"
        )
    transform = ScaledStandardize(gain, scale, eps)
    dynamic = bool(getattr(conv, "same_pad", False))
    return AttentionConv(conv, spread, weight_transform=transform, dynamic_same=dynamic)


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
    probe_gradients: bool = False,
) -> nn.Module:
    """A deep copy of ``model`` with every convolution Theorem 1 covers replaced by attention.

    Args:
        model: any network (or a single convolution).
        spread: ``None`` (hard attention, exact) or the finite spread of every converted layer.
        rules: ``{class: rule}`` for convolution subclasses with their own ``forward``; the first
            class of a layer's MRO found here decides. Overrides the plain conversion too. A
            rule's module must have the layer's state-dict entries (names and shapes): one that
            drops or adds one (e.g. the gain of a scaled weight standardisation) raises
            [`ConversionError`][] naming the layer.
        strict: raise [`ConversionError`][] naming every layer that would be left in place,
            instead of leaving it.
        probe: an input of ``model``; both networks are run on it (eval mode, no autograd; their
            training flags are restored) and [`ConversionError`][] is raised when the largest
            relative error of the outputs exceeds [`PROBE_TOLERANCE`][] (for the probe's
            dtype). The error is stored on the result as ``conversion_probe_error``. The probe
            also finds the modules that call a convolution function themselves
            ([`CONVOLUTION_FUNCTIONS`][]): they are left, listed and refused by ``strict``.
        probe_gradients: with ``probe``, also compare the gradients
            ([`probe_gradient_error`][], same tolerance), stored as
            ``conversion_probe_gradient_error``.
    Everything else is copied untouched, training mode included; [`conversion_summary`][] and
    [`layers_left`][] say what was replaced and what was left. What is shared stays shared: a
    convolution used in several places becomes one attention module used in the same places
    (the same parameters, trained as one); tensors sharing one storage share one in the copy;
    a convolution whose weight or bias is also another module's parameter, or shares its storage
    with another tensor, is left in place, since converting it alone would untie them. The
    parameters' tensor hooks are kept in the copy.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"expected an nn.Module, got {type(model).__name__}")
    rules = {} if rules is None else dict(rules)
    for cls, rule in rules.items():
        if not (isinstance(cls, type) and callable(rule)):
            raise TypeError(
                f"rules maps classes to callables rule(conv, spread), got {cls!r}: {rule!r}"
            )
    reference = None
    if probe is not None:
        reference, called = _probe_run(model, probe)
    converted = _copy(model)
    places: dict[int, list[str]] = {}  # every name of each module, also of one used twice
    for name, module in converted.named_modules(remove_duplicate=False):
        places.setdefault(id(module), []).append(name)
    targets, left = [], []
    for name, module, rule, reason in _survey(converted, rules):
        if reason is None:
            targets.append((name, module, rule or conv_to_attention))
        else:
            left.append(LeftLayer(name, type(module).__name__, reason))
    if probe is not None:
        left += called
    if strict and left:
        raise ConversionError(
            "convert_model(strict=True): these layers cannot be converted exactly:\n"
            + "\n".join(f"  {r.name} ({r.kind}): {r.reason}" for r in left)
        )
    for conv_name, conv, rule in targets:
        module = rule(conv, spread)
        _check_entries(conv_name, conv, module)
        module.train(conv.training)
        for name in places[id(conv)]:  # one module in every place the convolution held
            if not name:
                converted = module
                continue
            parent_name, _, child = name.rpartition(".")
            setattr(converted.get_submodule(parent_name), child, module)
    if probe is not None:
        dtype = probe.dtype if probe.is_floating_point() else torch.float32
        tolerance = PROBE_TOLERANCE.get(dtype, PROBE_TOLERANCE[torch.float32])
        names = ", ".join(r.name for r in left) or "none"
        error = _relative_error(reference, _outputs(converted, probe))
        if not error <= tolerance:
            raise ConversionError(
                f"the converted model differs from the original on the probe: relative error "
                f"{error:.3g} > {tolerance:g} ({dtype}); layers left: {names}"
            )
        converted.conversion_probe_error = error
        if probe_gradients:
            error = probe_gradient_error(model, converted, probe)
            if not error <= tolerance:
                raise ConversionError(
                    f"the converted model's gradients differ from the original's on the probe: "
                    f"relative error {error:.3g} > {tolerance:g} ({dtype}); layers left: {names}"
                )
            converted.conversion_probe_gradient_error = error
    return converted


def layers_left(
    model: nn.Module, rules: Mapping[type, Rule] | None = None, probe: Tensor | None = None
) -> list[LeftLayer]:
    """The convolutions of ``model`` that [`convert_model`][] leaves in place, with reasons.

    On a converted network: what was left. On an original: what would be (with ``rules``).
    With ``probe`` (an input of ``model``, run once in eval mode without autograd), also the
    modules that call a convolution function in their own forward.
    """
    left = [
        LeftLayer(name, type(module).__name__, reason)
        for name, module, _, reason in _survey(model, {} if rules is None else rules)
        if reason is not None
    ]
    return left if probe is None else left + _probe_run(model, probe)[1]


def _survey(
    model: nn.Module, rules: Mapping[type, Rule]
) -> list[tuple[str, nn.Module, Rule | None, str | None]]:
    """``(name, module, rule, reason left)`` of each convolution of ``model``, once per module
    (at its first name, ``(model)`` for the root) however many places use it; ``rule``: the first
    of ``rules`` for a class of its MRO, ``reason``: None if it can be converted."""
    owners: dict[int, list[str]] = {}  # parameter -> the modules holding it
    storages: dict[tuple, list[tuple[str, int]]] = {}  # storage -> (tensor's name, its id)
    for name, module in model.named_modules():
        for param in module._parameters.values():
            if param is not None:
                owners.setdefault(id(param), []).append(name or "(model)")
        for kind, tensor in (*module._parameters.items(), *module._buffers.items()):
            key = _storage_key(tensor)
            if key is not None:
                label = f"{name}.{kind}" if name else kind
                storages.setdefault(key, []).append((label, id(tensor)))
    outside = _held_outside(model)
    rows = []
    for name, module in model.named_modules():
        if not isinstance(module, _ConvNd):
            continue
        name = name or "(model)"
        rule = next((rules[c] for c in type(module).__mro__ if c in rules), None)
        if isinstance(module, (nn.Conv1d, nn.Conv2d)):
            reason = _reason_left(module, rule is not None)
        else:
            reason = f"a {type(module).__name__}: Theorem 1 covers Conv1d and Conv2d only"
        for kind, param in module._parameters.items():
            if reason is not None or param is None:
                continue
            others = [n for n in owners[id(param)] if n != name]
            sharers = [n for n, i in storages.get(_storage_key(param), []) if i != id(param)]
            if others:
                reason = (
                    f"its {kind} is also a parameter of {', '.join(others)} (converting it "
                    f"alone would untie them)"
                )
            elif sharers:
                reason = (
                    f"its {kind} shares its storage with {', '.join(sharers)} (converting it "
                    f"alone would untie them)"
                )
        if reason is None and id(module) in outside:
            reason = (
                f"also held outside the module tree, as {', '.join(outside[id(module)])} "
                f"(forward may call it there, where it would not be replaced)"
            )
        rows.append((name, module, rule, reason))
    return rows


def _storage_key(tensor: Tensor | None) -> tuple | None:
    """``(device, address)`` of a tensor's storage, None where it has none to share."""
    if (
        tensor is None
        or isinstance(tensor, nn.parameter.UninitializedTensorMixin)
        or tensor.is_meta
        or tensor.untyped_storage().nbytes() == 0
    ):
        return None
    return tensor.device, tensor.untyped_storage().data_ptr()


def _held_outside(model: nn.Module) -> dict[int, list[str]]:
    """``id(module) → where else it is held``: modules reachable from the attributes of
    ``model``'s modules other than their registries (``_modules``, ``_parameters``, hook tables),
    through lists, tuples, dicts, sets, ``functools.partial`` and bound methods of another object.
    A module reached so is held there as well as (or instead of) in the module tree."""
    found: dict[int, list[str]] = {}
    seen: set[int] = set()
    stack = [
        (value, f"{name or '(model)'}.{key}", module)
        for name, module in model.named_modules()
        for key, value in vars(module).items()
        if key not in _MODULE_INTERNALS
    ]
    while stack:
        value, path, holder = stack.pop()
        if isinstance(value, types.MethodType):
            if value.__self__ is holder:  # e.g. a forward patched on the instance itself
                continue
            value = value.__self__
        if isinstance(value, nn.Module):
            for sub_name, sub in value.named_modules():
                found.setdefault(id(sub), []).append(f"{path}.{sub_name}" if sub_name else path)
            continue
        if id(value) in seen:
            continue
        seen.add(id(value))
        if isinstance(value, dict):
            stack += [(v, f"{path}[{k!r}]", holder) for k, v in value.items()]
        elif isinstance(value, (list, tuple)):
            stack += [(v, f"{path}[{i}]", holder) for i, v in enumerate(value)]
        elif isinstance(value, (set, frozenset)):
            stack += [(v, f"{path}{{}}", holder) for v in value]
        elif isinstance(value, functools.partial):
            parts = (value.func, *value.args, *value.keywords.values())
            stack += [(v, path, holder) for v in parts]
    for paths in found.values():
        paths.sort()
    return found


def _copy(model: nn.Module) -> nn.Module:
    """``copy.deepcopy(model)`` that keeps what the original shares and hooks: tensors sharing a
    storage share one (a copy of it) in the copy, parameters keep their tensor hooks, and tensors
    computed from parameters that modules hold as attributes (the ``weight`` of old-style
    ``torch.nn.utils.weight_norm`` and ``prune``, recomputed by their forward pre-hooks, which
    deepcopy refuses) are copied detached."""
    memo: dict[int, object] = {}
    groups: dict[tuple, dict[int, Tensor]] = {}
    hooked: list[Tensor] = []
    for module in model.modules():
        attributes = (v for v in vars(module).values() if isinstance(v, Tensor))
        for tensor in (*module._parameters.values(), *module._buffers.values(), *attributes):
            if tensor is None or id(tensor) in memo:
                continue
            if tensor.grad_fn is not None:
                memo[id(tensor)] = tensor.detach().clone()
                continue
            key = _storage_key(tensor)
            if key is not None:
                groups.setdefault(key, {})[id(tensor)] = tensor
            if tensor._backward_hooks or tensor._post_accumulate_grad_hooks:
                hooked.append(tensor)
    for tensors in groups.values():
        if len(tensors) < 2:
            continue
        storage = next(iter(tensors.values())).untyped_storage().clone()
        for tensor in tensors.values():
            view = torch.empty(0, dtype=tensor.dtype, device=tensor.device).set_(
                storage, tensor.storage_offset(), tensor.size(), tensor.stride()
            )
            if isinstance(tensor, nn.Parameter):
                memo[id(tensor)] = type(tensor)(view, requires_grad=tensor.requires_grad)
            else:
                memo[id(tensor)] = view.requires_grad_(tensor.requires_grad)
    copied = copy.deepcopy(model, memo)
    for tensor in hooked:
        twin = memo[id(tensor)]
        if not twin._backward_hooks:
            for hook in (tensor._backward_hooks or {}).values():
                twin.register_hook(hook)
        if not twin._post_accumulate_grad_hooks:
            for hook in (tensor._post_accumulate_grad_hooks or {}).values():
                twin.register_post_accumulate_grad_hook(hook)
    return copied


def _check_entries(name: str, conv: nn.Module, module: nn.Module) -> None:
    """ConversionError naming the layer if a rule's ``module`` has other state-dict entries
    (names, shapes) than the convolution ``conv`` it replaces: it would drop or add part of it."""
    entries = [{k: tuple(v.shape) for k, v in m.state_dict().items()} for m in (module, conv)]
    if entries[0] != entries[1]:
        raise ConversionError(
            f"{name} ({type(conv).__name__}): the rule's module has the state-dict entries "
            f"{entries[0]}, the layer {entries[1]}: it would drop or add part of the layer"
        )


class _ConvolutionCalls(TorchFunctionMode):
    """Records, while active, which module's own forward called a convolution function: the
    innermost module running (``stack``, kept by hooks) at each call."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[nn.Module] = []
        self.calls: dict[int, str] = {}  # id(module) -> the first function it called

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in CONVOLUTION_FUNCTIONS and self.stack:
            self.calls.setdefault(id(self.stack[-1]), f"torch.{func.__name__}")
        return func(*args, **(kwargs or {}))


def _probe_run(model: nn.Module, probe: Tensor) -> tuple[list[Tensor], list[LeftLayer]]:
    """``model``'s outputs on ``probe`` (``_outputs``), and the modules other than
    convolution layers whose own forward called a convolution function, as layers left."""
    calls = _ConvolutionCalls()

    def leave(_module: nn.Module, _args: tuple, _output: object) -> None:
        calls.stack.pop()

    handles = []
    for module in model.modules():
        handles.append(module.register_forward_pre_hook(lambda m, _a: calls.stack.append(m)))
        handles.append(module.register_forward_hook(leave))
    try:
        with calls:
            outputs = _outputs(model, probe)
    finally:
        for handle in handles:
            handle.remove()
    left = [
        LeftLayer(
            name or "(model)",
            type(module).__name__,
            f"calls {calls.calls[id(module)]} in its own forward (a convolution convert_model "
            f"cannot replace)",
        )
        for name, module in model.named_modules()
        if id(module) in calls.calls and not isinstance(module, _ConvNd)
    ]
    return outputs, left


@torch.no_grad()
def _outputs(net: nn.Module, probe: Tensor) -> list[Tensor]:
    """The output tensors of ``net(probe)`` (eval mode, no autograd; training flags restored)."""
    with evaluating(net):
        return _tensors(net(probe))


def _relative_error(reference: list[Tensor], value: list[Tensor]) -> float:
    """``max |value − reference| / max |reference|`` over all tensors; ConversionError if their
    shapes differ."""
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


def probe_error(original: nn.Module, converted: nn.Module, probe: Tensor) -> float:
    """``max |converted(probe) − original(probe)| / max |original(probe)|`` over all outputs.

    Both run in eval mode without autograd; their training flags are restored afterwards.
    Outputs may be a tensor or a (nested) tuple/list/dict of tensors of the same structure.
    """
    return _relative_error(_outputs(original, probe), _outputs(converted, probe))


def probe_gradient_error(original: nn.Module, converted: nn.Module, probe: Tensor) -> float:
    r"""Largest relative error of the converted model's gradients on ``probe``.

    Each network's outputs ``y_i`` (as [`probe_error`][]; eval mode, training flags restored) give
    the loss $\sum_i \langle y_i, u_i \rangle$ with fixed random $u_i$ of their shapes; its
    gradients with respect to the probe (when floating point) and to every trainable parameter, by
    state-dict key, are compared tensor by tensor: ``max |g − g_original| / max |g_original|`` (the
    absolute difference where the original's is zero; no gradient counts as zeros). The parameters'
    ``.grad`` are left untouched. ConversionError if the two networks' trainable state-dict keys
    differ.
    """
    reference, value = (_gradients(net, probe) for net in (original, converted))
    if set(reference) != set(value):
        raise ConversionError(
            f"the converted model's trainable parameters {sorted(value)} are not the "
            f"original's {sorted(reference)}"
        )
    return max((_relative_error([reference[k]], [value[k]]) for k in reference), default=0.0)


def _gradients(net: nn.Module, probe: Tensor) -> dict[str, Tensor]:
    """Gradients of [`probe_gradient_error`][]'s loss for ``net``: ``{"(probe)": …, key: …}``."""
    x = probe.detach().clone().requires_grad_(probe.is_floating_point())
    params = {k: v for k, v in net.state_dict(keep_vars=True).items() if v.requires_grad}
    unique = list({id(p): p for p in params.values()}.values())
    inputs = ([x] if x.requires_grad else []) + unique
    generator = torch.Generator().manual_seed(0)
    with evaluating(net), torch.enable_grad():
        outputs = [t for t in _tensors(net(x)) if t.is_floating_point()]
        upstream = [torch.randn(t.shape, generator=generator, dtype=t.dtype) for t in outputs]
        loss = sum((t * u.to(t.device)).sum() for t, u in zip(outputs, upstream, strict=True))
        grads = [None] * len(inputs)
        if isinstance(loss, Tensor) and loss.requires_grad and inputs:
            grads = torch.autograd.grad(loss, inputs, allow_unused=True)
    by_id = {
        id(t): g if g is not None else torch.zeros_like(t)
        for t, g in zip(inputs, grads, strict=True)
    }
    result = {"(probe)": by_id[id(x)]} if x.requires_grad else {}
    return result | {k: by_id[id(p)] for k, p in params.items()}


def _reason_left(module: nn.Module, has_rule: bool) -> str | None:
    """Why ``module`` (a Conv1d/Conv2d instance) cannot be converted, or None if it can."""
    if isinstance(module.weight, nn.parameter.UninitializedParameter):
        return "uninitialized lazy parameters (run one forward first)"
    if parametrize.is_parametrized(module):
        return "parametrized weight (torch.nn.utils.parametrize): recomputed in each forward"
    cls = type(module)
    called = [m for m in ("__call__", "_call_impl") if getattr(cls, m) is not getattr(nn.Module, m)]
    if called:
        return (
            f"{cls.__name__} overrides {' and '.join(called)} of nn.Module: its call is not the "
            f"convolution's"
        )
    for method in ("forward", "_conv_forward", "_call_impl"):
        if method in vars(module):
            return f"{method} set on the instance: not the convolution Theorem 1 covers"
    if module._forward_hooks or module._forward_pre_hooks:
        return "forward hooks registered on the layer (they could change its function)"
    everywhere = [kind for kind, hooks in _global_module_hooks().items() if hooks]
    if everywhere:
        return (
            f"process-wide module {' and '.join(everywhere)} hooks are registered "
            f"(torch.nn.modules.module.register_module_*_hook): they see every convolution, and "
            f"would see an attention module in its place"
        )
    if module._backward_hooks or module._backward_pre_hooks:
        return "backward hooks registered on the layer (they change its gradients)"
    for kind, param in module._parameters.items():
        if param is not None and (param._backward_hooks or param._post_accumulate_grad_hooks):
            return f"hooks registered on its {kind} (they change its gradients)"
    if module.padding_mode not in SUPPORTED_PADDING_MODES:
        return f"padding_mode {module.padding_mode!r} not supported"
    pads, stated = list(module._reversed_padding_repeated_twice), _padding_pairs(module)
    if module.padding_mode != "zeros" and pads != stated:
        return (
            f"its {module.padding_mode} padding was changed after construction: its forward pads "
            f"{pads} (as built), its padding attribute says {stated}"
        )
    if has_rule:
        return None
    base = nn.Conv1d if isinstance(module, nn.Conv1d) else nn.Conv2d
    overridden = [
        m for m in ("forward", "_conv_forward") if getattr(cls, m) is not getattr(base, m)
    ]
    if overridden:
        return (
            f"{cls.__name__} overrides {' and '.join(overridden)} of nn.{base.__name__}: not the "
            f"convolution Theorem 1 covers; pass rules={{{cls.__name__}: rule}} that reproduces it"
        )
    for method in ("forward", "_conv_forward"):
        function = getattr(base, method)
        if getattr(function, "__module__", None) != "torch.nn.modules.conv":
            return (
                f"nn.{base.__name__}.{method} is {getattr(function, '__qualname__', function)!r} "
                f"from {getattr(function, '__module__', '?')}, not torch's (replaced process-wide)"
            )
    return None


def _global_module_hooks() -> dict[str, dict]:
    """torch's process-wide module hooks (``register_module_forward_hook`` and the like), by kind."""
    from torch.nn.modules import module as registry

    return {
        "forward": {**registry._global_forward_hooks, **registry._global_forward_pre_hooks},
        "backward": {**registry._global_backward_hooks, **registry._global_backward_pre_hooks},
    }


def _padding_pairs(conv: nn.Module) -> list[int]:
    """The ``(left, right)`` pads per axis, last axis first, that ``conv.padding`` means now:
    what torch's constructor stores as ``_reversed_padding_repeated_twice`` (which the forward of
    a padding mode other than zeros uses)."""
    if isinstance(conv.padding, str):
        pairs = [0, 0] * len(conv.kernel_size)
        if conv.padding == "same":
            for axis, (d, k) in enumerate(zip(conv.dilation, conv.kernel_size, strict=True)):
                total = d * (k - 1)
                index = len(conv.kernel_size) - 1 - axis
                pairs[2 * index], pairs[2 * index + 1] = total // 2, total - total // 2
        return pairs
    return [p for pad in reversed(conv.padding) for p in (pad, pad)]


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
    """What [`convert_model`][] replaced in ``model`` (a converted network), in module order."""
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
    """A plain-text table of [`conversion_summary`][] with a total line, then the layers left
    in place with their reasons ([`layers_left`][]) and the probe's relative ``error``."""
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

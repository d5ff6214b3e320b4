"""Transform, don't just convert: a network's convolutions recast as attention that keeps learning.

``transform`` replaces chosen ``nn.Conv2d`` layers of a network by
``TransformedConv2d`` layers built by Theorem 1's
construction with a finite spread (docs/transform.md): each kernel tap becomes a Gaussian head
on that tap whose centre and spread train, and a content attention joins behind per-head gates
(``CONTENT_START`` says how it starts: a path that can learn from the first step, or the
first form, shut). ``transform_checkpoint`` does it to a network attnconv can rebuild (a
checkpoint or shipped model), giving a checkpoint of architecture ``"transformed"``
(``attnconv.models.transformed``), which every command loads. ``choose_spread`` finds the
smallest spread and ``choose_opening`` the largest gate opening that keep an accuracy;
``calibrate_content`` scales mimetic queries and keys on real images;
``untransformed_layers`` lists the convolutions a transform left and why. The exact, frozen
conversion for deployment and verification stays [`convert_model`][attnconv.convert.model.convert_model].
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from attnconv.attention.transformed import TransformedConv2d
from attnconv.convert.model import ConversionError, LeftLayer, _copy, _survey
from attnconv.models.modes import evaluating
from attnconv.models.transformed import TransformedNetwork, _submodule_parent

SPATIAL = "spatial"
"""Every ``nn.Conv2d`` with a kernel larger than 1×1: the network's spatial mixing all becomes
attention (1×1 convolutions mix channels per pixel, as a transformer's Linear layers do)."""

LATE = "late"
"""The default selection: every ``nn.Conv2d`` with a kernel larger than 1×1 whose output grid is
one of the network's two smallest (the late stages, which T-CNN recast: their grids are small,
so attention over them is cheap, and they hold the most channels)."""

SPREAD_CANDIDATES: tuple[float, ...] = (1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 8.0)
"""Spreads ``choose_spread`` tries, smallest (most blurred, fastest to move) first."""

OPENING_CANDIDATES: tuple[float, ...] = (
    0.5, 0.35, 0.25, 0.15, 0.1, 0.05, 0.02, 0.01, 0.005, 0.002, 0.001
)
"""Gate openings ``choose_opening`` tries, largest (most content, most gradient to the
queries and keys) first."""

FIRST_FORM: dict[str, Any] = {
    "gate": "clamp", "opening": 0.0, "qk_init": "default", "content_weight_decay": True
}
"""The content path as attnconv first built it (``tcnn-fashion-small``'s): clamped gates started
shut, ``nn.Linear`` queries and keys under weight decay. It starts exactly as the blurred CNN, and
its queries and keys never learn (docs/transform.md)."""

CONTENT_START: dict[str, Any] = {
    "gate": "clamp", "opening": 0.02, "qk_init": "mimetic", "content_weight_decay": False
}
"""How ``transform`` and ``transform_checkpoint`` start the content path by default: clamped
gates open at 2% (the largest opening that keeps ``resnet-fashion-small``'s validation accuracy
within 0.5 point, 92.98% against 93.30%; ``attnconv transform`` searches it per network), mimetic
queries and keys (a pixel attends to pixels like it; ``calibrate_content`` scales them on real
images), outside weight decay. Open and informative, so the queries and keys get a gradient from
the first step, where ``FIRST_FORM``'s get none (docs/transform.md)."""

MIMETIC_LOGIT_STD = 2.0
"""The standard deviation over keys that ``calibrate_content`` gives mimetic content logits:
a map that prefers like pixels, far from uniform, without being one-hot."""


def _example_input(model: nn.Module, example: torch.Tensor | None) -> torch.Tensor:
    if example is not None:
        return example
    size, channels = getattr(model, "image_size", None), getattr(model, "in_channels", None)
    if size is None or channels is None:
        raise ValueError(
            f"layers={LATE!r} finds the late convolutions by running the network once: give an "
            f"example input (example=...), or name the layers"
        )
    parameter = next(model.parameters())
    return torch.zeros(1, channels, *size, device=parameter.device, dtype=parameter.dtype)


def _output_sizes(model: nn.Module, example: torch.Tensor) -> dict[str, tuple[int, int]]:
    """Output grid ``(H, W)`` of every ``nn.Conv2d`` of ``model`` on ``example`` (one forward in
    eval mode; the model's mode is put back)."""
    sizes: dict[str, tuple[int, int]] = {}
    hooks = [
        module.register_forward_hook(
            lambda _m, _i, out, name=name: sizes.__setitem__(name, tuple(out.shape[-2:]))
        )
        for name, module in model.named_modules()
        if isinstance(module, nn.Conv2d)
    ]
    try:
        with evaluating(model), torch.no_grad():  # eval: batch norms take a batch of one
            model(example)
    finally:
        for hook in hooks:
            hook.remove()
    return sizes


def select_layers(
    model: nn.Module,
    layers: str | Sequence[str] = LATE,
    example: torch.Tensor | None = None,
) -> list[str]:
    """Names of the ``nn.Conv2d`` modules of ``model`` that ``layers`` selects, in network order.

    ``layers``: ``LATE``, ``SPATIAL``, or module-name patterns (``fnmatch``: ``"stages.3.*"``,
    ``"layer4.0.conv2"``) each matching at least one convolution. ``example``: an input for the
    probe forward of ``LATE`` (default: zeros of the model's ``image_size`` and
    ``in_channels``). ConversionError naming the layer if a selected convolution is one
    Theorem 1's construction does not cover as written (a subclass with its own forward, hooks,
    a parametrized weight, a weight shared with another module, a convolution also held outside
    the module tree: ``convert_model``'s reasons); ValueError for a pattern that matches no convolution.
    """
    convs = {name: m for name, m in model.named_modules() if isinstance(m, nn.Conv2d)}
    if isinstance(layers, str) and layers == SPATIAL:
        chosen = [name for name, conv in convs.items() if conv.kernel_size != (1, 1)]
    elif isinstance(layers, str) and layers == LATE:
        sizes = _output_sizes(model, _example_input(model, example))
        spatial = [name for name in convs if convs[name].kernel_size != (1, 1) and name in sizes]
        smallest = sorted({sizes[name][0] * sizes[name][1] for name in spatial})[:2]
        chosen = [name for name in spatial if sizes[name][0] * sizes[name][1] in smallest]
    else:
        patterns = [layers] if isinstance(layers, str) else list(layers)
        chosen = []
        for pattern in patterns:
            matched = [name for name in convs if fnmatch.fnmatchcase(name, pattern)]
            if not matched:
                raise ValueError(
                    f"layer pattern {pattern!r} matches no nn.Conv2d; the network has "
                    f"{', '.join(list(convs)[:8])}{', ...' if len(convs) > 8 else ''}"
                )
            chosen += [name for name in matched if name not in chosen]
        chosen.sort(key=list(convs).index)
    if not chosen:
        raise ValueError("no convolution to transform: the network has no spatial nn.Conv2d")
    reasons = {name: reason for name, _, _, reason in _survey(model, {})}
    for name in chosen:
        reason = reasons.get(name)
        if type(convs[name]) is not nn.Conv2d:  # convert_model's hint (rules=) is not transform's
            own = (reason or f"a {type(convs[name]).__name__}, not a plain nn.Conv2d")
            reason = (
                f"{own.split('; pass rules=')[0]}; transform recasts only nn.Conv2d's own "
                f"forward: leave it out with a layer pattern, or convert it exactly with "
                f"convert_model(rules=...)"
            )
        if reason is not None:
            raise ConversionError(f"cannot transform {name}: {reason}")
    return chosen


def untransformed_layers(model: nn.Module) -> list[LeftLayer]:
    """The ``nn.Conv2d`` modules (subclasses included) that a transformed ``model`` still holds,
    each with why: a reason ``select_layers`` refuses it for, a 1×1 kernel (it mixes channels
    per pixel, as a transformer's Linear layers do), or not in the selection. On a network not
    transformed: every convolution, with the same reasons."""
    reasons = {name: reason for name, _, _, reason in _survey(model, {})}
    left = []
    for name, module in model.named_modules():
        if not isinstance(module, nn.Conv2d):
            continue
        reason = reasons.get(name)
        if type(module) is not nn.Conv2d:
            reason = f"a {type(module).__name__}, not a plain nn.Conv2d"
        elif reason is None:
            reason = "1x1: mixes channels per pixel" if module.kernel_size == (1, 1) else (
                "not selected"
            )
        left.append(LeftLayer(name, type(module).__name__, reason))
    return left


def transform(
    model: nn.Module,
    layers: str | Sequence[str] = LATE,
    spread: float = 4.0,
    content: bool = True,
    qk_dim: int | None = None,
    content_heads: int = 1,
    example: torch.Tensor | None = None,
    gate: str | None = None,
    opening: float | None = None,
    qk_init: str | None = None,
) -> nn.Module:
    """A copy of ``model`` with the convolutions ``layers`` selects (``select_layers``)
    recast as trainable attention (``TransformedConv2d``), everything else (normalisation,
    shortcuts, the head) untouched and ``model`` itself unchanged.

    Each transformed layer starts as its convolution blurred by a Gaussian of inverse standard
    deviation ``spread`` (1/pixels; the error against the convolution falls like
    ``exp(−spread²/2)``), and with ``content=True`` a content attention behind gates started at
    ``opening`` (``gate``, ``opening``, ``qk_init``: as ``TransformedConv2d`` takes them, default
    ``CONTENT_START``'s). With the gates shut the copy computes ``model``'s function with
    that blur; every centre, spread, gate and content weight is a trainable parameter. A
    convolution the network calls in several places (one module at several names) becomes one
    transformed layer at all of them, so the tie holds. Mimetic queries and keys start at gain 1:
    ``calibrate_content`` scales them on real images. ``untransformed_layers`` lists
    the convolutions left. For a network attnconv rebuilds from checkpoints use
    ``transform_checkpoint``, whose result saves and loads as a model of its own.
    """
    start = _content_start(gate, opening, qk_init)
    names = select_layers(model, layers, example)
    transformed = _copy(model)
    modules = dict(transformed.named_modules())
    paths: dict[int, list[str]] = {}
    for name, module in transformed.named_modules(remove_duplicate=False):
        paths.setdefault(id(module), []).append(name)
    for name in names:
        layer = TransformedConv2d.from_conv(
            modules[name], spread, content, qk_dim, content_heads, **start
        )
        layer.train(modules[name].training)
        for path in paths[id(modules[name])]:
            parent, leaf = _submodule_parent(transformed, path)
            setattr(parent, leaf, layer)
    return transformed


def _content_start(gate: str | None, opening: float | None, qk_init: str | None) -> dict[str, Any]:
    """``gate``, ``opening`` and ``qk_init``, each ``CONTENT_START``'s where None."""
    given = {"gate": gate, "opening": opening, "qk_init": qk_init}
    return {key: CONTENT_START[key] if value is None else value for key, value in given.items()}


@torch.no_grad()
def calibrate_content(
    model: nn.Module, images: torch.Tensor, logit_std: float = MIMETIC_LOGIT_STD
) -> dict[str, float]:
    """Scale the mimetic queries and keys of every transformed layer of ``model`` so that its
    content logits on ``images`` ``(B, C, H, W)`` (one eval-mode forward; the mode is put back)
    have standard deviation ``logit_std`` over each query's keys
    (``TransformedConv2d.calibrate_mimetic``); returns each layer's gain by name. Layers
    without mimetic content are left as they are.

    Each layer is calibrated on its input as the forward reaches it, so a later layer sees the
    output of the earlier ones already calibrated (with an open gate their content changes it).
    """
    layers = {
        name: module for name, module in model.named_modules()
        if isinstance(module, TransformedConv2d) and module.qk_init == "mimetic"
        and module.query is not None
    }  # fmt: skip
    gains: dict[str, float] = {}

    def calibrate(name: str, layer: TransformedConv2d, inputs: torch.Tensor) -> None:
        if name not in gains:  # a layer used twice is calibrated on its first input
            gains[name] = layer.calibrate_mimetic(inputs.detach(), logit_std)

    hooks = [
        layer.register_forward_pre_hook(
            lambda module, args, name=name: calibrate(name, module, args[0])
        )
        for name, layer in layers.items()
    ]
    try:
        with evaluating(model), torch.no_grad():
            model(images)
    finally:
        for hook in hooks:
            hook.remove()
    return gains


def transform_checkpoint(
    checkpoint: Mapping[str, Any],
    layers: str | Sequence[str] = LATE,
    spread: float = 4.0,
    content: bool | str | Sequence[str] = True,
    qk_dim: int | None = None,
    content_heads: int = 1,
    preset: str | None = None,
    gate: str | None = None,
    opening: float | None = None,
    qk_init: str | None = None,
    content_weight_decay: bool | None = None,
    images: torch.Tensor | None = None,
) -> dict[str, Any]:
    """The checkpoint (``attnconv.models.checkpoint`` format) of the transform of the model in
    ``checkpoint`` (``architecture``, ``arguments``, ``model`` weights, ``dataset``; a checkpoint
    from ``load_checkpoint`` or a shipped model's): architecture ``"transformed"``, arguments
    that rebuild it, its weights, the same dataset, and ``preset`` (default: the original's).
    ``content``: ``True``, ``False``, or a selection as ``layers`` takes one (``LATE``,
    patterns) of the transformed layers that get content attention. ``gate``, ``opening``,
    ``qk_init`` and ``content_weight_decay`` (default: ``CONTENT_START``'s) say how the
    content path starts and trains; ``images`` ``(B, C, H, W)``, real inputs of the network,
    calibrate mimetic queries and keys (``calibrate_content``). Query and key weights draw
    from torch's global generator."""
    from attnconv.models.checkpoint import rebuild

    if checkpoint["architecture"] == "transformed":
        raise ValueError("the checkpoint already holds a transformed network")
    base, arguments = checkpoint["architecture"], dict(checkpoint["arguments"])
    network = rebuild(base, arguments, checkpoint["model"], "the checkpoint to transform").eval()
    names = select_layers(network, layers)
    if not isinstance(content, bool):  # patterns: the transformed layers they name
        content = [name for name in select_layers(network, content) if name in names]
    start = _content_start(gate, opening, qk_init)
    if content_weight_decay is None:
        content_weight_decay = CONTENT_START["content_weight_decay"]
    model = TransformedNetwork.from_network(
        base, arguments, network, names, spread, content, qk_dim, content_heads, **start,
        content_weight_decay=content_weight_decay,
    )  # fmt: skip
    if images is not None and start["qk_init"] == "mimetic":
        calibrate_content(model, images.to(next(model.parameters())))
    return {
        "preset": preset or checkpoint["preset"],
        "dataset": checkpoint["dataset"],
        "architecture": "transformed",
        "arguments": {
            "base": base,
            "base_arguments": arguments,
            "layers": names,
            "spread": float(spread),
            "content": content,
            "qk_dim": qk_dim,
            "content_heads": content_heads,
            **start,
            "content_weight_decay": bool(content_weight_decay),
        },
        "model": model.state_dict(),
    }


def choose_spread(
    accuracy: Callable[[float], float],
    baseline: float,
    tolerance: float = 0.1,
    candidates: Sequence[float] = SPREAD_CANDIDATES,
) -> tuple[float, dict[float, float]]:
    """The smallest spread of ``candidates`` whose ``accuracy(spread)`` (in %, e.g. on a
    validation split) is within ``tolerance`` points of ``baseline`` (the original network's),
    and every accuracy measured; the candidates are tried in increasing order until one keeps it.
    ValueError if none does (the largest candidate's accuracy is in the message)."""
    measured: dict[float, float] = {}
    for spread in sorted(candidates):
        measured[spread] = accuracy(spread)
        if measured[spread] >= baseline - tolerance:
            return spread, measured
    largest = max(measured)
    raise ValueError(
        f"no spread keeps the accuracy within {tolerance} points of {baseline:.2f}% (spread "
        f"{largest:g}: {measured[largest]:.2f}%); give larger candidates or a spread"
    )


def choose_opening(
    accuracy: Callable[[float], float],
    baseline: float,
    tolerance: float = 0.1,
    candidates: Sequence[float] = OPENING_CANDIDATES,
) -> tuple[float, dict[float, float]]:
    """The largest gate opening of ``candidates`` whose ``accuracy(opening)`` (in %, e.g. on a
    validation split) is within ``tolerance`` points of ``baseline`` (the CNN's), and every
    accuracy measured; tried in decreasing order until one keeps it. ValueError if none does
    (the smallest candidate's accuracy is in the message): an open content path that starts
    informative perturbs the CNN, so the opening is chosen as the spread is."""
    measured: dict[float, float] = {}
    for opening in sorted(candidates, reverse=True):
        measured[opening] = accuracy(opening)
        if measured[opening] >= baseline - tolerance:
            return opening, measured
    smallest = min(measured)
    raise ValueError(
        f"no gate opening keeps the accuracy within {tolerance} points of {baseline:.2f}% "
        f"(opening {smallest:g}: {measured[smallest]:.2f}%); give smaller candidates or an opening"
    )

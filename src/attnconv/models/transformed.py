"""``TransformedNetwork``: a network of ``MODELS`` whose chosen convolutions are attention.

The model a checkpoint of a transformed CNN holds (docs/transform.md): the base network, built
as ``BASES[base](**base_arguments)``, with the ``Conv2d`` at each name of ``layers`` replaced by
a ``TransformedConv2d`` of its shape. The checkpoint's
architecture is ``"transformed"`` and its arguments are this class's constructor arguments (plain
values), so the model is rebuilt without the transform itself (``attnconv.convert.transform``
makes it once, from a trained network, and chooses the spread). ``state_dict`` keys are the base
network's under ``network.``, with each transformed layer's ``weight``, ``bias``,
``position.centers``, ``position.spread`` and, with content, ``query``, ``key`` and ``gate``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from attnconv.attention.transformed import TransformedConv2d
from attnconv.models.resnet import ResNet
from attnconv.models.transformer import ImageTransformer
from attnconv.models.vit import VisionTransformer

BASES: dict[str, type[nn.Module]] = {
    "image_transformer": ImageTransformer,
    "resnet18": ResNet,
    "vision_transformer": VisionTransformer,
}
"""The architectures a network can be transformed from: every other entry of
``attnconv.models.MODELS``, under the same names."""


def _submodule_parent(network: nn.Module, name: str) -> tuple[nn.Module, str]:
    *path, leaf = name.split(".")
    parent = network
    for part in path:
        parent = getattr(parent, part)
    return parent, leaf


class TransformedNetwork(nn.Module):
    """``BASES[base](**base_arguments)`` with the convolutions named in ``layers`` transformed.

    Args:
        base: a key of ``BASES`` (an architecture of ``attnconv.models.MODELS``).
        base_arguments: every constructor argument of the base network.
        layers: qualified names of ``nn.Conv2d`` modules of the base network (e.g.
            ``"stages.3.0.conv1"``), each becoming a ``TransformedConv2d``.
        spread: the heads' inverse standard deviation at the transform (1/pixels); trained after.
        content: give the transformed layers gated content attention: ``True`` (all), ``False``
            (none: Gaussian heads only), or the names of the layers that get it (a subset of
            ``layers``; content over a large grid costs ``N²`` per channel).
        qk_dim: query/key width of each content attention (default: see ``TransformedConv2d``).
        content_heads: content attention maps per layer (1: one map mixed into every head;
            the layer's number of heads: ConViT's, one per head).
        gate, opening, qk_init: how each content path is gated and starts (``TransformedConv2d``;
            the defaults are the first form's, which older checkpoints hold).
        content_weight_decay: whether weight decay applies to the queries and keys (False: they
            join the head geometry and gates among ``no_weight_decay_parameters``).

    Input and output are the base network's (``(B, C, H, W)`` images → logits).
    """

    def __init__(
        self,
        base: str,
        base_arguments: Mapping[str, Any],
        layers: Sequence[str],
        spread: float = 4.0,
        content: bool | Sequence[str] = True,
        qk_dim: int | None = None,
        content_heads: int = 1,
        gate: str = "clamp",
        opening: float = 0.0,
        qk_init: str = "default",
        content_weight_decay: bool = True,
    ) -> None:
        super().__init__()
        if base not in BASES:
            raise ValueError(f"base must be one of {', '.join(BASES)}, got {base!r}")
        if isinstance(layers, str) or not layers:
            raise ValueError(f"layers must be a non-empty list of module names, got {layers!r}")
        self.base, self.base_arguments = base, dict(base_arguments)
        self.layer_names = list(layers)
        if isinstance(content, str) or not (
            isinstance(content, bool) or set(content) <= set(self.layer_names)
        ):
            raise ValueError(
                f"content must be True, False or a list of names from layers, got {content!r}"
            )
        with_content = set(self.layer_names) if content is True else set(content or ())
        self.spread, self.content, self.qk_dim = float(spread), content, qk_dim
        self.content_heads = content_heads
        self.content_start = {"gate": gate, "opening": opening, "qk_init": qk_init}
        self.content_weight_decay = bool(content_weight_decay)
        self.network = BASES[base](**self.base_arguments)
        modules = dict(self.network.named_modules())
        for name in self.layer_names:
            conv = modules.get(name)
            if type(conv) is not nn.Conv2d:
                found = "no module" if conv is None else f"a {type(conv).__name__}"
                raise ValueError(
                    f"layer {name!r} of the {base!r} network is {found}, expected an nn.Conv2d"
                )
            parent, leaf = _submodule_parent(self.network, name)
            layer = TransformedConv2d.from_conv(
                conv, spread, name in with_content, qk_dim, content_heads, **self.content_start
            )
            setattr(parent, leaf, layer)

    @classmethod
    def from_network(
        cls,
        base: str,
        base_arguments: Mapping[str, Any],
        network: nn.Module,
        layers: Sequence[str],
        spread: float = 4.0,
        content: bool | Sequence[str] = True,
        qk_dim: int | None = None,
        content_heads: int = 1,
        gate: str = "clamp",
        opening: float = 0.0,
        qk_init: str = "default",
        content_weight_decay: bool = True,
    ) -> TransformedNetwork:
        """The transform of a trained ``network`` (built as ``BASES[base](**base_arguments)``):
        its weights, buffers and convolution kernels copied in, each transformed layer's heads on
        its kernel's taps with inverse std ``spread`` and its content gates at ``opening`` (at
        zero it computes ``network``'s function blurred by the finite spread). On ``network``'s
        device and dtype, in train mode. Queries and keys draw from torch's global generator."""
        model = cls(
            base, base_arguments, layers, spread, content, qk_dim, content_heads, gate, opening,
            qk_init, content_weight_decay,
        )  # fmt: skip
        weights = network.state_dict()
        own = {
            f"network.{key}": value
            for key, value in weights.items()
            if not any(key.startswith(f"{name}.") for name in model.layer_names)
        }
        parameter = next(network.parameters())
        model.to(device=parameter.device, dtype=parameter.dtype)
        missing, unexpected = model.load_state_dict(own, strict=False)
        expected_missing = {
            f"network.{name}.{key}"
            for name, layer in model.transformed_layers().items()
            for key in layer.state_dict()
        }
        if unexpected or set(missing) != expected_missing:
            raise ValueError(
                f"the network's weights do not fit a {base!r} model built from base_arguments "
                f"(missing: {sorted(set(missing) - expected_missing)[:3]}, unexpected: "
                f"{sorted(unexpected)[:3]})"
            )
        modules = dict(network.named_modules())
        with torch.no_grad():
            for name, layer in model.transformed_layers().items():
                layer.weight.copy_(modules[name].weight)
                if layer.bias is not None:
                    layer.bias.copy_(modules[name].bias)
        return model

    def transformed_layers(self) -> dict[str, TransformedConv2d]:
        """Name in the base network → its transformed layer, in network order."""
        return {
            name: module
            for name, module in self.network.named_modules()
            if isinstance(module, TransformedConv2d)
        }

    def transform_parameters(self) -> list[str]:
        """Names of the parameters the transform added or freed: each transformed layer's head
        geometry (centres, spreads), content gates, queries and keys (not its kernel and bias,
        the CNN's own weights); ``TrainConfig.attention_lr_scale`` multiplies their rate."""
        names = []
        for name, layer in self.transformed_layers().items():
            own = ("position.centers", "position.spread", "gate", "query", "key")
            names += [
                f"network.{name}.{key}"
                for key, _ in layer.named_parameters()
                if key.startswith(own)
            ]
        return names

    def extra_repr(self) -> str:
        return (
            f"base={self.base!r}, layers={len(self.layer_names)}, spread={self.spread:g}, "
            f"content={self.content if isinstance(self.content, bool) else len(self.content)}"
        )

    @property
    def normalize(self) -> nn.Module:
        """The base network's input normalisation (its mean and std travel with the weights)."""
        return self.network.normalize

    @property
    def num_classes(self) -> int:
        return self.network.num_classes

    @property
    def in_channels(self) -> int:
        return self.network.in_channels

    @property
    def image_size(self) -> tuple[int, int]:
        return self.network.image_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x (B, in_channels, H, W)`` in ``[0, 1]`` → the base network's output (logits)."""
        return self.network(x)

    def no_weight_decay_parameters(self, rule: str = "original") -> set[str]:
        """The base network's exemptions under ``rule`` (``models/decay.py``), and under every
        rule the transformed layers' head geometry (centres, spreads) and content gates, which
        have no preferred size (decay would pull the gates toward their start and the centres
        toward the centre tap); with ``content_weight_decay=False`` also the queries and keys
        (decay alone shrank them by x0.58 over ``tcnn-fashion-small``'s 20 epochs)."""
        exempt = {f"network.{name}" for name in self.network.no_weight_decay_parameters(rule)}
        for name, layer in self.transformed_layers().items():
            prefix = f"network.{name}."
            exempt |= {prefix + "position.centers", prefix + "position.spread"}
            if layer.gate is not None:
                exempt.add(prefix + "gate")
                if not self.content_weight_decay:
                    exempt |= {
                        f"{prefix}{key}" for key, _ in layer.named_parameters()
                        if key.startswith(("query.", "key."))
                    }  # fmt: skip
        return exempt

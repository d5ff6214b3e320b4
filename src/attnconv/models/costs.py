"""Every preset's size and cost for ``attnconv models``, without building a model.

``count_macs`` runs a forward pass on the meta device: no arithmetic, but the meta kernels and
``FlopCounterMode`` import ``torch._dynamo`` (about 1.2 s of CPU, as much again as importing torch)
and each model is built. ``COUNTED`` holds what they gave for every preset at 10 classes, each with
a fingerprint of the constructor arguments it was counted for; ``preset_cost`` answers from it when
the preset's arguments still match and counts on the meta device otherwise (another class count,
or a preset edited since). ``tests/test_models_presets.py`` counts every preset again and says
which entry to replace when the counts or a fingerprint no longer agree.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from attnconv.models.presets import preset_arguments

# preset -> (fingerprint of its architecture and arguments, parameters, multiply-adds per image)
COUNTED: dict[str, tuple[str, int, int]] = {
    "quadratic": ("afff57c5e8c9e176", 12086844, 3264925600),
    "quadratic-generalized": ("cdc2c990cf3863cc", 12087006, 4503556432),
    "quadratic-generalized-pruned": ("cdc2c990cf3863cc", 12087006, 4503556432),
    "many-heads": ("a870ef675e2eed25", 18806970, 5122871200),
    "learned": ("f5a56033f32d4aa5", 12259482, 3266286400),
    "learned-content": ("ce68be25322cc9f0", 29582682, 10344174400),
    "resnet18": ("4fa1c9222fcac510", 11173962, 555422720),
    "quick": ("3f2b644f0f0f1a50", 80096, 5280384),
    "quadratic-fashion": ("858630751afad4d1", 232758, 57652864),
    "learned-fashion": ("c65926abc90e26e3", 241866, 57715072),
    "learned-content-fashion": ("a19d076d74ce312c", 236682, 88443712),
    "resnet-fashion": ("7e24e834783c8956", 701178, 28573184),
    "resnet-fashion-small": ("0c83e0f16ee12478", 222805, 9068832),
    "tcnn-fashion-small": ("3c0ba3f3c24d3b8c", 233793, 13453915),
    "tcnn-full-fashion-small": ("e7494c0e68c23c46", 234036, 22169578),
    "resnet-fashion-small-continued": ("0c83e0f16ee12478", 222805, 9068832),
    "vit-fashion": ("b3e20f75964524b5", 230410, 86052480),
    "quadratic-anywhere": ("48c659bb5f0e7366", 232758, 77660800),
    "learned-anywhere": ("a6389c2e01a521f7", 242890, 77732224),
    "learned-content-anywhere": ("9e99557362572f1e", 236938, 132483136),
    "vit-anywhere": ("df7be817b9f7c71d", 234250, 130089600),
    "resnet-anywhere-small": ("65e56d8e00ecd6f9", 222805, 11032272),
}


@dataclass(frozen=True)
class PresetCost:
    """``parameters``: scalar parameters; ``macs``: multiply-adds of one eval-mode forward on one
    image (``count_macs``); ``input_size``: the image the preset is sized for, ``(H, W, C)`` in
    pixels and channels."""

    parameters: int
    macs: int
    input_size: tuple[int, int, int]


def fingerprint(architecture: str, arguments: dict[str, Any]) -> str:
    """16 hex digits of the SHA-256 of ``repr((architecture, arguments))``: which model a count
    is of."""
    return hashlib.sha256(repr((architecture, arguments)).encode()).hexdigest()[:16]


def measure_cost(name: str, num_classes: int = 10) -> tuple[int, int]:
    """``(parameters, multiply-adds per image)`` of preset ``name``, built on the meta device
    (shapes only) and counted by ``count_macs``."""
    import torch

    from attnconv.models.complexity import count_macs, count_parameters
    from attnconv.models.factory import create_model

    with torch.device("meta"):
        model = create_model(name, num_classes=num_classes)
    return count_parameters(model), count_macs(model)


def preset_cost(name: str, num_classes: int = 10) -> PresetCost:
    """Size and cost of preset ``name`` with ``num_classes`` outputs: from ``COUNTED`` when it
    holds this model, else measured (``measure_cost``). UserError for an unknown preset."""
    architecture, arguments = preset_arguments(name, num_classes)
    counted = COUNTED.get(name)
    if counted is not None and counted[0] == fingerprint(architecture, arguments):
        parameters, macs = counted[1:]
    else:
        parameters, macs = measure_cost(name, num_classes)
    images = arguments.get("base_arguments", arguments)  # a transformed network's are its base's
    height, width = images["image_size"]
    return PresetCost(parameters, macs, (height, width, images["in_channels"]))

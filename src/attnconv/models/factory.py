"""``create_model``: a preset's model, freshly initialised or with the weights shipped for it."""

from __future__ import annotations

from typing import Any

from torch import nn

from attnconv.errors import UserError
from attnconv.models.presets import MODELS, preset_arguments
from attnconv.models.pretrained import load_pretrained, pretrained_info


def create_model(
    name: str, num_classes: int = 10, pretrained: bool = False, **overrides: Any
) -> nn.Module:
    """Build the model of preset ``name`` with ``num_classes`` outputs.

    ``overrides`` replace the preset's constructor arguments (e.g. ``in_channels``,
    ``image_size``, ``mean``, ``std``, ``hidden``, ``heads``). Unknown preset names or override
    keys raise a UserError (a ValueError) listing the valid ones.

    ``pretrained=True`` returns the trained model shipped with the package under that name
    (``attnconv.models.pretrained``), in eval mode; it takes no overrides and its own number of
    classes.
    """
    if pretrained:
        info = pretrained_info(name)
        # a transformed network's classes are its base network's
        classes = info.arguments.get("base_arguments", info.arguments)["num_classes"]
        if overrides or num_classes != classes:
            raise UserError(
                f"pretrained model {name!r} is built as it was trained ({classes} classes); "
                f"build it without overrides, or fine-tune it for other settings"
            )
        return load_pretrained(name)
    architecture, arguments = preset_arguments(name, num_classes, **overrides)
    return MODELS[architecture](**arguments)

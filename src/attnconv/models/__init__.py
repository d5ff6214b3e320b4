"""The paper's models (image transformer, CIFAR ResNet-18), presets and head analysis."""

from attnconv.models.complexity import count_macs, count_parameters
from attnconv.models.factory import create_model
from attnconv.models.presets import MODELS, PRESETS, Preset, Recipe
from attnconv.models.resnet import ResNet, resnet18
from attnconv.models.transformer import ImageTransformer

__all__ = [
    "MODELS",
    "PRESETS",
    "ImageTransformer",
    "Preset",
    "Recipe",
    "ResNet",
    "count_macs",
    "count_parameters",
    "create_model",
    "resnet18",
]

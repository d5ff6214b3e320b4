"""ResNet-18, CIFAR variant: 3×3 stride-1 stem, no max-pool (the paper's convolutional baseline)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from attnconv.data.statistics import CIFAR10_MEAN, CIFAR10_STD
from attnconv.models.decay import exempt_names
from attnconv.models.normalize import Normalize, check_images


class BasicBlock(nn.Module):
    """Two 3×3 conv-BN layers with an identity (or 1×1 conv-BN projection) shortcut.

    ``(B, in_planes, H, W) -> (B, planes, ceil(H / stride), ceil(W / stride))``.
    """

    def __init__(self, in_planes: int, planes: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False),
                nn.BatchNorm2d(planes),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    """CIFAR ResNet: normalise, 3×3 conv stem (stride 1), four stages of ``BasicBlock``s with
    widths ``widths`` (stride 1, 2, 2, 2), global average pooling, linear classifier.

    Input: float images ``(B, in_channels, H, W)`` in ``[0, 1]``, any ``H, W >= 1``.
    Output: logits ``(B, num_classes)``. ``image_size`` is the default input ``(H, W)``, used
    by complexity counts.
    """

    def __init__(
        self,
        num_classes: int = 10,
        in_channels: int = 3,
        image_size: tuple[int, int] = (32, 32),
        mean: Sequence[float] = CIFAR10_MEAN,
        std: Sequence[float] = CIFAR10_STD,
        blocks: Sequence[int] = (2, 2, 2, 2),
        widths: Sequence[int] = (64, 128, 256, 512),
    ) -> None:
        super().__init__()
        if len(blocks) != len(widths) or len(blocks) == 0:
            raise ValueError(
                f"blocks and widths must have the same nonzero length, got {tuple(blocks)} "
                f"and {tuple(widths)}"
            )
        self.num_classes = num_classes
        self.in_channels = in_channels
        self.image_size = (int(image_size[0]), int(image_size[1]))
        self.normalize = Normalize(mean, std, in_channels)
        self.conv1 = nn.Conv2d(in_channels, widths[0], 3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        stages = []
        in_planes = widths[0]
        for index, (count, planes) in enumerate(zip(blocks, widths, strict=True)):
            stride = 1 if index == 0 else 2
            layers = []
            for block in range(count):
                layers.append(BasicBlock(in_planes, planes, stride if block == 0 else 1))
                in_planes = planes
            stages.append(nn.Sequential(*layers))
        self.stages = nn.Sequential(*stages)
        self.classifier = nn.Linear(in_planes, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x``: ``(B, in_channels, H, W)`` in ``[0, 1]`` -> logits ``(B, num_classes)``."""
        check_images(x, self.in_channels, "ResNet")
        x = F.relu(self.bn1(self.conv1(self.normalize(x))))
        x = self.stages(x)
        return self.classifier(x.mean(dim=(2, 3)))

    def no_weight_decay_parameters(self, rule: str = "original") -> set[str]:
        """Names of parameters trained without weight decay under ``rule`` (``models/decay.py``):
        none under ``"original"`` (the paper's code decays every ResNet parameter), batch-norm
        scales/shifts and biases under ``"norms-biases-positional"``."""
        return exempt_names(self, rule, positional=set(), geometry=set())


def resnet18(num_classes: int = 10, **kwargs) -> ResNet:
    """The CIFAR ResNet-18 (BasicBlocks [2, 2, 2, 2], widths 64..512): 11.17M parameters for
    10 classes. ``kwargs`` go to [`ResNet`][]."""
    return ResNet(
        num_classes=num_classes, blocks=(2, 2, 2, 2), widths=(64, 128, 256, 512), **kwargs
    )

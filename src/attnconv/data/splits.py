"""The containers every dataset is returned in, and the train/validation carve.

A split is an ``ImageSet``: all its images in one ``uint8`` tensor ``(N, C, H, W)`` (values
0..255) and its labels in one ``int64`` tensor ``(N,)``. ``DataSplits`` bundles the three splits
of a dataset with what a model needs to know about it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnconv.data.anywhere import Placement
from attnconv.errors import UserError


@dataclass
class ImageSet:
    """One split: ``images`` uint8 ``(N, C, H, W)`` in 0..255, ``labels`` int64 ``(N,)``."""

    images: torch.Tensor
    labels: torch.Tensor

    def __post_init__(self) -> None:
        if not isinstance(self.images, torch.Tensor) or self.images.dtype != torch.uint8:
            raise TypeError(f"ImageSet.images must be a uint8 tensor, got {_describe(self.images)}")
        if not isinstance(self.labels, torch.Tensor) or self.labels.dtype != torch.int64:
            raise TypeError(
                f"ImageSet.labels must be an int64 tensor, got {_describe(self.labels)}"
            )
        if self.images.dim() != 4:
            raise ValueError(
                f"ImageSet.images must have shape (N, C, H, W), got {tuple(self.images.shape)}"
            )
        if self.labels.shape != (self.images.shape[0],):
            raise ValueError(
                f"ImageSet.labels must have shape ({self.images.shape[0]},) to match "
                f"{self.images.shape[0]} images, got {tuple(self.labels.shape)}"
            )

    def __len__(self) -> int:
        return self.images.shape[0]

    def subset(self, indices: torch.Tensor) -> ImageSet:
        """The images at ``indices`` (int64 ``(M,)``), in that order."""
        return ImageSet(self.images[indices], self.labels[indices])


@dataclass
class DataSplits:
    """A dataset's three splits and its description.

    ``mean``/``std`` are per channel on the [0, 1] scale; ``flip`` says whether horizontal flips
    are a valid augmentation; ``image_size`` is ``(H, W)``, the size a model sees. ``placement``
    (``attnconv.data.anywhere.Placement``): the training split holds the images unplaced, at their
    source size, and the training loader places each on a canvas of ``image_size`` as it draws it;
    ``None``: every split holds the images as a model sees them.
    """

    name: str
    train: ImageSet
    val: ImageSet
    test: ImageSet
    num_classes: int
    channels: int
    image_size: tuple[int, int]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    flip: bool
    classes: list[str]
    placement: Placement | None = None


def _describe(value: object) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor"
    return type(value).__name__


def validation_count(val_size: int | float, num_train: int) -> int:
    """How many of ``num_train`` images ``val_size`` (a count, or a fraction in [0, 1)) means."""
    if isinstance(val_size, bool) or not isinstance(val_size, (int, float)):
        raise TypeError(
            f"val_size must be an int count or a float fraction, got {type(val_size).__name__}"
        )
    if isinstance(val_size, float):
        if not 0.0 <= val_size < 1.0:
            raise UserError(f"val_size as a fraction must be in [0, 1), got {val_size}")
        return round(val_size * num_train)
    if not 0 <= val_size < num_train:
        raise UserError(
            f"val_size as a count must be in [0, {num_train}) for {num_train} training images, "
            f"got {val_size}"
        )
    return val_size


def validation_indices(
    num_train: int, val_size: int | float, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The indices int64 (increasing) of the images that stay in training and of the
    ``val_size`` ones that go to validation, out of ``num_train``: a random subset drawn by a
    permutation seeded with ``seed``."""
    count = validation_count(val_size, num_train)
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(num_train, generator=generator)
    return order[count:].sort().values, order[:count].sort().values


def carve_validation(
    train: ImageSet, val_size: int | float, seed: int
) -> tuple[ImageSet, ImageSet]:
    """Split ``train`` into (train, val) with a random subset of ``val_size`` images
    (``validation_indices``); both parts keep the original order of their images."""
    train_idx, val_idx = validation_indices(len(train), val_size, seed)
    return train.subset(train_idx), train.subset(val_idx)


def channel_stats(images: torch.Tensor) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and (population) standard deviation of uint8 ``images`` (N, C, H, W).

    Both are on the [0, 1] scale. Computed exactly from each channel's 256-bin histogram, so no
    float copy of the images is made.
    """
    levels = torch.arange(256, dtype=torch.float64) / 255.0
    means, stds = [], []
    for channel in range(images.shape[1]):
        counts = torch.bincount(images[:, channel].reshape(-1), minlength=256).double()
        weights = counts / counts.sum()
        mean = (weights * levels).sum()
        var = (weights * (levels - mean) ** 2).sum()
        means.append(mean.item())
        stds.append(var.sqrt().item())
    return tuple(means), tuple(stds)

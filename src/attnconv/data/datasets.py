"""``load_splits``: any supported dataset as train / validation / test ``ImageSet``s.

| name                     | images             | classes | val_size | flip | mean/std              |
|--------------------------|--------------------|---------|----------|------|-----------------------|
| `cifar10`                | 50000+10000, 3×32² | 10      | 5000     | yes  | the paper's values    |
| `cifar100`               | 50000+10000, 3×32² | 100     | 5000     | yes  | train split           |
| `fashion-mnist`          | 60000+10000, 1×28² | 10      | 5000     | yes  | train split           |
| `digits`                 | 1438+359, 1×8²     | 10      | 10%      | no   | train split           |
| `fashion-mnist-anywhere` | 60000+10000, 1×32² | 10      | 5000     | yes  | fixed (statistics.py) |

(val_size: the default.)

``fashion-mnist-anywhere`` (``anywhere.py``): Fashion-MNIST's garments rescaled to 16..24 pixels
and placed anywhere on a 32×32 canvas. Its training split holds the 28×28 garments unplaced
(``DataSplits.placement``): the training loader places them anew every epoch. Validation and test
are placed once, by a fixed seed: a validation image keeps the placement of its index in the
official training set, so the bytes depend on nothing but the carve.

The validation split is carved from the official training set by a permutation seeded with
``seed``; the test set is never touched (digits has no official test set: see ``digits.py``).
For CIFAR-10 the normalisation is the paper's (``attnconv.data.statistics.CIFAR10_MEAN``/``STD``),
for ``fashion-mnist-anywhere`` the fixed values of ``statistics.py``; for the others it is each
channel's mean and population std over the training split actually returned (after the
validation carve), on the [0, 1] scale.

Files live under ``data_dir``; by default ``$ATTNCONV_DATA``, else ``~/.cache/attnconv``.
"""

from __future__ import annotations

import os
from pathlib import Path

from attnconv.data.anywhere import Placement, fixed_placements, place
from attnconv.data.cifar import load_cifar
from attnconv.data.digits import load_digits_sets
from attnconv.data.fashion_mnist import load_fashion_mnist
from attnconv.data.splits import (
    DataSplits,
    ImageSet,
    carve_validation,
    channel_stats,
    validation_indices,
)
from attnconv.data.statistics import (
    CIFAR10_MEAN,
    CIFAR10_STD,
    FASHION_MNIST_ANYWHERE_MEAN,
    FASHION_MNIST_ANYWHERE_STD,
)
from attnconv.errors import UserError

DATASETS: tuple[str, ...] = (
    "cifar10", "cifar100", "fashion-mnist", "digits", "fashion-mnist-anywhere"
)  # fmt: skip

DEFAULT_VAL_SIZE: dict[str, int | float] = {
    "cifar10": 5000,
    "cifar100": 5000,
    "fashion-mnist": 5000,
    "digits": 0.1,
    "fashion-mnist-anywhere": 5000,
}
# Datasets whose training images a loader places (``DataSplits.placement``); the random crop is
# off for them (``pad=0``): the placement already moves every image.
PLACED_DATASETS: tuple[str, ...] = ("fashion-mnist-anywhere",)


def default_data_dir() -> Path:
    """``$ATTNCONV_DATA`` if set, else ``~/.cache/attnconv``."""
    return Path(os.environ.get("ATTNCONV_DATA") or Path.home() / ".cache" / "attnconv")


def _load_official(
    name: str, data_dir: Path, download: bool
) -> tuple[ImageSet, ImageSet, list[str]]:
    if name in ("cifar10", "cifar100"):
        return load_cifar(name, data_dir, download)
    if name in ("fashion-mnist", "fashion-mnist-anywhere"):
        return load_fashion_mnist(data_dir, download)
    return load_digits_sets()


def load_splits(
    name: str,
    data_dir: str | Path | None = None,
    val_size: int | float | None = None,
    seed: int = 0,
    download: bool = True,
) -> DataSplits:
    """Load dataset ``name`` (one of ``DATASETS``) as train / val / test splits.

    ``val_size``: images moved from the training set to validation, as a count or a fraction in
    [0, 1); ``None`` means the dataset's default (``DEFAULT_VAL_SIZE``). ``seed`` picks which
    ones. ``download``: fetch missing files from the canonical address (MD5-checked).
    """
    if name not in DATASETS:
        raise UserError(f"unknown dataset {name!r}; expected one of {', '.join(DATASETS)}")
    data_dir = default_data_dir() if data_dir is None else Path(data_dir)
    official_train, test, classes = _load_official(name, data_dir, download)
    if name in PLACED_DATASETS:
        return _placed_splits(name, official_train, test, classes, val_size, seed)
    train, val = carve_validation(
        official_train, DEFAULT_VAL_SIZE[name] if val_size is None else val_size, seed
    )
    if name == "cifar10":
        mean, std = CIFAR10_MEAN, CIFAR10_STD
    else:
        mean, std = channel_stats(train.images)
    _, channels, height, width = train.images.shape
    return DataSplits(
        name=name,
        train=train,
        val=val,
        test=test,
        num_classes=len(classes),
        channels=channels,
        image_size=(height, width),
        mean=mean,
        std=std,
        flip=name != "digits",
        classes=classes,
    )


def _placed_splits(
    name: str,
    official_train: ImageSet,
    test: ImageSet,
    classes: list[str],
    val_size: int | float | None,
    seed: int,
) -> DataSplits:
    """``fashion-mnist-anywhere``'s splits (``anywhere.py``): training unplaced, validation and
    test placed by their fixed placements."""
    placement = Placement()
    train_idx, val_idx = validation_indices(
        len(official_train), DEFAULT_VAL_SIZE[name] if val_size is None else val_size, seed
    )
    sizes, corners = fixed_placements(len(official_train), "train", placement)
    val = ImageSet(
        place(official_train.images[val_idx], sizes[val_idx], corners[val_idx]),
        official_train.labels[val_idx],
    )
    test_sizes, test_corners = fixed_placements(len(test), "test", placement)
    placed_test = ImageSet(place(test.images, test_sizes, test_corners), test.labels)
    return DataSplits(
        name=name,
        train=official_train.subset(train_idx),
        val=val,
        test=placed_test,
        num_classes=len(classes),
        channels=official_train.images.shape[1],
        image_size=(placement.canvas, placement.canvas),
        mean=FASHION_MNIST_ANYWHERE_MEAN,
        std=FASHION_MNIST_ANYWHERE_STD,
        flip=True,
        classes=classes,
        placement=placement,
    )

"""``load_splits``: any supported dataset as train / validation / test ``ImageSet``s.

| name            | images             | classes | default val_size | flip | mean/std                 |
|-----------------|--------------------|---------|------------------|------|--------------------------|
| `cifar10`       | 50000+10000, 3×32² | 10      | 5000             | yes  | the paper's fixed values |
| `cifar100`      | 50000+10000, 3×32² | 100     | 5000             | yes  | train split              |
| `fashion-mnist` | 60000+10000, 1×28² | 10      | 5000             | yes  | train split              |
| `digits`        | 1438+359, 1×8²     | 10      | 10%              | no   | train split              |

The validation split is carved from the official training set by a permutation seeded with
``seed``; the test set is never touched (digits has no official test set: see ``digits.py``).
For CIFAR-10 the normalisation is the paper's (``attnconv.data.statistics.CIFAR10_MEAN``/``STD``); for the others it is each channel's mean and population std over the training split
actually returned (after the validation carve), on the [0, 1] scale.

Files live under ``data_dir``; by default ``$ATTNCONV_DATA``, else ``~/.cache/attnconv``.
"""

from __future__ import annotations

import os
from pathlib import Path

from attnconv.data.cifar import load_cifar
from attnconv.data.digits import load_digits_sets
from attnconv.data.fashion_mnist import load_fashion_mnist
from attnconv.data.splits import DataSplits, ImageSet, carve_validation, channel_stats
from attnconv.data.statistics import CIFAR10_MEAN, CIFAR10_STD
from attnconv.errors import UserError

DATASETS: tuple[str, ...] = ("cifar10", "cifar100", "fashion-mnist", "digits")

DEFAULT_VAL_SIZE: dict[str, int | float] = {
    "cifar10": 5000,
    "cifar100": 5000,
    "fashion-mnist": 5000,
    "digits": 0.1,
}


def default_data_dir() -> Path:
    """``$ATTNCONV_DATA`` if set, else ``~/.cache/attnconv``."""
    return Path(os.environ.get("ATTNCONV_DATA") or Path.home() / ".cache" / "attnconv")


def _load_official(
    name: str, data_dir: Path, download: bool
) -> tuple[ImageSet, ImageSet, list[str]]:
    if name in ("cifar10", "cifar100"):
        return load_cifar(name, data_dir, download)
    if name == "fashion-mnist":
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

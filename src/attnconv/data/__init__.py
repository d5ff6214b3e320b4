"""Datasets as on-device uint8 tensors, and batched augmentation.

``load_splits(name)`` returns a ``DataSplits`` (train / val / test ``ImageSet``s plus what a model
needs: classes, channels, image size, normalisation, whether flips are allowed) for any name in
``DATASETS``; ``BatchLoader`` turns one split into reproducible float batches on the device.
"""

from attnconv.data.datasets import DATASETS, load_splits
from attnconv.data.download import DownloadError
from attnconv.data.loader import BatchLoader, random_crop_flip
from attnconv.data.splits import DataSplits, ImageSet

__all__ = [
    "DATASETS",
    "BatchLoader",
    "DataSplits",
    "DownloadError",
    "ImageSet",
    "load_splits",
    "random_crop_flip",
]

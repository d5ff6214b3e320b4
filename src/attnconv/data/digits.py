"""The 8×8 handwritten digits that ship inside scikit-learn: the zero-download dataset.

1797 grey images with values 0..16, rescaled to uint8 0..255 (``round(v * 255 / 16)``). The data
has no official test split, so a fixed 20% (359 images) is held out by a permutation seeded with
``TEST_SEED``; it is the same for every run, whatever seed the train/validation carve uses.
"""

from __future__ import annotations

import torch

from attnconv.data.splits import ImageSet

TEST_FRACTION = 0.2
TEST_SEED = 20200101
CLASSES = [str(d) for d in range(10)]


def load_digits_sets() -> tuple[ImageSet, ImageSet, list[str]]:
    """(train, test, classes) of scikit-learn's digits; images uint8 ``(N, 1, 8, 8)``."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    values = torch.as_tensor(bunch.images, dtype=torch.float64)
    images = torch.round(values * (255.0 / 16.0)).to(torch.uint8).unsqueeze(1)
    full = ImageSet(images, torch.as_tensor(bunch.target, dtype=torch.int64))
    order = torch.randperm(len(full), generator=torch.Generator().manual_seed(TEST_SEED))
    num_test = round(TEST_FRACTION * len(full))
    test_idx, train_idx = order[:num_test].sort().values, order[num_test:].sort().values
    return full.subset(train_idx), full.subset(test_idx), list(CLASSES)

"""load_splits, the validation carve, channel statistics and the embedded digits."""

from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits

from attnconv.data import DATASETS, ImageSet, load_splits
from attnconv.data.datasets import default_data_dir
from attnconv.data.splits import carve_validation, channel_stats


def rows(image_set):
    """Each (image, label) as a hashable pair, for comparing splits as sets."""
    return [
        (bytes(img.numpy()), int(label))
        for img, label in zip(image_set.images, image_set.labels, strict=True)
    ]


def test_dataset_names():
    assert DATASETS == ("cifar10", "cifar100", "fashion-mnist", "digits", "fashion-mnist-anywhere")


def test_unknown_dataset_lists_the_valid_ones():
    with pytest.raises(ValueError, match=r"unknown dataset 'mnist'; expected one of cifar10, "):
        load_splits("mnist")


def test_digits_are_sklearns_images_rescaled_and_partitioned():
    splits = load_splits("digits")
    reference = load_digits()
    expected = np.rint(reference.images * 255 / 16).astype(np.uint8)[:, None]
    everything = ImageSet(torch.from_numpy(expected), torch.from_numpy(reference.target).long())
    got = rows(splits.train) + rows(splits.val) + rows(splits.test)
    assert sorted(got) == sorted(rows(everything))
    assert (len(splits.train), len(splits.val), len(splits.test)) == (1294, 144, 359)
    assert splits.train.images.max() == 255 and splits.train.images.min() == 0
    assert (splits.channels, splits.image_size, splits.num_classes) == (1, (8, 8), 10)
    assert splits.flip is False and splits.classes == [str(d) for d in range(10)]


def test_digits_test_split_is_fixed_and_validation_follows_the_seed():
    a = load_splits("digits", seed=0)
    b = load_splits("digits", seed=1, val_size=300)
    assert rows(a.test) == rows(b.test)
    assert len(b.val) == 300 and len(b.train) == 1438 - 300
    assert sorted(rows(a.train) + rows(a.val)) == sorted(rows(b.train) + rows(b.val))
    assert set(rows(load_splits("digits", seed=0).val)) == set(rows(a.val))
    assert set(rows(a.val)) != set(rows(load_splits("digits", seed=1).val))


def test_digits_normalisation_comes_from_the_training_split():
    splits = load_splits("digits", val_size=100)
    pixels = splits.train.images.numpy().astype(np.float64) / 255
    assert splits.mean == pytest.approx((pixels.mean(),), abs=1e-12)
    assert splits.std == pytest.approx((pixels.std(),), abs=1e-12)


def test_carve_validation_is_a_seeded_partition_in_original_order():
    data = ImageSet(torch.zeros(50, 1, 2, 2, dtype=torch.uint8), torch.arange(50))
    train, val = carve_validation(data, 0.2, seed=7)
    assert len(val) == 10 and len(train) == 40
    assert sorted(train.labels.tolist() + val.labels.tolist()) == list(range(50))
    assert train.labels.tolist() == sorted(train.labels.tolist())
    assert val.labels.tolist() == sorted(val.labels.tolist())
    assert torch.equal(carve_validation(data, 10, seed=7)[1].labels, val.labels)
    assert not torch.equal(carve_validation(data, 10, seed=8)[1].labels, val.labels)
    train, val = carve_validation(data, 0, seed=7)
    assert len(val) == 0 and torch.equal(train.labels, data.labels)


@pytest.mark.parametrize(
    ("val_size", "error", "message"),
    [
        (1.0, ValueError, r"fraction must be in \[0, 1\), got 1.0"),
        (-3, ValueError, r"count must be in \[0, 1438\)"),
        (1438, ValueError, r"count must be in \[0, 1438\) for 1438 training images, got 1438"),
        (True, TypeError, "val_size must be an int count or a float fraction, got bool"),
        ("10%", TypeError, "got str"),
    ],
)
def test_bad_val_size(val_size, error, message):
    with pytest.raises(error, match=message):
        load_splits("digits", val_size=val_size)


def test_channel_stats_match_numpy():
    images = torch.randint(0, 256, (20, 3, 5, 7), dtype=torch.uint8)
    images[:, 2] = 77  # a constant channel: std 0
    mean, std = channel_stats(images)
    as_float = images.numpy().astype(np.float64) / 255
    assert np.allclose(mean, as_float.mean(axis=(0, 2, 3)), atol=1e-12)
    assert np.allclose(std, as_float.std(axis=(0, 2, 3)), atol=1e-12)
    assert std[2] == pytest.approx(0.0, abs=1e-12) and mean[2] == pytest.approx(77 / 255)


def test_default_data_dir(monkeypatch):
    monkeypatch.setenv("ATTNCONV_DATA", "/some/where")
    assert default_data_dir() == Path("/some/where")
    monkeypatch.delenv("ATTNCONV_DATA")
    assert default_data_dir() == Path.home() / ".cache" / "attnconv"

"""The dataset statistics are the data's own (to their 4 decimals), and models take them from data/."""

import pytest
import torch

from attnconv.data import load_splits, statistics
from attnconv.data.anywhere import fixed_placements, place
from attnconv.data.digits import load_digits_sets
from attnconv.data.splits import channel_stats, validation_indices
from attnconv.models import PRESETS, create_model


def rounded(values):
    return tuple(round(v, 4) for v in values)


def test_digits_statistics_are_those_of_all_the_images():
    train, test, _ = load_digits_sets()
    mean, std = channel_stats(torch.cat([train.images, test.images]))
    assert (rounded(mean), rounded(std)) == (statistics.DIGITS_MEAN, statistics.DIGITS_STD)


@pytest.mark.needs_fashion_mnist
def test_fashion_mnist_statistics_are_those_of_the_training_split():
    splits = load_splits("fashion-mnist", download=False)
    assert len(splits.train) == 55000
    assert rounded(splits.mean) == statistics.FASHION_MNIST_MEAN
    assert rounded(splits.std) == statistics.FASHION_MNIST_STD


@pytest.mark.needs_fashion_mnist
def test_fashion_mnist_anywhere_statistics_are_those_of_its_training_split_placed_once():
    splits = load_splits("fashion-mnist-anywhere", download=False)
    sizes, corners = fixed_placements(60000, "train")
    train_idx, _ = validation_indices(60000, 5000, 0)
    placed = place(splits.train.images, sizes[train_idx], corners[train_idx])
    mean, std = channel_stats(placed)
    assert (rounded(mean), rounded(std)) == (
        statistics.FASHION_MNIST_ANYWHERE_MEAN,
        statistics.FASHION_MNIST_ANYWHERE_STD,
    )
    assert (splits.mean, splits.std) == (rounded(mean), rounded(std))  # what models normalise by


def test_models_normalise_with_the_data_statistics():
    quick = create_model("quick")
    torch.testing.assert_close(quick.normalize.mean.flatten(), torch.tensor(statistics.DIGITS_MEAN))
    assert PRESETS["quadratic-fashion"].model_kwargs["std"] == statistics.FASHION_MNIST_STD
    resnet = create_model("resnet18")  # CIFAR-10 by default
    torch.testing.assert_close(resnet.normalize.std.flatten(), torch.tensor(statistics.CIFAR10_STD))

"""BatchLoader and random_crop_flip: values against a per-image reference, reproducibility, DDP."""

import pytest
import torch
import torch.nn.functional as F

from attnconv.data import BatchLoader, ImageSet, random_crop_flip


def reference_crop_flip(image, offset, flip, pad):
    """One image, the obvious way: pad with zeros, slice, mirror."""
    _, h, w = image.shape
    padded = F.pad(image, (pad, pad, pad, pad))
    top, left = int(offset[0]), int(offset[1])
    crop = padded[:, top : top + h, left : left + w]
    return crop.flip(-1) if flip else crop


def make_set(n, channels=3, h=6, w=5, seed=0):
    """Random images; label i identifies image i."""
    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (n, channels, h, w), generator=g, dtype=torch.uint8)
    return ImageSet(images, torch.arange(n))


@pytest.mark.parametrize("pad", [0, 1, 4])
def test_random_crop_flip_matches_per_image_reference(pad):
    g = torch.Generator().manual_seed(1)
    images = torch.randint(0, 256, (40, 2, 7, 9), generator=g, dtype=torch.uint8)
    offsets = torch.randint(0, 2 * pad + 1, (40, 2), generator=g)
    flips = torch.rand(40, generator=g) < 0.5
    out = random_crop_flip(images, offsets, flips, pad)
    expected = torch.stack(
        [reference_crop_flip(images[i], offsets[i], flips[i], pad) for i in range(40)]
    )
    assert out.dtype == torch.uint8
    assert torch.equal(out, expected)


def test_random_crop_flip_hand_checked_pixels():
    image = torch.arange(1, 10, dtype=torch.uint8).reshape(1, 1, 3, 3)  # rows 1 2 3 / 4 5 6 / 7 8 9
    # offset (0, 0) with pad 1: shifted down-right by one, zeros enter at the top and left
    out = random_crop_flip(image, torch.tensor([[0, 0]]), torch.tensor([False]), 1)
    assert out[0, 0].tolist() == [[0, 0, 0], [0, 1, 2], [0, 4, 5]]
    # offset (2, 1) then mirrored: rows 2..3 of the image and a zero row, columns reversed
    out = random_crop_flip(image, torch.tensor([[2, 1]]), torch.tensor([True]), 1)
    assert out[0, 0].tolist() == [[6, 5, 4], [9, 8, 7], [0, 0, 0]]


def test_random_crop_flip_rejects_bad_offsets():
    images = torch.zeros(2, 1, 4, 4, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"offsets must lie in \[0, 2\]"):
        random_crop_flip(
            images, torch.tensor([[0, 3], [0, 0]]), torch.zeros(2, dtype=torch.bool), 1
        )
    with pytest.raises(ValueError, match=r"offsets must be int64 of shape \(2, 2\)"):
        random_crop_flip(
            images, torch.zeros(2, 3, dtype=torch.int64), torch.zeros(2, dtype=torch.bool), 1
        )
    with pytest.raises(ValueError, match=r"flips must be bool of shape \(2,\)"):
        random_crop_flip(images, torch.zeros(2, 2, dtype=torch.int64), torch.zeros(2), 1)


def collect(loader, epoch, start_batch=0):
    return [(x.clone(), y.clone()) for x, y in loader.epoch(epoch, start_batch)]


@pytest.mark.parametrize("flip", [True, False])
def test_train_batches_are_the_reference_crops_of_the_labelled_images(flip):
    data = make_set(30)
    loader = BatchLoader(data, 10, device="cpu", train=True, flip=flip, pad=2, seed=3)
    for batch, (x, y) in enumerate(loader.epoch(5)):
        assert x.dtype == torch.float32 and x.shape == (10, 3, 6, 5)
        offsets, flips = loader.augmentation(5, batch)
        assert flips.any() == flip
        expected = torch.stack(
            [
                reference_crop_flip(data.images[label], offsets[i], flips[i], 2)
                for i, label in enumerate(y)
            ]
        )
        assert torch.equal(x, expected.float() / 255)


def test_train_augmentation_uses_every_offset_and_both_flips():
    # a single bright pixel in the middle shows where each crop was taken
    images = torch.zeros(400, 1, 5, 5, dtype=torch.uint8)
    images[:, 0, 2, 2] = 255
    shifts = BatchLoader(
        ImageSet(images, torch.arange(400)), 400, device="cpu", train=True, flip=False, pad=2
    )
    ((x, _),) = shifts.epoch(0)
    positions = {tuple(torch.nonzero(img[0]).squeeze(0).tolist()) for img in x}
    assert positions == {(r, c) for r in range(5) for c in range(5)}  # all 25 offsets occur
    # columns 0..4 increasing left to right: a mirrored image decreases
    ramps = torch.arange(5, dtype=torch.uint8).expand(400, 1, 5, 5).contiguous()
    flips = BatchLoader(
        ImageSet(ramps, torch.arange(400)), 400, device="cpu", train=True, flip=True, pad=0
    )
    ((x, _),) = flips.epoch(0)
    mirrored = x[:, 0, 0, 0] > x[:, 0, 0, 4]
    assert torch.equal(x[mirrored], ramps[mirrored].flip(-1).float() / 255)
    assert torch.equal(x[~mirrored], ramps[~mirrored].float() / 255)
    assert 0.4 < mirrored.float().mean().item() < 0.6


def test_flip_off_never_mirrors():
    images = torch.arange(5, dtype=torch.uint8).expand(64, 1, 3, 5).contiguous()
    loader = BatchLoader(
        ImageSet(images, torch.arange(64)), 64, device="cpu", train=True, flip=False, pad=0
    )
    for epoch in range(3):
        ((x, _),) = loader.epoch(epoch)
        assert torch.equal(x, images.float() / 255)


def test_every_image_seen_once_per_epoch_and_epochs_differ():
    data = make_set(60)
    loader = BatchLoader(data, 12, device="cpu", train=True, flip=True)
    assert len(loader) == 5
    orders = []
    for epoch in range(2):
        labels = torch.cat([y for _, y in loader.epoch(epoch)])
        assert sorted(labels.tolist()) == list(range(60))
        orders.append(labels)
    assert not torch.equal(orders[0], orders[1])


def test_train_drops_last_incomplete_batch():
    loader = BatchLoader(make_set(25), 10, device="cpu", train=True, flip=True)
    batches = collect(loader, 0)
    assert len(loader) == len(batches) == 2
    labels = torch.cat([y for _, y in batches])
    assert len(set(labels.tolist())) == 20


def test_same_seed_same_batches_other_seed_other_batches():
    data = make_set(40)
    a = collect(BatchLoader(data, 8, device="cpu", train=True, flip=True, seed=5), 2)
    b = collect(BatchLoader(data, 8, device="cpu", train=True, flip=True, seed=5), 2)
    c = collect(BatchLoader(data, 8, device="cpu", train=True, flip=True, seed=6), 2)
    assert all(
        torch.equal(xa, xb) and torch.equal(ya, yb) for (xa, ya), (xb, yb) in zip(a, b, strict=True)
    )
    assert not all(torch.equal(ya, yc) for (_, ya), (_, yc) in zip(a, c, strict=True))


def test_resume_reproduces_the_tail_of_an_uninterrupted_epoch():
    data = make_set(50)
    full = collect(BatchLoader(data, 10, device="cpu", train=True, flip=True, seed=1), 4)
    resumed = collect(BatchLoader(data, 10, device="cpu", train=True, flip=True, seed=1), 4, 3)
    assert len(resumed) == 2
    for (xf, yf), (xr, yr) in zip(full[3:], resumed, strict=True):
        assert torch.equal(xf, xr) and torch.equal(yf, yr)
    loader = BatchLoader(data, 10, device="cpu", train=True, flip=True, seed=1)
    assert collect(loader, 4, len(loader)) == []


@pytest.mark.parametrize("train", [True, False])
def test_two_rank_shards_concatenate_to_the_single_rank_batch(train):
    data = make_set(46)
    single = collect(BatchLoader(data, 10, device="cpu", train=train, flip=True, seed=2), 1)
    ranks = [
        collect(
            BatchLoader(
                data, 10, device="cpu", train=train, flip=True, seed=2, rank=r, world_size=2
            ),
            1,
        )
        for r in range(2)
    ]
    assert len(ranks[0]) == len(ranks[1]) == len(single)
    for (x, y), (x0, y0), (x1, y1) in zip(single, *ranks, strict=True):
        assert torch.equal(torch.cat([x0, x1]), x) and torch.equal(torch.cat([y0, y1]), y)


def test_eval_order_and_partial_last_batch():
    data = make_set(23)
    loader = BatchLoader(data, 10, device="cpu", train=False, flip=True)
    batches = collect(loader, 7)
    assert len(loader) == 3 and [len(y) for _, y in batches] == [10, 10, 3]
    assert torch.equal(torch.cat([y for _, y in batches]), torch.arange(23))
    assert torch.equal(torch.cat([x for x, _ in batches]), data.images.float() / 255)


def test_eval_sharding_of_a_tiny_last_batch():
    data = make_set(21)  # last global batch: one image
    loaders = [
        BatchLoader(data, 10, device="cpu", train=False, flip=False, rank=r, world_size=2)
        for r in range(2)
    ]
    assert [len(loader) for loader in loaders] == [3, 2]
    labels = [[y.tolist() for _, y in loader.epoch(0)] for loader in loaders]
    assert labels[0] == [[0, 1, 2, 3, 4], [10, 11, 12, 13, 14], [20]]
    assert labels[1] == [[5, 6, 7, 8, 9], [15, 16, 17, 18, 19]]


def test_loader_keeps_the_split_as_one_uint8_tensor_on_the_device():
    data = make_set(12)
    loader = BatchLoader(data, 4, device=torch.device("cpu"), train=True, flip=True)
    assert loader.images.dtype == torch.uint8 and loader.images.shape == (12, 3, 6, 5)
    assert loader.images.device.type == "cpu" and loader.labels.dtype == torch.int64


def test_bad_arguments_are_rejected():
    data = make_set(12)
    with pytest.raises(
        ValueError, match=r"batch_size \(10\) must be divisible by world_size \(3\)"
    ):
        BatchLoader(data, 10, device="cpu", train=True, flip=True, world_size=3)
    with pytest.raises(ValueError, match=r"rank must be in \[0, 2\)"):
        BatchLoader(data, 4, device="cpu", train=True, flip=True, rank=2, world_size=2)
    with pytest.raises(ValueError, match="fewer than batch_size=20"):
        BatchLoader(data, 20, device="cpu", train=True, flip=True)
    with pytest.raises(TypeError, match="batch_size must be an int, got float"):
        BatchLoader(data, 4.0, device="cpu", train=True, flip=True)
    with pytest.raises(TypeError, match="images_set must be an ImageSet, got Tensor"):
        BatchLoader(data.images, 4, device="cpu", train=True, flip=True)
    loader = BatchLoader(data, 4, device="cpu", train=True, flip=True)
    with pytest.raises(ValueError, match=r"start_batch must be in \[0, 3\], got 4"):
        loader.epoch(0, start_batch=4)
    with pytest.raises(ValueError, match=r"batch must be in \[0, 3\), got 3"):
        loader.augmentation(0, 3)


def test_image_set_validates_its_tensors():
    with pytest.raises(TypeError, match=r"images must be a uint8 tensor, got a torch\.float32"):
        ImageSet(torch.zeros(2, 1, 3, 3), torch.zeros(2, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"labels must have shape \(2,\)"):
        ImageSet(torch.zeros(2, 1, 3, 3, dtype=torch.uint8), torch.zeros(3, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"\(N, C, H, W\), got \(2, 3, 3\)"):
        ImageSet(torch.zeros(2, 3, 3, dtype=torch.uint8), torch.zeros(2, dtype=torch.int64))

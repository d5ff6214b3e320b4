"""fashion-mnist-anywhere: exact area resampling, placements as documented, fixed evaluation bytes
(a checksum), training draws that resume bit-exactly."""

import hashlib

import pytest
import torch
import torch.nn.functional as F

from attnconv.data import BatchLoader, ImageSet, load_splits
from attnconv.data.anywhere import (
    CANVAS,
    MAX_SIZE,
    MIN_SIZE,
    TEST_SHA256,
    Placement,
    area_weights,
    fixed_placements,
    place,
)
from attnconv.errors import UserError
from attnconv.train.config import resolve_config


def bounding_boxes(images):
    """(top, left, height, width) int64 (B, 4) of each image's nonzero pixels; images (B, C, H, W)."""
    rows = (images > 0).any(dim=1).any(dim=2)  # (B, H)
    cols = (images > 0).any(dim=1).any(dim=1)  # (B, W)
    boxes = []
    for r, c in zip(rows, cols, strict=True):
        r_idx, c_idx = r.nonzero().flatten(), c.nonzero().flatten()
        boxes.append([r_idx[0], c_idx[0], r_idx[-1] - r_idx[0] + 1, c_idx[-1] - c_idx[0] + 1])
    return torch.tensor(boxes)


def reference_area(image, size):
    """Area resampling by another route: each pixel repeated ``size`` times along both axes, then
    averaged over 28×28 blocks (float64), rounded half up. image uint8 (C, 28, 28)."""
    big = image.double().repeat_interleave(size, 1).repeat_interleave(size, 2)
    mean = F.avg_pool2d(big.unsqueeze(0), 28).squeeze(0)  # (C, size, size)
    return torch.floor(mean + 0.5).to(torch.uint8)


def sha256(image_set):
    digest = hashlib.sha256(image_set.images.numpy().tobytes())
    digest.update(image_set.labels.numpy().astype("<i8").tobytes())
    return digest.hexdigest()


def test_area_weights_split_every_source_pixel_among_the_outputs():
    weights = area_weights(16, 28)
    assert weights.sum(1).tolist() == [28] * 16 and weights.sum(0).tolist() == [16] * 28
    # output pixel 0 covers source [0, 1.75): all of pixel 0 and three quarters of pixel 1
    assert weights[0, :3].tolist() == [16, 12, 0]


@pytest.mark.parametrize("size", [16, 19, 24])
def test_place_is_area_resampling_pasted_at_its_corner(size):
    generator = torch.Generator().manual_seed(size)
    images = torch.randint(0, 256, (3, 2, 28, 28), generator=generator, dtype=torch.uint8)
    corners = torch.tensor([[0, 0], [CANVAS - size, 3], [5, CANVAS - size]])
    placed = place(images, torch.full((3,), size), corners)
    assert placed.shape == (3, 2, CANVAS, CANVAS) and placed.dtype == torch.uint8
    for image, out, (top, left) in zip(images, placed, corners.tolist(), strict=True):
        inside = out[:, top : top + size, left : left + size]
        assert torch.equal(inside, reference_area(image, size))
        outside = out.clone()
        outside[:, top : top + size, left : left + size] = 0
        assert not outside.any()


def test_a_flip_places_the_mirrored_image():
    images = torch.randint(0, 256, (2, 1, 28, 28), dtype=torch.uint8)
    sizes, corners = torch.tensor([17, 23]), torch.tensor([[1, 2], [8, 0]])
    flipped = place(images, sizes, corners, torch.tensor([True, False]))
    assert torch.equal(flipped[0], place(images.flip(-1), sizes, corners)[0])
    assert torch.equal(flipped[1], place(images, sizes, corners)[1])


def test_place_refuses_images_off_the_canvas():
    images = torch.zeros(1, 1, 28, 28, dtype=torch.uint8)
    with pytest.raises(ValueError, match="inside the 32×32 canvas"):
        place(images, torch.tensor([20]), torch.tensor([[13, 0]]))
    with pytest.raises(ValueError, match=r"sizes must lie in \[1, 28\]"):
        place(images, torch.tensor([30]), torch.tensor([[0, 0]]))


def test_fixed_placements_are_fixed_and_cover_the_documented_ranges():
    sizes, corners = fixed_placements(2000, "test")
    again_sizes, again_corners = fixed_placements(10, "test")
    assert torch.equal(sizes[:10], again_sizes) and torch.equal(corners[:10], again_corners)
    assert not torch.equal(fixed_placements(10, "train")[0], again_sizes)
    assert sorted(sizes.unique().tolist()) == list(range(MIN_SIZE, MAX_SIZE + 1))
    room = (CANVAS - sizes).unsqueeze(1)
    assert (corners >= 0).all() and (corners <= room).all()
    # every corner a size allows occurs: the smallest images reach row and column 16
    assert corners[sizes == MIN_SIZE].amax(0).tolist() == [CANVAS - MIN_SIZE] * 2
    assert corners.amin(0).tolist() == [0, 0]


def synthetic_set(count=400):
    """Images with no zero pixel, so a placed image's bounding box is its placement exactly."""
    generator = torch.Generator().manual_seed(0)
    images = torch.randint(1, 256, (count, 1, 28, 28), generator=generator, dtype=torch.uint8)
    return ImageSet(images, torch.arange(count) % 10)


def placing_loader(**kwargs):
    return BatchLoader(
        synthetic_set(), 50, device="cpu", train=True, flip=True, pad=0, seed=3,
        placement=Placement(), **kwargs,
    )  # fmt: skip


def test_training_draws_place_every_image_anew_where_they_say():
    loader = placing_loader()
    assert loader.image_size == (CANVAS, CANVAS) and loader.images.shape[2:] == (28, 28)
    seen = []
    for epoch in (0, 1):
        for batch, (images, _) in enumerate(loader.epoch(epoch)):
            sizes, corners, _ = loader.placements(epoch, batch)
            boxes = bounding_boxes(images)
            assert torch.equal(boxes[:, :2], corners)
            assert torch.equal(boxes[:, 2], sizes) and torch.equal(boxes[:, 3], sizes)
            seen.append(boxes)
    boxes = torch.cat(seen)
    assert boxes[:, 2].min() == MIN_SIZE and boxes[:, 2].max() == MAX_SIZE
    assert boxes[:, 0].min() == 0 and boxes[:, 1].max() >= 14
    # a new draw per epoch: the same batch of epochs 0 and 1 is placed differently
    assert not torch.equal(loader.placements(0, 0)[1], loader.placements(1, 0)[1])


def test_training_draws_resume_bit_exactly_and_shard_a_global_batch():
    whole = [images for images, _ in placing_loader().epoch(2)]
    resumed = [images for images, _ in placing_loader().epoch(2, start_batch=5)]
    assert len(resumed) == len(whole) - 5
    assert all(torch.equal(a, b) for a, b in zip(whole[5:], resumed, strict=True))
    halves = [
        [images for images, _ in placing_loader(rank=rank, world_size=2).epoch(2)]
        for rank in (0, 1)
    ]
    for batch, (first, second) in enumerate(zip(*halves, strict=True)):
        assert torch.equal(torch.cat([first, second]), whole[batch])


def test_a_placing_loader_takes_no_crop_and_trains_only():
    with pytest.raises(UserError, match="pad must be 0 with a placement"):
        placing_loader().__class__(
            synthetic_set(), 50, device="cpu", train=True, flip=True, pad=4,
            placement=Placement(),
        )  # fmt: skip
    with pytest.raises(ValueError, match="placement is for train mode"):
        BatchLoader(synthetic_set(), 50, device="cpu", train=False, flip=False,
                    placement=Placement())  # fmt: skip
    with pytest.raises(ValueError, match=r"their draws are placements\(\)"):
        placing_loader().augmentation(0, 0)
    with pytest.raises(UserError, match="pad does nothing on 'fashion-mnist-anywhere'"):
        resolve_config("learned-fashion", "fashion-mnist-anywhere", pad=4)


@pytest.mark.needs_fashion_mnist
def test_the_evaluation_splits_are_fixed_bytes_and_placed_as_documented():
    splits = load_splits("fashion-mnist-anywhere", download=False)
    assert sha256(splits.test) == TEST_SHA256
    assert (len(splits.train), len(splits.val), len(splits.test)) == (55000, 5000, 10000)
    assert splits.image_size == (32, 32) and splits.train.images.shape[2:] == (28, 28)
    assert splits.placement == Placement() and splits.flip
    # the garments' bounding boxes lie inside their placements and move and vary in size
    sizes, corners = fixed_placements(10000, "test")
    boxes = bounding_boxes(splits.test.images)
    assert (boxes[:, :2] >= corners).all()
    assert (boxes[:, :2] + boxes[:, 2:] <= corners + sizes.unsqueeze(1)).all()
    assert boxes[:, 0].min() == 0 and boxes[:, 0].max() >= 14  # rows
    assert boxes[:, 1].min() == 0 and boxes[:, 1].max() >= 14  # columns
    longer = boxes[:, 2:].amax(1)
    assert longer.min() <= 16 and longer.max() == 24
    # Fashion-MNIST fills its frame's longer side: the garment's is the placement's size, ±1
    assert ((sizes - longer).abs() <= 1).float().mean() > 0.9
    # validation images keep the placement of their index, whatever the carve
    other = load_splits("fashion-mnist-anywhere", val_size=5000, seed=1, download=False)
    assert torch.equal(other.test.images, splits.test.images)
    common = {bytes(image.numpy()) for image in splits.val.images}
    assert sum(bytes(image.numpy()) in common for image in other.val.images) >= 300


@pytest.mark.needs_fashion_mnist
def test_a_run_on_it_places_its_training_images_and_resumes_bit_exactly(tmp_path, monkeypatch):
    """A tiny learned-anywhere run on 500 of its training images (200 validation): the trainer's
    loader places them on the 32×32 canvas without a crop, and one epoch + a resume ends with the
    weights of two."""
    import dataclasses

    from attnconv.train import loop
    from train_helpers import QUIET

    splits = load_splits("fashion-mnist-anywhere", download=False)
    small = dataclasses.replace(
        splits, train=splits.train.subset(torch.arange(500)), val=splits.val.subset(torch.arange(200))
    )
    monkeypatch.setattr(loop, "load_splits", lambda *args, **kwargs: small)
    loaders = []
    monkeypatch.setattr(
        loop, "BatchLoader", lambda *a, **k: loaders.append(k) or BatchLoader(*a, **k)
    )
    overrides = ["model.hidden=16", "model.depth=1", "model.mlp_dim=16", "epochs=2", *QUIET]
    config = resolve_config("learned-anywhere", overrides=overrides)
    loop.train(config, tmp_path / "whole")
    loop.train(config, tmp_path / "resumed", stop_after=1)
    loop.train(None, tmp_path / "resumed", resume=True)
    whole = torch.load(tmp_path / "whole" / "checkpoints" / "last.pt", weights_only=True)
    resumed = torch.load(tmp_path / "resumed" / "checkpoints" / "last.pt", weights_only=True)
    assert whole["step"] == resumed["step"] == 10  # 500 images, batch 100, 2 epochs
    for key, value in whole["model"].items():
        assert torch.equal(value, resumed["model"][key]), key
    train_loader = loaders[0]  # the first the trainer built is its training loader
    assert train_loader["train"] and train_loader["placement"] == Placement()
    assert train_loader["pad"] == 0

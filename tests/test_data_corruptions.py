"""The corrupted test sets (Fashion-MNIST's and fashion-mnist-anywhere's): the recorded bytes, and
each corruption doing what it says (on the real test sets where Debian's dataset-fashion-mnist is
installed, on small arrays else)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from attnconv.data.corruptions import (
    BLUR_KERNEL,
    CHOICES,
    CORRUPTION_SHA256,
    CORRUPTIONS,
    DIRECTIONS,
    IN_FRAME_SHIFT_PIXELS,
    NOISE_STD,
    OCCLUSION_SIZE,
    SHIFT_PIXELS,
    apply_blur,
    apply_contrast,
    apply_noise,
    apply_occlusion,
    apply_shift,
    array_sha256,
    corrupt,
    corrupted_test_set,
    corruption_draws,
    in_frame_offsets,
    ink_kept,
)
from attnconv.data.datasets import load_splits
from attnconv.data.fashion_mnist import load_fashion_mnist
from attnconv.errors import UserError


@pytest.fixture(scope="module")
def clean():
    """The Fashion-MNIST test images uint8 (10000, 28, 28) and labels (10000,), Debian's copy."""
    _, test, _ = load_fashion_mnist("/nonexistent", download=False)
    return test.images[:, 0].numpy(), test.labels.numpy()


@pytest.fixture(scope="module")
def placed():
    """fashion-mnist-anywhere's test images uint8 (10000, 32, 32), placed on their canvases."""
    test = load_splits("fashion-mnist-anywhere", "/nonexistent", download=False).test
    return test.images[:, 0].numpy()


def synthetic(n: int = 6, size: int = 28) -> np.ndarray:
    """Images with a bright blob on a zero background, like Fashion-MNIST's."""
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, size=(n, size, size)).astype(np.uint8)
    images[:, : size // 4] = 0
    images[:, :, -size // 4 :] = 0
    return images


def shifted_by_slicing(image: np.ndarray, dy: int, dx: int) -> np.ndarray:
    """``image`` moved by ``dy`` rows down and ``dx`` columns right, zero-filled."""
    h, w = image.shape
    out = np.zeros_like(image)
    out[max(dy, 0) : h + min(dy, 0), max(dx, 0) : w + min(dx, 0)] = image[
        max(-dy, 0) : h - max(dy, 0), max(-dx, 0) : w - max(dx, 0)
    ]
    return out


def gaussian_blur_float64(images: np.ndarray) -> np.ndarray:
    """Reference: images (N, H, W) convolved with the 2-D Gaussian of std 1 pixel, truncated at 4
    pixels and normalised, zeros outside, in float64 (no rounding)."""
    radius = 4
    offsets = range(-radius, radius + 1)
    weights = {(dy, dx): math.exp(-(dy * dy + dx * dx) / 2) for dy in offsets for dx in offsets}
    total = sum(weights.values())
    n, h, w = images.shape
    padded = np.pad(images.astype(np.float64), ((0, 0), (radius, radius), (radius, radius)))
    out = np.zeros((n, h, w))
    for (dy, dx), weight in weights.items():
        out += (weight / total) * padded[
            :, radius + dy : radius + dy + h, radius + dx : radius + dx + w
        ]
    return out


# ------------------------------------------------------------------ the real test set


@pytest.mark.needs_fashion_mnist
def test_each_corruption_has_the_recorded_bytes(clean, placed):
    assert list(CORRUPTION_SHA256) == ["fashion-mnist", "fashion-mnist-anywhere"]
    for dataset, images in (("fashion-mnist", clean[0]), ("fashion-mnist-anywhere", placed)):
        assert list(CORRUPTION_SHA256[dataset]) == list(CORRUPTIONS)
        hashes = {name: array_sha256(corrupt(images, name)) for name in CORRUPTIONS}
        assert hashes == CORRUPTION_SHA256[dataset]
        assert len(set(hashes.values())) == len(CORRUPTIONS)  # every corruption changes them


@pytest.mark.needs_fashion_mnist
def test_the_corrupted_test_set_comes_with_its_labels_and_checks_its_bytes(
    clean, tmp_path, monkeypatch
):
    images, labels = clean
    shifted = corrupted_test_set("shift-4", tmp_path, download=False)
    assert shifted.images.shape == (10000, 1, 28, 28) and shifted.labels.tolist() == labels.tolist()
    assert np.array_equal(shifted.images[:, 0].numpy(), corrupt(images, "shift-4"))
    monkeypatch.setitem(CORRUPTION_SHA256["fashion-mnist"], "blur", "0" * 64)
    with pytest.raises(
        UserError, match="'blur' fashion-mnist test images differ from the recorded"
    ):
        corrupted_test_set("blur", tmp_path, download=False)


@pytest.mark.needs_fashion_mnist
def test_the_anywhere_corrupted_test_set_corrupts_the_placed_canvases(clean, placed, tmp_path):
    _, labels = clean
    blurred = corrupted_test_set("blur", tmp_path, download=False, dataset="fashion-mnist-anywhere")
    assert blurred.images.shape == (10000, 1, 32, 32) and blurred.labels.tolist() == labels.tolist()
    assert np.array_equal(blurred.images[:, 0].numpy(), apply_blur(placed))
    with pytest.raises(UserError, match="no corrupted test sets for 'digits'; expected one of"):
        corrupted_test_set("blur", tmp_path, download=False, dataset="digits")


@pytest.mark.needs_fashion_mnist
def test_shifts_move_each_image_by_its_drawn_offset(clean):
    images, _ = clean
    for name, amount in SHIFT_PIXELS.items():
        offsets = corruption_draws(name, images.shape)["offsets"]
        assert np.all(np.abs(offsets).max(axis=1) == amount)
        assert np.all(np.isin(offsets, (-amount, 0, amount)))
        # all 8 directions, each drawn for about an eighth of the images
        directions, counts = np.unique(offsets, axis=0, return_counts=True)
        assert len(directions) == 8 and counts.min() > 1100 and counts.max() < 1400
        shifted = corrupt(images, name)
        for i in range(0, 10000, 7):
            assert np.array_equal(shifted[i], shifted_by_slicing(images[i], *offsets[i])), (name, i)


@pytest.mark.needs_fashion_mnist
def test_in_frame_shifts_keep_every_garment_that_has_room_whole(clean, placed):
    for images in (clean[0], placed):
        for name, amount in IN_FRAME_SHIFT_PIXELS.items():
            shifted = corrupt(images, name)
            kept = shifted.sum(axis=(1, 2), dtype=np.int64)
            total = images.sum(axis=(1, 2), dtype=np.int64)
            # where a direction keeps every bit of ink, the image was moved whole
            room = np.zeros(len(images), dtype=bool)
            for direction in DIRECTIONS * amount:
                moved = apply_shift(images, np.broadcast_to(direction, (len(images), 2)))
                room |= moved.sum(axis=(1, 2), dtype=np.int64) == total
            assert np.array_equal(room, kept == total), name
            assert ink_kept(images, shifted) > ink_kept(images, corrupt(images, name[:7]))
    # the placed garments have room for a 4-px move always, for an 8-px one almost always
    assert ink_kept(placed, corrupt(placed, "shift-4-in-frame")) == 1.0
    assert ink_kept(placed, corrupt(placed, "shift-8-in-frame")) > 0.999


@pytest.mark.needs_fashion_mnist
def test_noise_has_the_stated_std_on_pixels_far_from_the_clipping_bounds(clean):
    images, _ = clean
    for name, std in NOISE_STD.items():
        noisy = corrupt(images, name)
        difference = noisy.astype(np.float64) - images
        margin = 5 * 255 * std  # clipped once in ~3.5 million
        inside = (images >= margin) & (images <= 255 - margin)
        assert inside.sum() > 500_000
        # rounding adds a uniform error of variance 1/12 grey level²
        expected = math.sqrt((255 * std) ** 2 + 1 / 12)
        assert difference[inside].std() == pytest.approx(expected, rel=0.005)
        assert abs(difference[inside].mean()) < 0.05
        # the background (0) is clipped: about half its pixels stay 0
        assert 0.45 < (noisy[images == 0] == 0).mean() < 0.55


@pytest.mark.needs_fashion_mnist
def test_blur_is_the_float64_gaussian_within_one_grey_level(clean):
    images, _ = clean
    difference = corrupt(images, "blur") - gaussian_blur_float64(images)
    assert np.abs(difference).max() <= 1.0
    assert np.abs(difference).mean() < 0.3


@pytest.mark.needs_fashion_mnist
def test_contrast_scales_each_image_around_its_mean_to_forty_percent(clean):
    images, _ = clean
    low = corrupt(images, "contrast").astype(np.float64)
    pixels = images.astype(np.float64)
    ratio = low.std(axis=(1, 2)) / pixels.std(axis=(1, 2))
    assert np.all(np.abs(ratio - 0.4) < 0.01)
    assert np.all(np.abs(low.mean(axis=(1, 2)) - pixels.mean(axis=(1, 2))) <= 0.5)


@pytest.mark.needs_fashion_mnist
def test_occlusion_erases_one_square_per_image_and_nothing_else(clean):
    images, _ = clean
    corners = corruption_draws("occlusion", images.shape)["corners"]
    assert corners.min() == 0 and corners.max() == 28 - OCCLUSION_SIZE
    occluded = corrupt(images, "occlusion")
    for i in range(0, 10000, 7):
        top, left = corners[i]
        square = (slice(top, top + OCCLUSION_SIZE), slice(left, left + OCCLUSION_SIZE))
        assert np.all(occluded[i][square] == 0)
        outside = occluded[i].copy()
        outside[square] = images[i][square]
        assert np.array_equal(outside, images[i])


# ------------------------------------------------------------------ small arrays


def test_the_random_streams_are_the_recorded_ones():
    """The draws are numpy's PCG64 streams, the same on every machine: a check that runs without
    the dataset."""
    assert corruption_draws("shift-8", (5, 28, 28))["offsets"].tolist() == [
        [8, 0], [-8, 0], [-8, -8], [0, -8], [-8, 8],
    ]  # fmt: skip
    assert corruption_draws("occlusion", (4, 28, 28))["corners"].tolist() == [
        [5, 16], [10, 8], [2, 4], [3, 14],
    ]  # fmt: skip
    noise = corruption_draws("noise-low", (1, 2, 2))["noise"].round(6).tolist()
    assert noise == [[[-1.154409, -0.548959], [-0.258632, 0.46148]]]
    assert array_sha256(corrupt(synthetic(), "noise-high")) == (
        "fdb4a470954caba01996a09c0fa913f413505821403bde0f32d476f6dc075d53"
    )


def test_apply_shift_moves_a_pixel_and_fills_with_zeros():
    image = np.zeros((1, 5, 5), dtype=np.uint8)
    image[0, 2, 2] = 9
    image[0, 0, 4] = 7
    moved = apply_shift(image, np.array([[2, -1]]))
    expected = np.zeros((5, 5), dtype=np.uint8)
    expected[4, 1] = 9  # (2, 2) + (2, -1)
    expected[2, 3] = 7  # (0, 4) + (2, -1)
    assert np.array_equal(moved[0], expected)
    assert np.array_equal(apply_shift(image, np.array([[0, 0]])), image)
    assert not apply_shift(image, np.array([[5, 0]])).any()  # moved out entirely


def test_in_frame_offsets_pick_evenly_among_the_directions_that_keep_the_most_ink():
    images = np.zeros((4, 9, 9), dtype=np.uint8)
    images[0, 4, 4] = 5  # the centre: room in all 8 directions for 2 px
    images[1, 0, 0] = 5  # the top-left corner: room only S, SE, E
    images[2, 0, 4] = 5  # the top edge, and more ink below: room E, SE, S, SW, W
    images[2, 3, 4] = 1
    images[3, 4, 0:9] = 7  # a full row: every sideways move loses ink, N and S lose none
    choices = np.arange(CHOICES)
    for index, allowed in enumerate(
        [DIRECTIONS, [(0, 1), (1, 1), (1, 0)], [(0, 1), (1, 1), (1, 0), (1, -1), (0, -1)],
         [(-1, 0), (1, 0)]]
    ):  # fmt: skip
        repeated = np.repeat(images[index : index + 1], CHOICES, axis=0)
        offsets = in_frame_offsets(repeated, 2, choices)
        directions, counts = np.unique(offsets // 2, axis=0, return_counts=True)
        # in DIRECTIONS order, choice c takes the (c mod count)-th: every one equally often
        assert sorted(map(tuple, directions)) == sorted(map(tuple, allowed)), index
        assert set(counts) == {CHOICES // len(allowed)}
        assert np.array_equal(offsets[: len(allowed)] // 2, [
            d for d in DIRECTIONS.tolist() if tuple(d) in set(map(tuple, allowed))
        ])  # fmt: skip


def test_ink_kept_is_the_mean_share_of_each_images_grey_levels():
    clean = np.zeros((2, 4, 4), dtype=np.uint8)
    clean[0, 0, 0], clean[0, 3, 3] = 10, 30  # 40 in all
    clean[1, 1, 1] = 200
    moved = apply_shift(clean, np.array([[1, 1], [1, 1]]))  # image 0 loses its 30
    assert ink_kept(clean, moved) == pytest.approx((10 / 40 + 1) / 2)
    with pytest.raises(UserError, match="clean image 1 is black: no ink to keep"):
        ink_kept(np.stack([clean[0], 0 * clean[1]]), moved)
    with pytest.raises(UserError, match=r"the corrupted images \(1, 4, 4\) must match the clean"):
        ink_kept(clean, moved[:1])


def test_blur_of_an_impulse_is_the_rounded_kernel():
    image = np.zeros((1, 11, 11), dtype=np.uint8)
    image[0, 5, 5] = 255
    kernel = np.array(BLUR_KERNEL)
    expected = np.floor(255 * np.outer(kernel, kernel) / 2**24 + 0.5)
    blurred = apply_blur(image)[0]
    assert np.array_equal(blurred[2:9, 2:9], expected)
    assert blurred.sum() - blurred[2:9, 2:9].sum() == 0
    assert blurred[5, 5] == 41  # 255 · (1634 / 4096)² = 40.58
    assert np.array_equal(apply_blur(np.full((2, 9, 9), 200, np.uint8))[:, 4, 4], [200, 200])


def test_the_blur_kernel_is_the_normalised_gaussian_of_std_one():
    assert sum(BLUR_KERNEL) == 4096 and BLUR_KERNEL[::-1] == BLUR_KERNEL
    gaussian = np.exp(-(np.arange(-3, 4) ** 2) / 2)
    assert np.abs(np.array(BLUR_KERNEL) - 4096 * gaussian / gaussian.sum()).max() < 0.65


def test_contrast_keeps_the_mean_and_rounds_half_up():
    image = np.array([[[0, 0], [0, 200]]], dtype=np.uint8)  # mean 50
    assert apply_contrast(image).tolist() == [[[30, 30], [30, 110]]]
    # mean 0.75: 0.6 · 0.75 + 0.4 · 3 = 1.65 rounds to 2, 0.45 to 0
    image = np.array([[[3, 0], [0, 0]]], dtype=np.uint8)
    assert apply_contrast(image).tolist() == [[[2, 0], [0, 0]]]
    image = np.array([[[0, 5], [0, 0]]], dtype=np.uint8)  # mean 1.25: 0.75 and 2.75
    assert apply_contrast(image).tolist() == [[[1, 3], [1, 1]]]


def test_noise_is_added_rounded_and_clipped():
    image = np.array([[[0, 100, 250]]], dtype=np.uint8)
    noise = np.array([[[-1.0, 0.5, 1.0]]])
    # 255 · 0.04 = 10.2 grey levels per unit: -10.2 → 0, 105.1 → 105, 260.2 → 255
    assert apply_noise(image, noise, 0.04).tolist() == [[[0, 105, 255]]]
    assert apply_noise(image, np.zeros((1, 1, 3)), 0.08).tolist() == image.tolist()


def test_occlusion_on_a_small_array():
    images = np.full((2, 12, 12), 5, dtype=np.uint8)
    out = apply_occlusion(images, np.array([[0, 0], [2, 1]]))
    assert (out == 0).sum(axis=(1, 2)).tolist() == [100, 100]
    assert out[0, :10, :10].max() == 0 and out[0, 10:].min() == 5 and out[0, :, 10:].min() == 5
    assert out[1, 2:12, 1:11].max() == 0 and out[1, :2].min() == 5 and out[1, :, 0].min() == 5


def test_corrupt_is_deterministic_prefix_stable_and_seeded():
    images = synthetic(n=9)
    for name in CORRUPTIONS:
        full = corrupt(images, name)
        assert full.dtype == np.uint8 and full.shape == images.shape
        assert np.array_equal(full, corrupt(images, name))
        assert np.array_equal(full[:4], corrupt(images[:4], name)), name
    assert np.array_equal(corrupt(images, "clean"), images)
    assert not np.array_equal(corrupt(images, "noise-low"), corrupt(images, "noise-low", seed=1))
    offsets = corruption_draws("shift-4", images.shape)["offsets"]
    assert np.array_equal(corrupt(images, "shift-4"), apply_shift(images, offsets))
    assert set(map(tuple, offsets // 4)) <= set(map(tuple, DIRECTIONS))


@pytest.mark.parametrize(
    ("images", "name", "message"),
    [
        (np.zeros((2, 28, 28)), "blur", "images must be a uint8 array (N, H, W), got float64"),
        (np.zeros((28, 28), np.uint8), "blur", "uint8 array (N, H, W), got uint8 array of shape"),
        ([[[0]]], "blur", "images must be a uint8 array (N, H, W), got list"),
        (np.zeros((1, 28, 28), np.uint8), "fog", "unknown corruption 'fog'; expected one of clean"),
        (np.zeros((1, 8, 8), np.uint8), "occlusion", "at least 10×10 pixels, got 8×8"),
    ],
)
def test_bad_input_is_one_line_naming_what_was_expected(images, name, message):
    with pytest.raises(UserError) as error:
        corrupt(images, name)
    assert message in str(error.value) and "\n" not in str(error.value)

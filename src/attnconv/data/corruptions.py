"""Corrupted Fashion-MNIST test sets, the same bytes on every machine: robustness benchmarks.

Each corruption is computed from the clean uint8 test images (10000, 28×28 for Fashion-MNIST,
10000 placed 32×32 canvases for ``fashion-mnist-anywhere``) by integer arithmetic or exactly
rounded float64 operations, with its random draws from numpy's ``PCG64`` seeded with
``[SEED, *name.encode()]`` (one stream per corruption, so no corruption's bytes depend on another),
and only integer and standard-normal draws, whose streams numpy has kept unchanged since 1.17.
``CORRUPTION_SHA256`` records the SHA-256 of each result per dataset (the ``(10000, H, W)`` uint8
array, C order); ``corrupted_test_set`` and the tests check it.

| name               | what (grey levels: 0..255)                                                       |
|--------------------|----------------------------------------------------------------------------------|
| `clean`            | the test set as published                                                        |
| `shift-4`          | moved 4 pixels in one of the 8 compass directions (drawn per image), zero-filled |
| `shift-8`          | the same, 8 pixels (a diagonal move is 8 down or up and 8 sideways)              |
| `shift-4-in-frame` | 4 pixels, in one of the directions keeping the most ink in the frame             |
| `shift-8-in-frame` | the same, 8 pixels: a move, not a crop, where the image has room                 |
| `noise-low`        | plus Gaussian noise of std 0.04 on the [0, 1] scale (10.2 grey levels), rounded  |
| `noise-high`       | the same, std 0.08 (20.4 grey levels)                                            |
| `blur`             | Gaussian blur of std 1 pixel: integer kernel ``BLUR_KERNEL``, zero outside       |
| `contrast`         | each pixel brought to 40% of its distance from the image's mean, rounded         |
| `occlusion`        | a 10×10 square set to 0 (erased) at a position drawn per image, inside it        |

The plain shifts crop: a garment filling its frame loses its edge (Fashion-MNIST's 8-px shift
keeps 73% of the ink, ``ink_kept``). The in-frame shifts move the same distance but pick, per
image, uniformly among the directions that keep the most ink (``in_frame_offsets``): all of it
wherever the object has that much room, so they measure translation rather than cropping.

Noise is clipped to [0, 255] and rounded half to even (``np.rint``); the other roundings are half
up, in integers. The ``apply_*`` functions work on any uint8 array ``(N, H, W)``;
``corruption_draws`` gives the random parameters ``corrupt`` uses, so that a test can check what was
done to each image.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import torch

from attnconv.data.datasets import load_splits
from attnconv.data.splits import ImageSet
from attnconv.errors import UserError

SEED = 2021
CORRUPTIONS: tuple[str, ...] = (
    "clean",
    "shift-4",
    "shift-8",
    "shift-4-in-frame",
    "shift-8-in-frame",
    "noise-low",
    "noise-high",
    "blur",
    "contrast",
    "occlusion",
)
SHIFT_PIXELS: dict[str, int] = {"shift-4": 4, "shift-8": 8}
# the same moves, each image's direction drawn among those that keep the most of its ink
IN_FRAME_SHIFT_PIXELS: dict[str, int] = {"shift-4-in-frame": 4, "shift-8-in-frame": 8}
# the in-frame shifts draw an integer in [0, CHOICES) per image and take it modulo the number of
# best directions: 840 is a multiple of every count 1..8, so each best direction is equally likely
CHOICES = 840
# std of the added noise on the [0, 1] scale
NOISE_STD: dict[str, float] = {"noise-low": 0.04, "noise-high": 0.08}
# (dy, dx) of a move, rows down and columns right: N, NE, E, SE, S, SW, W, NW
DIRECTIONS = np.array(
    [(-1, 0), (-1, 1), (0, 1), (1, 1), (1, 0), (1, -1), (0, -1), (-1, -1)], dtype=np.int64
)
# 4096·exp(-x²/2)/Σ for x = -3..3 (18.16, 221.21, 991.38, 1634.51, ...) rounded to the nearest
# integer, but 992 for 991.38 so that they sum to 4096; applied vertically, then horizontally, so
# that the 2-D kernel sums to 2^24
BLUR_KERNEL: tuple[int, ...] = (18, 221, 992, 1634, 992, 221, 18)
CONTRAST: tuple[int, int] = (2, 5)  # the fraction of its distance to the mean a pixel keeps
OCCLUSION_SIZE = 10  # pixels, the side of the erased square

# The test sets ``corrupted_test_set`` corrupts: each one's 10000 clean test images
ROBUSTNESS_DATASETS: tuple[str, ...] = ("fashion-mnist", "fashion-mnist-anywhere")
# SHA-256 of each corruption of each dataset's 10000 test images (``array_sha256``), as made with
# SEED: Fashion-MNIST's (10000, 28, 28) and fashion-mnist-anywhere's placed (10000, 32, 32)
CORRUPTION_SHA256: dict[str, dict[str, str]] = {
    "fashion-mnist": {
        "clean": "c867c93ff95360594e8ec3287995350b824dd110b11595c0e13d5423f621867a",
        "shift-4": "88506ca700eae87366e1dae1d540ee914f3b304a91d878bd728c8b844605d46b",
        "shift-8": "25da57a32fb41c4e659c525f60f31c24c0e45e29bda9d15147cb4989d77d07a0",
        "shift-4-in-frame": "f98cfd9a279b30c41dac297ae5dc3f4cca6d805dbcd6a3fb493eb98565f81ae0",
        "shift-8-in-frame": "1f993e0a84bde692043d38e9595c4df276491993deaa9dab6f707aec834f8bbd",
        "noise-low": "cd8627c3c4162c78fbf7e9e018d254c3aa5e359b56cf0d8eb59f2af09ccce7b5",
        "noise-high": "9bc218f15087b1574b099c00cae3cb945354aea7533c1b7b84f9091993c34df6",
        "blur": "4c59d9cfbf7fe908cd1a409539d03a8d0d034adb85a1cb790c76c2329caf8a92",
        "contrast": "a5311e4fd8f9a50922327ad1c14cd7de7adf662a9600fa944160a1bcf03186e9",
        "occlusion": "7846d38e2d4b2944c2a0114321357ca0bd4678a340d7334709b6fa5aa66284d1",
    },
    "fashion-mnist-anywhere": {
        "clean": "961e1cacebf0030dfe97c6a58476305a2ab8c8ffac7c5c6f9fd6bf8b3e434941",
        "shift-4": "698dddbb462f1856573e70b7d870e9e1c0129795daeee465663cb200bfe4914e",
        "shift-8": "59d4ad8eaea6d920d5f803a050766a69866aa1af88f78bf51d6c9f232a7681e3",
        "shift-4-in-frame": "45e1a15eaa07ca622285ecf67dd169ee6fdde9885645127d1f997b3391790c3d",
        "shift-8-in-frame": "534645f484c080e389f03e65fc7458fc7eaa9a56c109e9a93733fab2e8a8c5b4",
        "noise-low": "208a48b48a3f44103b724a09f8680f81dec0d8976b1b66140ef2b3d82b505fd0",
        "noise-high": "e283c681ef08131eaea421be5a4fc6433e7f74065f290015b763b8b9b33ec698",
        "blur": "41321b76126c90f7eb6c5692e43dbf10ca2d2afc0c5bfa509b9c6eaac63fd251",
        "contrast": "ea416bbca2fdea9ae11461fb986c8e11a6a1847e789f143ed676e8a8736a5383",
        "occlusion": "56f0c38893a3980191384a6f21b8d193bb5b014e707336bdda0d89c51c636bab",
    },
}


def _check_images(images: np.ndarray) -> None:
    if not isinstance(images, np.ndarray) or images.dtype != np.uint8 or images.ndim != 3:
        kind = (
            f"{images.dtype} array of shape {images.shape}"
            if isinstance(images, np.ndarray)
            else type(images).__name__
        )
        raise UserError(f"images must be a uint8 array (N, H, W), got {kind}")


def _check_name(name: str) -> None:
    if name not in CORRUPTIONS:
        raise UserError(f"unknown corruption {name!r}; expected one of {', '.join(CORRUPTIONS)}")


def apply_shift(images: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """``images`` uint8 ``(N, H, W)`` each moved by ``offsets[i] = (dy, dx)`` (int, ``(N, 2)``,
    pixels; positive: down, right), the uncovered pixels 0:
    ``out[i, r, c] = images[i, r - dy, c - dx]`` where that lies inside the image."""
    n, h, w = images.shape
    pad = int(np.abs(offsets).max(initial=0))
    padded = np.pad(images, ((0, 0), (pad, pad), (pad, pad)))
    rows = (pad - offsets[:, 0])[:, None, None] + np.arange(h)[None, :, None]
    cols = (pad - offsets[:, 1])[:, None, None] + np.arange(w)[None, None, :]
    return padded[np.arange(n)[:, None, None], rows, cols]


def in_frame_offsets(images: np.ndarray, amount: int, choices: np.ndarray) -> np.ndarray:
    """int64 ``(N, 2)``: for each image of ``images`` uint8 ``(N, H, W)``, a move of ``amount``
    pixels in one of the 8 ``DIRECTIONS`` among those that keep the most of its ink (grey levels'
    sum) in the frame (all of it, where the image has room): the ``choices[i] mod count``-th of
    its ``count`` best directions, in ``DIRECTIONS`` order (``choices`` int ``(N,)``, >= 0)."""
    n = len(images)
    kept = np.stack(
        [
            apply_shift(images, np.broadcast_to(direction * amount, (n, 2))).sum(
                axis=(1, 2), dtype=np.int64
            )
            for direction in DIRECTIONS
        ],
        axis=1,
    )  # (N, 8): the ink each direction keeps
    best = kept == kept.max(axis=1, keepdims=True)
    rank = choices % best.sum(axis=1)
    index = np.argmax(np.cumsum(best, axis=1) > rank[:, None], axis=1)
    return DIRECTIONS[index] * amount


def apply_noise(images: np.ndarray, noise: np.ndarray, std: float) -> np.ndarray:
    """``images`` uint8 ``(N, H, W)`` plus ``std`` (on the [0, 1] scale) times ``noise`` (float64,
    same shape, standard normal), in grey levels: ``rint(clip(x + 255·std·z, 0, 255))``."""
    noisy = images + (255.0 * std) * noise
    return np.rint(np.clip(noisy, 0.0, 255.0)).astype(np.uint8)


def apply_blur(images: np.ndarray) -> np.ndarray:
    """``images`` uint8 ``(N, H, W)`` convolved with ``BLUR_KERNEL`` vertically and horizontally
    (zeros outside the image), in int64, then divided by 2^24 rounding half up."""
    kernel = np.array(BLUR_KERNEL, dtype=np.int64)
    radius = len(kernel) // 2
    _, h, w = images.shape
    padded = np.pad(images.astype(np.int64), ((0, 0), (radius, radius), (radius, radius)))
    down = sum(weight * padded[:, j : j + h, :] for j, weight in enumerate(kernel))
    both = sum(weight * down[:, :, j : j + w] for j, weight in enumerate(kernel))
    return ((both + (1 << 23)) >> 24).astype(np.uint8)


def apply_contrast(images: np.ndarray) -> np.ndarray:
    """``images`` uint8 ``(N, H, W)`` with each pixel ``x`` replaced by ``m + (a/b)·(x − m)``,
    ``a/b = CONTRAST`` (2/5), ``m`` its image's mean, rounded half up. In integers, exactly: with
    ``S`` the image's sum over ``P = H·W`` pixels, ``floor((2(b − a)S + 2aP·x + bP) / 2bP)``."""
    kept, whole = CONTRAST
    _, h, w = images.shape
    pixels = h * w
    values = images.astype(np.int64)
    sums = values.sum(axis=(1, 2), keepdims=True)
    numerator = 2 * (whole - kept) * sums + 2 * kept * pixels * values + whole * pixels
    return (numerator // (2 * whole * pixels)).astype(np.uint8)


def apply_occlusion(images: np.ndarray, corners: np.ndarray) -> np.ndarray:
    """``images`` uint8 ``(N, H, W)`` with the ``OCCLUSION_SIZE``-pixel square whose top-left
    pixel is ``corners[i] = (row, col)`` (int, ``(N, 2)``) set to 0."""
    _, h, w = images.shape
    top, left = corners[:, 0, None], corners[:, 1, None]
    rows = (np.arange(h) >= top) & (np.arange(h) < top + OCCLUSION_SIZE)
    cols = (np.arange(w) >= left) & (np.arange(w) < left + OCCLUSION_SIZE)
    return np.where(rows[:, :, None] & cols[:, None, :], np.uint8(0), images)


def corruption_draws(
    name: str, shape: tuple[int, int, int], seed: int = SEED
) -> dict[str, np.ndarray]:
    """The random parameters of corruption ``name`` for images of ``shape`` ``(N, H, W)``:
    ``{"offsets": (N, 2) int64}`` (shifts, pixels), ``{"choices": (N,) int64}`` (in-frame
    shifts: in ``[0, CHOICES)``, see ``in_frame_offsets``), ``{"noise": (N, H, W) float64}``
    (standard normal), ``{"corners": (N, 2) int64}`` (occlusion, top-left pixel); ``{}`` for the others."""
    _check_name(name)
    n, h, w = shape
    rng = np.random.Generator(np.random.PCG64([seed, *name.encode()]))
    if name in SHIFT_PIXELS:
        return {
            "offsets": DIRECTIONS[rng.integers(0, len(DIRECTIONS), size=n)] * SHIFT_PIXELS[name]
        }
    if name in IN_FRAME_SHIFT_PIXELS:
        return {"choices": rng.integers(0, CHOICES, size=n)}
    if name in NOISE_STD:
        return {"noise": rng.standard_normal((n, h, w))}
    if name == "occlusion":
        if h < OCCLUSION_SIZE or w < OCCLUSION_SIZE:
            raise UserError(
                f"occlusion needs images of at least {OCCLUSION_SIZE}×{OCCLUSION_SIZE} pixels, "
                f"got {h}×{w}"
            )
        high = np.array([h - OCCLUSION_SIZE + 1, w - OCCLUSION_SIZE + 1])
        return {"corners": rng.integers(0, high, size=(n, 2))}
    return {}


def corrupt(images: np.ndarray, name: str, seed: int = SEED) -> np.ndarray:
    """Corruption ``name`` (one of ``CORRUPTIONS``) of ``images`` uint8 ``(N, H, W)``, drawn from
    ``seed``: a new uint8 array ``(N, H, W)``. The draws for image ``i`` depend on ``N``, ``H``,
    ``W`` and ``i`` only, so corrupting a prefix of a set gives a prefix of its corruption."""
    _check_images(images)
    draws = corruption_draws(name, images.shape, seed)
    if name in SHIFT_PIXELS:
        return apply_shift(images, draws["offsets"])
    if name in IN_FRAME_SHIFT_PIXELS:
        amount = IN_FRAME_SHIFT_PIXELS[name]
        return apply_shift(images, in_frame_offsets(images, amount, draws["choices"]))
    if name in NOISE_STD:
        return apply_noise(images, draws["noise"], NOISE_STD[name])
    if name == "blur":
        return apply_blur(images)
    if name == "contrast":
        return apply_contrast(images)
    if name == "occlusion":
        return apply_occlusion(images, draws["corners"])
    return images.copy()


def array_sha256(images: np.ndarray) -> str:
    """Hex SHA-256 of a uint8 array's bytes in C order (what ``CORRUPTION_SHA256`` records)."""
    return hashlib.sha256(np.ascontiguousarray(images).tobytes()).hexdigest()


def ink_kept(clean: np.ndarray, corrupted: np.ndarray) -> float:
    """The mean over images of the share of an image's ink (its grey levels' sum) that
    ``corrupted`` keeps: for a shift, how much of the object stays in the frame. ``clean`` and
    ``corrupted`` uint8 ``(N, H, W)``, every clean image with some ink; a fraction (1: all kept)."""
    _check_images(clean)
    _check_images(corrupted)
    if clean.shape != corrupted.shape:
        raise UserError(
            f"the corrupted images {corrupted.shape} must match the clean {clean.shape}"
        )
    ink = clean.astype(np.int64).sum(axis=(1, 2))
    if (ink == 0).any():
        raise UserError(f"clean image {int(np.argmax(ink == 0))} is black: no ink to keep")
    return float((corrupted.astype(np.int64).sum(axis=(1, 2)) / ink).mean())


# SHA-256 of each dataset's standard test labels (int64, little-endian, as ``ImageSet`` holds them);
# its images' is ``CORRUPTION_SHA256[dataset]["clean"]``
TEST_LABELS_SHA256: dict[str, str] = {
    "fashion-mnist": "d51d859896c55775b9e9e219b77ff03bcec1b6ac322f313544dc3f9e7bc94fae",
    "fashion-mnist-anywhere": "d51d859896c55775b9e9e219b77ff03bcec1b6ac322f313544dc3f9e7bc94fae",
}


def nonstandard_test_set(dataset: str, test: ImageSet) -> str | None:
    """Why ``test`` (``load_splits(dataset).test``) is not ``dataset``'s standard test set, the
    one results are stated on: its images or labels differ from the recorded SHA-256s (other
    files in the data folder, e.g. training images put in the test files' place). None if they
    are the recorded ones, or if none are recorded for ``dataset``."""
    if dataset not in TEST_LABELS_SHA256:
        return None
    labels = np.ascontiguousarray(test.labels.numpy().astype("<i8"))
    images_ok = array_sha256(test.images.numpy()) == CORRUPTION_SHA256[dataset]["clean"]
    labels_ok = hashlib.sha256(labels.tobytes()).hexdigest() == TEST_LABELS_SHA256[dataset]
    if images_ok and labels_ok:
        return None
    differ = " and ".join(
        what for what, ok in (("images", images_ok), ("labels", labels_ok)) if not ok
    )
    return (
        f"not the standard {dataset} test set: its {len(test)} test {differ} differ from the "
        f"recorded ones (SHA-256)"
    )


def clean_test_set(
    dataset: str = "fashion-mnist", data_dir: str | Path | None = None, download: bool = True
) -> ImageSet:
    """The clean test set of ``dataset`` (one of ``ROBUSTNESS_DATASETS``) as ``load_splits``
    reads it (``data_dir``, ``download``): images uint8 ``(10000, 1, H, W)`` (28×28 for
    Fashion-MNIST, the placed 32×32 canvases for ``fashion-mnist-anywhere``), labels int64
    ``(10000,)``."""
    if dataset not in ROBUSTNESS_DATASETS:
        raise UserError(
            f"no corrupted test sets for {dataset!r}; expected one of "
            f"{', '.join(ROBUSTNESS_DATASETS)}"
        )
    # only the test split is used: no validation images need carving out of the training set
    return load_splits(dataset, data_dir, val_size=0, download=download).test


def corrupt_test_set(clean: ImageSet, name: str, dataset: str = "fashion-mnist") -> ImageSet:
    """``clean`` (``clean_test_set(dataset)``) under corruption ``name``, the same shapes, checked
    against ``CORRUPTION_SHA256``. UserError if the bytes differ."""
    _check_name(name)
    images = corrupt(clean.images[:, 0].numpy(), name)
    expected = CORRUPTION_SHA256[dataset][name]
    if array_sha256(images) != expected:
        raise UserError(
            f"the {name!r} {dataset} test images differ from the recorded ones (SHA-256 "
            f"{array_sha256(images)[:16]}..., expected {expected[:16]}...): a different test "
            f"set, or numpy changed its random streams"
        )
    return ImageSet(torch.from_numpy(images).unsqueeze(1), clean.labels)


def corrupted_test_set(
    name: str,
    data_dir: str | Path | None = None,
    download: bool = True,
    dataset: str = "fashion-mnist",
) -> ImageSet:
    """The test set of ``dataset`` (one of ``ROBUSTNESS_DATASETS``) under corruption ``name``:
    ``corrupt_test_set(clean_test_set(dataset, data_dir, download), name, dataset)``. To corrupt
    one test set several ways, read it once with ``clean_test_set``."""
    _check_name(name)
    return corrupt_test_set(clean_test_set(dataset, data_dir, download), name, dataset)

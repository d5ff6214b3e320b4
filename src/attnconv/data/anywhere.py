"""``fashion-mnist-anywhere``: Fashion-MNIST garments at a random size and position on a 32×32 canvas.

Why: Fashion-MNIST's garments are centred and size-normalised on black, so a model can read a
garment by fixed offsets from the centre (the shipped ``learned-fashion`` does: issue 39). In
CIFAR-10, where the paper saw learned attention turn local, objects vary in position and scale.
This dataset gives Fashion-MNIST that variation while keeping the paper's token grid: the 32×32
canvas becomes 16×16 tokens under the 2×2 stem.

How an image is made (``place``): the whole 28×28 frame is rescaled to ``s×s`` pixels with ``s``
uniform over the integers ``MIN_SIZE..MAX_SIZE`` (16..24; the garments fill their frame's longer
side, so a garment's longer side is about ``s``), optionally mirrored left-right, and pasted with
its top-left corner at ``(top, left)``, each uniform over ``0..CANVAS − s``, on a black canvas.

Resampling is area (box) averaging done in exact integer arithmetic: output pixel ``i`` of an
``s``-pixel side covers source pixels ``[i·28/s, (i+1)·28/s)``; scaled by ``s``, every overlap is a
whole number (``area_weights``), each output row of weights sums to 28, and the pixel is
``round_half_up(Σ w_row · w_col · x / 28²)``. The sums are products of integers below 2⁵³, which
float64 matrix products compute exactly in any order, so the bytes are the same on every CPU and
GPU (no instruction-set or library dependence; no float rounding before the final integer one).

Where placements come from:

* training: a new size, position and flip every time an image is seen, drawn for each batch from
  ``(seed, epoch, batch)`` as ``attnconv.data.loader.BatchLoader`` draws its crops, so a resumed
  run sees exactly the images of an uninterrupted one (the random crop is replaced, not added:
  the loader takes ``pad=0``);
* validation and test: fixed (``fixed_placements``), from SHA-256 of ``(PLACEMENT_SEED, stream,
  image index)``, independent of torch and numpy versions. Validation images keep the placement of
  their index in the official training set (stream ``"train"``), whatever the run's validation
  carve; test images use stream ``"test"``; neither is mirrored. ``TEST_SHA256`` is the checksum of
  the test split.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

CANVAS = 32
MIN_SIZE = 16
MAX_SIZE = 24
PLACEMENT_SEED = 20200101
TEST_SHA256 = "02b9afef6b5253ac7c4f69841240bb90157110bec016a9d77cdbfdf915751893"
"""SHA-256 of the test split: its images' bytes (uint8, ``(10000, 1, 32, 32)`` row-major), then
its labels' (int64 little-endian)."""


@dataclass(frozen=True)
class Placement:
    """How a loader places images: on a ``canvas``×``canvas`` black canvas (pixels), each image
    rescaled to a side uniform over ``min_size..max_size`` pixels (inclusive)."""

    canvas: int = CANVAS
    min_size: int = MIN_SIZE
    max_size: int = MAX_SIZE

    def __post_init__(self) -> None:
        if not 1 <= self.min_size <= self.max_size <= self.canvas:
            raise ValueError(
                f"placement sizes must satisfy 1 <= min_size <= max_size <= canvas, got "
                f"{self.min_size}, {self.max_size}, {self.canvas}"
            )

    def draw(self, count: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """``count`` random placements from ``generator`` (CPU): sizes int64 ``(count,)`` in
        ``[min_size, max_size]`` and top-left corners int64 ``(count, 2)`` (row, col) in
        ``[0, canvas − size]``."""
        sizes = torch.randint(self.min_size, self.max_size + 1, (count,), generator=generator)
        raw = torch.randint(0, 1 << 60, (count, 2), generator=generator)
        return sizes, raw % (self.canvas - sizes + 1).unsqueeze(1)


def fixed_placements(
    count: int, stream: str, placement: Placement = Placement()
) -> tuple[torch.Tensor, torch.Tensor]:
    """The fixed placements of images ``0..count−1`` of ``stream`` ("train", "test"), as
    ``Placement.draw`` returns them: image ``i``'s size and corner are read from
    ``sha256(f"{PLACEMENT_SEED},{stream},{i}")`` (the top 60 bits of each of its first three
    little-endian 8-byte words, reduced modulo the size's and the corner's ranges; the bias is
    below 2⁻⁵⁵)."""
    words = torch.tensor(
        [
            [int.from_bytes(digest[j : j + 8], "little") >> 4 for j in (0, 8, 16)]
            for digest in (
                hashlib.sha256(f"{PLACEMENT_SEED},{stream},{i}".encode()).digest()
                for i in range(count)
            )
        ],
        dtype=torch.int64,
    ).reshape(count, 3)
    sizes = placement.min_size + words[:, 0] % (placement.max_size - placement.min_size + 1)
    return sizes, words[:, 1:] % (placement.canvas - sizes + 1).unsqueeze(1)


def area_weights(size: int, source: int) -> torch.Tensor:
    """int64 ``(size, source)``: ``w[i, k]`` = the overlap of output pixel ``i``'s span
    ``[i·source, (i+1)·source)`` and source pixel ``k``'s ``[k·size, (k+1)·size)``, both in units
    of ``1/size`` source pixels; each row sums to ``source``, each column to ``size``."""
    i = torch.arange(size).unsqueeze(1)
    k = torch.arange(source).unsqueeze(0)
    overlap = torch.minimum((i + 1) * source, (k + 1) * size) - torch.maximum(i * source, k * size)
    return overlap.clamp(min=0)


def _placing_matrices(
    sizes: torch.Tensor, corners: torch.Tensor, source: int, canvas: int
) -> torch.Tensor:
    """float64 ``(B, canvas, source)``: row ``r`` of image ``b``'s matrix holds the weights of
    output pixel ``r − corners[b]`` of a ``sizes[b]``-pixel side (zero outside it)."""
    largest = int(sizes.max())
    table = torch.zeros(largest + 1, largest, source, dtype=torch.int64)
    for size in sizes.unique().tolist():
        table[size, :size] = area_weights(size, source)
    table = table.to(sizes.device, torch.float64)
    rows = torch.arange(canvas, device=sizes.device).unsqueeze(0) - corners.unsqueeze(1)  # (B, canvas)
    inside = (rows >= 0) & (rows < sizes.unsqueeze(1))
    picked = table[sizes.unsqueeze(1), rows.clamp(0, largest - 1)]  # (B, canvas, source)
    return picked * inside.unsqueeze(2)


def place(
    images: torch.Tensor,
    sizes: torch.Tensor,
    corners: torch.Tensor,
    flips: torch.Tensor | None = None,
    canvas: int = CANVAS,
) -> torch.Tensor:
    """Paste each image, area-rescaled, on a black canvas (see the module docstring).

    ``images`` uint8 ``(B, C, S, S)`` (square); ``sizes`` int64 ``(B,)`` the rescaled side in
    pixels, in ``[1, min(S, canvas)]`` (downscaling only); ``corners`` int64 ``(B, 2)`` the (row,
    col) of each image's top-left pixel on the canvas, in ``[0, canvas − size]``; ``flips`` bool
    ``(B,)``: mirror that image left-right (``None``: none). Returns uint8
    ``(B, C, canvas, canvas)`` on ``images``' device, the same bytes on every device.
    """
    b, _, height, width = images.shape
    if height != width:
        raise ValueError(f"images must be square, got {height}×{width}")
    if sizes.shape != (b,) or corners.shape != (b, 2):
        raise ValueError(
            f"sizes must be ({b},) and corners ({b}, 2), got {tuple(sizes.shape)} and "
            f"{tuple(corners.shape)}"
        )
    if b == 0:
        return images.new_zeros(0, images.shape[1], canvas, canvas)
    if sizes.min() < 1 or sizes.max() > min(height, canvas):
        raise ValueError(f"sizes must lie in [1, {min(height, canvas)}], got {sizes.tolist()}")
    if corners.min() < 0 or (corners + sizes.unsqueeze(1)).max() > canvas:
        raise ValueError(f"every placed image must lie inside the {canvas}×{canvas} canvas")
    device = images.device
    sizes, corners = sizes.to(device), corners.to(device)
    rows = _placing_matrices(sizes, corners[:, 0], height, canvas)  # (B, canvas, S)
    cols = _placing_matrices(sizes, corners[:, 1], width, canvas)
    if flips is not None:
        cols = torch.where(flips.to(device).view(b, 1, 1), cols.flip(2), cols)
    # (B, 1, canvas, S) @ (B, C, S, S) @ (B, 1, S, canvas): exact integers in float64
    sums = rows.unsqueeze(1) @ images.to(torch.float64) @ cols.transpose(1, 2).unsqueeze(1)
    area = height * width
    return torch.div(sums.to(torch.int64) + area // 2, area, rounding_mode="floor").to(torch.uint8)

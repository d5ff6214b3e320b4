"""Images to analyse a model on: from a folder of image files, a dataset's test split, or the test
images shipped with attnconv, brought to the model's input size and channels."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from attnconv.errors import UserError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")
# Luminance of an RGB pixel (ITU-R BT.601), for models that take one channel.
LUMA = (0.299, 0.587, 0.114)


def fit_image(image: Tensor, size: tuple[int, int], channels: int) -> Tensor:
    """One image ``(C, h, w)`` in ``[0, 1]`` as ``(channels, H, W)``, ``size = (H, W)``: scaled
    (bilinear, antialiased) so that it covers ``H × W``, then cropped at the centre; one channel
    repeated for three, three averaged with luminance weights for one."""
    if image.dim() != 3:
        raise ValueError(f"an image is (C, H, W), got shape {tuple(image.shape)}")
    image = image.float()
    if image.shape[0] != channels:
        if image.shape[0] == 1:
            image = image.expand(channels, -1, -1)
        elif image.shape[0] == 3 and channels == 1:
            image = (image * torch.tensor(LUMA).view(3, 1, 1)).sum(dim=0, keepdim=True)
        else:
            raise UserError(
                f"cannot turn {image.shape[0]}-channel images into the {channels} channels the "
                f"model takes"
            )
    height, width = size
    scale = max(height / image.shape[1], width / image.shape[2])
    scaled = (max(height, round(image.shape[1] * scale)), max(width, round(image.shape[2] * scale)))
    if scaled != tuple(image.shape[1:]):
        image = F.interpolate(
            image[None], size=scaled, mode="bilinear", antialias=True, align_corners=False
        )[0]
    top = (image.shape[1] - height) // 2
    left = (image.shape[2] - width) // 2
    return image[:, top : top + height, left : left + width].clamp(0, 1)


def fit_images(images: Sequence[Tensor] | Tensor, size: tuple[int, int], channels: int) -> Tensor:
    """``fit_image`` for each image: ``(B, channels, H, W)``."""
    return torch.stack([fit_image(image, size, channels) for image in images])


def folder_images(folder: Path, count: int) -> tuple[list[Tensor], list[str]]:
    """The first ``count`` image files of ``folder`` (by name) as ``(3, h, w)`` floats in
    ``[0, 1]``, captioned with their file names."""
    from PIL import Image, UnidentifiedImageError

    paths = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)[:count]
    if not paths:
        raise UserError(f"{folder} holds no image files ({', '.join(IMAGE_SUFFIXES)})")
    images = []
    for path in paths:
        try:
            with Image.open(path) as handle:
                pixels = torch.frombuffer(
                    bytearray(handle.convert("RGB").tobytes()), dtype=torch.uint8
                )
                width, height = handle.size
        except (UnidentifiedImageError, OSError) as err:
            raise UserError(f"{path} is not an image PIL can read ({err})") from err
        images.append(pixels.view(height, width, 3).permute(2, 0, 1).float() / 255.0)
    return images, [path.name for path in paths]


def load_images(
    source: str | None,
    count: int,
    size: tuple[int, int],
    channels: int,
    data_dir: str | None = None,
    shipped: str = "fashion-mnist",
) -> tuple[Tensor, list[str], str]:
    """Up to ``count`` images ``(B, channels, H, W)`` in ``[0, 1]`` at ``size = (H, W)``, a
    caption each, and where they came from (one line).

    ``source``: a folder of image files, an ``attnconv.data.DATASETS`` name (its test split), or
    None for the test images of ``shipped`` that ship with attnconv (offline).
    """
    from attnconv.data.datasets import DATASETS

    if count < 1:
        raise UserError(f"need at least one image, got {count}")
    if source is None:
        from attnconv.models.pretrained import sample_images

        images, labels = sample_images(shipped)
        images, labels = images[:count], labels[:count]
        origin = f"the {len(labels)} {shipped} test images shipped with attnconv"
    elif Path(source).is_dir():
        images, labels = folder_images(Path(source), count)
        origin = f"{len(labels)} image{'s' if len(labels) > 1 else ''} of {source}"
    elif source in DATASETS:
        from attnconv.viz.figures import test_images

        images, labels = test_images(source, count, data_dir)
        origin = f"the first {len(labels)} {source} test images"
    else:
        raise UserError(
            f"--images {source!r} is neither a folder nor a dataset ({', '.join(DATASETS)})"
        )
    fitted = fit_images(images, size, channels)
    first = images[0].shape[-2:]
    if tuple(first) != tuple(size):
        origin += f", scaled to {size[0]}x{size[1]}"
    return fitted, list(labels), origin

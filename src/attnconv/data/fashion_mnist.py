"""Fashion-MNIST (Xiao, Rasul & Vollgraf, 2017) from its four idx files.

The files (``train-images-idx3-ubyte`` etc., gzipped or not) are looked for in
``data_dir/fashion-mnist/``, then in ``SYSTEM_DIR`` (where Debian's ``dataset-fashion-mnist``
package installs them); if neither folder has all four, the missing ``.gz`` files are downloaded into
``data_dir/fashion-mnist/`` from the canonical address, each checked against its published MD5.
Local files are not checksummed (Debian recompresses them) but their idx headers and sizes are
checked.

idx format: a 4-byte magic number ``0x00 0x00 0x08 ndim`` (0x08: unsigned bytes), ``ndim``
big-endian uint32 sizes, then the values in row-major order.
"""

from __future__ import annotations

import gzip
import math
import zlib
from pathlib import Path

import numpy as np
import torch

from attnconv.data.download import fetch
from attnconv.data.splits import ImageSet
from attnconv.errors import UserError

BASE_URL = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"
MD5S: dict[str, str] = {
    "train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
    "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
    "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
    "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310",
}
SYSTEM_DIR = Path("/usr/share/datasets/fashion-mnist")
CLASSES = [
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
]  # fmt: skip
_STEMS = [name.removesuffix(".gz") for name in MD5S]


def read_idx(path: Path, ndim: int) -> np.ndarray:
    """The uint8 array stored in the idx file ``path`` (gzipped if it ends in ``.gz``).

    ``ndim`` is the number of dimensions the file must hold (1 for labels, 3 for images).
    """
    path = Path(path)
    try:
        with gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError, zlib.error) as err:
        raise UserError(f"{path}: cannot read the idx file ({err})") from err
    expected_magic = 0x0800 + ndim
    magic = int.from_bytes(raw[:4], "big")
    if len(raw) < 4 or magic != expected_magic:
        raise UserError(
            f"{path}: bad magic number 0x{magic:08x}, expected 0x{expected_magic:08x} "
            f"(an idx file of unsigned bytes with {ndim} dimension(s))"
        )
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise UserError(
            f"{path}: truncated idx header: {len(raw)} bytes, expected {header} (the magic number "
            f"and {ndim} sizes of 4 bytes)"
        )
    shape = tuple(int(d) for d in np.frombuffer(raw[4:header], dtype=">u4"))
    values = math.prod(shape)  # a Python int: sizes up to 2^32 - 1 each cannot overflow it
    if len(raw) - header != values:
        raise UserError(
            f"{path}: truncated or oversized idx file: header says shape {shape}, "
            f"{values} values, but {len(raw) - header} bytes follow it"
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(shape)


def _find(folder: Path, stem: str) -> Path | None:
    for candidate in (folder / f"{stem}.gz", folder / stem):
        if candidate.is_file():
            return candidate
    return None


def load_fashion_mnist(data_dir: Path, download: bool) -> tuple[ImageSet, ImageSet, list[str]]:
    """Read Fashion-MNIST: (train, test, classes); images uint8 ``(N, 1, 28, 28)``."""
    local = Path(data_dir) / "fashion-mnist"
    folder = next((d for d in (local, SYSTEM_DIR) if all(_find(d, s) for s in _STEMS)), None)
    if folder is None:
        missing = [s for s in _STEMS if _find(local, s) is None]
        hint = (
            f"To provide Fashion-MNIST by hand, put {', '.join(f'{s}.gz' for s in missing)} "
            f"(from {BASE_URL}) into {local}/, or install Debian's dataset-fashion-mnist package "
            f"(files in {SYSTEM_DIR}/)."
        )
        if not download:
            raise FileNotFoundError(f"fashion-mnist: files missing and download is off. {hint}")
        for stem in missing:
            fetch(
                BASE_URL + f"{stem}.gz", local / f"{stem}.gz", MD5S[f"{stem}.gz"], manual_hint=hint
            )
        folder = local
    train = _read_pair(folder, "train")
    test = _read_pair(folder, "t10k")
    return train, test, list(CLASSES)


def _read_pair(folder: Path, prefix: str) -> ImageSet:
    images_path = _find(folder, f"{prefix}-images-idx3-ubyte")
    labels_path = _find(folder, f"{prefix}-labels-idx1-ubyte")
    images = read_idx(images_path, 3)
    labels = read_idx(labels_path, 1)
    if images.shape[1:] != (28, 28):
        raise UserError(f"{images_path}: images must be 28×28, got {images.shape[1:]}")
    if len(images) == 0:
        raise UserError(
            f"{images_path}: holds no images: an empty split can be neither trained nor evaluated "
            f"on (Fashion-MNIST has 60000 training and 10000 test images)"
        )
    if len(labels) != len(images):
        raise UserError(
            f"{labels_path}: {len(labels)} labels for {len(images)} images in {images_path}"
        )
    if len(labels) and labels.max() >= len(CLASSES):
        raise UserError(f"{labels_path}: labels must lie in [0, 10), found {labels.max()}")
    return ImageSet(
        torch.from_numpy(images.copy()).unsqueeze(1),
        torch.from_numpy(labels.astype(np.int64)),
    )

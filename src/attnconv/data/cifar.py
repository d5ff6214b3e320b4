"""CIFAR-10 and CIFAR-100 from their python archives (Krizhevsky, 2009).

A dataset is read from its folder under ``data_dir`` (``cifar-10-batches-py/`` with
``data_batch_1..5``, ``test_batch``, ``batches.meta``; ``cifar-100-python/`` with ``train``,
``test``, ``meta``). When the folder is absent, the archive ``data_dir/cifar-10-python.tar.gz``
(or ``cifar-100-python.tar.gz``) is checked against its published MD5 and the batch files are
extracted from it; when that is absent too, the archive is downloaded from the canonical address
first (see ``download.fetch``).

Each batch file is a pickled dict: ``data`` uint8 ``(N, 3072)`` (1024 red, 1024 green, 1024 blue
values, each 32×32 row-major) and a list of ``N`` labels. Batches are unpickled with a loader that
only accepts numpy arrays and plain containers, so a tampered file cannot run code.
"""

from __future__ import annotations

import codecs
import io
import os
import pickle
import shutil
import tarfile
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch

from attnconv.data.download import fetch, file_md5
from attnconv.data.splits import ImageSet
from attnconv.errors import UserError


@dataclass(frozen=True)
class CifarArchive:
    """Where a CIFAR archive comes from and what its extracted folder holds."""

    url: str
    md5: str
    folder: str
    train_files: tuple[str, ...]
    test_file: str
    meta_file: str
    label_key: str
    names_key: str
    num_classes: int

    @property
    def filename(self) -> str:
        return self.url.rsplit("/", 1)[-1]

    @property
    def files(self) -> tuple[str, ...]:
        return (*self.train_files, self.test_file, self.meta_file)


ARCHIVES: dict[str, CifarArchive] = {
    "cifar10": CifarArchive(
        url="https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
        md5="c58f30108f718f92721af3b95e74349a",
        folder="cifar-10-batches-py",
        train_files=tuple(f"data_batch_{i}" for i in range(1, 6)),
        test_file="test_batch",
        meta_file="batches.meta",
        label_key="labels",
        names_key="label_names",
        num_classes=10,
    ),
    "cifar100": CifarArchive(
        url="https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz",
        md5="eb9058c3a382ffc7106e4002c42a8d85",
        folder="cifar-100-python",
        train_files=("train",),
        test_file="test",
        meta_file="meta",
        label_key="fine_labels",
        names_key="fine_label_names",
        num_classes=100,
    ),
}

_PIXELS = 3 * 32 * 32
# ndarray.__reduce__ names numpy's array rebuilder, whose module moved between numpy versions.
_RECONSTRUCT = np.empty(0).__reduce__()[0]


class _CifarUnpickler(pickle.Unpickler):
    """Unpickles numpy arrays and builtin containers only."""

    _ALLOWED: ClassVar[dict[tuple[str, str], object]] = {
        ("numpy.core.multiarray", "_reconstruct"): _RECONSTRUCT,
        ("numpy._core.multiarray", "_reconstruct"): _RECONSTRUCT,
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
        ("_codecs", "encode"): codecs.encode,
    }

    def find_class(self, module: str, name: str) -> object:
        try:
            return self._ALLOWED[module, name]
        except KeyError:
            raise pickle.UnpicklingError(f"unexpected object {module}.{name}") from None


def load_cifar(name: str, data_dir: Path, download: bool) -> tuple[ImageSet, ImageSet, list[str]]:
    """Read CIFAR ``name`` ("cifar10" or "cifar100") from ``data_dir``: (train, test, classes).

    Images are uint8 ``(N, 3, 32, 32)``; labels int64 (CIFAR-100: the 100 fine labels).
    """
    spec = ARCHIVES[name]
    data_dir = Path(data_dir)
    folder = data_dir / spec.folder
    if not folder.is_dir():
        archive = data_dir / spec.filename
        hint = (
            f"To provide {name} by hand, download {spec.url} (MD5 {spec.md5}) to {archive}, or "
            f"extract it so that {folder}/ holds {', '.join(spec.files)}."
        )
        if archive.is_file():
            actual = file_md5(archive)
            if actual != spec.md5:
                raise UserError(
                    f"{archive}: MD5 is {actual}, expected {spec.md5} (incomplete or corrupted "
                    f"archive); delete it to download again. {hint}"
                )
        elif download:
            fetch(spec.url, archive, spec.md5, manual_hint=hint)
        else:
            raise FileNotFoundError(
                f"{name}: neither {folder}/ nor {archive} exists and download is off. {hint}"
            )
        _extract(archive, spec, folder)

    train_parts = [_read_batch(folder / f, spec) for f in spec.train_files]
    train = ImageSet(
        torch.cat([images for images, _ in train_parts]),
        torch.cat([labels for _, labels in train_parts]),
    )
    test = ImageSet(*_read_batch(folder / spec.test_file, spec))
    return train, test, _read_classes(folder / spec.meta_file, spec)


def _extract(archive: Path, spec: CifarArchive, folder: Path) -> None:
    """Extract the batch files of ``archive`` into ``folder``, which appears only when complete."""
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}."))
    try:
        with tarfile.open(archive, "r:gz") as tar:
            for file in spec.files:
                member = f"{spec.folder}/{file}"
                try:
                    source = tar.extractfile(member)
                except KeyError:
                    source = None
                if source is None:
                    raise UserError(f"{archive}: the archive has no file {member}")
                with source, open(tmp / file, "wb") as out:
                    shutil.copyfileobj(source, out)
        os.replace(tmp, folder)
    except (tarfile.TarError, EOFError, OSError, zlib.error) as err:
        raise UserError(
            f"{archive}: cannot extract ({err}); delete it and download it again"
        ) from err
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _unpickle(path: Path, spec: CifarArchive) -> dict[str, object]:
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: CIFAR file missing; {path.parent}/ must hold {', '.join(spec.files)}"
        )
    try:
        content = _CifarUnpickler(io.BytesIO(path.read_bytes()), encoding="bytes").load()
    except Exception as err:  # corrupted pickles fail in many ways; all mean the same here
        raise UserError(
            f"{path}: not a complete CIFAR batch file ({type(err).__name__}: {err}); it is "
            f"truncated or corrupted, replace it (or delete {path.parent}/ to extract it again)"
        ) from err
    if not isinstance(content, dict):
        raise UserError(f"{path}: expected a pickled dict, got {type(content).__name__}")
    return {k.decode() if isinstance(k, bytes) else k: v for k, v in content.items()}


def _read_batch(path: Path, spec: CifarArchive) -> tuple[torch.Tensor, torch.Tensor]:
    """Images uint8 ``(N, 3, 32, 32)`` and labels int64 ``(N,)`` of one batch file."""
    batch = _unpickle(path, spec)
    data = batch.get("data")
    if (
        not isinstance(data, np.ndarray)
        or data.dtype != np.uint8
        or data.ndim != 2
        or (data.shape[1] != _PIXELS)
    ):
        got = (
            f"{data.dtype} array of shape {data.shape}"
            if isinstance(data, np.ndarray)
            else (type(data).__name__)
        )
        raise UserError(f"{path}: 'data' must be a uint8 array of shape (N, {_PIXELS}), got {got}")
    labels = batch.get(spec.label_key)
    if not isinstance(labels, (list, np.ndarray)) or len(labels) != data.shape[0]:
        got = (
            f"{len(labels)} entries"
            if isinstance(labels, (list, np.ndarray))
            else (type(labels).__name__)
        )
        raise UserError(
            f"{path}: '{spec.label_key}' must list one label per image ({data.shape[0]}), got {got}"
        )
    labels_np = np.asarray(labels)
    if labels_np.dtype.kind not in "iu" or (
        len(labels_np) and not (labels_np.min() >= 0 and labels_np.max() < spec.num_classes)
    ):
        raise UserError(
            f"{path}: '{spec.label_key}' must be integers in [0, {spec.num_classes}), got "
            f"{labels_np.dtype} values {labels_np[:5].tolist()}..."
        )
    images = torch.from_numpy(np.ascontiguousarray(data)).reshape(-1, 3, 32, 32)
    return images, torch.from_numpy(labels_np.astype(np.int64))


def _read_classes(path: Path, spec: CifarArchive) -> list[str]:
    names = _unpickle(path, spec).get(spec.names_key)
    if not isinstance(names, list) or len(names) != spec.num_classes:
        raise UserError(
            f"{path}: '{spec.names_key}' must list {spec.num_classes} class names, got "
            f"{len(names) if isinstance(names, list) else type(names).__name__}"
        )
    return [n.decode() if isinstance(n, bytes) else str(n) for n in names]

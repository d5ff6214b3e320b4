"""CIFAR-10/100: archives built in the exact CIFAR pickle format, served from 127.0.0.1."""

import dataclasses
import hashlib
import io
import pickle
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

from attnconv.data import DownloadError, cifar, load_splits
from attnconv.data.cifar import load_cifar

PER_BATCH = 12  # images per batch file: 5 × 12 = 60 training images for CIFAR-10


def cifar_rows(images):
    """(N, 3, 32, 32) uint8 -> the (N, 3072) rows of a CIFAR batch, written out by definition:
    value (channel c, row r, column x) sits at column 1024·c + 32·r + x."""
    c, r, x = np.meshgrid(np.arange(3), np.arange(32), np.arange(32), indexing="ij")
    rows = np.zeros((len(images), 3072), dtype=np.uint8)
    rows[:, 1024 * c + 32 * r + x] = images[:, c, r, x]
    return rows


def write_pickle(path, obj):
    path.write_bytes(pickle.dumps(obj, protocol=2))  # the archives' own protocol


def random_images(rng, n):
    return rng.integers(0, 256, size=(n, 3, 32, 32), dtype=np.uint8)


def make_cifar10_folder(root, seed=0):
    """Write cifar-10-batches-py/ under root; return (train images, train labels, test ...)."""
    rng = np.random.default_rng(seed)
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    batches = []
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        images = random_images(rng, PER_BATCH)
        labels = rng.integers(0, 10, size=PER_BATCH).tolist()
        write_pickle(
            folder / name,
            {
                b"batch_label": name.encode(),
                b"labels": labels,
                b"data": cifar_rows(images),
                b"filenames": [f"img_{i}.png".encode() for i in range(PER_BATCH)],
            },
        )
        batches.append((images, labels))
    names = [b"airplane", b"automobile", b"bird", b"cat", b"deer"]
    names += [b"dog", b"frog", b"horse", b"ship", b"truck"]
    write_pickle(
        folder / "batches.meta",
        {b"num_cases_per_batch": PER_BATCH, b"label_names": names, b"num_vis": 3072},
    )
    train_images = np.concatenate([b[0] for b in batches[:5]])
    train_labels = [label for b in batches[:5] for label in b[1]]
    return train_images, train_labels, batches[5][0], batches[5][1]


def make_archive(folder, archive):
    """A .tar.gz holding folder/ under its own name (plus a readme, as the real one)."""
    with tarfile.open(archive, "w:gz") as tar:
        for path in sorted(folder.iterdir()):
            tar.add(path, arcname=f"{folder.name}/{path.name}")
        readme = b"<html>readme</html>"
        info = tarfile.TarInfo(f"{folder.name}/readme.html")
        info.size = len(readme)
        tar.addfile(info, io.BytesIO(readme))
    return hashlib.md5(archive.read_bytes()).hexdigest()


def serve_cifar10(tmp_path, http_root, monkeypatch, md5=None):
    root, base = http_root
    expected = make_cifar10_folder(tmp_path / "source")
    real_md5 = make_archive(
        tmp_path / "source" / "cifar-10-batches-py", root / "cifar-10-python.tar.gz"
    )
    spec = dataclasses.replace(
        cifar.ARCHIVES["cifar10"], url=base + "cifar-10-python.tar.gz", md5=md5 or real_md5
    )
    monkeypatch.setitem(cifar.ARCHIVES, "cifar10", spec)
    return expected


def test_reads_a_cifar10_folder_in_batch_order(tmp_path):
    train_images, train_labels, test_images, test_labels = make_cifar10_folder(tmp_path)
    train, test, classes = load_cifar("cifar10", tmp_path, download=False)
    assert train.images.dtype == torch.uint8 and train.images.shape == (60, 3, 32, 32)
    assert np.array_equal(train.images.numpy(), train_images)
    assert train.labels.tolist() == train_labels
    assert np.array_equal(test.images.numpy(), test_images)
    assert test.labels.tolist() == test_labels
    assert classes[0] == "airplane" and classes[9] == "truck"


def test_load_splits_cifar10_carves_validation_and_uses_paper_normalisation(tmp_path):
    train_images, train_labels, test_images, _ = make_cifar10_folder(tmp_path)
    splits = load_splits("cifar10", data_dir=tmp_path, val_size=15, seed=4, download=False)
    assert (len(splits.train), len(splits.val), len(splits.test)) == (45, 15, 12)

    def pairs(images, labels):
        return sorted(zip(map(bytes, np.asarray(images)), np.asarray(labels).tolist(), strict=True))

    # train and val partition the official training set, each image with its own label
    carved = pairs(splits.train.images, splits.train.labels) + pairs(
        splits.val.images, splits.val.labels
    )
    assert sorted(carved) == pairs(train_images, train_labels)
    assert np.array_equal(splits.test.images.numpy(), test_images)
    assert splits.mean == (0.4914, 0.4822, 0.4465) and splits.std == (0.2023, 0.1994, 0.2010)
    assert (splits.num_classes, splits.channels, splits.image_size) == (10, 3, (32, 32))
    assert splits.flip is True and splits.name == "cifar10"


def test_cifar100_uses_fine_labels_and_training_statistics(tmp_path):
    rng = np.random.default_rng(1)
    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    sets = {}
    for name, n in (("train", 40), ("test", 8)):
        images = random_images(rng, n)
        fine = rng.integers(0, 100, size=n).tolist()
        write_pickle(
            folder / name,
            {
                b"filenames": [b"x.png"] * n,
                b"batch_label": name.encode(),
                b"fine_labels": fine,
                b"coarse_labels": [f // 5 for f in fine],
                b"data": cifar_rows(images),
            },
        )
        sets[name] = (images, fine)
    write_pickle(
        folder / "meta",
        {
            b"fine_label_names": [f"fine{i}".encode() for i in range(100)],
            b"coarse_label_names": [f"coarse{i}".encode() for i in range(20)],
        },
    )
    splits = load_splits("cifar100", data_dir=tmp_path, val_size=0.25, download=False)
    assert (len(splits.train), len(splits.val), len(splits.test)) == (30, 10, 8)
    assert splits.num_classes == 100 and splits.classes[37] == "fine37"
    assert splits.test.labels.tolist() == sets["test"][1]
    train = splits.train.images.numpy().astype(np.float64) / 255
    assert np.allclose(splits.mean, train.mean(axis=(0, 2, 3)), atol=1e-12)
    assert np.allclose(splits.std, train.std(axis=(0, 2, 3)), atol=1e-12)


def test_download_checks_md5_and_extracts(tmp_path, http_root, monkeypatch):
    train_images, _, test_images, _ = serve_cifar10(tmp_path, http_root, monkeypatch)
    data_dir = tmp_path / "data"
    train, test, _ = load_cifar("cifar10", data_dir, download=True)
    assert np.array_equal(train.images.numpy(), train_images)
    assert np.array_equal(test.images.numpy(), test_images)
    assert sorted(p.name for p in data_dir.iterdir()) == [
        "cifar-10-batches-py",
        "cifar-10-python.tar.gz",
    ]
    assert sorted(p.name for p in (data_dir / "cifar-10-batches-py").iterdir()) == sorted(
        cifar.ARCHIVES["cifar10"].files
    )


def test_download_with_bad_checksum_leaves_nothing(tmp_path, http_root, monkeypatch):
    serve_cifar10(tmp_path, http_root, monkeypatch, md5="0" * 32)
    data_dir = tmp_path / "data"
    with pytest.raises(DownloadError, match=r"MD5 is [0-9a-f]{32}, expected 0{32}.*by hand"):
        load_cifar("cifar10", data_dir, download=True)
    assert list(data_dir.iterdir()) == []


def test_failed_download_says_how_to_provide_the_files(tmp_path, http_root, monkeypatch):
    _, base = http_root
    spec = dataclasses.replace(cifar.ARCHIVES["cifar10"], url=base + "cifar-10-python.tar.gz")
    monkeypatch.setitem(cifar.ARCHIVES, "cifar10", spec)  # nothing served: HTTP 404
    data_dir = tmp_path / "data"
    with pytest.raises(DownloadError, match=r"could not download .*404.*cifar-10-batches-py/"):
        load_cifar("cifar10", data_dir, download=True)
    assert list(data_dir.iterdir()) == []


def test_missing_files_without_download(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"cifar-10-python\.tar\.gz.*download is off"):
        load_cifar("cifar10", tmp_path, download=False)


def test_archive_provided_by_hand_with_wrong_md5_is_refused(tmp_path):
    make_cifar10_folder(tmp_path / "source")
    archive = tmp_path / "data" / "cifar-10-python.tar.gz"
    archive.parent.mkdir()
    make_archive(tmp_path / "source" / "cifar-10-batches-py", archive)
    with pytest.raises(ValueError, match=r"cifar-10-python\.tar\.gz: MD5 is .*expected c58f3010"):
        load_cifar("cifar10", tmp_path / "data", download=True)
    assert archive.exists() and not (tmp_path / "data" / "cifar-10-batches-py").exists()


def test_truncated_batch_file_is_named(tmp_path):
    make_cifar10_folder(tmp_path)
    path = tmp_path / "cifar-10-batches-py" / "data_batch_2"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(ValueError, match=r"data_batch_2: not a complete CIFAR batch.*truncated"):
        load_cifar("cifar10", tmp_path, download=False)


def test_missing_batch_file_is_named(tmp_path):
    make_cifar10_folder(tmp_path)
    (tmp_path / "cifar-10-batches-py" / "data_batch_3").unlink()
    with pytest.raises(FileNotFoundError, match=r"data_batch_3: CIFAR file missing"):
        load_cifar("cifar10", tmp_path, download=True)


def test_wrong_shapes_are_named(tmp_path):
    make_cifar10_folder(tmp_path)
    folder = tmp_path / "cifar-10-batches-py"
    write_pickle(
        folder / "test_batch", {b"data": np.zeros((4, 1024), np.uint8), b"labels": [0] * 4}
    )
    with pytest.raises(ValueError, match=r"test_batch: 'data' must be a uint8 array of shape"):
        load_cifar("cifar10", tmp_path, download=False)
    write_pickle(
        folder / "test_batch", {b"data": np.zeros((4, 3072), np.uint8), b"labels": [0] * 3}
    )
    with pytest.raises(ValueError, match=r"test_batch: 'labels' must list one label per image"):
        load_cifar("cifar10", tmp_path, download=False)
    write_pickle(
        folder / "test_batch", {b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 10]}
    )
    with pytest.raises(ValueError, match=r"test_batch: 'labels' must be integers in \[0, 10\)"):
        load_cifar("cifar10", tmp_path, download=False)


def test_batch_files_cannot_run_code(tmp_path):
    make_cifar10_folder(tmp_path)
    sentinel = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (Path.touch, (sentinel,))

    path = tmp_path / "cifar-10-batches-py" / "data_batch_1"
    path.write_bytes(pickle.dumps({b"data": Payload()}, protocol=4))
    with pytest.raises(ValueError, match=r"data_batch_1: .*unexpected object pathlib"):
        load_cifar("cifar10", tmp_path, download=False)
    assert not sentinel.exists()

"""Fashion-MNIST: idx files written here byte by byte, the real Debian files, and downloads."""

import gzip
import hashlib
import struct

import numpy as np
import pytest

from attnconv.data import DownloadError, fashion_mnist, load_splits
from attnconv.data.fashion_mnist import load_fashion_mnist, read_idx


def idx_bytes(array):
    """The idx encoding of a uint8 array: 0, 0, 0x08, ndim, big-endian sizes, values."""
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(struct.pack(">I", d) for d in array.shape)
    return header + array.astype(np.uint8).tobytes()


def write_idx(path, array):
    data = idx_bytes(array)
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)


def write_fashion_folder(folder, n_train=7, n_test=3, seed=0, gz=True):
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    arrays = {}
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        arrays[f"{prefix}-images-idx3-ubyte"] = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        arrays[f"{prefix}-labels-idx1-ubyte"] = rng.integers(0, 10, n, dtype=np.uint8)
    for stem, array in arrays.items():
        write_idx(folder / (f"{stem}.gz" if gz else stem), array)
    return arrays


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_read_idx_round_trips_values(tmp_path, suffix):
    images = np.random.default_rng(0).integers(0, 256, (5, 3, 4), dtype=np.uint8)
    write_idx(tmp_path / f"images{suffix}", images)
    out = read_idx(tmp_path / f"images{suffix}", 3)
    assert out.shape == (5, 3, 4) and np.array_equal(out, images)
    labels = np.array([3, 1, 4, 1, 5], dtype=np.uint8)
    write_idx(tmp_path / f"labels{suffix}", labels)
    assert read_idx(tmp_path / f"labels{suffix}", 1).tolist() == [3, 1, 4, 1, 5]


def test_bad_magic_number_is_named(tmp_path):
    path = tmp_path / "train-labels-idx1-ubyte"
    write_idx(path, np.zeros((4, 2), dtype=np.uint8))  # 2-D: magic 0x00000802
    with pytest.raises(ValueError, match=r"train-labels-idx1-ubyte: bad magic number 0x00000802"):
        read_idx(path, 1)


def test_truncated_idx_files_are_named(tmp_path):
    raw = idx_bytes(np.zeros((3, 28, 28), dtype=np.uint8))
    path = tmp_path / "t10k-images-idx3-ubyte"
    path.write_bytes(raw[:-10])
    with pytest.raises(ValueError, match=r"t10k-images-idx3-ubyte: truncated .*2352 values"):
        read_idx(path, 3)
    gz = tmp_path / "t10k-images-idx3-ubyte.gz"
    gz.write_bytes(gzip.compress(raw)[:-20])
    with pytest.raises(ValueError, match=r"t10k-images-idx3-ubyte\.gz: cannot read"):
        read_idx(gz, 3)


@pytest.mark.needs_fashion_mnist
def test_real_debian_files(tmp_path):
    # data_dir has no fashion-mnist/ folder: the system copy is used
    train, test, classes = load_fashion_mnist(tmp_path, download=False)
    assert train.images.shape == (60000, 1, 28, 28) and test.images.shape == (10000, 1, 28, 28)
    # the published set is balanced, and its first images (train and test) are ankle boots
    assert train.labels.bincount().tolist() == [6000] * 10
    assert test.labels.bincount().tolist() == [1000] * 10
    assert classes[train.labels[0]] == classes[test.labels[0]] == "Ankle boot"
    with gzip.open(fashion_mnist.SYSTEM_DIR / "train-images-idx3-ubyte.gz") as f:
        first = np.frombuffer(f.read(16 + 784)[16:], dtype=np.uint8).reshape(28, 28)
    assert np.array_equal(train.images[0, 0].numpy(), first)
    splits = load_splits("fashion-mnist", data_dir=tmp_path, download=False)
    assert (len(splits.train), len(splits.val), len(splits.test)) == (55000, 5000, 10000)
    assert splits.flip is True and splits.channels == 1 and splits.image_size == (28, 28)
    pixels = splits.train.images.double() / 255
    assert splits.mean[0] == pytest.approx(pixels.mean().item(), abs=1e-9)
    assert splits.std[0] == pytest.approx(pixels.std(correction=0).item(), abs=1e-9)


@pytest.mark.parametrize("gz", [True, False])
def test_a_folder_in_data_dir_comes_first(tmp_path, gz):
    arrays = write_fashion_folder(tmp_path / "fashion-mnist", gz=gz)
    train, test, _ = load_fashion_mnist(tmp_path, download=False)
    assert np.array_equal(train.images[:, 0].numpy(), arrays["train-images-idx3-ubyte"])
    assert train.labels.tolist() == arrays["train-labels-idx1-ubyte"].tolist()
    assert np.array_equal(test.images[:, 0].numpy(), arrays["t10k-images-idx3-ubyte"])


def test_inconsistent_files_are_named(tmp_path):
    folder = tmp_path / "fashion-mnist"
    write_fashion_folder(folder)
    write_idx(folder / "t10k-labels-idx1-ubyte.gz", np.zeros(4, dtype=np.uint8))
    with pytest.raises(ValueError, match=r"t10k-labels-idx1-ubyte\.gz: 4 labels for 3 images"):
        load_fashion_mnist(tmp_path, download=False)
    write_idx(folder / "train-images-idx3-ubyte.gz", np.zeros((7, 27, 28), dtype=np.uint8))
    with pytest.raises(ValueError, match=r"train-images-idx3-ubyte\.gz: images must be 28×28"):
        load_fashion_mnist(tmp_path, download=False)


@pytest.fixture
def served(tmp_path, http_root, monkeypatch):
    """Fashion-MNIST .gz files served from 127.0.0.1 on a free port; the system copy hidden."""
    root, base = http_root
    arrays = write_fashion_folder(root)
    monkeypatch.setattr(fashion_mnist, "SYSTEM_DIR", tmp_path / "not-installed")
    monkeypatch.setattr(fashion_mnist, "BASE_URL", base)
    for name in fashion_mnist.MD5S:
        monkeypatch.setitem(
            fashion_mnist.MD5S, name, hashlib.md5((root / name).read_bytes()).hexdigest()
        )
    return arrays


def test_download_checks_each_file(tmp_path, served):
    data_dir = tmp_path / "data"
    train, _, _ = load_fashion_mnist(data_dir, download=True)
    assert np.array_equal(train.images[:, 0].numpy(), served["train-images-idx3-ubyte"])
    assert sorted(p.name for p in (data_dir / "fashion-mnist").iterdir()) == sorted(
        fashion_mnist.MD5S
    )


def test_download_with_bad_checksum_keeps_nothing(tmp_path, served, monkeypatch):
    monkeypatch.setitem(fashion_mnist.MD5S, "train-labels-idx1-ubyte.gz", "f" * 32)
    data_dir = tmp_path / "data"
    with pytest.raises(DownloadError, match=r"train-labels-idx1-ubyte\.gz but its MD5 .*by hand"):
        load_fashion_mnist(data_dir, download=True)
    assert "train-labels-idx1-ubyte.gz" not in {
        p.name for p in (data_dir / "fashion-mnist").iterdir()
    }
    assert not list((data_dir / "fashion-mnist").glob("*.part"))


def test_missing_files_without_download(tmp_path, monkeypatch):
    monkeypatch.setattr(fashion_mnist, "SYSTEM_DIR", tmp_path / "not-installed")
    with pytest.raises(FileNotFoundError, match=r"download is off.*dataset-fashion-mnist"):
        load_fashion_mnist(tmp_path, download=False)


def gz_idx(path, array=None, raw=None):
    """Write ``array`` (or the ``raw`` bytes) gzipped as the idx file ``path``."""
    path.write_bytes(gzip.compress(idx_bytes(array) if raw is None else raw))


@pytest.mark.parametrize(
    ("test_images", "message"),
    [
        (b"\x00\x00\x08\x03\x00\x00", "truncated idx header: 6 bytes, expected 16 (the magic"),
        (
            bytes([0, 0, 8, 3]) + struct.pack(">III", 2**31, 2**31, 4),
            "header says shape (2147483648, 2147483648, 4), 18446744073709551616 values, but 0 "
            "bytes follow it",
        ),
        (idx_bytes(np.zeros((0, 28, 28))), "holds no images: an empty split"),
    ],
    ids=["6-byte header", "overflowing sizes", "empty test split"],
)
def test_eval_on_malformed_files_is_one_line_naming_the_file(
    tmp_path, capsys, test_images, message
):
    from attnconv import cli

    folder = tmp_path / "fashion-mnist"
    folder.mkdir()
    # more training images than the 5000 the validation split takes
    gz_idx(folder / "train-images-idx3-ubyte.gz", np.zeros((5010, 28, 28)))
    gz_idx(folder / "train-labels-idx1-ubyte.gz", np.arange(5010) % 10)
    gz_idx(folder / "t10k-images-idx3-ubyte.gz", raw=test_images)
    gz_idx(folder / "t10k-labels-idx1-ubyte.gz", np.zeros(0))
    argv = ["eval", "--pretrained", "quadratic-fashion", "--data-dir", str(tmp_path)]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert err.startswith(f"attnconv eval: error: {folder / 't10k-images-idx3-ubyte.gz'}: "), err
    assert message in err, err


def test_a_download_killed_midway_leaves_no_part_file_behind(tmp_path, served):
    """A killed download leaves its ``.NAME.XXXX.part`` file; the next download into the folder
    removes it, but not the one a running download still writes (it holds its lock)."""
    import fcntl
    import os

    folder = tmp_path / "data" / "fashion-mnist"
    folder.mkdir(parents=True)
    killed = folder / ".train-images-idx3-ubyte.gz.k1ll3d.part"
    killed.write_bytes(b"the first half of a download")
    running = folder / ".t10k-images-idx3-ubyte.gz.runn1n.part"
    running.write_bytes(b"a download in progress")
    fd = os.open(running, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        train, _, _ = load_fashion_mnist(tmp_path / "data", download=True)
    finally:
        os.close(fd)
    assert np.array_equal(train.images[:, 0].numpy(), served["train-images-idx3-ubyte"])
    assert sorted(p.name for p in folder.iterdir()) == sorted([*fashion_mnist.MD5S, running.name])


def test_eval_refuses_a_dataset_of_another_image_size(tmp_path, capsys):
    """The digits checkpoint (8×8 images) on Fashion-MNIST (28×28, the same classes and channel):
    one line naming both sizes, not an accuracy of the model at a size it was not built for."""
    from pathlib import Path

    from attnconv import cli

    folder = tmp_path / "fashion-mnist"
    folder.mkdir()
    gz_idx(folder / "train-images-idx3-ubyte.gz", np.zeros((5010, 28, 28)))
    gz_idx(folder / "train-labels-idx1-ubyte.gz", np.arange(5010) % 10)
    gz_idx(folder / "t10k-images-idx3-ubyte.gz", np.zeros((20, 28, 28)))
    gz_idx(folder / "t10k-labels-idx1-ubyte.gz", np.arange(20) % 10)
    checkpoint = Path(__file__).parent / "fixtures" / "checkpoint-v1" / "quick-digits.pt"
    argv = ["eval", str(checkpoint), "--dataset", "fashion-mnist", "--data-dir", str(tmp_path)]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert "was built for 8x8 images, but dataset 'fashion-mnist' has 28x28" in err, err
    assert cli.main([*argv[:2], "--data-dir", str(tmp_path)]) == 0  # its own dataset: digits
    assert "accuracy" in capsys.readouterr().out

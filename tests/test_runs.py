"""runs.py: the run folder's paths (RunDir), the atomic writers and the folder lock."""

import errno
import json
import os
import re
import stat

import pytest

from attnconv.runs import (
    RunDir,
    RunFolderError,
    locked_run,
    remove_stale_temporaries,
    write_atomic,
    write_json,
    write_text_atomic,
)


def test_run_dir_paths(tmp_path):
    run = RunDir(str(tmp_path / "r"))
    root = tmp_path / "r"
    assert run.root == root
    assert (run.config, run.metrics, run.summary) == (
        root / "config.json",
        root / "metrics.jsonl",
        root / "summary.json",
    )
    assert (run.tensorboard, run.lock) == (root / "tensorboard", root / ".lock")
    assert (run.last, run.best) == (root / "checkpoints/last.pt", root / "checkpoints/best.pt")
    assert run.epoch_checkpoint(7) == root / "checkpoints/epoch_0007.pt"
    assert not root.exists()  # naming paths makes nothing


def test_epoch_checkpoints_in_epoch_order(tmp_path):
    run = RunDir(tmp_path)
    run.checkpoints.mkdir()
    for epoch in (10, 2, 1):
        run.epoch_checkpoint(epoch).write_bytes(b"")
    run.last.write_bytes(b"")
    assert run.epoch_checkpoints() == [run.epoch_checkpoint(e) for e in (1, 2, 10)]


def test_run_of_a_checkpoint(tmp_path):
    run = RunDir(tmp_path / "r")
    assert RunDir.of_checkpoint(run.best) == RunDir(tmp_path.resolve() / "r")
    assert RunDir.of_checkpoint(tmp_path / "model.pt") is None


def test_writers_replace_whole_files_with_plain_permissions(tmp_path):
    path = tmp_path / "summary.json"
    write_json(path, {"acc": 0.5, "epochs": [1, 2]})
    assert path.read_text() == '{\n  "acc": 0.5,\n  "epochs": [\n    1,\n    2\n  ]\n}\n'
    write_text_atomic(path, "é\n")
    assert path.read_bytes() == "é\n".encode()
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~mask
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]


def test_failed_write_keeps_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "metrics.jsonl"
    write_atomic(path, b"old\n")

    def full_disk(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(OSError, match="No space left"):
        write_atomic(path, b"new\n")
    assert path.read_bytes() == b"old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.jsonl"]


def test_lock_refuses_a_second_writer_and_cleans_temporaries(tmp_path):
    run = RunDir(tmp_path / "r")
    run.checkpoints.mkdir(parents=True)
    stale = run.checkpoints / ".last.pt.abc.tmp"
    stale.write_bytes(b"half")
    with locked_run(run.root):
        assert not stale.exists()
        holder = json.loads(run.lock.read_text())
        assert holder["pid"] == os.getpid()
        in_use = rf"run folder {run.root} is in use by process "
        with pytest.raises(RunFolderError, match=in_use), locked_run(run.root):
            pass
    with locked_run(run.root):  # released at the end of the block
        assert remove_stale_temporaries(run.root) == []


# ---------------------------------------------------------------------------- the one reader


def test_read_json_names_the_file_and_what_is_wrong(tmp_path):
    from attnconv.runs import FileFormatError, read_json

    path = tmp_path / "summary.json"
    cases = [
        (b"\xff\xfe{}", "cannot be read (not UTF-8 text: invalid start byte at byte 0)"),
        (b"[" * 100_000, "cannot be read (not valid JSON: nested too deeply)"),
        (b"{not json", "cannot be read (not valid JSON: Expecting property name"),
        (b"[]", "must hold an object, not an array"),
        (b'{"test_acc": "x"}', "test_acc must be a number, got a string 'x'"),
        (b'{"test_acc": true}', "test_acc must be a number, got a boolean True"),
        (b'{"other": 1}', "lacks 'test_acc'"),
    ]
    for data, message in cases:
        path.write_bytes(data)
        with pytest.raises(FileFormatError) as error:
            read_json(path, "the run's summary", fields={"test_acc": float})
        assert f"the run's summary {path}" in str(error.value) and message in str(error.value)
        assert "\n" not in str(error.value)
    path.write_bytes(b'{"test_acc": 1}')
    assert read_json(path, fields={"test_acc": float}) == {"test_acc": 1}
    path.write_bytes(b"x" * 100)
    with pytest.raises(FileFormatError, match="larger than 10 bytes"):
        read_json(path, limit=10)


def test_read_file_refuses_what_is_not_a_regular_file(tmp_path):
    from attnconv.runs import read_file

    os.mkfifo(tmp_path / "fifo")  # reading it would wait for a writer for ever
    os.symlink("/dev/zero", tmp_path / "zero")  # reading it would never end
    for name, message in (
        ("fifo", "is a FIFO (named pipe), not a regular file"),
        ("zero", "is a symbolic link to /dev/zero, a character device, not a regular file"),
        (".", "is a folder, not a regular file"),
    ):
        with pytest.raises(ValueError, match=re.escape(f"{tmp_path / name} {message}")):
            read_file(tmp_path / name, 100, "file")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_file(tmp_path / "missing", 100, "file")


def test_read_xz_stops_at_its_limit(tmp_path):
    import lzma

    from attnconv.runs import FileFormatError, read_xz

    data = bytes(range(256)) * 64
    packed = lzma.compress(data)
    assert read_xz(packed, len(data), "x") == data
    for limit in (len(data) - 1, 10):
        with pytest.raises(FileFormatError, match=f"more than the {limit} bytes"):
            read_xz(packed, limit, "x")
    with pytest.raises(FileFormatError, match="truncated"):
        read_xz(packed[:-20], len(data), "x")
    with pytest.raises(FileFormatError, match="3 bytes after its xz stream"):
        read_xz(packed + b"abc", len(data), "x")
    with pytest.raises(FileFormatError, match="not xz-compressed data"):
        read_xz(b"plain text, not an xz stream", 100, "x")


def test_temporaries_of_dead_writers_are_removed_and_live_ones_kept(tmp_path):
    import subprocess
    import sys

    from attnconv.runs import remove_dead_temporaries

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / "figures").mkdir()
    stale = [tmp_path / f".a.png.{dead.pid}-x1y2.tmp", tmp_path / "figures" / f".b.pdf.{dead.pid}-z.tmp"]
    kept = [
        tmp_path / f".c.png.{os.getpid()}-abc.tmp",  # this process's: a live writer's
        tmp_path / ".d.png.abc.tmp",  # no process id: not known to be dead
        tmp_path / "e.png",
    ]
    for path in stale + kept:
        path.write_bytes(b"")
    assert sorted(remove_dead_temporaries(tmp_path)) == sorted(stale)
    assert all(path.exists() for path in kept) and not any(path.exists() for path in stale)
    write_atomic(tmp_path / "f.json", b"{}")
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")) == sorted(
        path.name for path in kept[:2]
    )

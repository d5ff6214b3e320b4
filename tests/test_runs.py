"""runs.py: the run folder's paths (RunDir), the atomic writers and the folder lock."""

import errno
import json
import os
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

"""The run folder: its paths, the lock that gives it one writer, and the one atomic file writer.

A run folder (``RunDir``) holds ``config.json`` (the training config), ``metrics.jsonl`` (one JSON
record per finished epoch), ``summary.json`` (written when the run ends), ``tensorboard/``,
``checkpoints/`` (``last.pt``, ``best.pt``, ``epoch_NNNN.pt``) and ``.lock``. A process that writes
the folder holds an exclusive ``flock`` on ``.lock`` for as long as it runs (the kernel drops it
when the process dies, also by SIGKILL); a second writer is refused with the holder's process id.
The holder checks before it writes that ``.lock`` is still the file it locked (``RunLock.check``),
so a folder deleted or replaced meanwhile stops the run instead of being made again unlocked.
Every file is written by ``write_atomic`` (or ``write_text_atomic``/``write_json`` on top of it): a
temporary file in the same folder, flushed to disk, renamed over the target, so a reader or a
crash sees the old file or the new one. Temporary files a killed writer left behind are removed by
the next lock holder.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnconv.errors import UserError

TMP_SUFFIX = ".tmp"
CHECKPOINTS = "checkpoints"


class RunFolderError(UserError):
    """The run folder cannot be used: held by another process, not writable, or full."""


@dataclass(frozen=True)
class RunDir:
    """The paths of the run folder ``root`` (see the module docstring); nothing is read or made."""

    root: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))

    @classmethod
    def of_checkpoint(cls, checkpoint: str | Path) -> RunDir | None:
        """The run folder of a checkpoint stored as ``ROOT/checkpoints/NAME.pt``, else None."""
        parent = Path(checkpoint).resolve().parent
        return cls(parent.parent) if parent.name == CHECKPOINTS else None

    @property
    def config(self) -> Path:
        return self.root / "config.json"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def summary(self) -> Path:
        return self.root / "summary.json"

    @property
    def tensorboard(self) -> Path:
        return self.root / "tensorboard"

    @property
    def lock(self) -> Path:
        return self.root / ".lock"

    @property
    def checkpoints(self) -> Path:
        return self.root / CHECKPOINTS

    @property
    def last(self) -> Path:
        """The newest state of the run (also mid-epoch): what a resume starts from."""
        return self.checkpoints / "last.pt"

    @property
    def best(self) -> Path:
        """The epoch with the best validation accuracy so far."""
        return self.checkpoints / "best.pt"

    def epoch_checkpoint(self, epoch: int) -> Path:
        """The copy kept of the end of ``epoch`` (1-based) when ``checkpoint_every`` asks for it."""
        return self.checkpoints / f"epoch_{epoch:04d}.pt"

    def epoch_checkpoints(self) -> list[Path]:
        """The ``epoch_NNNN.pt`` files present, in epoch order."""
        return sorted(self.checkpoints.glob("epoch_*.pt"))


def checkpoint_file(path: str | Path) -> Path:
    """The checkpoint a command reads for ``path``: ``path`` itself if it is a file, and for a run
    folder its ``checkpoints/best.pt`` (the epoch chosen on validation, the one ``summary.json``'s
    test accuracy is of). FileNotFoundError (one line) if there is none."""
    path = Path(path)
    if not path.is_dir():
        if not path.is_file():
            raise FileNotFoundError(f"checkpoint {path} does not exist")
        return path
    run = RunDir(path)
    if not run.checkpoints.is_dir():
        raise FileNotFoundError(
            f"{path} is a folder but not a run folder (it has no {CHECKPOINTS}/)"
        )
    if not run.best.is_file():
        detail = f"give {run.last} for its newest state" if run.last.is_file() else "nor last.pt"
        raise FileNotFoundError(
            f"run folder {path} has no {run.best} yet (it is written when an epoch ends); {detail}"
        )
    return run.best


def plain_file_mode() -> int:
    """The permission bits ``open`` gives a new file: 0666 less the process umask."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def write_atomic(path: str | Path, data: bytes | memoryview) -> None:
    """Write ``data`` to ``path`` through a temporary file, fsync, and a rename.

    The file gets the permissions of a plain ``open`` (0666 less the umask), not the 0600 of
    ``mkstemp``. OSError (disk full, read-only, ...) leaves ``path`` as it was and no temporary
    file behind.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TMP_SUFFIX, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), plain_file_mode())
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_directory(path.parent)


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` with ``write_atomic``."""
    write_atomic(path, text.encode())


def write_json(path: str | Path, value: Any) -> None:
    """Write ``value`` as indented JSON (and a final newline) with ``write_atomic``."""
    write_text_atomic(path, json.dumps(value, indent=2) + "\n")


def parse_json(text: str) -> Any:
    """``json.loads(text)``; JSON nested deeper than Python's reader goes (its RecursionError) is
    a ValueError, as any other malformed JSON is."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def _fsync_directory(folder: Path) -> None:
    """Make a rename durable (POSIX); a no-op where folders cannot be opened."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def os_error_reason(err: OSError) -> str:
    """``err`` in words without its file name, e.g. ``no space left on the device (ENOSPC)``."""
    reasons = {
        errno.ENOSPC: "no space left on the device",
        errno.EDQUOT: "disk quota exceeded",
        errno.EFBIG: "file too large for this file system or process limit",
        errno.EROFS: "read-only file system",
        errno.EACCES: "permission denied",
        errno.EPERM: "operation not permitted",
    }
    name = errno.errorcode.get(err.errno or 0, "")
    reason = reasons.get(err.errno or 0, (err.strerror or str(err)).lower())
    return f"{reason} ({name})" if name else reason


def is_full(err: OSError) -> bool:
    """True for the errors that freeing space (or raising a size limit) fixes."""
    return err.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def not_writable_hint(run_dir: Path) -> str:
    return f"make {run_dir} writable or give another folder"


def _holder(lock_path: Path) -> str:
    try:
        info = json.loads(lock_path.read_text())
        return (
            f"process {int(info['pid'])} on {str(info['host'])[:64]!r} "
            f"(since {str(info['since'])[:32]})"
        )
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"


@dataclass(frozen=True)
class RunLock:
    """The lock a process holds on a run folder: the open ``.lock`` file ``fd`` of ``root``."""

    root: Path
    fd: int

    def check(self) -> None:
        """RunFolderError unless the folder's ``.lock`` is still the file this lock holds: the
        folder was deleted (or made again, and maybe locked by another writer) meanwhile, so
        writing to it now would make a run folder without a lock, or write over another run."""
        path = RunDir(self.root).lock
        held = os.fstat(self.fd)
        try:
            current = os.stat(path)
        except FileNotFoundError:
            what = f"was deleted while this run was writing it ({path} is gone)"
        else:
            if (current.st_dev, current.st_ino) == (held.st_dev, held.st_ino):
                return
            what = (
                f"was replaced while this run was writing it: its .lock is now held by "
                f"{_holder(path)}"
            )
        raise RunFolderError(
            f"run folder {self.root} {what}; the run stopped without writing to it again"
        )


@contextmanager
def locked_run(run_dir: str | Path) -> Iterator[RunLock]:
    """Create ``run_dir`` if needed and hold its exclusive lock for the ``with`` block; yields the
    lock, whose ``check()`` says whether the folder is still the one locked.

    Removes temporary files left in the folder by a killed writer. RunFolderError (one line) if
    another process holds the lock or the folder cannot be created or written.
    """
    run_dir = Path(run_dir)
    lock_path = RunDir(run_dir).lock
    try:
        RunDir(run_dir).checkpoints.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as err:
        raise RunFolderError(
            f"cannot write run folder {run_dir}: {os_error_reason(err)}; "
            f"{not_writable_hint(run_dir)}"
        ) from err
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as err:
            raise RunFolderError(
                f"run folder {run_dir} is in use by {_holder(lock_path)}; wait for it to end or "
                f"give another --out"
            ) from err
        holder = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "since": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(holder) + "\n").encode(), 0)
        remove_stale_temporaries(run_dir)
        yield RunLock(run_dir, fd)
    finally:
        os.close(fd)  # releases the lock


def remove_stale_temporaries(run_dir: Path) -> list[Path]:
    """Delete the ``.NAME.*.tmp`` files of interrupted writes in ``run_dir`` and its checkpoints
    folder (call it only while holding the lock); returns what was removed."""
    removed = []
    for folder in (run_dir, RunDir(run_dir).checkpoints):
        for path in folder.glob(f".*{TMP_SUFFIX}"):
            if path.is_file():
                path.unlink(missing_ok=True)
                removed.append(path)
    return removed

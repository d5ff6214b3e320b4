"""The run folder: its paths, the lock that gives it one writer, and the one atomic file writer.

A run folder (``RunDir``) holds ``config.json`` (the training config), ``metrics.jsonl`` (one JSON
record per finished epoch), ``summary.json`` (written when the run ends), ``tensorboard/``,
``checkpoints/`` (``last.pt``, ``best.pt``, ``epoch_NNNN.pt``) and ``.lock``. A process that writes
the folder holds an exclusive ``flock`` on ``.lock`` for as long as it runs (the kernel drops it
when the process dies, also by SIGKILL); a second writer is refused with the holder's process id.
The holder checks before it writes that ``.lock`` is still the file it locked (``RunLock.check``),
so a folder deleted or replaced meanwhile stops the run instead of being made again unlocked.
Every file is written by ``write_atomic`` (or ``write_text_atomic``/``write_json`` on top of it): a
temporary file in the same folder, named ``.NAME.PID-XXXX.tmp`` after the target and the writing
process, flushed to disk, renamed over the target, so a reader or a crash sees the old file or the
new one. Temporary files a killed writer left behind are removed by the next lock holder of a run
folder, and from any other output folder by the next command that writes it
(``remove_stale_temporaries``, which leaves those of live processes).

Every JSON, safetensors and xz file the package or a run folder holds is read by the one bounded
reader below (``read_file``, ``read_json``, ``read_xz``, ``safetensors_header``): sizes and nesting
bounded, types checked, and the file named in the one-line error (``FileFormatError``). A path that
must be a regular file and is not (missing, a folder, a FIFO, a device, a broken link) is named as
what it is (``require_regular_file``).
"""

from __future__ import annotations

import errno
import fcntl
import json
import lzma
import os
import re
import socket
import stat
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnconv.errors import UserError

TMP_SUFFIX = ".tmp"
CHECKPOINTS = "checkpoints"
# ``.NAME.PID-XXXX.tmp``: the temporary file of ``write_atomic``, with the writer's process id
_TEMPORARY = re.compile(r"^\..+\.(\d+)-[A-Za-z0-9_]+" + re.escape(TMP_SUFFIX) + "$")


class RunFolderError(UserError):
    """The run folder cannot be used: held by another process, not writable, or full."""


class FileFormatError(UserError):
    """A file that is not what it must be: too large, not UTF-8, malformed JSON, safetensors or
    xz, or a value of the wrong type; the message names the file."""


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
        return require_regular_file(path, "checkpoint")
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
    prefix = f".{path.name}.{os.getpid()}-"
    fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=TMP_SUFFIX, dir=path.parent)
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


def parse_json(text: str | bytes) -> Any:
    """``json.loads(text)``; JSON nested deeper than Python's reader goes (its RecursionError) is
    a ValueError, as any other malformed JSON is."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("nested too deeply") from None


# ---------------------------------------------------------------------------- the one reader

MAX_JSON_BYTES = 64 * 2**20
"""The largest JSON file ``read_json`` reads: a run folder's are kilobytes, ``index.json`` too."""

_FILE_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def path_problem(path: str | Path) -> str | None:
    """Why ``path`` is not a regular file one can read (``"does not exist"``, ``"is a folder"``,
    ``"is a FIFO (named pipe)"``, ``"is a symbolic link to /dev/zero, a character device"``, ...),
    or None if it is one. Links are followed, and named where they lead somewhere else."""
    path = Path(path)
    link = ""
    if path.is_symlink():
        link = f"a symbolic link to {os.readlink(path)}, "
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return f"is {link}which does not exist" if link else "does not exist"
    except NotADirectoryError:
        return "does not exist (a part of its path is not a folder)"
    except OSError as err:
        return f"cannot be read: {os_error_reason(err)}"
    for test, kind in _FILE_KINDS:
        if test(mode):
            what = f"{link}{kind}" if link else kind
            return f"is {what}, not a regular file"
    if not os.access(path, os.R_OK):
        return "cannot be read: permission denied (EACCES)"
    return None


def require_regular_file(path: str | Path, what: str = "file") -> Path:
    """``path`` if it is a regular file one can read (links followed); else FileNotFoundError
    (missing) or UserError (a folder, FIFO, device, socket, unreadable), one line naming it."""
    path = Path(path)
    problem = path_problem(path)
    if problem is None:
        return path
    message = f"{what} {path} {problem}"
    if problem.startswith("does not exist") or problem.endswith("which does not exist"):
        raise FileNotFoundError(message)
    raise UserError(message)


def _size(count: int) -> str:
    return f"{count / 2**20:.0f} MiB" if count >= 2**20 else f"{count} bytes"


def read_file(path: str | Path, limit: int, what: str = "file") -> bytes:
    """The bytes of the regular file ``path`` (``require_regular_file``), at most ``limit`` of
    them: FileFormatError naming the file if it holds more."""
    path = require_regular_file(path, what)
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size  # read(n) would set n bytes aside at once
        data = handle.read(min(size, limit) + 1)
    if len(data) > limit:
        raise FileFormatError(
            f"{what} {path} cannot be read (larger than {_size(limit)}, the most it may hold)"
        )
    return data


def json_kind(value: Any) -> str:
    """What a value read from JSON is, in JSON's words: ``an object``, ``a number``, ..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    kinds = {dict: "an object", list: "an array", str: "a string"}
    return kinds.get(type(value), "a number")


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


JsonType = type | tuple[type, ...]


_TYPE_WORDS = {dict: "an object", list: "an array", str: "a string", float: "a number",
               int: "an integer", bool: "a boolean", type(None): "null"}


def _fits(item: Any, allowed: tuple[type, ...]) -> bool:
    """Whether JSON ``item`` has one of the ``allowed`` types (``float`` takes integers too; a
    boolean is no number)."""
    if isinstance(item, bool):
        return bool in allowed
    if isinstance(item, int):
        return int in allowed or float in allowed
    return isinstance(item, allowed)


def check_fields(
    value: Mapping[str, Any], fields: Mapping[str, JsonType], where: str, optional: bool = False
) -> None:
    """FileFormatError naming ``where`` unless each key of ``fields`` in ``value`` has one of its
    types (``float`` also takes a JSON integer; a boolean is never a number); a missing key is
    an error too unless ``optional``."""
    for key, types in fields.items():
        if key not in value:
            if optional:
                continue
            raise FileFormatError(f"{where} lacks {key!r}")
        allowed = types if isinstance(types, tuple) else (types,)
        if not _fits(value[key], allowed):
            expected = " or ".join(_TYPE_WORDS.get(kind, kind.__name__) for kind in allowed)
            raise FileFormatError(
                f"{where}: {key} must be {expected}, got {json_kind(value[key])} "
                f"{_short(value[key])}"
            )


def read_json(
    path: str | Path,
    what: str = "JSON file",
    *,
    expect: type | None = dict,
    fields: Mapping[str, JsonType] | None = None,
    limit: int = MAX_JSON_BYTES,
) -> Any:
    """The JSON value in the regular file ``path`` (``read_file``: at most ``limit`` bytes),
    which must be UTF-8, nested no deeper than Python's reader goes, of type ``expect`` (None:
    any) and, for an object, have each key of ``fields`` with its type (``check_fields``).
    FileFormatError (one line naming the file) otherwise; FileNotFoundError if it is missing."""
    path = Path(path)
    data = read_file(path, limit, what)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise FileFormatError(
            f"{what} {path} cannot be read (not UTF-8 text: {err.reason} at byte {err.start})"
        ) from err
    try:
        value = parse_json(text)
    except ValueError as err:
        reason = str(err).splitlines()[0][:120]
        raise FileFormatError(f"{what} {path} cannot be read (not valid JSON: {reason})") from err
    if expect is not None and not isinstance(value, expect):
        raise FileFormatError(
            f"{what} {path} must hold {json_kind(expect())}, not {json_kind(value)}"
        )
    if fields:
        check_fields(value, fields, f"{what} {path}")
    return value


def read_xz(data: bytes, limit: int, where: str) -> bytes:
    """The bytes the single xz stream ``data`` decompresses to, stopping at ``limit`` bytes of
    output: FileFormatError naming ``where`` if it would give more (a decompression bomb), is not
    xz, is truncated or has bytes after its stream. Memory stays within ``limit``."""
    decompressor = lzma.LZMADecompressor(format=lzma.FORMAT_XZ)
    try:
        out = decompressor.decompress(data, max_length=limit + 1)
    except lzma.LZMAError as err:
        raise FileFormatError(f"{where} cannot be read (not xz-compressed data: {err})") from err
    if len(out) > limit:
        raise FileFormatError(
            f"{where} cannot be read (it decompresses to more than the {limit} bytes it may "
            f"hold; decompression stopped there)"
        )
    if not decompressor.eof:
        raise FileFormatError(f"{where} cannot be read (truncated: its xz stream does not end)")
    if decompressor.unused_data:
        extra = len(decompressor.unused_data)
        raise FileFormatError(f"{where} cannot be read ({extra} bytes after its xz stream)")
    return out


SAFETENSORS_HEADER_LIMIT = 100 * 2**20
"""The largest safetensors header read (the safetensors library's own limit)."""


def safetensors_header(data: bytes, where: str) -> tuple[dict[str, Any], int]:
    """The header of the safetensors file ``data`` and where its tensor data starts. Each entry
    but ``__metadata__`` (an object of strings) must have a string ``dtype``, a ``shape`` of
    non-negative integers and ``data_offsets`` of two integers that lie in the data.
    FileFormatError naming ``where`` otherwise, the header's size and nesting bounded."""
    if len(data) < 8:
        raise FileFormatError(
            f"{where} cannot be read ({len(data)} bytes, too few for a safetensors header)"
        )
    length = int.from_bytes(data[:8], "little")
    if length > min(SAFETENSORS_HEADER_LIMIT, len(data) - 8):
        raise FileFormatError(
            f"{where} cannot be read (its safetensors header says {length} bytes, more than the "
            f"file or {_size(SAFETENSORS_HEADER_LIMIT)} hold)"
        )
    start = 8 + length
    try:
        header = parse_json(bytes(data[8:start]).decode("utf-8"))
    except ValueError as err:  # UnicodeDecodeError, JSONDecodeError, nested too deeply
        reason = str(err).splitlines()[0][:120]
        raise FileFormatError(
            f"{where} cannot be read (its safetensors header is not JSON: {reason})"
        ) from err
    if not isinstance(header, dict):
        raise FileFormatError(
            f"{where} cannot be read (its safetensors header is {json_kind(header)}, not an "
            f"object)"
        )
    size = len(data) - start
    for name, entry in header.items():
        label = f"{where}: tensor {_short(name, 40)}"
        if name == "__metadata__":
            if not isinstance(entry, dict) or not all(isinstance(v, str) for v in entry.values()):
                raise FileFormatError(f"{where}: its __metadata__ is not an object of strings")
            continue
        if not isinstance(entry, dict):
            raise FileFormatError(f"{label} is {json_kind(entry)}, not an object")
        check_fields(entry, {"dtype": str, "shape": list, "data_offsets": list}, label)
        shape, offsets = entry["shape"], entry["data_offsets"]
        if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape):
            raise FileFormatError(f"{label} has a shape that is not a list of sizes")
        if not (
            len(offsets) == 2
            and all(isinstance(n, int) and not isinstance(n, bool) for n in offsets)
            and 0 <= offsets[0] <= offsets[1] <= size
        ):
            raise FileFormatError(f"{label} lies outside the file's data")
    return header, start


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


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (on this machine): signal 0 reaches it."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # none, or no process id at all
        return False
    except PermissionError:  # another user's process
        return True
    return pid > 0


def remove_dead_temporaries(folder: str | Path, depth: int = 2) -> list[Path]:
    """Delete the temporary files ``write_atomic`` left in ``folder`` (and its subfolders, down to
    ``depth`` levels) when its process was killed: ``.NAME.PID-XXXX.tmp`` whose process ``PID``
    no longer runs (a live writer's are kept). For output folders that have no lock; returns
    what was removed."""
    removed = []
    folders = [Path(folder)]
    for _ in range(depth + 1):
        below = []
        for current in folders:
            try:
                entries = list(os.scandir(current))
            except OSError:
                continue
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    below.append(Path(entry.path))
                    continue
                match = _TEMPORARY.match(entry.name)
                if match and entry.is_file(follow_symlinks=False) and not _alive(int(match[1])):
                    Path(entry.path).unlink(missing_ok=True)
                    removed.append(Path(entry.path))
        folders = below
    return removed

"""Careful downloads: stream to a temporary file, check the MD5, then rename.

A download that fails, or whose checksum does not match, leaves nothing behind and raises
``DownloadError`` saying what went wrong and how to provide the file by hand. A download that is
killed (SIGKILL, power loss) leaves its temporary ``.NAME.XXXX.part`` file; the download holds an
exclusive ``flock`` on it while it runs (the kernel drops it when the process dies), so the next
download into the folder removes the ``.part`` files nobody holds.
"""

from __future__ import annotations

import fcntl
import hashlib
import http.client
import os
import tempfile
import urllib.request
from pathlib import Path

from attnconv.runs import plain_file_mode

_CHUNK = 1 << 20
PART_SUFFIX = ".part"


def remove_stale_parts(folder: Path) -> list[Path]:
    """Delete the ``.NAME.XXXX.part`` files in ``folder`` that no running download holds (those
    of killed downloads); returns what was removed."""
    removed = []
    for path in Path(folder).glob(f".*{PART_SUFFIX}"):
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:  # its download just finished or failed
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # a download in progress
            os.close(fd)
            continue
        try:
            path.unlink(missing_ok=True)
            removed.append(path)
        finally:
            os.close(fd)
    return removed


def _locked_part(dest: Path) -> tuple[int, Path]:
    """A new ``.NAME.XXXX.part`` file next to ``dest``, open and exclusively locked: ``(fd, path)``."""
    while True:
        fd, name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=PART_SUFFIX)
        fcntl.flock(fd, fcntl.LOCK_EX)
        if os.fstat(fd).st_nlink:
            return fd, Path(name)
        os.close(fd)  # another download's cleanup removed it before the lock: make another


class DownloadError(FileNotFoundError):
    """A dataset file is not on disk and could not be downloaded (network error or bad MD5)."""


def file_md5(path: Path) -> str:
    """Hex MD5 digest of the file at ``path``."""
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def fetch(url: str, dest: Path, md5: str, *, manual_hint: str, timeout: float = 60.0) -> Path:
    """Download ``url`` to ``dest`` if its MD5 is ``md5``; return ``dest``.

    The bytes go to a temporary file next to ``dest`` that is renamed to ``dest`` only when the
    checksum matches; on any failure the temporary file is removed and ``DownloadError`` is raised
    with ``manual_hint`` (how to put the file in place by hand) appended. ``timeout`` is in seconds
    and bounds each network operation.
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_parts(dest.parent)
    fd, tmp = _locked_part(dest)
    os.fchmod(fd, plain_file_mode())  # mkstemp's 0600 would hide the dataset from other users
    try:
        digest = hashlib.md5(usedforsecurity=False)
        try:
            with (
                os.fdopen(fd, "wb", closefd=False) as out,
                urllib.request.urlopen(url, timeout=timeout) as resp,
            ):
                while chunk := resp.read(_CHUNK):
                    digest.update(chunk)
                    out.write(chunk)
        except (OSError, http.client.HTTPException) as err:
            raise DownloadError(f"could not download {url}: {err}. {manual_hint}") from err
        if digest.hexdigest() != md5:
            raise DownloadError(
                f"downloaded {url} but its MD5 is {digest.hexdigest()}, expected {md5} "
                f"(corrupted or changed download; nothing was kept). {manual_hint}"
            )
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
        os.close(fd)  # releases the lock, after the rename: no cleanup takes the finished file
    return dest

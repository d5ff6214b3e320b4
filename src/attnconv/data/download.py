"""Careful downloads: stream to a temporary file, check the MD5, then rename.

A download that fails, or whose checksum does not match, leaves nothing behind and raises
``DownloadError`` saying what went wrong and how to provide the file by hand.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import tempfile
import urllib.request
from pathlib import Path

from attnconv.runs import plain_file_mode

_CHUNK = 1 << 20


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
    fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
    os.fchmod(fd, plain_file_mode())  # mkstemp's 0600 would hide the dataset from other users
    tmp = Path(tmp_name)
    try:
        digest = hashlib.md5(usedforsecurity=False)
        try:
            with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=timeout) as resp:
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
    return dest

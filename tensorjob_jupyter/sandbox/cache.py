"""Where compiled guests and the Python interpreter are cached: ``cache_dir()``.

A leaf (standard library only), so ``compile`` (C/Zig/WAT modules) and
``python.interpreter`` (the CPython component and its compiled forms) share
one location without importing each other. ``$TENSORJOB_CACHE`` if set, else
``$XDG_CACHE_HOME/tensorjob/wasm``, else ``~/.cache/tensorjob/wasm``. Every
process on a machine with the same environment finds the same files there
(a map's local workers, a Dask cluster's workers started by the same user),
which is what lets them reuse one build. Deleting it is always safe.

Anything in it may have been put there by someone else, so its files are
read with ``open_regular``: a FIFO, a device or a socket where a file should
be is refused at once (opening a FIFO for reading blocks until a writer
comes; reading a device may never end), and so is a file past the size its
reader expects.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO

__all__ = ["cache_dir", "open_regular", "read_regular", "NotARegularFile"]


class NotARegularFile(OSError):
    """A cache entry that is not a regular file (or is larger than its reader takes): refused."""


def open_regular(path: str | os.PathLike, max_bytes: int | None = None) -> BinaryIO:
    """``path`` open for reading, if it is a regular file of at most ``max_bytes``; ``NotARegularFile``
    if not (``FileNotFoundError`` and other ``OSError`` as ``open`` raises them). Never blocks."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotARegularFile(f"{path} is not a regular file")
        if max_bytes is not None and st.st_size > max_bytes:
            raise NotARegularFile(f"{path} is {st.st_size} bytes, more than the {max_bytes} expected")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str | os.PathLike, max_bytes: int | None = None) -> bytes:
    """The bytes of ``path`` (see ``open_regular``)."""
    with open_regular(path, max_bytes) as f:
        data = f.read() if max_bytes is None else f.read(max_bytes + 1)
    if max_bytes is not None and len(data) > max_bytes:  # it grew while being read
        raise NotARegularFile(f"{path} is more than the {max_bytes} bytes expected")
    return data


def cache_dir() -> Path:
    """``$TENSORJOB_CACHE`` or ``~/.cache/tensorjob/wasm`` (created on demand by its users)."""
    env = os.environ.get("TENSORJOB_CACHE")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME")
    root = Path(base).expanduser() if base else Path.home() / ".cache"
    return root / "tensorjob" / "wasm"

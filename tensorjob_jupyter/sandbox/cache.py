"""Where compiled guests and the Python interpreter are cached: ``cache_dir()``.

A leaf (standard library and ``regular_file`` only), so ``compile`` (C/Zig/WAT modules) and
``python.interpreter`` (the CPython component and its compiled forms) share
one location without importing each other. ``$TENSORJOB_CACHE`` if set, else
``$XDG_CACHE_HOME/tensorjob/wasm``, else ``~/.cache/tensorjob/wasm``. Every
process on a machine with the same environment finds the same files there
(a map's local workers, a Dask cluster's workers started by the same user),
which is what lets them reuse one build. Deleting it is always safe.

Anything in it may have been put there by someone else, so its files are
read with ``open_regular`` (``regular_file``, the package's one safe open,
re-exported here): a FIFO, a device or a socket where a file should be is
refused at once, and so is a file past the size its reader expects.
"""

from __future__ import annotations

import os
from pathlib import Path

from tensorjob_jupyter.regular_file import NotARegularFile, open_regular, read_regular

__all__ = ["cache_dir", "open_regular", "read_regular", "NotARegularFile"]


def cache_dir() -> Path:
    """``$TENSORJOB_CACHE`` or ``~/.cache/tensorjob/wasm`` (created on demand by its users)."""
    env = os.environ.get("TENSORJOB_CACHE")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME")
    root = Path(base).expanduser() if base else Path.home() / ".cache"
    return root / "tensorjob" / "wasm"

"""A GGUF model file, checked before anything loads it.

Loading a model costs seconds and memory, and llama.cpp's own failure on a
wrong file is a log line and a null pointer; so a path is checked here first
-- it exists, is a file, can be read, starts with the GGUF magic and a
version llama.cpp reads -- and a ``ModelError`` names the path and what is
wrong with it.
"""

from __future__ import annotations

import os
from pathlib import Path

from tensorjob_jupyter.inference.base import ModelError
from tensorjob_jupyter.regular_file import open_regular

GGUF_MAGIC = b"GGUF"


def check_gguf(path: str | os.PathLike) -> Path:
    """The resolved path of a readable GGUF file, or ``ModelError`` naming the path."""
    p = Path(path).expanduser()
    if not p.exists():
        raise ModelError(f"model file not found: {p}")
    if not p.is_file():
        raise ModelError(f"model path is not a file: {p}")
    try:
        with open_regular(p) as f:  # a FIFO or a device in a model's place is refused, never read
            head = f.read(8)
    except OSError as e:
        raise ModelError(f"cannot read model file {p}: {e.strerror or e}") from None
    if len(head) < 8 or head[:4] != GGUF_MAGIC:
        raise ModelError(f"not a GGUF model file (bad magic {head[:4]!r}): {p}")
    version = int.from_bytes(head[4:8], "little")
    if version not in (2, 3):
        raise ModelError(f"unsupported GGUF version {version}: {p}")
    return p.resolve()


__all__ = ["GGUF_MAGIC", "check_gguf"]

"""The manifest: one item per non-blank JSONL line, read and checked in full first.

Items are numbered from 0 in manifest order, counting only non-blank lines.
The whole manifest is parsed before any item runs, so a line that is not
UTF-8, not JSON (``NaN`` included), or a manifest with no items raises
``ManifestError`` naming its 1-based line in the file rather than failing a
map halfway. A list of inputs is hashed as the JSONL it would be, so the
SHA-256 the ledger pins for resume means the same either way.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from ..abi import dumps
from .errors import ManifestError


@dataclass(frozen=True)
class Manifest:
    items: tuple[Any, ...]
    sha256: str
    source: str  # the file's absolute path, or "<list>"

    def __len__(self) -> int:
        return len(self.items)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse_manifest(data: bytes, source: str = "<bytes>") -> Manifest:
    """Every item of a JSONL manifest, or ``ManifestError`` naming the line."""
    items = []
    for number, raw in enumerate(data.split(b"\n"), start=1):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ManifestError(f"{source}: line {number} is not UTF-8 (byte {raw[e.start]:#04x} at "
                                f"column {e.start + 1})", number) from None
        if not text.strip():
            continue
        try:
            items.append(json.loads(text, parse_constant=_reject_constant))
        except json.JSONDecodeError as e:
            raise ManifestError(f"{source}: line {number} is not valid JSON: {e.msg} at column {e.colno}",
                                number) from None
        except ValueError as e:
            raise ManifestError(f"{source}: line {number} is not valid JSON: {e}", number) from None
    if not items:
        raise ManifestError(f"{source}: the manifest has no items (every line is blank)")
    return Manifest(tuple(items), hashlib.sha256(data).hexdigest(), source)


def read_manifest(manifest: str | os.PathLike | Sequence[Any]) -> Manifest:
    """A manifest from a JSONL file, or from a list of inputs (hashed as JSONL)."""
    if isinstance(manifest, (str, os.PathLike)):
        path = Path(manifest).absolute()
        try:
            data = path.read_bytes()
        except OSError as e:
            raise ManifestError(f"cannot read manifest {manifest}: {e.strerror}") from None
        return parse_manifest(data, str(path))
    try:
        data = "".join(dumps(item) + "\n" for item in manifest).encode("utf-8")
    except (TypeError, ValueError) as e:
        raise ManifestError(f"a manifest item is not JSON: {e}") from None
    return parse_manifest(data, "<list>")

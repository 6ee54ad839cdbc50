"""The manifest: one item per non-blank JSONL line, read and checked in full first.

Items are numbered from 0 in manifest order, counting only non-blank lines.
The whole manifest is parsed before any item runs, held to the rule guest
output is held to (``abi.loads_strict``: UTF-8, JSON without ``NaN`` or
duplicate keys, 64-bit integers, no lone surrogates, at most 128 levels), so
a bad line, or a manifest with no items, raises ``ManifestError`` naming its
1-based line in the file rather than failing a map halfway. A list of inputs is hashed as the JSONL it would be, so the
SHA-256 the ledger pins for resume means the same either way.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from ..abi import AbiError, dumps, loads_strict
from .errors import ManifestError


@dataclass(frozen=True)
class Manifest:
    items: tuple[Any, ...]
    sha256: str
    source: str  # the file's absolute path, or "<list>"

    def __len__(self) -> int:
        return len(self.items)


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
            items.append(loads_strict(raw, what=f"line {number}"))
        except AbiError as e:
            raise ManifestError(f"{source}: {e}", number) from None
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

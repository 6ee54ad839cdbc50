"""The manifest: one item per non-blank JSONL line, read and checked in full first.

Items are numbered from 0, and the whole manifest is held to the rule guest output is held to before any item
runs, so a bad line raises ``ManifestError`` naming it rather than failing a map halfway. A manifest is a file
from anywhere and may be large, so it is streamed with capped lines and its items kept as JSON bytes in one
buffer (``ManifestItems``). Each item also has a key (``item_key``) to name it to a person.

Design: docs/internals/fanout.md#manifestpy
"""

from __future__ import annotations

import hashlib
import io
import os
from array import array
from collections.abc import Sequence as SequenceABC
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Iterator, Sequence

import orjson

from tensorjob_jupyter.abi import AbiError, CheckedJson, dumps, loads_strict
from tensorjob_jupyter.fanout.errors import ManifestError, TooManyItems
from tensorjob_jupyter.regular_file import NotARegularFile, open_regular

#: Bytes of one manifest line (its newline aside): an item is one job's input, and a guest's command
#: is at most 16 MiB (``max_command_bytes``) too.
MAX_LINE_BYTES = 16 * 1024 * 1024


#: The input fields that name an item, in the order they are looked for (``item_key``).
KEY_FIELDS = ("id", "key", "name", "path", "file", "url")
#: The longest key kept (a key is for reading, not for joining on).
MAX_KEY_CHARS = 200


def item_key(value: Any, index: int) -> str:
    """What names item ``index`` to a person: its input's first ``KEY_FIELDS`` field that is a string or a
    whole number, the input itself when it is one, else the item number -- as text of at most
    ``MAX_KEY_CHARS`` characters."""
    if isinstance(value, dict):
        value = next((value[f] for f in KEY_FIELDS if _names(value.get(f))), None)
    if not _names(value):
        return str(index)
    text = str(value)
    return text if len(text) <= MAX_KEY_CHARS else text[:MAX_KEY_CHARS - 1] + "…"


def _names(value: Any) -> bool:
    return isinstance(value, (str, int)) and not isinstance(value, bool) and value != ""


class ManifestItems(SequenceABC):
    """A manifest's items, held as their checked JSON bytes (compact, as ``dumps`` writes them) in one buffer:
    parsed when asked for, or handed on as bytes (``checked``) for the item's job to parse once."""

    def __init__(self, data: bytes, ends: array):
        self._data = data
        self._ends = ends  # where each item's bytes end in ``_data``

    def __len__(self) -> int:
        return len(self._ends)

    def _item(self, index: int) -> Any:
        """Item ``index``, parsed by orjson: its bytes were held to ``loads_strict`` when the manifest was read,
        and for JSON that passes it the two give the same value (a property test holds them to it)."""
        return orjson.loads(self._bytes(index))

    def _bytes(self, index: int) -> bytes:
        start = self._ends[index - 1] if index else 0
        return self._data[start:self._ends[index]]

    def checked(self, index: int) -> CheckedJson:
        """Item ``index`` as its checked bytes, unparsed: what a map hands its job."""
        return CheckedJson(self._bytes(index))

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self._item(i) for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError("manifest item index out of range")
        return self._item(index)

    def __iter__(self) -> Iterator[Any]:
        for index in range(len(self)):
            yield self._item(index)

    def __repr__(self) -> str:
        return f"<{len(self)} manifest items, {len(self._data)} bytes>"


@dataclass(frozen=True)
class Manifest:
    items: ManifestItems
    sha256: str
    source: str  # the file's absolute path, or "<list>"

    def __len__(self) -> int:
        return len(self.items)


def _read_items(stream: IO[bytes], source: str, max_items: int | None = None) -> Manifest:
    """Every item of a JSONL stream, checked line by line; ``ManifestError`` naming the first bad line, or the
    line of item ``max_items + 1`` at once (the rest unread) when there may be at most ``max_items``."""
    digest = hashlib.sha256()
    data = bytearray()
    ends = array("Q")
    number = 0
    while True:
        raw = stream.readline(MAX_LINE_BYTES + 1)  # never more than the bound, however long the line
        if not raw:
            break
        number += 1
        digest.update(raw)
        line = raw[:-1] if raw.endswith(b"\n") else raw
        if len(line) > MAX_LINE_BYTES:
            raise ManifestError(f"{source}: line {number} is longer than {MAX_LINE_BYTES} bytes (MAX_LINE_BYTES)",
                                number)
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ManifestError(f"{source}: line {number} is not UTF-8 (byte {line[e.start]:#04x} at "
                                f"column {e.start + 1})", number) from None
        if not text.strip():
            continue
        del text
        try:
            value = loads_strict(line, what=f"line {number}")  # checked here, once
        except AbiError as e:
            raise ManifestError(f"{source}: {e}", number) from None
        line = dumps(value).encode("utf-8")  # kept compact: the bytes a job given this input is given
        if max_items is not None and len(ends) >= max_items:
            raise TooManyItems(f"{source}: more than {max_items} items (line {number} is item {max_items + 1})",
                               number)
        data += line
        ends.append(len(data))
    if not ends:
        raise ManifestError(f"{source}: the manifest has no items (every line is blank)")
    return Manifest(ManifestItems(bytes(data), ends), digest.hexdigest(), source)


def parse_manifest(data: bytes, source: str = "<bytes>") -> Manifest:
    """Every item of a JSONL manifest, or ``ManifestError`` naming the line."""
    return _read_items(io.BytesIO(data), source)


def _open_regular(path: Path) -> IO[bytes]:
    """``path`` opened for reading; ``ManifestError`` unless it is a regular file (a FIFO would block,
    a device such as ``/dev/zero`` never ends) -- checked on the open file (``regular_file``)."""
    try:
        return open_regular(path)
    except NotARegularFile as e:
        raise ManifestError(f"cannot read manifest {path}: it is {e.strerror}; a manifest is a JSONL file") from None
    except OSError as e:
        raise ManifestError(f"cannot read manifest {path}: {e.strerror}") from None


def read_manifest(manifest: "str | os.PathLike | Sequence[Any] | Manifest", *,
                  max_items: int | None = None) -> Manifest:
    """A manifest from a JSONL file, or from a list of inputs (hashed as JSONL), or one read already (a
    ``MapSpec``'s), as it is; ``max_items`` (a file or a list): refused at the first item past it, before the rest
    is read."""
    if isinstance(manifest, Manifest):
        return manifest
    if isinstance(manifest, (str, os.PathLike)):
        path = Path(manifest).absolute()
        with _open_regular(path) as f:
            try:
                return _read_items(f, str(path), max_items)
            except OSError as e:
                raise ManifestError(f"cannot read manifest {path}: {e.strerror}") from None
    try:
        data = "".join(dumps(item) + "\n" for item in manifest).encode("utf-8")
    except (TypeError, ValueError) as e:
        raise ManifestError(f"a manifest item is not JSON: {e}") from None
    return parse_manifest(data, "<list>")


__all__ = [
    "MAX_LINE_BYTES", "KEY_FIELDS", "MAX_KEY_CHARS", "item_key", "ManifestItems", "Manifest", "parse_manifest",
    "read_manifest"
]

"""Expected answers: which items of a map are labelled, and the answer each should give.

    expected = Expected.read("answers.jsonl", total, keys)   # or a list, or a dict {item or key: value}
    has, value = expected.get(7)                             # (False, None): item 7 is not labelled

A file is read and checked as a manifest is: one value a line in item order, or keyed lines
(``{"key": KEY, "expected": VALUE}``, ``{"item": N, ...}``); ``null`` or no line means not labelled. The run
folder keeps them (``expected.jsonl``) so a later session scores against the same answers. Apart from the
scorers: they are input from anywhere, checked as such, and a review's decisions become ``Expected`` answers
too (``reviews.review_expected``), with no scorer in sight.

Design: docs/internals/fanout.md#scoringpy
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence, TypeGuard

from tensorjob_jupyter.abi import dumps
from tensorjob_jupyter.fanout.errors import MapError, ScoringError, TooManyItems
from tensorjob_jupyter.fanout.map_folder import fsync_write  # the folder's one atomic writer
from tensorjob_jupyter.fanout.map_folder_reader import EXPECTED, FolderError, read_records
from tensorjob_jupyter.fanout.manifest import MAX_KEY_CHARS, read_manifest

#: The two shapes of a keyed expected line: by the manifest's key, or by item number (what the run folder keeps).
KEYED_SHAPES = (frozenset({"key", "expected"}), frozenset({"item", "expected"}))


def _keyed(value: Any) -> bool:
    return isinstance(value, dict) and frozenset(value) in KEYED_SHAPES


class Expected:
    """One expected answer for each of some items: ``get(i)`` is (True, value) or (False, None).

    An item is *labelled* when it has an expected answer that is not ``null``; every other item (``null``,
    no line for it, no key for it) is not labelled: not scored and not counted."""

    def __init__(self, values: Mapping[int, Any] | Sequence[Any], total: int, source: str, sha256: str):
        self._values = values
        self.total = total
        self.source = source
        self.sha256 = sha256
        if isinstance(values, Mapping):
            self._labelled = sorted(i for i, v in values.items() if v is not None)
        else:  # a manifest's items, parsed once here (and again when asked for: they are kept as bytes)
            self._labelled = [i for i, v in enumerate(values) if v is not None and i < total]

    def get(self, item: int) -> tuple[bool, Any]:
        if isinstance(self._values, Mapping):
            value = self._values.get(item)
        else:
            value = self._values[item] if 0 <= item < min(len(self._values), self.total) else None
        return (True, value) if value is not None else (False, None)

    def items(self) -> Iterator[tuple[int, Any]]:
        """The labelled items and their expected answers, in item order."""
        for item in self._labelled:
            yield item, self.get(item)[1]

    @property
    def labelled(self) -> int:
        """How many items have an expected answer (not ``null``)."""
        return len(self._labelled)

    def __len__(self) -> int:
        return len(self._labelled)

    @classmethod
    def read(cls, spec: Any, total: int, keys: "Callable[[], Sequence[str]] | None" = None) -> "Expected":
        """Expected answers for a map of ``total`` items: a JSONL file or a list -- one value per item in item
        order (``null`` and items past its end are not labelled), or one ``{"key": KEY, "expected": VALUE}``
        (or ``{"item": N, "expected": VALUE}``) a line for the items it names -- or a dict ``{item or key:
        value}``. ``keys()`` gives the manifest's item keys (``manifest.item_key``), needed only to match
        keys. ``ScoringError`` naming what is wrong."""
        if isinstance(spec, Expected):
            if spec.total != total:
                raise ScoringError(f"the expected answers are for {spec.total} items; this map has {total}")
            return spec
        if isinstance(spec, Mapping):
            lookup = _KeyLookup(keys, total, "<dict>")
            values: dict[int, Any] = {}
            for key, value in spec.items():
                if isinstance(key, str) and key.strip().isdigit():
                    index = int(key)
                elif isinstance(key, str):
                    index = lookup.item(key, f"expected answer for key {key!r}")
                else:
                    index = key
                if not is_item_number(index, total):
                    raise ScoringError(f"expected answer for item {key!r}: the items are numbered 0 to {total - 1}")
                if index in values:
                    raise ScoringError(f"two expected answers for item {index}")
                values[index] = value
            data = _records_jsonl((i, values[i]) for i in sorted(values))
            return cls(values, total, "<dict>", hashlib.sha256(data).hexdigest())
        if isinstance(spec, (str, os.PathLike, Sequence)) and not isinstance(spec, (bytes, bytearray)):
            if isinstance(spec, Sequence) and not isinstance(spec, str) and len(spec) > total:
                raise ScoringError(f"expected answers: {len(spec)} values for a manifest of {total} items (one "
                                   f"expected value an item, in the manifest's order; null, or none, for an item "
                                   f"not labelled)")
            try:  # a file of more values than items is refused at the first extra one, the rest unread
                manifest = read_manifest(spec, max_items=total)
            except MapError as e:  # its words are a manifest's: say whose they are
                if isinstance(e, TooManyItems) and isinstance(spec, (str, os.PathLike)):  # a list is refused above
                    raise ScoringError(f"expected answers {Path(spec).absolute()}: more than {total} values for a "
                                       f"manifest of {total} items (line {e.line}; one expected value a line, in "
                                       f"the manifest's order; null, or no line, for an item not labelled)") from None
                raise ScoringError("expected answers: " + str(e).replace("manifest ", "", 1)) from None
            first = next((v for v in manifest.items if v is not None), None)
            if _keyed(first):
                return cls(_keyed_values(manifest, total, keys), total, manifest.source, manifest.sha256)
            if len(manifest) > total:
                raise ScoringError(f"expected answers {manifest.source}: {len(manifest)} values for a manifest of "
                                   f"{total} items (one expected value a line, in the manifest's order; null, or "
                                   f"no line, for an item not labelled)")
            return cls(manifest.items, total, manifest.source, manifest.sha256)
        raise ScoringError(f"expected answers are a JSONL file, a list or a dict {{item: value}}, "
                           f"not {type(spec).__name__}")

    @classmethod
    def from_folder(cls, run_dir: Path, total: int) -> "Expected | None":
        """The expected answers a run folder keeps (``expected.jsonl``), checked; None without them."""
        path = run_dir / EXPECTED
        if not os.path.lexists(path):
            return None
        values: dict[int, Any] = {}
        try:
            records = read_records(path, total=total)
        except FolderError as e:  # one line naming the file and the line
            raise ScoringError(f"{e}; the file was edited, or belongs to another map") from None
        for record in records:
            item = record["item"]
            if item in values:
                raise ScoringError(f"{path}: a record that scoring did not write (item {item!r} twice); the file "
                                   f"was edited, or belongs to another map")
            values[item] = record["expected"]
        # the SHA-256 of the file as scoring writes it (the same bytes, for a file it wrote)
        return cls(values, total, str(path), hashlib.sha256(_records_jsonl(sorted(values.items()))).hexdigest())

    def write(self, run_dir: Path) -> None:
        fsync_write(run_dir / EXPECTED, _records_jsonl(self.items()).decode("utf-8"))


class _KeyLookup:
    """The manifest's item keys, built on first use: which one item a key names."""

    def __init__(self, keys: "Callable[[], Sequence[str]] | None", total: int, source: str):
        self._keys, self._total, self._source = keys, total, source
        self._by_key: dict[str, list[int]] | None = None

    def item(self, key: Any, where: str) -> int:
        if not isinstance(key, str) or not key:
            raise ScoringError(f"{where}: a key is the item's key as text (its input's id, key, name, path, "
                               f"file or url), not {json_kind(key)}")
        if self._by_key is None:
            if self._keys is None:
                raise ScoringError(f"{where}: expected answers by key need the manifest's keys here; give them "
                                   f"by item number instead")
            self._by_key = {}
            for index, name in enumerate(self._keys()):
                self._by_key.setdefault(name, []).append(index)
        found = self._by_key.get(key[:MAX_KEY_CHARS] if len(key) <= MAX_KEY_CHARS else key[:MAX_KEY_CHARS - 1] + "…")
        if not found:
            raise ScoringError(f"{where}: no item of the manifest has the key {_short(key)}")
        if len(found) > 1:
            raise ScoringError(f"{where}: the key {_short(key)} names {len(found)} items of the manifest "
                               f"({', '.join(map(str, found[:5]))}{' ...' if len(found) > 5 else ''}); key those "
                               f"lines by item number instead ({{\"item\": N, \"expected\": ...}})")
        return found[0]


def _keyed_values(manifest: Any, total: int, keys: "Callable[[], Sequence[str]] | None") -> dict[int, Any]:
    """The items a keyed expected file names (every line ``{"key"|"item": ..., "expected": ...}``, or null)."""
    lookup = _KeyLookup(keys, total, manifest.source)
    values: dict[int, Any] = {}
    line_of: dict[int, int] = {}
    for number, value in enumerate(manifest.items, start=1):
        where = f"expected answers {manifest.source}: value {number}"
        if value is None:
            continue
        if not _keyed(value):
            raise ScoringError(f"{where} is not {{\"key\": ..., \"expected\": ...}} as the first one is; a keyed "
                               f"file keys every line")
        if "key" in value:
            index = lookup.item(value["key"], where)
        else:
            index = value["item"]
            if not is_item_number(index, total):
                shown = index if isinstance(index, int) and not isinstance(index, bool) else _short(index)
                raise ScoringError(f"{where}: item {shown} -- the items are numbered 0 to {total - 1}")
        if index in values:
            raise ScoringError(f"{where}: item {index} has an expected answer already (value {line_of[index]})")
        values[index], line_of[index] = value["expected"], number
    return values


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else repr(value)
    text = " ".join(text.split())
    return repr(text if len(text) <= 80 else text[:79] + "…")


def _records_jsonl(pairs: Iterable[tuple[int, Any]]) -> bytes:
    return "".join(dumps({"item": i, "expected": v}) + "\n" for i, v in pairs).encode("utf-8")


def is_item_number(value: Any, total: int) -> TypeGuard[int]:
    """Whether ``value`` is the number of one of ``total`` items (an int, not a boolean, from 0)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < total


def json_kind(value: Any) -> str:
    """What kind of JSON value this is, for a message: ``an object``, ``a list``, ``a string``, ..."""
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number")


__all__ = ["KEYED_SHAPES", "Expected", "is_item_number", "json_kind"]

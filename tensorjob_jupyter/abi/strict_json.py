"""The strict JSON reader: bytes from a guest or a file, judged once, as serde_json would judge them.

``loads_strict`` refuses invalid JSON or UTF-8, duplicate keys, non-finite numbers, integers outside 64 bits,
nesting deeper than serde_json's 128 levels, more values than allowed (counted on the bytes, before anything
is parsed) and text that is not Unicode (a lone surrogate such as ``"\\ud800"``), each with an ``AbiError``
naming the problem. Whatever passes can be encoded, written and shown anywhere without another check;
``checked_value`` holds a value from Python to the same rule, and ``dumps``/``encode_json`` write serde_json's
compact form.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from tensorjob_jupyter.abi.errors import AbiError
from tensorjob_jupyter.text import clip

U32_MAX = 2**32 - 1
U64_MAX = 2**64 - 1
#: The largest count a transcript records (tokens, bytes, milliseconds, steps): 2^53, the largest whole
#: number every JSON reader holds exactly. Counts from elsewhere (a model server's usage) are checked
#: against it where they arrive, and the job's totals stop there.
MAX_COUNT = 2 ** 53


def dumps(value: Any) -> str:
    """Compact JSON, non-ASCII kept as UTF-8: serde_json's output format."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


# --- strict parsing ----------------------------------------------------------

#: serde_json's recursion limit: deeper nesting is refused, as cuttlefish refuses it.
MAX_DEPTH = 128
#: Integers a command may hold: what serde_json's i64 and u64 can.
INT_MIN, INT_MAX = -(2**63), U64_MAX
# A JSON string (valid JSON assumed; anything else fails json.loads anyway):
# strings may hold brackets, commas and colons that are not structure.
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
# A \u escape of a surrogate (may be a false hit after an escaped backslash;
# the parsed value is checked exactly).
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise AbiError(f"duplicate field `{clip(key, 64)}`")
            seen.add(key)
    return obj


def _no_constants(name: str) -> Any:
    raise AbiError(f"{name} is not valid JSON")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise AbiError(f"number {text[:20]} is out of range")
    return value


def _int64(text: str) -> int:
    value = int(text)
    if not INT_MIN <= value <= INT_MAX:
        raise AbiError(f"integer {text[:24]}{'...' if len(text) > 24 else ''} is out of range "
                       f"(JSON integers must fit in 64 bits)")
    return value


def _check_shape(data: bytes, max_values: int, what: str) -> None:
    """Refuse too deep or too many values from the bytes alone, before parsing.

    Parsing costs about 25 bytes of memory per byte of JSON like ``[{},{}]``,
    so the count is bounded first. The fast path counts bytes: fewer opening
    brackets than the depth limit and fewer separators than the value limit
    settle it. Otherwise strings are blanked out (they may hold any of these
    characters) and depth and values are counted exactly.
    """
    opens = data.count(b"[") + data.count(b"{")
    separators = data.count(b",") + data.count(b":")
    if opens <= MAX_DEPTH and opens + separators < max_values:
        return
    structure = np.frombuffer(_JSON_STRING.sub(b'""', data), dtype=np.uint8)
    opening = (structure == ord("[")) | (structure == ord("{"))
    closing = (structure == ord("]")) | (structure == ord("}"))
    values = 1 + int(np.count_nonzero(opening)) + int(np.count_nonzero(
        (structure == ord(",")) | (structure == ord(":"))))
    if values > max_values:
        raise AbiError(f"{what} holds about {values} JSON values, more than the {max_values} allowed "
                       f"(max_command_values)")
    if np.count_nonzero(opening) > MAX_DEPTH:
        depth = np.cumsum(opening.astype(np.int32) - closing.astype(np.int32))
        if depth.size and int(depth.max()) > MAX_DEPTH:
            raise AbiError(f"{what} JSON is nested too deeply (more than {MAX_DEPTH} levels)")


def _first_non_unicode(value: Any) -> str | None:
    """The first string (key or value) in ``value`` holding a lone surrogate."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if not item.isascii():
                try:
                    item.encode("utf-8")
                except UnicodeEncodeError:
                    return item
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return None


def loads_strict(raw: bytes | bytearray | memoryview, *, max_values: int = 1_000_000,
                 what: str = "command") -> Any:
    """Parse JSON as serde_json would: UTF-8 text only, no NaN, no duplicate keys,
    64-bit integers, at most ``MAX_DEPTH`` levels and ``max_values`` values."""
    data = bytes(raw)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise AbiError(f"{what} is not valid UTF-8 (byte {e.start})") from None
    _check_shape(data, max_values, what)
    try:
        value = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constants,
                           parse_float=_finite, parse_int=_int64)
    except AbiError as e:
        raise AbiError(f"{what}: {e}") from None
    except json.JSONDecodeError as e:
        raise AbiError(f"{what} is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    except RecursionError:  # pragma: no cover - the shape check refuses this first
        raise AbiError(f"{what} JSON is nested too deeply") from None
    except ValueError as e:  # an integer with more digits than Python converts
        raise AbiError(f"{what} JSON has a number it cannot hold: {clip(str(e), 120)}") from None
    if _SURROGATE_ESCAPE.search(data):
        bad = _first_non_unicode(value)
        if bad is not None:
            at = next(i for i, ch in enumerate(bad) if 0xD800 <= ord(ch) <= 0xDFFF)
            raise AbiError(f"{what} has a string that is not valid Unicode: a lone surrogate "
                           f"\\u{ord(bad[at]):04x} at character {at}; JSON strings must be UTF-8 text")
    return value


def checked_value(value: Any, what: str = "value", *, max_values: int = 1_000_000) -> tuple[Any, bytes]:
    """A value from Python, held to the rule guest output is held to; returns
    (the value as it will be seen, its compact JSON). ``ValueError`` otherwise."""
    try:
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as e:
        raise ValueError(f"{what} is not JSON: {e}") from None
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"{what} holds text that is not valid Unicode (a lone surrogate at character "
                         f"{e.start}); strings must be UTF-8 text") from None
    try:
        return loads_strict(data, max_values=max_values, what=what), data
    except AbiError as e:
        raise ValueError(str(e)) from None


@dataclass(frozen=True)
class CheckedJson:
    """A JSON value carried as the compact bytes ``dumps`` writes, already held to ``loads_strict``'s rule (a
    manifest item): it travels as bytes, and the job that takes it parses it once, with no second check but its
    own value count (``checked_input``)."""

    data: bytes

    def value(self) -> Any:
        """The value (orjson: for bytes that passed ``loads_strict`` it gives the same value; a property test
        holds the two to it)."""
        return orjson.loads(self.data)


def checked_input(value: Any, what: str = "value", *, max_values: int = 1_000_000) -> tuple[Any, bytes]:
    """``checked_value`` for a job's input, which may arrive checked already (``CheckedJson``): then it is parsed
    once and only its value count is held to ``max_values`` (an ``AbiError``, a ``ValueError`` too, past it).
    ``ValueError`` otherwise, as ``checked_value``."""
    if isinstance(value, CheckedJson):
        _check_shape(value.data, max_values, what)
        return value.value(), value.data
    return checked_value(value, what, max_values=max_values)


def encode_json(value: Any) -> bytes:
    """Compact JSON bytes of a value that passed the boundary (or the host built)."""
    return orjson.dumps(value)


__all__ = [
    "U32_MAX", "U64_MAX", "MAX_COUNT", "dumps", "MAX_DEPTH", "loads_strict", "checked_value", "CheckedJson", "checked_input", "encode_json"
]

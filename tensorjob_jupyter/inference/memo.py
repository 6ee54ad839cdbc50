"""Memos bounded in bytes: what a guest's schema makes (its grammar, its checked spec, its validator).

A cache bounded by its number of entries is bounded by nothing when one
entry can be as large as a guest likes: sixty-four 15 MB schemas kept
"for next time" are a gigabyte that outlives every job that sent them.
``BytesLRU`` keeps entries while the bytes they hold (as the caller weighs
them: exact string sizes, or a measured multiple of the text an object was
parsed from) stay under its bound, dropping the least recently used first;
an entry heavier than the whole bound is handed back but never kept. It is
thread-safe: the host checks schemas on each job's thread, the engine builds
grammars on the model's.
"""

from __future__ import annotations

import collections
import threading
from typing import Any, Callable, Hashable

MISSING = object()


class BytesLRU:
    """A least-recently-used memo of at most ``max_bytes`` (as weighed by the caller)."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._entries: collections.OrderedDict[Hashable, tuple[Any, int]] = collections.OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> Any:
        """The value kept for ``key`` (now the most recently used), or ``MISSING``."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return MISSING
            self._entries.move_to_end(key)
            return entry[0]

    def put(self, key: Hashable, value: Any, size: int) -> None:
        """Keep ``value`` for ``key`` as ``size`` bytes, dropping the oldest entries to stay in bounds."""
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            if size > self.max_bytes:
                return
            while self._entries and self._bytes + size > self.max_bytes:
                _, (_, dropped) = self._entries.popitem(last=False)
                self._bytes -= dropped
            self._entries[key] = (value, size)
            self._bytes += size

    def get_or_make(self, key: Hashable, make: Callable[[], Any], weigh: Callable[[Any], int]) -> Any:
        """The kept value for ``key``, or ``make()`` kept as ``weigh(value)`` bytes (a failure is not kept)."""
        value = self.get(key)
        if value is MISSING:
            value = make()
            self.put(key, value, weigh(value))
        return value

    @property
    def bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0


__all__ = ["MISSING", "BytesLRU"]

"""``ItemSet``: a set of a map's item numbers, one bit an item, so it costs the same per item at any size.

A map keeps which of its items have concluded for as long as it runs (to skip them on resume and to refuse a
second record of one). As a Python ``set`` that is an int object and a hash slot an item, about 70 bytes; as
bits it is one eighth of a byte, so a map of millions of items holds its progress in kilobytes. The bits grow
only as far as the items in them make worth it (``DENSE_BYTES_PER_ITEM``): a number far past the others (a
run folder's file comes from anywhere, and may name item 2**52) is kept in a plain set beside them, so what
the set holds stays in proportion to how many items it has, whatever their numbers.
"""

from __future__ import annotations

import heapq
from typing import Iterable, Iterator

#: Bits are kept up to this many bytes whatever the count; past it, at most this many bytes per item held.
MIN_DENSE_BYTES = 64 * 1024
DENSE_BYTES_PER_ITEM = 16


class ItemSet:
    """Item numbers (whole numbers from 0): ``add``, ``in``, ``len``, iteration in increasing order."""

    __slots__ = ("_bits", "_count", "_sparse")

    def __init__(self, items: Iterable[int] = ()):
        self._bits = bytearray()
        self._count = 0
        self._sparse: set[int] = set()  # items past what the bits are worth growing to
        for item in items:
            self.add(item)

    def add(self, item: int) -> None:
        if not isinstance(item, int) or isinstance(item, bool) or item < 0:
            raise ValueError(f"an item number is a whole number from 0, not {item!r}")
        if item in self:
            return
        self._count += 1
        byte = item >> 3
        if byte >= len(self._bits):
            if byte >= max(MIN_DENSE_BYTES, DENSE_BYTES_PER_ITEM * self._count):
                self._sparse.add(item)
                return
            self._bits.extend(bytes(byte + 1 - len(self._bits)))  # bytearray's own growth is amortised
        self._bits[byte] |= 1 << (item & 7)

    def __contains__(self, item: object) -> bool:
        if not isinstance(item, int) or item < 0:
            return False
        byte = item >> 3
        if byte < len(self._bits) and self._bits[byte] & (1 << (item & 7)):
            return True
        return item in self._sparse

    def __len__(self) -> int:
        return self._count

    def _dense(self) -> Iterator[int]:
        for byte, value in enumerate(self._bits):
            if value:
                for bit in range(8):
                    if value & (1 << bit):
                        yield byte * 8 + bit

    def __iter__(self) -> Iterator[int]:
        return heapq.merge(self._dense(), sorted(self._sparse))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (ItemSet, set, frozenset)):
            return len(self) == len(other) and all(item in self for item in other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return f"<ItemSet of {self._count} items>"


__all__ = ["MIN_DENSE_BYTES", "DENSE_BYTES_PER_ITEM", "ItemSet"]

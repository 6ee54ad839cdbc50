"""A result's fields: each scalar leaf of a JSON value, named by its dotted path.

Sources and confidence are given per field, and tables show them as ``source.FIELD`` columns, so every
part of the package names a field the same way: object keys and array indices joined by ``.``
(``facts.authors.1``). A key holding ``.`` or ``\\`` escapes it with ``\\`` (``"a.b"`` is ``a\\.b``), so a
path names one leaf and ``split_path`` gives its parts back. The walk is iterative and bounded
(``MAX_FIELDS`` leaves, in document order), since the value may be a guest's.
"""

from __future__ import annotations

from typing import Any, Iterator

__all__ = ["MAX_FIELDS", "MISSING", "Scalar", "child_path", "field_path", "result_fields", "split_path", "value_at"]

#: The most leaves of one result that get a field of their own; the rest are not walked.
MAX_FIELDS = 1_000

Scalar = str | int | float | bool | None


def _escape(key: str) -> str:
    return key.replace("\\", "\\\\").replace(".", "\\.")


def field_path(parts: tuple[str | int, ...]) -> str:
    """The dotted path of a leaf reached through ``parts`` (object keys and array indices)."""
    return ".".join(str(p) if isinstance(p, int) else _escape(p) for p in parts)


def child_path(name: str, rel: str) -> str:
    """The path of the field ``rel`` (a path inside the value at ``name``; ``""``: that value itself)."""
    return name if rel == "" else (f"{name}.{rel}" if name else rel)


def split_path(path: str) -> list[str]:
    """A path's parts, unescaped (array indices stay strings: ``"1"``)."""
    parts, current, escaped = [], [], False
    for ch in path:
        if escaped:
            current.append(ch)
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == ".":
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return parts


#: What ``value_at`` gives for a path that names nothing in the value.
MISSING = object()


def value_at(value: Any, path: str) -> Any:
    """The value (a leaf, or an object or array) that ``path`` names in ``value``, or ``MISSING``."""
    node = value
    if path == "":
        return node
    for part in split_path(path):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isascii() and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return MISSING
    return node


def result_fields(value: Any, *, limit: int = MAX_FIELDS) -> Iterator[tuple[str, Scalar]]:
    """``(path, leaf)`` for each scalar leaf of ``value`` in document order, at most ``limit`` of them.

    A scalar result is one field with the empty path ``""``; an empty object or array has none.
    """
    # each entry's path is a chain (parent, key) built when its leaf is reached: a deep value costs its depth once
    # a leaf, never a copy of the path at every level
    stack: list[tuple[Any, Any]] = [(None, value)]  # (its chain: (parent chain or None, key), the node)
    given = 0
    while stack and given < limit:
        chain, node = stack.pop()
        if isinstance(node, dict):
            stack.extend(reversed([((chain, k), v) for k, v in node.items()]))
        elif isinstance(node, list):
            stack.extend(reversed([((chain, i), v) for i, v in enumerate(node)]))
        else:
            given += 1
            parts: list[str | int] = []
            while chain is not None:
                chain, key = chain
                parts.append(key)
            yield field_path(tuple(reversed(parts))), node

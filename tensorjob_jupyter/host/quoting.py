"""Quote mode: string fields an infer asks to be copied from what the job read, held to it while decoding.

A format with ``"quote": true`` (every plain string field), or a string subschema with ``"quote": true`` (that
field), asks for values copied from the windows the job has read. ``quote_constraint`` writes the format's
schema as an llguidance Lark grammar in which each such field is a substring lexeme of those windows
(``substring_words``: whole words, so no value starts or ends inside one) and every other part stays the
schema's own ``%json``; the local engine cannot write anything else, so a quoted value is found where it was
copied from. ``check_quoted`` checks a finished answer the same way (a served model may not enforce Lark).

The windows are cut at the characters JSON escapes (quotes, backslashes, line breaks and other controls: a
value never spans them), deduplicated and bounded (``MAX_QUOTE_CHARS``, the first read first).
Design: docs/maps.md#quote-mode
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Iterable, Iterator

from tensorjob_jupyter.host.schemas import SchemaError
from tensorjob_jupyter.inference import grammar
from tensorjob_jupyter.inference.base import Constraint, ConstraintError
from tensorjob_jupyter.inference.grammar import DATA_KEYWORDS, JSON_OPTIONS, lark_string

#: Characters of the windows a quoted value may be copied from (the first read first; the rest are not offered).
MAX_QUOTE_CHARS = 64 * 1024
#: Pieces of text (runs between characters JSON escapes) offered at most.
MAX_QUOTE_PIECES = 2048
#: Keywords under which a string is not a plain copy of text: quote mode leaves such a field to the schema.
_SHAPED = ("enum", "const", "pattern", "format", "minLength", "maxLength", "contentEncoding")
#: Keywords that combine or refer to schemas: a subschema with one is never walked into (it stays ``%json``).
_COMBINED = ("anyOf", "oneOf", "allOf", "not", "if", "then", "else", "$ref", "$defs", "definitions",
             "patternProperties", "dependentSchemas", "prefixItems", "contains")
_ESCAPED = re.compile(r'["\\\x00-\x1f\x7f]+')


def asks_quotes(fmt: dict | None, schema: Any) -> bool:
    """Whether an infer's format (``"quote": true``) or its schema (a field's ``"quote": true``) asks for quotes."""
    if isinstance(fmt, dict) and fmt.get("quote") is True:
        return True
    return any(True for _ in _quoted_marks(schema))


def _quoted_marks(node: Any) -> Iterator[None]:
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, list):
            stack.extend(n)
        elif isinstance(n, dict):
            if n.get("quote") is True:
                yield None
            stack.extend(v for k, v in n.items() if k not in DATA_KEYWORDS)


def quote_pieces(texts: Iterable[str]) -> list[str]:
    """The runs of ``texts`` a value may be copied from: cut at what JSON escapes, stripped, deduplicated, in order,
    within ``MAX_QUOTE_CHARS`` and ``MAX_QUOTE_PIECES``."""
    seen: dict[str, None] = {}
    budget = MAX_QUOTE_CHARS
    for text in texts:
        for piece in _ESCAPED.split(text):
            piece = piece.strip()
            if not piece or piece in seen or not any(c.isalnum() for c in piece):
                continue
            if len(piece) > budget:  # the rest of the budget, cut at a word's end
                piece = piece[:budget].rsplit(" ", 1)[0] if " " in piece[:budget] else ""
            if not piece or len(seen) >= MAX_QUOTE_PIECES:
                return list(seen)
            seen[piece] = None
            budget -= len(piece)
    return list(seen)


def quote_constraint(fmt: dict, schema: Any, pieces: list[str]) -> tuple[Constraint, list[tuple[str, ...]]]:
    """The Lark constraint of ``schema`` with its quoted string fields copied from ``pieces`` (``quote_pieces``),
    and the paths of those fields; ``SchemaError`` when nothing in the schema can be quoted or nothing was read
    to quote from."""
    writer = _Writer(quote_all=fmt.get("quote") is True, pieces=pieces)
    try:
        start = writer.value(schema, ())
    except RecursionError:
        raise SchemaError("quote mode: the schema is nested too deeply to be written as a grammar") from None
    if not writer.paths:
        raise SchemaError('quote mode: no field of the schema can be quoted (a quoted field is a plain string: '
                          'no enum, const, pattern, format or length bound, inside objects and arrays that use '
                          'no anyOf, oneOf, allOf or $ref)')
    if not pieces and not writer.nullable_only:
        raise SchemaError("quote mode: the job has read no text to copy a quoted field from (slice or open a "
                          "document before this infer)")
    rules = [f"start: {start}", *writer.rules]
    if pieces:
        rules.append("quoted: " + " | ".join(f"Q{i}" for i in range(len(pieces))))
        rules.extend(f"Q{i}: %regex {json.dumps({'substring_words': p}, ensure_ascii=False)}"
                     for i, p in enumerate(pieces))
    return Constraint(lark="\n".join(rules) + "\n"), writer.paths


@dataclass(frozen=True)
class Quotes:
    """One infer's quote mode: the constraint its answer is held to, and what its quoted fields are checked against."""

    constraint: Constraint
    paths: tuple[tuple[str, ...], ...]
    pieces: tuple[str, ...]

    @classmethod
    def of(cls, spec: Any, texts: Iterable[str]) -> "Quotes":
        """The quotes of an ``OutputSpec`` that asks for them, from the text the job has read."""
        pieces = quote_pieces(texts)
        constraint, paths = quote_constraint(spec.format, spec.output_schema, pieces)
        try:
            grammar.check(constraint)
        except ConstraintError as e:
            raise SchemaError(f"quote mode: {e.message}") from None
        except UnicodeError:  # a lone surrogate in a property's name: JSON holds it, a grammar's text cannot
            raise SchemaError("quote mode: a property name is not valid Unicode (a lone surrogate)") from None
        return cls(constraint, tuple(paths), tuple(pieces))

    def check(self, text: str) -> None:
        """``SchemaError`` unless every quoted field of the answer ``text`` (valid JSON) was copied from a piece."""
        wrong = check_quoted(json.loads(text), list(self.paths), list(self.pieces))
        if wrong is not None:
            raise SchemaError(wrong)


def check_quoted(value: Any, paths: list[tuple[str, ...]], pieces: list[str]) -> str | None:
    """What is wrong with a finished answer's quoted fields (the first), or None: each quoted string must be a
    run of whole words of one piece the job read."""
    for path in paths:
        for found in _at(value, path):
            if isinstance(found, str) and found and not any(_whole_words_in(found, p) for p in pieces):
                return f"quote mode: {'.'.join(path) or 'the answer'} is {found[:80]!r}, which is not copied from " \
                       f"what the job read"
    return None


def _whole_words_in(value: str, piece: str) -> bool:
    start = piece.find(value)
    while start >= 0:
        end = start + len(value)
        before = piece[start - 1] if start else " "
        after = piece[end] if end < len(piece) else " "
        if not (before.isalnum() and value[0].isalnum()) and not (after.isalnum() and value[-1].isalnum()):
            return True
        start = piece.find(value, start + 1)
    return False


def _at(value: Any, path: tuple[str, ...]) -> Iterator[Any]:
    if not path:
        yield value
        return
    head, rest = path[0], path[1:]
    if head == "[]" and isinstance(value, list):
        for item in value:
            yield from _at(item, rest)
    elif isinstance(value, dict) and head in value:
        yield from _at(value[head], rest)


class _Writer:
    """The schema as Lark rules: walks the objects and arrays that hold a quoted field, the rest as ``%json``."""

    def __init__(self, quote_all: bool, pieces: list[str]) -> None:
        self.quote_all, self.pieces = quote_all, pieces
        self.rules: list[str] = []
        self.paths: list[tuple[str, ...]] = []
        self.nullable_only = True

    def value(self, node: Any, path: tuple[str, ...]) -> str:
        if not self._holds_quote(node):
            return self._json(node)
        assert isinstance(node, dict)
        types = node.get("type")
        if self._quotable(node):
            self.paths.append(path)
            nullable = isinstance(types, list) and "null" in types
            self.nullable_only = self.nullable_only and nullable
            copied = '"\\"" quoted "\\""' if self.pieces else None
            return " | ".join(x for x in (copied, '"null"' if nullable else None) if x) or '"null"'
        if node.get("type", "object") == "object" and isinstance(node.get("properties"), dict):
            members = [f'{lark_string(json.dumps(name, ensure_ascii=False) + ": ")} {self._rule(sub, (*path, name))}'
                       for name, sub in node["properties"].items()]
            return '"{" ' + ' ", " '.join(members) + ' "}"'
        item = self._rule(node["items"], (*path, "[]"))
        return f'"[" ({item} (", " {item})*)? "]"'

    def _rule(self, node: Any, path: tuple[str, ...]) -> str:
        name = f"v{len(self.rules)}"
        self.rules.append("")  # the rule's place, so nested rules number after it
        at = len(self.rules) - 1
        self.rules[at] = f"{name}: {self.value(node, path)}"
        return name

    def _json(self, node: Any) -> str:
        name = f"j{len(self.rules)}"
        schema = _without_quote_marks(node if not isinstance(node, bool) else ({} if node else {"not": {}}))
        self.rules.append(f"{name}: %json {json.dumps({**schema, 'x-guidance': JSON_OPTIONS}, ensure_ascii=False)}")
        return name

    def _quotable(self, node: dict) -> bool:
        types = node.get("type")
        plain = types == "string" or (isinstance(types, list) and set(types) in ({"string"}, {"string", "null"}))
        return (plain and not any(k in node for k in _SHAPED + _COMBINED)
                and (self.quote_all or node.get("quote") is True))

    def _holds_quote(self, node: Any) -> bool:
        """Whether ``node`` is a quoted string, or an object or array (no combinators) with one inside."""
        if not isinstance(node, dict) or any(k in node for k in _COMBINED):
            return False
        if self._quotable(node):
            return True
        if isinstance(node.get("properties"), dict) and node.get("type", "object") == "object":
            closed = node.get("additionalProperties", False) is False
            return closed and any(self._holds_quote(s) for s in node["properties"].values())
        if node.get("type") == "array" and isinstance(node.get("items"), dict):
            unbounded = not any(k in node for k in ("minItems", "maxItems", "uniqueItems"))
            return unbounded and self._holds_quote(node["items"])
        return False


def _without_quote_marks(node: Any) -> Any:
    """``node`` without its ``quote`` keywords (a property named "quote" is a name, and stays)."""
    if isinstance(node, list):
        return [_without_quote_marks(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key == "quote" and isinstance(value, bool):
            continue
        if key in ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas") \
                and isinstance(value, dict):
            out[key] = {name: _without_quote_marks(sub) for name, sub in value.items()}
        elif key in DATA_KEYWORDS:
            out[key] = value
        else:
            out[key] = _without_quote_marks(value)
    return out


__all__ = ["MAX_QUOTE_CHARS", "MAX_QUOTE_PIECES", "Quotes", "asks_quotes", "check_quoted", "quote_constraint", "quote_pieces"]

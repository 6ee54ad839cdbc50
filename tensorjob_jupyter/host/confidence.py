"""How sure the model was of each field: an answer's leaves from its tokens' logprobs, a result's from its answers.

``answer_confidence`` lays an answer's tokens over its text and scores each scalar leaf by the probability of
the tokens that spell it (a choice against its runner-up, a null against the best non-null start); ``FieldConfidence`` gives each field of the job's
result the confidence of the answer leaf it came from, or None where no answer spelled it. Everything here is
bounded by the answer's tokens, ``host.fields.MAX_FIELDS`` and ``MAX_SCHEMA_HOPS``.
What these numbers can and cannot say is docs/guests.md's "Confidence".

Design: docs/internals/host.md#confidencepy
"""

from __future__ import annotations

import bisect
import math
import re
from json.decoder import scanstring  # type: ignore[attr-defined]  # in the module, not in typeshed's stub
from typing import Any, Sequence

from tensorjob_jupyter.host.fields import MAX_FIELDS, Scalar, field_path, result_fields
from tensorjob_jupyter.inference.logprobs import TokenLogprob

__all__ = ["CONFIDENT_KINDS", "MAX_SCHEMA_HOPS", "json_leaves", "answer_confidence", "answer_margins",
           "FieldConfidence", "leaves_json"]

#: The infer kinds (``host.structured.OutputSpec.kind``) whose answers have fields.
CONFIDENT_KINDS = frozenset({"json", "choices", "regex"})
#: Schema steps (a property, an item, a ``$ref``, a branch) one leaf's lookup may take.
MAX_SCHEMA_HOPS = 256

_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?")
_WHITESPACE = re.compile(r"[ \t\n\r]*")
_LITERALS = (("true", True), ("false", False), ("null", None))

Leaf = tuple[tuple, Scalar, int, int]  # (path parts, value, start, end): character offsets into the text


def json_leaves(text: str, limit: int = MAX_FIELDS) -> list[Leaf] | None:
    """Each scalar leaf of the JSON ``text``, in document order (at most ``limit``): its path's parts, its
    value (as ``json.loads`` reads it) and its character span (a string's with its quotes). None unless
    ``text`` is one JSON value. Iterative: any depth costs no recursion."""
    leaves: list[Leaf] = []
    stack: list[list] = []  # open containers: [kind, parts, key or index]
    i = _skip(text, 0)
    parts: tuple = ()
    try:
        while True:
            c = text[i]
            if c == "{" or c == "[":
                i = _skip(text, i + 1)
                if text[i] == ("}" if c == "{" else "]"):
                    i += 1  # an empty container: no leaf
                elif c == "{":
                    key, i = _key(text, i)
                    stack.append(["o", parts, key])
                    parts = parts + (key,)
                    continue
                else:
                    stack.append(["a", parts, 0])
                    parts = parts + (0,)
                    continue
            else:
                value, end = _scalar(text, i)
                if len(leaves) < limit:
                    leaves.append((parts, value, i, end))
                i = end
            # after a value: close what ends here, or go on to the next member
            while True:
                i = _skip(text, i)
                if not stack:
                    return leaves if i == len(text) else None
                kind, outer, at = top = stack[-1]
                if text[i] == ",":
                    i = _skip(text, i + 1)
                    if kind == "o":
                        key, i = _key(text, i)
                        top[2] = key
                        parts = outer + (key,)
                    else:
                        top[2] = at + 1
                        parts = outer + (at + 1,)
                    break
                if text[i] != ("}" if kind == "o" else "]"):
                    return None
                stack.pop()
                i += 1
    except (IndexError, ValueError):
        return None


def _skip(text: str, i: int) -> int:
    m = _WHITESPACE.match(text, i)
    assert m is not None  # [ \t\n\r]* matches (empty, at worst) at any position
    return m.end()


def _key(text: str, i: int) -> tuple[str, int]:
    if text[i] != '"':
        raise ValueError("a key is a string")
    key, i = scanstring(text, i + 1, True)
    i = _skip(text, i)
    if text[i] != ":":
        raise ValueError("a key is followed by :")
    return key, _skip(text, i + 1)


def _scalar(text: str, i: int) -> tuple[Scalar, int]:
    c = text[i]
    if c == '"':
        return scanstring(text, i + 1, True)
    for word, literal in _LITERALS:
        if text.startswith(word, i):
            return literal, i + len(word)
    m = _NUMBER.match(text, i)
    if m is None or m.end() == i:
        raise ValueError("not a JSON value")
    number = m.group(0)
    value = float(number) if (m.group(1) or m.group(2)) else int(number)
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("a number too large for a float")
    return value, m.end()


# --- an answer's fields ----------------------------------------------------------------------------------


def _token_spans(records: Sequence[TokenLogprob]) -> list[int]:
    """Each token's end, in bytes of the answer (cumulative)."""
    ends, total = [], 0
    for record in records:
        total += len(record.token)
        ends.append(total)
    return ends


def _byte_offsets(text: str) -> list[int]:
    """The byte offset of each character of ``text`` in its UTF-8, and of its end."""
    out = [0] * (len(text) + 1)
    total = 0
    for n, ch in enumerate(text):
        total += 1 if ch < "\x80" else len(ch.encode("utf-8", "surrogatepass"))
        out[n + 1] = total
    return out


def _span_tokens(ends: list[int], start: int, end: int) -> range:
    """The tokens whose bytes overlap [start, end)."""
    first = bisect.bisect_right(ends, start)
    last = bisect.bisect_left(ends, end)
    return range(first, min(last + 1, len(ends)))


def _spelled(records: Sequence[TokenLogprob], tokens: range) -> float | None:
    if not tokens:
        return None
    return math.exp(sum(records[t].logprob for t in tokens))


def _chosen(records: Sequence[TokenLogprob], tokens: range) -> float | None:
    """A choice against its runner-up at the deciding token (its span's least sure one)."""
    if not tokens:
        return None
    deciding = records[min(tokens, key=lambda t: records[t].logprob)]
    if deciding.runner_up is None:
        return 1.0
    return _against(deciding.logprob - deciding.runner_up)


#: How a JSON null is spelled: a token that starts it (after whitespace) is a null start, not an alternative to it.
_NULL = b"null"


def _null_start(token: bytes) -> bool:
    """Whether ``token`` (its leading whitespace aside) begins to spell ``null``, or spells it and goes on."""
    body = token.lstrip(b" \t\n\r")
    return bool(body) and (_NULL.startswith(body) or body.startswith(_NULL))


def _null_chosen(records: Sequence[TokenLogprob], tokens: range) -> float | None:
    """A null against the best non-null start at its deciding token (its span's least sure one): the same rule
    as a choice, ``p / (p + q)``, where ``q`` is the most likely other token that does not begin ``null`` too --
    from the token's ``top`` alternatives other than itself where it has them (the least of them bounds ``q`` when all
    begin ``null``), else its runner-up."""
    if not tokens:
        return None
    deciding = records[min(tokens, key=lambda t: records[t].logprob)]
    others = [t for t in deciding.top if t.token != deciding.token]
    starts = [t.logprob for t in others if not _null_start(t.token)]
    q = max(starts) if starts else min(t.logprob for t in others) if others else deciding.runner_up
    if q is None:
        return 1.0
    return _against(deciding.logprob - q)


def _against(gap: float) -> float:
    """``p / (p + q)`` from ``gap = log p - log q``: ``1 / (1 + e^-gap)``, without overflow either way."""
    return 1.0 / (1.0 + math.exp(-gap)) if gap >= 0 else math.exp(gap) / (1.0 + math.exp(gap))


def _leaf_tokens(text: str, records: Sequence[TokenLogprob], kind: str) -> list[tuple[tuple, Scalar, range]] | None:
    """Each leaf of an answer of ``kind`` with the tokens that spell it: a JSON answer's scalar leaves
    (``json_leaves``), another kind's whole text (at ``()``); None when the answer has no fields, no records, or
    records that do not spell ``text``."""
    if kind not in CONFIDENT_KINDS or not records:
        return None
    data = text.encode("utf-8", "surrogatepass")
    ends = _token_spans(records)
    if ends[-1] < len(data) or b"".join(r.token for r in records)[:len(data)] != data:
        return None  # the tokens do not spell the answer: nothing to lay them over
    if kind != "json":
        return [((), text, _span_tokens(ends, 0, len(data)))]
    leaves = json_leaves(text)
    if leaves is None:
        return None
    offsets = _byte_offsets(text)
    return [(parts, value, _span_tokens(ends, offsets[start], offsets[end])) for parts, value, start, end in leaves]


def answer_confidence(text: str, records: Sequence[TokenLogprob], kind: str,
                      schema: Any = None) -> dict[tuple, tuple[Scalar, float | None]] | None:
    """``{path parts: (value, confidence)}`` for each leaf of an answer of ``kind`` (``CONFIDENT_KINDS``;
    ``schema``: a JSON answer's schema, for its enums), from its tokens' ``records``; None when the answer has
    no fields, no records, or records that do not spell ``text``."""
    leaves = _leaf_tokens(text, records, kind)
    if leaves is None:
        return None
    out: dict[tuple, tuple[Scalar, float | None]] = {}
    for parts, value, tokens in leaves:
        if kind != "json":
            score = _chosen(records, tokens) if kind == "choices" else _spelled(records, tokens)
        elif value is None:  # a null: the model chose to give no value, measured against giving one
            score = _null_chosen(records, tokens)
        elif isinstance(value, bool) or _is_choice(schema, parts):
            score = _chosen(records, tokens)
        else:
            score = _spelled(records, tokens)
        out[parts] = (value, score)
    return out


def answer_margins(text: str, records: Sequence[TokenLogprob],
                   kind: str) -> dict[tuple, tuple[Scalar, float | None]] | None:
    """``answer_confidence``'s leaves with another measure: each leaf's margin at its deciding token -- the
    chosen token's probability against its runner-up's, ``p / (p + q)``, at the least sure token of its span --
    for every leaf, strings and numbers too (``answer_confidence`` gives those the probability of their whole
    spelling). Never under that spelling's probability: ``q`` is at most ``1 - p``. A measure to compare
    (``bench/bench_cascade.py``); None where ``answer_confidence`` would be."""
    leaves = _leaf_tokens(text, records, kind)
    if leaves is None:
        return None
    return {parts: (value, _null_chosen(records, tokens) if value is None and kind == "json"
                    else _chosen(records, tokens)) for parts, value, tokens in leaves}


def _is_choice(schema: Any, parts: tuple) -> bool:
    """Whether ``schema`` holds the leaf at ``parts`` to an ``enum`` or a ``const`` (following properties,
    items, local ``$ref``s and the branches of ``allOf``/``anyOf``/``oneOf``; at most ``MAX_SCHEMA_HOPS``)."""
    if not isinstance(schema, dict):
        return False
    root = schema
    hops = 0
    todo: list[tuple[Any, int]] = [(schema, 0)]  # (subschema, parts consumed)
    while todo and hops < MAX_SCHEMA_HOPS:
        node, at = todo.pop()
        hops += 1
        if not isinstance(node, dict):
            continue
        ref = node.get("$ref")
        if isinstance(ref, str):
            target = _local_ref(root, ref)
            if target is not None:
                todo.append((target, at))
        for word in ("allOf", "anyOf", "oneOf"):
            branches = node.get(word)
            if isinstance(branches, list):
                todo.extend((b, at) for b in branches[:MAX_SCHEMA_HOPS])
        if at == len(parts):
            if "enum" in node or "const" in node:
                return True
            continue
        part = parts[at]
        if isinstance(part, str):
            properties = node.get("properties")
            if isinstance(properties, dict) and part in properties:
                todo.append((properties[part], at + 1))
            elif isinstance(node.get("additionalProperties"), dict):
                todo.append((node["additionalProperties"], at + 1))
        else:
            prefix = node.get("prefixItems")
            if isinstance(prefix, list) and part < len(prefix):
                todo.append((prefix[part], at + 1))
            elif isinstance(node.get("items"), dict):
                todo.append((node["items"], at + 1))
    return False


def _local_ref(root: dict, ref: str) -> Any:
    if not ref.startswith("#"):
        return None
    node: Any = root
    for raw in ref[1:].split("/")[1:] if ref != "#" else []:
        key = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and key in node:
            node = node[key]
        elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
        else:
            return None
    return node


# --- a result's fields ------------------------------------------------------------------------------------


def _value_key(value: Scalar) -> tuple:
    """What makes two JSON scalars equal: numbers by value (``1 == 1.0``), booleans apart from numbers."""
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, (int, float)):
        return ("number", value)
    if value is None:
        return ("null",)
    return ("string", value)


class FieldConfidence:
    """A job's answers' leaf confidences, folded into the confidence of each field of its result."""

    def __init__(self) -> None:
        self._by_path: dict[tuple[str, tuple], float] = {}
        self._by_value: dict[tuple, float] = {}
        self.answers = 0

    def add(self, leaves: dict[tuple, tuple[Scalar, float | None]] | None) -> None:
        """One answer's leaves (``answer_confidence``); a later answer's value wins over an earlier one's."""
        if not leaves:
            return
        self.answers += 1
        for parts, (value, score) in leaves.items():
            if score is None:
                continue
            key = _value_key(value)
            self._by_path[(field_path(parts), key)] = score
            if key[0] in ("string", "number"):
                self._by_value[key] = score

    def of(self, result: Any) -> dict[str, float | None] | None:
        """``{path: confidence or None}`` for each field of ``result``; None when no answer had any."""
        if not self._by_path:
            return None
        out: dict[str, float | None] = {}
        for path, value in result_fields(result):
            key = _value_key(value)
            score = self._by_path.get((path, key))
            if score is None:
                score = self._by_value.get(key)
            out[path] = None if score is None else min(1.0, max(0.0, score))
        return out


def leaves_json(leaves: dict[tuple, tuple[Scalar, float | None]] | None) -> dict[str, float | None] | None:
    """An answer's leaves as the guest's ``infer_done.confidence`` gives them: ``{path: confidence}``."""
    if leaves is None:
        return None
    return {field_path(parts): score for parts, (value, score) in leaves.items()}

"""A map's values one at a time, doubtful first: the review's rows, their order score and the reason for each.

Every scalar leaf of every completed item's result is a value -- a null too -- with its confidence, what its
sources say of it (``host.grounding.evidence_kind``) and its best source with the text around it. The order
score (``review_score``) is 0 to 2, lower more doubtful: 0 for a value that claims something (not null, not
blank) and is not grounded -- found in no window, only under another field's label, only fuzzily -- 1 for any
other, plus its confidence (1 where none was measured). Ties: a measured value first, then item, then field order.
What each reason means: docs/maps.md, "Review, correct, certify".
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

from tensorjob_jupyter.host.excerpts import excerpt_parts
from tensorjob_jupyter.host.fields import Scalar, result_fields
from tensorjob_jupyter.host.grounding import DOUBTFUL, ELSEWHERE, NOT_FOUND, claims, evidence_kind, source_label

#: Why a value is where it is in the order: found in no window, only under another field's label, only a fuzzy
#: match or an ambiguous spelling (these three claim something and are not grounded), then ordered by its
#: confidence, or with nothing measured to doubt it by.
NOT_FOUND_REASON, ELSEWHERE_REASON, DOUBTFUL_REASON = "not_found", "elsewhere", "doubtful"
LEAST_CONFIDENCE, UNMEASURED = "least_confidence", "unmeasured"
REASONS = (NOT_FOUND_REASON, ELSEWHERE_REASON, DOUBTFUL_REASON, LEAST_CONFIDENCE, UNMEASURED)
_KIND_REASON = {NOT_FOUND: NOT_FOUND_REASON, ELSEWHERE: ELSEWHERE_REASON, DOUBTFUL: DOUBTFUL_REASON}
#: Bytes of the file read on each side of a value's span for its context (enough for the label before it).
CONTEXT_BYTES = 60
#: Characters of a row's context kept on each side of the span.
CONTEXT_CHARS = 50
_WHITESPACE = re.compile(r"\s+")


def review_score(value: Any, sources: list[dict] | None, confidence: float | None) -> float:
    """The order score of one value, 0 to 2, lower more doubtful (see the module doc)."""
    ungrounded = claims(value) and evidence_kind(sources) in _KIND_REASON
    return (0.0 if ungrounded else 1.0) + (1.0 if confidence is None else confidence)


def reason_of(value: Any, sources: list[dict] | None, confidence: float | None) -> str:
    """Why a value stands where it does in the review (``REASONS``)."""
    kind = evidence_kind(sources) if claims(value) else None
    if kind in _KIND_REASON:
        return _KIND_REASON[kind]
    return LEAST_CONFIDENCE if confidence is not None else UNMEASURED


def context_of(source: dict) -> str | None:
    """``…before«span»after…`` around ``source`` in its file, on one line (runs of whitespace made one space, so
    a label on the line above shows); None where there is no file to read. Not made safe for a display."""
    parts = excerpt_parts(source, CONTEXT_BYTES)
    if parts is None:
        return None
    before, span, after, cut = parts
    before, span, after = (_WHITESPACE.sub(" ", part) for part in (before, span, after))
    head = ("…" if cut or len(before) > CONTEXT_CHARS else "") + before[-CONTEXT_CHARS:]
    return f"{head}«{span}»{after[:CONTEXT_CHARS]}…"


@dataclass(frozen=True)
class ValueRow:
    """One value of one item: where it is (``item``, ``key``, ``field``: its dotted path, ``order``: its place in
    the result), what it is (``value``, ``confidence``), what its sources say (``found``: ``grounded``,
    ``elsewhere``, ``doubtful``, ``not found``, or None for a null or a value not located; ``source``, ``label``,
    ``context``), and its place in the review (``score``, ``reason``)."""

    item: int
    key: str
    field: str
    value: Scalar
    confidence: float | None
    found: str | None
    source: str | None
    label: str | None
    context: str | None
    score: float
    reason: str
    order: int = 0

    @property
    def sort_key(self) -> tuple:
        return (self.score, self.confidence is None, self.item, self.order)

    def to_json(self) -> dict[str, Any]:
        return {"item": self.item, "key": self.key, "field": self.field, "value": self.value,
                "confidence": self.confidence, "found": self.found, "reason": self.reason,
                "score": round(self.score, 6), "source": self.source, "label": self.label, "context": self.context}


def value_rows(item: int, key: str, result: Any, sources: Mapping[str, list[dict]] | None,
               confidence: Mapping[str, float | None] | None, *, context: bool = True) -> list[ValueRow]:
    """The values of one completed item's result, in document order (``host.fields.result_fields``: at most
    ``MAX_FIELDS``). ``sources``/``confidence``: as its record keeps them (checked), or None; ``context``: read
    each best source's file again for the text around it."""
    rows = []
    for order, (path, value) in enumerate(result_fields(result)):
        found_at = sources.get(path) if sources is not None else None
        sure = confidence.get(path) if confidence is not None else None
        kind = evidence_kind(found_at) if claims(value) else None
        best = found_at[0] if found_at else None
        label = best.get("label") if best is not None else None
        rows.append(ValueRow(
            item, key, path, value, sure, kind,
            source_label(best) if best is not None else None,
            label if isinstance(label, str) and label else None,
            context_of(best) if best is not None and context else None,
            review_score(value, found_at, sure), reason_of(value, found_at, sure), order))
    return rows


def doubtful_first(rows: list[ValueRow]) -> list[ValueRow]:
    """``rows`` in the review's order: by ``review_score``, then a measured value first, then item and field."""
    return sorted(rows, key=lambda r: r.sort_key)


__all__ = ["NOT_FOUND_REASON", "ELSEWHERE_REASON", "DOUBTFUL_REASON", "LEAST_CONFIDENCE", "UNMEASURED", "REASONS",
           "CONTEXT_BYTES", "CONTEXT_CHARS", "review_score", "reason_of", "context_of", "ValueRow", "value_rows",
           "doubtful_first"]

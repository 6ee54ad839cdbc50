"""Whether to trust a map's evidence: per scored field, how often grounded and confident answers were right.

A map with expected answers has a verdict per field and item (``score.FIELD``); a map whose items recorded
sources and confidence has ``grounded.FIELD`` and ``confidence.FIELD`` too. Laid side by side they say, on
this task, whether the signals mean anything: grounded answers right against ungrounded ones, the most
confident half right against the least confident half, and the AUROC of confidence for correctness. The
figures are computed here, from plain per-item values, so ``ScoreSummary`` only shows them. What they mean
and when not to trust them: docs/maps.md, "Whether to trust sources and confidence".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

from tensorjob_jupyter.host.grounding import grounds

__all__ = ["Evidence", "FieldSignal", "auroc", "halves", "field_signals", "evidence_of"]


@dataclass(frozen=True)
class Evidence:
    """One item's verdict on one field with what the map recorded beside it: ``grounded`` (None: the field
    was not located) and ``confidence`` (0 to 1; None: none recorded)."""

    item: int
    right: bool
    grounded: bool | None = None
    confidence: float | None = None


def auroc(confidences: Sequence[float], correct: Sequence[bool]) -> float | None:
    """The probability that a right answer has a higher confidence than a wrong one, a tie counting 1/2
    (the Mann-Whitney U over right times wrong answers, from average ranks); None when either class is empty."""
    n = len(confidences)
    if n != len(correct):
        raise ValueError("as many confidences as verdicts are needed")
    right = sum(1 for ok in correct if ok)
    wrong = n - right
    if not right or not wrong:
        return None
    order = sorted(range(n), key=lambda i: confidences[i])
    rank_sum = 0.0  # of the right answers, ranks 1..n, a run of ties sharing their average rank
    start = 0
    while start < n:
        end = start
        while end + 1 < n and confidences[order[end + 1]] == confidences[order[start]]:
            end += 1
        average = (start + end) / 2 + 1
        rank_sum += average * sum(1 for i in order[start:end + 1] if correct[i])
        start = end + 1
    u = rank_sum - right * (right + 1) / 2
    return min(1.0, max(0.0, u / (right * wrong)))


def halves(pairs: Iterable[tuple[int, float, bool]]) -> tuple[tuple[int, int], tuple[int, int]] | None:
    """(right, count) of the most confident half and of the least confident half of ``(item, confidence,
    right)``: ordered by confidence, highest first, equal confidences by item number (the lower item first),
    the first ``n // 2`` the confident half -- with an odd count the middle item goes to the least confident
    half. None under two items."""
    ordered = sorted(pairs, key=lambda p: (-p[1], p[0]))
    if len(ordered) < 2:
        return None
    top, rest = ordered[:len(ordered) // 2], ordered[len(ordered) // 2:]
    return (sum(p[2] for p in top), len(top)), (sum(p[2] for p in rest), len(rest))


@dataclass(frozen=True)
class FieldSignal:
    """One field's trust figures, each with the counts it rests on; None where the map has no such data
    (no item of the field located, or none with a confidence) -- never zeros in their place."""

    name: str
    grounded: tuple[int, int] | None = None  # (right, count) of the items whose answer was found in a window
    ungrounded: tuple[int, int] | None = None  # (right, count) of those found in none
    confident: tuple[int, int] | None = None  # (right, count) of the most confident half
    unconfident: tuple[int, int] | None = None  # (right, count) of the least confident half
    auroc: float | None = None
    right: int = 0  # items with a confidence that were right, wrong: what the AUROC rests on
    wrong: int = 0

    @property
    def has_grounding(self) -> bool:
        return self.grounded is not None

    @property
    def has_confidence(self) -> bool:
        return self.right + self.wrong > 0

    def to_json(self) -> dict:
        out: dict[str, Any] = {"field": self.name}
        if self.has_grounding:
            out["grounded"] = _share_json(self.grounded)
            out["ungrounded"] = _share_json(self.ungrounded)
        if self.has_confidence:
            out["confident_half"] = _share_json(self.confident)
            out["least_confident_half"] = _share_json(self.unconfident)
            out["auroc"] = None if self.auroc is None else round(self.auroc, 6)
            out["auroc_right"], out["auroc_wrong"] = self.right, self.wrong
        return out


def _share_json(pair: tuple[int, int] | None) -> dict | None:
    if pair is None:
        return None
    right, count = pair
    return {"right": right, "count": count, "accuracy": round(right / count, 6) if count else None}


def field_signals(evidence: Mapping[str, Sequence[Evidence]]) -> tuple[FieldSignal, ...]:
    """Each field's figures from its items' evidence, in the order given; a field with neither grounding nor
    confidence is left out."""
    out = []
    for name, rows in evidence.items():
        located = [e for e in rows if e.grounded is not None]
        grounded = ungrounded = None
        if located:
            found = [e.right for e in located if e.grounded]
            missing = [e.right for e in located if not e.grounded]
            grounded, ungrounded = (sum(found), len(found)), (sum(missing), len(missing))
        measured = [(e.item, e.confidence, e.right) for e in rows if e.confidence is not None]
        confident, unconfident = halves(measured) or (None, None)
        right = sum(1 for _, _, correct in measured if correct)
        signal = FieldSignal(name, grounded, ungrounded, confident, unconfident,
                             auroc([c for _, c, _ in measured], [r for _, _, r in measured]) if measured else None,
                             right, len(measured) - right)
        if signal.has_grounding or signal.has_confidence:
            out.append(signal)
    return tuple(out)


def evidence_of(verdicts: Mapping[int, Mapping[str, bool] | None], paths_of: Callable[[int], Mapping[str, str]],
                sources: Mapping[int, Mapping[str, list]], confidences: Mapping[int, Mapping[str, float | None]]
                ) -> dict[str, list[Evidence]]:
    """Per verdict name, each scored item's verdict with its field's grounding and confidence, where the map
    recorded them. ``paths_of(item)``: the field path (``host.fields``) of each of its verdict names, a name not
    there taken as a path itself (``scoring.verdict_paths``). Only completed items have grounding or confidence
    (a failed item's misses have none)."""
    out: dict[str, list[Evidence]] = {}
    for item in sorted(verdicts):
        fields = verdicts[item]
        if not fields:
            continue
        paths = paths_of(item)
        found, sure = sources.get(item, {}), confidences.get(item, {})
        for name, ok in fields.items():
            path = paths.get(name, name)
            where = found.get(path)
            out.setdefault(name, []).append(Evidence(item, bool(ok), grounds(where),
                                                     sure.get(path)))
    return out

"""Sources: where each field of a job's result was found in the windows that job read.

Each field of a final result is looked for in the job's own windows (``host.windows``) and only there --
exactly, normalised, then fuzzily -- and gets its sources, best first, or ``[]`` when it is found nowhere.
Only an exact or normalised match at word edges *grounds* a value (``grounds``); a fuzzy match and a spelling
that reads as another value too (``05/03/2024``, ``1.234``: ``AMBIGUOUS``) are kept as evidence to doubt, never
as proof.

Locating is the job's own work: it runs under the job's deadline and cancel (``check``, called between steps of
at most a few thousand characters), within ``Bounds`` of bytes, characters and seconds, and in memory that does
not grow with the windows (text is folded a chunk at a time). A field the bounds stopped before it was searched
gets no entry -- never a source. What a job requires of its fields (grounded, present) is
``requirements.py``.

Design: docs/internals/host.md#groundingpy
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Sequence

from rapidfuzz import fuzz

from tensorjob_jupyter import abi
from tensorjob_jupyter.host.fields import MAX_FIELDS, MISSING, child_path, result_fields, value_at
from tensorjob_jupyter.host.labels import FieldNames, label_before
from tensorjob_jupyter.host.spellings import (
    GROUP_CHARS, Folded, ambiguous_date, canonical, chunks, date_pattern, iso_date, number_pattern,
    number_reading, text_pattern,
)
from tensorjob_jupyter.host.windows import Segment

EXACT, NORMALISED, FUZZY, AMBIGUOUS = "exact", "normalised", "fuzzy", "ambiguous"
MATCHES = (EXACT, NORMALISED, FUZZY, AMBIGUOUS)
#: The kinds of match that ground a value: the others are shown, and doubted.
GROUNDING_MATCHES = (EXACT, NORMALISED)
#: The score of a spelling that reads as another value too (``05/03/2024``: 5 March, or May 3; ``1.234``).
AMBIGUOUS_SCORE = 0.5
MiB = 1024 * 1024


@dataclass(frozen=True)
class Bounds:
    """What locating one job's result may cost at most (the defaults bound it to about a second)."""

    max_fields: int = MAX_FIELDS
    """Fields of one result located, the job's required fields first, then in document order."""
    max_sources: int = 3
    """Sources given per field."""
    max_occurrences: int = 256
    """Occurrences of one value looked at, per kind of match (a value found everywhere is found soon)."""
    max_exact_bytes: int = 64 * 1024
    """The longest value (UTF-8 bytes) looked for at all."""
    max_normalised_chars: int = 1000
    """The longest value (characters) given a normalised search."""
    fuzzy_min_chars: int = 8
    fuzzy_max_chars: int = 256
    """Values of these lengths (characters, once normalised) are given a fuzzy search."""
    fuzzy_cutoff: float = 0.9
    """The least similarity (0 to 1) a fuzzy match needs."""
    exact_budget_bytes: int = 256 * MiB
    """Window bytes the exact searches of one job may scan, all fields together."""
    fold_budget_chars: int = 16 * MiB
    """Window characters folded for the normalised and fuzzy searches (each pass folds what it reads)."""
    normalised_budget_chars: int = 64 * MiB
    """Folded characters the normalised searches may scan, all fields together."""
    fuzzy_budget_chars: int = 256 * 1024
    """Folded characters the fuzzy searches may align against, all fields together."""
    max_seconds: float = 1.0
    """Seconds one result's locating may take (within the job's own deadline, which ends the job): the fields
    not searched by then get no entry."""
    max_sources_bytes: int = 256 * 1024
    """The sources of one result as JSON, all fields together: a field past it gets no entry (a result's paths
    grow with its depth, so sources could otherwise outweigh the result many times)."""


DEFAULT_BOUNDS = Bounds()

# --- the work: budgets, seconds, the job's check ------------------------------------------------------------


@dataclass
class _Budget:
    exact: int
    fold: int
    normalised: int
    fuzzy: int


class _Work:
    """One result's locating: what is left of its budgets and its seconds, and the job's ``check`` (which raises
    the job's ``JobFailure`` once it is cancelled or past its deadline)."""

    def __init__(self, bounds: Bounds, check: Callable[[], None] | None, clock: Callable[[], float]):
        self.budget = _Budget(bounds.exact_budget_bytes, bounds.fold_budget_chars, bounds.normalised_budget_chars,
                              bounds.fuzzy_budget_chars)
        self._check = check
        self._clock = clock
        self._until = clock() + bounds.max_seconds

    def go_on(self) -> bool:
        """False once the seconds are spent; the job's failure once it is cancelled or past its deadline."""
        if self._check is not None:
            self._check()
        return self._clock() < self._until


# --- one field -----------------------------------------------------------------------------------------------


def _is_word(ch: str) -> bool:
    """A letter or digit of a script that puts spaces between words: where a match must not start or end inside
    a word. Thai, Lao, Khmer, Myanmar, and the scripts from CJK on (U+2E80), write words unspaced: a value there
    may start and end at any character."""
    if not ch.isalnum():
        return False
    point = ord(ch)
    return not (0x0E00 <= point <= 0x0EFF or 0x1000 <= point <= 0x109F or 0x1780 <= point <= 0x17FF
                or point >= 0x2E80)


#: Characters of context around a match that the edge checks look at (a digit group is a separator and three).
_CONTEXT = 5
_GROUP_TAIL = re.compile(r"\d{3}(?!\d)")
MINUS = "-\u2212"


def _around(data: bytes, start: int, end: int) -> tuple[str, str]:
    """The ``_CONTEXT`` characters before byte ``start`` and after byte ``end`` of ``data`` (fewer at its edges)."""
    before = data[max(0, start - 4 * _CONTEXT):start].decode("utf-8", "ignore")[-_CONTEXT:]
    after = data[end:end + 4 * _CONTEXT].decode("utf-8", "ignore")[:_CONTEXT]
    return before, after


def _number_edge(before: str, after: str, value_text: str) -> bool:
    """A number seen as part of a longer one: ``5`` in ``3.5``, ``1,234`` in ``1,234,567``, ``234`` in
    ``1 234``, ``5`` in ``-5`` (a minus after no letter or digit is the number's sign) -- but not ``0`` in ``0 0``
    (a space, quote or underscore joins digits only as a group of three), nor ``5`` in ``3-5``."""
    if not value_text:
        return False
    if value_text[-1].isdigit() and after[:1]:
        if after[0] in ".," and after[1:2].isdigit():
            return True
        if after[0] in GROUP_CHARS and _GROUP_TAIL.match(after, 1):
            return True
    if value_text[0].isdigit() and before[-1:]:
        if before[-1] in MINUS and not (before[-2:-1] and before[-2].isalnum()):
            return True
        if before[-2:-1].isdigit():
            if before[-1] in ".,":
                return True
            if before[-1] in GROUP_CHARS and _GROUP_TAIL.match(value_text):
                return True
    return False


class _Field:
    """How one value is looked for: its exact bytes, its normalised pattern, its fuzzy needle."""

    def __init__(self, value: Any, bounds: Bounds):
        self.value = value
        self.number = isinstance(value, (int, float)) and not isinstance(value, bool)
        text = abi.dumps(value) if not isinstance(value, str) else value
        self.text = text
        self.exact = text.encode("utf-8")
        self.canon = canonical(text) if len(text) <= bounds.max_normalised_chars else None
        self.day = iso_date(text) if isinstance(value, str) else None
        pattern = None
        if self.number:
            pattern = number_pattern(value)
        elif self.canon:
            pattern = text_pattern(self.canon)
            if self.day is not None:
                pattern = f"{pattern}|{date_pattern(self.day)}"
        self.pattern = re.compile(pattern) if pattern else None
        self.fuzzy = (isinstance(value, str) and self.canon is not None and self.day is None
                      and bounds.fuzzy_min_chars <= len(self.canon) <= bounds.fuzzy_max_chars)
        self._echoes: dict[Any, bool] = {}

    def same(self, span: str) -> bool:
        """Whether ``span`` is this value, normalised."""
        return self.reading(span) is not None

    def reading(self, span: str) -> str | None:
        """How ``span`` spells this value: ``NORMALISED``, ``AMBIGUOUS`` (it reads as another value too: a number
        with one decimal mark and three digits, a numeric date whose day and month may swap), or None (not it)."""
        if self.number:
            how = number_reading(self.value, span)
            return None if how is None else AMBIGUOUS if how == "two" else NORMALISED
        if self.day is not None and re.fullmatch(date_pattern(self.day), Folded(span).text.strip()):
            return AMBIGUOUS if ambiguous_date(span) else NORMALISED
        return NORMALISED if self.canon is not None and canonical(span) == self.canon else None

    def edges_ok(self, before: str, after: str) -> bool:
        first, last = self.text.lstrip()[:1], self.text.rstrip()[-1:]
        if first and _is_word(first) and before and _is_word(before[-1]):
            return False
        if last and _is_word(last) and after and _is_word(after[0]):
            return False
        if self.number and first in MINUS and before and before[-1].isalnum():
            return False  # "-5" in "3-5" or "ABC-5" is a range or a code, not minus five
        return not _number_edge(before, after, self.text.strip())

    def echoed(self, place: Any) -> bool:
        """Whether the guest itself wrote this value into the URL that ``place`` was fetched from (a body that
        says it back is no evidence); False for a file."""
        if place.url is None:
            return False
        if place not in self._echoes:
            needle = self.canon if self.canon else self.text.casefold()
            self._echoes[place] = any(self._at_edges(self.text, text) or (needle and self._at_edges(needle,
                                                                                                  canonical(text)))
                                      for text in place.url_texts)
        return self._echoes[place]

    def _at_edges(self, needle: str, text: str) -> bool:
        """Whether ``needle`` stands in ``text`` at word edges (a ``2`` in ``/v2/`` is not the guest's 2)."""
        at, seen = text.find(needle), 0
        while at >= 0 and seen < 64:
            if self.edges_ok(text[max(0, at - _CONTEXT):at], text[at + len(needle):at + len(needle) + _CONTEXT]):
                return True
            at, seen = text.find(needle, at + 1), seen + 1
        return False


def _source(seg: Segment, start: int, end: int, match: str, score: float) -> dict:
    """One source: where (``start``/``end``: offsets in the place), how, and the label the span stands under."""
    place = seg.place
    return {"file": place.file, "url": place.url, "page": place.page, "start": start, "end": end,
            "match": match, "score": round(float(score), 4), "label": label_before(seg.data, start - seg.start)}


# --- the searches ----------------------------------------------------------------------------------------------


#: Sources gathered per field before the best ``max_sources`` are kept: a value under another field's label
#: in its first places may stand under its own further on.
CANDIDATES_PER_SOURCE = 4


def _candidates(bounds: Bounds) -> int:
    return bounds.max_sources * CANDIDATES_PER_SOURCE


def _exact(field: _Field, segments: Sequence[Segment], work: _Work, bounds: Bounds) -> list[dict] | None:
    """The value's bytes at word edges, or None when the bounds stopped the search first."""
    found: list[dict] = []
    needle, seen = field.exact, 0
    kind = AMBIGUOUS if field.number and field.reading(field.text) == AMBIGUOUS else EXACT  # 1.234: or 1234?
    for seg in segments:
        if not work.go_on() or work.budget.exact < len(seg.data):
            return None
        work.budget.exact -= len(seg.data)
        if field.echoed(seg.place):
            continue
        data, at = seg.data, seg.data.find(needle)
        while at >= 0 and len(found) < _candidates(bounds) and seen < bounds.max_occurrences:
            seen += 1
            end = at + len(needle)
            if field.edges_ok(*_around(data, at, end)):
                found.append(_source(seg, seg.start + at, seg.start + end, kind,
                                     AMBIGUOUS_SCORE if kind == AMBIGUOUS else 1.0))
            at = data.find(needle, at + 1)
        if len(found) >= _candidates(bounds) or seen >= bounds.max_occurrences:
            break
    if not found and seen >= bounds.max_occurrences:
        return None  # so many places, none of them the value's: not looked at everywhere, so not "not found"
    return found


#: Folded characters a window keeps of the one before it, so that a match across a chunk's cut is whole.
_KEEP = 2048


class _Windows:
    """The segments' text folded a chunk at a time, each chunk joined to the end of the one before (``_KEEP``
    characters): ``(segment, window, fresh)``, where a match ending after ``fresh`` has not been seen whole
    before and one ending in the last ``_CONTEXT`` characters of a window that is not its text's last comes
    again in the next (with what follows it). ``complete`` says whether every window was given."""

    def __init__(self, segments: Sequence[Segment], work: _Work):
        self.segments, self.work, self.complete = segments, work, False

    def __iter__(self) -> Iterator[tuple[Segment, Folded, int, int]]:
        for seg in self.segments:
            for base, text in seg.pieces():
                window: Folded | None = None
                kept = 0
                at = base
                pending = chunks(text)
                chunk = next(pending, None)
                while chunk is not None:
                    following = next(pending, None)
                    if not self.work.go_on() or self.work.budget.fold < len(chunk):
                        return
                    self.work.budget.fold -= len(chunk)
                    folded = Folded(chunk, at)
                    at += len(chunk.encode("utf-8", "surrogatepass"))
                    window = folded if window is None else window.joined(folded, _KEEP)
                    fresh = max(0, kept - _CONTEXT) if kept else 0
                    limit = len(window) if following is None else len(window) - _CONTEXT
                    yield seg, window, fresh, limit
                    kept = min(_KEEP, len(window))
                    chunk = following
        self.complete = True


def _normalised(fields: list[_Field], segments: Sequence[Segment], work: _Work,
                bounds: Bounds) -> list[list[dict] | None]:
    """Each field's normalised matches (a pass over the folded windows for all of them together); None for a
    field the bounds stopped before it was searched everywhere and that was found nowhere before that."""
    found: list[list[dict]] = [[] for _ in fields]
    seen = [0] * len(fields)
    stopped = [False] * len(fields)
    windows = _Windows(segments, work)
    for seg, window, fresh, limit in windows:
        text = window.text
        for i, field in enumerate(fields):
            if stopped[i] or len(found[i]) >= _candidates(bounds):
                continue
            if seen[i] >= bounds.max_occurrences:
                stopped[i] = True  # so many places: the rest are not looked at
                continue
            if work.budget.normalised < len(text):
                stopped[i] = True
                continue
            work.budget.normalised -= len(text)
            if field.echoed(seg.place):
                continue
            assert field.pattern is not None, "only a field with a pattern is searched for normalised"
            for m in field.pattern.finditer(text):
                if m.end() <= fresh or m.end() > limit or m.end() == m.start():
                    continue
                seen[i] += 1
                if seen[i] > bounds.max_occurrences:
                    stopped[i] = True
                    break
                before, after = text[max(0, m.start() - _CONTEXT):m.start()], text[m.end():m.end() + _CONTEXT]
                if not field.edges_ok(before, after):
                    continue
                start, end = window.byte_span(m.start(), m.end())
                span = seg.data[start - seg.start:end - seg.start].decode("utf-8", "replace")
                how = field.reading(span)
                if how is not None:
                    found[i].append(_source(seg, start, end, how, AMBIGUOUS_SCORE if how == AMBIGUOUS else 1.0))
                    if len(found[i]) >= _candidates(bounds):
                        break
    out: list[list[dict] | None] = []
    for i, sources in enumerate(found):
        whole = (windows.complete and not stopped[i]) or len(sources) >= _candidates(bounds)
        out.append(sorted(sources, key=_best_first) if sources or whole else None)
    return out


def _fuzzy(fields: list[_Field], segments: Sequence[Segment], work: _Work,
           bounds: Bounds) -> list[list[dict] | None]:
    """Each field's best fuzzy match, ``[]``, or None (stopped before it was searched everywhere)."""
    best: list[tuple[float, dict] | None] = [None] * len(fields)
    stopped = [False] * len(fields)
    cutoff = bounds.fuzzy_cutoff
    windows = _Windows(segments, work)
    for seg, window, _fresh, _limit in windows:
        text = window.text
        for i, field in enumerate(fields):
            assert field.canon is not None, "a fuzzy field has its canonical text"
            needle = field.canon
            if stopped[i] or len(text) < len(needle) or field.echoed(seg.place):
                continue
            if work.budget.fuzzy < len(text):
                stopped[i] = True
                continue
            work.budget.fuzzy -= len(text)
            aligned = fuzz.partial_ratio_alignment(needle, text, score_cutoff=cutoff * 100)
            if aligned is None or aligned.dest_end <= aligned.dest_start:
                continue
            for lo, hi in _spans_to_try(text, aligned.dest_start, aligned.dest_end):
                if not field.edges_ok(text[max(0, lo - _CONTEXT):lo], text[hi:hi + _CONTEXT]):
                    continue  # a stretch that cuts a word is not the value (``Ann Lee Jr`` is not ``Ann Lee. r``)
                start, end = window.byte_span(lo, hi)
                span = seg.data[start - seg.start:end - seg.start].decode("utf-8", "replace")
                said = canonical(span)
                if seg.place.url is not None and any(said in canonical(t) for t in seg.place.url_texts):
                    continue  # the body says back what the guest wrote in the URL, near the value or not
                score = fuzz.ratio(needle, said) / 100
                current = best[i]
                if score >= cutoff and (current is None or score > current[0]):
                    best[i] = (score, _source(seg, start, end, FUZZY, score))
    out: list[list[dict] | None] = []
    for i, found in enumerate(best):
        if found is not None:
            out.append([found[1]])
        else:
            out.append([] if windows.complete and not stopped[i] else None)
    return out


def _spans_to_try(text: str, start: int, end: int) -> list[tuple[int, int]]:
    """The aligned stretch, and the same widened to the edges of the words it cuts (an alignment as long as the
    value may cut a letter off the value's first or last word)."""
    lo, hi = start, end
    while lo > 0 and lo > start - 16 and _is_word(text[lo - 1]):
        lo -= 1
    while hi < len(text) and hi < end + 16 and _is_word(text[hi]):
        hi += 1
    return list(dict.fromkeys(((start, end), (lo, end), (start, hi), (lo, hi))))


_RANK = {EXACT: 0, NORMALISED: 1, AMBIGUOUS: 2, FUZZY: 3}


def _best_first(source: dict) -> tuple[int, float]:
    return _RANK.get(source["match"], 9), -source["score"]


def claims(value: Any) -> bool:
    """Whether a field's value is a claim a window can ground: not null and not empty (or blank) text."""
    if value is None:
        return False
    return not (isinstance(value, str) and not value.strip())


def grounds(sources: list[dict] | None) -> bool | None:
    """Whether a field's sources (as recorded: read back, so checked) ground its value -- an exact or normalised
    match that does not stand under another field's label; None when it was not located."""
    if sources is None:
        return None
    return any(isinstance(s, dict) and s.get("match") in GROUNDING_MATCHES and s.get("elsewhere") is not True
               for s in sources)


#: What a field's sources say of its value -- the view's mark, the terminal's word, the review's reason: the value
#: itself in what the job read; found, but only under another field's label; only a fuzzy match or an ambiguous
#: spelling; not found.
GROUNDED, ELSEWHERE, DOUBTFUL, NOT_FOUND = "grounded", "elsewhere", "doubtful", "not found"


def evidence_kind(sources: list[dict] | None) -> str | None:
    """``GROUNDED``, ``ELSEWHERE``, ``DOUBTFUL`` or ``NOT_FOUND`` for a field's sources (as recorded: checked);
    None when it was not located."""
    if sources is None:
        return None
    if grounds(sources):
        return GROUNDED
    if not sources:
        return NOT_FOUND
    if any(isinstance(s, dict) and s.get("elsewhere") is True and s.get("match") in GROUNDING_MATCHES
           for s in sources):
        return ELSEWHERE
    return DOUBTFUL


def _placed(path: str, sources: list[dict], names: FieldNames, most: int) -> list[dict]:
    """``sources`` with the field each one's label names (``under``) and whether that is another field
    (``elsewhere``), best first -- under the field's own label or none, then the kind of match -- the best
    ``most`` of them."""
    for s in sources:
        s["under"] = names.named(s["label"])
        s["elsewhere"] = names.elsewhere(path, s["label"]) is not None
    return sorted(sources, key=lambda s: (s["elsewhere"], s["under"] is None, *_best_first(s), s["start"]))[:most]


def locate(result: Any, segments: Sequence[Segment], *, first: Iterable[str] = (),
           bounds: Bounds = DEFAULT_BOUNDS, check: Callable[[], None] | None = None,
           clock: Callable[[], float] = time.monotonic) -> dict[str, list[dict]]:
    """Each field of ``result`` with its sources in ``segments`` (see the module doc), in document order;
    ``first``: paths (or their prefixes) searched before the others, so the bounds reach them; ``check``: the
    job's own (raises its ``JobFailure`` once it is cancelled or past its deadline), called between steps."""
    fields = _fields(result, list(first), bounds.max_fields)
    work = _Work(bounds, check, clock)
    searched: dict[int, list[dict] | None] = {}
    looks: dict[int, _Field] = {}
    for i in range(len(fields)):  # the required first, then document order
        if not work.go_on():
            break  # a value's expression is compiled before it is searched: no more of them once time is up
        try:
            field = _Field(fields[i][1], bounds)
        except (UnicodeError, RecursionError, ValueError):
            continue
        if len(field.exact) > bounds.max_exact_bytes:
            continue
        looks[i] = field
        searched[i] = _exact(field, segments, work, bounds)
    _then(looks, searched, lambda i: looks[i].pattern is not None, _normalised, segments, work, bounds)
    _then(looks, searched, lambda i: looks[i].fuzzy, _fuzzy, segments, work, bounds)
    found: dict[int, list[dict]] = {}
    names: FieldNames | None = None  # built once a field has sources to place (none has where nothing was read)
    size = 2  # {}
    for i in range(len(fields)):
        sources = searched.get(i)
        if sources is None:
            continue
        if sources:
            names = names or FieldNames(path for path, _ in fields)
            sources = _placed(fields[i][0], sources, names, bounds.max_sources)
        size += len(abi.dumps({fields[i][0]: sources}).encode("utf-8")) - 1  # the entry and its comma
        if size > bounds.max_sources_bytes:
            break
        found[i] = sources
    return {fields[i][0]: found[i] for i in sorted(found)}


def _fields(result: Any, first: list[str], most: int) -> list[tuple[str, Any]]:
    """The fields to locate, at most ``most``: those under ``first`` (the required, reached by their paths even
    past the ``most``-th leaf of the whole), then the rest in document order; only claims."""
    out: dict[str, Any] = {}
    for name in first:
        value = value_at(result, name)
        if value is MISSING:
            continue
        for rel, leaf in result_fields(value, limit=most):
            out.setdefault(child_path(name, rel), leaf)
    for path, leaf in result_fields(result, limit=most):
        out.setdefault(path, leaf)
    return [(path, value) for path, value in out.items() if claims(value)][:most]


def _then(looks: dict[int, _Field], searched: dict[int, list[dict] | None], eligible: Callable[[int], bool],
          search: Callable[..., list[list[dict] | None]], segments: Sequence[Segment], work: _Work,
          bounds: Bounds) -> None:
    """The next kind of search, for the fields the ones before searched everywhere and found nowhere."""
    todo = [i for i in looks if searched.get(i) == [] and eligible(i)]
    if not todo:
        return
    for i, sources in zip(todo, search([looks[i] for i in todo], segments, work, bounds)):
        searched[i] = sources


# --- sources as a person reads them -----------------------------------------------------------------------


def source_label(source: dict) -> str:
    """One source as ``NAME:START-END`` (the file's name, byte offsets), ``NAME#PAGE:START-END`` for a page's
    text (zero-based, as the ABI counts pages), ``URL:START-END`` for a fetched body."""
    where = source.get("url") or os.path.basename(str(source.get("file") or "")) or "?"
    if source.get("page") is not None:
        where = f"{where}#{source['page']}"
    return f"{where}:{source.get('start')}-{source.get('end')}"


def sources_label(sources: list[dict] | None) -> str | None:
    """A field's sources in a table cell: the best one's ``source_label`` (and ``(+N)`` more); ``""`` when
    found nowhere; None when not located."""
    if sources is None:
        return None
    if not sources:
        return ""
    more = f" (+{len(sources) - 1})" if len(sources) > 1 else ""
    label = source_label(sources[0])
    return label + (f" ({sources[0].get('match')})" if sources[0].get("match") != EXACT else "") + more


__all__ = [
    "EXACT", "NORMALISED", "FUZZY", "AMBIGUOUS", "MATCHES", "GROUNDING_MATCHES", "AMBIGUOUS_SCORE", "Bounds",
    "DEFAULT_BOUNDS", "Folded", "canonical", "iso_date", "date_pattern", "ambiguous_date", "claims", "grounds",
    "GROUNDED", "ELSEWHERE", "DOUBTFUL", "NOT_FOUND", "evidence_kind",
    "locate", "source_label", "sources_label"
]

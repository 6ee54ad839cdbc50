"""Sources: where each field of a job's result was found in the windows that job read.

Each field of a final result is looked for in the job's own windows (``host.windows``) and only there --
exactly, normalised, then fuzzily -- and gets its sources, best first, or ``[]`` when it is found nowhere.
The work is bounded by ``Bounds``; ``require_grounded`` turns a named field found nowhere into the job's
failure (``ungrounded``).

Design: docs/internals/host.md#groundingpy
"""

from __future__ import annotations

import datetime
import logging
import os
import re
import unicodedata
from bisect import bisect_right
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any, Iterable, Sequence

import numpy as np
from rapidfuzz import fuzz

from tensorjob_jupyter import abi
from tensorjob_jupyter.abi import JobFailure, codes
from tensorjob_jupyter.host.fields import MAX_FIELDS, MISSING, result_fields, value_at
from tensorjob_jupyter.host.windows import ReadWindows, Segment
from tensorjob_jupyter.text import clip

EXACT, NORMALISED, FUZZY = "exact", "normalised", "fuzzy"
MATCHES = (EXACT, NORMALISED, FUZZY)
#: The score of an exact match inside a longer word or number, given only when nothing else is found.
MID_WORD_SCORE = 0.5
MiB = 1024 * 1024
log = logging.getLogger("tensorjob_jupyter")


@dataclass(frozen=True)
class Bounds:
    """What locating one job's result may cost at most (the defaults bound it to a fraction of a second)."""

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
    normalised_budget_chars: int = 64 * MiB
    """Window characters the normalised searches may fold and scan, all fields together."""
    fuzzy_budget_chars: int = 4 * MiB
    """Window characters the fuzzy searches may align against, all fields together."""
    max_sources_bytes: int = 256 * 1024
    """The sources of one result as JSON, all fields together: a field past it gets no entry (a result's paths
    grow with its depth, so sources could otherwise outweigh the result many times)."""


DEFAULT_BOUNDS = Bounds()

# --- folding: a text compared as NFKC, case-folded, with the way back to its bytes -----------------------

_ASCII, _LINEAR, _ATOMIC = 0, 1, 2
#: Characters folded as one piece at most (a piece ends before an ASCII character, which composes with nothing
#: before it): a regular piece is folded whole, an irregular one character by character.
_CHUNK = 4096
_ASCII_CHAR = re.compile(r"[\x00-\x7f]")


def _utf8_offsets(text: str) -> np.ndarray:
    """The byte offset of each character of ``text`` in its UTF-8, and its length at the end (``n + 1``)."""
    points = np.frombuffer(text.encode("utf-32-le"), dtype="<u4")
    sizes = 1 + (points >= 0x80).astype(np.int64) + (points >= 0x800) + (points >= 0x10000)
    out = np.zeros(len(points) + 1, dtype=np.int64)
    np.cumsum(sizes, out=out[1:])
    return out


def _fold_unit(unit: str) -> str:
    return unicodedata.normalize("NFKC", unit).casefold()


def _chunks(text: str) -> Iterable[str]:
    i, n = 0, len(text)
    while i < n:
        j = i + _CHUNK
        if j < n:
            m = _ASCII_CHAR.search(text, j)
            j = m.start() if m else n
        yield text[i:j]
        i = j


class Folded:
    """``text`` folded for comparison (``.text``), and ``byte_span`` from a folded stretch back to the bytes of
    the original it came from (whole characters, a character and its combining marks kept together)."""

    __slots__ = ("text", "base", "_starts", "_pieces")
    text: str
    base: int
    _starts: list[int]
    _pieces: list[tuple[int, int, Any]]  # (kind, first byte, payload: the kind's offsets or end byte)

    def __init__(self, text: str, base: int = 0):
        self.base = base
        if text.isascii():
            self.text = text.lower()
            self._starts = [0]
            self._pieces = [(_ASCII, base, None)]
            return
        parts: list[str] = []
        starts: list[int] = []
        pieces: list[tuple[int, int, Any]] = []
        f_pos, b_pos = 0, base

        def add(kind: int, folded: str, nbytes: int, payload: Any) -> None:
            nonlocal f_pos, b_pos
            if not folded:  # a character that folds to nothing still ends where it ends
                b_pos += nbytes
                return
            starts.append(f_pos)
            pieces.append((kind, b_pos, payload))
            parts.append(folded)
            f_pos += len(folded)
            b_pos += nbytes

        for chunk in _chunks(text):
            if chunk.isascii():
                add(_ASCII, chunk.lower(), len(chunk), None)
                continue
            folded = chunk.casefold()
            if len(folded) == len(chunk) and unicodedata.is_normalized("NFKC", chunk):
                offsets = _utf8_offsets(chunk)
                add(_LINEAR, folded, int(offsets[-1]), offsets)
                continue
            run: list[str] = []  # ASCII characters waiting to be one piece
            units = _units(chunk)
            for unit in units:
                if len(unit) == 1 and unit.isascii():
                    run.append(unit)
                    continue
                if run:
                    add(_ASCII, "".join(run).lower(), len(run), None)
                    run = []
                nbytes = len(unit.encode("utf-8"))
                add(_ATOMIC, _fold_unit(unit), nbytes, b_pos + nbytes)
            if run:
                add(_ASCII, "".join(run).lower(), len(run), None)
        self.text = "".join(parts)
        self._starts = starts or [0]
        self._pieces = pieces or [(_ASCII, base, None)]

    def byte_span(self, start: int, end: int) -> tuple[int, int]:
        """The bytes (offsets in the original's place) that folded characters ``start`` to ``end`` came from."""
        return self._byte_at(start, False), self._byte_at(end - 1, True)

    def _byte_at(self, index: int, after: bool) -> int:
        i = bisect_right(self._starts, index) - 1
        kind, b_start, payload = self._pieces[i]
        k = index - self._starts[i]
        if kind == _ASCII:
            return b_start + k + (1 if after else 0)
        if kind == _LINEAR:
            return b_start + int(payload[k + 1 if after else k])
        return payload if after else b_start


def _units(text: str) -> list[str]:
    """``text`` as characters, each with the combining marks after it."""
    units: list[str] = []
    for ch in text:
        if units and unicodedata.combining(ch):
            units[-1] += ch
        else:
            units.append(ch)
    return units


_SPACES = re.compile(r"\s+")
#: A digit-group separator, once folded (NFKC makes no-break and thin spaces plain spaces).
_GROUP_CHARS = ",'\u2019_ "
_GROUP_SEPARATOR = re.compile(r"(?<=\d)[,'\u2019_ ](?=\d{3}(?!\d))")
_OPTIONAL_SEPARATOR = "[,'\u2019_ ]?"


def canonical(text: str) -> str:
    """``text`` as the normalised match compares it: folded, whitespace runs one space, digit groups joined."""
    return _GROUP_SEPARATOR.sub("", _SPACES.sub(" ", Folded(text).text)).strip()


def _digits_pattern(digits: str, integer: bool) -> str:
    """A run of digits, with an optional group separator every three from the right when it is a number's
    integer part."""
    if not integer or len(digits) <= 3:
        return digits
    head = len(digits) % 3 or 3
    groups = [digits[:head]] + [digits[i:i + 3] for i in range(head, len(digits), 3)]
    return _OPTIONAL_SEPARATOR.join(groups)


_DIGIT_RUN = re.compile(r"\d+")


def _text_pattern(canon: str) -> str:
    """The regular expression of the stretches of a folded text whose canonical form is ``canon``."""
    out, pos = [], 0
    for m in _DIGIT_RUN.finditer(canon):
        out.append(_escaped(canon[pos:m.start()]))
        integer = not (m.start() > 0 and canon[m.start() - 1] in ".,")
        out.append(_digits_pattern(m.group(), integer))
        pos = m.end()
    out.append(_escaped(canon[pos:]))
    return "".join(out)


def _escaped(text: str) -> str:
    return r"\s+".join(re.escape(part) for part in text.split(" "))


# --- numbers and dates ---------------------------------------------------------------------------------

def _number_pattern(value: int | float) -> str | None:
    """Every decimal spelling of ``value`` (signs, digit groups, trailing zeros), on folded text."""
    try:
        number = Decimal(str(value)) if isinstance(value, int) else Decimal(repr(value))
    except InvalidOperation:
        return None
    if not number.is_finite() or abs(number.adjusted()) > 400:
        return None
    text = format(number, "f")
    sign = ""
    if text.startswith("-"):
        sign, text = "(?:-|\u2212)", text[1:]
    whole, _, fraction = text.partition(".")
    fraction = fraction.rstrip("0")
    tail = (r"\." + fraction + "0*") if fraction else r"(?:\.0+)?"
    return sign + _digits_pattern(whole, True) + tail


def _number_matches(value: int | float, text: str) -> bool:
    cleaned = _GROUP_SEPARATOR.sub("", Folded(text).text.strip()).replace("\u2212", "-")
    try:
        expected = Decimal(str(value)) if isinstance(value, int) else Decimal(repr(value))
        return Decimal(cleaned) == expected
    except InvalidOperation:
        return False


_ISO_DATE = re.compile(r"(\d{4})-(\d{2})-(\d{2})")
_MONTHS = ("january", "february", "march", "april", "may", "june", "july", "august", "september", "october",
           "november", "december")


def iso_date(value: str) -> datetime.date | None:
    """The day an ISO date string (``YYYY-MM-DD``, nothing more) names, or None."""
    m = _ISO_DATE.fullmatch(value.strip())
    if m is None:
        return None
    try:
        return datetime.date(int(m[1]), int(m[2]), int(m[3]))
    except ValueError:
        return None


def date_pattern(day: datetime.date) -> str:
    """The usual spellings of ``day``, on folded (lower-case) text."""
    full = _MONTHS[day.month - 1]
    names = [full, full[:3]] + (["sept"] if day.month == 9 else [])
    name = "(?:" + "|".join(sorted(set(names), key=len, reverse=True)) + r")\.?"
    d = f"0?{day.day}" if day.day < 10 else str(day.day)
    m = f"0?{day.month}" if day.month < 10 else str(day.month)
    ordinal = d + "(?:st|nd|rd|th)?"
    y = str(day.year)
    return "|".join((rf"{name}\s+{ordinal},?\s+{y}", rf"{ordinal}\s+(?:of\s+)?{name},?\s+{y}",
                     rf"{y}[-/.]{m}[-/.]{d}", rf"{d}[./-]{m}[./-]{y}", rf"{m}/{d}/{y}"))


# --- one field's search ------------------------------------------------------------------------------------


@dataclass
class _Budget:
    exact: int
    normalised: int
    fuzzy: int


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


def _around(data: bytes, start: int, end: int) -> tuple[str, str]:
    """The ``_CONTEXT`` characters before byte ``start`` and after byte ``end`` of ``data`` (fewer at its edges)."""
    before = data[max(0, start - 4 * _CONTEXT):start].decode("utf-8", "ignore")[-_CONTEXT:]
    after = data[end:end + 4 * _CONTEXT].decode("utf-8", "ignore")[:_CONTEXT]
    return before, after


def _number_edge(before: str, after: str, value_text: str) -> bool:
    """A number seen as part of a longer one: ``5`` in ``3.5``, ``1,234`` in ``1,234,567``, ``234`` in
    ``1 234`` -- but not ``0`` in ``0 0`` (a space, quote or underscore joins digits only as a group of three)."""
    if not value_text:
        return False
    if value_text[-1].isdigit() and after[:1]:
        if after[0] in ".," and after[1:2].isdigit():
            return True
        if after[0] in _GROUP_CHARS and _GROUP_TAIL.match(after, 1):
            return True
    if value_text[0].isdigit() and before[-1:] and before[-2:-1].isdigit():
        if before[-1] in ".,":
            return True
        if before[-1] in _GROUP_CHARS and _GROUP_TAIL.match(value_text):
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
            pattern = _number_pattern(value)
        elif self.canon:
            pattern = _text_pattern(self.canon)
            if self.day is not None:
                pattern = f"{pattern}|{date_pattern(self.day)}"
        self.pattern = re.compile(pattern) if pattern else None
        self.fuzzy = (isinstance(value, str) and self.canon is not None and self.day is None
                      and bounds.fuzzy_min_chars <= len(self.canon) <= bounds.fuzzy_max_chars)

    def same(self, span: str) -> bool:
        """Whether ``span`` is this value, normalised."""
        if self.number:
            return _number_matches(self.value, span)
        if self.day is not None and re.fullmatch(date_pattern(self.day), Folded(span).text.strip()):
            return True
        return self.canon is not None and canonical(span) == self.canon

    def edges_ok(self, before: str, after: str) -> bool:
        first, last = self.text.lstrip()[:1], self.text.rstrip()[-1:]
        if first and _is_word(first) and before and _is_word(before[-1]):
            return False
        if last and _is_word(last) and after and _is_word(after[0]):
            return False
        return not _number_edge(before, after, self.text.strip())


def _source(place, start: int, end: int, match: str, score: float) -> dict:
    return {"file": place.file, "url": place.url, "page": place.page, "start": start, "end": end,
            "match": match, "score": round(float(score), 4)}


class _Haystack:
    """The job's segments, each folded the first time a normalised or fuzzy search needs it."""

    def __init__(self, segments: Sequence[Segment]):
        self.segments = list(segments)
        self._folded: list[list[Folded]] | None = None

    def folded(self, budget: _Budget) -> list[list[Folded]] | None:
        if self._folded is None:
            size = sum(len(s.data) for s in self.segments)
            if size > budget.normalised:
                return None
            budget.normalised -= size
            self._folded = [[Folded(text, base) for base, text in s.pieces()] for s in self.segments]
        return self._folded


def _exact(field: _Field, hay: _Haystack, budget: _Budget, bounds: Bounds) -> tuple[list[dict], list[dict]] | None:
    """(matches at word edges, matches inside words), or None when the budget ran out first."""
    edged: list[dict] = []
    inside: list[dict] = []
    needle, most, seen = field.exact, bounds.max_sources, 0
    for seg in hay.segments:
        if budget.exact < len(seg.data):
            return None
        budget.exact -= len(seg.data)
        data, at = seg.data, seg.data.find(needle)
        while at >= 0 and len(edged) < most and seen < bounds.max_occurrences:
            seen += 1
            end = at + len(needle)
            if field.edges_ok(*_around(data, at, end)):
                edged.append(_source(seg.place, seg.start + at, seg.start + end, EXACT, 1.0))
            elif len(inside) < most and not field.number:  # 12 in 2012 is another number
                inside.append(_source(seg.place, seg.start + at, seg.start + end, EXACT, MID_WORD_SCORE))
            at = data.find(needle, at + 1)
        if len(edged) >= most or seen >= bounds.max_occurrences:
            break
    return edged, inside


def _normalised(field: _Field, hay: _Haystack, budget: _Budget, bounds: Bounds) -> list[dict] | None:
    assert field.pattern is not None, "only a field with a pattern is searched for normalised"
    folded = hay.folded(budget)
    if folded is None:
        return None
    found: list[dict] = []
    most, seen = bounds.max_sources, 0
    for seg, pieces in zip(hay.segments, folded):
        for piece in pieces:
            text = piece.text
            if budget.normalised < len(text):
                return None
            budget.normalised -= len(text)
            for m in field.pattern.finditer(text):
                seen += 1
                if seen > bounds.max_occurrences:
                    return found
                before, after = text[max(0, m.start() - _CONTEXT):m.start()], text[m.end():m.end() + _CONTEXT]
                if not field.edges_ok(before, after):
                    continue
                start, end = piece.byte_span(m.start(), m.end())
                span = seg.data[start - seg.start:end - seg.start].decode("utf-8", "replace")
                if field.same(span):
                    found.append(_source(seg.place, start, end, NORMALISED, 1.0))
                    if len(found) >= most:
                        return found
    return found


def _fuzzy(field: _Field, hay: _Haystack, budget: _Budget, cutoff: float) -> list[dict] | None:
    assert field.canon is not None, "a fuzzy field has its canonical text"
    folded = hay.folded(budget)
    if folded is None:
        return None
    needle, best = field.canon, None
    for seg, pieces in zip(hay.segments, folded):
        for piece in pieces:
            text = piece.text
            if len(text) < len(needle):
                continue
            if budget.fuzzy < len(text):
                return None if best is None else [best[1]]
            budget.fuzzy -= len(text)
            aligned = fuzz.partial_ratio_alignment(needle, text, score_cutoff=cutoff * 100)
            if aligned is None or aligned.dest_end <= aligned.dest_start:
                continue
            for lo, hi in _spans_to_try(text, aligned.dest_start, aligned.dest_end):
                if not field.edges_ok(text[max(0, lo - _CONTEXT):lo], text[hi:hi + _CONTEXT]):
                    continue  # a stretch that cuts a word is not the value (``Ann Lee Jr`` is not ``Ann Lee. r``)
                start, end = piece.byte_span(lo, hi)
                span = seg.data[start - seg.start:end - seg.start].decode("utf-8", "replace")
                score = fuzz.ratio(needle, canonical(span)) / 100
                if score >= cutoff and (best is None or score > best[0]):
                    best = (score, _source(seg.place, start, end, FUZZY, score))
    return [] if best is None else [best[1]]


def _spans_to_try(text: str, start: int, end: int) -> list[tuple[int, int]]:
    """The aligned stretch, and the same widened to the edges of the words it cuts (an alignment as long as the
    value may cut a letter off the value's first or last word)."""
    lo, hi = start, end
    while lo > 0 and lo > start - 16 and _is_word(text[lo - 1]):
        lo -= 1
    while hi < len(text) and hi < end + 16 and _is_word(text[hi]):
        hi += 1
    return list(dict.fromkeys(((start, end), (lo, end), (start, hi), (lo, hi))))


def _locate_one(value: Any, hay: _Haystack, budget: _Budget, bounds: Bounds) -> list[dict] | None:
    """One value's sources, ``[]`` (found nowhere), or None (the bounds stopped the search)."""
    field = _Field(value, bounds)
    if len(field.exact) > bounds.max_exact_bytes:
        return None
    exact = _exact(field, hay, budget, bounds)
    if exact is None:
        return None
    edged, inside = exact
    if edged:
        return edged
    if field.pattern is not None:
        found = _normalised(field, hay, budget, bounds)
        if found is None:
            return None
        if found:
            return found
    if inside:
        return inside
    if field.fuzzy:
        return _fuzzy(field, hay, budget, bounds.fuzzy_cutoff)
    return []


def claims(value: Any) -> bool:
    """Whether a field's value is a claim a window can ground: not null and not empty (or blank) text."""
    if value is None:
        return False
    return not (isinstance(value, str) and not value.strip())


def locate(result: Any, segments: Sequence[Segment], *, first: Iterable[str] = (),
           bounds: Bounds = DEFAULT_BOUNDS) -> dict[str, list[dict]]:
    """Each field of ``result`` with its sources in ``segments`` (see the module doc), in document order;
    ``first``: paths (or their prefixes) searched before the others, so the bounds reach them."""
    fields = [(path, value) for path, value in result_fields(result, limit=bounds.max_fields) if claims(value)]
    wanted = [p for p in first]
    order = sorted(range(len(fields)), key=lambda i: not any(_under(fields[i][0], w) for w in wanted))
    hay = _Haystack(segments)
    budget = _Budget(bounds.exact_budget_bytes, bounds.normalised_budget_chars, bounds.fuzzy_budget_chars)
    found: dict[int, list[dict]] = {}
    size = 2  # {}
    for i in order:
        try:
            sources = _locate_one(fields[i][1], hay, budget, bounds)
        except (UnicodeError, RecursionError, ValueError):
            sources = None
        if sources is not None:
            size += len(abi.dumps({fields[i][0]: sources}).encode("utf-8")) - 1  # the entry and its comma
            if size > bounds.max_sources_bytes:
                break
            found[i] = sources
    return {fields[i][0]: found[i] for i in sorted(found)}


def _under(path: str, named: str) -> bool:
    """Whether field ``path`` is ``named`` or a leaf under it."""
    return path == named or (path.startswith(named + ".") if named else True)


# --- a required field ---------------------------------------------------------------------------------

def require_grounded(result: Any, sources: dict[str, list[dict]], required: Sequence[str]) -> None:
    """``JobFailure`` (``ungrounded``) naming the first of ``required`` -- a field, or an object or array whose
    every field is meant -- that is not in ``result``, holds no value, or was found in no window."""
    for name in required:
        shown = clip(name, 200)
        value = value_at(result, name)
        if value is MISSING:
            raise JobFailure(codes.UNGROUNDED, f"the result has no field `{shown}`, which must be found in what the "
                                               f"job read (require_grounded)")
        leaves = [(p, v) for p, v in result_fields(value)]
        if not leaves:
            raise JobFailure(codes.UNGROUNDED, f"field `{shown}` of the result holds no value, so nothing of it can "
                                               f"be found in what the job read (require_grounded)")
        for rel, leaf in leaves:
            path = name if rel == "" else (f"{name}.{rel}" if name else rel)
            what = f"field `{clip(path, 200)}`"
            if not claims(leaf):
                raise JobFailure(codes.UNGROUNDED, f"{what} of the result is {abi.dumps(leaf)}: there is nothing "
                                                   f"to find in what the job read (require_grounded)")
            found = sources.get(path)
            shown_value = clip(abi.dumps(leaf), 80)
            if found is None:
                raise JobFailure(codes.UNGROUNDED, f"{what} = {shown_value} could not be looked for within the "
                                                   f"locator's bounds (require_grounded)")
            if not found:
                raise JobFailure(codes.UNGROUNDED, f"{what} = {shown_value} was found in no window the job read "
                                                   f"(require_grounded; a value rephrased or computed is not "
                                                   f"found either)")


def ground(result: Any, windows: ReadWindows, required: Sequence[str] = (), *,
           bounds: Bounds = DEFAULT_BOUNDS) -> dict[str, list[dict]] | None:
    """A completed job's sources (``locate`` over ``windows``), once every field of ``required`` is found
    (``require_grounded``: else its ``JobFailure``). A bug in locating leaves the job's sources out (None) and
    goes to the log, unless fields are required: then it is the job's failure."""
    try:
        sources = locate(result, windows.segments(), first=required, bounds=bounds)
    except Exception:  # noqa: BLE001 - a locator bug must not take a completed job's result away
        if required:
            raise
        log.exception("tensorjob: could not locate the result's fields")
        return None
    require_grounded(result, sources, required)
    return sources


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
    "EXACT", "NORMALISED", "FUZZY", "MATCHES", "MID_WORD_SCORE", "Bounds", "DEFAULT_BOUNDS", "Folded", "canonical",
    "iso_date", "date_pattern", "claims", "locate", "require_grounded", "ground", "source_label", "sources_label"
]

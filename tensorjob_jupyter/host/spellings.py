"""Spellings: how one value may be written in a document, and text folded so that they compare equal.

The locator (``grounding.py``) asks two things of a text: its folded form (NFKC, case-folded, a character and
its combining marks at a time) with the way back from each folded character to the original's bytes
(``Folded``), and, for a value, the regular expression of its spellings -- digit groups, decimal spellings of a
number, the usual spellings of a day (``date_pattern``) -- and whether a span is one of them. Kept apart from the
search so that each can be read (and its table of spellings grown) alone.
"""

from __future__ import annotations

import datetime
import functools
import re
import unicodedata
from decimal import Decimal, InvalidOperation
from typing import Iterator

import numpy as np

# --- folding: a text compared as NFKC, case-folded, with the way back to its bytes -----------------------

#: Characters folded as one piece at most, about: a piece ends before an ASCII character (which composes with
#: nothing before it), or, in text with none, before a character that starts a new one (``MAX_CHUNK``).
CHUNK = 4096
MAX_CHUNK = 2 * CHUNK
_ASCII_CHAR = re.compile(r"[\x00-\x7f]")


def _utf8_offsets(text: str) -> np.ndarray:
    """The byte offset of each character of ``text`` in its UTF-8, and its length at the end (``n + 1``)."""
    points = np.frombuffer(text.encode("utf-32-le"), dtype="<u4")
    sizes = 1 + (points >= 0x80).astype(np.int64) + (points >= 0x800) + (points >= 0x10000)
    out = np.zeros(len(points) + 1, dtype=np.int64)
    np.cumsum(sizes, out=out[1:])
    return out


@functools.lru_cache(maxsize=4096)
def _fold_short(unit: str) -> str:
    return unicodedata.normalize("NFKC", unit).casefold()


def _fold_unit(unit: str) -> str:
    """A character and its combining marks, folded (cached when short: a run of thousands of marks is one
    unit, which a cache must not keep)."""
    return _fold_short(unit) if len(unit) <= 4 else unicodedata.normalize("NFKC", unit).casefold()


def _starts_anew(ch: str) -> bool:
    """Whether ``ch`` composes with nothing before it: not a combining mark, not a Hangul jamo."""
    point = ord(ch)
    return not unicodedata.combining(ch) and not (0x1100 <= point <= 0x11FF or 0x3130 <= point <= 0x318F
                                                  or 0xA960 <= point <= 0xA97F or 0xD7B0 <= point <= 0xD7FF)


def chunks(text: str) -> Iterator[str]:
    """``text`` in consecutive pieces of about ``CHUNK`` characters, each cut where folding may cut it."""
    i, n = 0, len(text)
    while i < n:
        j = i + CHUNK
        if j < n:
            m = _ASCII_CHAR.search(text, j, i + MAX_CHUNK)
            if m is not None:
                j = m.start()
            else:
                j = min(n, i + MAX_CHUNK)
                while j < n and j < i + MAX_CHUNK + 64 and not _starts_anew(text[j]):
                    j += 1
        yield text[i:j]
        i = j


class Folded:
    """``text`` folded for comparison (``.text``: NFKC, case-folded, a character and its combining marks at a
    time), with each folded character's bytes in the original (``byte_span``); ``base`` is where the original
    starts. Meant for a chunk at a time: it holds two offsets a folded character."""

    __slots__ = ("text", "_starts", "_ends")
    text: str
    _starts: np.ndarray
    _ends: np.ndarray

    def __init__(self, text: str, base: int = 0):
        if text.isascii():
            self.text = text.lower()
            self._starts = np.arange(base, base + len(text), dtype=np.int64)
            self._ends = self._starts + 1
            return
        folded = text.casefold()
        if len(folded) == len(text) and unicodedata.is_normalized("NFKC", text):
            offsets = _utf8_offsets(text) + base
            self.text, self._starts, self._ends = folded, offsets[:-1], offsets[1:]
            return
        parts: list[str] = []
        starts: list[int] = []
        ends: list[int] = []
        at = base
        for unit in _units(text):
            nbytes = len(unit.encode("utf-8"))
            piece = unit.lower() if unit.isascii() else _fold_unit(unit)
            parts.append(piece)
            starts.extend([at] * len(piece))
            ends.extend([at + nbytes] * len(piece))
            at += nbytes
        self.text = "".join(parts)
        self._starts = np.array(starts, dtype=np.int64)
        self._ends = np.array(ends, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.text)

    def byte_span(self, start: int, end: int) -> tuple[int, int]:
        """The bytes (offsets in the original's place) that folded characters ``start`` to ``end`` came from."""
        return int(self._starts[start]), int(self._ends[end - 1])

    def joined(self, after: "Folded", keep: int) -> "Folded":
        """The last ``keep`` folded characters of this text followed by ``after`` (a match may cross a cut)."""
        out = Folded.__new__(Folded)
        cut = max(0, len(self.text) - keep)
        out.text = self.text[cut:] + after.text
        out._starts = np.concatenate((self._starts[cut:], after._starts))
        out._ends = np.concatenate((self._ends[cut:], after._ends))
        return out


def _units(text: str) -> list[str]:
    """``text`` as characters, each with the combining marks after it."""
    units: list[str] = []
    combining = unicodedata.combining
    for ch in text:
        if units and combining(ch):
            units[-1] += ch
        else:
            units.append(ch)
    return units


_SPACES = re.compile(r"\s+")
#: A digit-group separator, once folded (NFKC makes no-break and thin spaces plain spaces).
GROUP_CHARS = ",'\u2019_ "
_GROUP_SEPARATOR = re.compile(r"(?<=\d)[,'\u2019_ ](?=\d{3}(?!\d))")


def canonical(text: str) -> str:
    """``text`` as the normalised match compares it: folded, whitespace runs one space, digit groups joined."""
    return _GROUP_SEPARATOR.sub("", _SPACES.sub(" ", Folded(text).text)).strip()


#: The longest integer part given digit groups in its spellings.
MAX_GROUPED_DIGITS = 36


def _digits_pattern(digits: str, integer: bool, separator: str = "[,'\u2019_ ]?") -> str:
    """A run of digits, with an optional group ``separator`` every three from the right when it is a number's
    integer part of at most ``MAX_GROUPED_DIGITS`` (no one groups a longer one, and each group costs the
    expression's compilation a character class)."""
    if not integer or len(digits) <= 3 or len(digits) > MAX_GROUPED_DIGITS:
        return digits
    head = len(digits) % 3 or 3
    groups = [digits[:head]] + [digits[i:i + 3] for i in range(head, len(digits), 3)]
    return separator.join(groups)


_DIGIT_RUN = re.compile(r"\d+")


def text_pattern(canon: str) -> str:
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

#: Digit-group separators, once folded, where a decimal point is ``.`` (``1,234.56``, ``1'234.56``, ``1 234.56``)
#: and where it is ``,`` (``1.234,56``, ``1 234,56``; NFKC makes no-break and thin spaces plain spaces).
_POINT_GROUPS, _COMMA_GROUPS = "[,'\u2019_ ]?", "[.'\u2019 ]?"
_POINT_GROUP = re.compile(r"(?<=\d)[,'\u2019_ ](?=\d{3}(?!\d))")
_COMMA_GROUP = re.compile(r"(?<=\d)[.'\u2019 ](?=\d{3}(?!\d))")
#: A number that reads as two: one ``.`` or ``,`` and three digits after it (``1.234``: 1234 with the decimal
#: comma, 1.234 with the point; ``1,234`` the other way round).
_TWO_READINGS = re.compile(r"[-\u2212(]?[1-9]\d{0,2}[.,]\d{3}\)?")  # 0.125 is not a group of 125


def _decimal(value: int | float) -> Decimal | None:
    try:
        number = Decimal(str(value)) if isinstance(value, int) else Decimal(repr(value))
    except InvalidOperation:
        return None
    return number if number.is_finite() and abs(number.adjusted()) <= 400 else None


def number_pattern(value: int | float) -> str | None:
    """Every decimal spelling of ``value``, on folded text: digit groups by ``,`` ``.`` ``'`` or a space, a decimal
    point or a decimal comma, trailing zeros, a minus sign or accounting parentheses."""
    number = _decimal(value)
    if number is None:
        return None
    text = format(number, "f")
    negative = text.startswith("-")
    whole, _, fraction = text.lstrip("-").partition(".")
    fraction = fraction.rstrip("0")
    # a whole number's zeros after either mark (``3 450,00`` and ``3,450.00``: the first alternative that matches
    # is the one found, so each takes both), a fraction after its own
    point = _digits_pattern(whole, True, _POINT_GROUPS) + (
        (r"\." + fraction + "0*") if fraction else r"(?:[.,]0+)?")
    comma = _digits_pattern(whole, True, _COMMA_GROUPS) + ((r"," + fraction + "0*") if fraction else r"(?:[.,]0+)?")
    body = f"(?:{point}|{comma})"
    return rf"(?:[-\u2212]{body}|\({body}\))" if negative else body


_LEADING_ZERO_GROUP = re.compile(r"[-\u2212(]?0\D")


def _read(span: str, groups: re.Pattern, point: str) -> Decimal | None:
    """``span`` read as a number whose digit groups ``groups`` finds and whose decimal mark is ``point``; None
    when it is none (a group after a leading 0: ``0.125`` is never 125)."""
    stripped = groups.sub("", span)
    if stripped != span and _LEADING_ZERO_GROUP.match(span) and not _LEADING_ZERO_GROUP.match(stripped):
        return None
    text = stripped.replace("\u2212", "-")
    if text.startswith("(") and text.endswith(")"):
        text = "-" + text[1:-1]
    try:
        return Decimal(text.replace(point, ".") if point != "." else text)
    except InvalidOperation:
        return None


def number_reading(value: int | float, text: str) -> str | None:
    """How ``text`` spells ``value``: ``"one"`` (it reads as ``value`` and nothing else), ``"two"`` (as ``value``
    with one decimal mark and as another number with the other: ``1.234`` for 1234), or None (not ``value``)."""
    expected = _decimal(value)
    span = Folded(text).text.strip()
    if expected is None:
        return None
    readings = [_read(span, _POINT_GROUP, "."), _read(span, _COMMA_GROUP, ",")]
    if expected not in readings:
        return None
    if readings[0] == expected:  # the decimal point: ``1,234`` is 1234, as it has always been read here
        return "two" if "." in span and _TWO_READINGS.fullmatch(span) and readings[1] is not None else "one"
    return "two" if _TWO_READINGS.fullmatch(span) and readings[0] is not None else "one"


def number_matches(value: int | float, text: str) -> bool:
    """Whether ``text`` is a spelling of ``value`` (``number_pattern``)."""
    return number_reading(value, text) is not None


_ISO_DATE = re.compile(r"(\d{4})-(\d{2})-(\d{2})")
#: Each month's names and abbreviations, folded, in English, German, French, Spanish and Italian (docs/maps.md's
#: table of spellings; a name shared by two languages is listed once).
_MONTHS: tuple[tuple[str, ...], ...] = (
    ("january", "jan", "januar", "jänner", "janvier", "janv", "enero", "ene", "gennaio", "gen"),
    ("february", "feb", "februar", "février", "févr", "fevrier", "fevr", "febrero", "febbraio"),
    ("march", "mar", "märz", "maerz", "mär", "mars", "marzo"),
    ("april", "apr", "avril", "avr", "abril", "abr", "aprile"),
    ("may", "mai", "mayo", "maggio", "mag"),
    ("june", "jun", "juni", "juin", "junio", "giugno", "giu"),
    ("july", "jul", "juli", "juillet", "juil", "julio", "luglio", "lug"),
    ("august", "aug", "août", "aout", "agosto", "ago"),
    ("september", "sep", "sept", "septembre", "septiembre", "setiembre", "settembre", "set"),
    ("october", "oct", "oktober", "okt", "octobre", "octubre", "ottobre", "ott"),
    ("november", "nov", "novembre", "noviembre"),
    ("december", "dec", "dezember", "dez", "décembre", "déc", "decembre", "diciembre", "dic", "dicembre"),
)


def iso_date(value: str) -> datetime.date | None:
    """The day an ISO date string (``YYYY-MM-DD``, nothing more) names, or None."""
    m = _ISO_DATE.fullmatch(value.strip())
    if m is None:
        return None
    try:
        return datetime.date(int(m[1]), int(m[2]), int(m[3]))
    except ValueError:
        return None


@functools.lru_cache(maxsize=1024)
def date_pattern(day: datetime.date) -> str:
    """The usual spellings of ``day``, on folded (lower-case) text: the month by name (``May 12, 2024``, ``12th
    of May 2024``, ``12. Mai 2024``, ``1er mai 2024``, ``12 de mayo de 2024``, ``12 maggio 2024``) or by number,
    the year first (``2024-05-12``), the day first (``12.05.2024``, ``12/05/2024``) or the month first
    (``05/12/2024``)."""
    names = sorted(_MONTHS[day.month - 1], key=len, reverse=True)
    name = "(?:" + "|".join(re.escape(n) for n in names) + r")\.?"
    d = f"0?{day.day}" if day.day < 10 else str(day.day)
    m = f"0?{day.month}" if day.month < 10 else str(day.month)
    ordinal = d + "(?:st|nd|rd|th|er|o|°)?\\.?"
    y = str(day.year)
    return "|".join((rf"{name}\s+{ordinal},?\s+{y}",
                     rf"{ordinal}\s+(?:of\s+|de\s+)?{name},?\s+(?:de\s+|del\s+)?{y}",
                     rf"{y}[-/.]{m}[-/.]{d}", rf"{d}[./-]{m}[./-]{y}", rf"{m}[/-]{d}[/-]{y}"))


_NUMERIC_DATE = re.compile(r"(\d{1,2})[/-](\d{1,2})[/-]\d{4}")


def ambiguous_date(span: str) -> bool:
    """Whether ``span`` is a numeric date that reads as two days: ``05/03/2024`` or ``05-03-2024`` is 5 March
    where the day comes first and May 3 where the month does. Dots (``05.03.2024``) are read day first, as where
    they are written."""
    m = _NUMERIC_DATE.fullmatch(span.strip())
    return m is not None and int(m[1]) <= 12 and int(m[2]) <= 12 and m[1].lstrip("0") != m[2].lstrip("0")


__all__ = ["CHUNK", "MAX_CHUNK", "GROUP_CHARS", "Folded", "chunks", "canonical", "text_pattern", "number_pattern",
           "number_matches", "iso_date", "date_pattern", "ambiguous_date"]

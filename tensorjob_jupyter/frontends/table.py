"""A map's items as a table for a terminal, or as CSV: what ``tensorjob map`` prints at the end.

``map_table(rows)`` keeps what a person scans for, with every cell made inert and the columns sharing the
terminal's width, so a guest's result can neither move the cursor nor push the table off the screen.
``rows_csv(rows)`` is every column of every row for a spreadsheet, with cells a spreadsheet would run as a
formula quoted.

Design: docs/internals/frontends.md#tablepy
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import textwrap
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Sequence, TextIO

from tensorjob_jupyter.text import for_terminal

#: Items a terminal table shows before it says how many more there are.
MAX_ROWS = 30
#: The widest a result column may be, and the narrowest it is squeezed to; the key's widest; the lines a cell
#: wraps onto at most.
MAX_CELL = 40
MIN_CELL = 8
MAX_KEY_CELL = 60
WRAP_LINES = 3
#: How narrow a key or result column gets before result columns are left out instead.
READABLE_CELL = 20
_FORMULA = ("=", "+", "-", "@", "\t", "\r")


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        text = value
    else:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
    return _one_line(text)


def _one_line(text: str) -> str:
    return for_terminal(text, one_line=True).replace("\t", " ")


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[:max(0, width - 1)] + "…"


def _wrap(text: str, width: int) -> list[str]:
    """``text`` in lines of ``width`` characters (broken at spaces and ``/`` where it can), at most
    ``WRAP_LINES`` of them, the last clipped with ``…``."""
    lines: list[str] = []
    rest = text
    while rest and len(lines) < WRAP_LINES:
        if len(rest) <= width:
            lines.append(rest)
            rest = ""
            break
        cut = max(rest.rfind(" ", 1, width + 1), rest.rfind("/", 1, width) + 1)
        cut = cut if cut > width // 2 else width
        lines.append(rest[:cut].rstrip(" "))
        rest = rest[cut:].lstrip(" ")
    if rest:
        lines[-1] = _clip(lines[-1] + " " + rest, width)
    return lines or [""]


def map_table(rows: Sequence[dict], *, width: int = 120, max_rows: int = MAX_ROWS, more: str = "") -> str:
    """``rows`` (``MapResult.rows()``) as a fixed-width table at most ``width`` characters wide: item, key,
    status (``failed: CODE``), then each ``result.*`` column. A cell wider than its column wraps (up to
    ``WRAP_LINES`` lines); columns are squeezed to ``READABLE_CELL``, then the last result columns are left
out (and named), then what is left is squeezed to ``MIN_CELL``. Past
    ``max_rows`` items a line says how many more there are; ``more`` says where to see every row."""
    return "\n".join(map_table_lines(lambda: rows, width=width, max_rows=max_rows, more=more, count=len(rows)))


def _cells(row: dict, results: list[str]) -> list[str]:
    status = row["status"] if row["status"] != "failed" else f"failed: {row.get('error_code') or '?'}"
    if row.get("answered_by"):  # a cascade's: which model's answer this is (proxy, oracle, both-sampled)
        status += f" ({row['answered_by']})"
    return [_cell(row["item"]), _cell(row.get("key")), _cell(status)] + [_cell(row.get(k)) for k in results]


@dataclass(frozen=True)
class Layout:
    """What a table shows of its rows: ``columns(first_row)`` gives the headers and a function of a row giving
    its cells; the first ``fixed`` columns are never left out, column ``whole`` is never squeezed."""

    columns: Callable[[dict], tuple[list[str], Callable[[dict], list[str]]]]
    fixed: int = 3
    whole: int = 2


def _map_columns(first: dict) -> tuple[list[str], Callable[[dict], list[str]]]:
    results = [k for k in first if k == "result" or k.startswith("result.")]
    headers = ["item", "key", "status"] + [_one_line(k[len("result."):] if k != "result" else k) for k in results]
    return headers, lambda row: _cells(row, results)


#: A map's items: item, key, status, then each result field.
MAP_LAYOUT = Layout(_map_columns)
#: The review's columns (``MapResult.review()``): where the value is, why it is doubted, what it is, where found.
REVIEW_COLUMNS = ("item", "field", "reason", "found", "confidence", "value", "key", "decision", "final", "label",
                  "context", "source")


def _review_columns(first: dict) -> tuple[list[str], Callable[[dict], list[str]]]:
    def cells(row: dict) -> list[str]:
        out = [_cell(row.get(name)) for name in REVIEW_COLUMNS]
        confidence = row.get("confidence")
        out[4] = f"{confidence:.3f}" if isinstance(confidence, float) else out[4]
        return out
    return list(REVIEW_COLUMNS), cells


#: A map's values doubtful first: every reason column in every form of the table.
REVIEW_LAYOUT = Layout(_review_columns, fixed=5, whole=2)


def map_table_lines(rows: Callable[[], Iterable[dict]], *, width: int = 120, max_rows: int | None = MAX_ROWS,
                    more: str = "", count: int | None = None, layout: Layout = MAP_LAYOUT,
                    what: str = "items") -> Iterator[str]:
    """``map_table``'s lines, one at a time, from ``rows()`` called twice -- once for the columns' widths, once
    for the lines -- so a table of every item of a large map (``max_rows`` None) is never held whole.
    ``count``: how many rows there are in all, where the caller knows (else they are counted). ``layout``: the
    columns (a map's items, or ``REVIEW_LAYOUT``); ``what``: the rows, as the notes name them."""
    headers: list[str] = []
    natural: list[int] = []
    cells_of: Callable[[dict], list[str]] = lambda row: []
    seen = 0
    for row in rows():
        if not seen:
            headers, cells_of = layout.columns(row)
            natural = [len(h) for h in headers]
        seen += 1
        if max_rows is not None and seen > max_rows:
            if count is not None:
                break
            continue
        natural = [max(w, len(c)) for w, c in zip(natural, cells_of(row))]
    if not seen:
        yield f"(no {what})"
        return
    count = seen if count is None else count
    natural = [natural[0], min(natural[1], MAX_KEY_CELL)] + [min(w, MAX_CELL) for w in natural[2:]]
    whole = layout.whole
    widths = list(natural)
    shown = list(range(len(headers)))

    def total() -> int:
        return sum(widths[c] for c in shown) + 2 * (len(shown) - 1)

    def squeeze(floor: Callable[[int], int]) -> None:
        while total() > width:  # the widest column first, none below its floor
            room = [c for c in shown[1:] if widths[c] > floor(c)]
            if not room:
                return
            widths[max(room, key=lambda c: widths[c])] -= 1

    squeeze(lambda c: natural[c] if c == whole else min(natural[c], READABLE_CELL))  # the status whole, others readable
    while total() > width and len(shown) > layout.fixed + 1:  # then leave result columns out, the last first
        shown.pop()
        squeeze(lambda c: natural[c] if c == whole else min(natural[c], READABLE_CELL))
    squeeze(lambda c: min(natural[c], MIN_CELL))
    yield "  ".join(_clip(headers[c], widths[c]).ljust(widths[c]) for c in shown).rstrip()
    for row in itertools.islice(rows(), max_rows):
        r = cells_of(row)
        cells = [_wrap(r[c], widths[c]) for c in shown]
        for k in range(max(len(cell) for cell in cells)):
            yield "  ".join((cell[k] if k < len(cell) else "").ljust(widths[c])
                            for c, cell in zip(shown, cells)).rstrip()
    where = f": {more} lists every one" if more else ""
    notes = []
    if len(shown) < len(headers):
        left = [headers[c] for c in range(len(headers)) if c not in shown]
        notes.append(f"… {len(left)} more columns ({', '.join(left)}) do not fit {width} characters{where}")
    if max_rows is not None and count > max_rows:
        notes.append(f"… {count - max_rows} more {what}{where}")
    for note in notes:  # prose: wrapped at spaces to the width
        yield from textwrap.wrap(note, max(width, MIN_CELL), break_on_hyphens=False)


def _csv_value(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float)):
        return "" if value is None else json.dumps(value)
    if not isinstance(value, str):
        value = json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
    value = for_terminal(value)
    return "'" + value if value.startswith(_FORMULA) else value


def rows_csv(rows: Sequence[dict]) -> str:
    """Every column of ``rows`` as CSV (a header line, then a line per item)."""
    out = io.StringIO()
    write_csv(rows, out)
    return out.getvalue()


def write_csv(rows: Iterable[dict], out: TextIO) -> None:
    """``rows_csv`` written to ``out`` a row at a time (nothing for no rows)."""
    writer = csv.writer(out, lineterminator="\r\n")  # RFC 4180; a cell holding either break is quoted
    columns: list[str] | None = None
    for row in rows:
        if columns is None:
            columns = list(row)
            writer.writerow([_csv_value(c) for c in columns])
        writer.writerow([_csv_value(row.get(c)) for c in columns])


def review_table(rows: Sequence[dict], *, width: int = 120, max_rows: int = MAX_ROWS, more: str = "") -> str:
    """A map's values doubtful first (``MapResult.review()``) as a fixed-width table, its reasons shown."""
    return "\n".join(map_table_lines(lambda: rows, width=width, max_rows=max_rows, more=more, count=len(rows),
                                     layout=REVIEW_LAYOUT, what="values"))


class ReviewRows(list):
    """A map's values doubtful first (``MapResult.review()``), as ``%tensorjob review`` gives them: a list of
    rows that shows as the table ``tensorjob runs --table --review`` prints."""

    def __repr__(self) -> str:
        return review_table(self, max_rows=MAX_ROWS) if self else "(no completed items to review)"

    def _repr_pretty_(self, p, cycle: bool) -> None:
        p.text(repr(self))


__all__ = ["MAX_ROWS", "MAX_CELL", "MIN_CELL", "MAX_KEY_CELL", "WRAP_LINES", "READABLE_CELL", "map_table",
           "map_table_lines", "Layout", "MAP_LAYOUT", "REVIEW_COLUMNS", "REVIEW_LAYOUT", "review_table", "rows_csv",
           "write_csv", "ReviewRows"]

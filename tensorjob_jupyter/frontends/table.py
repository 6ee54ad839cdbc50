"""A map's items as a table for a terminal, or as CSV: what ``tensorjob map`` prints at the end.

``map_table(rows)`` takes ``MapResult.rows()`` and keeps what a person scans
for -- the item, its key, its status (with the error code of a failed item)
and the result's fields; the input's own fields are summed up by the key.
Every cell is made inert (``text.for_terminal``, one line) and clipped, and
the columns share the terminal's width (a key is clipped at its start, where
a path's or a URL's name is not), so a guest's result can neither
move the cursor nor push the table off the screen; past ``max_rows`` items
the table says how many more there are and where to see them.

``rows_csv(rows)`` is every column of every row, for a spreadsheet: values
that are not text or numbers are written as JSON, terminal controls are
removed (it may be printed to one; the exact values are in the results
files), and a text cell a spreadsheet would run as a formula (``=``, ``+``,
``-``, ``@``) is quoted with a leading ``'``.
"""

from __future__ import annotations

import csv
import io
import json
from typing import Any, Sequence

from tensorjob_jupyter.text import for_terminal

#: Items a terminal table shows before it says how many more there are.
MAX_ROWS = 30
#: The widest a result column may be, and the narrowest it is squeezed to.
MAX_CELL = 40
MIN_CELL = 8
_FIXED = ("item", "key", "status")
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


def _clip(text: str, width: int, *, keep_end: bool = False) -> str:
    if len(text) <= width:
        return text
    return "…" + text[len(text) - width + 1:] if keep_end and width > 1 else text[:max(0, width - 1)] + "…"


def map_table(rows: Sequence[dict], *, width: int = 120, max_rows: int = MAX_ROWS, more: str = "") -> str:
    """``rows`` (``MapResult.rows()``) as a fixed-width table at most ``width`` characters wide: item, key,
    status (``failed: CODE``), then each ``result.*`` column; ``more`` ends the note on rows left out."""
    if not rows:
        return "(no items)"
    results = [k for k in rows[0] if k == "result" or k.startswith("result.")]
    headers = ["item", "key", "status"] + [_one_line(k[len("result."):] if k != "result" else k) for k in results]
    table = []
    for row in rows[:max_rows]:
        status = row["status"] if row["status"] != "failed" else f"failed: {row.get('error_code') or '?'}"
        table.append([_cell(row["item"]), _cell(row.get("key")), _cell(status)] + [_cell(row.get(k)) for k in results])
    widths = [max(len(headers[c]), *(len(r[c]) for r in table)) for c in range(len(headers))]
    widths = [min(w, MAX_CELL) for w in widths]
    while sum(widths) + 2 * (len(widths) - 1) > width:  # squeeze the widest column first
        widest = max(range(len(widths)), key=lambda c: widths[c])
        if widths[widest] <= MIN_CELL:
            break
        widths[widest] -= 1
    lines = ["  ".join(_clip(h, w).ljust(w) for h, w in zip(headers, widths)).rstrip()]
    for r in table:  # a key keeps its end: a path's or a URL's name is there
        lines.append("  ".join(_clip(cell, w, keep_end=c == 1).ljust(w)
                               for c, (cell, w) in enumerate(zip(r, widths))).rstrip())
    if len(rows) > max_rows:
        lines.append(f"… {len(rows) - max_rows} more items" + (f" ({more})" if more else ""))
    return "\n".join(lines)


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
    if not rows:
        return ""
    writer = csv.writer(out, lineterminator="\r\n")  # RFC 4180; a cell holding either break is quoted
    columns = list(rows[0])
    writer.writerow([_csv_value(c) for c in columns])
    for row in rows:
        writer.writerow([_csv_value(row.get(c)) for c in columns])
    return out.getvalue()


class ReviewRows(list):
    """A map's items doubtful first (``MapResult.review()``), as ``%tensorjob review`` gives them: a list of
    rows that shows as the table ``tensorjob runs --table --review`` prints."""

    def __repr__(self) -> str:
        return map_table(self, max_rows=MAX_ROWS) if self else "(no completed items to review)"

    def _repr_pretty_(self, p, cycle: bool) -> None:
        p.text(repr(self))


__all__ = ["MAX_ROWS", "MAX_CELL", "MIN_CELL", "map_table", "rows_csv", "ReviewRows"]

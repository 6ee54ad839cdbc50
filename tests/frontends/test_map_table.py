"""A map's items as a table: what ``tensorjob map`` prints at the end, ``tensorjob runs --table`` and ``--csv``.

The commands run as a user runs them, in a subprocess, over a real map; the
table's own promises (every cell inert, the table inside the width, whatever
a guest returned) are a Hypothesis property on ``frontends/table.py``.
"""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorjob_jupyter.frontends.table import map_table, rows_csv

HOSTILE = "\x1b[2J\x1b]0;owned\x07Lost"
FORMULA = '=HYPERLINK("http://evil")'


def tensorjob(*args, cwd, timeout=120):
    return subprocess.run([sys.executable, "-m", "tensorjob_jupyter.frontends.cli", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow  # a CLI in a subprocess, or a long search: in the full suite, not the fast loop
def test_tensorjob_map_ends_with_a_table_and_runs_table_gives_it_again_and_as_csv(tmp_path):
    guest = tmp_path / "guest.py"
    guest.write_text("import tensorjob as tj\n\ndef main(input):\n    if 'missing' in input:\n"
                     "        tj.fail('not_found', input['missing'])\n    return input['answer']\n")
    items = [{"path": f"docs/{name}.txt", "answer": {"title": name.title(), "n": i}}
             for i, name in enumerate(["bridge", "lighthouse", "orchard"])]
    items.append({"path": "docs/bad.txt", "missing": "gone"})
    items.append({"path": "docs/hostile.txt", "answer": {"title": HOSTILE, "n": FORMULA}})
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps(item) + "\n" for item in items), encoding="utf-8")

    proc = tensorjob("map", guest, "--over", manifest, "--run-dir", "run", "-q", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr  # one item failed
    table = proc.stdout.split("\n\n")[0].splitlines()
    assert table[0].split() == ["item", "key", "status", "title", "n"]
    assert table[1].split() == ["0", "docs/bridge.txt", "completed", "Bridge", "0"]
    assert table[4].split()[:4] == ["3", "docs/bad.txt", "failed:", "not_found"]
    assert "\x1b" not in proc.stdout and "\x07" not in proc.stdout
    assert "5 items: 4 completed, 1 failed" in proc.stdout

    again = tensorjob("runs", "--table", "run", cwd=tmp_path)
    assert again.returncode == 0 and again.stdout.splitlines()[:5] == table[:5]
    as_csv = tensorjob("runs", "--table", "run", "--csv", cwd=tmp_path)
    rows = list(csv.DictReader(io.StringIO(as_csv.stdout)))
    assert [r["key"] for r in rows] == [item["path"] for item in items]
    assert [r["status"] for r in rows] == ["completed"] * 3 + ["failed", "completed"]
    assert rows[1]["result.title"] == "Lighthouse" and rows[3]["error_code"] == "not_found"
    assert rows[4]["result.title"] == "Lost" and rows[4]["result.n"] == "'" + FORMULA  # text, not a formula
    assert "\x1b" not in as_csv.stdout and "\x07" not in as_csv.stdout
    not_a_map = tensorjob("runs", "--table", ".", cwd=tmp_path)
    assert not_a_map.returncode == 2 and not_a_map.stderr.count("\n") == 1 and "no ledger.json" in not_a_map.stderr
    assert tensorjob("runs", "--csv", cwd=tmp_path).returncode == 2  # --csv needs --table


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                                         max_size=3), max_leaves=8)


@pytest.mark.slow  # a CLI in a subprocess, or a long search: in the full suite, not the fast loop
@settings(max_examples=150, deadline=None)
@given(results=st.lists(st.dictionaries(st.text(max_size=8), json_values, max_size=4), min_size=1, max_size=6),
       keys=st.lists(st.text(), min_size=6, max_size=6), width=st.integers(40, 200))
def test_a_table_of_any_results_is_inert_and_fits_its_width(results, keys, width):
    columns = sorted({f"result.{k}" for r in results for k in r})
    rows = [{"item": i, "key": keys[i], "status": "completed", "error_code": None, "error_message": None,
             **{c: r.get(c[len("result."):]) for c in columns}} for i, r in enumerate(results)]
    text = map_table(rows, width=width)
    lines = text.splitlines()
    assert len(lines) >= len(rows) + 1 and lines[0].startswith("item")
    for line in lines + rows_csv(rows).replace("\r\n", "").replace("\n", "").replace("\t", "").splitlines():
        assert not any(ord(ch) < 0x20 or 0x7F <= ord(ch) < 0xA0 for ch in line), line
    narrowest = 2 * (len(columns) + 2) + 8 * (len(columns) + 3)  # each column squeezed at most to 8
    assert all(len(line) <= max(width, narrowest) for line in lines)
    parsed = list(csv.reader(io.StringIO(rows_csv(rows), newline="")))
    assert len(parsed) == len(rows) + 1 and all(len(r) == len(parsed[0]) for r in parsed)
    for cells in parsed[1:]:
        assert not any(cell[:1] in ("=", "+", "@", "-") and not _number(cell) for cell in cells)


def _number(cell: str) -> bool:
    try:
        float(cell)
        return True
    except ValueError:
        return False


def test_a_table_wraps_long_keys_and_results_and_names_the_columns_and_rows_it_leaves_out():
    """40 items with long keys and many fields at 80 columns: each key and result is read whole (wrapped, not
    clipped from the left or cut at 13 characters), no line passes the width, and the table says which
    columns and how many rows it left out and where every one is."""
    rows = [{"item": i, "key": f"emails/{i:03d}_api_rate_limit_exceeded_for_customer.txt", "status": "completed",
             "error_code": None, "error_message": None,
             "result.summary": f"the customer hit the API rate limit {i} times this week",
             **{f"result.field_{k}": f"value {k}" for k in range(8)}} for i in range(40)]
    text = map_table(rows, width=80, more="tensorjob runs --table run (--csv for a spreadsheet)")
    lines = text.splitlines()
    assert all(len(line) <= 80 for line in lines), max(lines, key=len)
    assert lines[0].split()[:4] == ["item", "key", "status", "summary"]
    first = [line for line in lines[1:] if line.strip()][:3]
    key_at, status_at = lines[0].index("key"), lines[0].index("status")
    assert "".join(line[key_at:status_at].strip() for line in first) == rows[0]["key"], first
    assert "week" in " ".join(first)  # the summary wrapped whole within the item's lines
    assert "more columns (field_" in " ".join(lines) and "do not fit 80 characters" in " ".join(lines)
    notes = " ".join(lines[next(i for i, line in enumerate(lines) if line.startswith("…")):])
    assert notes.endswith("… 10 more items: tensorjob runs --table run (--csv for a spreadsheet) lists every one")
    rows_text = "".join(line for line in lines[1:] if not line.startswith("…"))
    assert "…" not in rows_text  # nothing of a shown row was clipped

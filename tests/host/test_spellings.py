"""Spellings (host/spellings.py through the locator): every row of docs/maps.md's table of spellings is a case.

The table is the documentation's promise; this test reads it, so a row added there is tested and a spelling the
locator stops knowing fails here. ``\\uXXXX`` in a row stands for the character (a thin space, a minus sign).
"""

import json
import pathlib
import re

import pytest
from hypothesis import given, strategies as st

from tensorjob_jupyter.host.grounding import locate
from tensorjob_jupyter.host.spellings import number_reading
from tensorjob_jupyter.host.windows import Place, Segment

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs" / "maps.md"


def table_rows():
    text = DOCS.read_text(encoding="utf-8")
    table = text.split("<!-- spellings table: value | written as | found as -->", 1)[1].split("\n\n", 1)[0]
    rows = []
    for line in table.strip().splitlines()[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        value = json.loads(re.fullmatch(r"`(.*)`", cells[0])[1]) if not cells[0].startswith("`20") \
            else cells[0].strip("`")
        written = re.sub(r"\\u([0-9a-f]{4})", lambda m: chr(int(m[1], 16)), re.match(r"`(.*)`", cells[1])[1])
        rows.append(pytest.param(value, written, cells[2], id=f"{cells[0]} in {cells[1]}"))
    return rows


ROWS = table_rows()


def test_the_table_has_its_rows():
    assert len(ROWS) >= 30


@pytest.mark.parametrize("value, written, found_as", ROWS)
def test_each_documented_spelling(value, written, found_as):
    sources = locate({"v": value}, [Segment(Place(file="/doc.txt"), 0, written.encode())]).get("v")
    kinds = {s["match"] for s in sources}
    if found_as == "not found":
        assert sources == []
    else:
        assert kinds == {found_as} if found_as == "ambiguous" else found_as in kinds or "exact" in kinds, sources


@given(whole=st.integers(0, 10**12), cents=st.integers(0, 99), style=st.sampled_from(["point", "comma"]),
       group=st.sampled_from(["", " ", "'", "\u2009"]))
def test_a_number_written_in_either_convention_reads_as_itself(whole, cents, style, group):
    digits = f"{whole:,}".replace(",", "\0")
    mark, sep = (".", ",") if style == "point" else (",", ".")
    text = digits.replace("\0", group or sep) + mark + f"{cents:02d}"
    value = float(f"{whole}.{cents:02d}")
    assert number_reading(value, text) is not None, text

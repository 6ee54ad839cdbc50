"""A result key holding a dot is one field, not a nested one, in every table of a map (issue 53, item 6).

``{"total.amount": X}`` and ``{"total": {"amount": Y}}`` are two fields: ``host.fields`` names them
``total\\.amount`` and ``total.amount``, and so do the ``source.``/``grounded.``/``score.`` columns. The
``result.`` and ``expected.`` columns used to join the key unescaped, so ``result.total.amount`` showed the
planted X beside ``grounded.total.amount = True``, which belongs to Y. The ``peek.c`` guest (tests/guests)
reads a document holding Y and returns both; rows(), iter_rows(), to_pandas() and ``tensorjob runs --table``
(terminal, CSV, JSON) must put each value beside its own grounding and verdict.
"""

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

import tensorjob_jupyter as tj
from tensorjob_jupyter.fanout.progress import flattened
from tensorjob_jupyter.fanout.scoring import Scored, json_fields, verdict_paths

GUEST = Path(__file__).resolve().parents[1] / "guests" / "peek.c"
PLANTED, READ = "Invented Value Q", "Harbour Bridge"
ANSWER = {"total.amount": PLANTED, "total": {"amount": READ}}
EXPECTED = {"total.amount": "something else", "total": {"amount": READ}}

DOTTED, NESTED = "total\\.amount", "total.amount"  # the two fields' paths (host.fields)


def cli(*argv, cwd):
    return subprocess.run([sys.executable, "-m", "tensorjob_jupyter.frontends.cli", *map(str, argv)],
                          capture_output=True, text=True, cwd=cwd, timeout=300, stdin=subprocess.DEVNULL)


def test_flattened_columns_spell_keys_as_field_paths():
    assert flattened("result", ANSWER) == {f"result.{DOTTED}": PLANTED, "result.total": {"amount": READ}}
    assert flattened("result", {"a\\b": 1, "": 2}) == {"result.a\\\\b": 1, "result.": 2}
    assert flattened("result", [1]) == {"result": [1]}


def test_json_fields_gives_the_dotted_key_and_the_nested_field_a_verdict_each():
    got = json_fields(ANSWER, EXPECTED)
    assert got == Scored(0.5, {DOTTED: False, NESTED: True})  # was one verdict, "total.amount", for both
    assert verdict_paths("json_fields", EXPECTED) == {DOTTED: DOTTED, NESTED: NESTED}


def check_row(row):
    """One item's row: every value beside its own grounding and verdict, none under the other's name."""
    assert f"result.{NESTED}" not in row and f"expected.{NESTED}" not in row, sorted(row)
    assert row[f"result.{DOTTED}"] == PLANTED and row[f"grounded.{DOTTED}"] is False
    assert row["result.total"] == {"amount": READ} and row[f"grounded.{NESTED}"] is True
    assert row[f"source.{DOTTED}"] == "" and row[f"source.{NESTED}"].startswith("doc.txt:0-")
    assert row[f"expected.{DOTTED}"] == "something else" and row["expected.total"] == {"amount": READ}
    assert row[f"score.{DOTTED}"] is False and row[f"score.{NESTED}"] is True and row["score"] == 0.5


@pytest.mark.slow  # CLIs in a subprocess
def test_a_dotted_key_and_a_nested_field_are_two_columns_in_every_table(tmp_path):
    (tmp_path / "doc.txt").write_text(READ + "\n", encoding="utf-8")
    (tmp_path / "m.jsonl").write_text(json.dumps({"path": "doc.txt", "answer": ANSWER}) + "\n", encoding="utf-8")
    (tmp_path / "e.jsonl").write_text(json.dumps(EXPECTED) + "\n", encoding="utf-8")
    done = cli("map", GUEST, "--over", "m.jsonl", "--read", ".", "--run-dir", "run", "--expected", "e.jsonl",
               "--scorer", "json_fields", "--concurrency", "1", "--quiet", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "mean 0.500 over 1 item" in done.stdout, done.stdout  # was 1.000 or 0.000: one verdict for two fields

    result = tj.MapResult.read(tmp_path / "run")
    [row] = result.rows()
    check_row(row)
    assert list(result.iter_rows()) == [row]

    as_json = cli("runs", "--table", "run", "--json", cwd=tmp_path)
    assert as_json.returncode == 0, as_json.stderr
    [line] = as_json.stdout.splitlines()
    check_row(json.loads(line))

    as_csv = cli("runs", "--table", "run", "--csv", cwd=tmp_path)
    assert as_csv.returncode == 0, as_csv.stderr
    [cells] = list(csv.DictReader(io.StringIO(as_csv.stdout)))
    assert f"result.{NESTED}" not in cells
    assert cells[f"result.{DOTTED}"] == PLANTED and cells[f"grounded.{DOTTED}"] == "false"
    assert cells["result.total"] == json.dumps({"amount": READ}, separators=(",", ":"))
    assert cells[f"grounded.{NESTED}"] == "true"

    table = cli("runs", "--table", "run", cwd=tmp_path)
    assert table.returncode == 0, table.stderr
    header = table.stdout.splitlines()[0].split()
    assert DOTTED in header and "total" in header and NESTED not in header, table.stdout

    pandas = pytest.importorskip("pandas")
    frame = result.to_pandas()
    assert isinstance(frame, pandas.DataFrame)
    assert frame.loc[0, f"result.{DOTTED}"] == PLANTED and not frame.loc[0, f"grounded.{DOTTED}"]
    assert bool(frame.loc[0, f"grounded.{NESTED}"]) and f"result.{NESTED}" not in frame.columns

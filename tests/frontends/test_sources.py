"""Sources from outside: each field of a result located in what its job read, as a user reaches it.

``tests/guests/quote.c`` reads a document's first line (``quote``, copied from the window) and returns a
``claim`` it was only told (a planted value, found in no window). Through Python, ``tensorjob run`` and
``tensorjob map`` in a subprocess: the sources in the envelope, ``results.jsonl`` and ``rows()``;
``--require-grounded`` rejecting the planted field alone (``--fail-item``: failing the item with ``ungrounded``);
``runs --table --review`` putting its value first; ``show --sources`` printing the excerpt; and ``replay --map`` giving the same sources with no model.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

import tensorjob_jupyter as tj
from tensorjob_jupyter.abi import codes

GUEST = Path(__file__).resolve().parents[1] / "guests" / "quote.c"
LINES = ["Invoice 1 from ACME Corp, total 1,234 EUR", "Order 2 for Zoë Ångström", "Ticket 3: kettle broken"]


def cli(*argv, cwd):
    return subprocess.run([sys.executable, "-m", "tensorjob_jupyter.frontends.cli", *argv], capture_output=True,
                          text=True, cwd=cwd, timeout=300, stdin=subprocess.DEVNULL)


@pytest.fixture
def docs(tmp_path):
    folder = tmp_path / "docs"
    folder.mkdir()
    for i, line in enumerate(LINES):
        (folder / f"d{i}.txt").write_text(f"{line}\nsecond line of {i}\n", encoding="utf-8")
    claims = ["ACME Corp", "zoë  ångström", "The product named, or null,"]  # exact, normalised, planted
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps({"path": str(folder / f"d{i}.txt"), "claim": c}) + "\n"
                                for i, c in enumerate(claims)), encoding="utf-8")
    return tmp_path


def test_python_a_result_carries_its_sources_into_the_envelope_and_transcript(docs):
    doc = docs / "docs" / "d0.txt"
    job = tj.Job(GUEST,
                 input={"path": str(doc), "claim": "1,234 EUR"}, read=[docs / "docs"], runs_dir=docs / "runs")
    envelope = job.start().wait(120)
    assert envelope.ok, envelope.error
    [quote] = envelope.sources["quote"]
    assert (quote["file"], quote["start"], quote["end"], quote["match"]) == (str(doc.resolve()), 0,
                                                                            len(LINES[0]), "exact")
    [claim] = envelope.sources["claim"]
    assert doc.read_bytes()[claim["start"]:claim["end"]] == b"1,234 EUR"
    recorded = json.loads(job.envelope_path.read_text())
    assert recorded["sources"] == envelope.sources


def test_python_require_grounded_rejects_a_planted_value_alone_or_fails_the_item(docs):
    doc = docs / "docs" / "d2.txt"
    job = tj.Job(GUEST, input={"path": str(doc), "claim": "Widget Pro"}, read=[docs / "docs"],
                 runs_dir=docs / "runs", require_grounded="quote,claim").start()
    envelope = job.wait(120)
    assert envelope.ok and list(envelope.rejected) == ["claim"] and "`claim`" in envelope.rejected["claim"]
    assert envelope.result["quote"] and envelope.sources["quote"][0]["match"] == "exact"  # the rest stays
    strict = tj.Job(GUEST, input={"path": str(doc), "claim": "Widget Pro"}, read=[docs / "docs"],
                    runs_dir=docs / "runs", require_grounded="quote,claim", fail_item=True).start().wait(120)
    assert strict.error.code == codes.UNGROUNDED and "`claim`" in strict.error.message
    assert strict.result is None and strict.sources is None
    present = tj.Job(GUEST, input={"path": str(doc), "claim": None}, read=[docs / "docs"], runs_dir=docs / "runs",
                     require_grounded="claim").start().wait(120)
    assert present.ok and present.rejected is None  # a null claims nothing: nothing to reject
    absent = tj.Job(GUEST, input={"path": str(doc), "claim": None}, read=[docs / "docs"], runs_dir=docs / "runs",
                    require_grounded="claim", require_present="claim").start().wait(120)
    assert absent.error.code == codes.UNGROUNDED and "require_present" in absent.error.message
    ok = tj.Job(GUEST, input={"path": str(doc), "claim": "kettle"}, read=[docs / "docs"], runs_dir=docs / "runs",
                require_grounded=["claim"]).start().wait(120)
    assert ok.ok and ok.sources["claim"][0]["match"] == "exact"


def test_cli_run_require_grounded_and_show_sources(docs):
    doc = docs / "docs" / "d2.txt"
    given = json.dumps({"path": str(doc), "claim": "Widget Pro"})
    failed = cli("run", str(GUEST), "--input", given, "--read", "docs", "--runs", "runs", "--require-grounded",
                 "claim", "--fail-item", "--json", "--quiet", cwd=docs)
    assert failed.returncode == 1, failed.stderr
    assert json.loads(failed.stdout)["error"]["code"] == "ungrounded"
    rejected = cli("run", str(GUEST), "--input", given, "--read", "docs", "--runs", "runs", "--require-grounded",
                   "claim", "--json", "--quiet", cwd=docs)
    assert rejected.returncode == 0, rejected.stderr
    assert list(json.loads(rejected.stdout)["rejected"]) == ["claim"]
    done = cli("run", str(GUEST), "--input", given, "--read", "docs", "--runs", "runs", "--json", "--quiet", cwd=docs)
    assert done.returncode == 0, done.stderr
    envelope = json.loads(done.stdout)
    assert envelope["sources"]["claim"] == [] and envelope["sources"]["quote"][0]["match"] == "exact"
    runs = sorted((docs / "runs").iterdir(), key=lambda p: p.stat().st_mtime)
    shown = cli("show", str(runs[-1]), "--sources", "--quiet", cwd=docs)
    assert shown.returncode == 0, shown.stderr
    assert '  claim = "Widget Pro": not found in what the job read' in shown.stdout
    assert "d2.txt:0-23 exact 1" in shown.stdout and "«Ticket 3: kettle broken»" in shown.stdout


def test_a_bad_require_grounded_is_one_line(docs):
    done = cli("run", str(GUEST), "--require-grounded", "a,,b", cwd=docs)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "empty field name" in done.stderr


def test_cli_map_sources_in_results_rows_review_and_replay(docs):
    done = cli("map", str(GUEST), "--over", "m.jsonl", "--run-dir", "run", "--read", "docs", "--quiet", cwd=docs)
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in (docs / "run" / "results.jsonl").read_text().splitlines()]
    by_item = {r["item"]: r["sources"] for r in records}
    assert [by_item[i]["claim"][0]["match"] if by_item[i]["claim"] else None for i in range(3)] == [
        "exact", "normalised", None]
    rows = tj.MapResult.read(docs / "run").rows()
    assert [r["grounded.claim"] for r in rows] == [True, True, False]
    assert rows[0]["source.claim"] == f"d0.txt:{LINES[0].index('ACME')}-{LINES[0].index('ACME') + 9}"
    assert rows[2]["source.claim"] == "" and rows[2]["grounded.quote"] is True
    review = tj.MapResult.read(docs / "run").review()  # one row a value, the planted one first
    assert [(r["item"], r["field"], r["reason"]) for r in review[:1]] == [(2, "claim", "not_found")]
    assert len(review) == 6 and {r["reason"] for r in review[1:]} == {"unmeasured"}

    table = cli("runs", "--table", "run", "--review", "--json", cwd=docs)
    assert table.returncode == 0, table.stderr
    reviewed = [json.loads(line) for line in table.stdout.splitlines()]
    assert [(r["item"], r["field"], r["found"]) for r in reviewed[:1]] == [(2, "claim", "not found")]
    assert reviewed[1]["context"].startswith("«") and reviewed[1]["found"] == "grounded"
    assert cli("runs", "--review", cwd=docs).returncode == 2

    # a replayed map has the same sources with no model
    replayed = cli("replay", "--map", "run", str(GUEST), "--run-dir", "again", "--read", "docs", "--json", cwd=docs)
    assert replayed.returncode == 0, replayed.stderr
    again = {json.loads(line)["item"]: json.loads(line)["sources"]
             for line in (docs / "again" / "results.jsonl").read_text().splitlines()}
    assert again == by_item

    # --require-grounded: the planted field is rejected alone, its item completes with its other fields
    rejecting = cli("map", str(GUEST), "--over", "m.jsonl", "--run-dir", "rejecting", "--read", "docs",
                    "--require-grounded", "claim", "--quiet", cwd=docs)
    assert rejecting.returncode == 0, rejecting.stderr
    rows = tj.MapResult.read(docs / "rejecting").rows()
    assert [r["status"] for r in rows] == ["completed"] * 3
    assert [r["rejected.claim"] is not None for r in rows] == [False, False, True]
    assert rows[2]["final.claim"] is None and rows[2]["result.claim"] and rows[0]["final.claim"] == rows[0][
        "result.claim"]
    # --fail-item: the planted item fails ungrounded, the others complete
    strict = cli("map", str(GUEST), "--over", "m.jsonl", "--run-dir", "strict", "--read", "docs",
                 "--require-grounded", "claim", "--fail-item", "--quiet", cwd=docs)
    assert strict.returncode == 1, strict.stderr
    [failure] = [json.loads(line) for line in (docs / "strict" / "failures.jsonl").read_text().splitlines()]
    assert failure["item"] == 2 and failure["error"]["code"] == "ungrounded"


def test_the_review_magic_orders_a_map_doubtful_first(docs, monkeypatch):
    from IPython.testing import globalipapp

    globalipapp.start_ipython()
    ip = globalipapp.get_ipython()
    ip.run_line_magic("load_ext", "tensorjob_jupyter")
    monkeypatch.chdir(docs)
    result = ip.run_line_magic("tensorjob", f"map {GUEST} --over m.jsonl --run-dir run --read docs --quiet")
    ip.user_ns["mapped"] = result
    for target in ("run", "$mapped"):
        rows = ip.run_line_magic("tensorjob", f"review {target} --table")
        assert (rows[0]["item"], rows[0]["field"], rows[0]["reason"]) == (2, "claim", "not_found")
        assert "claim" in repr(rows) and "not_found" in repr(rows)  # shown as the table, its reasons too
        widget = ip.run_line_magic("tensorjob", f"review {target}")  # without --table: the review widget
        assert "tensorjob-review" in widget._dom_classes
    from IPython.core.error import UsageError
    with pytest.raises(UsageError, match="review nowhere"):
        ip.run_line_magic("tensorjob", "review nowhere")

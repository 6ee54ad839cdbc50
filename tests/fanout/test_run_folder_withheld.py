"""A map's run folder is withheld from its guests, whatever read grant covers it (issue 53, item 7).

``--read .`` with ``--run-dir run`` used to let a guest read ``run/expected.jsonl`` and grade itself: the
``peek.c`` guest (tests/guests) returns the expected answer of its own line and scored 1.0. Now every open in
the run folder -- as given, absolute, through a symlink -- is ``capability_denied`` naming the folder, the map
says so in one line before it runs, and the ledger's session records the folder. The grants themselves are
tested in tests/world/test_withheld_folders.py.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import tensorjob_jupyter as tj
from tensorjob_jupyter.abi import codes
from tensorjob_jupyter.fanout.map_folder import LEDGER

GUEST = Path(__file__).resolve().parents[1] / "guests" / "peek.c"
ANSWERS = ["alpha", "beta", "gamma"]


def cli(*argv, cwd):
    return subprocess.run([sys.executable, "-m", "tensorjob_jupyter.frontends.cli", *map(str, argv)],
                          capture_output=True, text=True, cwd=cwd, timeout=300, stdin=subprocess.DEVNULL)


def write_jsonl(path, values):
    path.write_text("".join(json.dumps(v) + "\n" for v in values), encoding="utf-8")


@pytest.mark.slow  # a CLI in a subprocess
def test_a_guest_under_read_dot_cannot_read_the_run_folder_s_expected_answers(tmp_path):
    os.symlink("run", tmp_path / "peek")  # a way in that no lexical check sees
    write_jsonl(tmp_path / "m.jsonl", [{"path": "run/expected.jsonl", "line": 0},
                                       {"path": str(tmp_path / "run" / "expected.jsonl"), "line": 1},
                                       {"path": "peek/expected.jsonl", "line": 2}])
    write_jsonl(tmp_path / "e.jsonl", ANSWERS)
    done = cli("map", GUEST, "--over", "m.jsonl", "--read", ".", "--run-dir", "run", "--expected", "e.jsonl",
               "--concurrency", "1", "--quiet", cwd=tmp_path)
    run = tmp_path / "run"
    assert "mean 1.000" not in done.stdout, done.stdout  # what the guest scored when it could read its answers
    assert done.returncode == 1, done.stderr
    note = f"note: the map's run folder {run} is inside the read grant {tmp_path}; it is withheld from the guest"
    [line] = [line for line in done.stderr.splitlines() if line.startswith("note:")]
    assert line.startswith(note), done.stderr
    failures = [json.loads(line) for line in (run / "failures.jsonl").read_text().splitlines()]
    assert [f["item"] for f in failures] == [0, 1, 2]
    for f in failures:
        assert f["error"]["code"] == codes.CAPABILITY_DENIED, f
        assert f"it is in the map's run folder {run}" in f["error"]["message"], f
        assert "\n" not in f["error"]["message"]
    assert "mean 0.000 over 3 items" in done.stdout, done.stdout
    ledger = json.loads((run / LEDGER).read_text())
    assert ledger["sessions"][-1]["withheld"] == [str(run)]


def test_the_transcripts_folder_is_withheld_too_and_the_python_map_notes_both(tmp_path):
    (tmp_path / "doc.txt").write_text("Harbour Bridge\n", encoding="utf-8")
    transcripts = tmp_path / "transcripts"
    items = [{"path": "doc.txt", "answer": "ok"}, {"path": "transcripts/earlier/events.jsonl"},
             {"path": "run/results.jsonl"}]
    run = tj.start_map(str(GUEST), items, tmp_path / "run", read=["."], cwd=tmp_path, runs_dir=transcripts,
                       concurrency=1)
    assert [n.split(" is inside")[0] for n in run.notes] == [
        f"note: the map's run folder {tmp_path / 'run'}", f"note: the map's transcripts folder {transcripts}"]
    result = run.wait()
    assert result.results() == {0: "ok"}
    failures = result.failures()
    assert failures[1]["code"] == failures[2]["code"] == codes.CAPABILITY_DENIED
    assert f"the map's transcripts folder {transcripts}" in failures[1]["message"]
    assert f"the map's run folder {tmp_path / 'run'}" in failures[2]["message"]


def test_a_map_whose_grants_miss_its_run_folder_has_no_note(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("Harbour Bridge\n", encoding="utf-8")
    run = tj.start_map(str(GUEST), [{"path": str(docs / "a.txt"), "answer": 1}], tmp_path / "run",
                       read=[docs], concurrency=1)
    assert run.notes == ()
    assert run.wait().results() == {0: 1}

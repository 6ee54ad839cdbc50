"""A map's group commit: an item reported concluded -- its event, its progress -- is already in the run folder.

The run folder fsyncs concluded items a batch at a time (``fanout.group_commit``); what must hold is that no
report runs ahead of its record. A map in a child process prints each item as it is reported and is
SIGKILLed right after one: the folder it leaves holds every item it printed. In this process, a spy on
``os.fsync`` checks the stronger claim: every item reported was in its file before an fsync of it ended.
"""

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import tensorjob_jupyter
from tensorjob_jupyter.fanout import group_commit, map as tj_map, start_map
from tensorjob_jupyter.fanout.map_folder_reader import FAILURES, RESULTS, read_records
from tensorjob_jupyter.inference import ScriptedBackend

from test_map import done, fail, infer, puppet_guest, write_manifest

ROOT = Path(tensorjob_jupyter.__file__).resolve().parent.parent

#: The child: a map whose subscriber prints each concluded item, then (at the ``block_at``-th) waits to be killed.
CHILD = r"""
import sys
from tensorjob_jupyter.fanout import start_map
from tensorjob_jupyter.inference import ScriptedBackend

guest, manifest, run_dir, block_at = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
reported = []

def on_event(event):
    if event["type"] in ("item.completed", "item.failed"):
        reported.append(event["item"])
        sys.stdout.write(f"concluded {event['item']}\n")
        sys.stdout.flush()
        if len(reported) == block_at:
            sys.stdin.read()  # the report is out: nothing after it runs before the kill

run = start_map(guest, manifest, run_dir, backend=ScriptedBackend("one two three"), concurrency=3)
run.subscribe(on_event)
run.wait()
print("finished", flush=True)
"""


def _items(n):
    return [fail("bad_item", f"item {i} fails") if i % 7 == 3 else (infer("p", 2) if i % 2 else done({"n": i}))
            for i in range(n)]


def _recorded(run_dir):
    total = 10**9
    return ({r["item"] for r in read_records(run_dir / RESULTS, total=total, repair=True)}
            | {r["item"] for r in read_records(run_dir / FAILURES, total=total, repair=True)})


def _kill_after(tmp_path, reports, block_at):
    """Run the child until it has printed ``reports`` items, SIGKILL it; the items it printed."""
    guest = tmp_path / "puppet.wasm"
    guest.write_bytes(puppet_guest())
    manifest = write_manifest(tmp_path / "items.jsonl", _items(300))
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(guest), str(manifest), str(run_dir), str(block_at)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    printed = []
    try:
        timer = threading.Timer(120, proc.kill)  # a child that never reports is killed, and the test fails below
        timer.start()
        for line in proc.stdout:
            if line.startswith("concluded "):
                printed.append(int(line.split()[1]))
            if len(printed) >= reports or line.startswith("finished"):
                break
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        timer.cancel()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert len(printed) >= reports, (printed, proc.stderr.read()[-3000:])
    return run_dir, manifest, printed


@pytest.mark.parametrize("block_at", [1, 8])
def test_every_item_reported_before_a_sigkill_is_in_the_run_folder(tmp_path, block_at):
    run_dir, manifest, printed = _kill_after(tmp_path, block_at, block_at)
    recorded = _recorded(run_dir)
    assert set(printed) <= recorded, f"reported but not recorded: {sorted(set(printed) - recorded)}"
    # and a resume runs exactly what was not recorded, skipping every item that was
    result = tj_map(puppet_guest(), manifest, run_dir, backend=ScriptedBackend("one two three"))
    assert result.skipped == len(recorded) and result.ran == 300 - len(recorded)
    assert _recorded(run_dir) == set(range(300))


def test_a_map_killed_while_it_reports_freely_lost_no_item_it_reported(tmp_path):
    run_dir, _, printed = _kill_after(tmp_path, 40, block_at=10**9)
    recorded = _recorded(run_dir)
    assert set(printed) <= recorded, f"reported but not recorded: {sorted(set(printed) - recorded)}"


def test_an_item_is_reported_only_once_an_fsync_covered_its_record(tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    synced: set[int] = set()
    fsyncs = []
    real_fsync = os.fsync

    def spy(fd):
        before = set()  # what the results files hold as the fsync starts: all of it is durable once it returns
        for name in (RESULTS, FAILURES):
            path = run_dir / name
            if path.exists():
                for line in path.read_text(encoding="utf-8").splitlines(keepends=True):
                    if line.endswith("\n"):
                        before.add(json.loads(line)["item"])
        real_fsync(fd)
        fsyncs.append(len(before))
        synced.update(before)

    monkeypatch.setattr(group_commit.os, "fsync", spy)
    late = []

    def on_event(event):
        if event["type"] in ("item.completed", "item.failed") and event["item"] not in synced:
            late.append(event["item"])

    run = start_map(puppet_guest(), _items(120), run_dir, backend=ScriptedBackend("one two three"), concurrency=4)
    run.subscribe(on_event)
    result = run.wait(120)
    assert result.ran == 120 and not late, f"reported before an fsync covered them: {late}"
    assert fsyncs and len(fsyncs) <= 120 + 2  # one a batch, never more than one an item (and the ledger's)


def test_a_failed_fsync_reports_nothing_more_and_ends_the_map_as_an_error(tmp_path, monkeypatch):
    calls = []

    real_fsync = os.fsync

    def broken(fd):  # the results files' fsyncs fail (the ledger's, on the map's own thread, still work)
        if threading.current_thread().name != "tensorjob-map-commit":
            return real_fsync(fd)
        calls.append(fd)
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(group_commit.os, "fsync", broken)
    reported = []
    run = start_map(puppet_guest(), [done(i) for i in range(20)], tmp_path / "run",
                    backend=ScriptedBackend("x"), concurrency=2)
    run.subscribe(lambda e: reported.append(e["item"]) if e["type"].startswith("item.") else None)
    result = run.wait(60)
    assert calls and result.status == "error" and "Input/output error" in result.error
    assert reported == [] and run.progress().completed == 0

"""A live replay never reads under a recorded grant unasked (issue 38): a transcript granting ``/`` let a guest
that opens ``input["path"]`` read a 0600 file outside the folder. The grants a live replay runs under are the
ones given now, or the recorded ones only with ``recorded_grants=True`` / ``--recorded-grants``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson

import tensorjob_jupyter as tj
from tensorjob_jupyter.history.replay import ReplayJob
from tensorjob_jupyter.inference.scripted import ScriptedBackend

import wat

ROOT = Path(__file__).resolve().parents[2]
SECRET = "TOPSECRET-0600"


def recorded_reader(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A real run of a guest that opens and reads a 0600 file it was granted: (run folder, guest, secret)."""
    private = tmp_path / "private"
    private.mkdir()
    secret = private / "secret.txt"
    secret.write_text(SECRET)
    os.chmod(secret, 0o600)
    guest = tmp_path / "reader.wasm"
    guest.write_bytes(wat.script_guest([{"cmd": "open", "path": str(secret)},
                                        {"cmd": "slice", "handle": 0, "offset": 0, "len": len(SECRET)},
                                        {"cmd": "done", "result": {"ok": True}}]))
    job = tj.Job(guest, backend=ScriptedBackend("x"), read=[private], runs_dir=tmp_path / "recorded").start()
    assert job.wait(60).ok
    return Path(job.run_dir), guest, secret


def opened(run_dir: Path) -> list[dict]:
    """The answers to the ``open`` commands of the run in ``run_dir``."""
    events = [orjson.loads(line) for line in (run_dir / "events.jsonl").read_bytes().splitlines()]
    return [e for e in events if e["type"].startswith("job.file") or "open" in e["type"]]


def test_a_live_replay_reads_only_what_is_granted_now(tmp_path):
    run, guest, secret = recorded_reader(tmp_path)
    live = ReplayJob(guest, run, live=True, backend=ScriptedBackend("x"), runs_dir=tmp_path / "replays")
    assert live.grants.roots == [] or not list(live.grants.roots)
    assert any("--live reads only what --read grants now" in line and str(secret.parent) in line
               for line in live.adopted), live.adopted
    live.start().wait(60)
    text = (Path(live.run_dir) / "events.jsonl").read_text()
    assert SECRET not in text and "capability_denied" in text
    asked = ReplayJob(guest, run, live=True, recorded_grants=True, backend=ScriptedBackend("x"),
                      runs_dir=tmp_path / "replays")
    assert [str(r) for r in asked.grants.roots] == [str(secret.parent)]
    assert asked.start().wait(60).ok
    offline = ReplayJob(guest, run, runs_dir=tmp_path / "replays")  # nor a replay with no model (issue 53)
    assert offline.grants.roots == ()


def tensorjob(*argv, runs: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TENSORJOB_RUNS": str(runs)}
    return subprocess.run([sys.executable, "-m", "tensorjob_jupyter.frontends.cli", *map(str, argv)], env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120, cwd=runs.parent)


def test_recorded_grants_is_for_a_live_replay(tmp_path):
    run, guest, _ = recorded_reader(tmp_path)
    proc = tensorjob("replay", guest, "--from", run, "--recorded-grants", runs=tmp_path / "runs")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "--recorded-grants is for a --live replay" in proc.stderr

"""A replay runs under the grants it is given on this machine and none from its recording (issue 53, item 4).

A run folder can come from anywhere. Its transcripts granted ``/`` and named a 0600 file of this machine's user --
as the open's path and as the item's input -- and a plain replay (no ``--live``) opened that file under the
recorded grants: the guest read it, its first characters reached the terminal (the divergence line that compared
them with the recording) and the replay's own transcripts and failures.jsonl. Here the run folders are forged the
same way: recorded honestly against a decoy file of the same length, then rewritten to name the secret and grant
``/``, so no byte of the secret is in any file the replay is given -- any that comes out was read from disk.
Each replay runs as a user runs it, ``tensorjob`` in a subprocess, with no model (none is needed).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

import tensorjob_jupyter as tj
from tensorjob_jupyter.history.replay import ReplayJob
from tensorjob_jupyter.inference.scripted import ScriptedBackend

import wat

ROOT = Path(__file__).resolve().parents[2]
SECRET = "TOPSECRET-0600-the-user-s-own-private-key-material"
DECOY = "d" * len(SECRET)  # what the forged recording saw: as long as the secret, so only its bytes differ

#: The guest the user replays: it opens and reads the file its input names, and returns how long it was.
READER_PY = '''import tensorjob as tj

def main(input):
    n = 0
    with tj.open(input["path"]) as f:
        for text in f.windows(64):
            n += len(text)
    return {"chars": n}
'''


def secret_file(tmp_path: Path) -> Path:
    """The user's private file: 0600, in a folder no grant of theirs names."""
    home = tmp_path / "home"
    home.mkdir()
    secret = home / "id_secret"
    secret.write_text(SECRET)
    os.chmod(secret, 0o600)
    return secret


def decoy_file(tmp_path: Path) -> Path:
    folder = tmp_path / "elsewhere"
    folder.mkdir(exist_ok=True)
    decoy = folder / "decoy.txt"
    decoy.write_text(DECOY)
    return decoy


def swap(value, old: str, new: str):
    """``value`` (parsed JSON) with every ``old`` in its strings replaced by ``new``."""
    if isinstance(value, str):
        return value.replace(old, new)
    if isinstance(value, list):
        return [swap(v, old, new) for v in value]
    if isinstance(value, dict):
        return {k: swap(v, old, new) for k, v in value.items()}
    return value


def forge(run_dir: Path, decoy: Path, secret: Path) -> None:
    """Rewrite the run in ``run_dir`` as an attacker would: it names ``secret`` wherever it named ``decoy``, and
    its ``job.created`` grants ``/``."""
    events = run_dir / "events.jsonl"
    lines = [swap(orjson.loads(line), str(decoy), str(secret)) for line in events.read_bytes().splitlines()]
    lines[0].update(read=["/"], grants=["/"], cwd="/")
    events.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in lines))
    assert SECRET.encode() not in events.read_bytes()


def tensorjob(*argv, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TENSORJOB_RUNS": str(cwd / "runs")}
    return subprocess.run([sys.executable, "-m", "tensorjob_jupyter.frontends.cli", *map(str, argv)], env=env,
                          cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)


def leaked(folder: Path) -> list[str]:
    """The files under ``folder`` holding any of the secret's first characters."""
    needle = SECRET[:12].encode()
    return [str(p) for p in folder.rglob("*") if p.is_file() and needle in p.read_bytes()]


def wasm(tmp_path: Path, name: str, commands: list) -> Path:
    path = tmp_path / name
    path.write_bytes(wat.script_guest(commands))
    return path


def reader(path: Path) -> list:
    return [{"cmd": "open", "path": str(path)}, {"cmd": "slice", "handle": 0, "offset": 0, "len": 4096},
            {"cmd": "done", "result": {"ok": True}}]


# --- one run --------------------------------------------------------------------------------------------------


def forged_run(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(a forged run folder granting ``/`` that opens the secret, the user's guest that opens it, the secret)."""
    secret, decoy = secret_file(tmp_path), decoy_file(tmp_path)
    honest = wasm(tmp_path, "honest.wasm", reader(decoy))
    job = tj.Job(honest, read=[decoy.parent], runs_dir=tmp_path / "from-elsewhere").start()
    assert job.wait(60).ok
    run = Path(job.run_dir)
    forge(run, decoy, secret)
    return run, wasm(tmp_path, "guest.wasm", reader(secret)), secret


def test_a_plain_replay_of_a_forged_run_reads_nothing_it_was_not_granted(tmp_path):
    run, guest, secret = forged_run(tmp_path)
    proc = tensorjob("replay", guest, "--from", run, cwd=tmp_path)
    assert SECRET[:12] not in proc.stdout + proc.stderr, proc.stderr
    assert leaked(tmp_path / "runs") == []
    assert proc.returncode == 1, proc.stderr
    said = proc.stderr.splitlines()
    # said before it ran: the recorded grant is not taken
    assert any(line.startswith("replay: reads only what --read grants now; the recorded grants are not taken: /")
               for line in said), proc.stderr
    # and where it stopped, the one grant it would need
    assert f"capability_denied: replay: step 1 opens {secret}, which this replay may not read" in proc.stderr
    assert f"give --read {secret} to let it" in proc.stderr
    (replayed,) = (tmp_path / "runs").iterdir()
    events = [orjson.loads(line) for line in (replayed / "events.jsonl").read_bytes().splitlines()]
    assert events[0]["read"] == [] and events[0]["grants"] == []
    assert not [e for e in events if e["type"].startswith("job.file")]  # nothing opened, nothing sliced
    assert events[-1]["envelope"]["error"]["code"] == "capability_denied"


def test_the_python_api_takes_no_recorded_grant_unless_asked(tmp_path):
    run, guest, secret = forged_run(tmp_path)
    job = ReplayJob(guest, run, runs_dir=tmp_path / "runs")
    assert job.grants.roots == () and job.fetch_grants.prefixes == []
    report = tj.replay(guest, run, runs_dir=tmp_path / "runs")
    assert report.envelope.error.code == "capability_denied" and report.divergence is None
    assert f"--read {secret}" in report.envelope.error.message
    assert leaked(tmp_path / "runs") == []
    asked = ReplayJob(guest, run, recorded_grants=True, runs_dir=tmp_path / "runs")  # asked for by name
    assert [str(r) for r in asked.grants.roots] == ["/"]


def test_a_replay_reads_what_read_grants_here_and_relative_grants_are_this_directory_s(tmp_path, monkeypatch):
    decoy = decoy_file(tmp_path)
    guest = wasm(tmp_path, "honest.wasm", reader(decoy))
    job = tj.Job(guest, read=[decoy.parent], runs_dir=tmp_path / "recorded").start()
    assert job.wait(60).ok
    monkeypatch.chdir(tmp_path)
    # --read names the folder here, made absolute in this directory, not in the run's recorded one
    given = ReplayJob(guest, job.run_dir, read=["elsewhere"], runs_dir=tmp_path / "runs")
    assert [str(r) for r in given.grants.roots] == [str(decoy.parent.resolve())]
    assert given.adopted == []
    proc = tensorjob("replay", guest, "--from", job.run_dir, "--read", "elsewhere", cwd=tmp_path)
    assert proc.returncode == 0 and "the same result" in proc.stderr, proc.stderr
    assert "grants now" not in proc.stderr


def test_recorded_fetch_prefixes_are_not_taken_either(tmp_path):
    guest = wasm(tmp_path, "done.wasm", [{"cmd": "done", "result": 0}])
    job = tj.Job(guest, runs_dir=tmp_path / "recorded").start()
    assert job.wait(60).ok
    events = Path(job.run_dir) / "events.jsonl"
    lines = [orjson.loads(line) for line in events.read_bytes().splitlines()]
    lines[0]["fetch"] = ["http://127.0.0.1:9/"]
    events.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in lines))
    replay = ReplayJob(guest, job.run_dir, runs_dir=tmp_path / "runs")
    assert replay.fetch_grants.prefixes == []
    assert ("replay: fetches only what --fetch grants now; the recorded URL prefixes are not taken: "
            "http://127.0.0.1:9/") in replay.adopted, replay.adopted
    asked = ReplayJob(guest, job.run_dir, live=True, recorded_grants=True, backend=ScriptedBackend("x"),
                      runs_dir=tmp_path / "runs")
    assert asked.fetch_grants.prefixes == ["http://127.0.0.1:9/"]
    assert any("may fetch under the recorded run's URL prefixes" in line for line in asked.adopted)


def test_recorded_grants_is_for_a_live_replay_and_says_a_plain_one_takes_none(tmp_path):
    run, guest, _ = forged_run(tmp_path)
    proc = tensorjob("replay", guest, "--from", run, "--recorded-grants", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "--recorded-grants is for a --live replay" in proc.stderr
    assert "never the recorded grants" in proc.stderr


# --- a map ----------------------------------------------------------------------------------------------------


@pytest.fixture
def forged_map(tmp_path):
    """A map's run folder from elsewhere: two items whose transcripts grant ``/`` and name the secret as their
    input, with no manifest here (so the replay takes each item's input from its transcript)."""
    secret, decoy = secret_file(tmp_path), decoy_file(tmp_path)
    guest = tmp_path / "reader.py"
    guest.write_text(READER_PY, encoding="utf-8")
    manifest = tmp_path / "items.jsonl"
    manifest.write_text("".join(json.dumps({"path": str(decoy), "n": i}) + "\n" for i in range(2)))
    result = tj.map(guest, manifest, tmp_path / "run", read=[decoy.parent], backend=ScriptedBackend("x"))
    assert result.ok, result
    manifest.unlink()
    for job in sorted((tmp_path / "run" / "jobs").iterdir()):
        forge(job, decoy, secret)
    return tmp_path, guest, secret


def test_a_map_replay_says_its_grants_first_and_reads_nothing_it_was_not_granted(forged_map):
    folder, guest, secret = forged_map
    proc = tensorjob("replay", "--map", folder / "run", guest, "--run-dir", folder / "replayed", cwd=folder)
    assert SECRET[:12] not in proc.stdout + proc.stderr, proc.stderr
    assert leaked(folder / "replayed") == [] and leaked(folder / "runs") == []
    said = proc.stderr.splitlines()
    assert said[0] == ("replay: each item reads no file (--read grants them), and fetches no URL (--fetch grants "
                       "them); a replay takes no grant from its recordings"), proc.stderr
    assert said[1] == "replay: the recorded map read under --read /; give it again (--read) for its items to read here"
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "need a grant this replay was not given" in proc.stdout and f"give --read {secret}" in proc.stdout
    failures = [orjson.loads(line) for line in (folder / "replayed" / "failures.jsonl").read_bytes().splitlines()]
    assert [f["error"]["code"] for f in failures] == ["capability_denied"] * 2
    assert all(f"--read {secret}" in f["error"]["message"] for f in failures)


def test_a_map_replay_in_python_names_the_grants_its_items_need(forged_map):
    folder, guest, secret = forged_map
    replay = tj.replay_map(folder / "run", guest, out=folder / "replayed")
    assert replay.needs_grants == [0, 1] and replay.needs_model == []
    assert not replay.passed(0.0)
    rows = replay.rows()
    assert [r["status_new"] for r in rows] == ["needs a grant"] * 2
    assert rows[0]["needs_grant"] == f"--read {secret}"
    assert leaked(folder / "replayed") == []


def test_the_map_replay_grants_line():
    from tensorjob_jupyter.history.replay_setup import grants_line

    assert grants_line(["/data"], None) == ("replay: each item reads only what --read grants: /data, and fetches no "
                                            "URL (--fetch grants them); a replay takes no grant from its recordings")
    assert "reads under its recorded run's grants (--recorded-grants)" in grants_line(None, None,
                                                                                      recorded_grants=True)
    assert "\x1b" not in grants_line(["/a\x1b[31m"], ["http://x/"])

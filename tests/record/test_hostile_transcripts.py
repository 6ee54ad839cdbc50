"""Transcripts, run folders and manifests from elsewhere are untrusted input (issue 21: items 5 to 7, and
the weak points of the transcript readers, replay, prune and manifests).

Each finding is run as it was found: the ``tensorjob`` command in a subprocess on a run folder planted
by hand from a real one (``plant``: the real run's events and envelope, a field changed), the magic in
an IPython shell, the debug prompt with a stdin that stays open and silent. Memory is measured as the
peak resident set of the command's own process, against the same command on a small run in the same
test. The Hypothesis properties at the end plant any bytes (a real transcript with one value replaced
by a hostile one, a byte range overwritten, or noise) as ``events.jsonl`` and ``envelope.json`` and
require of ``runs``, ``show``, ``diff`` and ``replay`` a result or one error line, inert text, and
bounded memory.
"""

from __future__ import annotations

import io
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tensorjob_jupyter as tj
from tensorjob_jupyter import abi
from tensorjob_jupyter.fanout import ManifestError, parse_manifest, read_manifest
from tensorjob_jupyter.fanout.manifest import MAX_LINE_BYTES as MANIFEST_LINE_BYTES
from tensorjob_jupyter.frontends.cli import main
from tensorjob_jupyter.frontends.prompt import prompt
from tensorjob_jupyter.frontends.view import render
from tensorjob_jupyter.frontends.view.state import ViewState
from tensorjob_jupyter.inference.scripted import ScriptedBackend
from tensorjob_jupyter.record.event_checks import MAX_LINE_BYTES, MAX_T_MS
from tensorjob_jupyter.text import for_terminal

import wat

ROOT = Path(__file__).resolve().parents[2]
#: Everything a terminal or a view could act on: OSC 52 (set the clipboard), CSI (clear the screen), a
#: carriage return and a backspace (rewrite the line), a bidi override, and markup.
HOSTILE = "\x1b]52;c;aGk=\x07\x1b[2J\r\x08\u202e<img src=x onerror=alert(1)>"
COMMANDS = [{"cmd": "emit", "progress": {"done": 1, "total": 2}},
            {"cmd": "open", "path": "doc.txt"},
            {"cmd": "slice", "handle": 0, "offset": 0, "len": 20},
            {"cmd": "infer", "prompt": "go", "max_tokens": 10},
            {"cmd": "embed", "texts": ["a", "b"]},
            {"cmd": "emit", "progress": "a log line"},
            {"cmd": "done", "result": {"ok": True}}]
#: Runs the command line as ``python -m tensorjob_jupyter.frontends.cli`` does, then reports its own peak RSS.
PEAK_RSS = ("import resource, sys\n"
            "from tensorjob_jupyter.frontends.cli import main\n"
            "code = main(sys.argv[1:])\n"
            "sys.stderr.write(f'PEAK_RSS_KIB {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}\\n')\n"
            "sys.exit(code)\n")
MiB = 1024 * 1024


# --- recording a real run, planting altered copies ---------------------------------------------------------


def record_run(where: Path) -> tuple[Path, Path]:
    """A real run of a guest that uses every kind of event, and the guest: (run folder, guest file)."""
    data = where / "data"
    data.mkdir(parents=True, exist_ok=True)
    (data / "doc.txt").write_text("hello world " * 50)
    guest = where / "every.wasm"
    guest.write_bytes(wat.script_guest(COMMANDS))
    job = tj.Job(guest, backend=ScriptedBackend("one two three"), read=[data], cwd=data,
                 runs_dir=where / "recorded").start()
    assert job.wait(60).ok
    return Path(job.run_dir), guest


@pytest.fixture
def recorded(tmp_path) -> tuple[Path, Path]:
    return record_run(tmp_path / "world")


def plant(source: Path, runs: Path, name: str, *, events=None, envelope=None, raw_events: bytes | None = None,
          raw_envelope: bytes | None = None) -> Path:
    """A copy of the run ``source`` as ``runs/name`` (its own job id), its events and envelope changed by
    ``events(list)`` / ``envelope(dict)``, or replaced by raw bytes."""
    target = runs / name
    target.mkdir(parents=True)
    lines = [orjson.loads(line) for line in (source / "events.jsonl").read_bytes().splitlines()]
    for event in lines:
        event["job_id"] = name
    env = orjson.loads((source / "envelope.json").read_bytes())
    if events is not None:
        events(lines)
    if envelope is not None:
        envelope(env)
    (target / "events.jsonl").write_bytes(raw_events if raw_events is not None else
                                          b"".join(orjson.dumps(e) + b"\n" for e in lines))
    (target / "envelope.json").write_bytes(raw_envelope if raw_envelope is not None else orjson.dumps(env))
    return target


def tensorjob(*argv, runs: Path, stdin=subprocess.DEVNULL, timeout: float = 60,
              wrapper: str | None = None) -> subprocess.CompletedProcess:
    """The ``tensorjob`` command in a subprocess, as a user runs it."""
    head = [sys.executable, "-c", wrapper] if wrapper else [sys.executable, "-m", "tensorjob_jupyter.frontends.cli"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TENSORJOB_RUNS": str(runs)}
    return subprocess.run([*head, *map(str, argv)], env=env, stdin=stdin, capture_output=True, text=True,
                          timeout=timeout, cwd=runs.parent)


def peak_rss_mib(proc: subprocess.CompletedProcess) -> float:
    line = [x for x in proc.stderr.splitlines() if x.startswith("PEAK_RSS_KIB ")][-1]
    return int(line.split()[1]) / 1024


def inert(text: str) -> bool:
    """Nothing a terminal acts on: no escape sequence, no control character but newline and tab, no bidi."""
    return for_terminal(text) == text


def one_error_line(proc: subprocess.CompletedProcess, *, mentions: str = "") -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert proc.stderr.startswith("tensorjob: error: ") and proc.stderr.count("\n") == 1, proc.stderr[-2000:]
    assert mentions in proc.stderr and inert(proc.stderr) and "Traceback" not in proc.stderr


def deep(levels: int) -> bytes:
    return b"[" * levels + b"1" + b"]" * levels


def with_raw_progress(source: Path, runs: Path, name: str, progress: bytes) -> Path:
    """A copy of ``source`` whose first progress event carries ``progress`` as raw JSON bytes."""
    run = plant(source, runs, name)
    lines = (run / "events.jsonl").read_bytes().splitlines()
    at = next(i for i, line in enumerate(lines) if b'"job.progress"' in line)
    event = orjson.loads(lines[at])
    event["progress"] = "@@"
    lines[at] = orjson.dumps(event).replace(b'"@@"', progress)
    (run / "events.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    return run


# --- 5. transcript fields reach the terminal and the view raw -----------------------------------------------


def set_usage(value):
    def edit(target):
        usage = target["envelope"]["usage"] if "envelope" in target else target["usage"]
        usage.update(tokens_in=value, tokens_out=value, duration_ms=value)
    return edit


@pytest.mark.slow
def test_usage_fields_with_escapes_are_refused_not_printed(recorded, tmp_path):
    run, _ = recorded
    runs = tmp_path / "runs"
    both = plant(run, runs, "both", events=lambda ev: set_usage(HOSTILE)(ev[-1]), envelope=set_usage(HOSTILE))
    only_envelope = plant(run, runs, "envelope-only", envelope=set_usage(HOSTILE))
    real = plant(run, runs, "real")
    for argv in (("show", both), ("diff", both, real)):  # as found: the command in a subprocess
        one_error_line(tensorjob(*argv, runs=runs), mentions="usage.tokens_in")
    for argv in (("show", only_envelope), ("diff", real, both)):
        code, out, err = run_cli(*argv)
        assert code == 2 and err.count("\n") == 1 and "usage.tokens_in" in err and inert(err), err
    listing = tensorjob("runs", runs=runs)
    assert listing.returncode == 0 and inert(listing.stdout) and "<img" not in listing.stdout
    rows = {line.split()[0]: line.split()[2] for line in listing.stdout.splitlines()[1:]}
    assert rows == {"both": "unreadable", "envelope-only": "unreadable", "real": "completed"}
    code, _, err = run_cli("show", real)  # the real run still shows, its usage as numbers
    assert code == 0 and "✓ completed (1 tokens in, 3 out," in err and inert(err)


def test_the_view_escapes_usage_and_the_magic_refuses_the_planted_run(recorded, tmp_path, ip):
    from IPython.core.error import UsageError

    state = ViewState("g")  # a live event is the host's own, but the view escapes whatever it is given
    state.apply({"type": "job.completed", "sequence_number": 1, "envelope": {
        "status": "completed", "result": 1, "usage": {"tokens_in": HOSTILE, "tokens_out": 2, "duration_ms": HOSTILE,
                                                      "model": HOSTILE}}})
    html = render.usage(state)
    assert "<img" not in html and "&lt;img src=x onerror=alert(1)&gt;" in html and "\x1b" not in html
    run, _ = recorded
    planted = plant(run, tmp_path / "runs", "planted", events=lambda ev: set_usage(HOSTILE)(ev[-1]),
                    envelope=set_usage(HOSTILE))
    with pytest.raises(UsageError, match="usage.tokens_in") as refused:
        ip.run_line_magic("tensorjob", f"show {planted}")
    assert "\n" not in str(refused.value) and "<img" not in str(refused.value)


@pytest.fixture(scope="module")
def ip():
    from IPython.testing import globalipapp

    globalipapp.start_ipython()
    shell = globalipapp.get_ipython()
    shell.run_line_magic("load_ext", "tensorjob_jupyter")
    yield shell


# --- 6. numbers from elsewhere crash the CLI ----------------------------------------------------------------


@pytest.mark.slow
def test_numbers_from_elsewhere_are_one_line_and_never_end_the_listing(recorded, tmp_path):
    run, _ = recorded
    runs = tmp_path / "runs"
    real = plant(run, runs, "real")
    planted = {
        "created-1e300": plant(run, runs, "created-1e300", events=lambda ev: ev[0].update(created_at=1e300)),
        "created-2-63": plant(run, runs, "created-2-63", events=lambda ev: ev[0].update(created_at=2 ** 63 - 1)),
        "duration-x": plant(run, runs, "duration-x", envelope=lambda env: env["usage"].update(duration_ms="x")),
        "t-ms-1e15": plant(run, runs, "t-ms-1e15", events=lambda ev: ev[3].update(t_ms=10 ** 15)),
        "deep": with_raw_progress(run, runs, "deep", deep(1000)),
    }
    listing = tensorjob("runs", "--json", runs=runs)
    assert listing.returncode == 0 and "Traceback" not in listing.stderr
    rows = {row["id"]: row for row in map(json.loads, listing.stdout.splitlines())}
    assert set(rows) == {"real", *planted}  # a bad run is one line of the listing, never its end
    assert rows["real"]["status"] == "completed"
    assert {rows[name]["status"] for name in ("created-1e300", "created-2-63", "duration-x")} == {"unreadable"}
    one_error_line(tensorjob("show", planted["t-ms-1e15"], "--speed", "1", runs=runs, timeout=30),
                   mentions=f"a time from 0 to {MAX_T_MS} ms")
    one_error_line(tensorjob("diff", planted["deep"], real, runs=runs), mentions="nested more than")
    one_error_line(tensorjob("show", real, "--speed", "1e-300", runs=runs), mentions="--speed")
    code, out, _ = run_cli("runs", "--runs", runs)
    assert code == 0 and len(out.splitlines()) == 1 + len(rows) and inert(out)
    for name in ("created-1e300", "created-2-63"):
        code, _, err = run_cli("show", planted[name])
        assert code == 2 and err.count("\n") == 1 and "created_at" in err, err
    assert run_cli("show", real, "--speed", "nan")[0] == 2
    assert run_cli("show", real, "--speed", "0.01", "--quiet")[0] == 0  # a hundredth of the speed: about 1 s


# --- 7. the debug prompt ignores max_paused_s ----------------------------------------------------------------


@pytest.mark.slow
def test_the_terminal_debug_prompt_ends_with_its_job_when_stdin_stays_silent(tmp_path):
    guest = tmp_path / "g.wasm"
    guest.write_bytes(wat.script_guest([{"cmd": "emit", "progress": "x"}, {"cmd": "done", "result": 1}]))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TENSORJOB_RUNS": str(tmp_path / "runs")}
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "tensorjob_jupyter.frontends.cli", "run", str(guest), "--debug",
                             "--max-paused-s", "1"], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:  # stdin stays open, and nobody types
        code = proc.wait(timeout=30)
    finally:
        proc.kill()
        err = proc.stderr.read().decode()
        proc.stdin.close()
        proc.stdout.close()
        proc.stderr.close()
    assert code == 130 and "paused_too_long" in err and time.monotonic() - started < 20, err


def _blocking_pipe_reader():
    """A read_line that blocks as ``input()`` does while nobody types: a read on a pipe nobody writes to."""
    r, w = os.pipe()

    def read_line():
        return os.read(r, 100).decode() or None

    return read_line, (r, w)


def test_the_magic_s_prompt_ends_with_its_job(ip, monkeypatch, tmp_path):
    from tensorjob_jupyter.frontends import magic

    read_line, fds = _blocking_pipe_reader()
    monkeypatch.setattr(magic, "_input_line", read_line)
    cell = wat.script_wat([{"cmd": "emit", "progress": "x"}, {"cmd": "done", "result": 1}])
    started = time.monotonic()
    try:
        ip.run_cell_magic("tensorjob", f"--lang wat --debug --max-paused-s 1 --runs {tmp_path / 'runs'}", cell)
    except Exception as e:  # noqa: BLE001 - a failed cell may raise its failure: either way the cell returned
        assert "paused_too_long" in str(e)
    finally:
        for fd in fds:
            os.close(fd)
    assert time.monotonic() - started < 15
    (run,) = (tmp_path / "runs").iterdir()
    envelope = json.loads((run / "envelope.json").read_text())
    assert envelope["error"]["code"] == "paused_too_long"


@pytest.mark.slow
def test_a_blocked_prompt_returns_when_the_pause_ends_and_a_real_ctrl_c_still_cancels():
    guest = wat.script_guest([{"cmd": "emit", "progress": "x"}, {"cmd": "done", "result": 1}])
    read_line, fds = _blocking_pipe_reader()
    try:
        job = tj.Job(guest, backend=None, debug=True, max_paused_s=1).start()
        started = time.monotonic()
        prompt(job, read_line=read_line, write=lambda text: None)  # on the main thread: interrupted
        assert time.monotonic() - started < 10 and job.wait(10).error.code == "paused_too_long"
        job = tj.Job(guest, backend=None, debug=True, max_paused_s=60).start()
        done = threading.Event()
        threading.Thread(target=lambda: done.wait(0.5) or os.kill(os.getpid(), signal.SIGINT), daemon=True).start()
        with pytest.raises(KeyboardInterrupt):  # the user's own Ctrl-C is not taken for the pause's end
            prompt(job, read_line=read_line, write=lambda text: None)
        job.cancel()
        assert job.wait(10).status is tj.JobStatus.CANCELLED
        job = tj.Job(guest, backend=None, debug=True, max_paused_s=1).start()
        finished = []
        helper = threading.Thread(target=lambda: finished.append(prompt(job, read_line=read_line,
                                                                        write=lambda text: None)))
        helper.start()  # off the main thread the read goes to a helper thread, abandoned when the pause ends
        helper.join(10)
        assert finished == [None] and job.wait(10).error.code == "paused_too_long"
    finally:
        for fd in fds:
            os.close(fd)


# --- weak: no per-line cap, everything held --------------------------------------------------------------------


@pytest.mark.slow  # writes a 68 MiB transcript and measures three processes
def test_a_line_past_the_cap_is_one_error_read_in_bounded_memory(recorded, tmp_path):
    run, _ = recorded
    runs = tmp_path / "runs"
    real = plant(run, runs, "real")
    huge = plant(run, runs, "huge")
    with open(huge / "events.jsonl", "r+b") as f:  # the progress event's line, grown past the cap
        lines = f.read().splitlines(keepends=True)
        f.seek(0)
        f.truncate()
        f.write(lines[0])
        f.write(b'{"type":"job.progress","sequence_number":1,"job_id":"huge","t_ms":1,"progress":"')
        for _ in range(MAX_LINE_BYTES // MiB + 4):
            f.write(b"a" * MiB)
        f.write(b'"}\n')
    baseline = tensorjob("show", real, "--quiet", runs=runs, wrapper=PEAK_RSS)
    assert baseline.returncode == 0
    for argv in (("show", huge, "--quiet"), ("diff", huge, real)):
        proc = tensorjob(*argv, runs=runs, wrapper=PEAK_RSS)
        assert proc.returncode == 2 and "longer than" in proc.stderr and "MAX_LINE_BYTES" in proc.stderr
        assert peak_rss_mib(proc) - peak_rss_mib(baseline) < 16, (peak_rss_mib(proc), peak_rss_mib(baseline))


def many_events(source: Path, runs: Path, name: str, count: int) -> Path:
    """A transcript of ``count`` progress events between the real run's first and last."""
    run = plant(source, runs, name)
    lines = [orjson.loads(line) for line in (run / "events.jsonl").read_bytes().splitlines()]
    with open(run / "events.jsonl", "wb") as f:
        f.write(orjson.dumps(lines[0]) + b"\n")
        for i in range(1, count + 1):
            f.write(orjson.dumps({"type": "job.progress", "sequence_number": i, "job_id": name, "t_ms": i,
                                  "progress": {"done": i, "total": count, "note": "x" * 40}}) + b"\n")
        end = lines[-1]
        end["sequence_number"] = count + 1
        f.write(orjson.dumps(end) + b"\n")
    return run


@pytest.mark.slow  # diffs two pairs of runs of 2,000 and 40,000 events in fresh processes
def test_diff_of_many_events_holds_one_step_of_each_run(recorded, tmp_path):
    run, _ = recorded
    runs = tmp_path / "runs"
    small = [many_events(run, runs, f"small-{x}", 2_000) for x in "ab"]
    large = [many_events(run, runs, f"large-{x}", 40_000) for x in "ab"]
    grown = sum((a / "events.jsonl").stat().st_size - (b / "events.jsonl").stat().st_size
                for a, b in zip(large, small)) / MiB
    procs = [tensorjob("diff", *pair, runs=runs, wrapper=PEAK_RSS, timeout=120) for pair in (small, large)]
    assert [p.returncode for p in procs] == [0, 0], procs[1].stderr[-1000:]
    assert "commands: the same 40000 steps, and the same end" in procs[1].stdout
    growth = peak_rss_mib(procs[1]) - peak_rss_mib(procs[0])
    assert growth < 0.25 * grown, (growth, grown)  # all steps held would be about 11 times the files' growth


# --- weak: replay adopts silently, and takes looser limits -------------------------------------------------


def test_replay_says_what_it_adopts_and_takes_no_looser_limit_unless_given(recorded, tmp_path):
    run, guest = recorded
    runs = tmp_path / "runs"

    def loosen(events):
        events[0]["limits"].update(call_timeout_s=1e9, max_tokens=100)
        events[0]["fetch"] = ["http://127.0.0.1:9/"]

    planted = plant(run, runs, "loose", events=loosen)
    data = guest.parent / "data"  # a replay takes no grant from its transcript: the reads are granted again
    replayed = tensorjob("replay", guest, "--from", planted, "--read", data, runs=runs)
    assert replayed.returncode == 0, replayed.stderr
    said = replayed.stderr.splitlines()
    first_progress = next(i for i, line in enumerate(said) if line.startswith("·"))
    before = "\n".join(said[:first_progress])  # said before the guest ran
    assert ("replay: fetches only what --fetch grants now; the recorded URL prefixes are not taken: "
            "http://127.0.0.1:9/") in before
    assert "recorded run's grants" not in before
    assert "limits from the recorded run: max_tokens 100" in before
    assert "not taken: call_timeout_s 1000000000.0 (default 10.0)" in before

    def limits_of_latest() -> dict:
        latest = max((p for p in runs.iterdir() if p.name not in ("loose",)), key=lambda p: p.stat().st_mtime)
        return orjson.loads((latest / "events.jsonl").read_bytes().splitlines()[0])["limits"]

    assert limits_of_latest()["call_timeout_s"] == 10.0 and limits_of_latest()["max_tokens"] == 100
    given_again = tensorjob("replay", guest, "--from", planted, "--read", data, "--call-timeout", "1e9", runs=runs)
    assert given_again.returncode == 0 and "limits looser than the defaults" not in given_again.stderr
    assert limits_of_latest()["call_timeout_s"] == 1e9


# --- weak: prune trusts created_at ----------------------------------------------------------------------------


def test_prune_goes_by_the_file_system_not_by_the_time_a_run_claims(tmp_path):
    runs = tmp_path / "runs"
    jobs = []
    for i in range(3):
        jobs.append(tj.Job(wat.script_guest([{"cmd": "done", "result": i}]), backend=None, runs_dir=runs).start())
        jobs[-1].wait(30)
        time.sleep(0.02)
    future = plant(Path(jobs[0].run_dir), runs, "from-the-future",
                   events=lambda ev: ev[0].update(created_at=250_000_000_000.0))  # the year 9892
    os.utime(future / "events.jsonl", (1_000_000_000, 1_000_000_000))  # written in 2001, as the disk says
    assert tensorjob("runs", "--json", runs=runs).stdout.splitlines()[0].startswith('{"id":"from-the-future"')
    pruned = tensorjob("runs", "--prune", "2", "--json", runs=runs)
    assert pruned.returncode == 0, pruned.stderr
    assert sorted(json.loads(pruned.stdout)["removed"]) == sorted(["from-the-future", jobs[0].id])
    assert sorted(p.name for p in runs.iterdir()) == sorted([jobs[1].id, jobs[2].id])


# --- weak: manifests held whole, read from anything -----------------------------------------------------------


@pytest.mark.slow
def test_a_manifest_is_streamed_capped_and_only_a_regular_file(tmp_path):
    guest = tmp_path / "g.wasm"
    guest.write_bytes(wat.script_guest([{"cmd": "done", "result": 1}]))
    runs = tmp_path / "runs"
    runs.mkdir()
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)
    zero = tmp_path / "zero.jsonl"
    zero.symlink_to("/dev/zero")
    for over in (fifo, zero):  # as found: `tensorjob map --over` hung on the one and read the other forever
        proc = tensorjob("map", guest, "--over", over, "--run-dir", tmp_path / f"map-{over.name}", runs=runs,
                         timeout=30)
        one_error_line(proc, mentions="not a regular file")
    with pytest.raises(ManifestError, match="not a regular file"):
        read_manifest(tmp_path)
    with pytest.raises(ManifestError, match=r"line 2 is longer than \d+ bytes \(MAX_LINE_BYTES\)"):
        parse_manifest(b'{"a": 1}\n"' + b"x" * MANIFEST_LINE_BYTES + b'"\n')
    lines = 30_000
    manifest = tmp_path / "m.jsonl"
    manifest.write_bytes(b"{}\n" * (lines - 1) + b'{"last": [1, 2]}')
    tracemalloc.start()
    try:
        read = read_manifest(manifest)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(read) == lines and read.items[0] == {} and read.items[-1] == {"last": [1, 2]}
    assert sum(1 for _ in read.items) == lines and read.items[1:3] == [{}, {}]
    assert peak < 5 * manifest.stat().st_size, peak / manifest.stat().st_size  # parsed: about 44 times


# --- Hypothesis: any bytes in events.jsonl and envelope.json ---------------------------------------------------


@pytest.fixture(scope="module")
def base_run(tmp_path_factory):
    return record_run(tmp_path_factory.mktemp("base"))


def _paths(value, prefix=()):
    """Every (path to a value) in a JSON value, objects and arrays alike."""
    yield prefix
    if isinstance(value, dict):
        for key, child in value.items():
            yield from _paths(child, prefix + (key,))
    elif isinstance(value, list):
        for i, child in enumerate(value):
            yield from _paths(child, prefix + (i,))


hostile_text = st.one_of(st.sampled_from([HOSTILE, "\x1b[31m", "\r", "\u2028", "\x9b2J", "<script>", "\ud7ff", ""]),
                         st.text(max_size=20))
hostile_values = st.one_of(
    hostile_text, st.none(), st.booleans(),
    st.sampled_from([2 ** 63 - 1, -(2 ** 63), 2 ** 64, 1e300, -1, 1e15, 0.5, 10 ** 20]),
    st.integers(), st.floats(allow_nan=False, allow_infinity=False),
    st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
    st.sampled_from(["@deep"]))


@st.composite
def planted_bytes(draw, base: Path) -> tuple[bytes, bytes | None]:
    """``events.jsonl`` and ``envelope.json`` (None: absent) bytes from elsewhere."""
    events = (base / "events.jsonl").read_bytes()
    envelope = (base / "envelope.json").read_bytes()
    how = draw(st.sampled_from(["value", "value", "value", "bytes", "noise", "cut"]))
    if how == "value":  # one value anywhere (a field, a nested field, a whole event) replaced by a hostile one
        lines = events.splitlines()
        target = draw(st.sampled_from(["events", "events", "envelope"]))
        where = draw(st.integers(0, len(lines) - 1))
        obj = orjson.loads(lines[where] if target == "events" else envelope)
        path = draw(st.sampled_from(list(_paths(obj))))
        value = draw(hostile_values)
        if path:
            parent = obj
            for key in path[:-1]:
                parent = parent[key]
            parent[path[-1]] = "@@"
        else:
            obj = "@@"
        raw = json.dumps(obj, ensure_ascii=False).encode("utf-8", "surrogatepass")
        raw = raw.replace(b'"@@"', deep(300) if value == "@deep" else
                          json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass"), 1)
        if target == "events":
            lines[where] = raw
            return b"\n".join(lines) + b"\n", envelope
        return events, raw
    if how == "bytes":  # a byte range of the real transcript overwritten
        data = bytearray(events)
        start = draw(st.integers(0, len(data) - 1))
        data[start:start + draw(st.integers(0, 16))] = draw(st.binary(max_size=16))
        return bytes(data), draw(st.sampled_from([envelope, None, b"", b"{}", b"[", b"\x00" * 8]))
    if how == "cut":  # cut anywhere: a torn tail, with or without the envelope
        return events[:draw(st.integers(0, len(events)))], draw(st.sampled_from([envelope, None]))
    return draw(st.binary(max_size=200)), draw(st.one_of(st.none(), st.binary(max_size=50)))


def run_cli(*argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main([str(a) for a in argv], out=out, err=err)  # an exception escaping main fails the property
    return code, out.getvalue(), err.getvalue()


def check_ending(code: int, out: str, err: str, codes: set[int]) -> None:
    assert code in codes, (code, err[-500:])
    if code == 2:
        assert err.startswith("tensorjob: error: ") and err.count("\n") == 1, err[-1000:]
    assert inert(out) and inert(err)


def _planted_folder(base: Path, events: bytes, envelope: bytes | None, tmp: str) -> tuple[Path, Path]:
    runs = Path(tmp) / "runs"
    shutil.copytree(base, runs / "real")
    planted = runs / "planted"
    planted.mkdir()
    (planted / "events.jsonl").write_bytes(events)
    if envelope is not None:
        (planted / "envelope.json").write_bytes(envelope)
    return runs, planted


@pytest.mark.slow
@settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_any_bytes_give_a_listing_line_a_show_and_a_diff_that_end_inert_in_bounded_memory(base_run, data):
    base, _ = base_run
    events, envelope = data.draw(planted_bytes(base))
    with tempfile.TemporaryDirectory() as tmp:
        runs, planted = _planted_folder(base, events, envelope, tmp)
        high_water = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        code, out, err = run_cli("runs", "--json", "--runs", runs)
        check_ending(code, out, err, {0})
        assert {json.loads(line)["id"] for line in out.splitlines()} == {"real", "planted"}
        check_ending(*run_cli("runs", "--runs", runs), {0})
        check_ending(*run_cli("show", planted), {0, 2})
        check_ending(*run_cli("show", planted, "--json", "--quiet"), {0, 2})
        check_ending(*run_cli("diff", planted, runs / "real"), {0, 1, 2})
        grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - high_water
        assert grown_kib < 32 * 1024, grown_kib  # the files are a few KB: bounded whatever they hold


@settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_any_bytes_give_a_replay_that_ends_with_a_result_or_one_line(base_run, data):
    base, guest = base_run
    events, envelope = data.draw(planted_bytes(base))
    with tempfile.TemporaryDirectory() as tmp:
        _, planted = _planted_folder(base, events, envelope, tmp)
        check_ending(*run_cli("replay", guest, "--from", planted, "--quiet"), {0, 1, 2, 130})


@given(lines=st.lists(st.one_of(st.binary(max_size=40), st.sampled_from([b"{}", b"[1]", b"", b"  ", b"\xff",
                                                                           deep(200), b'{"a":1,"a":2}', b"NaN"])),
                      max_size=8))
def test_any_manifest_bytes_give_items_or_one_error_naming_a_line(lines):
    data = b"\n".join(lines)
    try:
        manifest = parse_manifest(data)
    except ManifestError as e:
        assert "\n" not in str(e)
        return
    assert len(manifest) == len(list(manifest.items)) >= 1
    written = [line for line in data.split(b"\n") if line.decode("utf-8").strip()]
    assert list(manifest.items) == [abi.loads_strict(line) for line in written]


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-2 ** 63, max_value=2 ** 63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20)


@given(values=st.lists(_JSON, min_size=1, max_size=6), spaced=st.booleans())
def test_a_manifest_gives_each_item_as_the_strict_reader_reads_its_line(values, spaced):
    """Items are parsed by orjson from bytes ``loads_strict`` checked when the manifest was read: the same values,
    types included (an integral float stays a float), whatever the JSON."""
    lines = [json.dumps(v, ensure_ascii=not spaced, indent=None, separators=(", ", ": ") if spaced else (",", ":"))
             for v in values]
    manifest = parse_manifest("\n".join(lines).encode("utf-8"))
    items = list(manifest.items)
    expected = [abi.loads_strict(line.encode("utf-8")) for line in lines]
    assert items == expected
    assert [type(i) for i in items] == [type(e) for e in expected]
    for index, value in enumerate(expected):  # the bytes a job is handed are those it would write itself
        assert abi.checked_input(manifest.items.checked(index), "the job input") == abi.checked_value(value,
                                                                                                     "the job input")

"""One regression test per way a hostile guest once hung, bloated or probed the host.

Each test names the finding it guards. Guests here are a few lines: either a
scripted WAT guest or ``wat.input_script_guest``, which returns whatever raw
command bytes the test stages. Where a finding was seen through the command
line, the test runs ``tensorjob`` as a real subprocess.
"""

import gc
import json
import logging
import os
import subprocess
import sys
import time
import tracemalloc

import orjson
import pytest

import tensorjob_jupyter as tj
from tensorjob_jupyter import abi
from tensorjob_jupyter.abi import codes
from tensorjob_jupyter.world.grants import MAX_PATH_BYTES, Grants
from tensorjob_jupyter.record.events import EventStream, TranscriptWriteError
from tensorjob_jupyter.fanout import ManifestError, ResumeRefused, parse_manifest
from tensorjob_jupyter.inference import ScriptedBackend
from tensorjob_jupyter.host.reactor import Reactor
from tensorjob_jupyter.host import grounding

import wat
from conftest import assert_host_healthy

LONE = b'"\\ud800"'


def run_raw(commands, **kwargs):
    """Run the input-script guest over raw command bytes; returns the finished job."""
    kwargs.setdefault("backend", ScriptedBackend("a b c"))
    job = tj.Job(wat.input_script_guest(), input_bytes=wat.pack_commands(commands), **kwargs).start()
    job.wait(120)  # a shared machine under load can take long over 16 MiB of events
    return job


def transcript_is_whole(job):
    """The transcript on disk: every line parses, numbers gapless, ends with the envelope."""
    lines = job.transcript_path.read_bytes().splitlines()
    events = [orjson.loads(line) for line in lines]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[-1]["type"] == f"job.{job.status.value}"
    assert orjson.loads(job.envelope_path.read_bytes()) == job.envelope.to_json() == events[-1]["envelope"]
    return events


# --- 1. a job that never ended ----------------------------------------------------------------


@pytest.mark.parametrize("command", [
    b'{"cmd":"done","result":' + LONE + b"}",
    b'{"cmd":"done","result":{"k":[1,{' + LONE + b':2}]}}',
    b'{"cmd":"fail","code":"x","message":' + LONE + b"}",
    b'{"cmd":"fail","code":' + LONE + b',"message":"m"}',
    b'{"cmd":"open","path":' + LONE + b"}",
    b'{"cmd":"emit","progress":[' + LONE + b"]}",
    b'{"cmd":"infer","prompt":' + LONE + b',"max_tokens":2}',
    b'{"cmd":"embed","texts":["a",' + LONE + b"]}",
])
def test_a_lone_surrogate_anywhere_ends_the_job_by_one_rule(command, healthy):
    job = run_raw([command])
    assert job.done and job.status is tj.JobStatus.FAILED
    error = job.envelope.error
    assert error.code == codes.WASM_TRAP and "not valid Unicode" in error.message and "\\ud800" in error.message
    transcript_is_whole(job)


def test_a_valid_surrogate_pair_is_text_not_an_error():
    job = run_raw([b'{"cmd":"done","result":"\\ud83d\\ude00"}'])
    assert job.result == "\U0001F600"


def test_the_job_input_is_held_to_the_same_rule():
    with pytest.raises(ValueError, match="not valid Unicode"):
        tj.Job(wat.script_guest([{"cmd": "done", "result": 1}]), input={"x": "\ud800"})
    with pytest.raises(ValueError, match="64 bits"):
        tj.Job(wat.script_guest([{"cmd": "done", "result": 1}]), input=[2**70])


def cli(*args, timeout=60, **kwargs):
    return subprocess.run([sys.executable, "-m", "tensorjob_jupyter.frontends.cli", *args], capture_output=True,
                          text=True, timeout=timeout, **kwargs)


def test_the_cli_ends_on_a_surrogate_result_and_writes_the_envelope(tmp_path):
    guest = tmp_path / "g.wasm"
    guest.write_bytes(wat.script_guest([b'{"cmd":"done","result":"\\udc00"}']))
    started = time.monotonic()
    done = cli("run", str(guest), "--runs", str(tmp_path / "runs"), "--json")
    assert time.monotonic() - started < 30
    assert done.returncode == 1
    envelope = json.loads(done.stdout)
    assert envelope["status"] == "failed" and envelope["error"]["code"] == "wasm_trap"
    [run_dir] = (tmp_path / "runs").iterdir()
    assert json.loads((run_dir / "envelope.json").read_text()) == envelope


def test_a_map_of_surrogate_guests_ends_every_item(tmp_path):
    guest = tmp_path / "g.wasm"
    guest.write_bytes(wat.script_guest([b'{"cmd":"fail","code":"x","message":"\\ud800"}']))
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps({"i": i}) + "\n" for i in range(5)))
    done = cli("map", str(guest), "--over", str(manifest), "--run-dir", str(tmp_path / "run"), "--quiet")
    assert done.returncode == 1, done.stderr
    failures = [json.loads(line) for line in (tmp_path / "run" / "failures.jsonl").read_text().splitlines()]
    assert sorted(f["item"] for f in failures) == list(range(5))
    assert {f["error"]["code"] for f in failures} == {"wasm_trap"}


# --- 2. amplification ------------------------------------------------------------------------------


def nested(depth: int, leaves: int) -> bytes:
    inner = b"[" + b",".join(b"0" for _ in range(leaves)) + b"]"
    return b"[" * (depth - 1) + inner + b"]" * (depth - 1)


def test_a_deep_wide_result_writes_a_compact_envelope(tmp_path):
    result = nested(127, 2000)  # with the command object: 128 levels, serde_json's limit
    job = run_raw([b'{"cmd":"done","result":' + result + b"}"])
    assert job.envelope.ok
    # each of its first 1,000 leaves is a field of 127 parts ("0.0...."), found in nothing the guest read: the
    # sources are bounded by their own budget, the rest of the envelope by the result
    sources = json.dumps(job.envelope.sources, separators=(",", ":")).encode()
    assert 0 < len(sources) <= grounding.DEFAULT_BOUNDS.max_sources_bytes
    assert set(map(len, job.envelope.sources.values())) == {0}
    assert job.envelope_path.stat().st_size < 2 * len(result) + len(sources) + 1000


def test_nesting_deeper_than_serde_allows_is_refused():
    job = run_raw([b'{"cmd":"done","result":' + nested(300, 2000) + b"}"])
    assert job.envelope.error.code == codes.WASM_TRAP and "nested too deeply" in job.envelope.error.message


def test_the_cli_prints_a_deep_result_compactly(tmp_path):
    guest = tmp_path / "g.wasm"
    result = nested(127, 200)
    guest.write_bytes(wat.script_guest([b'{"cmd":"done","result":' + result + b"}"]))
    done = cli("run", str(guest), "--runs", str(tmp_path / "runs"), "--quiet")
    assert done.returncode == 0
    assert len(done.stdout) < 2 * len(result) + 100 and json.loads(done.stdout)


def test_a_command_with_too_many_values_is_refused_before_it_is_parsed():
    job = run_raw([b'{"cmd":"done","result":[' + b"{}," * 2000 + b"{}]}"], limits=tj.Limits(max_command_values=1000))
    assert job.envelope.error.code == codes.WASM_TRAP and "max_command_values" in job.envelope.error.message


def test_a_result_over_its_limit_is_refused():
    job = run_raw([b'{"cmd":"done","result":"' + b"x" * 5000 + b'"}'], limits=tj.Limits(max_result_bytes=4096))
    assert job.envelope.error.code == codes.LIMIT_EXCEEDED and "max_result_bytes" in job.envelope.error.message


# --- 3. memory kept after the job ------------------------------------------------------------------


def bulky_progress(total_bytes: int) -> list[bytes]:
    """Emits of ``[{},{},...]`` (the costliest JSON to hold parsed) adding up to ``total_bytes``."""
    one = b'{"cmd":"emit","progress":[' + b"{}," * 20_000 + b"{}]}"
    return [one] * (total_bytes // len(one)) + [b'{"cmd":"done","result":"ok"}']


@pytest.mark.slow
def test_memory_kept_after_jobs_is_bounded_whatever_they_published():
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(3):
            job = run_raw(bulky_progress(16 * 1024 * 1024), backend=None)
            assert job.envelope.ok and job.stream.bytes > 15 * 1024 * 1024
        del job
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert kept < 16 * 1024 * 1024, kept


def test_a_finished_job_keeps_no_events_in_memory():
    job = run_raw([{"cmd": "emit", "progress": i} for i in range(100)] + [{"cmd": "done", "result": 1}])
    assert not hasattr(job.stream, "_history")
    assert job.retained_bytes < 1000 and len(job.events) == job.stream._next  # read back from disk


def test_the_process_forgets_old_finished_jobs():
    from tensorjob_jupyter.host.jobs import KEEP_FINISHED_JOBS

    for _ in range(KEEP_FINISHED_JOBS + 5):
        tj.run(wat.script_guest([{"cmd": "done", "result": 1}]), backend=None)
    assert sum(j.done for j in tj.jobs()) <= KEEP_FINISHED_JOBS


# --- 4. host work no limit reached ---------------------------------------------------------------


@pytest.mark.parametrize("size", [60_000, 128 * 1024, 16 * 1024 * 1024 - 1024])
def test_a_long_missing_path_is_answered_at_once(tmp_path, size):
    (tmp_path / "data").mkdir()
    path = str(tmp_path / "data") + "/" + "a/" * (size // 2)
    job = run_raw([abi.Open(path).to_json()], read=[tmp_path / "data"], limits=tj.Limits(job_timeout_s=5))
    assert job.envelope.error.code == codes.CAPABILITY_DENIED
    assert f"at most {MAX_PATH_BYTES} bytes" in job.envelope.error.message
    assert job.envelope.usage.duration_ms < 2000
    assert len(job.envelope.error.message) < 500


def test_a_deep_missing_path_inside_the_grant_is_walked_not_resolved_per_ancestor(tmp_path):
    (tmp_path / "data").mkdir()
    path = str(tmp_path / "data") + "/" + "a/" * 1500 + "x"
    started = time.perf_counter()
    with pytest.raises(Exception) as info:
        Grants.for_paths([tmp_path / "data"]).open_checked(path)
    assert time.perf_counter() - started < 0.5 and info.value.code == codes.NOT_FOUND


# --- 5. an existence oracle -----------------------------------------------------------------------


def test_dot_dot_through_a_path_outside_the_grant_never_depends_on_what_exists(tmp_path):
    granted = tmp_path / "granted"
    granted.mkdir()
    (granted / "a.txt").write_text("inside")
    (tmp_path / "exists").mkdir()
    g = Grants.for_paths([granted])
    for probe in ("exists", "absent"):
        fd, _ = g.open_checked(str(tmp_path / probe / ".." / "granted" / "a.txt"))
        assert os.read(fd, 10) == b"inside"
        os.close(fd)
    # ...and a path outside is denied the same way whether or not it exists.
    for probe in ("exists", "absent"):
        with pytest.raises(Exception) as info:
            g.open_checked(str(tmp_path / probe))
        assert info.value.code == codes.CAPABILITY_DENIED and "absent" not in info.value.message.replace(probe, "")


def test_symlinks_are_followed_only_while_they_stay_beneath_the_root(tmp_path):
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "f.txt").write_text("in")
    (tmp_path / "secret.txt").write_text("out")
    os.symlink("sub/f.txt", root / "rel_in")
    os.symlink("../secret.txt", root / "rel_out")
    os.symlink("sub/../../secret.txt", root / "rel_out_later")
    os.symlink(str(tmp_path / "secret.txt"), root / "abs_out")
    os.symlink("loop", root / "loop")
    os.symlink(".", root / "sub" / "here")
    g = Grants.for_paths([root])
    assert g.resolve(str(root / "rel_in")).read_text() == "in"
    assert g.resolve(str(root / "sub" / "here" / "here" / "f.txt")).read_text() == "in"
    for name in ("rel_out", "rel_out_later", "abs_out", "loop"):
        with pytest.raises(Exception) as info:
            g.resolve(str(root / name))
        assert info.value.code == codes.CAPABILITY_DENIED, name


# --- 6. lost and unsafe output ----------------------------------------------------------------------


def test_an_event_that_cannot_be_written_takes_no_number(tmp_path):
    stream = EventStream("j", tmp_path)
    stream.publish("a")
    with pytest.raises(TranscriptWriteError):
        stream.publish("b", bad="\ud800")
    with pytest.raises(TranscriptWriteError):
        stream.publish("c", bad={1, 2})
    stream.publish("d")
    stream.close()
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [(e["type"], e["sequence_number"]) for e in events] == [("a", 0), ("d", 1)]


HOSTILE_TEXT = "\x1b]0;pwned\x07\x1b[2J\u009b31m\u009d8;;x\u009c\u202egnp.exe\u2066\n✓ completed (fake)\r"


def test_the_cli_json_escapes_every_control_and_bidi_character(tmp_path):
    guest = tmp_path / "g.wasm"
    guest.write_bytes(wat.script_guest([{"cmd": "done", "result": {"t": HOSTILE_TEXT}}]))
    done = cli("run", str(guest), "--runs", str(tmp_path / "runs"), "--json")
    assert done.returncode == 0
    assert not any(ch in done.stdout for ch in "\x1b\x07\u009b\u009d\u009c\u202e\u2066\r")
    assert json.loads(done.stdout)["result"] == {"t": HOSTILE_TEXT}  # escaped, not changed


def test_the_cli_never_lets_a_guest_forge_a_host_line(tmp_path):
    guest = tmp_path / "g.wasm"
    guest.write_bytes(wat.script_guest([{"cmd": "fail", "code": "c\n✓ completed", "message": HOSTILE_TEXT}]))
    done = cli("run", str(guest), "--runs", str(tmp_path / "runs"))
    assert done.returncode == 1
    assert not any(ch in done.stderr for ch in "\x1b\x07\u009b\u009d\u202e\u2066\r")
    assert [line for line in done.stderr.splitlines() if line.startswith("✓")] == []


def test_model_text_is_indented_under_the_host_lines(tmp_path):
    from tensorjob_jupyter.frontends.terminal import LivePrinter
    import io

    job = tj.Job(wat.script_guest([{"cmd": "infer", "prompt": "p", "max_tokens": 5}, {"cmd": "done", "result": 1}]),
                 backend=ScriptedBackend("a \n✓ completed (0 ms)\n· open /etc/passwd"))
    err = io.StringIO()
    printer = LivePrinter(job, out=io.StringIO(), err=err, quiet=False, chunks_to_stdout=True)
    printer.thread.start()
    job.start().wait(10)
    printer.thread.join(10)
    host_lines = [line for line in err.getvalue().splitlines() if line[:1] in ("✓", "·", "✗")]
    assert host_lines == ["· infer:", host_lines[1]] and host_lines[1].startswith("✓ completed (")


def test_jobs_listing_is_inert(capsys):
    from IPython.testing import globalipapp

    from tensorjob_jupyter.frontends.magic import TensorJob

    globalipapp.start_ipython()  # once per process; later calls do nothing

    tj.run(wat.script_guest([{"cmd": "fail", "code": "\x1b[31mred\u202e\n", "message": "m"}]), backend=None)
    TensorJob(shell=globalipapp.get_ipython())._list_jobs()
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\u202e" not in out and "failed     guest.wasm  red⏎" in out


def test_a_deep_result_never_kills_the_view():
    from tensorjob_jupyter.frontends.view.widget import JobView

    job = tj.Job(wat.input_script_guest(), backend=None,
                 input_bytes=wat.pack_commands([b'{"cmd":"done","result":' + nested(127, 3000) + b"}"]))
    view = JobView(job, refresh_hz=20).start()
    job.start().wait(10)
    view.join(10)
    assert not view._thread.is_alive()
    assert 'class="tj-status">completed<' in view.header.value and "tj-result" in view.result.value
    assert len(view.result.value) < 500_000


# --- 7. host bugs reported as guest faults ---------------------------------------------------------


def test_a_host_bug_is_internal_error_with_the_traceback_logged(monkeypatch, caplog):
    def broken(self, cmd):
        raise KeyError("the host's own mistake")

    monkeypatch.setattr(Reactor, "_emit", broken)
    with caplog.at_level(logging.ERROR, logger="tensorjob_jupyter"):
        env = tj.run(wat.script_guest([{"cmd": "emit", "progress": 1}, {"cmd": "done", "result": 1}]), backend=None)
    assert env.error.code == codes.INTERNAL_ERROR and "not the guest" in env.error.message
    assert any(r.exc_info and "the host's own mistake" in str(r.exc_info[1]) for r in caplog.records)
    monkeypatch.undo()
    assert_host_healthy()


@pytest.mark.parametrize("code", sorted(abi.HOST_ONLY_CODES))
def test_a_guest_claiming_a_host_only_code_is_reported_as_its_own(code):
    env = tj.run(wat.script_guest([{"cmd": "fail", "code": code, "message": "trust me"}]), backend=None)
    assert env.error.code == codes.SCRIPT_ERROR
    assert f"`{code}`" in env.error.message and "trust me" in env.error.message


def test_an_endless_fail_message_is_cut():
    job = run_raw([b'{"cmd":"fail","code":"' + b"c" * 10_000 + b'","message":"' + b"m" * 1_000_000 + b'"}'])
    assert len(job.envelope.error.message) < 20_000 and len(job.envelope.error.code) < 200


# --- 8. smaller ---------------------------------------------------------------------------------------


def test_a_deeply_nested_manifest_line_names_the_line():
    with pytest.raises(ManifestError, match="line 2") as info:
        parse_manifest(b'{"a": 1}\n' + b"[" * 5000 + b"]" * 5000 + b"\n")
    assert info.value.line == 2 and "nested too deeply" in str(info.value)


def test_a_duplicate_key_is_called_a_duplicate():
    with pytest.raises(abi.AbiError) as info:
        abi.parse_command(b'{"cmd":"open","path":"a","path":"b"}')
    assert "duplicate field `path`" in str(info.value) and "number" not in str(info.value)


@pytest.mark.parametrize("name", [".lock", "results.jsonl", "failures.jsonl"])
def test_a_run_folder_file_that_is_a_symlink_is_refused_not_followed(tmp_path, name):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    run_dir = tmp_path / "run"
    guest = wat.script_guest([{"cmd": "fail", "code": "x", "message": "y"}])
    assert tj.map(guest, [{"i": 0}], run_dir, backend=ScriptedBackend("x")).failed == 1  # a real run folder
    (run_dir / name).unlink()
    os.symlink(victim, run_dir / name)
    with pytest.raises(ResumeRefused, match="symbolic link"):
        tj.map(guest, [{"i": 0}], run_dir, backend=ScriptedBackend("x"), retry_failed=True)
    assert victim.read_text() == "precious\n"

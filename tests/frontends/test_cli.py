"""The ``tensorjob`` command line, in process and as a real subprocess."""

import io
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tensorjob_jupyter.frontends.cli import main

import wat

DONE = {"cmd": "done", "result": {"answer": 42}}


def run_cli(*argv):
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def guest_file(tmp_path):
    def write(commands, name="g.wasm", **kwargs):
        p = tmp_path / name
        p.write_bytes(wat.script_guest(commands, **kwargs))
        return str(p)
    return write


def test_run_prints_the_result_and_exits_zero(guest_file):
    code, out, err = run_cli("run", guest_file([{"cmd": "emit", "progress": {"done": 1, "total": 4}}, DONE]))
    assert code == 0
    assert json.loads(out) == {"answer": 42}
    assert "1/4 (25%)" in err and "completed" in err


def test_json_prints_only_the_envelope(guest_file):
    code, out, _ = run_cli("run", guest_file([DONE]), "--json", "--quiet")
    env = json.loads(out)
    assert code == 0 and env["status"] == "completed" and env["result"] == {"answer": 42}
    assert env["usage"]["model"] == "SmolLM2-135M-Instruct.Q4_1"


def test_a_failed_job_exits_one(guest_file):
    code, out, err = run_cli("run", guest_file([{"cmd": "fail", "code": "not_found", "message": "gone"}]), "--json")
    assert code == 1
    assert json.loads(out)["error"] == {"code": "not_found", "message": "gone"}


def test_events_file_has_every_event_as_one_json_line(guest_file, tmp_path):
    events = tmp_path / "events.jsonl"
    code, _, _ = run_cli("run", guest_file([{"cmd": "emit", "progress": 1}, DONE]), "--events", str(events), "-q")
    lines = [json.loads(line) for line in events.read_text().splitlines()]
    assert code == 0
    assert [e["sequence_number"] for e in lines] == list(range(len(lines)))
    assert lines[0]["type"] == "job.created" and lines[-1]["type"] == "job.completed"


def test_read_input_and_timeout_options_reach_the_job(guest_file, tmp_path):
    doc = tmp_path / "doc.txt"
    doc.write_text("data")
    code, out, _ = run_cli("run", guest_file([{"cmd": "open", "path": str(doc)}, DONE]), "--read", str(tmp_path),
                           "--input", '{"path": "x"}', "--timeout", "20", "--json")
    assert code == 0, out
    code, out, _ = run_cli("run", guest_file([{"cmd": "open", "path": str(doc)}, DONE]), "--json")
    assert json.loads(out)["error"]["code"] == "capability_denied"


def test_the_input_may_be_written_as_a_python_literal(tmp_path):
    """What a notebook line takes, a terminal takes too: the console script in a subprocess, a Python guest."""
    echo = tmp_path / "echo.py"
    echo.write_text("def main(input):\n    return input\n")
    proc = subprocess.run([sys.executable, "-m", "tensorjob_jupyter.frontends.cli", "run", str(echo), "--json",
                           "--input", "{'path': 'a.txt', 'n': 3, 'ok': True, 'none': None}"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["result"] == {"path": "a.txt", "n": 3, "ok": True, "none": None}
    code, _, err = run_cli("run", str(echo), "--input", "$params")  # a variable needs a notebook
    assert code == 2 and "only in a notebook" in err


def test_input_file_is_staged_for_read_input(tmp_path):
    staged = tmp_path / "staged.bin"
    staged.write_bytes(b"0123456789")
    imports = '(import "wasi:tensor/host@0.1.0" "input-len" (func $input_len (result i32)))'
    body = "(if (i32.ne (call $input_len) (i32.const 10)) (then (unreachable))) (call $next)"
    g = tmp_path / "g.wasm"
    g.write_bytes(wat.script_guest([DONE], imports=imports, init_body=body))
    assert run_cli("run", str(g), "--input-file", str(staged), "-q")[0] == 0
    assert run_cli("run", str(g), "-q")[0] == 1


def test_terminal_control_sequences_from_a_guest_are_stripped(tmp_path):
    nasty = "\x1b[2J\x1b]0;pwned\x07red\x1b[31m!\x1b[0m\r\x9b1A"
    imports = '(import "wasi:tensor/host@0.1.0" "emit-chunk" (func $emit (param i32 i32) (result i32)))'
    data = nasty.encode()
    hexed = "".join(f"\\{b:02x}" for b in data)
    g = tmp_path / "g.wasm"
    g.write_bytes(wat.script_guest([{"cmd": "emit", "progress": nasty}, {"cmd": "done", "result": nasty}],
                                   imports=imports + f'(data (i32.const 0x8000) "{hexed}")',
                                   init_body=f"(drop (call $emit (i32.const 0x8000) (i32.const {len(data)}))) (call $next)"))
    code, out, err = run_cli("run", str(g))
    assert code == 0
    for stream in (out, err):
        assert "\x1b" not in stream and "\x07" not in stream and "\r" not in stream and "\x9b" not in stream
    assert out.startswith("red!")  # the streamed chunk, cleaned; JSON output escapes the rest


@pytest.mark.parametrize("argv, fragment", [
    (["run", "missing.wasm"], "guest file not found: missing.wasm"),
    (["run", "{guest}", "--input", "{not json"], "--input is not valid JSON"),
    (["run", "{guest}", "--read", "/no/such/dir"], "--read /no/such/dir: no such file or directory"),
    (["run", "{guest}", "--max-tokens", "many"], "--max-tokens: 'many' is not a whole number"),
    (["run", "{guest}", "--timeout", "-3"], "--timeout must be a positive number"),
    (["run", "{guest}", "--model", "/no/model.gguf"], "model file not found"),
    (["frobnicate"], "invalid choice"),
])
def test_usage_errors_are_one_clear_line(argv, fragment, guest_file):
    g = guest_file([DONE])
    code, out, err = run_cli(*[a.replace("{guest}", g) for a in argv])
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("tensorjob: error:") and fragment in err
    assert "Traceback" not in err


def test_the_console_script_runs_as_a_subprocess(guest_file):
    proc = subprocess.run([sys.executable, "-m", "tensorjob_jupyter.frontends.cli", "run", guest_file([DONE]), "--json"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["result"] == {"answer": 42}


def spinning_cli_job(guest_file, tmp_path) -> subprocess.Popen:
    """``tensorjob run --json`` of a guest that spins in ``cf_init``, once its job has started."""
    runs = tmp_path / "runs"
    proc = subprocess.Popen([sys.executable, "-m", "tensorjob_jupyter.frontends.cli", "run", guest_file([DONE],
                             init_body=wat.SPIN), "--json", "--runs", str(runs)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not list(runs.glob("*/events.jsonl")) and time.monotonic() < deadline:
        time.sleep(0.05)
    return proc


def test_ctrl_c_cancels_the_job_and_exits_130(guest_file, tmp_path):
    proc = spinning_cli_job(guest_file, tmp_path)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 130, err
    assert json.loads(out)["status"] == "cancelled"


TGKILL = {"x86_64": 234, "aarch64": 131}.get(os.uname().machine)


@pytest.mark.skipif(TGKILL is None or not sys.platform.startswith("linux"), reason="tgkill: Linux x86-64/arm64")
def test_ctrl_c_handed_to_another_thread_still_cancels_the_job(guest_file, tmp_path):
    """The kernel may hand a Ctrl-C to any thread of the process; its handler runs on the main thread
    only once that thread is back in Python, so the CLI never waits for a job without a timeout."""
    import ctypes

    proc = spinning_cli_job(guest_file, tmp_path)
    others = [int(t) for t in os.listdir(f"/proc/{proc.pid}/task") if int(t) != proc.pid]
    assert others, "the CLI runs its job on a thread of its own"
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.syscall(TGKILL, proc.pid, others[0], signal.SIGINT) == 0, ctypes.get_errno()
    started = time.monotonic()
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 130, err
    assert time.monotonic() - started < 5  # not the guest's 10 s call deadline
    assert json.loads(out)["status"] == "cancelled"


def test_a_guest_that_does_not_compile_shows_file_and_line(tmp_path):
    src = tmp_path / "broken.c"
    src.write_text('#include "tensorjob.h"\n\nint oops = ;\n')
    code, out, err = run_cli("run", str(src))
    assert code == 1 and out == ""
    assert "broken.c:3:" in err and "Traceback" not in err
    code, _, err = run_cli("compile", str(src))
    assert code == 1 and "broken.c:3:" in err


def test_compile_writes_a_wasm_module(tmp_path):
    src = tmp_path / "g.wat"
    src.write_text(wat.script_wat([DONE]))
    code, out, _ = run_cli("compile", str(src), "-o", str(tmp_path / "out.wasm"))
    assert code == 0 and "out.wasm" in out
    assert (tmp_path / "out.wasm").read_bytes().startswith(b"\0asm")


def test_an_unwritable_events_file_is_a_usage_error(guest_file, tmp_path):
    code, _, err = run_cli("run", guest_file([DONE]), "--events", str(tmp_path / "no" / "such" / "dir.jsonl"))
    assert code == 2 and "--events" in err and err.count("\n") == 1

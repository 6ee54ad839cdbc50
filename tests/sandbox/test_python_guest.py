"""Python guests in the sandbox: the guest API, the reactor's protocol, and every hostile case.

These drive a ``PythonGuest`` (CPython 3.14 compiled to WebAssembly, run by
wasmtime) with the small reactor of ``python_guest_support.drive``: the real
engine and the real interpreter, no model. Jobs through ``tj.Job``, the CLI,
replay and maps are in ``test_python_guest_jobs.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from python_guest_support import TOKENS, drive, ensure_interpreter

from tensorjob_jupyter import abi
from tensorjob_jupyter.abi import codes
from tensorjob_jupyter.limits import Limits
from tensorjob_jupyter.sandbox.python import PythonSyntaxError
from tensorjob_jupyter.sandbox.python.guest import MAX_LOG_BYTES, Determinism, check_syntax
from tensorjob_jupyter.sandbox.python.program import PythonProgram, is_program


@pytest.fixture(scope="module", autouse=True)
def _interpreter():
    ensure_interpreter()


# --- the guest API -------------------------------------------------------------------------


def test_main_returns_the_result_and_sees_the_input():
    out = drive("""
        import tensorjob as tj
        def main(input):
            return {"got": input, "same": tj.input == input}
    """, {"n": 3})
    assert out.result == {"got": {"n": 3}, "same": True}


def test_a_main_without_parameters_is_called_without_input():
    assert drive("def main():\n    return 5\n").result == 5


def test_each_api_call_is_one_command_in_order():
    out = drive("""
        import tensorjob as tj
        def main(input):
            tj.emit({"stage": "start"})
            tj.emit(step=2)
            v = tj.embed(["ab", "abc"])
            one = tj.embed("abcd")
            return {"v": v, "one": one}
    """)
    assert [c.to_json() for c in out.commands] == [
        {"cmd": "emit", "progress": {"stage": "start"}},
        {"cmd": "emit", "progress": {"step": 2}},
        {"cmd": "embed", "texts": ["ab", "abc"]},
        {"cmd": "embed", "texts": ["abcd"]},
    ]
    assert out.result == {"v": [[2.0, 1.0], [3.0, 1.0]], "one": [4.0, 1.0]}


def test_break_stops_generation_and_the_reply_keeps_what_was_streamed():
    out = drive("""
        import tensorjob as tj
        def main(input):
            seen = []
            reply = tj.infer("go", max_tokens=50)
            for piece in reply:
                seen.append(piece)
                if len(seen) == 2:
                    break
            after = tj.infer("again")   # the stopped infer is settled first
            return {"seen": seen, "stopped": reply.stopped, "text": reply.text, "after": after.text}
    """)
    assert out.judged[0] == TOKENS[:2]  # the guest judged two tokens, then said stop
    assert out.judged[1] == TOKENS  # the second reply was read whole: every token continues...
    assert out.result == {"seen": TOKENS[:2], "stopped": True, "text": "".join(TOKENS), "after": "".join(TOKENS)}


def test_a_reply_read_whole_costs_the_guest_no_token_calls():
    out = drive("""
        import tensorjob as tj
        def main(input):
            r = tj.infer("hi", max_tokens=4, temperature=0.5, stop=["\\n"], seed=3)
            return [r.text, r.tokens_out, r.done]
    """)
    assert out.result == ["".join(TOKENS[:4]), 4, True]
    assert out.commands[0].to_json() == {"cmd": "infer", "prompt": "hi", "max_tokens": 4, "images": [],
                                         "temperature": 0.5, "seed": 3, "stop": ["\n"]}
    assert not out.guest._stream_infer


def test_on_token_callback_form_and_stop():
    out = drive("""
        import tensorjob as tj
        def main(input):
            got = []
            def judge(piece):
                got.append(piece)
                return tj.STOP if piece == " brown" else None
            r = tj.infer("go", on_token=judge)
            return got
    """)
    assert out.result == TOKENS[:3]
    assert out.judged[0] == TOKENS[:3]


def test_an_unread_reply_is_still_sent_before_the_next_command_and_at_the_end():
    out = drive("""
        import tensorjob as tj
        def main(input):
            tj.infer("first")
            tj.emit(1)
            tj.infer("last")
            return "ok"
    """)
    assert [c.cmd for c in out.commands] == ["infer", "emit", "infer"]
    assert out.result == "ok"


def test_a_file_is_read_in_windows_as_text_lines_and_by_seek():
    out = drive("""
        import tensorjob as tj
        def main(input):
            with tj.open("notes.txt") as f:
                windows = list(f.windows(4))
                f.seek(0)
                first = f.read(5)
                f.seek(6)
                rest = f.read()
            return {"windows": windows, "first": first, "rest": rest, "size": f.size, "kind": f.kind}
    """)
    assert out.result == {"windows": ["hell", "o wo", "rld"], "first": "hello", "rest": "world", "size": 11,
                          "kind": "text"}
    assert out.commands[0].to_json() == {"cmd": "open", "path": "notes.txt"}


def test_format_and_tools_shape_the_infer_command():
    out = drive("""
        import tensorjob as tj
        def lookup():
            "Find a word."
        def main(input):
            tj.infer("a", format={"type": "object"}).text
            tj.infer("b", format="json").text
            tj.infer("c", tools=[lookup], tool_choice="auto").text
            return 1
    """)
    a, b, c = (cmd.to_json() for cmd in out.commands)
    assert a["format"] == {"type": "json_schema", "name": "answer", "schema": {"type": "object"}, "strict": True}
    assert b["format"] == {"type": "json_object"}
    assert c["tools"] == [{"type": "function", "name": "lookup", "description": "Find a word."}]
    assert c["tool_choice"] == "auto"


def test_a_bad_argument_is_the_guests_own_exception_at_its_own_line():
    out = drive("""
        import tensorjob as tj
        def main(input):
            try:
                tj.infer("x", max_tokens=-1).text
            except ValueError as e:
                return "caught: " + str(e)[:40]
    """)
    assert out.result.startswith("caught: ")
    out = drive("""
        import tensorjob as tj
        def main(input):
            tj.infer("x", max_tokens=-1).text
    """, filename="guest.py")
    message = out.failure.message
    assert out.failure.code == codes.SCRIPT_ERROR
    assert 'File "guest.py", line 3, in main' in message and "ValueError" in message
    assert "tensorjob.py" not in message  # the runtime's own frames are not the guest's


def test_fail_ends_with_the_guests_code():
    out = drive("""
        import tensorjob as tj
        def main(input):
            tj.fail("not_found", "no such thing")
            return "never"
    """)
    assert out.failure.code == "not_found" and out.failure.message == "no such thing"


def test_an_uncaught_exception_is_script_error_with_the_guests_traceback():
    out = drive("""
        def helper(x):
            return 1 / x

        def main(input):
            return helper(0)
    """)
    f = out.failure
    assert f.code == codes.SCRIPT_ERROR
    assert 'File "cell.py", line 5, in main' in f.message
    assert 'File "cell.py", line 2, in helper' in f.message
    assert "return 1 / x" in f.message  # the guest's own source line
    assert f.message.rstrip().endswith("ZeroDivisionError: division by zero")


def test_a_result_that_is_not_json_is_script_error():
    out = drive("def main(input):\n    return {1, 2}\n")
    assert out.failure.code == codes.SCRIPT_ERROR and "not JSON" in out.failure.message


def test_print_goes_to_the_jobs_log_by_line():
    out = drive("""
        import sys
        def main(input):
            print("one")
            print("two", "three", sep="-")
            print("to stderr", file=sys.stderr)
            print("no newline", end="")
            return 0
    """)
    assert out.log_lines() == ["one", "two-three", "no newline"]
    assert out.log_lines("stderr") == ["to stderr"]


def test_streaming_output_and_staged_input():
    out = drive("""
        import tensorjob as tj
        def main(input):
            n = tj.input_len()
            data = tj.read_input()
            code = tj.emit_chunk(b"\\x00\\xff raw")
            tj.emit_chunk("text é")
            return {"n": n, "data": data.hex(), "code": code, "flush": tj.flush()}
    """, input_bytes=b"\x01\x02\xfe")
    assert out.result == {"n": 3, "data": "0102fe", "code": 0, "flush": 0}
    chunks = [f["data"] for t, f in out.events if t == "job.chunk"]
    assert chunks == [b"\x00\xff raw", "text é".encode()]


def test_the_standard_library_the_issue_promises_is_importable():
    modules = ("json re math statistics datetime decimal fractions textwrap difflib collections itertools "
               "functools dataclasses typing enum string unicodedata csv html base64 hashlib heapq bisect "
               "random").split()
    out = drive(f"""
        def main(input):
            import importlib
            return [importlib.import_module(m).__name__ for m in {modules!r}]
    """)
    assert out.result == modules


def test_syntax_errors_are_reported_before_the_job_with_line_and_column():
    check_syntax("def main(x):\n    return x\n")
    with pytest.raises(PythonSyntaxError) as e:
        check_syntax("def main(x):\n    return (x\n\nprint(1)\n", "guest.py")
    assert e.value.filename == "guest.py" and e.value.lineno == 2
    assert str(e.value).startswith("guest.py:2:")
    # The guest's own Python decides (3.14 syntax, whatever the host's version).
    check_syntax("def main(x):\n    match x:\n        case {'a': v}: return v\n")


def test_a_program_travels_as_bytes_no_wasm_module_can_start_with():
    blob = PythonProgram("def main(x): return x\n", "a.py").to_bytes()
    assert is_program(blob) and not blob.startswith(b"\0asm")
    assert PythonProgram.from_bytes(blob) == PythonProgram("def main(x): return x\n", "a.py")


# --- determinism: the host's clock and random source, recorded ------------------------------


DETERMINISM = """
    import random, time, os, uuid, datetime
    def main(input):
        return {"random": random.random(), "urandom": os.urandom(8).hex(), "uuid": str(uuid.uuid4()),
                "time": time.time(), "mono": time.monotonic(), "now": datetime.datetime.now().isoformat()}
"""


def test_random_comes_from_the_seed_the_job_records():
    a = drive(DETERMINISM, determinism=Determinism(seed=42))
    b = drive(DETERMINISM, determinism=Determinism(seed=42))
    c = drive(DETERMINISM, determinism=Determinism(seed=43))
    for key in ("random", "urandom", "uuid"):
        assert a.result[key] == b.result[key] != c.result[key]
    started = [f for t, f in a.events if t == "job.interpreter"][0]
    assert started["seed"] == 42 and started["interpreter"]["componentize_py"] == "0.25.1"


def test_clock_readings_are_recorded_and_a_replay_gets_them_back():
    first = drive(DETERMINISM, determinism=Determinism(seed=1))
    started = [f for t, f in first.events if t == "job.interpreter"][0]
    readings = [r for t, f in first.events if t == "job.clock" for r in f["readings"]]
    assert len(readings) >= 3
    time.sleep(0.05)
    again = drive(DETERMINISM, determinism=Determinism(seed=1, wall_origin_ns=started["wall_origin_ns"],
                                                        readings=readings))
    assert again.result == first.result
    assert [r for t, f in again.events if t == "job.clock" for r in f["readings"]] == readings


# --- hostile guests: each ends only its own job ------------------------------------------------


def test_a_spinning_guest_times_out_at_the_call_deadline(healthy):
    out = drive("def main(input):\n    while True:\n        pass\n", limits=Limits(call_timeout_s=0.5))
    assert out.trap is not None and out.trap.code == codes.TIMEOUT
    assert "call_timeout_s" in out.trap.message
    assert out.seconds < 6


def test_a_guest_spinning_after_a_command_times_out_too():
    out = drive("""
        import tensorjob as tj
        def main(input):
            tj.emit(1)
            while True:
                pass
    """, limits=Limits(call_timeout_s=1))
    assert out.trap.code == codes.TIMEOUT and len(out.commands) == 1


def test_cancel_ends_a_spinning_guest_at_once():
    out = drive("def main(input):\n    while True:\n        pass\n", limits=Limits(call_timeout_s=30),
                cancel_after=0.5)
    assert out.trap.code == codes.CANCELLED and out.seconds < 5


def test_the_job_deadline_reaches_inside_the_guest():
    out = drive("def main(input):\n    while True:\n        pass\n", limits=Limits(call_timeout_s=30),
                deadline=time.monotonic() + 0.5)
    assert out.trap.code == codes.TIMEOUT and "time limit" in out.trap.message


def test_fuel_counts_the_guests_code_not_the_interpreters_start_up():
    pytest.importorskip("wasmtime")
    out = drive("def main(input):\n    return sum(range(1000))\n", limits=Limits(fuel=5_000_000))
    assert out.result == 499500  # start-up alone costs more than 5M
    out = drive("def main(input):\n    while True:\n        pass\n", limits=Limits(fuel=5_000_000))
    assert out.trap.code == codes.TIMEOUT and "fuel" in out.trap.message


def test_a_memory_bomb_meets_memory_error_and_the_host_stays_flat():
    psutil = pytest.importorskip("psutil")
    bomb = """
        def main(input):
            hoard = []
            try:
                while True:
                    hoard.append(bytearray(1 << 20))
            except MemoryError:
                n = len(hoard)
                hoard.clear()
                return n
    """
    limits = Limits(memory_bytes=96 * 1024 * 1024)
    drive(bomb, limits=limits)  # warm up
    rss = psutil.Process().memory_info().rss
    for _ in range(3):
        out = drive(bomb, limits=limits)
        assert 10 < out.result < 96
    assert psutil.Process().memory_info().rss - rss < 64 * 1024 * 1024


def test_an_uncaught_memory_bomb_ends_its_job_only():
    out = drive("def main(input):\n    x = [bytearray(1 << 20) for _ in range(10_000)]\n",
                limits=Limits(memory_bytes=64 * 1024 * 1024))
    if out.trap is not None:
        assert out.trap.code == codes.LIMIT_EXCEEDED
    else:
        assert out.failure.code == codes.SCRIPT_ERROR and "MemoryError" in out.failure.message


def test_deep_recursion_is_a_recursion_error_with_a_bounded_traceback():
    out = drive("def f(n):\n    return f(n + 1)\n\ndef main(input):\n    return f(0)\n")
    f = out.failure
    assert f.code == codes.SCRIPT_ERROR and "RecursionError" in f.message
    assert len(f.message) < 20_000


def test_recursion_past_the_wasm_stack_is_a_trap_not_a_crash(healthy):
    out = drive("""
        import sys
        def main(input):
            a = []
            for _ in range(200_000):
                a = [a]
            return repr(a)[:10]
    """)
    assert out.trap is not None and out.trap.code == codes.WASM_TRAP and "stack overflow" in out.trap.message


@pytest.mark.slow
def test_a_print_flood_is_bounded():
    out = drive("""
        def main(input):
            for i in range(200_000):
                print("line", i, "x" * 50)
            return "done"
    """, limits=Limits(call_timeout_s=60))
    assert out.result == "done"
    kept = out.log_lines()
    assert 0 < sum(len(x) + 1 for x in kept) <= MAX_LOG_BYTES
    dropped = [f for t, f in out.events if t == "job.log" and f.get("dropped")]
    assert dropped and dropped[-1]["dropped"] > 100_000


def test_a_huge_line_is_cut():
    out = drive("def main(input):\n    print('y' * 1_000_000)\n    return 1\n")
    [line] = out.log_lines()
    assert len(line) < 3000 and line.endswith("more characters)")


def test_a_huge_result_is_refused():
    out = drive("def main(input):\n    return 'z' * (20 * 1024 * 1024)\n",
                limits=Limits(call_timeout_s=30, max_command_bytes=1024 * 1024))
    assert out.trap.code == codes.LIMIT_EXCEEDED


PROBES = """
    import os, sys
    def main(input):
        out = {}
        def probe(name, f):
            try:
                out[name] = repr(f())[:80]
            except BaseException as e:
                out[name] = "refused: " + type(e).__name__
        probe("open", lambda: open("/etc/passwd").read())
        probe("open_rel", lambda: open("cell.py").read())
        probe("listdir", lambda: os.listdir("/"))
        probe("environ", lambda: dict(os.environ))
        probe("getenv", lambda: os.getenv("HOME"))
        probe("argv", lambda: sys.argv)
        probe("socket", lambda: __import__("socket"))
        probe("ctypes", lambda: __import__("ctypes"))
        probe("subprocess", lambda: __import__("subprocess"))
        probe("host_package", lambda: __import__("tensorjob_jupyter"))
        probe("system", lambda: os.system("id"))
        probe("urllib", lambda: __import__("urllib.request"))
        return out
"""


def test_no_host_files_network_environment_or_host_python_is_reachable():
    r = drive(PROBES).result
    for name in ("open", "open_rel", "listdir", "socket", "ctypes", "subprocess", "host_package", "system",
                 "urllib"):
        assert r[name].startswith("refused:"), (name, r[name])
    assert r["environ"] == "{}" and r["getenv"] == "None" and r["argv"] in ("[]", "['']")


def test_sleep_is_a_host_call_cancel_reaches():
    out = drive("import time\ndef main(input):\n    time.sleep(0.2)\n    return 1\n")
    assert out.result == 1 and out.seconds >= 0.2
    out = drive("import time\ndef main(input):\n    time.sleep(3600)\n", limits=Limits(call_timeout_s=2))
    assert out.trap.code == codes.WASM_TRAP and "time.sleep" in out.trap.message
    out = drive("import time\ndef main(input):\n    time.sleep(20)\n", limits=Limits(call_timeout_s=30),
                cancel_after=0.3)
    assert out.trap.code == codes.CANCELLED and out.seconds < 5


def test_exit_ends_the_job_not_the_host():
    out = drive("import sys\ndef main(input):\n    sys.exit(3)\n")
    assert out.failure.code == codes.SCRIPT_ERROR and "SystemExit" in out.failure.message
    out = drive("import os\ndef main(input):\n    os._exit(0)\n")
    assert out.trap.code == codes.WASM_TRAP and "exit" in out.trap.message


def test_sys_modules_tricks_reach_only_the_protocol():
    # The raw host functions: a command out of turn is refused, a well-formed one is just a command.
    out = drive("""
        import sys
        def main(input):
            host = sys.modules["wit_world.imports.host"]
            host.verdict(True)
    """)
    assert out.trap.code == codes.WASM_TRAP and "protocol" in out.trap.message
    out = drive("""
        import sys
        def main(input):
            host = sys.modules["wit_world.imports.host"]
            return host.command('{"cmd":"emit","progress":"raw"}', False)
    """)
    assert out.commands[0].to_json() == {"cmd": "emit", "progress": "raw"}
    assert out.result == 'E{"event":"emitted"}'
    # Replacing the guest API's pieces changes only this guest's own behaviour.
    out = drive("""
        import tensorjob as tj
        def main(input):
            tj._host = None
            tj.emit(1)
    """)
    assert out.failure.code == codes.SCRIPT_ERROR


@pytest.mark.parametrize("call,binding", [("host.log(300, 'x')", "log"), ("host.read_input(-1, 2)", "read-input"),
                                          ("host.read_input(2 ** 40, 2)", "read-input"), ("host.sleep(-5)", "sleep"),
                                          ("host.command(5, False)", "command")])
def test_a_raw_binding_called_with_a_value_out_of_its_range_is_a_wasm_trap_not_out_of_memory(call, binding):
    # componentize-py's bindings abort the interpreter on a value their WIT type cannot hold: the
    # guest's doing, reported as a trap in the binding it called -- memory has nothing to do with it
    out = drive(f"""
        import sys
        def main(input):
            host = sys.modules["wit_world.imports.host"]
            {call}
    """)
    assert out.trap.code == codes.WASM_TRAP, out.trap
    assert f"(`{binding}`)" in out.trap.message and "memory" not in out.trap.message
    assert drive("def main(input):\n    return 1\n").result == 1  # the next guest is unharmed


def test_interpreters_are_isolated_from_each_other():
    a = drive("import tensorjob as tj\ndef main(input):\n    tj.SECRET = 1\n    return 1\n")
    b = drive("import tensorjob as tj\ndef main(input):\n    return hasattr(tj, 'SECRET')\n")
    assert a.result == 1 and b.result is False


def test_many_guests_at_once_on_threads():
    results = []

    def one(i):
        results.append(drive(f"def main(input):\n    return {i} * 2\n").result)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [i * 2 for i in range(6)]


# --- Hypothesis over the guest-side API's arguments ---------------------------------------------

json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                        max_size=4),
                           max_leaves=12)
calls = st.one_of(
    st.tuples(st.just("emit"), json_values),
    st.tuples(st.just("embed"), st.one_of(st.text(max_size=30), st.lists(st.text(max_size=10), max_size=4),
                                          st.integers())),
    st.tuples(st.just("infer"), st.fixed_dictionaries({}, optional={
        "max_tokens": st.integers(-5, 10**12), "temperature": st.floats(allow_nan=True),
        "top_p": st.floats(-1, 2), "top_k": st.integers(-3, 10**6), "seed": st.integers(-2**70, 2**70),
        "stop": st.one_of(st.text(max_size=5), st.lists(st.text(max_size=300), max_size=20)),
        "format": st.one_of(st.just("json"), st.just("text"), st.dictionaries(st.text(max_size=5), json_values,
                                                                             max_size=3))})),
    st.tuples(st.just("open"), st.text(max_size=40)),
    st.tuples(st.just("fail"), st.tuples(st.text(max_size=20), st.text(max_size=40))),
)


@settings(max_examples=40)
@given(st.lists(calls, min_size=1, max_size=4))
def test_any_guest_api_arguments_end_in_a_value_or_a_clean_failure(program):
    """Whatever the guest passes, the job ends as a result, the guest's own exception, or a clean code."""
    guest = """
        import json, tensorjob as tj
        def main(input):
            for name, arg in input:
                if name == "infer":
                    tj.infer("p", **arg).text
                elif name == "fail":
                    tj.fail(*arg)
                elif name == "open":
                    tj.open(arg)
                else:
                    getattr(tj, name)(arg)
            return "ok"
    """
    try:
        payload = json.loads(json.dumps(program, allow_nan=False))
    except ValueError:
        payload = json.loads(json.dumps(program).replace("NaN", "null").replace("Infinity", "1e308"))
    out = drive(guest, payload)
    if out.trap is not None:
        assert out.trap.code in (codes.TIMEOUT, codes.LIMIT_EXCEEDED), out.trap
    else:
        assert isinstance(out.command, (abi.Done, abi.Fail))
        if isinstance(out.command, abi.Fail) and out.command.code == codes.SCRIPT_ERROR:
            assert "Traceback" in out.command.message or "Error" in out.command.message


def test_the_interpreter_fits_a_pool_slot_of_the_shape_it_is_given(tmp_path):
    """A pooled engine's slots are counted for ``_POOL_SHAPE`` a guest; an interpreter holding more core instances,
    memories or tables than that would be refused once many ran. On a pool with room for exactly one guest of that
    shape, one starts and answers."""
    import wat
    from tensorjob_jupyter.sandbox.guest import Guest

    with Guest(wat.script_guest([{"cmd": "done", "result": 1}])) as probe:
        if probe._shared.key[-1] != "pooled":
            pytest.skip("this process makes no pool (see engines._reservable)")
    guest = tmp_path / "g.py"
    guest.write_text('import tensorjob as tj\ndef main(input):\n    return tj.infer("hi", max_tokens=2).text\n')
    script = f"""
from tensorjob_jupyter.sandbox import engines
engines.POOL_GUESTS, engines.POOL_MARGIN = 1, 0
import tensorjob_jupyter as tj
from tensorjob_jupyter.inference.scripted import ScriptedBackend
env = tj.run({str(guest)!r}, backend=ScriptedBackend("a b"), runs_dir={str(tmp_path / "runs")!r})
assert env.ok and env.result == "a b", env
assert any(k[0] == "python" and k[-1] == "pooled" for k in engines._ENGINES), list(engines._ENGINES)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]

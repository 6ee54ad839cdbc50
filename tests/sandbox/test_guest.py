"""Loading guests and holding them to their limits: every limit meets a guest that tries to break it."""

import os
import time

import psutil
import pytest

import tensorjob_jupyter as tj
from tensorjob_jupyter.abi import JobStatus, codes
from tensorjob_jupyter.sandbox.guest import MODULE_CACHE, Guest, GuestTrap
from tensorjob_jupyter.inference import ScriptedBackend

import wat

DONE = {"cmd": "done", "result": 1}


def failed(env, code):
    assert env.status is (JobStatus.CANCELLED if code == codes.CANCELLED else JobStatus.FAILED), env
    assert env.error.code == code, env
    assert env.result is None
    return env.error.message


# --- loading and validation ---------------------------------------------------------------


def test_bytes_that_are_not_wasm_fail_as_a_trap(healthy):
    with pytest.raises(ValueError, match="not a WebAssembly module"):
        tj.Job(b"hello, I am text")  # bytes are a module, never source text
    with pytest.raises(GuestTrap, match="not a WebAssembly module"):
        Guest(b"hello, I am text")
    assert "invalid WebAssembly module" in failed(tj.run(b"\0asm\x01\0\0\0garbage"), codes.WASM_TRAP)


def test_the_same_bytes_compile_once():
    wasm = wat.script_guest([{"cmd": "done", "result": "unique-" + str(time.time())}])
    before = MODULE_CACHE.stats.compiles
    assert tj.run(wasm).ok
    assert MODULE_CACHE.stats.compiles == before + 1
    hits = MODULE_CACHE.stats.hits
    assert tj.run(wasm).ok
    assert MODULE_CACHE.stats.compiles == before + 1
    assert MODULE_CACHE.stats.hits == hits + 1


MISSING_STEP = """(module (memory (export "memory") 1)
  (func (export "cf_alloc") (param i32) (result i32) i32.const 0)
  (func (export "cf_init") (param i32 i32) (result i32) i32.const 0))"""

WRONG_ALLOC = """(module (memory (export "memory") 1)
  (func (export "cf_alloc") (param i64) (result i32) i32.const 0)
  (func (export "cf_init") (param i32 i32) (result i32) i32.const 0)
  (func (export "cf_step") (param i32 i32) (result i32) i32.const 0))"""

NO_MEMORY = """(module
  (func (export "cf_alloc") (param i32) (result i32) i32.const 0)
  (func (export "cf_init") (param i32 i32) (result i32) i32.const 0)
  (func (export "cf_step") (param i32 i32) (result i32) i32.const 0))"""

MEMORY64 = """(module (memory (export "memory") i64 1)
  (func (export "cf_alloc") (param i32) (result i32) i32.const 0)
  (func (export "cf_init") (param i32 i32) (result i32) i32.const 0)
  (func (export "cf_step") (param i32 i32) (result i32) i32.const 0))"""

BAD_ON_TOKEN = """(module (memory (export "memory") 1)
  (func (export "cf_alloc") (param i32) (result i32) i32.const 0)
  (func (export "cf_init") (param i32 i32) (result i32) i32.const 0)
  (func (export "cf_step") (param i32 i32) (result i32) i32.const 0)
  (func (export "cf_on_token") (param i32) (result i32) i32.const 0))"""

IMPORTS_FS = """(module (import "wasi_snapshot_preview1" "fd_write" (func (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (func (export "cf_alloc") (param i32) (result i32) i32.const 0)
  (func (export "cf_init") (param i32 i32) (result i32) i32.const 0)
  (func (export "cf_step") (param i32 i32) (result i32) i32.const 0))"""


@pytest.mark.parametrize("text, fragment", [
    (MISSING_STEP, "does not export `cf_step` (i32 ptr, i32 len) -> i32 desc_ptr"),
    (WRONG_ALLOC, "export `cf_alloc` has the wrong type: expected (i32 len) -> i32 ptr, got (i64) -> (i32)"),
    (NO_MEMORY, "guest exports no memory"),
    (MEMORY64, "64-bit memory"),
    (BAD_ON_TOKEN, "export `cf_on_token` has the wrong type"),
    (IMPORTS_FS, "imports `wasi_snapshot_preview1::fd_write`, which this host does not provide"),
])
def test_a_wrong_guest_is_a_trap_with_a_message_naming_the_problem(text, fragment):
    assert fragment in failed(tj.run(wat.wat(text)), codes.WASM_TRAP)


def test_memory_declared_larger_than_the_limit_is_refused_up_front():
    text = MISSING_STEP.replace('"memory") 1', '"memory") 100')
    msg = failed(tj.run(wat.wat(text), limits=tj.Limits(memory_bytes=1 << 20)), codes.WASM_TRAP)
    assert "starts at 100 pages" in msg and "memory limit" in msg


# --- hostile descriptors and commands ---------------------------------------------------------


def guest_returning(desc_expr: str, data: str = "") -> bytes:
    return wat.wat(f"""(module (memory (export "memory") 1)
      {data}
      (func (export "cf_alloc") (param i32) (result i32) i32.const 1024)
      (func (export "cf_init") (param i32 i32) (result i32) {desc_expr})
      (func (export "cf_step") (param i32 i32) (result i32) {desc_expr}))""")


def test_a_descriptor_pointing_outside_memory_is_a_trap(healthy):
    msg = failed(tj.run(guest_returning("i32.const -16")), codes.WASM_TRAP)
    assert "descriptor returned by `cf_init`" in msg and "outside guest memory" in msg


def test_a_descriptor_whose_payload_runs_past_memory_is_a_trap():
    # desc at 16 says: ptr 65000, len 100000 -> beyond the single page.
    data = '(data (i32.const 16) "\\e8\\fd\\00\\00\\a0\\86\\01\\00")'
    msg = failed(tj.run(guest_returning("i32.const 16", data)), codes.WASM_TRAP)
    assert "command returned by `cf_init`" in msg and "outside guest memory" in msg


def test_a_command_of_invalid_json_is_a_trap_naming_the_problem():
    data = '(data (i32.const 16) "\\20\\00\\00\\00\\0d\\00\\00\\00") (data (i32.const 32) "{\\"cmd\\":\\"zap\\"}")'
    msg = failed(tj.run(guest_returning("i32.const 16", data)), codes.WASM_TRAP)
    assert "`cf_init` returned an invalid command: unknown command `zap`" in msg


def test_cf_alloc_returning_a_pointer_outside_memory_is_a_trap():
    g = wat.wat("""(module (memory (export "memory") 1)
      (func (export "cf_alloc") (param i32) (result i32) i32.const 65530)
      (func (export "cf_init") (param i32 i32) (result i32) i32.const 0)
      (func (export "cf_step") (param i32 i32) (result i32) i32.const 0))""")
    assert "cf_alloc(" in failed(tj.run(g, input={"pad": "x" * 64}), codes.WASM_TRAP)


def test_a_guest_trap_is_reported_as_wasm_trap(healthy):
    g = wat.script_guest([DONE], init_body="(unreachable)")
    assert "guest trapped in `cf_init`" in failed(tj.run(g), codes.WASM_TRAP)


def test_the_guest_fail_command_passes_code_and_message_verbatim():
    env = tj.run(wat.script_guest([{"cmd": "fail", "code": "schema_validation_failed", "message": "no path"}]))
    assert failed(env, "schema_validation_failed") == "no path"


# --- time ------------------------------------------------------------------------------------


@pytest.mark.parametrize("guest", [wat.spin_in_init, wat.spin_in_step])
def test_an_infinite_loop_ends_with_timeout_within_twice_the_deadline(guest, healthy):
    started = time.monotonic()
    msg = failed(tj.run(guest(), limits=tj.Limits(call_timeout_s=0.5)), codes.TIMEOUT)
    elapsed = time.monotonic() - started
    assert 0.45 <= elapsed < 1.0, elapsed
    assert "0.5 s deadline" in msg


def test_an_infinite_loop_in_cf_on_token_ends_with_timeout(healthy):
    g = wat.script_guest([{"cmd": "infer", "prompt": "p", "max_tokens": 4}, DONE],
                         extra='(func (export "cf_on_token") (param i32 i32) (result i32) (loop $l (br $l)) (i32.const 0))')
    msg = failed(tj.run(g, backend=ScriptedBackend("a b c"), limits=tj.Limits(call_timeout_s=0.3)), codes.TIMEOUT)
    assert "cf_on_token" in msg


def test_the_default_call_deadline_is_at_most_ten_seconds():
    assert tj.Limits().call_timeout_s <= 10


def test_the_job_timeout_ends_a_guest_that_never_finishes(healthy):
    forever = wat.script_guest([{"cmd": "emit", "progress": "tick"}])  # emits forever
    started = time.monotonic()
    msg = failed(tj.run(forever, limits=tj.Limits(job_timeout_s=0.4)), codes.TIMEOUT)
    assert time.monotonic() - started < 2.0
    assert "time limit of 0.4 s" in msg


def test_fuel_bounds_the_work_of_a_spinning_guest(healthy):
    msg = failed(tj.run(wat.spin_in_init(), limits=tj.Limits(fuel=2_000_000)), codes.TIMEOUT)
    assert "fuel" in msg


def test_fuel_is_enough_for_an_honest_guest():
    assert tj.run(wat.script_guest([{"cmd": "emit", "progress": 1}, DONE]), limits=tj.Limits(fuel=1_000_000)).ok


# --- memory and stack ---------------------------------------------------------------------------


def test_a_memory_bomb_gets_grow_failures_and_the_host_stays_small(healthy):
    rss = psutil.Process(os.getpid()).memory_info().rss
    job = tj.Job(wat.memory_bomb(), limits=tj.Limits(memory_bytes=16 << 20)).start()
    env = job.wait(30)
    assert env.ok and env.result == "survived"  # memory.grow returned -1; the guest carried on
    assert job.stats.peak_memory_bytes <= 16 << 20
    assert psutil.Process(os.getpid()).memory_info().rss - rss < 64 << 20


def test_a_guest_that_writes_past_its_memory_traps_cleanly(healthy):
    g = wat.script_guest([DONE], init_body="(i32.store (i32.const 0x7ffffff0) (i32.const 1)) (call $next)")
    assert "out of bounds" in failed(tj.run(g), codes.WASM_TRAP)


def test_deep_recursion_is_a_trap_not_a_crash(healthy):
    msg = failed(tj.run(wat.deep_recursion(), limits=tj.Limits(stack_bytes=256 << 10)), codes.WASM_TRAP)
    assert "stack overflow" in msg


# --- steps, emits -------------------------------------------------------------------------------


def test_max_steps_ends_a_guest_that_never_finishes(healthy):
    forever = wat.script_guest([{"cmd": "emit", "progress": "tick"}])
    job = tj.Job(forever, limits=tj.Limits(max_steps=50)).start()
    msg = failed(job.wait(30), codes.LIMIT_EXCEEDED)
    assert "max_steps" in msg
    assert job.stats.steps == 50


def test_an_oversized_emit_payload_is_refused(healthy):
    g = wat.script_guest([{"cmd": "emit", "progress": "x" * 2000}, DONE])
    msg = failed(tj.run(g, limits=tj.Limits(max_emit_bytes=1024)), codes.LIMIT_EXCEEDED)
    assert "max_emit_bytes" in msg


def test_a_command_larger_than_the_limit_is_refused():
    g = wat.script_guest([{"cmd": "done", "result": "y" * 5000}])
    assert "over the 4096-byte limit" in failed(tj.run(g, limits=tj.Limits(max_command_bytes=4096)), codes.WASM_TRAP)


# --- cancellation ----------------------------------------------------------------------------------


def test_cancel_stops_a_guest_spinning_inside_cf_step(healthy):
    job = tj.Job(wat.spin_in_step(), limits=tj.Limits(call_timeout_s=10)).start()
    time.sleep(0.3)
    started = time.monotonic()
    job.cancel()
    env = job.wait(5)
    assert time.monotonic() - started < 0.5
    assert failed(env, codes.CANCELLED) == "job cancelled"


def test_cancel_before_start_yields_cancelled():
    job = tj.Job(wat.script_guest([DONE]))
    job.cancel()
    assert failed(job.start().wait(5), codes.CANCELLED)


def test_a_guest_interrupted_directly_reports_cancelled():
    with Guest(wat.spin_in_init(), tj.Limits(call_timeout_s=10)) as g:
        import threading
        threading.Timer(0.1, g.interrupt).start()
        with pytest.raises(GuestTrap) as info:
            g.init(b"{}")
        assert info.value.code == codes.CANCELLED


# --- limits found by review: the host's own memory and the shared model -----------------------


def test_emitting_without_end_is_bounded_by_the_event_budget(healthy):
    spam = wat.script_guest([{"cmd": "emit", "progress": "x" * 30_000}])  # forever
    job = tj.Job(spam, limits=tj.Limits(max_event_bytes=2 << 20)).start()
    msg = failed(job.wait(30), codes.LIMIT_EXCEEDED)
    assert "max_event_bytes" in msg
    assert job.stream.bytes <= (2 << 20) + 64 * 1024  # the terminal event is let through
    assert job.transcript_path.stat().st_size <= (2 << 20) + 64 * 1024


def test_an_embed_over_its_limits_is_refused(healthy):
    many = wat.script_guest([{"cmd": "embed", "texts": ["a"] * 300}, DONE])
    assert "max_embed_texts" in failed(tj.run(many, backend=ScriptedBackend("x")), codes.LIMIT_EXCEEDED)
    big = wat.script_guest([{"cmd": "embed", "texts": ["y" * 5000]}, DONE])
    msg = failed(tj.run(big, backend=ScriptedBackend("x"), limits=tj.Limits(max_embed_bytes=4096)), codes.LIMIT_EXCEEDED)
    assert "max_embed_bytes" in msg


def test_asking_for_zero_tokens_generates_none():
    g = wat.script_guest([{"cmd": "infer", "prompt": "p", "max_tokens": 0}, DONE])
    env = tj.run(g, backend=ScriptedBackend("a b c"), limits=tj.Limits(max_tokens=5))
    assert env.ok and env.usage.tokens_out == 0


@pytest.mark.slow
def test_a_guest_slow_in_cf_on_token_does_not_hold_the_shared_model():
    # ~tens of ms per token of pure guest work, on purpose (well inside the deadline)
    slow_on_token = """(func (export "cf_on_token") (param i32 i32) (result i32)
        (local $i i32) (local.set $i (i32.const 300000000))
        (loop $l (local.set $i (i32.sub (local.get $i) (i32.const 1))) (br_if $l (local.get $i)))
        (i32.const 0))"""
    infer = {"cmd": "infer", "prompt": "p", "max_tokens": 30}
    backend = ScriptedBackend(" ".join(["w"] * 30))
    slow = tj.Job(wat.script_guest([infer, DONE], extra=slow_on_token), backend=backend).start()
    time.sleep(0.05)
    started = time.monotonic()
    quick = tj.Job(wat.script_guest([infer, DONE]), backend=backend).start()
    assert quick.wait(30).ok
    quick_s = time.monotonic() - started
    assert slow.wait(60).ok
    slow_s = time.monotonic() - started
    assert quick_s < slow_s / 2, (quick_s, slow_s)  # the quick job did not wait for the slow guest


def test_a_guest_failing_with_code_cancelled_is_still_failed():
    env = tj.run(wat.script_guest([{"cmd": "fail", "code": "cancelled", "message": "not really"}]))
    assert env.status is JobStatus.FAILED and env.error.code == "cancelled"


def test_out_of_range_numbers_are_refused_as_a_trap(healthy):
    for raw in ('{"cmd":"done","result":1e999}', '{"cmd":"done","result":' + "9" * 5000 + "}"):
        g = wat.script_guest([raw.encode()])
        msg = failed(tj.run(g), codes.WASM_TRAP)
        assert "invalid command" in msg

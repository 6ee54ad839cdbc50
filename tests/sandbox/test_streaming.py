"""The wasi:tensor/host@0.1.0 streaming imports, with guests that probe every return code.

Each guest checks the return code it expects and traps (``unreachable``) if
the host answered anything else, so a completed job proves the code.
"""

import base64

import pytest

import tensorjob_jupyter as tj
from tensorjob_jupyter.abi import codes

import wat

DONE = {"cmd": "done", "result": "ok"}

IMPORTS = """
  (import "wasi:tensor/host@0.1.0" "emit-chunk" (func $emit (param i32 i32) (result i32)))
  (import "wasi:tensor/host@0.1.0" "flush" (func $flush (result i32)))
  (import "wasi:tensor/host@0.1.0" "input-len" (func $input_len (result i32)))
  (import "wasi:tensor/host@0.1.0" "read-input" (func $read_input (param i32 i32) (result i32)))
"""

TEXT_AT = 0x8000  # a data area inside the 2-page guest memory


def expect(call: str, code: int) -> str:
    return f"(if (i32.ne {call} (i32.const {code})) (then (unreachable)))"


def streaming_guest(body: str, data: str = "", module: str = "wasi:tensor/host@0.1.0") -> bytes:
    imports = IMPORTS.replace("wasi:tensor/host@0.1.0", module)
    return wat.script_guest([DONE], imports=imports + data, init_body=body + " (call $next)")


def chunks(job):
    return [base64.b64decode(e["bytes_base64"]) for e in job.events if e["type"] == "job.chunk"]


def run(guest, **kwargs):
    job = tj.Job(guest, **kwargs).start()
    job.wait(30)
    return job


def test_chunks_reach_the_stream_in_order():
    data = f'(data (i32.const {TEXT_AT}) "first|second|third")'
    body = (expect(f"(call $emit (i32.const {TEXT_AT}) (i32.const 5))", 0)
            + expect(f"(call $emit (i32.const {TEXT_AT + 6}) (i32.const 6))", 0)
            + expect("(call $flush)", 0)
            + expect(f"(call $emit (i32.const {TEXT_AT + 13}) (i32.const 5))", 0))
    job = run(streaming_guest(body, data))
    assert job.envelope.ok, job.envelope
    assert chunks(job) == [b"first", b"second", b"third"]
    assert [e["text"] for e in job.events if e["type"] == "job.chunk"] == ["first", "second", "third"]
    assert job.stats.chunks == 3 and job.stats.stream_bytes == 16


def test_the_unversioned_module_name_works_too():
    data = f'(data (i32.const {TEXT_AT}) "hi")'
    job = run(streaming_guest(expect(f"(call $emit (i32.const {TEXT_AT}) (i32.const 2))", 0), data,
                              module="wasi:tensor/host"))
    assert job.envelope.ok and chunks(job) == [b"hi"]


@pytest.mark.parametrize("ptr, length", [
    (0x1FFFF, 2),         # runs off the end of memory
    (0x7FFFFFF0, 4),      # far outside
    (-1, 4),              # negative pointer
    (0, -5),              # negative length
])
def test_any_pointer_range_outside_memory_is_minus_two_never_a_crash(ptr, length, healthy):
    job = run(streaming_guest(expect(f"(call $emit (i32.const {ptr}) (i32.const {length}))", -2)
                              + expect(f"(call $read_input (i32.const {ptr}) (i32.const {length}))", -2)),
              input_bytes=b"staged input bytes")
    assert job.envelope.ok, job.envelope
    assert chunks(job) == []


def test_the_per_chunk_cap_is_minus_two():
    job = run(streaming_guest(expect("(call $emit (i32.const 0) (i32.const 1025))", -2)
                              + expect("(call $emit (i32.const 0) (i32.const 1024))", 0)),
              limits=tj.Limits(max_chunk_bytes=1024))
    assert job.envelope.ok, job.envelope
    assert [len(c) for c in chunks(job)] == [1024]


def test_the_per_job_cap_is_minus_two_once_spent():
    body = (expect("(call $emit (i32.const 0) (i32.const 600))", 0)
            + expect("(call $emit (i32.const 0) (i32.const 400))", 0)
            + expect("(call $emit (i32.const 0) (i32.const 1))", -2))
    job = run(streaming_guest(body), limits=tj.Limits(max_chunk_bytes=1000, max_stream_bytes=1000))
    assert job.envelope.ok, job.envelope
    assert sum(len(c) for c in chunks(job)) == 1000


def test_read_input_serves_the_staged_bytes():
    staged = "staged ü input".encode()
    n = len(staged)
    body = (expect("(call $input_len)", n)
            + expect(f"(call $read_input (i32.const {TEXT_AT}) (i32.const 1000))", n)
            + expect(f"(call $emit (i32.const {TEXT_AT}) (i32.const {n}))", 0)
            + expect(f"(call $read_input (i32.const {TEXT_AT}) (i32.const 6))", 6)
            + expect(f"(call $read_input (i32.const {TEXT_AT}) (i32.const 0))", 0))
    job = run(streaming_guest(body), input_bytes=staged)
    assert job.envelope.ok, job.envelope
    assert chunks(job) == [staged]


def test_nothing_staged_reads_zero():
    job = run(streaming_guest(expect("(call $input_len)", 0)
                              + expect(f"(call $read_input (i32.const {TEXT_AT}) (i32.const 10))", 0)))
    assert job.envelope.ok, job.envelope


def test_binary_chunks_are_kept_exactly():
    data = f'(data (i32.const {TEXT_AT}) "\\ff\\00\\fe")'
    job = run(streaming_guest(expect(f"(call $emit (i32.const {TEXT_AT}) (i32.const 3))", 0), data))
    assert chunks(job) == [b"\xff\x00\xfe"]
    assert next(e for e in job.events if e["type"] == "job.chunk")["text"] is None


def test_an_import_the_host_does_not_offer_is_named():
    g = wat.script_guest([DONE], imports='(import "wasi:tensor/host@0.1.0" "launch-missiles" (func))')
    env = tj.run(g)
    assert env.error.code == codes.WASM_TRAP and "launch-missiles" in env.error.message

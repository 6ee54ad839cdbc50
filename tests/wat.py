"""Hand-written WAT guests for host tests: scripted command sequences and hostile guests.

``script_guest`` builds a module that answers ``cf_init`` and each ``cf_step``
with the next of a fixed list of commands (repeating the last), so a test can
drive the reactor through any sequence without a compiler. The other builders
are guests that try to break a limit.
"""

from __future__ import annotations

import json

import wasmtime

HEAP = 0x10000  # scratch for host writes; commands live below it
DATA = 0x100


def _bytes_literal(data: bytes) -> str:
    return "".join(f"\\{b:02x}" for b in data)


def _alloc_fn(heap: int = HEAP) -> str:
    return f"""
  (func (export "cf_alloc") (param $n i32) (result i32)
    (local $need i32)
    (local.set $need (i32.shr_u (i32.add (i32.add (i32.const {heap}) (local.get $n)) (i32.const 65535))
                                (i32.const 16)))
    (if (i32.gt_u (local.get $need) (memory.size))
      (then (drop (memory.grow (i32.sub (local.get $need) (memory.size))))))
    (i32.const {heap}))"""


def script_wat(commands: list, *, stop_after_tokens: int | None = None, imports: str = "",
               init_body: str | None = None, step_prelude: str = "", extra: str = "") -> str:
    blobs = [c if isinstance(c, bytes) else (c.encode() if isinstance(c, str) else
                                                json.dumps(c, separators=(",", ":")).encode())
             for c in commands]
    table = DATA
    offset = DATA + 8 * len(blobs)
    descs = b""
    payload = b""
    for blob in blobs:
        descs += (offset + len(payload)).to_bytes(4, "little") + len(blob).to_bytes(4, "little")
        payload += blob
    assert offset + len(payload) < HEAP, "script too large for the data area"
    on_token = ""
    if stop_after_tokens is not None:
        on_token = f"""
  (global $tokens (mut i32) (i32.const 0))
  (func (export "cf_on_token") (param i32 i32) (result i32)
    (global.set $tokens (i32.add (global.get $tokens) (i32.const 1)))
    (i32.ge_u (global.get $tokens) (i32.const {stop_after_tokens})))"""
    init = init_body if init_body is not None else "(call $next)"
    return f"""(module
  {imports}
  (memory (export "memory") 2)
  (global $i (mut i32) (i32.const 0))
  (data (i32.const {table}) "{_bytes_literal(descs + payload)}")
  {_alloc_fn()}
  (func $next (result i32)
    (local $d i32)
    (local.set $d (i32.add (i32.const {table}) (i32.mul (global.get $i) (i32.const 8))))
    (if (i32.lt_u (global.get $i) (i32.const {len(blobs) - 1}))
      (then (global.set $i (i32.add (global.get $i) (i32.const 1)))))
    (local.get $d))
  (func (export "cf_init") (param i32 i32) (result i32) {init})
  (func (export "cf_step") (param i32 i32) (result i32) {step_prelude} (call $next))
  {on_token}
  {extra}
)"""


def script_guest(commands: list, **kwargs) -> bytes:
    return bytes(wasmtime.wat2wasm(script_wat(commands, **kwargs)))


def wat(text: str) -> bytes:
    return bytes(wasmtime.wat2wasm(text))


SPIN = "(loop $l (br $l)) (unreachable)"


def spin_in_init() -> bytes:
    return script_guest([{"cmd": "done", "result": 1}], init_body=SPIN)


def spin_in_step() -> bytes:
    return script_guest([{"cmd": "emit", "progress": 1}, {"cmd": "done", "result": 1}],
                        step_prelude="(loop $l (br $l))")


def memory_bomb() -> bytes:
    """Grows memory one page at a time until refused, then reports done."""
    return script_guest([{"cmd": "done", "result": "survived"}], init_body="""
      (block $out (loop $l
        (br_if $out (i32.eq (memory.grow (i32.const 16)) (i32.const -1)))
        (br $l)))
      (call $next)""")


def deep_recursion() -> bytes:
    return script_guest([{"cmd": "done", "result": 1}], init_body="(call $down (i32.const 0))",
                        extra="""(func $down (param i32) (result i32)
                                   (i32.add (call $down (i32.add (local.get 0) (i32.const 1))) (i32.const 1)))""")


INPUT_BASE = 0x20000  # where the staged commands are read to; host writes go after them


def pack_commands(commands: list) -> bytes:
    """Raw commands for ``input_script_guest``: each as a u32 length, then its bytes."""
    out = bytearray()
    for c in commands:
        blob = c if isinstance(c, bytes) else json.dumps(c, separators=(",", ":")).encode()
        out += len(blob).to_bytes(4, "little") + blob
    return bytes(out)


def input_script_guest() -> bytes:
    """A guest that returns, byte for byte, the commands staged as the job's input bytes
    (``pack_commands``), one per call, repeating the last: any bytes, any size, one module."""
    return wat(f"""(module
  (import "wasi:tensor/host@0.1.0" "input-len" (func $input_len (result i32)))
  (import "wasi:tensor/host@0.1.0" "read-input" (func $read_input (param i32 i32) (result i32)))
  (memory (export "memory") 2)
  (global $loaded (mut i32) (i32.const 0))
  (global $cur (mut i32) (i32.const {INPUT_BASE}))
  (global $end (mut i32) (i32.const {INPUT_BASE}))
  (global $heap (mut i32) (i32.const {INPUT_BASE}))
  (func $fit (param $top i32)
    (local $need i32)
    (local.set $need (i32.shr_u (i32.add (local.get $top) (i32.const 65535)) (i32.const 16)))
    (if (i32.gt_u (local.get $need) (memory.size))
      (then (drop (memory.grow (i32.sub (local.get $need) (memory.size)))))))
  (func $load
    (local $n i32)
    (global.set $loaded (i32.const 1))
    (local.set $n (call $input_len))
    (call $fit (i32.add (i32.const {INPUT_BASE}) (local.get $n)))
    (drop (call $read_input (i32.const {INPUT_BASE}) (local.get $n)))
    (global.set $end (i32.add (i32.const {INPUT_BASE}) (local.get $n)))
    (global.set $heap (i32.and (i32.add (global.get $end) (i32.const 15)) (i32.const -16))))
  (func (export "cf_alloc") (param $n i32) (result i32)
    (if (i32.eqz (global.get $loaded)) (then (call $load)))
    (call $fit (i32.add (global.get $heap) (local.get $n)))
    (global.get $heap))
  (func $next (result i32)
    (local $len i32)
    (if (i32.lt_u (global.get $cur) (global.get $end))
      (then
        (local.set $len (i32.load (global.get $cur)))
        (i32.store (i32.const 0x100) (i32.add (global.get $cur) (i32.const 4)))
        (i32.store (i32.const 0x104) (local.get $len))
        (global.set $cur (i32.add (global.get $cur) (i32.add (i32.const 4) (local.get $len))))))
    (i32.const 0x100))
  (func (export "cf_init") (param i32 i32) (result i32) (call $next))
  (func (export "cf_step") (param i32 i32) (result i32) (call $next))
  (func (export "cf_on_token") (param i32 i32) (result i32) (i32.const 0))
)""")

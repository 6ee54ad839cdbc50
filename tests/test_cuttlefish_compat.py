"""A block built with cuttlefish's Rust SDK runs here unchanged: the exact bytes, both ways.

README claims that cuttlefish proc-blocks built with the Rust SDK
(``cuttlefish-sdk``'s ``export_block!``) run on this host unchanged. This
test holds the claim to bytes. Its guest is WAT written to be, at the ABI
boundary, what ``export_block!`` compiles to (reference/cuttlefish.md,
sections 1 and 2):

* the exports rustc and the macro emit for ``wasm32-unknown-unknown``:
  ``memory`` (17 pages: a 1 MiB stack, then the data), the ``__data_end`` and
  ``__heap_base`` globals, and ``cf_alloc``, ``cf_signature``, ``cf_init``,
  ``cf_step``, ``cf_on_token``, every one with the SDK's wasm signature; no
  imports;
* ``cf_alloc`` hands out fresh memory and never frees it (the SDK leaks on
  purpose), and every answer is an 8-byte ``Desc`` (u32 ptr, u32 len, little
  endian) pointing at the JSON;
* every command is the byte string ``serde_json::to_vec`` writes for that
  ``Command`` variant: the ``"cmd"`` tag first, fields in declaration order,
  ``images: []`` on ``infer`` (serde writes the defaulted field too);
* ``cf_signature`` returns the serde JSON of the block's ``Signature``.

It walks the worked example of section 2.6 (open, slice, infer, done), with
a window that ends inside a character so the host must cut it back and the
block resumes from ``next_offset``, an ``emit``, and a file whose text needs
every kind of JSON escape. At each call the guest compares what the host
handed it -- the input, every event, every token -- byte for byte with what
cuttlefish's host would hand it (``serde_json::to_vec`` of the ``Event``:
the ``"event"`` tag first, fields in declaration order, ``kind`` as the
nested object ``{"kind":"text"}``, strings escaped as serde escapes them:
``\\"``, ``\\\\``, ``\\n``, ``\\t``, ``\\u00XX`` for other controls, and
everything else -- DEL, U+2028, ``</script>``, non-ASCII -- as raw UTF-8;
tokens as raw UTF-8 bytes, not JSON). The expected bytes below are written
out by hand from serde's rules, not produced by our encoder. A mismatch ends
the job with a ``fail`` naming the exchange.
"""

from __future__ import annotations

import json

import wasmtime

import tensorjob_jupyter as tj
from tensorjob_jupyter.inference import ScriptedBackend

# -- the file, and what cuttlefish's host would send for it ------------------------------------------

TEXT = 'Log "calm" \\ back\ttab\x01ctl\x7fdel \u2028ls </script> é 🎉 end\n'
DATA = TEXT.encode("utf-8")
EMOJI_AT = DATA.index("🎉".encode())
FIRST_LEN = EMOJI_AT + 2  # ends inside the 4-byte emoji: the host cuts the window back to EMOJI_AT

INPUT = b'{"path":"a.txt"}'
# (the host's answer to the previous command, the block's next command), as serde_json writes each.
EXCHANGES = [
    (None, b'{"cmd":"open","path":"a.txt"}'),
    (b'{"event":"opened","handle":0,"len":%d,"kind":{"kind":"text"}}' % len(DATA),
     b'{"cmd":"slice","handle":0,"offset":0,"len":%d}' % FIRST_LEN),
    (b'{"event":"sliced","text":"Log \\"calm\\" \\\\ back\\ttab\\u0001ctl\x7fdel \xe2\x80\xa8ls </script> \xc3\xa9 ",'
     b'"next_offset":%d}' % EMOJI_AT,
     b'{"cmd":"slice","handle":0,"offset":%d,"len":65536}' % EMOJI_AT),
    (b'{"event":"sliced","text":"\xf0\x9f\x8e\x89 end\\n","next_offset":%d}' % len(DATA),
     b'{"cmd":"infer","prompt":"Summarize the document between the markers","max_tokens":128,"images":[]}'),
    (b'{"event":"infer_done","text":"a stub r\xc3\xa9sum\xc3\xa9","tokens_out":3}',
     b'{"cmd":"emit","progress":{"done":1,"total":1}}'),
    (b'{"event":"emitted"}',
     b'{"cmd":"done","result":{"path":"a.txt","summary":"a stub r\xc3\xa9sum\xc3\xa9"}}'),
]
REPLY = "a stub résumé"  # the scripted model's words: tokens "a", " stub", " résumé"
TOKENS = [b"a", b" stub", b" r\xc3\xa9sum\xc3\xa9"]
SIGNATURE = b'{"input":"{path: text}","output":"{path: text, summary: text}"}'


def _fail(message: str) -> bytes:
    return json.dumps({"cmd": "fail", "code": "schema_validation_failed", "message": message},
                      separators=(",", ":")).encode()


# -- the block --------------------------------------------------------------------------------------

STACK_TOP = 1 << 20  # rustc's wasm32 layout: the shadow stack, then the data


def _lit(data: bytes) -> str:
    return "".join(f"\\{b:02x}" for b in data)


def sdk_block(input_json: bytes, exchanges: list, tokens: list, signature: bytes) -> bytes:
    """A module shaped as ``export_block!`` compiles, answering with ``exchanges``' commands
    when, and only when, the host sends exactly their events (and ``tokens``)."""
    blobs: list[bytes] = []

    def blob(data: bytes) -> int:
        blobs.append(data)
        return len(blobs) - 1

    commands = [blob(cmd) for _, cmd in exchanges]
    events = [blob(ev) for ev, _ in exchanges[1:]]
    token_blobs = [blob(t) for t in tokens]
    fails_event = [blob(_fail(f"exchange {i + 1}: the host's event differs from cuttlefish's bytes"))
                   for i in range(len(events))]
    fail_input = blob(_fail("the job input differs from cuttlefish's bytes"))
    fail_token = blob(_fail("a token's bytes differ from the raw UTF-8 cuttlefish hands cf_on_token"))
    fail_extra = blob(_fail("the host stepped the block past its last command"))
    input_blob = blob(input_json)
    sig = blob(signature)
    # Layout: one 8-byte Desc per blob, then the blobs.
    table = STACK_TOP
    payload_at = table + 8 * len(blobs)
    descs, payload = b"", b""
    for data in blobs:
        descs += (payload_at + len(payload)).to_bytes(4, "little") + len(data).to_bytes(4, "little")
        payload += data
    data_end = payload_at + len(payload)
    heap_base = (data_end + 15) & ~15

    def desc(i: int) -> int:
        return table + 8 * i

    def ptr_len(i: int) -> str:
        return f"(i32.load (i32.const {desc(i)})) (i32.load (i32.const {desc(i) + 4}))"

    n = len(events)
    event_checks = "\n".join(
        f"(if (i32.eq (local.get $i) (i32.const {i})) (then (return (if (result i32) "
        f"(call $eq (local.get $p) (local.get $n) {ptr_len(events[i])}) "
        f"(then (i32.const {desc(commands[i + 1])})) (else (i32.const {desc(fails_event[i])}))))))"
        for i in range(n))
    token_checks = "\n".join(
        f"(if (i32.eq (local.get $t) (i32.const {i})) (then (if (i32.eqz (call $eq (local.get $p) (local.get $n) "
        f"{ptr_len(token_blobs[i])})) (then (global.set $bad_token (i32.const 1))))))"
        for i in range(len(token_blobs)))
    return bytes(wasmtime.wat2wasm(f"""(module
  (memory (export "memory") 17)
  (global $__stack_pointer (mut i32) (i32.const {STACK_TOP}))
  (global (export "__data_end") i32 (i32.const {data_end}))
  (global (export "__heap_base") i32 (i32.const {heap_base}))
  (global $heap (mut i32) (i32.const {heap_base}))
  (global $step (mut i32) (i32.const 0))
  (global $token (mut i32) (i32.const 0))
  (global $bad_token (mut i32) (i32.const 0))
  (data (i32.const {table}) "{_lit(descs + payload)}")
  (func $eq (param $a i32) (param $alen i32) (param $b i32) (param $blen i32) (result i32)
    (local $k i32)
    (if (i32.ne (local.get $alen) (local.get $blen)) (then (return (i32.const 0))))
    (block $done (loop $next
      (br_if $done (i32.ge_u (local.get $k) (local.get $alen)))
      (if (i32.ne (i32.load8_u (i32.add (local.get $a) (local.get $k)))
                  (i32.load8_u (i32.add (local.get $b) (local.get $k))))
        (then (return (i32.const 0))))
      (local.set $k (i32.add (local.get $k) (i32.const 1)))
      (br $next)))
    (i32.const 1))
  (func (export "cf_alloc") (param $len i32) (result i32)
    (local $ptr i32) (local $pages i32)
    (local.set $ptr (global.get $heap))
    (global.set $heap (i32.and (i32.add (i32.add (local.get $ptr) (local.get $len)) (i32.const 15)) (i32.const -16)))
    (local.set $pages (i32.shr_u (i32.add (global.get $heap) (i32.const 65535)) (i32.const 16)))
    (if (i32.gt_u (local.get $pages) (memory.size))
      (then (if (i32.eq (memory.grow (i32.sub (local.get $pages) (memory.size))) (i32.const -1))
        (then (unreachable)))))
    (local.get $ptr))
  (func (export "cf_signature") (result i32) (i32.const {desc(sig)}))
  (func (export "cf_init") (param $p i32) (param $n i32) (result i32)
    (if (result i32) (call $eq (local.get $p) (local.get $n) {ptr_len(input_blob)})
      (then (i32.const {desc(commands[0])})) (else (i32.const {desc(fail_input)}))))
  (func (export "cf_step") (param $p i32) (param $n i32) (result i32)
    (local $i i32)
    (local.set $i (global.get $step))
    (global.set $step (i32.add (local.get $i) (i32.const 1)))
    (if (global.get $bad_token) (then (return (i32.const {desc(fail_token)}))))
    {event_checks}
    (i32.const {desc(fail_extra)}))
  (func (export "cf_on_token") (param $p i32) (param $n i32) (result i32)
    (local $t i32)
    (local.set $t (global.get $token))
    (global.set $token (i32.add (local.get $t) (i32.const 1)))
    (if (i32.ge_u (local.get $t) (i32.const {len(token_blobs)})) (then (global.set $bad_token (i32.const 1))))
    {token_checks}
    (i32.const 0))
)"""))


BLOCK = sdk_block(INPUT, EXCHANGES, TOKENS, SIGNATURE)


# -- the tests --------------------------------------------------------------------------------------


def test_the_block_has_exactly_the_sdk_exports_and_imports_nothing():
    module = wasmtime.Module(wasmtime.Engine(), BLOCK)
    assert module.imports == []
    exports = {e.name: e.type for e in module.exports}
    assert set(exports) == {"memory", "__data_end", "__heap_base", "cf_alloc", "cf_signature", "cf_init", "cf_step",
                            "cf_on_token"}
    i32 = wasmtime.ValType.i32()

    def sig(name):
        return list(exports[name].params), list(exports[name].results)

    assert sig("cf_alloc") == ([i32], [i32])
    assert sig("cf_signature") == ([], [i32])
    assert sig("cf_init") == sig("cf_step") == sig("cf_on_token") == ([i32, i32], [i32])
    # cf_signature's Desc points at serde's JSON of the Signature
    store = wasmtime.Store(wasmtime.Engine())
    instance = wasmtime.Instance(store, wasmtime.Module(store.engine, BLOCK), [])
    memory = instance.exports(store)["memory"]
    desc = instance.exports(store)["cf_signature"](store)
    ptr, length = (int.from_bytes(memory.read(store, desc + k, desc + k + 4), "little") for k in (0, 4))
    assert memory.read(store, ptr, ptr + length) == SIGNATURE


def test_the_block_notices_a_single_byte_of_difference(tmp_path, monkeypatch):
    """The comparison inside the guest can fail: a block expecting other bytes fails the job, naming where."""
    (tmp_path / "a.txt").write_bytes(DATA)
    monkeypatch.chdir(tmp_path)
    wrong = [EXCHANGES[0], (EXCHANGES[1][0].replace(b'"handle":0,"len"', b'"len":0,"handle"'), EXCHANGES[1][1]),
             *EXCHANGES[2:]]
    env = tj.run(sdk_block(INPUT, wrong, TOKENS, SIGNATURE), input={"path": "a.txt"}, read=[tmp_path],
                 backend=ScriptedBackend(REPLY), timeout=30)
    assert env.error.code == "schema_validation_failed" and "exchange 1:" in env.error.message
    tokens = [TOKENS[0], b" stub", b'" r\\u00e9sum\\u00e9"']  # a host that sent tokens as JSON would fail here
    env = tj.run(sdk_block(INPUT, EXCHANGES, tokens, SIGNATURE), input={"path": "a.txt"}, read=[tmp_path],
                 backend=ScriptedBackend(REPLY), timeout=30)
    assert env.error.code == "schema_validation_failed" and "token's bytes differ" in env.error.message


def test_a_rust_sdk_block_runs_here_unchanged_byte_for_byte(tmp_path, monkeypatch):
    (tmp_path / "a.txt").write_bytes(DATA)
    monkeypatch.chdir(tmp_path)
    job = tj.Job(BLOCK, input={"path": "a.txt"}, read=[tmp_path], backend=ScriptedBackend(REPLY)).start()
    env = job.wait(30)
    assert env.status.value == "completed", (env.error, [ev for ev, _ in EXCHANGES[1:]])
    assert env.result == {"path": "a.txt", "summary": REPLY}
    # the envelope has cuttlefish's shape: status, result (only when completed), usage; fields in that order
    out = env.to_json()
    assert list(out)[:3] == ["status", "result", "usage"]
    assert set(list(out)[3:]) <= {"sources", "confidence"}  # ours come after: where each field was found
    assert list(out["usage"]) == ["tokens_in", "tokens_out", "duration_ms", "model"]
    assert out["usage"]["tokens_out"] == 3 and out["usage"]["model"] == "scripted"
    # the host carried out each command: the windows it cut, the chunk boundary it resumed from
    sliced = [e for e in job.events if e["type"] == "job.file.sliced"]
    assert [(e["offset"], e["length"]) for e in sliced] == [(0, EMOJI_AT), (EMOJI_AT, len(DATA) - EMOJI_AT)]

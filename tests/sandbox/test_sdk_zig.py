"""The Zig SDK (guests/tensorjob.zig) through a real guest, byte for byte.

The same approach as test_sdk_c.py (and its ``RawGuest``): tests/guests/
sdk_echo.zig answers each input with one SDK builder or echoes fields back,
and describes each event it is stepped with. The first Zig compile of a
session takes a few seconds; later ones come from the cache.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
import wasmtime

from tensorjob_jupyter import abi
from tensorjob_jupyter.sandbox import compile as tjc
from test_sdk_c import TRICKY, RawGuest, done_result, emitted

GUESTS = Path(__file__).resolve().parents[1] / "guests"


@pytest.fixture(scope="module")
def echo_wasm() -> bytes:
    return tjc.compile_file(GUESTS / "sdk_echo.zig")


@pytest.fixture
def guest(echo_wasm) -> RawGuest:
    return RawGuest(echo_wasm)


@pytest.mark.parametrize("ascii_only", [True, False], ids=["escaped-input", "raw-utf8-input"])
def test_tricky_string_round_trips_exactly(guest, ascii_only):
    data = json.dumps({"cmd": "echo", "s": TRICKY, "nested": {"a": [1, "x"]}}, ensure_ascii=ascii_only).encode()
    raw = guest.init(data)
    result = done_result(raw)
    assert result == {"s": TRICKY, "hex": TRICKY.encode().hex(), "len": len(TRICKY.encode()),
                      "nested": {"a": [1, "x"]}, "missing": None}
    assert b'quote \\" backslash \\\\ slash / newline \\n tab \\t cr \\r' in raw
    assert b"nul \\u0000 bell \\u0007 esc \\u001b us \\u001f del \x7f" in raw
    assert "日本語 emoji 😀 🎉 line-sep \u2028 end".encode() in raw


def test_surrogate_pair_escapes_decode_to_utf8(guest):
    raw = guest.init(b'{"s":"\\uD83D\\uDE00\\u00e9\\/"}')
    assert done_result(raw)["hex"] == "😀é/".encode().hex()


def test_invalid_utf8_is_replaced_wherever_it_sits(guest):
    raw = guest.init({"cmd": "bad_utf8"})
    raw.decode("utf-8")
    result = json.loads(raw)["result"]
    assert result == {"bad": "a\ufffdb\ufffd(\ufffd\ufffd\ufffdc\ufffd\ufffd\ufffd", "list": ["\ufffd"]}


EXACT = [
    ({"cmd": "infer", "s": "hi"}, b'{"cmd":"infer","prompt":"hi","max_tokens":32,"images":[]}'),
    ({"cmd": "infer_with", "s": "hi"},
     b'{"cmd":"infer","prompt":"hi","max_tokens":16,"images":[],"format":{"type":"text"},'
     b'"tool_choice":"none","temperature":0.5,"seed":3,"stop":["x","y"]}'),
    ({"cmd": "infer_images", "s": 'a "q"'},
     b'{"cmd":"infer","prompt":"a \\"q\\"","max_tokens":0,"images":[1,4294967295]}'),
    ({"cmd": "open", "s": "dir/ä.txt"}, '{"cmd":"open","path":"dir/ä.txt"}'.encode()),
    ({"cmd": "slice"}, b'{"cmd":"slice","handle":7,"offset":4294967296,"len":65536}'),
    ({"cmd": "slice_bytes"}, b'{"cmd":"slice_bytes","handle":0,"offset":0,"len":18446744073709551615}'),
    ({"cmd": "embed", "s": "a\nb"}, b'{"cmd":"embed","texts":["a\\nb","b",""]}'),
    ({"cmd": "emit", "payload": {"k": [1, "x"]}}, b'{"cmd":"emit","progress":{"k":[1,"x"]}}'),
    ({"cmd": "progress"}, b'{"cmd":"emit","progress":{"done":3,"total":10}}'),
    ({"cmd": "done", "payload": "r"}, b'{"cmd":"done","result":"r"}'),
    ({"cmd": "done"}, b'{"cmd":"done","result":null}'),
    ({"cmd": "fail", "s": "no such file"}, b'{"cmd":"fail","code":"not_found","message":"no such file"}'),
    ({"cmd": "failf", "s": "y"}, b'{"cmd":"fail","code":"unsupported","message":"x=-42 y"}'),
    ({"cmd": "error"}, b'{"cmd":"fail","code":"wasm_trap","message":"guest error in init: Deliberate"}'),
    ([1, 2], b'{"cmd":"fail","code":"schema_validation_failed","message":"the input must be an object"}'),
    ({"cmd": "page_text"}, b'{"cmd":"page_text","handle":3,"page":4294967295}'),
    ({"cmd": "page_text_opt"}, b'{"cmd":"page_text_opt","handle":0,"page":7}'),
    ({"cmd": "page_image"}, b'{"cmd":"page_image","handle":1,"page":0}'),
    ({"cmd": "document_text"}, b'{"cmd":"document_text","handle":9}'),
    ({"cmd": "resize"}, b'{"cmd":"image_op","handle":2,"op":{"op":"resize","max_width":512,"max_height":384}}'),
    ({"cmd": "crop"}, b'{"cmd":"image_op","handle":2,"op":{"op":"crop","x":1,"y":2,"width":3,"height":4294967295}}'),
    ({"cmd": "fetch", "s": "https://example.org/é"}, '{"cmd":"fetch","url":"https://example.org/é"}'.encode()),
]


@pytest.mark.parametrize("input,expected", EXACT, ids=[str(i) for i, _ in enumerate(EXACT)])
def test_builders_write_the_exact_wire_format(guest, input, expected):
    raw = guest.init(input)
    assert raw == expected
    abi.parse_command(raw)


def test_events_are_parsed_into_the_tagged_union(guest):
    guest.init({"s": "kept across steps"})
    ev = emitted(guest.step(b' { "kind" : { "format":"png", "kind" : "image" }, "len": 4294967296,'
                            b' "extra": {"handle": 9}, "handle": 3, "event": "opened" } '))
    assert ev == {"event": "opened", "handle": 3, "len": 2**32, "kind": "image", "format": "png",
                  "pages": None, "has_text_layer": None, "kept": "kept across steps"}
    ev = emitted(guest.step({"event": "opened", "handle": 0, "len": 5}))
    assert (ev["kind"], ev["format"]) == ("text", None)

    ev = emitted(guest.step({"event": "sliced", "text": TRICKY, "next_offset": 2**64 - 1}))
    assert (ev["text"], ev["text_hex"], ev["next_offset"]) == (TRICKY, TRICKY.encode().hex(), 2**64 - 1)

    data = bytes(range(256))
    ev = emitted(guest.step({"event": "sliced_bytes", "bytes_base64": base64.b64encode(data).decode(),
                             "next_offset": 256}))
    assert (ev["bytes_hex"], ev["next_offset"]) == (data.hex(), 256)

    ev = emitted(guest.step({"event": "infer_done", "text": 'a "b"\n', "tokens_out": 2**32 - 1}))
    assert (ev["text"], ev["tokens_out"], ev["tool_calls"]) == ('a "b"\n', 2**32 - 1, [])
    calls = [{"call_id": "call_1", "name": "add", "arguments": '{"a": 1}'}]
    ev = emitted(guest.step({"event": "infer_done", "text": "", "tokens_out": 3, "tool_calls": calls}))
    assert (ev["text"], ev["tool_calls"]) == ("", calls)
    assert (ev["logprobs"], ev["first_logprob"], ev["confidence_name"]) == (0, None, None)  # not asked: none

    records = [{"token": "{", "logprob": -0.25, "bytes": [123], "runner_up_logprob": -2.5,
                "top_logprobs": [{"token": "{", "logprob": -0.25, "bytes": [123]}, {"token": " ", "logprob": -2.5}]},
               {"token": "x", "logprob": -1e-9, "top_logprobs": []}]
    ev = emitted(guest.step({"event": "infer_done", "text": "{}", "tokens_out": 2, "logprobs": records,
                             "confidence": {"name": 0.75, "facts.age": None, "other": 1}}))
    assert (ev["logprobs"], ev["first_logprob"], ev["first_top"], ev["runner_up"]) == (2, -0.25, 2, -2.5)
    assert (ev["confidence_name"], ev["confidence_age"]) == (0.75, None)

    ev = emitted(guest.step({"event": "embedded", "vectors": [[0.5, -0.25, 1e-3], [2.5e1, 0, -1e1]]}))
    assert (ev["vectors"], ev["dims"]) == (2, 6)
    assert ev["sum"] == pytest.approx(15.251, abs=1e-5)

    ev = emitted(guest.step({"event": "a_later_event", "text": "later"}))
    assert ev == {"event": "unknown", "name": "a_later_event", "kept": "kept across steps"}


def test_document_events_are_parsed(guest):
    guest.init({"s": "k"})
    ev = emitted(guest.step({"event": "opened", "handle": 2, "len": 3674,
                             "kind": {"kind": "document", "pages": 4, "has_text_layer": True}}))
    assert (ev["kind"], ev["pages"], ev["has_text_layer"], ev["format"]) == ("document", 4, True, None)
    ev = emitted(guest.step({"event": "opened", "handle": 0, "len": 5}))
    assert (ev["pages"], ev["has_text_layer"]) == (None, None)
    ev = emitted(guest.step({"event": "page_texted", "text": "a\fb " + TRICKY}))
    assert ev == {"event": "page_texted", "text": "a\fb " + TRICKY}
    ev = emitted(guest.step({"event": "page_text_attempted", "text": "words", "error": None}))
    assert ev == {"event": "page_text_attempted", "text": "words", "error": None}
    ev = emitted(guest.step({"event": "page_text_attempted", "text": None, "error": "page 2 has no text layer"}))
    assert ev == {"event": "page_text_attempted", "text": None, "error": "page 2 has no text layer"}
    ev = emitted(guest.step({"event": "page_imaged", "handle": 4294967295, "len": 2**40}))
    assert ev == {"event": "page_imaged", "handle": 2**32 - 1, "len": 2**40}


def test_on_token_verdicts(guest):
    guest.init({})
    assert guest.on_token("go") == 0
    assert guest.on_token(b"\xe6\x97") == 0
    assert guest.on_token("stop") == 1
    assert emitted(guest.step({"event": "emitted"}))["tokens"] == 3


def test_a_malformed_event_fails_cleanly(guest):
    guest.init({})
    obj = json.loads(guest.step(b'{"event": "sliced", "text": 5}'))
    assert obj["cmd"] == "fail" and obj["code"] == "wasm_trap"


def test_memory_stays_flat_across_many_steps(guest):
    guest.init({"s": "x" * 1000})
    window = ("word " * 13107 + "é\n")[:65536]
    event = {"event": "sliced", "text": window, "next_offset": 1}
    for _ in range(5):
        guest.step(event)
        guest.on_token("tok")
    settled = guest.memory_size
    for i in range(300):
        event["next_offset"] = i
        assert emitted(guest.step(event))["kept"] == "x" * 1000
        guest.on_token("tok")
    assert guest.memory_size == settled
    assert settled <= 4 * 1024 * 1024


def test_exports_exactly_the_abi_and_imports_nothing(echo_wasm):
    module = wasmtime.Module(wasmtime.Engine(), echo_wasm)
    assert list(module.imports) == []
    assert {e.name for e in module.exports} == {"memory", "cf_alloc", "cf_init", "cf_step", "cf_on_token"}


def test_typed_input_struct_and_streaming(tmp_path):
    src = """
const std = @import("std");
const tj = @import("tensorjob");

pub const Input = struct { name: []const u8, times: u32 = 2 };

pub fn init(input: Input) !tj.Command {
    const staged = tj.inputBytes();
    var sent: u32 = 0;
    while (sent < input.times) : (sent += 1) {
        if (tj.emitChunk(staged) != 0) return tj.fail("unsupported", "streaming is off");
    }
    _ = tj.flush();
    return tj.done(.{ .name = input.name, .times = input.times, .staged = tj.inputLen() });
}

pub fn step(ev: tj.Event) tj.Command {
    _ = ev;
    return tj.fail("unsupported", "no steps");
}

comptime {
    tj.exportGuest(@This());
}
"""
    wasm = tjc.compile_source(src, "zig", filename="sdk_typed")
    imports = {(i.module, i.name) for i in wasmtime.Module(wasmtime.Engine(), wasm).imports}
    assert imports == {("wasi:tensor/host@0.1.0", n) for n in ("emit-chunk", "flush", "input-len", "read-input")}
    g = RawGuest(wasm, input_bytes=b"abc")
    assert done_result(g.init({"name": "n\u00e9", "extra": [1]})) == {"name": "n\u00e9", "times": 2, "staged": 3}
    assert g.chunks == [b"abc", b"abc"]
    g = RawGuest(wasm)
    obj = json.loads(g.init({"times": 1}))  # "name" is missing
    assert (obj["cmd"], obj["code"]) == ("fail", "schema_validation_failed")
    assert "MissingField" in obj["message"]


def test_the_example_in_the_module_docs_compiles_and_runs(tmp_path):
    doc = (tjc.sdk_dir() / "tensorjob.zig").read_text().split("\n\n")[0]
    lines = [ln[len("//!     "):] if ln.startswith("//!     ") else "" for ln in doc.splitlines()]
    example = "\n".join(lines).strip()
    assert "exportGuest" in example
    g = RawGuest(tjc.compile_source(example, "zig", filename="sdk_doc_example"))
    assert json.loads(g.init({"path": "a.txt"})) == {"cmd": "open", "path": "a.txt"}
    assert json.loads(g.step({"event": "opened", "handle": 2, "len": 5})) == {
        "cmd": "slice", "handle": 2, "offset": 0, "len": 65536}
    assert done_result(g.step({"event": "sliced", "text": "hello", "next_offset": 5})) == {"path": "a.txt", "bytes": 5}
    assert g.on_token(" end.") == 1 and g.on_token(" go") == 0

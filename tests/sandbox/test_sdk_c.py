"""The C SDK (guests/tensorjob.h) through a real guest, byte for byte.

``RawGuest`` drives a compiled guest with wasmtime directly -- cf_alloc, write,
call, read the descriptor -- and returns the command bytes unparsed, so these
tests pin the exact wire format (field order, escaping) that the host's strict
parser would only accept or reject. tests/guests/sdk_echo.c answers each input
with one SDK builder, or echoes fields back, and describes each event it gets.
"""

from __future__ import annotations

import base64
import json
import struct
from pathlib import Path

import pytest
import wasmtime

from tensorjob_jupyter.sandbox import compile as tjc

GUESTS = Path(__file__).resolve().parents[1] / "guests"

#: Everything JSON string escaping can get wrong, in one string.
TRICKY = ('quote " backslash \\ slash / newline \n tab \t cr \r backspace \b formfeed \f nul \x00 bell \x07 '
          'esc \x1b us \x1f del \x7f é ß 日本語 emoji 😀 🎉 line-sep \u2028 end')


_ENGINE = wasmtime.Engine()
_MODULES: dict[bytes, wasmtime.Module] = {}


def _module(wasm: bytes) -> wasmtime.Module:
    """``wasm`` compiled once a session (most of a second for a Zig guest); every guest still gets its own store."""
    module = _MODULES.get(wasm)
    if module is None:
        module = _MODULES[wasm] = wasmtime.Module(_ENGINE, wasm)
    return module


class RawGuest:
    """A guest instance driven through the ABI by hand (no host, no parsing)."""

    def __init__(self, wasm: bytes, *, input_bytes: bytes = b""):
        self.engine = _ENGINE
        self.store = wasmtime.Store(self.engine)
        module = _module(bytes(wasm))
        linker = wasmtime.Linker(self.engine)
        self.chunks: list[bytes] = []
        self.input_bytes = input_bytes
        self._define_streaming(linker, module)
        self.instance = linker.instantiate(self.store, module)
        ex = self.instance.exports(self.store)
        self.memory: wasmtime.Memory = ex["memory"]
        self.exports = {e.name for e in module.exports}
        self._ex = ex

    def _define_streaming(self, linker: wasmtime.Linker, module: wasmtime.Module) -> None:
        i32 = wasmtime.ValType.i32()
        impls = {
            "emit-chunk": (wasmtime.FuncType([i32, i32], [i32]), self._emit_chunk),
            "flush": (wasmtime.FuncType([], [i32]), lambda caller: 0),
            "input-len": (wasmtime.FuncType([], [i32]), lambda caller: len(self.input_bytes)),
            "read-input": (wasmtime.FuncType([i32, i32], [i32]), self._read_input),
        }
        for imp in module.imports:
            ty, fn = impls[imp.name]
            linker.define_func(imp.module, imp.name, ty, fn, access_caller=True)

    def _emit_chunk(self, caller, ptr: int, n: int) -> int:
        self.chunks.append(bytes(caller["memory"].read(caller, ptr, ptr + n)))
        return 0

    def _read_input(self, caller, ptr: int, n: int) -> int:
        data = self.input_bytes[:n]
        caller["memory"].write(caller, data, ptr)
        return len(data)

    @property
    def memory_size(self) -> int:
        return self.memory.data_len(self.store)

    def _write(self, data: bytes) -> tuple[int, int]:
        ptr = self._ex["cf_alloc"](self.store, len(data))
        if data:
            self.memory.write(self.store, data, ptr)
        return ptr, len(data)

    def _call(self, export: str, data: bytes) -> bytes:
        ptr, n = self._write(data)
        desc = self._ex[export](self.store, ptr, n)
        p, length = struct.unpack("<II", bytes(self.memory.read(self.store, desc, desc + 8)))
        return bytes(self.memory.read(self.store, p, p + length))

    def init(self, value) -> bytes:
        return self._call("cf_init", _encode(value))

    def step(self, value) -> bytes:
        return self._call("cf_step", _encode(value))

    def on_token(self, token: str | bytes) -> int:
        data = token.encode() if isinstance(token, str) else token
        ptr, n = self._write(data)
        return self._ex["cf_on_token"](self.store, ptr, n)


def _encode(value) -> bytes:
    if isinstance(value, bytes):
        return value
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


@pytest.fixture(scope="module")
def echo_wasm() -> bytes:
    return tjc.compile_file(GUESTS / "sdk_echo.c")


@pytest.fixture
def guest(echo_wasm) -> RawGuest:
    return RawGuest(echo_wasm)


def done_result(raw: bytes):
    obj = json.loads(raw)
    assert obj["cmd"] == "done", raw
    assert list(obj) == ["cmd", "result"]
    return obj["result"]


def emitted(raw: bytes):
    obj = json.loads(raw)
    assert obj["cmd"] == "emit", raw
    return obj["progress"]


# --- strings ----------------------------------------------------------------------


@pytest.mark.parametrize("ascii_only", [True, False], ids=["escaped-input", "raw-utf8-input"])
def test_tricky_string_round_trips_exactly(guest, ascii_only):
    data = json.dumps({"cmd": "echo", "s": TRICKY}, ensure_ascii=ascii_only).encode()
    if ascii_only:
        assert b"\\ud83d\\ude00" in data  # the emoji arrives as a surrogate pair escape
    raw = guest.init(data)
    result = done_result(raw)
    assert result["s"] == TRICKY
    assert result["hex"] == TRICKY.encode().hex()
    assert result["len"] == len(TRICKY.encode())
    # Exact escaping on the wire: short forms, \u00XX for the rest, UTF-8 as is.
    assert b'quote \\" backslash \\\\ slash / newline \\n tab \\t cr \\r' in raw
    assert b"nul \\u0000 bell \\u0007 esc \\u001b us \\u001f del \x7f" in raw
    assert b"backspace \\u0008 formfeed \\u000c" in raw
    assert "日本語 emoji 😀 🎉 line-sep \u2028 end".encode() in raw


def test_every_simple_escape_and_uppercase_hex_decode(guest):
    raw = guest.init(b'{"cmd":"echo","s":"\\"\\\\\\/\\b\\f\\n\\r\\t\\u00e9\\u00C9\\uD83D\\uDE00"}')
    assert done_result(raw)["s"] == '"\\/\b\f\n\r\té\u00c9😀'


def test_lone_surrogates_become_replacement_characters(guest):
    raw = guest.init(b'{"s":"a\\ud800b\\udc00c\\ud83d"}')
    assert done_result(raw)["s"] == "a\ufffdb\ufffdc\ufffd"


def test_invalid_utf8_from_the_guest_becomes_replacement_characters(guest):
    raw = guest.init({"cmd": "bad_utf8"})
    raw.decode("utf-8")  # the command itself is valid UTF-8
    assert json.loads(raw)["result"] == "a\ufffdb\ufffd(\ufffd\ufffd\ufffdc\ufffd\ufffd\ufffd"


# --- reading the input ------------------------------------------------------------------


def test_top_level_lookup_ignores_nested_and_quoted_decoys(guest):
    data = (b'{ "nested" : {"s": "decoy", "deeper": [{"s": "no"}]} ,\n'
            b' "q": "has \\"s\\": \\"no\\" inside", "list": ["s", {"s": 1}, "]}"],\t'
            b' "\\u0073" : "yes" , "n": 18446744073709551615, "i": -9223372036854775808,'
            b' "f": -1.25e2, "b": true }')
    result = done_result(guest.init(data))
    assert result["s"] == "yes"  # found through an escaped key, past every decoy
    assert result["n"] == 2**64 - 1
    assert result["i"] == -(2**63)
    assert result["f"] == -125.0
    assert result["b"] is True
    assert result["missing"] is None and result["missing_str"] is None
    assert result["nested"] == {"s": "decoy", "deeper": [{"s": "no"}]}
    assert result["kind_s"] == ord('"') and result["kind_nested"] == ord("{")


def test_defaults_for_absent_or_mistyped_fields(guest):
    result = done_result(guest.init({"s": 5, "n": -1, "i": 1.5, "f": "x", "b": "true"}))
    assert result["s"] is None and result["hex"] == "" and result["len"] == 0
    assert (result["n"], result["i"], result["f"], result["b"]) == (7, -7, 0.5, False)
    result = done_result(guest.init({"n": 18446744073709551616}))  # u64 overflow -> default
    assert result["n"] == 7


def test_iteration_over_objects_and_arrays(guest):
    raw = guest.init(b'{"cmd":"iter", "a\\"b": [1, {"x": "]"}], "list": [1, 2 ,3, "x"], "z": null}')
    result = done_result(raw)
    assert result == {"keys": 'cmd,a"b,list,z,', "kinds": '"[[n', "items": 4, "sum": 1006}


# --- commands ---------------------------------------------------------------------------

EXACT = [
    ({"cmd": "infer", "s": "hi"}, b'{"cmd":"infer","prompt":"hi","max_tokens":32,"images":[]}'),
    ({"cmd": "infer_with", "s": "hi", "options": {"format": {"type": "json_object"}, "temperature": 0.5}},
     b'{"cmd":"infer","prompt":"hi","max_tokens":16,"images":[],"format":{"type":"json_object"},"temperature":0.5}'),
    ({"cmd": "infer_with", "s": "hi", "options": {}}, b'{"cmd":"infer","prompt":"hi","max_tokens":16,"images":[]}'),
    ({"cmd": "infer_with", "s": "hi"}, b'{"cmd":"infer","prompt":"hi","max_tokens":16,"images":[]}'),
    ({"cmd": "infer_images", "s": 'a "q"'},
     b'{"cmd":"infer","prompt":"a \\"q\\"","max_tokens":0,"images":[1,4294967295]}'),
    ({"cmd": "open", "s": "dir/ä.txt"}, '{"cmd":"open","path":"dir/ä.txt"}'.encode()),
    ({"cmd": "slice"}, b'{"cmd":"slice","handle":7,"offset":4294967296,"len":65536}'),
    ({"cmd": "slice_bytes"}, b'{"cmd":"slice_bytes","handle":0,"offset":0,"len":18446744073709551615}'),
    ({"cmd": "embed", "s": "a\nb"}, b'{"cmd":"embed","texts":["a\\nb","b",""]}'),
    ({"cmd": "emit", "payload": {"k": [1, "x"]}}, b'{"cmd":"emit","progress":{"k":[1,"x"]}}'),
    ({"cmd": "progress"}, b'{"cmd":"emit","progress":{"done":3,"total":10}}'),
    ({"cmd": "done", "payload": "r"}, b'{"cmd":"done","result":"r"}'),
    ({"cmd": "done_null"}, b'{"cmd":"done","result":null}'),
    ({"cmd": "fail", "s": "no such file"}, b'{"cmd":"fail","code":"not_found","message":"no such file"}'),
    ({"cmd": "failf", "s": "y"}, b'{"cmd":"fail","code":"unsupported","message":"x=-42 y"}'),
    ({"cmd": "none"}, b'{"cmd":"fail","code":"wasm_trap","message":"the guest returned no command"}'),
    ({"cmd": "page_text"}, b'{"cmd":"page_text","handle":3,"page":4294967295}'),
    ({"cmd": "page_text_opt"}, b'{"cmd":"page_text_opt","handle":0,"page":7}'),
    ({"cmd": "page_image"}, b'{"cmd":"page_image","handle":1,"page":0}'),
    ({"cmd": "document_text"}, b'{"cmd":"document_text","handle":9}'),
    ({"cmd": "resize"}, b'{"cmd":"image_op","handle":2,"op":{"op":"resize","max_width":512,"max_height":384}}'),
    ({"cmd": "crop"}, b'{"cmd":"image_op","handle":2,"op":{"op":"crop","x":1,"y":2,"width":3,"height":4294967295}}'),
    ({"cmd": "fetch", "s": 'https://example.org/a "b"'},
     b'{"cmd":"fetch","url":"https://example.org/a \\"b\\""}'),
]


@pytest.mark.parametrize("input,expected", EXACT, ids=[json.dumps(i["cmd"]) for i, _ in EXACT])
def test_builders_write_the_exact_wire_format(guest, input, expected):
    assert guest.init(input) == expected


def test_json_and_text_formatting(guest):
    raw = guest.init({"cmd": "format", "payload": [True]})
    assert raw == (b'{"cmd":"done","result":[-5,4000000000,-9223372036854775808,18446744073709551615,7,"ff",'
                   b'1.5,-0.25,1e20,0,true,false,"A","q\\"",[true],"%",null]}')
    json.loads(raw)
    raw = guest.init({"cmd": "strf", "s": "t\"x"})
    assert json.loads(raw)["result"] == '<raw "c"|t"x|12345678901>'


def test_builders_agree_with_the_hosts_strict_parser(guest):
    from tensorjob_jupyter import abi

    for input, _ in EXACT:
        abi.parse_command(guest.init(input))


# --- events -----------------------------------------------------------------------------


def test_events_are_parsed_whatever_the_key_order_and_whitespace(guest):
    guest.init({"s": "kept across steps"})
    ev = emitted(guest.step(b' { "kind" : { "format":"png", "kind" : "image" }, "len": 4294967296,'
                            b' "extra": {"handle": 9}, "handle": 3, "event": "opened" } '))
    assert (ev["type"], ev["name"], ev["handle"], ev["len"], ev["kind"], ev["format"]) == (2, "opened", 3, 2**32,
                                                                                         "image", "png")
    assert ev["kept"] == "kept across steps"

    ev = emitted(guest.step({"event": "opened", "handle": 0, "len": 5}))  # kind defaults to text
    assert (ev["kind"], ev["format"]) == ("text", None)

    ev = emitted(guest.step({"event": "sliced", "text": TRICKY, "next_offset": 18446744073709551615}))
    assert (ev["type"], ev["text"], ev["text_hex"]) == (3, TRICKY, TRICKY.encode().hex())
    assert ev["next_offset"] == 2**64 - 1

    data = bytes(range(256))
    ev = emitted(guest.step({"event": "sliced_bytes", "bytes_base64": base64.b64encode(data).decode(),
                             "next_offset": 256}))
    assert (ev["type"], ev["bytes_hex"], ev["next_offset"]) == (4, data.hex(), 256)

    ev = emitted(guest.step({"event": "infer_done", "text": "a \"b\"\n", "tokens_out": 4294967295}))
    assert (ev["type"], ev["text"], ev["tokens_out"], ev["tool_calls"]) == (1, 'a "b"\n', 2**32 - 1, None)
    calls = [{"call_id": "call_1", "name": "add", "arguments": '{"a": 1}'}]
    ev = emitted(guest.step({"event": "infer_done", "text": "", "tokens_out": 3, "tool_calls": calls}))
    assert (ev["type"], ev["text"], ev["tool_calls"]) == (1, "", calls)

    ev = emitted(guest.step({"event": "embedded", "vectors": [[0.5, -0.25, 1e-3], [2.5e1, 0, -1E+1]]}))
    assert (ev["type"], ev["vectors"], ev["dims"]) == (5, 2, 6)
    assert ev["sum"] == pytest.approx(0.5 - 0.25 + 1e-3 + 25 - 10, abs=1e-6)

    ev = emitted(guest.step({"event": "emitted"}))
    assert (ev["type"], ev["name"], ev["text"]) == (6, "emitted", "")

    ev = emitted(guest.step({"event": "a_later_event", "text": "later"}))
    assert (ev["type"], ev["name"]) == (0, "a_later_event")
    assert ev["kept"] == "kept across steps"


def test_document_events_are_parsed(guest):
    guest.init({})
    ev = emitted(guest.step({"event": "opened", "handle": 2, "len": 3674,
                             "kind": {"kind": "document", "pages": 4, "has_text_layer": True}}))
    assert (ev["type"], ev["kind"], ev["pages"], ev["has_text_layer"], ev["error"]) == (2, "document", 4, True, None)
    ev = emitted(guest.step({"event": "opened", "handle": 2, "len": 3, "kind": {"kind": "document", "pages": 1,
                                                                                 "has_text_layer": False}}))
    assert (ev["pages"], ev["has_text_layer"]) == (1, False)
    ev = emitted(guest.step({"event": "page_texted", "text": "page\ftwo " + TRICKY}))
    assert (ev["type"], ev["name"], ev["text"]) == (7, "page_texted", "page\ftwo " + TRICKY)
    ev = emitted(guest.step({"event": "page_text_attempted", "text": "words", "error": None}))
    assert (ev["type"], ev["text"], ev["error"]) == (8, "words", None)
    ev = emitted(guest.step({"event": "page_text_attempted", "text": None, "error": "page 2 has no text layer"}))
    assert (ev["type"], ev["text"], ev["error"]) == (8, "", "page 2 has no text layer")
    ev = emitted(guest.step({"event": "page_imaged", "handle": 4294967295, "len": 2**40}))
    assert (ev["type"], ev["handle"], ev["len"]) == (9, 2**32 - 1, 2**40)


def test_on_token_gets_raw_bytes_and_its_answer_is_the_verdict(guest):
    guest.init({})
    assert guest.on_token("go") == 0
    assert guest.on_token(b"\xe6\x97") == 0  # half a character is fine
    assert guest.on_token("stop") == 1
    assert emitted(guest.step({"event": "emitted"}))["tokens"] == 3


# --- memory -----------------------------------------------------------------------------


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
    assert settled <= 4 * 1024 * 1024  # text, its hex and the JSON of both, for a 64 KiB window


def test_plain_guest_imports_nothing_and_exports_the_abi(echo_wasm):
    module = wasmtime.Module(wasmtime.Engine(), echo_wasm)
    assert list(module.imports) == []
    assert {e.name for e in module.exports} == {"memory", "cf_alloc", "cf_init", "cf_step", "cf_on_token"}


def test_signature_export_when_declared(tmp_path):
    src = ('#define TJ_SIGNATURE_INPUT "{path: text}"\n#define TJ_SIGNATURE_OUTPUT "{path: text, words: number}"\n'
           '#include "tensorjob.h"\ntj_cmd guest_init(tj_json in) { return tj_done(in); }\n'
           'tj_cmd guest_step(tj_event ev) { return tj_done(ev.json); }\n')
    g = RawGuest(tjc.compile_source(src, "c", filename="sdk_sig"))
    desc = g._ex["cf_signature"](g.store)
    p, n = struct.unpack("<II", bytes(g.memory.read(g.store, desc, desc + 8)))
    assert json.loads(bytes(g.memory.read(g.store, p, p + n))) == {"input": "{path: text}",
                                                                  "output": "{path: text, words: number}"}
    assert done_result(g.init(b' {"a": 1} ')) == {"a": 1}


def test_streaming_helpers(tmp_path):
    src = ('#include "tensorjob.h"\n'
           'tj_cmd guest_init(tj_json in) {\n'
           '    tj_str all = tj_input_bytes();\n'
           '    char two[2];\n'
           '    int32_t got = tj_read_input(two, 2);\n'
           '    int32_t rc = tj_emit_chunk(all);\n'
           '    tj_flush();\n'
           '    return tj_done(tj_jsonf("{\\"len\\":%u,\\"got\\":%d,\\"rc\\":%d,\\"all\\":%S}",\n'
           '                            tj_input_len(), got, rc, all));\n'
           '}\n'
           'tj_cmd guest_step(tj_event ev) { return tj_done(ev.json); }\n')
    wasm = tjc.compile_source(src, "c", filename="sdk_stream")
    imports = {(i.module, i.name) for i in wasmtime.Module(wasmtime.Engine(), wasm).imports}
    assert imports == {("wasi:tensor/host@0.1.0", n) for n in ("emit-chunk", "flush", "input-len", "read-input")}
    g = RawGuest(wasm, input_bytes=b"staged\x00bytes")
    assert done_result(g.init({})) == {"len": 12, "got": 2, "rc": 0, "all": "staged\x00bytes"}
    assert g.chunks == [b"staged\x00bytes"]


def test_the_example_in_the_header_compiles_and_runs():
    doc = (tjc.sdk_dir() / "tensorjob.h").read_text().split(" * Compile:")[0]
    example = "\n".join(ln[len(" *     "):] for ln in doc.splitlines() if ln.startswith(" *     "))
    g = RawGuest(tjc.compile_source(example, "c", filename="sdk_doc_example"))
    assert json.loads(g.init({"path": "a.txt"})) == {"cmd": "open", "path": "a.txt"}
    assert json.loads(g.step({"event": "opened", "handle": 2, "len": 5})) == {
        "cmd": "slice", "handle": 2, "offset": 0, "len": 65536}
    assert done_result(g.step({"event": "sliced", "text": "hello", "next_offset": 5})) == {"bytes": 5}

"""tensorjob_jupyter.sandbox.compile: C, Zig and WAT to wasm, the cache, diagnostics.

Every test points the cache at its own tmp dir (``TENSORJOB_CACHE``), so a
"cache hit" here is one this test made. Zig's own cache (~/.cache/zig) stays
shared, which keeps a recompile of the Zig SDK to about a second.
"""

from __future__ import annotations

import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import wasmtime

from tensorjob_jupyter.sandbox import compile as tjc

ABI = {"memory", "cf_alloc", "cf_init", "cf_step"}

C_SRC = """#include "tensorjob.h"
tj_cmd guest_init(tj_json input) { return tj_done(input); }
tj_cmd guest_step(tj_event ev) { return tj_fail("unsupported", ev.name); }
"""

ZIG_SRC = """const std = @import("std");
const tj = @import("tensorjob");

pub fn init(input: std.json.Value) tj.Command {
    return tj.done(input);
}

pub fn step(ev: tj.Event) tj.Command {
    _ = ev;
    return tj.fail("unsupported", "no steps");
}

comptime {
    tj.exportGuest(@This());
}
"""

WAT_SRC = """(module
  (memory (export "memory") 1)
  (data (i32.const 16) "\\20\\00\\00\\00\\19\\00\\00\\00")
  (data (i32.const 32) "{\\"cmd\\":\\"done\\",\\"result\\":1}")
  (func (export "cf_alloc") (param i32) (result i32) (i32.const 1024))
  (func (export "cf_init") (param i32 i32) (result i32) (i32.const 16))
  (func (export "cf_step") (param i32 i32) (result i32) (i32.const 16)))
"""


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch) -> Path:
    cache = tmp_path / "wasm-cache"
    monkeypatch.setenv("TENSORJOB_CACHE", str(cache))
    return cache


def _module(wasm: bytes) -> wasmtime.Module:
    return wasmtime.Module(wasmtime.Engine(), wasm)


def _memory_min_pages(module: wasmtime.Module) -> int:
    mem = next(e.type for e in module.exports if e.name == "memory")
    return mem.limits.min


@pytest.mark.parametrize("lang,source", [("c", C_SRC), ("zig", ZIG_SRC), ("wat", WAT_SRC)])
def test_each_language_compiles_to_a_plain_abi_module(lang, source):
    wasm = tjc.compile_source(source, lang, filename="cell")
    assert wasm.startswith(b"\0asm")
    module = _module(wasm)
    assert {e.name for e in module.exports} == ABI  # exactly the ABI: no __stack_pointer
    assert list(module.imports) == []
    assert _memory_min_pages(module) <= 2  # a 64 KiB shadow stack, not zig's default 1 MiB
    # It runs: cf_init answers the input back.
    from test_sdk_c import RawGuest

    raw = RawGuest(wasm).init({"x": [1]})
    assert raw in (b'{"cmd":"done","result":{"x":[1]}}', b'{"cmd":"done","result":1}')


def test_the_cache_skips_the_compiler(own_cache):
    tjc.stats.reset()
    first = tjc.compile_source(C_SRC, "c", filename="cell")
    assert tjc.stats.compiler_runs == 1
    second = tjc.compile_source(C_SRC, "c", filename="cell")
    assert second == first
    assert (tjc.stats.compiler_runs, tjc.stats.cache_hits) == (1, 1)
    assert len(list(own_cache.rglob("*.wasm"))) == 1
    # Anything that changes the bytes changes the key.
    tjc.compile_source(C_SRC, "c", filename="cell", flags=["-DEXTRA=1"])
    tjc.compile_source(C_SRC + "\n", "c", filename="cell")
    assert tjc.stats.compiler_runs == 3
    tjc.compile_source(C_SRC, "c", filename="cell", cache=False)
    assert tjc.stats.compiler_runs == 4


def test_an_sdk_change_invalidates_the_cache(tmp_path, monkeypatch):
    sdk = tmp_path / "sdk"
    shutil.copytree(tjc.sdk_dir(), sdk, ignore=shutil.ignore_patterns("examples"))
    monkeypatch.setattr(tjc, "sdk_dir", lambda: sdk)
    tjc.stats.reset()
    tjc.compile_source(C_SRC, "c")
    tjc.compile_source(C_SRC, "c")
    assert tjc.stats.compiler_runs == 1
    (sdk / "tensorjob.h").write_text((sdk / "tensorjob.h").read_text() + "\n/* changed */\n")
    tjc.compile_source(C_SRC, "c")
    assert tjc.stats.compiler_runs == 2


def test_a_corrupt_cache_entry_is_recompiled(own_cache):
    wasm = tjc.compile_source(WAT_SRC, "wat")
    (entry,) = own_cache.rglob("*.wasm")
    entry.write_bytes(b"garbage")
    assert tjc.compile_source(WAT_SRC, "wat") == wasm


def test_concurrent_compiles_of_one_source_agree(own_cache):
    source = C_SRC + "/* concurrent */\n"
    barrier = threading.Barrier(4)

    def build(_):
        barrier.wait()
        return tjc.compile_source(source, "c", filename="cell")

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(build, range(4)))
    assert len(set(results)) == 1
    (entry,) = own_cache.rglob("*.wasm")
    assert entry.read_bytes() == results[0]
    assert not [p for p in own_cache.rglob("*") if p.suffix == ".tmp"]


# --- diagnostics -----------------------------------------------------------------------


def test_c_syntax_error_names_the_file_and_line():
    src = '#include "tensorjob.h"\n\ntj_cmd guest_init(tj_json input) {\n    return tj_done(input)\n}\n'
    with pytest.raises(tjc.CompileError) as info:
        tjc.compile_source(src, "c", filename="cell")
    message = str(info.value)
    assert "cell.c:4:" in message and "error" in message
    assert "tensorjob-build-" not in message and "/tmp" not in message
    assert info.value.lang == "c" and info.value.filename == "cell.c"


def test_c_missing_entry_point_is_a_compile_error():
    with pytest.raises(tjc.CompileError) as info:
        tjc.compile_source('#include "tensorjob.h"\ntj_cmd guest_init(tj_json i) { return tj_done(i); }\n', "c")
    assert "guest_step" in str(info.value)


def test_zig_error_names_the_line():
    src = ZIG_SRC.replace("    _ = ev;\n", "    _ = ev;\n    const unused = undefined_name;\n")
    with pytest.raises(tjc.CompileError) as info:
        tjc.compile_source(src, "zig", filename="cell")
    message = str(info.value)
    assert "cell.zig:10:" in message and "undefined_name" in message
    assert "tensorjob-build-" not in message


def test_wat_error_names_the_line_and_column():
    src = "(module\n  (func $f (result i32)\n    (i32.add (i32.const 1) oops)))\n"
    with pytest.raises(tjc.CompileError) as info:
        tjc.compile_source(src, "wat", filename="cell")
    assert str(info.value).startswith("cell.wat:3:28: error:")


def test_compile_file_reports_the_real_file_name(tmp_path):
    p = tmp_path / "broken.c"
    p.write_text("int f(void) {\n  return 1\n}\n")
    with pytest.raises(tjc.CompileError) as info:
        tjc.compile_file(p)
    assert str(info.value).startswith("broken.c:2:")


# --- languages, files, loading ---------------------------------------------------------------


@pytest.mark.parametrize("source,lang", [
    (WAT_SRC, "wat"),
    (";; a comment\n  (module)", "wat"),
    (C_SRC, "c"),
    ("// no include\nstatic int x;\nint f(void) { return x; }\n", "c"),
    (ZIG_SRC, "zig"),
    ("pub fn init() void {}\n", "zig"),
    ("export fn f() i32 { return 1; }\n", "zig"),
    ("const tj = @import(\"tensorjob\");\n", "zig"),
])
def test_detect_language(source, lang):
    assert tjc.detect_language(source) == lang


def test_detect_language_refuses_prose():
    with pytest.raises(ValueError):
        tjc.detect_language("just some words\n")


def test_a_guest_source_from_bytes_paths_and_text(tmp_path):
    wasm = tjc.compile_source(WAT_SRC, "wat")
    assert tjc.GuestSource.of(wasm).wasm == wasm and tjc.GuestSource.of(bytearray(wasm)).language == "wasm"
    (tmp_path / "g.wasm").write_bytes(b"\0asm-not-checked")
    g = tjc.GuestSource.of(tmp_path / "g.wasm")
    assert (g.wasm, g.name, g.language, g.origin) == (b"\0asm-not-checked", "g.wasm", "wasm", str(tmp_path / "g.wasm"))
    (tmp_path / "g.wat").write_text(WAT_SRC)
    g = tjc.GuestSource.of(str(tmp_path / "g.wat"))
    assert (g.wasm, g.language) == (wasm, "wat")
    (tmp_path / "g.c").write_text(C_SRC)
    g = tjc.GuestSource.of(tmp_path / "g.c")
    assert g.language == "c" and ABI <= {e.name for e in _module(g.wasm).exports}
    (tmp_path / "noext").write_bytes(wasm)
    assert tjc.GuestSource.of(tmp_path / "noext").wasm == wasm
    cell = tjc.GuestSource.from_text(WAT_SRC)
    assert (cell.wasm, cell.language, cell.name, cell.origin) == (wasm, "wat", "cell.wat", "cell")
    # A string is always a path, never source text; bytes are always a module.
    with pytest.raises(FileNotFoundError):
        tjc.GuestSource.of(WAT_SRC)
    with pytest.raises(ValueError, match="not a WebAssembly module"):
        tjc.GuestSource.of(WAT_SRC.encode())


def test_local_includes_are_part_of_the_cache_key(tmp_path):
    (tmp_path / "helper.h").write_text("#define ANSWER 41\n")
    main = tmp_path / "main.c"
    main.write_text('#include "tensorjob.h"\n#include "helper.h"\n'
                    'tj_cmd guest_init(tj_json i) { return tj_done(tj_jsonf("%d", ANSWER)); }\n'
                    'tj_cmd guest_step(tj_event ev) { return tj_done(ev.json); }\n')
    from test_sdk_c import RawGuest

    assert RawGuest(tjc.compile_file(main)).init({}) == b'{"cmd":"done","result":41}'
    (tmp_path / "helper.h").write_text("#define ANSWER 42\n")
    assert RawGuest(tjc.compile_file(main)).init({}) == b'{"cmd":"done","result":42}'


def test_sdk_dir_is_the_checkouts_guests_folder():
    d = tjc.sdk_dir()
    assert (d / "tensorjob.h").is_file() and (d / "tensorjob.zig").is_file()
    assert d == Path(__file__).resolve().parents[2] / "guests"


def test_strip_linker_exports_drops_only_linker_globals():
    wat = """(module
      (global $sp (mut i32) (i32.const 0))
      (global $g i32 (i32.const 0))
      (memory (export "memory") 1)
      (export "__stack_pointer" (global $sp))
      (export "mine" (global $g))
      (func (export "__f")))"""
    stripped = tjc.strip_linker_exports(bytes(wasmtime.wat2wasm(wat)))
    assert [e.name for e in _module(stripped).exports] == ["memory", "mine", "__f"]
    assert tjc.strip_linker_exports(b"not wasm") == b"not wasm"


def test_command_line(tmp_path):
    from tensorjob_jupyter.frontends.cli import main
    import io

    src = tmp_path / "cli.c"
    src.write_text(C_SRC)
    out, err = io.StringIO(), io.StringIO()
    assert main(["compile", str(src), "-o", str(tmp_path / "out.wasm")], out=out, err=err) == 0
    assert (tmp_path / "out.wasm").read_bytes().startswith(b"\0asm")
    src.write_text("int broken(\n")
    assert main(["compile", str(src)], out=out, err=err) == 1
    assert "cli.c:" in err.getvalue()

# --- compiling like %%cython: --force, flags, warnings, the cache ------------------------------

WARNS = """#include "tensorjob.h"
tj_cmd guest_init(tj_json input) { int unused_here = 3; return tj_done(input); }
tj_cmd guest_step(tj_event ev) { return tj_fail("unsupported", ev.name); }
"""


def test_warnings_are_kept_when_the_compile_succeeds_and_force_compiles_again():
    tjc.stats.reset()
    first = tjc.GuestSource.from_text(WARNS, name="cell", cflags=["-Wall"])
    assert "unused_here" in first.warnings and "cell.c:" in first.warnings
    again = tjc.GuestSource.from_text(WARNS, name="cell", cflags=["-Wall"])
    assert again.wasm == first.wasm and again.warnings == "" and tjc.stats.compiler_runs == 1  # from the cache
    forced = tjc.GuestSource.from_text(WARNS, name="cell", cflags=["-Wall"], force=True)
    assert tjc.stats.compiler_runs == 2 and "unused_here" in forced.warnings
    plain = tjc.GuestSource.from_text(WARNS, name="cell")  # other flags: another cache entry, no -Wall
    assert tjc.stats.compiler_runs == 3 and "unused_here" not in plain.warnings


def test_flags_reach_the_compiler_of_their_language(tmp_path):
    src = '#include "tensorjob.h"\ntj_cmd guest_init(tj_json i) { return tj_done(tj_jsonf("%d", N)); }\n' \
          'tj_cmd guest_step(tj_event ev) { return tj_done(i_am_not_defined); }\n'
    with pytest.raises(tjc.CompileError):
        tjc.GuestSource.from_text(src, cflags=["-DN=4"])  # the step's error stays
    good = src.replace("i_am_not_defined", "tj_jsonf(\"0\")")
    assert tjc.GuestSource.from_text(good, cflags=["-DN=4"], zigflags=["-nonsense"]).language == "c"
    with pytest.raises(tjc.CompileError, match="N"):
        tjc.GuestSource.from_text(good, zigflags=["-DN=4"])  # zig flags do not reach the C compiler


def test_the_cache_command_shows_and_clears(own_cache):
    from tensorjob_jupyter.frontends.cli import main
    import io

    tjc.GuestSource.from_text(WAT_SRC)
    out = io.StringIO()
    assert main(["cache"], out=out, err=io.StringIO()) == 0
    assert str(own_cache) in out.getvalue() and "1 cached modules" in out.getvalue()
    out = io.StringIO()
    assert main(["cache", "--clear"], out=out, err=io.StringIO()) == 0
    assert "removed 1 cached modules" in out.getvalue() and tjc.cache_usage() == (0, 0)


def test_the_cell_magic_shows_warnings_and_the_cache(own_cache, capsys):
    from IPython.testing import globalipapp

    globalipapp.start_ipython()
    ip = globalipapp.get_ipython()
    ip.run_line_magic("load_ext", "tensorjob_jupyter")
    value = ip.run_cell_magic("tensorjob", "--cflags=-Wall --quiet", WARNS.replace("tj_done(input)", "tj_done(tj_jsonf(\"7\"))"))
    assert value.result == 7  # the cell's value is the envelope
    assert "unused_here" in capsys.readouterr().err
    ip.run_line_magic("tensorjob", "cache")
    assert str(own_cache) in capsys.readouterr().out
    ip.run_line_magic("tensorjob", "cache clear")
    assert "removed" in capsys.readouterr().out and tjc.cache_usage() == (0, 0)
    assert "compile cache" in ip.magics_manager.magics["line"]["tensorjob"].__doc__

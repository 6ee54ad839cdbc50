"""Guest sources (C, Zig, WAT) to WebAssembly, with a content-hash cache.

Every guest reaches the host as a :class:`GuestSource` -- its name, its language (detected once),
its wasm bytes and where it came from -- made by ``from_file``, ``from_text`` or ``from_wasm``; a
string is always a path, never source code. C and Zig go through the ``ziglang`` wheel, WAT through
``wasmtime.wat2wasm``, so nothing but pip is needed; Python is not compiled, only checked by the
guest's own interpreter. Compiling is slow and notebooks re-run cells, so results are cached by a
hash of everything that determines the bytes (``cache_dir()``, always safe to delete). The four
languages' compilers sit side by side here (one cache, one error shape), which is why it runs a
little past the others' length.

Design: docs/internals/sandbox.md#compilepy
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import wasmtime

from tensorjob_jupyter.abi import TensorjobError
from tensorjob_jupyter.sandbox.cache import cache_dir, read_regular
from tensorjob_jupyter.sandbox.guest import MAX_MODULE_BYTES, WASM_MAGIC, GuestTrap
from tensorjob_jupyter.sandbox.python.guest import check_syntax
from tensorjob_jupyter.sandbox.python.program import PythonProgram, PythonSyntaxError, is_program

__all__ = [
    "CompileError",
    "CompileStats",
    "C_FLAGS",
    "GuestSource",
    "ZIG_FLAGS",
    "cache_dir",
    "clear_cache",
    "compile_file",
    "compile_source",
    "compiler_version",
    "detect_language",
    "sdk_dir",
    "stats",
]
LANGS = ("c", "zig", "wat", "python")
EXTENSIONS = {"c": ".c", "zig": ".zig", "wat": ".wat", "python": ".py"}
_SUFFIX_LANG = {".c": "c", ".h": "c", ".zig": "zig", ".wat": "wat", ".wast": "wat", ".py": "python"}

#: Bump when the way we compile changes in a way flags do not capture.
_CACHE_FORMAT = 1
#: Stack for the guest's shadow stack (the wasm stack of C/Zig locals).
STACK_BYTES = 64 * 1024
#: A compile that runs longer than this is killed (a first Zig build of the
#: standard library pieces takes several seconds on a small machine).
COMPILE_TIMEOUT_S = 300

#: ``zig cc`` flags for C guests (the source file and output are appended).
C_FLAGS: tuple[str, ...] = (
    "--target=wasm32-freestanding",
    "-Os",
    "-nostdlib",
    "-fvisibility=hidden",
    "-Werror=implicit-function-declaration",
    "-Werror=return-type",
    "-Wl,--no-entry",
    f"-Wl,-z,stack-size={STACK_BYTES}",
    "-Wl,--strip-all",
)

#: ``zig build-exe`` flags for Zig guests.
ZIG_FLAGS: tuple[str, ...] = (
    "-target", "wasm32-freestanding",
    "-O", "ReleaseSmall",
    "-fno-entry",
    "-rdynamic",
    "-fstrip",
    "--stack", str(STACK_BYTES),
)


class CompileError(TensorjobError):
    """A guest did not compile. ``str(e)`` is the compiler's diagnostics,
    naming the file as given (``cell.c:3:5: error: ...``)."""

    def __init__(self, message: str, *, lang: str | None = None, filename: str | None = None):
        super().__init__(message)
        self.message = message
        self.lang = lang
        self.filename = filename


@dataclass
class CompileStats:
    """Counters, mainly for tests: a cache hit does not run the compiler."""

    compiler_runs: int = 0
    cache_hits: int = 0

    def reset(self) -> None:
        self.compiler_runs = 0
        self.cache_hits = 0


stats = CompileStats()
_stats_lock = threading.Lock()


# --- locations -------------------------------------------------------------------


def sdk_dir() -> Path:
    """Where ``tensorjob.h`` and ``tensorjob.zig`` live.

    The repository's ``guests/`` in a checkout; ``tensorjob_jupyter/sdk/`` in
    an installed wheel (pyproject force-includes the two files there).
    """
    package = Path(__file__).resolve().parents[1]
    for candidate in (package.parent / "guests", package / "sdk"):
        if (candidate / "tensorjob.h").is_file():
            return candidate
    raise FileNotFoundError(f"the tensorjob guest SDK is missing (looked in {package.parent / 'guests'} and "
                            f"{package / 'sdk'})")


_version_lock = threading.Lock()
_version: str | None = None


def compiler_version() -> str:
    """The bundled zig's version, e.g. ``0.17.1`` (asked once per process)."""
    global _version
    with _version_lock:
        if _version is None:
            try:
                out = subprocess.run([sys.executable, "-m", "ziglang", "version"], capture_output=True,
                                     text=True, timeout=60)
                _version = out.stdout.strip() or "unknown"
            except (OSError, subprocess.SubprocessError):
                _version = "unavailable"
        return _version


# --- language detection ---------------------------------------------------------------

_ZIG_HINTS = re.compile(r"@import\s*\(|^\s*(pub\s+)?(export\s+)?fn\s+\w+\s*\(|^\s*(pub\s+)?const\s+\w+\s*=|"
                        r"^\s*comptime\s*\{|\bcallconv\s*\(", re.M)
_C_HINTS = re.compile(r"^\s*#\s*(include|define|ifn?def|if|pragma)\b|\b(int|void|char|unsigned|static|struct|"
                      r"typedef|tj_cmd|uint\d+_t|size_t)\b[^;{]*[;{(]", re.M)


def _strip_comments(source: str) -> str:
    source = re.sub(r"/\*.*?\*/", " ", source, flags=re.S)
    return re.sub(r"//[^\n]*", " ", source)


_PY_HINTS = re.compile(r"^(?:(?:async\s+)?def\s+\w+\s*\(|class\s+\w+\s*[(:]|(?:import|from)\s+tensorjob\b|"
                       r"(?:import|from)\s+[\w.]+(?:\s+import\s+[\w., ]+)?(?:\s+as\s+\w+)?\s*$)", re.M)


def detect_language(source: str) -> str:
    """``"c"``, ``"zig"``, ``"wat"`` or ``"python"``, recognised from the content.

    WAT starts with ``(module`` (after comments); Zig has ``@import``,
    ``pub fn``/``export fn``, ``const x =``; C has ``#include`` and friends;
    Python has ``def f(...):`` or ``import tensorjob`` at the start of a line.
    Raises ``ValueError`` when nothing matches.
    """
    text = source.lstrip("\ufeff")
    wat = re.sub(r";;[^\n]*", " ", re.sub(r"\(;.*?;\)", " ", text, flags=re.S)).lstrip()
    if wat.startswith("(module") or wat.startswith("(component"):
        return "wat"
    body = _strip_comments(text)
    if re.search(r"^\s*#\s*include\b", body, re.M):
        return "c"
    if _PY_HINTS.search(text) and not re.search(r";\s*$", body, re.M):  # C and Zig end statements with ;
        return "python"
    zig = len(_ZIG_HINTS.findall(body))
    c = len(_C_HINTS.findall(body))
    if zig and zig >= c:
        return "zig"
    if c:
        return "c"
    raise ValueError("cannot tell whether this is Python, C, Zig or WAT; name the language "
                     "(lang='python'|'c'|'zig'|'wat')")


def _normalise_lang(lang: str) -> str:
    key = lang.lower().lstrip(".")
    key = {"h": "c", "wast": "wat", "wasm-text": "wat", "py": "python"}.get(key, key)
    if key not in LANGS:
        raise ValueError(f"unknown guest language {lang!r}; expected one of {', '.join(LANGS)}")
    return key


# --- the cache ------------------------------------------------------------------------


def _sdk_fingerprint(lang: str) -> str:
    if lang == "wat":
        return ""
    try:
        d = sdk_dir()
    except FileNotFoundError:
        return "no-sdk"
    name = "tensorjob.h" if lang == "c" else "tensorjob.zig"
    path = d / name
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "missing"


_LOCAL_INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"|@(?:import|embedFile)\s*\(\s*"([^"]+)"\s*\)', re.M)


def _local_dependencies(source: str, base: Path | None, seen: set[Path] | None = None) -> list[tuple[str, str]]:
    """(name, sha256) of files a source pulls in from its own directory.

    Only for :func:`compile_file`: a cell compiled from text has no directory.
    Followed recursively, so an edit to a local header invalidates the cache.
    """
    if base is None:
        return []
    seen = set() if seen is None else seen
    out: list[tuple[str, str]] = []
    for m in _LOCAL_INCLUDE.finditer(source):
        name = m.group(1) or m.group(2)
        if name in ("std", "builtin", "root", "tensorjob", "tensorjob.h"):
            continue
        path = (base / name).resolve()
        if path in seen or not path.is_file():
            continue
        seen.add(path)
        data = path.read_bytes()
        out.append((name, hashlib.sha256(data).hexdigest()))
        out.extend(_local_dependencies(data.decode("utf-8", "replace"), path.parent, seen))
    return out


def _wat_version() -> str:
    try:
        return "wasmtime " + importlib.metadata.version("wasmtime")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover
        return "wasmtime"


def _cache_key(lang: str, source: str, flags: Sequence[str], filename: str, deps: list) -> str:
    version = _wat_version() if lang == "wat" else compiler_version()
    blob = json.dumps([_CACHE_FORMAT, lang, source, list(flags), filename, version, _sdk_fingerprint(lang), deps],
                      ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def _cache_get(key: str) -> bytes | None:
    path = cache_dir() / key[:2] / f"{key}.wasm"
    try:
        data = read_regular(path, MAX_MODULE_BYTES)  # a FIFO planted there is a miss, never a hang
    except OSError:
        return None
    return data if data.startswith(WASM_MAGIC) else None


def _cache_put(key: str, wasm: bytes) -> None:
    folder = cache_dir() / key[:2]
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{key[:16]}-", suffix=".tmp", dir=folder)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(wasm)
            os.replace(tmp, folder / f"{key}.wasm")
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
    except OSError:
        pass  # a read-only or full cache must not break compiling


# --- compiling ------------------------------------------------------------------------


def _source_name(filename: str, lang: str) -> str:
    name = Path(filename).name or "guest"
    ext = EXTENSIONS[lang]
    if not name.endswith(ext):
        name = (name[: -len(Path(name).suffix)] if Path(name).suffix in _SUFFIX_LANG else name) + ext
    return name


_ZIG_CACHE_PATH = re.compile(r"[^\s:'\"]*[/\\]o[/\\][0-9a-f]{16,}[/\\]")


def _clean_diagnostics(text: str, replacements: Iterable[tuple[str, str]]) -> str:
    for old, new in replacements:
        if old:
            text = text.replace(old + os.sep, new).replace(old, new.rstrip("/") or ".")
    text = _ZIG_CACHE_PATH.sub("", text)  # wasm-ld names objects inside zig's cache
    if re.search(r"undefined symbol: guest_(init|step|on_token)", text):
        text = text.rstrip() + ("\nhint: a C guest defines tj_cmd guest_init(tj_json input) and "
                                "tj_cmd guest_step(tj_event ev) (and int guest_on_token(tj_str token) "
                                "when it defines TJ_ON_TOKEN)")
    return text.strip()


def _run_compiler(cmd: list[str], cwd: Path, lang: str, filename: str, replacements: list[tuple[str, str]]) -> str:
    with _stats_lock:
        stats.compiler_runs += 1
    try:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, errors="replace",
                              timeout=COMPILE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise CompileError(f"{filename}: the compiler ran longer than {COMPILE_TIMEOUT_S} s", lang=lang,
                           filename=filename) from None
    except OSError as e:
        raise CompileError(f"{filename}: could not run the compiler ({e})", lang=lang, filename=filename) from None
    text = _clean_diagnostics((proc.stderr or "") + (proc.stdout or ""), replacements)
    if proc.returncode != 0:
        raise CompileError(text or f"{filename}: the compiler failed (exit status {proc.returncode})", lang=lang,
                           filename=filename)
    return text  # warnings, if any


def _compile_c(src: Path, out: Path, flags: Sequence[str], cwd: Path, filename: str,
               replacements: list[tuple[str, str]]) -> str:
    cmd = [sys.executable, "-m", "ziglang", "cc", *C_FLAGS, f"-I{sdk_dir()}", f"-I{src.parent}", *flags,
           "-o", str(out), os.path.relpath(src, cwd)]
    return _run_compiler(cmd, cwd, "c", filename, replacements)


def _compile_zig(src: Path, out: Path, flags: Sequence[str], cwd: Path, filename: str,
                 replacements: list[tuple[str, str]]) -> str:
    sdk = sdk_dir() / "tensorjob.zig"
    cmd = [sys.executable, "-m", "ziglang", "build-exe", *ZIG_FLAGS, *flags, "--name", "guest",
           f"-femit-bin={out}", "--dep", "tensorjob", f"-Mroot={os.path.relpath(src, cwd)}", f"-Mtensorjob={sdk}"]
    return _run_compiler(cmd, cwd, "zig", filename, replacements)


_WAT_LOCATION = re.compile(r"-->\s*<anon>:(\d+):(\d+)")


def _python_guest(source: str, name: str) -> bytes:
    """A Python guest as bytes (``sandbox.python.program``), its syntax checked first like a compile."""
    try:
        check_syntax(source, name)
    except PythonSyntaxError as e:
        raise CompileError(e.message, lang="python", filename=name) from None
    except GuestTrap as e:
        raise CompileError(f"{name}: {e.message}", lang="python", filename=name) from None
    return PythonProgram(source, name).to_bytes()


def _compile_wat(source: str, filename: str) -> bytes:
    with _stats_lock:
        stats.compiler_runs += 1
    try:
        return bytes(wasmtime.wat2wasm(source))
    except wasmtime.WasmtimeError as e:
        text = str(e).strip()
        first = text.splitlines()[0] if text else "invalid WAT"
        m = _WAT_LOCATION.search(text)
        where = f"{filename}:{m.group(1)}:{m.group(2)}" if m else filename
        rest = "\n".join(ln for ln in text.splitlines()[1:] if "<anon>" not in ln)
        message = f"{where}: error: {first}" + (f"\n{rest}" if rest.strip() else "")
        raise CompileError(message, lang="wat", filename=filename) from None


def compile_source(source: str, lang: str | None = None, *, filename: str = "guest",
                   flags: Sequence[str] = (), cache: bool = True, force: bool = False,
                   _base: Path | None = None) -> bytes:
    """Compile guest source text to wasm bytes.

    ``lang`` is ``"c"``, ``"zig"`` or ``"wat"`` (detected when ``None``).
    ``filename`` names the file in diagnostics (``cell`` -> ``cell.c``).
    ``flags`` are extra compiler flags (e.g. ``["-DWINDOW=4096"]``).
    ``cache=False`` neither reads nor writes the cache; ``force=True``
    compiles again and replaces the cached module.
    Raises :class:`CompileError` with the compiler's diagnostics.
    """
    return _compile(source, lang, filename, flags, cache, force, _base)[0]


def _compile(source: str, lang: str | None, filename: str, flags: Sequence[str], cache: bool, force: bool,
             base: Path | None) -> tuple[bytes, str, str]:
    """(wasm, warnings, language); warnings are empty on a cache hit."""
    lang = _normalise_lang(lang) if lang else detect_language(source)
    name = _source_name(filename, lang)
    if lang == "python":  # not compiled: checked by the guest's own interpreter, carried as source
        return _python_guest(source, name), "", lang
    deps = _local_dependencies(source, base)
    key = _cache_key(lang, source, flags, name, deps)
    if cache and not force:
        hit = _cache_get(key)
        if hit is not None:
            with _stats_lock:
                stats.cache_hits += 1
            return hit, "", lang

    warnings = ""
    if lang == "wat":
        wasm = _compile_wat(source, name)
    else:
        with tempfile.TemporaryDirectory(prefix="tensorjob-build-") as tmp:
            tmpdir = Path(tmp)
            out = tmpdir / "guest.wasm"
            replacements = [(str(tmpdir.resolve()), ""), (str(tmpdir), "")]
            if base is None:
                src = tmpdir / name
                src.write_text(source, encoding="utf-8")
                cwd = tmpdir
            else:
                src = base / name
                cwd = base
            build = _compile_c if lang == "c" else _compile_zig
            warnings = build(src, out, flags, cwd, name, replacements)
            wasm = out.read_bytes()
        wasm = strip_linker_exports(wasm)
    if cache:
        _cache_put(key, wasm)
    return wasm, warnings, lang


def _file_language(p: Path, source: str, lang: str | None) -> str:
    return _normalise_lang(lang or _SUFFIX_LANG.get(p.suffix.lower()) or detect_language(source))


def _compile_path(p: Path, lang: str | None, flags: Sequence[str], cache: bool,
                  force: bool) -> tuple[bytes, str, str]:
    source = p.read_text(encoding="utf-8")
    lang = _file_language(p, source, lang)
    # Local includes resolve next to the file, unless the compiler needs a copy named with the right suffix.
    base = p.resolve().parent if lang != "wat" and _source_name(p.name, lang) == p.name else None
    return _compile(source, lang, p.name, flags, cache, force, base)


def compile_file(path: str | os.PathLike, lang: str | None = None, *, flags: Sequence[str] = (),
                 cache: bool = True, force: bool = False) -> bytes:
    """Compile a guest source file; the language comes from the suffix or content.

    Local ``#include "x.h"`` / ``@import("x.zig")`` resolve next to the file,
    and their contents are part of the cache key.
    """
    return _compile_path(Path(path), lang, flags, cache, force)[0]


@dataclass(frozen=True)
class GuestSource:
    """A guest as the host takes it: a name, a language, wasm bytes and an origin.

    ``language`` is ``"c"``, ``"zig"``, ``"wat"`` or ``"wasm"`` (given as a
    module); ``origin`` is the file's path, ``"cell"`` or ``"bytes"``;
    ``warnings`` holds what a successful compile printed (empty when the
    module came from the cache or needed no compiling).
    """

    name: str
    language: str
    wasm: bytes
    origin: str
    warnings: str = ""

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.wasm).hexdigest()

    @classmethod
    def from_wasm(cls, data: bytes | bytearray | memoryview, *, name: str = "guest.wasm",
                  origin: str = "bytes") -> "GuestSource":
        data = bytes(data)
        if not data.startswith(WASM_MAGIC):
            raise ValueError(f"{name} is not a WebAssembly module (no \\0asm header); for source code use "
                             f"GuestSource.from_text or a .c/.zig/.wat file")
        return cls(name, "wasm", data, origin)

    @classmethod
    def from_text(cls, source: str, *, lang: str | None = None, name: str = "cell", cflags: Sequence[str] = (),
                  zigflags: Sequence[str] = (), force: bool = False) -> "GuestSource":
        """Compile source text (a cell): C, Zig or WAT, named or detected; Python is checked and carried."""
        lang = _normalise_lang(lang) if lang else detect_language(source)
        wasm, warnings, lang = _compile(source, lang, name, _flags_for(lang, cflags, zigflags), True, force, None)
        return cls(_source_name(name, lang), lang, wasm, "cell", warnings)

    @classmethod
    def from_file(cls, path: str | os.PathLike, *, lang: str | None = None, cflags: Sequence[str] = (),
                  zigflags: Sequence[str] = (), force: bool = False) -> "GuestSource":
        """A ``.wasm`` as it is; a ``.c``/``.zig``/``.wat`` (or recognisable) file compiled."""
        p = Path(path)
        if not os.path.isfile(p):  # False, not an error, for a name too long to be a path
            shown = str(path) if len(str(path)) <= 200 else str(path)[:200] + "..."
            raise FileNotFoundError(f"guest file not found: {shown}")
        data = p.read_bytes()
        if p.suffix.lower() == ".wasm" or data.startswith(WASM_MAGIC):
            return cls.from_wasm(data, name=p.name, origin=str(p))
        try:
            source = data.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"{path} is neither a WebAssembly module nor UTF-8 source text") from None
        lang = _file_language(p, source, lang)
        wasm, warnings, lang = _compile_path(p, lang, _flags_for(lang, cflags, zigflags), True, force)
        return cls(p.name, lang, wasm, str(p), warnings)

    @classmethod
    def of(cls, guest: "GuestSource | bytes | bytearray | memoryview | str | os.PathLike") -> "GuestSource":
        """A ``GuestSource`` as it is, wasm bytes, or a path (a ``str`` is always a path)."""
        if isinstance(guest, GuestSource):
            return guest
        if isinstance(guest, (bytes, bytearray, memoryview)):
            if is_program(guest):  # a Python guest's bytes (a map's workers get them so)
                program = PythonProgram.from_bytes(bytes(guest))
                return cls(program.filename, "python", bytes(guest), "bytes")
            return cls.from_wasm(guest)
        return cls.from_file(guest)


def _flags_for(lang: str, cflags: Sequence[str], zigflags: Sequence[str]) -> tuple[str, ...]:
    return tuple(cflags) if lang == "c" else tuple(zigflags) if lang == "zig" else ()


def clear_cache() -> tuple[int, int]:
    """Delete every cached module; returns (files, bytes) removed."""
    root = cache_dir()
    files = [p for p in root.rglob("*.wasm")] if root.is_dir() else []
    size = sum(p.stat().st_size for p in files)
    if root.is_dir():
        shutil.rmtree(root, ignore_errors=True)
    return len(files), size


def cache_usage() -> tuple[int, int]:
    """(files, bytes) in the compile cache."""
    root = cache_dir()
    files = [p for p in root.rglob("*.wasm")] if root.is_dir() else []
    return len(files), sum(p.stat().st_size for p in files)


# --- post-processing --------------------------------------------------------------------


def _read_uleb(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def _uleb(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def strip_linker_exports(wasm: bytes) -> bytes:
    """Drop exported globals the linker adds (``__stack_pointer``, ``__heap_base``...).

    The ABI exports only functions and ``memory``; a guest exporting its
    stack pointer would invite a host (or a debugger) to corrupt it.
    Anything unparsable is returned unchanged.
    """
    try:
        if not wasm.startswith(WASM_MAGIC):
            return wasm
        pos = 8
        out = bytearray(wasm[:8])
        changed = False
        while pos < len(wasm):
            sid = wasm[pos]
            size, body = _read_uleb(wasm, pos + 1)
            end = body + size
            if sid == 7:
                count, p = _read_uleb(wasm, body)
                kept = []
                for _ in range(count):
                    start = p
                    nlen, p = _read_uleb(wasm, p)
                    name = wasm[p:p + nlen]
                    p += nlen
                    kind = wasm[p]
                    _, p = _read_uleb(wasm, p + 1)
                    if kind == 3 and name.startswith(b"__"):
                        changed = True
                        continue
                    kept.append(wasm[start:p])
                section = _uleb(len(kept)) + b"".join(kept)
                out += bytes([7]) + _uleb(len(section)) + section
            else:
                out += wasm[pos:end]
            pos = end
        return bytes(out) if changed else wasm
    except (IndexError, ValueError):
        return wasm

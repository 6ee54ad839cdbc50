"""The Python interpreter guests run in: built once, compiled once per engine configuration, checked.

The interpreter is CPython compiled to a WebAssembly component by componentize-py, with the guest
API (``runtime/``) as its app module, snapshotted once initialised, so a job starts from a ready
heap in milliseconds instead of booting CPython. Building (about 20 s) and compiling for an engine
configuration (15-30 s) are slow, so both results are kept in ``<cache_dir()>/python/`` with a
manifest of their SHA-256, built once under a lock file; the compiled file is checked against the
manifest before wasmtime maps it (deserializing is trusting native code), and the cache's files
are read only if they are regular files.

Design: docs/internals/sandbox.md#pythoninterpreterpy
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import importlib.metadata
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import wasmtime
from wasmtime import component

from tensorjob_jupyter.regular_file import open_fd
from tensorjob_jupyter.sandbox.cache import NotARegularFile, cache_dir, open_regular, read_regular

#: The componentize-py this interpreter is built with (pyproject pins the same).
COMPONENTIZE_PY = "componentize-py"
COMPONENTIZE_PY_VERSION = "0.25.1"
#: Bump when the build changes in a way the hashed inputs do not capture.
_BUILD_FORMAT = 1
BUILD_TIMEOUT_S = 600
#: The largest manifest read (it holds a few hashes and sizes); a longer one is damage.
MAX_MANIFEST_BYTES = 64 * 1024
#: The largest interpreter file (component or compiled form: about 40 MB) the cache's reader hashes.
MAX_INTERPRETER_FILE_BYTES = 1024 * 1024 * 1024
HERE = Path(__file__).resolve().parent
WIT = HERE / "wit" / "guest.wit"
RUNTIME = HERE / "runtime"
APP_MODULE = "tensorjob_app"
WASMTIME_VERSION = importlib.metadata.version("wasmtime")

Progress = Callable[[str, float | None], None]


class InterpreterError(Exception):
    """The Python interpreter could not be built, compiled or verified."""


def _no_progress(stage: str, fraction: float | None) -> None:
    pass


def cache_root() -> Path:
    return cache_dir() / "python"


@functools.lru_cache(maxsize=1)
def componentize_py_version() -> str | None:
    """The installed componentize-py's version, read once a process (a search of every path's metadata)."""
    try:
        return importlib.metadata.version(COMPONENTIZE_PY)
    except importlib.metadata.PackageNotFoundError:
        return None


def runtime_files() -> list[Path]:
    return sorted([WIT, *RUNTIME.glob("*.py")])


#: How long a look at the runtime files' sizes and times stands (every job asks; a map asks thousands a second).
BUILD_KEY_FRESH_S = 1.0
_LAST_KEY: list = [-math.inf, ""]  # when the runtime files were last looked at, and the key they gave


def build_key() -> str:
    """A hash of everything the built component depends on (hashed again only when a file's size or time
    changes, looked at again once ``BUILD_KEY_FRESH_S`` has passed: every job asks)."""
    now = time.monotonic()
    looked_at, key = _LAST_KEY
    if now - looked_at <= BUILD_KEY_FRESH_S:
        return key
    stats = [(path, path.stat()) for path in runtime_files()]
    key = _build_key(tuple((path, st.st_size, st.st_mtime_ns) for path, st in stats))
    _LAST_KEY[:] = [now, key]
    return key


@functools.lru_cache(maxsize=4)
def _build_key(files: tuple[tuple[Path, int, int], ...]) -> str:
    h = hashlib.sha256(f"tensorjob-python {_BUILD_FORMAT} componentize-py {componentize_py_version()}\n".encode())
    for path, _, _ in files:
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:20]


def engine_key(fuel: bool) -> str:
    """The engine settings a serialized component must match: wasmtime's version, fuel on or off."""
    return f"wasmtime{WASMTIME_VERSION}-epoch-{'fuel' if fuel else 'nofuel'}"


def engine_config(fuel: bool, stack_bytes: int) -> wasmtime.Config:
    cfg = wasmtime.Config()
    cfg.epoch_interruption = True
    cfg.consume_fuel = fuel
    cfg.max_wasm_stack = stack_bytes
    cfg.wasm_component_model = True
    return cfg


def _damaged(e: NotARegularFile) -> InterpreterError:
    return InterpreterError(f"{e}: the Python interpreter's cache is damaged; `tensorjob cache --clear` empties it")


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    try:
        with open_regular(path, MAX_INTERPRETER_FILE_BYTES) as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    except NotARegularFile as e:
        raise _damaged(e) from None
    return h.hexdigest()


@dataclass
class Paths:
    key: str
    root: Path

    @property
    def wasm(self) -> Path:
        return self.root / f"interpreter-{self.key}.wasm"

    @property
    def manifest(self) -> Path:
        return self.root / f"interpreter-{self.key}.json"

    def compiled(self, ekey: str) -> Path:
        return self.root / f"interpreter-{self.key}-{ekey}.cwasm"

    @property
    def lock(self) -> Path:
        return self.root / "build.lock"


def cache_paths() -> Paths:
    return Paths(build_key(), cache_root())


def _read_manifest(paths: Paths) -> dict:
    """The manifest ({} when there is none, or it is not JSON: the build writes it again);
    ``InterpreterError`` when it is not a regular file (a FIFO would hang the read) or is too long."""
    try:
        data = json.loads(read_regular(paths.manifest, MAX_MANIFEST_BYTES))
        return data if isinstance(data, dict) else {}
    except NotARegularFile as e:
        raise _damaged(e) from None
    except (OSError, ValueError):
        return {}


def _write_manifest(paths: Paths, manifest: dict) -> None:
    tmp = paths.manifest.with_suffix(f".json.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)  # a leftover, or a link planted there: never written through
    with open_regular(tmp, flags=os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode="w", follow_symlinks=False) as f:
        f.write(json.dumps(manifest, indent=1, sort_keys=True))
    os.replace(tmp, paths.manifest)


class _FileLock:
    """An exclusive lock on ``path`` across processes (and a thread lock within this one)."""

    _thread_lock = threading.Lock()

    def __init__(self, path: Path):
        self.path = path

    def __enter__(self):
        self._thread_lock.acquire()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            try:
                self._fd = open_fd(self.path, flags=os.O_RDWR | os.O_CREAT, mode=0o600, follow_symlinks=False)
            except NotARegularFile as e:  # a link, a FIFO or a folder where the lock should be
                raise _damaged(e) from None
            fcntl.flock(self._fd, fcntl.LOCK_EX)
        except BaseException:
            self._thread_lock.release()
            raise
        return self

    def __exit__(self, *exc):
        try:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
        finally:
            self._thread_lock.release()


# --- building -----------------------------------------------------------------------------


def _componentize(out: Path, progress: Progress) -> None:
    version = componentize_py_version()
    if version is None:
        raise InterpreterError(f"Python guests need {COMPONENTIZE_PY}=={COMPONENTIZE_PY_VERSION} "
                               f"(pip install '{COMPONENTIZE_PY}=={COMPONENTIZE_PY_VERSION}')")
    if version != COMPONENTIZE_PY_VERSION:
        raise InterpreterError(f"Python guests are built with {COMPONENTIZE_PY}=={COMPONENTIZE_PY_VERSION}; "
                               f"this environment has {version}")
    with tempfile.TemporaryDirectory(prefix="tensorjob-python-build-") as tmp:
        src = Path(tmp) / "runtime"
        shutil.copytree(RUNTIME, src, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        args = ["componentize-py", "-d", str(WIT), "-w", "guest", "componentize", "-p", str(src),
                APP_MODULE, "-o", str(out)]
        env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
        code = "import sys, componentize_py; sys.argv = sys.argv[1:]; componentize_py.script()"
        progress("building the Python interpreter (componentize-py)", None)
        try:
            done = subprocess.run([sys.executable, "-c", code, *args], cwd=tmp, env=env, capture_output=True,
                                  text=True, timeout=BUILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise InterpreterError(f"building the Python interpreter took more than {BUILD_TIMEOUT_S} s") from None
        if done.returncode != 0 or not out.is_file():
            tail = (done.stderr or done.stdout).strip()[-4000:]
            raise InterpreterError(f"componentize-py could not build the Python interpreter:\n{tail}")


def _build(paths: Paths, progress: Progress) -> dict:
    """The component and its manifest (built when missing or when it does not match)."""
    manifest = _read_manifest(paths)
    if paths.wasm.is_file() and manifest.get("wasm_sha256"):
        return manifest
    tmp = paths.root / f".interpreter-{paths.key}.{os.getpid()}.wasm"
    started = time.monotonic()
    try:
        _componentize(tmp, progress)
        digest = _sha256_file(tmp)
        os.replace(tmp, paths.wasm)
    finally:
        tmp.unlink(missing_ok=True)
    manifest = {"key": paths.key, "componentize_py": componentize_py_version(), "wasm_sha256": digest,
                "wasm_bytes": paths.wasm.stat().st_size, "build_s": round(time.monotonic() - started, 1),
                "compiled": {}}
    _write_manifest(paths, manifest)
    for old in paths.root.glob("interpreter-*"):  # earlier builds (another runtime or componentize-py)
        if not old.name.startswith(f"interpreter-{paths.key}"):
            old.unlink(missing_ok=True)
    return manifest


def _compile(paths: Paths, manifest: dict, fuel: bool, progress: Progress) -> dict:
    ekey = engine_key(fuel)
    out = paths.compiled(ekey)
    entry = manifest.get("compiled", {}).get(ekey)
    if entry and out.is_file():
        return manifest
    if _sha256_file(paths.wasm) != manifest.get("wasm_sha256"):
        raise InterpreterError(f"{paths.wasm} does not match the SHA-256 recorded when it was built")
    progress("compiling the Python interpreter for this machine (once per configuration)", None)
    started = time.monotonic()
    engine = wasmtime.Engine(engine_config(fuel, 1 << 20))
    try:
        comp = component.Component.from_file(engine, str(paths.wasm))
        blob = comp.serialize()
    except wasmtime.WasmtimeError as e:
        raise InterpreterError(f"wasmtime could not compile the Python interpreter: {e}") from None
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)  # a leftover, or a link planted there: never written through
    try:
        with open_regular(tmp, flags=os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode="wb", follow_symlinks=False) as f:
            f.write(blob)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    manifest = dict(manifest)
    manifest.setdefault("compiled", {})
    manifest["compiled"] = dict(manifest["compiled"], **{ekey: {
        "sha256": hashlib.sha256(blob).hexdigest(), "bytes": len(blob),
        "compile_s": round(time.monotonic() - started, 1)}})
    _write_manifest(paths, manifest)
    return manifest


# --- loading ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Interpreter:
    """A verified, compiled interpreter for one engine configuration."""

    path: Path
    sha256: str
    wasm_sha256: str
    key: str
    engine_key: str

    def describe(self) -> dict:
        """As a job's record names it."""
        return {"name": "cpython-wasi (componentize-py)", "componentize_py": COMPONENTIZE_PY_VERSION,
                "python": "3.14", "sha256": self.wasm_sha256, "compiled_sha256": self.sha256,
                "engine": self.engine_key}


_verified: dict[tuple, Interpreter] = {}
_verified_lock = threading.Lock()


def _identity(path: Path) -> tuple:
    st = path.stat()
    return (str(path), st.st_ino, st.st_size, st.st_mtime_ns)


def ensure(fuel: bool = False, progress: Progress | None = None) -> Interpreter:
    """The compiled interpreter for this engine configuration: built, compiled and checked as needed."""
    progress = progress or _no_progress
    paths = cache_paths()
    ekey = engine_key(fuel)
    compiled = paths.compiled(ekey)
    with _verified_lock:
        try:
            cached = _verified.get(_identity(compiled))
        except OSError:
            cached = None
    if cached is not None:
        return cached
    for attempt in range(2):
        with _FileLock(paths.lock):
            manifest = _build(paths, progress)
            manifest = _compile(paths, manifest, fuel, progress)
            entry = manifest["compiled"][ekey]
            progress("checking the Python interpreter", None)
            identity = _identity(compiled)
            if _sha256_file(compiled) == entry.get("sha256"):
                interp = Interpreter(compiled, entry["sha256"], manifest["wasm_sha256"], paths.key, ekey)
                with _verified_lock:
                    _verified[identity] = interp
                progress("ready", 1.0)
                return interp
            # Not what was recorded (a torn or altered file): never map it; build it again.
            compiled.unlink(missing_ok=True)
            manifest["compiled"].pop(ekey, None)
            if attempt:
                paths.wasm.unlink(missing_ok=True)
                paths.manifest.unlink(missing_ok=True)
            else:
                _write_manifest(paths, manifest)
    raise InterpreterError(f"the compiled Python interpreter {compiled} does not match its recorded SHA-256")


def load_component(engine: wasmtime.Engine, interp: Interpreter) -> component.Component:
    """Map the verified compiled interpreter into ``engine`` (about 5 ms)."""
    with _verified_lock:
        try:
            ok = _verified.get(_identity(interp.path)) == interp
        except OSError:
            ok = False
    if not ok:
        raise InterpreterError(f"{interp.path} changed since it was checked; run the job again to rebuild it")
    try:
        return component.Component.deserialize_file(engine, str(interp.path))
    except wasmtime.WasmtimeError as e:
        raise InterpreterError(f"wasmtime could not load the compiled Python interpreter: {e}") from None


def is_ready(fuel: bool = False) -> bool:
    """Whether a job would start without building or compiling the interpreter."""
    try:
        paths = cache_paths()
        return paths.compiled(engine_key(fuel)).is_file() and engine_key(fuel) in _read_manifest(paths).get(
            "compiled", {})
    except (OSError, InterpreterError):
        return False


def clear() -> tuple[int, int]:
    """Delete every built and compiled interpreter; (files, bytes) removed."""
    root = cache_root()
    files = size = 0
    with _verified_lock:
        _verified.clear()
    if root.is_dir():
        for p in root.iterdir():
            if not p.is_dir() and p.name != "build.lock":  # a FIFO or a link planted there goes too
                try:
                    size += p.lstat().st_size
                    p.unlink()
                    files += 1
                except OSError:
                    pass
    return files, size


__all__ = [
    "COMPONENTIZE_PY", "COMPONENTIZE_PY_VERSION", "BUILD_TIMEOUT_S", "MAX_MANIFEST_BYTES", "MAX_INTERPRETER_FILE_BYTES", "HERE", "WIT", "RUNTIME",
    "APP_MODULE", "WASMTIME_VERSION", "Progress", "InterpreterError", "cache_root", "componentize_py_version",
    "runtime_files", "build_key", "engine_key", "engine_config", "Paths", "cache_paths", "Interpreter", "ensure",
    "load_component", "is_ready", "clear"
]

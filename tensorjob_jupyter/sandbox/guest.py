"""One wasm guest instance: validated exports, bounded memory access, limited calls.

A ``Guest`` owns a wasmtime ``Store`` and must be used from one thread only (the job's thread).
Everything else about it is shaped by hostility: modules are compiled once per content hash and
configuration; imports and exports are checked before instantiation, with a message naming the
export; each guest has its own store on a shared engine (``engines.py``), every call runs under
its own deadline and ``interrupt()`` stops this guest alone; descriptors and payloads are
bounds-checked before they are read. Failures surface as ``GuestTrap(code, message)``: ``timeout``
for deadlines and fuel, ``cancelled`` after ``interrupt()``, ``wasm_trap`` for the rest.

Design: docs/internals/sandbox.md#guestpy
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.metadata
import struct
import threading
import time
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Iterable, Protocol, cast

import wasmtime

from tensorjob_jupyter import abi
from tensorjob_jupyter.abi import JobFailure, codes
from tensorjob_jupyter.limits import Limits
from tensorjob_jupyter.sandbox.engines import (
    TICK_S, EpochTicked, PoolShape, SharedEngine, engine_for, forget_prepared,
)
from tensorjob_jupyter.sandbox.wasmcall import HotCall, HotMemory

WASM_MAGIC = b"\0asm"
#: Compiling is the one step no deadline can interrupt (it runs before the guest
#: does), so the module size bounds it: real guests are kilobytes to a few MiB.
MAX_MODULE_BYTES = 8 * 1024 * 1024
PAGE = 65536
_DESC = struct.Struct("<II")

I32 = wasmtime.ValType.i32()
WASMTIME_VERSION = importlib.metadata.version("wasmtime")


class GuestTrap(JobFailure):
    """A guest call failed; ``code`` is the envelope error code."""


class HostImports(Protocol):
    """Host functions a guest may import (e.g. the wasi:tensor streaming ones).

    An import kind that can be linked once per engine also has ``shared_key`` (a string naming the kind)
    and a classmethod ``define_shared(linker, current)``: its functions find the calling guest's own
    instance of the kind through ``current()`` (``current_import``), so the linker -- and the
    ``InstancePre`` made with it -- serves every guest on the engine."""

    def names(self) -> Iterable[tuple[str, str]]: ...

    def define(self, linker: wasmtime.Linker) -> None: ...


class SharedHostImports(HostImports, Protocol):
    """An import kind that can be linked once per engine (see ``HostImports``)."""

    shared_key: str

    @classmethod
    def define_shared(cls, linker: wasmtime.Linker, current: Callable[[], Any]) -> None: ...


#: The imports of the guest whose call is running on this thread (a store is used by one thread at a time).
_CURRENT = threading.local()


def current_import(kind: str) -> object | None:
    """The running guest's import of kind ``kind`` (its ``shared_key``), for a function linked once."""
    return getattr(_CURRENT, "imports", {}).get(kind)


# --- compiled-module cache -------------------------------------------------------


@dataclass
class CacheStats:
    compiles: int = 0
    hits: int = 0


class ModuleCache:
    """Compiled modules by (sha256 of the bytes, engine configuration).

    Artifacts are kept serialized, so a module the shared engine has let go
    of (``engines.MAX_PREPARED``) is loaded again with ``Module.deserialize``
    instead of compiled again. ``stats.hits`` counts every guest that started
    without a compile (from the engine's prepared module or from here).
    """

    def __init__(self, max_entries: int = 256, max_bytes: int = 256 * 1024 * 1024) -> None:
        self._lock = threading.Lock()
        self._entries: dict[tuple[str, tuple], bytes] = {}
        self._max = max_entries
        self._max_bytes = max_bytes
        self._bytes = 0
        self.stats = CacheStats()

    def load(self, engine: wasmtime.Engine, config_key: tuple, wasm: bytes, digest: str) -> wasmtime.Module:
        key = (digest, config_key)
        with self._lock:
            blob = self._entries.get(key)
        if blob is not None:
            with self._lock:
                self.stats.hits += 1
            return wasmtime.Module.deserialize(engine, blob)
        module = wasmtime.Module(engine, wasm)
        blob = bytes(module.serialize())
        with self._lock:
            self.stats.compiles += 1
            while self._entries and (len(self._entries) >= self._max or self._bytes + len(blob) > self._max_bytes):
                self._bytes -= len(self._entries.pop(next(iter(self._entries))))  # oldest first
            if len(blob) <= self._max_bytes:
                self._entries[key] = blob
                self._bytes += len(blob)
        return module

    def count_hit(self) -> None:
        with self._lock:
            self.stats.hits += 1

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0
        forget_prepared()


MODULE_CACHE = ModuleCache()


def _engine_config(limits: Limits) -> wasmtime.Config:
    cfg = wasmtime.Config()
    cfg.epoch_interruption = True
    cfg.consume_fuel = limits.fuel is not None
    cfg.max_wasm_stack = limits.stack_bytes
    cfg.wasm_memory64 = True  # so a 64-bit guest compiles and is refused by name
    cfg.wasm_threads = False
    return cfg


def _engine_key(limits: Limits) -> tuple:
    """What ``_engine_config(limits)`` depends on."""
    return "epoch", limits.fuel is not None, limits.stack_bytes, WASMTIME_VERSION


#: What one module guest holds at most (``Store.set_limits`` below): one instance, one memory, four tables; its
#: stack and data are the first megabyte it touches.
_POOL_SHAPE = PoolShape(core_instances=1, memories=1, tables=4, keep_resident_bytes=1024 * 1024)


class PoolRefused(Exception):
    """A pooled engine refused a guest for its own limits or room, not the guest's: it starts on demand."""


def _shared_engine(limits: Limits, *, pooled: bool = True) -> tuple[SharedEngine, tuple]:
    """The engine a guest with these settings (fuel on or off, the stack size, its memory limit) starts on, and
    the key its compiled modules are kept under (``engines.engine_for``; ``pooled`` false: on demand)."""
    shared, engine_key = engine_for(("core", *_engine_key(limits)), lambda: _engine_config(limits), _POOL_SHAPE,
                                    limits.memory_bytes, pooled=pooled)
    return shared, engine_key[1:]


# --- module validation ---------------------------------------------------------------

_REQUIRED = {
    "cf_alloc": ([I32], [I32], "(i32 len) -> i32 ptr"),
    "cf_init": ([I32, I32], [I32], "(i32 ptr, i32 len) -> i32 desc_ptr"),
    "cf_step": ([I32, I32], [I32], "(i32 ptr, i32 len) -> i32 desc_ptr"),
}
_OPTIONAL = {
    "cf_on_token": ([I32, I32], [I32], "(i32 ptr, i32 len) -> i32"),
    "cf_signature": ([], [I32], "() -> i32 desc_ptr"),
}


def _sig(ft: wasmtime.FuncType) -> str:
    params = ", ".join(str(p) for p in ft.params)
    results = ", ".join(str(r) for r in ft.results)
    return f"({params}) -> ({results})"


def validate_module(module: wasmtime.Module, limits: Limits, available: set[tuple[str, str]]) -> None:
    """Raise ``GuestTrap(wasm_trap)`` naming the first thing wrong with ``module``."""
    for imp in module.imports:
        if (imp.module, imp.name) not in available:
            offered = sorted({m for m, _ in available}) or ["nothing"]
            raise GuestTrap(codes.WASM_TRAP,
                            f"guest imports `{imp.module}::{imp.name}`, which this host does not provide "
                            f"(it offers {', '.join(offered)})")
    exports = {e.name: e.type for e in module.exports}
    mem = exports.get("memory")
    if mem is None:
        raise GuestTrap(codes.WASM_TRAP, "guest exports no memory")
    if not isinstance(mem, wasmtime.MemoryType):
        raise GuestTrap(codes.WASM_TRAP, "guest export `memory` is not a memory")
    if mem.is_64:
        raise GuestTrap(codes.WASM_TRAP, "guest uses 64-bit memory; only 32-bit guests are supported")
    if mem.limits.min * PAGE > limits.memory_bytes:
        raise GuestTrap(codes.WASM_TRAP,
                        f"guest memory starts at {mem.limits.min} pages ({mem.limits.min * PAGE} bytes), "
                        f"more than the job's memory limit of {limits.memory_bytes} bytes")
    for name, (params, results, text) in _REQUIRED.items():
        ty = exports.get(name)
        if ty is None:
            raise GuestTrap(codes.WASM_TRAP, f"guest does not export `{name}` {text}")
        if not isinstance(ty, wasmtime.FuncType) or ty.params != params or ty.results != results:
            got = _sig(ty) if isinstance(ty, wasmtime.FuncType) else "not a function"
            raise GuestTrap(codes.WASM_TRAP, f"guest export `{name}` has the wrong type: expected {text}, got {got}")
    for name, (params, results, text) in _OPTIONAL.items():
        ty = exports.get(name)
        if ty is None:
            continue
        if not isinstance(ty, wasmtime.FuncType) or ty.params != params or ty.results != results:
            got = _sig(ty) if isinstance(ty, wasmtime.FuncType) else "not a function"
            raise GuestTrap(codes.WASM_TRAP, f"guest export `{name}` has the wrong type: expected {text}, got {got}")


def module_digest(wasm: bytes) -> str:
    return hashlib.sha256(wasm).hexdigest()


# --- the guest -------------------------------------------------------------------------


class Guest(EpochTicked):
    """A live guest instance. Not thread-safe except ``interrupt()``."""

    def __init__(self, wasm: bytes, limits: Limits | None = None,
                 imports: Iterable[HostImports] = (), *, deadline: float | None = None,
                 cache: ModuleCache = MODULE_CACHE, digest: str | None = None):
        self.limits = limits or Limits()
        self.deadline = deadline  # monotonic time the whole job must end by
        self.peak_memory_bytes = 0
        self._size = 0  # the memory's size after the last guest call
        self._interrupted = False
        self._closed = False
        if not isinstance(wasm, bytes):
            wasm = bytes(wasm)
        if len(wasm) > MAX_MODULE_BYTES:
            raise GuestTrap(codes.WASM_TRAP, f"module is {len(wasm)} bytes, over the {MAX_MODULE_BYTES}-byte limit")
        if not wasm.startswith(WASM_MAGIC):
            raise GuestTrap(codes.WASM_TRAP, "not a WebAssembly module (no \\0asm header)")
        self.digest = digest or module_digest(wasm)
        imports = list(imports)
        try:
            instance, store = self._start(_shared_engine(self.limits), wasm, imports, cache)
        except PoolRefused:  # a pool's own limits, or its room, refused what the on-demand engine allows
            instance, store = self._start(_shared_engine(self.limits, pooled=False), wasm, imports, cache)
        ex = instance.exports(store)
        self._memory = HotMemory(store, ex["memory"])
        # The ABI's exports, called through prepared C calls (wasmcall.py): their
        # signatures were checked above, and they are the host's hottest path.
        self._alloc = HotCall(store, ex["cf_alloc"], 1, checked=True)
        self._init = HotCall(store, ex["cf_init"], 2, checked=True)
        self._step = HotCall(store, ex["cf_step"], 2, checked=True)
        on_token = ex.get("cf_on_token")
        self._on_token = HotCall(store, on_token, 2, checked=True) if on_token is not None else None
        self._note_memory()

    def _start(self, engine: tuple[SharedEngine, tuple], wasm: bytes, imports: list, cache: ModuleCache
               ) -> tuple[Any, wasmtime.Store]:
        """The guest's instance and store on ``engine`` (an engine and its modules' key). ``PoolRefused`` where a
        pooled engine refused it for its own limits or room (nothing of the guest has run: its start is not a
        trap), so that the caller starts it again on demand."""
        self._shared, key = engine
        self._closed, self._stopped = False, None
        pooled = self._shared.pooled
        kinds = tuple(sorted(getattr(imp, "shared_key", None) or "" for imp in imports))
        linked_once = all(kinds)
        shared = cast("list[SharedHostImports]", imports) if linked_once else []  # each has a shared_key
        self._imports = {imp.shared_key: imp for imp in shared}
        module = self._module(wasm, key, cache, pooled=pooled)
        available = {n for imp in imports for n in imp.names()}

        def validate() -> bool:
            validate_module(module, self.limits, available)
            return True
        self._shared.prepared(("valid", self.digest, self.limits.memory_bytes, frozenset(available)), validate)

        store = self._store = wasmtime.Store(self._shared.engine)
        store.set_limits(memory_size=self.limits.memory_bytes, table_elements=1_000_000,
                         instances=1, tables=4, memories=1)
        if self.limits.fuel is not None:
            store.set_fuel(self.limits.fuel)
        self._watch(store)
        self._start_ticks()
        self._export = "instantiate"
        try:
            self._arm()
            _CURRENT.imports = self._imports
            if linked_once:
                pre, _ = self._shared.prepared(("pre", self.digest, kinds),
                                               lambda: self._linker(shared, kinds).instantiate_pre(module))
                instance = pre.instantiate(store)
            else:  # an import only this guest has: linked for it alone
                linker = wasmtime.Linker(self._shared.engine)
                for imp in imports:
                    imp.define(linker)
                instance = linker.instantiate(store, module)
        except GuestTrap:
            self.close()
            raise
        except wasmtime.Trap as e:
            self.close()
            raise self._trap(e) from None
        except wasmtime.WasmtimeError as e:
            self.close()
            if self._stopped is not None:
                raise self._stop_trap() from None
            if pooled:
                raise PoolRefused(_first_line(e)) from None
            raise GuestTrap(codes.WASM_TRAP, f"could not instantiate the guest: {_first_line(e)}") from None
        return instance, store

    def _module(self, wasm: bytes, key: tuple, cache: ModuleCache, *, pooled: bool) -> wasmtime.Module:
        """The module on the shared engine: compiled (or deserialized from ``cache``) the first time; on a pooled
        engine, a module its limits refuse is ``PoolRefused`` (the on-demand engine says whether it is valid)."""
        def load() -> wasmtime.Module:
            try:
                return cache.load(self._shared.engine, key, wasm, self.digest)
            except wasmtime.WasmtimeError as e:
                if pooled:
                    raise PoolRefused(_first_line(e)) from None
                raise GuestTrap(codes.WASM_TRAP, f"invalid WebAssembly module: {_first_line(e)}") from None

        module, made = self._shared.prepared(("module", self.digest), load)
        if not made:
            cache.count_hit()
        return module

    def _linker(self, imports: list[SharedHostImports], kinds: tuple) -> wasmtime.Linker:
        """The engine's linker for this set of import kinds, their functions defined once."""
        def make() -> wasmtime.Linker:
            linker = wasmtime.Linker(self._shared.engine)
            for imp in {type(imp): imp for imp in imports}.values():
                kind = imp.shared_key
                imp.define_shared(linker, partial(current_import, kind))
            return linker
        return self._shared.prepared(("linker", kinds), make)[0]

    # -- deadlines and interruption ---------------------------------------------------

    def _arm(self) -> None:
        if self._interrupted:
            raise GuestTrap(codes.CANCELLED, "job cancelled")
        budget, cause = self.limits.call_timeout_s, "call"
        if self.deadline is not None:
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                raise GuestTrap(codes.TIMEOUT, f"the job ran past its time limit of {self.limits.job_timeout_s} s")
            if remaining < budget:
                budget, cause = remaining, "job"
        self._stopped = None
        self._arm_until(self._store, budget, cause)

    def _stop_trap(self) -> GuestTrap:
        """Why the call the clock stopped ended (``_stopped``: cancelled, or whose time ran out)."""
        where = self._export
        if self._stopped == "cancelled" or self._interrupted:
            return GuestTrap(codes.CANCELLED, "job cancelled")
        if self._stopped == "job":
            return GuestTrap(codes.TIMEOUT, f"the job ran past its time limit of {self.limits.job_timeout_s} s "
                                            f"(inside `{where}`)")
        return GuestTrap(codes.TIMEOUT, f"`{where}` ran past its {self.limits.call_timeout_s} s deadline")

    def _trap(self, e: wasmtime.Trap) -> GuestTrap:
        code = e.trap_code
        where = self._export
        if code == wasmtime.TrapCode.INTERRUPT:
            return self._stop_trap()
        if code == wasmtime.TrapCode.OUT_OF_FUEL:
            return GuestTrap(codes.TIMEOUT, f"the guest used up its fuel ({self.limits.fuel}) inside `{where}`")
        if code == wasmtime.TrapCode.STACK_OVERFLOW:
            return GuestTrap(codes.WASM_TRAP, f"stack overflow in `{where}` (recursion deeper than the "
                                              f"{self.limits.stack_bytes}-byte wasm stack)")
        return GuestTrap(codes.WASM_TRAP, f"guest trapped in `{where}`: {_first_line(e)}")

    def _call(self, name: str, func: HotCall, *args: int) -> int:
        self._export = name
        self._arm()
        _CURRENT.imports = self._imports
        try:
            return func(*args)
        except wasmtime.Trap as e:
            raise self._trap(e) from None
        except wasmtime.WasmtimeError as e:
            if self._stopped is not None:
                raise self._stop_trap() from None
            raise GuestTrap(codes.WASM_TRAP, f"`{name}` failed: {_first_line(e)}") from None
        finally:
            self._note_memory()

    def _note_memory(self) -> int:
        """The memory's size now (it only changes inside a guest call); kept as the peak too."""
        size = self._memory.size() if hasattr(self, "_memory") else 0
        self._size = size
        if size > self.peak_memory_bytes:
            self.peak_memory_bytes = size
        return size

    # -- memory ---------------------------------------------------------------------

    @property
    def memory_bytes(self) -> int:
        return self._memory.size()

    def _base(self) -> int:
        return self._memory.base()

    def read(self, ptr: int, length: int, what: str) -> bytes:
        size = self._memory.size()
        if ptr < 0 or length < 0 or ptr + length > size:
            raise GuestTrap(codes.WASM_TRAP, f"{what} [{ptr:#x}, +{length}) lies outside guest memory "
                                             f"({size} bytes)")
        if length == 0:
            return b""
        return ctypes.string_at(self._base() + ptr, length)

    def write(self, data: bytes) -> tuple[int, int]:
        """Allocate with ``cf_alloc`` and copy ``data`` in; returns (ptr, len)."""
        n = len(data)
        ptr = self._call("cf_alloc", self._alloc, n) & 0xFFFFFFFF
        size = self._size  # noted as the call returned
        if ptr + n > size:
            raise GuestTrap(codes.WASM_TRAP, f"cf_alloc({n}) returned {ptr:#x}, which leaves no room for "
                                             f"{n} bytes in guest memory ({size} bytes)")
        if n:
            ctypes.memmove(self._base() + ptr, data, n)
        return ptr, n

    def _read_command(self, name: str, desc_ptr: int) -> abi.Command:
        desc_ptr &= 0xFFFFFFFF
        raw = self.read(desc_ptr, 8, f"descriptor returned by `{name}`")
        ptr, length = _DESC.unpack(raw)
        if length > self.limits.max_command_bytes:
            raise GuestTrap(codes.WASM_TRAP, f"`{name}` returned a {length}-byte command, over the "
                                             f"{self.limits.max_command_bytes}-byte limit")
        payload = self.read(ptr, length, f"command returned by `{name}`")
        try:
            return abi.parse_command(payload, max_values=self.limits.max_command_values)
        except abi.UnsupportedCommand as e:
            raise GuestTrap(codes.UNSUPPORTED, str(e)) from None
        except abi.AbiError as e:
            raise GuestTrap(codes.WASM_TRAP, f"`{name}` returned an invalid command: {e}") from None

    # -- the ABI calls ----------------------------------------------------------------

    def init(self, input_json: bytes) -> abi.Command:
        ptr, n = self.write(input_json)
        return self._read_command("cf_init", self._call("cf_init", self._init, ptr, n))

    def step(self, event: abi.Event | bytes) -> abi.Command:
        data = event if isinstance(event, (bytes, bytearray)) else abi.encode_event(event)
        ptr, n = self.write(data)
        return self._read_command("cf_step", self._call("cf_step", self._step, ptr, n))

    @property
    def judges_tokens(self) -> bool:
        """Whether ``on_token`` can stop an answer: the guest exports ``cf_on_token``."""
        return self._on_token is not None

    def on_token(self, token: str) -> bool:
        """Offer one token; True means continue. Without the export, always True."""
        if self._on_token is None:
            return True
        ptr, n = self.write(token.encode("utf-8"))
        return self._call("cf_on_token", self._on_token, ptr, n) == abi.TokenAction.CONTINUE  # anything else stops

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stop_ticks()
        self._imports = {}
        for attr in ("_memory", "_alloc", "_init", "_step", "_on_token"):
            self.__dict__.pop(attr, None)
        store = self.__dict__.pop("_store", None)
        if store is not None:
            store.close()

    def __enter__(self) -> "Guest":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _first_line(e: BaseException) -> str:
    """The informative line of a wasmtime error: the trap reason, not the backtrace."""
    text = str(e).strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for line in lines:
        if "wasm trap:" in line:
            return line[line.index("wasm trap:") + len("wasm trap:"):].strip()
    if "Caused by:" in lines:
        cause = lines[lines.index("Caused by:") + 1:]
        if cause:
            return cause[-1].split(":", 1)[-1].strip() if cause[-1][:1].isdigit() else cause[-1]
    for line in lines:
        if not line.startswith("error while executing at wasm backtrace"):
            return line
    return text or type(e).__name__


__all__ = [
    "WASM_MAGIC", "MAX_MODULE_BYTES", "PAGE", "TICK_S", "I32", "WASMTIME_VERSION", "GuestTrap", "HostImports",
    "current_import", "EpochTicked", "CacheStats", "ModuleCache", "MODULE_CACHE", "validate_module", "module_digest",
    "PoolRefused", "Guest"
]

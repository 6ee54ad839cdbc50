"""One wasm guest instance: validated exports, bounded memory access, limited calls.

A ``Guest`` owns a wasmtime ``Store`` and must be used from one thread only
(the job's thread). Everything else about it is shaped by hostility:

* Modules are compiled once per content hash and configuration; later loads
  deserialize the cached artifact instead of recompiling.
* Imports and exports are checked before instantiation, so a wrong guest gets
  a message that names the export and the expected signature.
* Each job gets its own ``Engine`` so that its epoch counter is its own: one
  clock thread ticks every live engine, every call into the guest runs under
  an epoch deadline, and ``interrupt()`` (from any thread) pushes the epoch
  past any deadline, stopping a guest even while it spins inside ``cf_step``.
* Descriptors and payloads are bounds-checked against the memory size before
  they are read: ``Memory.read`` clamps like a Python slice and would
  silently return short data.

Failures surface as ``GuestTrap(code, message)``: ``timeout`` for deadlines
and fuel, ``cancelled`` after ``interrupt()``, ``wasm_trap`` for the rest.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.metadata
import math
import struct
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Iterable, Protocol

import wasmtime

from tensorjob_jupyter import abi
from tensorjob_jupyter.abi import JobFailure, codes
from tensorjob_jupyter.limits import Limits
from tensorjob_jupyter.sandbox.wasmcall import HotCall, set_deadline

WASM_MAGIC = b"\0asm"
#: Compiling is the one step no deadline can interrupt (it runs before the guest
#: does), so the module size bounds it: real guests are kilobytes to a few MiB.
MAX_MODULE_BYTES = 8 * 1024 * 1024
PAGE = 65536
TICK_S = 0.02  # epoch tick: deadlines fire within one tick; interrupts are immediate
_DESC = struct.Struct("<II")

I32 = wasmtime.ValType.i32()
WASMTIME_VERSION = importlib.metadata.version("wasmtime")


class GuestTrap(JobFailure):
    """A guest call failed; ``code`` is the envelope error code."""


class HostImports(Protocol):
    """Host functions a guest may import (e.g. the wasi:tensor streaming ones)."""

    def names(self) -> Iterable[tuple[str, str]]: ...

    def define(self, linker: wasmtime.Linker) -> None: ...


# --- the epoch clock -----------------------------------------------------------


class _EpochClock:
    """One daemon thread that advances the epoch of every live guest engine.

    Ticks are counted from a monotonic start, so a late wake-up catches up
    instead of stretching every deadline. An engine marked for interruption
    is pushed far past any deadline on every tick until it is released.
    """

    def __init__(self) -> None:
        self._engines: dict[int, tuple[weakref.ref, list]] = {}
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def register(self, guest: "Guest") -> None:
        with self._cond:
            self._engines[id(guest)] = (weakref.ref(guest), [False])
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="tensorjob-epoch", daemon=True)
                self._thread.start()
            self._cond.notify()

    def unregister(self, guest: "Guest") -> None:
        with self._cond:
            self._engines.pop(id(guest), None)

    def interrupt(self, guest: "Guest") -> None:
        with self._cond:
            entry = self._engines.get(id(guest))
            if entry:
                entry[1][0] = True
        guest._burst()

    def _run(self) -> None:
        start = time.monotonic()
        done = 0
        while True:
            with self._cond:
                while not self._engines:
                    self._cond.wait()
                    start, done = time.monotonic(), 0
                entries = list(self._engines.values())
            due = int((time.monotonic() - start) / TICK_S)
            steps, done = max(due - done, 1), max(due, done + 1)
            for ref, flag in entries:
                guest = ref()
                if guest is None:
                    continue
                if flag[0]:
                    guest._burst()
                else:
                    for _ in range(steps):
                        guest._engine.increment_epoch()
            time.sleep(TICK_S)


_CLOCK = _EpochClock()


class EpochTicked:
    """What every guest kind shares with the one epoch clock: its wasmtime engine (``_engine``) ticks
    while the guest is live (``_start_ticks``/``_stop_ticks``), and a cancel from any thread
    (``interrupt``) pushes it past every deadline at once (``_burst``), where the guest's next call
    (or the one running) traps. The wasm ``Guest`` and the ``PythonGuest`` both are one."""

    _engine: wasmtime.Engine
    _interrupted: bool = False
    _deadline_ticks_max: int = 0

    def _start_ticks(self, call_timeout_s: float) -> None:
        self._deadline_ticks_max = math.ceil(call_timeout_s / TICK_S) + 2
        _CLOCK.register(self)

    def _stop_ticks(self) -> None:
        _CLOCK.unregister(self)

    def interrupt(self) -> None:
        """Stop the guest as soon as possible, from any thread (for cancel)."""
        self._interrupted = True
        _CLOCK.interrupt(self)

    def _burst(self) -> None:
        for _ in range(self._deadline_ticks_max):
            self._engine.increment_epoch()


# --- compiled-module cache -------------------------------------------------------


@dataclass
class CacheStats:
    compiles: int = 0
    hits: int = 0


class ModuleCache:
    """Compiled modules by (sha256 of the bytes, engine configuration).

    Artifacts are kept serialized so that each job's own engine can load them
    with ``Module.deserialize`` (about 40 us) instead of compiling again.
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

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0


MODULE_CACHE = ModuleCache()


def _engine_config(limits: Limits) -> tuple[wasmtime.Config, tuple]:
    cfg = wasmtime.Config()
    cfg.epoch_interruption = True
    cfg.consume_fuel = limits.fuel is not None
    cfg.max_wasm_stack = limits.stack_bytes
    cfg.wasm_memory64 = True  # so a 64-bit guest compiles and is refused by name
    cfg.wasm_threads = False
    key = ("epoch", limits.fuel is not None, limits.stack_bytes, WASMTIME_VERSION)
    return cfg, key


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
                 cache: ModuleCache = MODULE_CACHE):
        self.limits = limits or Limits()
        self.deadline = deadline  # monotonic time the whole job must end by
        self.digest = module_digest(wasm)
        self.peak_memory_bytes = 0
        self._size = 0  # the memory's size after the last guest call
        self._interrupted = False
        self._closed = False
        wasm = bytes(wasm)
        if len(wasm) > MAX_MODULE_BYTES:
            raise GuestTrap(codes.WASM_TRAP, f"module is {len(wasm)} bytes, over the {MAX_MODULE_BYTES}-byte limit")
        if not wasm.startswith(WASM_MAGIC):
            raise GuestTrap(codes.WASM_TRAP, "not a WebAssembly module (no \\0asm header)")

        cfg, key = _engine_config(self.limits)
        self._engine = wasmtime.Engine(cfg)
        try:
            module = cache.load(self._engine, key, wasm, self.digest)
        except wasmtime.WasmtimeError as e:
            raise GuestTrap(codes.WASM_TRAP, f"invalid WebAssembly module: {_first_line(e)}") from None

        imports = list(imports)
        available = {n for imp in imports for n in imp.names()}
        validate_module(module, self.limits, available)

        self._store = wasmtime.Store(self._engine)
        self._store.set_limits(memory_size=self.limits.memory_bytes, table_elements=1_000_000,
                               instances=1, tables=4, memories=1)
        if self.limits.fuel is not None:
            self._store.set_fuel(self.limits.fuel)
        linker = wasmtime.Linker(self._engine)
        for imp in imports:
            imp.define(linker)
        self._start_ticks(self.limits.call_timeout_s)
        self._export = "instantiate"
        try:
            self._arm()
            instance = linker.instantiate(self._store, module)
        except wasmtime.Trap as e:
            self.close()
            raise self._trap(e) from None
        except wasmtime.WasmtimeError as e:
            self.close()
            raise GuestTrap(codes.WASM_TRAP, f"could not instantiate the guest: {_first_line(e)}") from None
        ex = instance.exports(self._store)
        self._memory: wasmtime.Memory = ex["memory"]
        # The ABI's exports, called through prepared C calls (wasmcall.py): their
        # signatures were checked above, and they are the host's hottest path.
        self._alloc = HotCall(self._store, ex["cf_alloc"], 1)
        self._init = HotCall(self._store, ex["cf_init"], 2)
        self._step = HotCall(self._store, ex["cf_step"], 2)
        on_token = ex.get("cf_on_token")
        self._on_token = HotCall(self._store, on_token, 2) if on_token is not None else None
        self.has_on_token = self._on_token is not None
        self._note_memory()

    # -- deadlines and interruption ---------------------------------------------------

    def _arm(self) -> None:
        if self._interrupted:
            raise GuestTrap(codes.CANCELLED, "job cancelled")
        budget = self.limits.call_timeout_s
        self._cause = "call"
        if self.deadline is not None:
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                raise GuestTrap(codes.TIMEOUT, f"the job ran past its time limit of {self.limits.job_timeout_s} s")
            if remaining < budget:
                budget, self._cause = remaining, "job"
        set_deadline(self._store, max(1, math.ceil(budget / TICK_S)) + 1)

    def _trap(self, e: wasmtime.Trap) -> GuestTrap:
        code = e.trap_code
        where = self._export
        if code == wasmtime.TrapCode.INTERRUPT:
            if self._interrupted:
                return GuestTrap(codes.CANCELLED, "job cancelled")
            if self._cause == "job":
                return GuestTrap(codes.TIMEOUT, f"the job ran past its time limit of {self.limits.job_timeout_s} s "
                                                f"(inside `{where}`)")
            return GuestTrap(codes.TIMEOUT, f"`{where}` ran past its {self.limits.call_timeout_s} s deadline")
        if code == wasmtime.TrapCode.OUT_OF_FUEL:
            return GuestTrap(codes.TIMEOUT, f"the guest used up its fuel ({self.limits.fuel}) inside `{where}`")
        if code == wasmtime.TrapCode.STACK_OVERFLOW:
            return GuestTrap(codes.WASM_TRAP, f"stack overflow in `{where}` (recursion deeper than the "
                                              f"{self.limits.stack_bytes}-byte wasm stack)")
        return GuestTrap(codes.WASM_TRAP, f"guest trapped in `{where}`: {_first_line(e)}")

    def _call(self, name: str, func: HotCall, *args: int) -> int:
        self._export = name
        self._arm()
        try:
            return func(*args)
        except wasmtime.Trap as e:
            raise self._trap(e) from None
        except wasmtime.WasmtimeError as e:
            raise GuestTrap(codes.WASM_TRAP, f"`{name}` failed: {_first_line(e)}") from None
        finally:
            self._note_memory()

    def _note_memory(self) -> int:
        """The memory's size now (it only changes inside a guest call); kept as the peak too."""
        size = self._memory.data_len(self._store) if hasattr(self, "_memory") else 0
        self._size = size
        if size > self.peak_memory_bytes:
            self.peak_memory_bytes = size
        return size

    # -- memory ---------------------------------------------------------------------

    @property
    def memory_bytes(self) -> int:
        return self._memory.data_len(self._store)

    def _base(self) -> int:
        return ctypes.addressof(self._memory.data_ptr(self._store).contents)

    def read(self, ptr: int, length: int, what: str) -> bytes:
        size = self._memory.data_len(self._store)
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

    def on_token(self, token: str) -> bool:
        """Offer one token; True means continue. Without the export, always True."""
        if self._on_token is None:
            return True
        ptr, n = self.write(token.encode("utf-8"))
        return self._call("cf_on_token", self._on_token, ptr, n) == abi.TokenAction.CONTINUE  # anything else stops

    @property
    def fuel_left(self) -> int | None:
        return self._store.get_fuel() if self.limits.fuel is not None else None

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stop_ticks()
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
    "EpochTicked", "CacheStats", "ModuleCache", "MODULE_CACHE", "validate_module", "module_digest", "Guest"
]

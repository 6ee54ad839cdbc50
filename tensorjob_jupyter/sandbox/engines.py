"""Shared wasmtime engines: one per configuration, each guest in a store of its own on it.

Making an engine and linking the host's functions costs about a millisecond; doing it once per
configuration instead of once per guest is what lets a map start thousands of guests a second.
What stays per guest is what the guarantees are made of: its own ``Store`` (instance, memory,
fuel), deadline and cancel. Since an engine has one epoch counter, each store's deadline is the
next tick and its callback decides whether it goes on (``EpochTicked``), so a cancel stops one
guest within microseconds and leaves the others running. ``EpochClock`` is the one thread that
ticks every engine with live guests. ``engine_for`` gives a guest a pooled engine (``pooling``):
its memory from slots reserved once, not a reservation mapped and unmapped for each guest.

Design: docs/internals/sandbox.md#enginespy
"""

from __future__ import annotations

import atexit
import collections
import ctypes
import gc
import itertools
import logging
import math
import mmap
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable

import wasmtime
from wasmtime import _ffi as ffi

from tensorjob_jupyter.sandbox.wasmcall import set_deadline

log = logging.getLogger("tensorjob_jupyter")

#: Epoch tick: deadlines fire within one tick; interrupts are immediate.
TICK_S = 0.02
#: What a store's call ends with when its guest is stopped (the interpreter's classifier and ``Guest``
#: look for these words, as for a wasmtime interrupt trap).
STOPPED_MESSAGE = b"wasm trap: interrupt (tensorjob: the guest was stopped)"
#: The last part of a pooled engine's key (``engine_for``).
POOLED = "pooled"
#: Prepared items (modules, pre-linked instances, components) one engine keeps, the least used dropped first.
MAX_PREPARED = 256

_DEADLINE_CB = ctypes.CFUNCTYPE(ctypes.c_size_t, ctypes.POINTER(ffi.wasmtime_context_t), ctypes.c_void_p,
                                ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ffi.wasmtime_update_deadline_kind_t))
_FINALIZE_CB = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_NO_FINALIZER = _FINALIZE_CB()  # a NULL finalizer
_UPDATE_CONTINUE = 0


class SharedEngine:
    """One wasmtime ``Engine`` for one configuration, and what has been prepared on it.

    ``prepared(key, make)`` is a small cache (least recently used dropped past ``MAX_PREPARED``): a
    module compiled or deserialized once, a linker with the host's functions defined once, an
    ``InstancePre`` -- each made by ``make()`` the first time, on the calling thread.
    """

    def __init__(self, config: wasmtime.Config, key: tuple):
        self.engine = wasmtime.Engine(config)
        self.key = key
        self.live = 0  # guests with a store on this engine now (the clock ticks it while > 0)
        self._prepared: collections.OrderedDict[Any, Any] = collections.OrderedDict()
        self._lock = threading.Lock()

    def prepared(self, key: Any, make: Callable[[], Any]) -> tuple[Any, bool]:
        """What ``make()`` made for ``key`` on this engine, and whether it was made just now."""
        with self._lock:
            item = self._prepared.get(key)
            if item is not None:
                self._prepared.move_to_end(key)
                return item, False
        item = make()  # outside the lock: a slow compile must not hold the other guests' starts
        with self._lock:
            kept = self._prepared.setdefault(key, item)
            self._prepared.move_to_end(key)
            while len(self._prepared) > MAX_PREPARED:
                self._prepared.popitem(last=False)
        return kept, kept is item

    @property
    def pooled(self) -> bool:
        """Whether this engine's guests come from a pool's slots (``engine_for``)."""
        return self.key[-1] == POOLED

    def forget(self) -> None:
        with self._lock:
            self._prepared.clear()


_ENGINES: dict[tuple, SharedEngine] = {}
_ENGINES_LOCK = threading.Lock()


def shared_engine(key: tuple, config: Callable[[], wasmtime.Config]) -> SharedEngine:
    """The process's engine for configuration ``key`` (``config()`` builds it the first time)."""
    with _ENGINES_LOCK:
        engine = _ENGINES.get(key)
        if engine is None:
            engine = _ENGINES[key] = SharedEngine(config(), key)
        return engine


# --- the pooling allocator ----------------------------------------------------------------------

#: Guests one pooled engine holds at once; past ``POOL_GUESTS - POOL_MARGIN`` live, the next go to the on-demand
#: engine of the same settings (the margin covers guests starting at the same moment).
POOL_GUESTS = 200
POOL_MARGIN = 32
#: Pooled engines a process makes at most (one for each set of engine settings in use); later settings' guests
#: start on the on-demand engines.
POOL_ENGINES = 4
#: The most linear memory a pooled guest may have (the default ``Limits.memory_bytes``); a guest allowed more
#: runs on the on-demand engine, so no limit is ever lowered by a slot's size.
POOL_MEMORY_BYTES = 256 * 1024 * 1024
#: Free slots kept warm (their memory's first ``PoolShape.keep_resident_bytes`` still mapped, zeroed for the next
#: guest instead of faulted in again): a map's items at once reuse them; the rest are given back to the kernel.
POOL_WARM_SLOTS = 4
#: The most elements a pooled guest's table may hold (the stores' own limit), and the most bytes of an instance's
#: own state (a module with very many functions needs more: it starts on demand, as does any guest a pool's own
#: limits refuse -- ``PoolRefused`` in ``sandbox/guest.py``).
POOL_TABLE_ELEMENTS = 1_000_000
POOL_INSTANCE_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class PoolShape:
    """What one guest of a kind holds at most -- core instances, memories and tables (a component holds several) --
    the bytes of its memory a warm slot keeps mapped (what the kind touches on every start), and whether it is
    a component."""

    core_instances: int
    memories: int
    tables: int
    keep_resident_bytes: int
    component: bool = False


def pooling(config: wasmtime.Config, shape: PoolShape) -> wasmtime.Config:
    """``config`` with wasmtime's pooling instance allocator, sized for ``POOL_GUESTS`` guests of ``shape``:
    instances, memories and tables come from slots reserved once (a memory's image mapped copy-on-write), and a
    guest's end resets its slot instead of unmapping it -- the kernel work that was most of a short guest's cost."""
    pool = ffi.wasmtime_pooling_allocation_config_new()
    try:
        ffi.wasmtime_pooling_allocation_config_total_core_instances_set(pool, POOL_GUESTS * shape.core_instances)
        ffi.wasmtime_pooling_allocation_config_total_memories_set(pool, POOL_GUESTS * shape.memories)
        ffi.wasmtime_pooling_allocation_config_total_tables_set(pool, POOL_GUESTS * shape.tables)
        ffi.wasmtime_pooling_allocation_config_total_component_instances_set(
            pool, POOL_GUESTS if shape.component else 0)
        ffi.wasmtime_pooling_allocation_config_max_memories_per_module_set(pool, shape.memories)
        ffi.wasmtime_pooling_allocation_config_max_tables_per_module_set(pool, shape.tables)
        ffi.wasmtime_pooling_allocation_config_max_core_instance_size_set(pool, POOL_INSTANCE_BYTES)
        ffi.wasmtime_pooling_allocation_config_max_memory_size_set(pool, POOL_MEMORY_BYTES)
        ffi.wasmtime_pooling_allocation_config_table_elements_set(pool, POOL_TABLE_ELEMENTS)
        ffi.wasmtime_pooling_allocation_config_linear_memory_keep_resident_set(pool, shape.keep_resident_bytes)
        ffi.wasmtime_pooling_allocation_config_max_unused_warm_slots_set(pool, POOL_WARM_SLOTS)
        ffi.wasmtime_pooling_allocation_strategy_set(config.ptr(), pool)
    finally:
        ffi.wasmtime_pooling_allocation_config_delete(pool)
    return config


def engine_for(key: tuple, config: Callable[[], wasmtime.Config], shape: PoolShape, memory_bytes: int, *,
               pooled: bool = True) -> tuple[SharedEngine, tuple]:
    """The engine a guest of ``shape`` allowed ``memory_bytes`` starts on, and its key: the pooled one of these
    settings while it has room and the guest fits a slot, else (or with ``pooled`` false: a guest the pool
    refused) the on-demand one (``shared_engine``)."""
    pooled_key = (*key, POOLED)
    if pooled and memory_bytes <= POOL_MEMORY_BYTES and pooled_key not in _UNPOOLED:
        try:
            pool = shared_engine(pooled_key, lambda: pooling(_reservable(config(), shape), shape))
        except (_NoRoom, wasmtime.WasmtimeError) as e:  # its slots cannot be reserved here
            _UNPOOLED.add(pooled_key)
            log.warning("tensorjob: guests of %s start without the pooling allocator: %s", key, e)
        else:
            if pool.live < POOL_GUESTS - POOL_MARGIN:
                return pool, pooled_key
    return shared_engine(key, config), key


#: The pooled engines that could not be made: their guests start on the on-demand engines from then on.
_UNPOOLED: set[tuple] = set()


class _NoRoom(Exception):
    """This process may not reserve what a pool's slots take."""


def _reservable(config: wasmtime.Config, shape: PoolShape) -> wasmtime.Config:
    """``config``, if this process may reserve the slots of a pool for ``shape``: a pool reserves a 4 GiB address
    range for each memory slot when its engine is made (a terabyte or more), and wasmtime ends the process, not
    the call, when it cannot -- under an address-space limit (``RLIMIT_AS``), or on a kernel with a small address
    space. So twice the reservation is tried first (mapped with no access, never touched, and let go at once), and
    a process with ``POOL_ENGINES`` pools already (each set of engine settings has its own) makes no more."""
    pools = sum(1 for e in _ENGINES.values() if e.pooled)  # under _ENGINES_LOCK: shared_engine calls config()
    if pools >= POOL_ENGINES:
        raise _NoRoom(f"this process has {pools} pools already (POOL_ENGINES)")
    size = 2 * POOL_GUESTS * shape.memories * _SLOT_BYTES
    try:
        mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, prot=0).close()
    except (OSError, OverflowError, ValueError) as e:
        raise _NoRoom(f"this process cannot reserve {size >> 30} GiB of address space ({e})") from None
    return config


#: The address range a pooled memory slot takes: 4 GiB and its guard.
_SLOT_BYTES = (4 << 30) + (32 << 20)


def forget_prepared() -> None:
    """Drop every module and component prepared on the shared engines (the next guests prepare them again)."""
    with _ENGINES_LOCK:
        engines = list(_ENGINES.values())
    for engine in engines:
        engine.forget()


# A linker's host functions end with a finalizer that is a Python callback (wasmtime-py's ``func_finalize``).
# Left to the interpreter's teardown, a cached linker can be freed after that callback is, and the process
# ends in SIGSEGV; dropping what the engines prepared while the interpreter is whole keeps the exit clean.
@atexit.register
def _release_at_exit() -> None:
    forget_prepared()
    gc.collect()  # and the guests a reference cycle still holds, while their finalizers can run


# --- the clock -------------------------------------------------------------------------------


class EpochClock:
    """One daemon thread that advances the epoch of every engine with live guests, once a tick."""

    def __init__(self) -> None:
        self._engines: dict[int, SharedEngine] = {}
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def register(self, engine: SharedEngine) -> None:
        with self._cond:
            engine.live += 1
            self._engines[id(engine)] = engine
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="tensorjob-epoch", daemon=True)
                self._thread.start()
            self._cond.notify()

    def unregister(self, engine: SharedEngine) -> None:
        with self._cond:
            engine.live -= 1
            if engine.live <= 0:
                engine.live = 0
                self._engines.pop(id(engine), None)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._engines:
                    self._cond.wait()
                engines = list(self._engines.values())
            for engine in engines:
                engine.engine.increment_epoch()
            time.sleep(TICK_S)


CLOCK = EpochClock()


# --- each store's deadline ---------------------------------------------------------------------

#: Each watched guest by its key: a weak reference whose callback drops the entry. No lock guards it: the callback
#: runs wherever the garbage collector does -- inside any allocation, a thread holding such a lock included, which
#: then waits on itself -- and each change is one dict operation, atomic under the GIL.
_TICKED: dict[int, "weakref.ref[EpochTicked]"] = {}
_IDS = itertools.count(1)


@_DEADLINE_CB
def _on_deadline(context, data, delta, kind):  # type: ignore[no-untyped-def]
    """A store's deadline passed (a tick, or a kick): on for one more tick, or stop the call."""
    try:
        ref = _TICKED.get(data or 0)
        guest = ref() if ref is not None else None
        if guest is not None and guest._epoch_verdict() is None:
            delta[0] = 1
            kind[0] = _UPDATE_CONTINUE
            return 0
    except BaseException:  # noqa: BLE001 - never into wasmtime: a failure here stops the call
        pass
    return ctypes.cast(ffi.wasmtime_error_new(STOPPED_MESSAGE), ctypes.c_void_p).value or 0


def _forget(key: int) -> None:
    _TICKED.pop(key, None)


class EpochTicked:
    """What every guest kind shares with the clock: a store on a shared engine whose deadline is the next
    tick, a callback that decides at each tick, and a cancel from any thread (``interrupt``).

    A guest sets ``_shared`` and calls ``_watch(store)`` once its store exists, ``_start_ticks`` while it
    is live, ``_arm_until(seconds, cause)`` before each stretch of guest code, and reads ``_stopped``
    (``"cancelled"``, ``"call"`` or ``"job"``) when a call ends in an error."""

    _shared: SharedEngine
    _interrupted: bool = False
    _stop_at: float = math.inf
    _cause: str = "call"
    _stopped: str | None = None
    _ticking: bool = False

    def _watch(self, store: wasmtime.Store) -> None:
        """Install the deadline callback on ``store`` (once, right after it is made)."""
        key = next(_IDS)
        # the entry goes with the guest (no store finalizer: one called back into Python as the interpreter ends
        # crashes)
        _TICKED[key] = weakref.ref(self, lambda _ref: _forget(key))
        ffi.wasmtime_store_epoch_deadline_callback(store.ptr(), _on_deadline, key, _NO_FINALIZER)
        ffi.wasmtime_context_set_epoch_deadline(store._context(), 1)

    def _start_ticks(self, call_timeout_s: float | None = None) -> None:
        if not self._ticking:
            self._ticking = True
            CLOCK.register(self._shared)

    def _stop_ticks(self) -> None:
        if self._ticking:
            self._ticking = False
            CLOCK.unregister(self._shared)

    def _arm_until(self, context: Any, seconds: float, cause: str) -> None:
        """The next stretch of guest code on ``context`` (a store or a call's context) may run ``seconds``."""
        self._stop_at = time.monotonic() + seconds
        self._cause = cause
        set_deadline(context, 1)

    def _epoch_verdict(self) -> str | None:
        """None: the call goes on; else why it stops (kept in ``_stopped``). On the guest's thread."""
        if self._interrupted:
            self._stopped = "cancelled"
        elif time.monotonic() >= self._stop_at:
            self._stopped = self._cause
        else:
            return None
        return self._stopped

    def interrupt(self) -> None:
        """Stop the guest as soon as possible, from any thread (for cancel)."""
        self._interrupted = True
        self._kick()

    def _kick(self) -> None:
        """Tick this guest's engine now: a store inside a call asks its callback at once."""
        shared = getattr(self, "_shared", None)
        if shared is not None:
            shared.engine.increment_epoch()


__all__ = [
    "TICK_S", "STOPPED_MESSAGE", "MAX_PREPARED", "SharedEngine", "shared_engine", "forget_prepared", "EpochClock",
    "CLOCK", "EpochTicked"
]

"""The hot calls into a guest, made through wasmtime's C API directly.

This is the one module that goes below wasmtime-py's public API, and only for speed: a token costs
the host two guest calls, and ``Func.__call__`` spends most of its time in Python around a call
that takes a microsecond. ``HotCall`` prepares everything once and calls
``wasmtime_func_call_unchecked``, which is sound because the signatures are checked when the guest
is validated. Traps and errors surface exactly as through the public API
(``tests/sandbox/test_wasmcall.py`` checks it). ``HotMemory`` and ``set_deadline`` read a memory and
set a deadline through bindings that keep the GIL: calls of nanoseconds need no hand-off to another
thread. Tested with wasmtime-py 50 (the range ``pyproject.toml`` pins).

Design: docs/internals/sandbox.md#wasmcallpy
"""

from __future__ import annotations

import ctypes

import wasmtime
from wasmtime import _ffi as ffi
from wasmtime._func import maybe_raise_last_exn

_TRAP = ctypes.POINTER(ffi.wasm_trap_t)

#: The same C API through bindings that keep the GIL, for calls that take nanoseconds and never block or call
#: back: through the usual ones each lets the GIL go and takes it back, which with a map's items running on
#: several threads is a hand-off to another thread and back for every one.
_HELD = ctypes.PyDLL(ffi.dll._name, handle=ffi.dll._handle)
_memory_data = _HELD.wasmtime_memory_data
_memory_data.restype = ctypes.c_void_p
_memory_data.argtypes = [ctypes.POINTER(ffi.wasmtime_context_t), ctypes.POINTER(ffi.wasmtime_memory_t)]
_memory_data_size = _HELD.wasmtime_memory_data_size
_memory_data_size.restype = ctypes.c_size_t
_memory_data_size.argtypes = [ctypes.POINTER(ffi.wasmtime_context_t), ctypes.POINTER(ffi.wasmtime_memory_t)]
_set_epoch_deadline = _HELD.wasmtime_context_set_epoch_deadline
_set_epoch_deadline.restype = None
_set_epoch_deadline.argtypes = [ctypes.POINTER(ffi.wasmtime_context_t), ctypes.c_uint64]


class HotCall:
    """A prepared call of one export taking and returning i32 values."""

    __slots__ = ("_context", "_func", "_values", "_count")

    def __init__(self, store: wasmtime.Store, func: wasmtime.Func, params: int, *, checked: bool = False):
        """``checked``: the caller has already checked the signature on the module (``validate_module``)."""
        if not checked:
            ty = func.type(store)
            if len(ty.params) != params or len(ty.results) != 1 or any(
                    str(t) != "i32" for t in [*ty.params, *ty.results]):
                raise TypeError(f"HotCall needs ({params} x i32) -> i32, got {ty.params} -> {ty.results}")
        self._context = store._context()
        self._func = ctypes.byref(func._func)
        self._count = max(params, 1)
        self._values = (ffi.wasmtime_val_raw_t * self._count)()

    def __call__(self, *args: int) -> int:
        values = self._values
        for i, value in enumerate(args):
            values[i].i32 = value
        trap = _TRAP()
        error = ffi.wasmtime_func_call_unchecked(self._context, self._func, values, self._count, ctypes.byref(trap))
        if error:
            maybe_raise_last_exn()
            raise wasmtime.WasmtimeError._from_ptr(error)
        if trap:
            trap_obj = wasmtime.Trap._from_ptr(trap)
            maybe_raise_last_exn()
            raise trap_obj
        return values[0].i32


class HotMemory:
    """A guest's memory: its size and where it starts, read as the host reads them around every guest call."""

    __slots__ = ("_context", "_memory")

    def __init__(self, store: wasmtime.Store, memory: wasmtime.Memory):
        self._context = store._context()
        self._memory = ctypes.byref(memory._memory)

    def size(self) -> int:
        """``memory.data_len(store)``."""
        return _memory_data_size(self._context, self._memory)

    def base(self) -> int:
        """The address of the memory's first byte (``memory.data_ptr(store)``); valid until the next guest call."""
        return _memory_data(self._context, self._memory) or 0


def set_deadline(store: wasmtime.Store | wasmtime.Caller, ticks: int) -> None:
    """``store.set_epoch_deadline(ticks)`` (a store's, or a host call's caller's)."""
    _set_epoch_deadline(store._context(), ticks)


__all__ = ["HotCall", "HotMemory", "set_deadline"]

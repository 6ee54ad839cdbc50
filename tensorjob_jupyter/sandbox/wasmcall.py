"""The hot calls into a guest, made through wasmtime's C API directly.

This is the one module that goes below wasmtime-py's public API, and only for speed: a token costs
the host two guest calls, and ``Func.__call__`` spends most of its time in Python around a call
that takes a microsecond. ``HotCall`` prepares everything once and calls
``wasmtime_func_call_unchecked``, which is sound because the signatures are checked when the guest
is validated. Traps and errors surface exactly as through the public API
(``tests/sandbox/test_wasmcall.py`` checks it). Tested with wasmtime-py 50 (the range
``pyproject.toml`` pins).

Design: docs/internals/sandbox.md#wasmcallpy
"""

from __future__ import annotations

import ctypes

import wasmtime
from wasmtime import _ffi as ffi
from wasmtime._func import maybe_raise_last_exn

_TRAP = ctypes.POINTER(ffi.wasm_trap_t)


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


def set_deadline(store: wasmtime.Store, ticks: int) -> None:
    """``store.set_epoch_deadline(ticks)`` without re-checking the store each time."""
    ffi.wasmtime_context_set_epoch_deadline(store._context(), ticks)


__all__ = ["HotCall", "set_deadline"]

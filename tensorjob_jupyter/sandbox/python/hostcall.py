"""Host functions for the Python interpreter's component, defined through wasmtime's C API directly.

``wasmtime.component.LinkerInstance.add_func`` converts every value generically, about 15 us a
call: most of the cost of a guest's command or token. The interpreter's own imports
(``wit/guest.wit``) have fixed, simple signatures, so ``add_func`` here states each signature once
and converts the raw values directly, exactly as wasmtime-py's own conversions do, ownership
included. An exception never crosses into wasmtime's process-wide error slot: it becomes the
call's ``WasmtimeError``. Tested with wasmtime-py 50 (the range ``pyproject.toml`` pins).

Design: docs/internals/sandbox.md#pythonhostcallpy
"""

from __future__ import annotations

import ctypes
import itertools
import threading
from typing import Any, Callable

import wasmtime
from wasmtime import _ffi as ffi

#: The value kinds this module converts: WIT type -> (union field, kind constant).
_KINDS = {
    "bool": ("boolean", ffi.WASMTIME_COMPONENT_BOOL),
    "u8": ("u8", ffi.WASMTIME_COMPONENT_U8),
    "s32": ("s32", ffi.WASMTIME_COMPONENT_S32),
    "u32": ("u32", ffi.WASMTIME_COMPONENT_U32),
    "u64": ("u64", ffi.WASMTIME_COMPONENT_U64),
    "string": ("string", ffi.WASMTIME_COMPONENT_STRING),
    "bytes": ("list", ffi.WASMTIME_COMPONENT_LIST),  # list<u8>, as a result only
}
#: A ``list<u8>`` is a list of whole values, one per byte: laid out here in one pass over the bytes
#: (wasmtime-py's own conversion makes a Python object per byte, about a microsecond each).
_VAL = ffi.wasmtime_component_val_t
_VAL_SIZE = ctypes.sizeof(_VAL)
_KIND_OFFSET = _VAL.kind.offset
_U8_OFFSET = _VAL.of.offset
_U8_KIND = ffi.WASMTIME_COMPONENT_U8.value

_lock = threading.Lock()
_functions: dict[int, tuple[Callable, tuple[str, ...], str | None]] = {}
_ids = itertools.count(1)


class Context:
    """What a host function gets as its store: the calling store's context (valid during the call only)."""

    __slots__ = ("_ptr",)

    def __init__(self, ptr: Any):
        self._ptr = ptr

    def _context(self) -> Any:
        return self._ptr


def _read(value: Any, kind: str) -> Any:
    if kind == "string":
        text = ffi.to_str(value.of.string)
        ffi.wasm_byte_vec_delete(ctypes.byref(value.of.string))
        return text
    if kind == "bool":
        return bool(value.of.boolean)
    return int(getattr(value.of, _KINDS[kind][0]))


def _byte_list(data: bytes) -> Any:
    """A ``wasmtime_component_vallist_t`` of ``u8`` values holding ``data``."""
    raw = ffi.wasmtime_component_vallist_t()
    n = len(data)
    if n == 0:
        ffi.wasmtime_component_vallist_new_empty(ctypes.byref(raw))
        return raw
    layout = bytearray(n * _VAL_SIZE)
    layout[_KIND_OFFSET::_VAL_SIZE] = bytes((_U8_KIND,)) * n
    layout[_U8_OFFSET::_VAL_SIZE] = data
    ffi.wasmtime_component_vallist_new(ctypes.byref(raw), n, (_VAL * n).from_buffer(layout))
    return raw


def _write(result: Any, kind: str, value: Any) -> None:
    field, constant = _KINDS[kind]
    result.contents.kind = constant
    if kind == "bytes":
        result.contents.of.list = _byte_list(bytes(value))
    elif kind == "string":
        result.contents.of.string = ffi.str_to_capi(value)
    elif kind == "bool":
        result.contents.of.boolean = bool(value)
    else:
        setattr(result.contents.of, field, value)


def _error(e: BaseException) -> int:
    if not isinstance(e, wasmtime.WasmtimeError):
        e = wasmtime.WasmtimeError(f"tensorjob: host failure: {type(e).__name__}: {e}")
    return ctypes.cast(e._consume(), ctypes.c_void_p).value or 0


@ffi.wasmtime_component_func_callback_t
def _trampoline(idx, context, ty_raw, args, nargs, results, nresults):  # type: ignore[no-untyped-def]
    try:
        fn, params, result = _functions[idx or 0]
        if nargs != len(params) or nresults != (0 if result is None else 1):
            raise wasmtime.WasmtimeError("tensorjob: a host function was called with the wrong signature")
        values = [_read(args[i], kind) for i, kind in enumerate(params)]
        out = fn(Context(context), *values)
        if result is not None:
            _write(results, result, out)
        return 0
    except BaseException as e:  # noqa: BLE001 - becomes the guest call's error, never an exception slot
        try:
            return _error(e)
        except BaseException:  # noqa: BLE001
            return _error(wasmtime.WasmtimeError("tensorjob: host failure"))


@ctypes.CFUNCTYPE(None, ctypes.c_void_p)
def _finalize(idx):  # type: ignore[no-untyped-def]
    with _lock:
        _functions.pop(idx or 0, None)


def add_func(instance: Any, name: str, fn: Callable, params: tuple[str, ...] = (), result: str | None = None) -> None:
    """Define ``name`` in a component ``LinkerInstance`` as ``fn(store, *params) -> result``."""
    for kind in (*params, *([result] if result else [])):
        if kind not in _KINDS or (kind == "bytes" and kind in params):
            raise ValueError(f"hostcall converts {', '.join(_KINDS)} (bytes as a result only), not {kind}")
    instance._assert_not_locked()
    with _lock:
        idx = next(_ids)
        _functions[idx] = (fn, tuple(params), result)
    data = name.encode("utf-8")
    err = ffi.wasmtime_component_linker_instance_add_func(instance.ptr(), ctypes.create_string_buffer(data),
                                                          len(data), _trampoline, idx, _finalize)
    if err:
        with _lock:
            _functions.pop(idx, None)
        raise wasmtime.WasmtimeError._from_ptr(err)


__all__ = ["Context", "add_func"]

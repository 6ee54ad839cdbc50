"""The ``wasi:tensor/host@0.1.0`` streaming functions a guest may import.

They follow the tensor-wasm streaming interface exactly, return codes included, so a guest written
for it streams here unchanged: ``emit-chunk``, ``flush``, ``input-len`` and ``read-input``. They
run on the job's thread inside a guest call and never raise (an exception would cross
wasmtime-py's process-wide error slot), so every failure is a return code. They are registered once
per engine (``define_shared``), and each call finds the calling guest's own ``StreamingHost``.

Design: docs/internals/sandbox.md#streamingpy
"""

from __future__ import annotations

import ctypes
from typing import Callable, Iterable, Optional

import wasmtime

from tensorjob_jupyter.limits import Limits

MODULES = ("wasi:tensor/host@0.1.0", "wasi:tensor/host")
OK, DISABLED, REFUSED, DISCONNECTED = 0, -1, -2, -3
I32_MAX = 2**31 - 1

_I32 = wasmtime.ValType.i32()


def _memory(caller: wasmtime.Caller) -> wasmtime.Memory | None:
    mem = caller.get("memory")
    return mem if isinstance(mem, wasmtime.Memory) else None


def _range_ok(mem: wasmtime.Memory, caller: wasmtime.Caller, ptr: int, length: int) -> bool:
    return ptr >= 0 and length >= 0 and ptr + length <= mem.data_len(caller)


class StreamingHost:
    """One job's streaming state: its caps, counters, staged input and sink."""

    #: The kind of import this is, for a linker shared by every guest on an engine (``guest.HostImports``).
    shared_key = "wasi:tensor/host"

    def __init__(self, limits: Limits, on_chunk: Callable[[bytes], None],
                 input_bytes: bytes = b"", *, enabled: bool = True,
                 listening: Callable[[], bool] = lambda: True,
                 on_flush: Callable[[], None] = lambda: None):
        self.limits = limits
        self.enabled = enabled
        self.input_bytes = bytes(input_bytes)
        self.bytes_emitted = 0
        self.chunks = 0
        self._on_chunk = on_chunk
        self._listening = listening
        self._on_flush = on_flush

    # -- HostImports ------------------------------------------------------------

    def names(self) -> Iterable[tuple[str, str]]:
        for module in MODULES:
            for name in ("emit-chunk", "flush", "input-len", "read-input"):
                yield module, name

    def define(self, linker: wasmtime.Linker) -> None:
        two = wasmtime.FuncType([_I32, _I32], [_I32])
        none = wasmtime.FuncType([], [_I32])
        for module in MODULES:
            linker.define_func(module, "emit-chunk", two, self._emit_chunk, access_caller=True)
            linker.define_func(module, "flush", none, self._flush, access_caller=True)
            linker.define_func(module, "input-len", none, self._input_len, access_caller=True)
            linker.define_func(module, "read-input", two, self._read_input, access_caller=True)

    @classmethod
    def define_shared(cls, linker: wasmtime.Linker, current: Callable[[], Optional["StreamingHost"]]) -> None:
        """The functions once for every guest on ``linker``'s engine; ``current()`` is the calling guest's host."""
        two = wasmtime.FuncType([_I32, _I32], [_I32])
        none = wasmtime.FuncType([], [_I32])

        def emit_chunk(caller: wasmtime.Caller, ptr: int, length: int) -> int:
            host = current()
            return host._emit_chunk(caller, ptr, length) if host is not None else REFUSED

        def flush(caller: wasmtime.Caller) -> int:
            host = current()
            return host._flush(caller) if host is not None else REFUSED

        def input_len(caller: wasmtime.Caller) -> int:
            host = current()
            return host._input_len(caller) if host is not None else 0

        def read_input(caller: wasmtime.Caller, ptr: int, length: int) -> int:
            host = current()
            return host._read_input(caller, ptr, length) if host is not None else REFUSED

        for module in MODULES:
            linker.define_func(module, "emit-chunk", two, emit_chunk, access_caller=True)
            linker.define_func(module, "flush", none, flush, access_caller=True)
            linker.define_func(module, "input-len", none, input_len, access_caller=True)
            linker.define_func(module, "read-input", two, read_input, access_caller=True)

    # -- the functions ------------------------------------------------------------

    def _emit_chunk(self, caller: wasmtime.Caller, ptr: int, length: int) -> int:
        try:
            if not self.enabled:
                return DISABLED
            if length > self.limits.max_chunk_bytes:
                return REFUSED
            mem = _memory(caller)
            if mem is None or not _range_ok(mem, caller, ptr, length):
                return REFUSED
            if self.bytes_emitted + length > self.limits.max_stream_bytes:
                return REFUSED
            if not self._listening():
                return DISCONNECTED
            base = ctypes.addressof(mem.data_ptr(caller).contents)
            data = ctypes.string_at(base + ptr, length) if length else b""
            self.bytes_emitted += length
            self.chunks += 1
            self._on_chunk(data)
            return OK
        except Exception:  # never let an exception cross into wasm
            return REFUSED

    def _flush(self, caller: wasmtime.Caller) -> int:
        try:
            if not self.enabled:
                return DISABLED
            self._on_flush()
            return OK
        except Exception:
            return REFUSED

    def _input_len(self, caller: wasmtime.Caller) -> int:
        return min(len(self.input_bytes), I32_MAX)

    def _read_input(self, caller: wasmtime.Caller, ptr: int, length: int) -> int:
        try:
            if ptr < 0 or length < 0:
                return REFUSED
            n = min(length, len(self.input_bytes), I32_MAX)
            if n == 0:
                return 0
            mem = _memory(caller)
            if mem is None or not _range_ok(mem, caller, ptr, n):
                return REFUSED
            base = ctypes.addressof(mem.data_ptr(caller).contents)
            ctypes.memmove(base + ptr, self.input_bytes, n)
            return n
        except Exception:
            return REFUSED


__all__ = ["MODULES", "I32_MAX", "StreamingHost"]

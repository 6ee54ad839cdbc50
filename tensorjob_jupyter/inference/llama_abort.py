"""Ending a long llama.cpp decode part-way once every request in it has left, instead of at its end.

While a decode that reads many prompt tokens runs, a thread looks at its requests' jobs; once all have ended it
sets the byte llama.cpp's abort callback reads between graph nodes (``library.abort_switch``: no Python, no GIL
in the decode), and ``llama_decode`` returns 2. A thread of its own because the decode holds the engine's
thread the whole while; a module of its own because it shares nothing with the engine but that byte.

Design: docs/internals/inference.md#what-the-engine-guarantees
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any, Callable

from tensorjob_jupyter.inference.library import abort_switch

#: A decode that reads at least this many prompt tokens is watched while it runs: once every sequence in it has been
#: abandoned, it ends between two of llama.cpp's graph nodes instead of at its end (``AbortWatch``).
ABORT_WATCH_TOKENS = 64
#: How often the watch looks at the jobs of the decode it watches.
ABORT_POLL_S = 0.005


class Aborted(Exception):
    """``llama_decode`` returned 2: the abort callback ended it (``AbortWatch``)."""


class AbortWatch:
    """Ends a long decode as soon as every sequence in it has been abandoned, not at its end: while one runs, a
    thread looks at their jobs every ``ABORT_POLL_S`` and then sets the byte that llama.cpp's abort callback reads
    between graph nodes (``library.abort_switch``: no Python, no GIL, in the decode). Decodes not watched run to
    their end: the byte is clear whenever no decode is watched."""

    def __init__(self, callback: object, byte: ctypes.Array) -> None:
        self._callback = callback  # kept alive as long as llama.cpp may call it
        self._byte = byte
        self._cond = threading.Condition()
        self._watched: list[Callable[[], bool]] | None = None
        self._closed = False
        self._thread: threading.Thread | None = None

    @classmethod
    def install(cls, lc: Any, ctx: Any) -> AbortWatch | None:
        """A watch over the decodes of context ``ctx`` (its ``LlamaContext``; ``lc``: llama-cpp-python), its
        abort callback set; None where the library's callback cannot be trusted (decodes run to their end)."""
        switch = abort_switch(lc)
        if switch is None:
            return None
        callback, byte = switch
        lc.llama_set_abort_callback(ctx.ctx, callback, ctypes.cast(byte, ctypes.c_void_p))
        return cls(callback, byte)

    def start(self, abandoned: list[Callable[[], bool]]) -> None:
        """Watch the decode about to run, whose sequences' jobs have ended once each of ``abandoned`` says so (if
        they already have, it ends at its first node)."""
        with self._cond:
            if all(ended(a) for a in abandoned):
                self._byte[0] = b"\x01"
                return
            self._byte[0] = b"\x00"
            self._watched = abandoned
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="tensorjob-decode-abort", daemon=True)
                self._thread.start()
            self._cond.notify()

    def stop(self) -> None:
        """The decode has returned: clear the byte for the decodes after it."""
        with self._cond:
            self._watched = None
            self._byte[0] = b"\x00"

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._watched = None
            self._cond.notify()

    def _run(self) -> None:
        with self._cond:
            while not self._closed:
                watched = self._watched
                if watched is None:
                    self._cond.wait()
                elif all(ended(abandoned) for abandoned in watched):
                    self._byte[0] = b"\x01"
                    self._watched = None
                else:
                    self._cond.wait(ABORT_POLL_S)


def ended(abandoned: Callable[[], bool]) -> bool:
    """What ``abandoned()`` says, False if it cannot say."""
    try:
        return bool(abandoned())
    except Exception:  # noqa: BLE001 - a request that cannot say is not ended here
        return False


__all__ = ["ABORT_WATCH_TOKENS", "ABORT_POLL_S", "Aborted", "AbortWatch", "ended"]

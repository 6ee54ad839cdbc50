"""``open_guest``: the running guest for a job's bytes, a wasm ``Guest`` or a ``PythonGuest``.

A job carries its guest as bytes (``GuestSource.wasm``); a Python guest's
bytes start with ``python.program.MAGIC``, which no WebAssembly module can.
This module is the one place that tells the two apart when a guest is
instantiated, so the reactor depends on neither adapter by name, and neither
adapter (nor ``compile``) depends on the other.
"""

from __future__ import annotations

from typing import Any, Iterable

from tensorjob_jupyter.limits import Limits
from tensorjob_jupyter.sandbox.guest import Guest
from tensorjob_jupyter.sandbox.python.guest import PythonGuest
from tensorjob_jupyter.sandbox.python.program import is_program

__all__ = ["open_guest"]


def open_guest(blob: bytes, limits: Limits | None = None, imports: Iterable[Any] = (), *,
               deadline: float | None = None, **python: Any) -> Guest | PythonGuest:
    """The guest for ``blob``: a ``PythonGuest`` for a Python program, else the wasm ``Guest``.

    ``python`` (``publish``, ``determinism``, ``progress``) applies to Python guests only; ``determinism``
    may be a function giving it, called only for a Python guest (a replay reads it from its whole recording).
    """
    if is_program(blob):
        if callable(python.get("determinism")):
            python["determinism"] = python["determinism"]()
        return PythonGuest(blob, limits, imports, deadline=deadline, **python)
    return Guest(blob, limits, imports, deadline=deadline)

"""Python guests: a script's ``main(input)`` run by CPython compiled to WebAssembly, under the same job.

* ``program``: the guest as bytes (``PythonProgram``), and its syntax check.
* ``interpreter``: the interpreter component (componentize-py), built, compiled
  and checked once per machine and engine configuration.
* ``guest``: ``PythonGuest``, the adapter the reactor drives like a wasm ``Guest``.
* ``runtime/tensorjob.py``: the guest API, ``import tensorjob as tj``, which runs
  inside the sandbox.
"""

from __future__ import annotations

from tensorjob_jupyter.sandbox.python.program import (MAGIC, PythonProgram, PythonSyntaxError, format_syntax_error,
                                                       is_program)

__all__ = ["MAGIC", "PythonProgram", "PythonSyntaxError", "format_syntax_error", "is_program", "open_guest",
           "check_syntax"]


def open_guest(blob: bytes, limits=None, imports=(), *, deadline=None, **python):
    """The guest for ``blob``: a ``PythonGuest`` for a Python program, else the wasm ``Guest``.

    ``python`` (``publish``, ``determinism``, ``progress``) applies to Python guests only.
    """
    if is_program(blob):
        from tensorjob_jupyter.sandbox.python.guest import PythonGuest
        return PythonGuest(blob, limits, imports, deadline=deadline, **python)
    from tensorjob_jupyter.sandbox.guest import Guest
    return Guest(blob, limits, imports, deadline=deadline)


def check_syntax(source: str, filename: str = "cell.py", *, progress=None) -> None:
    """Raise ``PythonSyntaxError`` (line and column) if ``source`` does not compile in the guest's Python."""
    import json

    from tensorjob_jupyter.sandbox.python.guest import PythonGuest
    with PythonGuest(PythonProgram(source, filename), progress=progress) as guest:
        out = guest.check_syntax()
    if out:
        raise format_syntax_error(filename, json.loads(out))

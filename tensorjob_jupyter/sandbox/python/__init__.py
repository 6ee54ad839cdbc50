"""Python guests: a script's ``main(input)`` run by CPython compiled to WebAssembly, under the same job.

* ``program``: the guest as bytes (``PythonProgram``), and the syntax error type.
* ``interpreter``: the interpreter component (componentize-py), built, compiled
  and checked once per machine and engine configuration.
* ``guest``: ``PythonGuest``, the adapter the reactor drives like a wasm ``Guest``,
  and ``check_syntax`` (the source compiled by the guest's own interpreter).
* ``hostcall``: raw wasmtime host functions the component imports.
* ``runtime/tensorjob.py``: the guest API, ``import tensorjob as tj``, which runs
  inside the sandbox.

``sandbox.instance.open_guest`` picks ``Guest`` or ``PythonGuest`` for a job's
bytes. This package's ``__init__`` re-exports only the leaf ``program`` (no
wasmtime, no interpreter), so importing a submodule never runs anything else.
"""

from __future__ import annotations

from tensorjob_jupyter.sandbox.python.program import (MAGIC, PythonProgram, PythonSyntaxError, format_syntax_error,
                                                       is_program)

__all__ = ["MAGIC", "PythonProgram", "PythonSyntaxError", "format_syntax_error", "is_program"]

"""sandbox: the guest itself -- one wasm instance under its limits, and how it is made.

Owns: ``guest`` (the wasmtime instance: validated exports, bounded memory
reads, calls under an epoch deadline), ``wasmcall`` (the hot call path),
``streaming`` (the ``wasi:tensor/host`` imports), ``compile`` (C, Zig and WAT
sources to a module, cached by content hash; ``GuestSource``), ``python``
(Python guests: CPython compiled to WebAssembly by componentize-py, run under
the same limits; ``PythonGuest`` is driven like ``Guest``), ``instance``
(``open_guest``: ``Guest`` or ``PythonGuest`` for a job's bytes), ``engines`` (the shared wasmtime
engines and their epoch clock) and ``cache`` (``cache_dir()``, a leaf both ``compile`` and
``python.interpreter`` use).
Inside: ``compile`` and ``instance`` sit above ``guest`` and ``python``;
nothing in ``python`` imports ``compile`` or ``instance``.
May import: ``abi``, ``limits``, ``text``, ``version``. Nothing above: a guest
knows nothing of files, models or jobs; it returns commands.
"""


__all__: list[str] = []

"""frontends: how people reach a job -- the options table, the ``%%tensorjob`` magic,
the ``tensorjob`` command, terminal printing and the live view.

Owns: ``options`` (every job flag, once, for the CLI and the magic alike)
and ``input_value`` (``--input`` as JSON, ``$name`` or a Python literal),
``cli`` and ``history_cli`` and ``map_cli`` (the commands, whose work --
loading a guest, listing, showing, replaying, starting a map -- the magic
calls too), ``terminal`` (events as terminal lines, the one guest loader),
``prompt`` (the terminal debug prompt), ``serve`` (``tensorjob serve``: the
model for other kernels, over an OpenAI-compatible API), ``magic`` and ``outcome`` (what a
cell gives back: the envelope, shown once, or a one-line error), ``view/``
(ipywidgets, and the static HTML a finished view leaves).
May import: everything below. Nothing imports a front end but a front end
and the package's ``__init__`` (``load_ipython_extension``).
"""


__all__: list[str] = []

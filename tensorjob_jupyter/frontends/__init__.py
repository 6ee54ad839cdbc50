"""frontends: how people reach a job -- the options table, the ``%%tensorjob`` magic, the ``tensorjob``
command, terminal printing and the views.

Owns: ``options`` (every job flag, once, for the CLI and the magic alike), ``flags`` (a map's and a replay's own
flags, once, likewise) and ``input_value`` (``--input`` as JSON, ``$name`` or a Python literal), ``cli``,
``history_cli``, ``map_cli`` and ``review_cli`` (the commands, whose work the magic calls too), ``requests`` (a
map's and a replay's request, from either door), ``table`` (a map's rows as a table), ``terminal`` (events as
terminal lines, the one guest loader), ``prompt`` (the debug prompt), ``interpreter_progress`` (the Python
interpreter's first build, shown), ``serve_cli`` (``tensorjob serve``), ``magic`` and ``outcome`` (what a cell
gives back), ``export``, ``nbconvert_static`` and ``static_views`` (notebooks with views as static HTML), ``view/``
(the ipywidgets views).
May import: everything below. Nothing imports a front end but a front end and the package's ``__init__``
(``load_ipython_extension``).
"""


__all__: list[str] = []

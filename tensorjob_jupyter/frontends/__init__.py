"""frontends: how people reach a job -- the options table, the ``%%tensorjob`` magic,
the ``tensorjob`` command, terminal printing and the live view.

Owns: ``options`` (every job flag, once, for the CLI and the magic alike),
``cli`` and ``history_cli`` and ``map_cli`` (the commands), ``printer``
(events as terminal lines), ``prompt`` (the terminal debug prompt),
``magic``, ``view/`` (ipywidgets).
May import: everything below. Nothing imports a front end but a front end
and the package's ``__init__`` (``load_ipython_extension``).
"""

"""Notebooks exported with each finished view as static HTML, whether or not widget state was saved.

A finished view's output carries both the live widget and its static HTML, but nbconvert prefers the widget
when the widget state was saved (as nbclient and papermill do), and only its JavaScript can draw it: offline,
the view is blank. ``tensorjob export NOTEBOOK`` (here), ``nbconvert --to tensorjob-html`` and the
``StaticViews`` preprocessor all apply ``static_views.static_views`` instead. nbconvert is imported only when
an export runs, so the command line starts as fast without it.

Design: docs/internals/frontends.md#exportpy
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TextIO

from tensorjob_jupyter.frontends.options import EXIT_FAILED, EXIT_OK, OptionError
from tensorjob_jupyter.frontends.static_views import static_views

# --- tensorjob export ------------------------------------------------------------------------------------


def add_export_parser(sub) -> None:
    p = sub.add_parser("export", help="a notebook as HTML with each finished job or map view as static HTML",
                       description="Export a notebook so that every finished tensorjob view shows without the "
                                   "widget's JavaScript -- offline, on GitHub, in nbviewer -- even when widget "
                                   "state was saved (nbclient, papermill and nbconvert --execute save it).")
    p.add_argument("notebook", help="the .ipynb file")
    p.add_argument("-o", "--output", default=None, metavar="OUT",
                   help="where to write (default: NOTEBOOK with .html, or .static.ipynb with --to ipynb)")
    p.add_argument("--to", choices=("html", "ipynb"), default="html",
                   help="html (default), or the notebook itself with its views made static")
    p.add_argument("--execute", action="store_true",
                   help="run the notebook first, in a fresh kernel (as nbconvert --execute does)")
    p.add_argument("--timeout", type=float, default=600, metavar="S",
                   help="with --execute: the longest a cell may run (default 600 s)")


def cmd_export(args, out: TextIO, err: TextIO) -> int:
    """``tensorjob export``: 0 once written, 1 when a cell failed under ``--execute``, 2 a usage error."""
    try:
        import nbformat
        from nbconvert.exporters import HTMLExporter  # noqa: F401  (checked here, used below)
    except ImportError as e:
        raise OptionError(f"tensorjob export needs nbconvert ({e.name} is missing): pip install nbconvert") from None
    source = Path(args.notebook)
    if not source.is_file():
        raise OptionError(f"{args.notebook}: no such notebook")
    try:
        nb = nbformat.read(source, as_version=4)
    except Exception as e:  # noqa: BLE001 - not JSON, not a notebook
        raise OptionError(f"{args.notebook} is not a notebook: {' '.join(str(e).split())[:300]}") from None
    if args.execute:
        from nbclient import NotebookClient
        from nbclient.exceptions import CellExecutionError

        try:
            NotebookClient(nb, timeout=args.timeout, resources={"metadata": {"path": str(source.parent.absolute())}}
                           ).execute()
        except CellExecutionError as e:
            err.write(f"tensorjob: a cell failed: {' '.join(str(e).split())[:500]}\n")
            return EXIT_FAILED
    static_views(nb)
    if args.to == "ipynb":
        target = Path(args.output or source.with_suffix(".static.ipynb"))
        nbformat.write(nb, target)
    else:
        from tensorjob_jupyter.frontends.nbconvert_static import StaticHTMLExporter  # deferred: nbconvert

        target = Path(args.output or source.with_suffix(".html"))
        body, _ = StaticHTMLExporter().from_notebook_node(nb, resources={"metadata": {"name": source.stem}})
        target.write_text(body, encoding="utf-8")
    out.write(f"{os.fspath(target)}\n")
    return EXIT_OK


__all__ = ["add_export_parser", "cmd_export"]

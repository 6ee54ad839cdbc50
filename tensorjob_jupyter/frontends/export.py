"""Notebooks exported with each finished view as static HTML, whether or not widget state was saved.

A finished view's output carries the live widget and its static HTML; nbconvert prefers the widget when its
state was saved, and offline the view is blank. ``tensorjob export NOTEBOOK`` (here), ``nbconvert --to
tensorjob-html`` and the ``StaticViews`` preprocessor apply ``static_views.static_views`` instead (nbconvert is
imported only when an export runs). A notebook may come from anyone: ``read_notebook`` reads it as every JSON
from elsewhere -- a regular file of at most ``MAX_NOTEBOOK_BYTES``, the strict reader with at most
``MAX_NOTEBOOK_VALUES`` values, each field's type checked (``notebook_problem``), then the schema with
fastjsonschema (nbformat's own validation costs seconds and hundreds of MB on a hostile list) -- and anything
wrong is one line naming where (exit 2), never a traceback.

Design: docs/internals/frontends.md#exportpy
"""

from __future__ import annotations

import errno
import os
import warnings
from pathlib import Path
from typing import Any, TextIO

from tensorjob_jupyter.abi import AbiError, loads_strict
from tensorjob_jupyter.frontends.options import EXIT_FAILED, EXIT_OK, OptionError
from tensorjob_jupyter.frontends.static_views import static_views
from tensorjob_jupyter.regular_file import read_regular
from tensorjob_jupyter.text import clip

#: The largest notebook ``tensorjob export`` reads: it is held in memory whole, as text and parsed.
MAX_NOTEBOOK_BYTES = 256 << 20
#: The most JSON values (array elements, object members) a notebook may hold, counted on its bytes before it is
#: parsed: parsed JSON costs tens of bytes of memory per value.
MAX_NOTEBOOK_VALUES = 10_000_000

# --- reading a notebook from elsewhere ---------------------------------------------------------------------


def _is_text(value: Any) -> bool:
    """A notebook's multi-line string: a string, or a list of strings."""
    return isinstance(value, str) or (isinstance(value, list) and all(isinstance(line, str) for line in value))


def _is_json_mime(mime: str) -> bool:
    return mime == "application/json" or (mime.startswith("application/") and mime.endswith("+json"))


def _bundle_problem(bundle: Any, where: str) -> str | None:
    if not isinstance(bundle, dict):
        return f"{where} is {_kind(bundle)}, not an object"
    for mime, value in bundle.items():
        if not _is_json_mime(mime) and not _is_text(value):
            return f"{where}[{clip(repr(mime), 80)}] is {_kind(value)}, not text"
    return None


def _kind(value: Any) -> str:
    """What a JSON value is, in words (for a message: never the value itself, which may be huge)."""
    if isinstance(value, list):
        odd = next((i for i, v in enumerate(value) if not isinstance(v, str)), None)  # (strings alone: text)
        return "a list" if odd is None else f"a list holding {_kind(value[odd])}"
    return {dict: "an object", str: "a string", bool: "a boolean", int: "a number", float: "a number",
            type(None): "null"}.get(type(value), type(value).__name__)


def notebook_problem(nb: Any) -> str | None:
    """The first field of notebook JSON ``nb`` whose type an exporter would trip over (``cells[2].outputs[0]
    .metadata is a string, not an object``), or ``None``. Linear in the notebook, whatever it holds."""
    if not isinstance(nb, dict):
        return f"it holds {'a list' if isinstance(nb, list) else _kind(nb)}, not an object"
    for key in ("nbformat", "nbformat_minor"):
        if not isinstance(nb.get(key), int) or isinstance(nb.get(key), bool) or not 0 <= nb[key] < 1000:
            return f"{key} is {_kind(nb.get(key))}, not a version number"
    if not isinstance(nb.get("metadata", {}), dict):
        return f"metadata is {_kind(nb['metadata'])}, not an object"
    if nb["nbformat"] != 4:
        return None  # an older notebook: nbformat converts it, and it is checked again as version 4
    if not isinstance(nb.get("cells"), list):
        return f"cells is {_kind(nb.get('cells'))}, not a list"
    for i, cell in enumerate(nb["cells"]):
        where = f"cells[{i}]"
        if not isinstance(cell, dict):
            return f"{where} is {_kind(cell)}, not an object"
        if cell.get("cell_type") not in ("code", "markdown", "raw"):
            return f"{where}.cell_type is not code, markdown or raw"
        for key, check, wanted in (("metadata", lambda v: isinstance(v, dict), "an object"),
                                   ("source", _is_text, "text"), ("outputs", lambda v: isinstance(v, list), "a list"),
                                   ("attachments", lambda v: isinstance(v, dict), "an object")):
            if key in cell and not check(cell[key]):
                return f"{where}.{key} is {_kind(cell[key])}, not {wanted}"
        for name, bundle in (cell.get("attachments") or {}).items():
            if problem := _bundle_problem(bundle, f"{where}.attachments[{clip(repr(name), 80)}]"):
                return problem
        for j, output in enumerate(cell.get("outputs") or []):
            at = f"{where}.outputs[{j}]"
            if not isinstance(output, dict):
                return f"{at} is {_kind(output)}, not an object"
            if output.get("output_type") not in ("stream", "display_data", "execute_result", "error"):
                return f"{at}.output_type is not stream, display_data, execute_result or error"
            if "metadata" in output and not isinstance(output["metadata"], dict):
                return f"{at}.metadata is {_kind(output['metadata'])}, not an object"
            if "data" in output and (problem := _bundle_problem(output["data"], f"{at}.data")):
                return problem
            for key in ("text", "traceback"):
                if key in output and not _is_text(output[key]):
                    return f"{at}.{key} is {_kind(output[key])}, not text"
    return None


def read_notebook(path: str) -> Any:
    """The notebook at ``path`` as nbformat's version 4 node, read as input from elsewhere (see the module's
    docstring); ``OptionError``, one line naming the first thing wrong, for anything else."""
    import nbformat
    from nbformat.validator import get_validator, normalize

    try:
        data = read_regular(path, MAX_NOTEBOOK_BYTES)
    except OSError as e:
        too_big = f" (tensorjob export reads notebooks of up to {MAX_NOTEBOOK_BYTES >> 20} MiB)" \
            if e.errno == errno.EFBIG else ""
        raise OptionError(f"{path}: {e.strerror or e}{too_big}") from None
    try:
        nb = loads_strict(data, max_values=MAX_NOTEBOOK_VALUES, what="the file")
    except AbiError as e:
        raise OptionError(f"{path} is not a notebook: {e}") from None
    del data
    if problem := notebook_problem(nb):
        raise OptionError(f"{path} is not a notebook: {problem}")
    if nb["nbformat"] not in nbformat.versions:
        raise OptionError(f"{path} is not a notebook this nbformat reads: its nbformat is {nb['nbformat']}")
    try:
        if nb["nbformat"] != 4:  # an older notebook, converted as nbformat.read converts it
            nb = nbformat.convert(nbformat.versions[nb["nbformat"]].to_notebook_json(
                nb, minor=nb["nbformat_minor"]), 4)
            if problem := notebook_problem(nb):
                raise OptionError(f"{path} is not a notebook: {problem}")
        with warnings.catch_warnings():  # a cell without an id is given one, as nbformat.read does
            warnings.simplefilter("ignore")
            _, nb = normalize(nb)
        for error in get_validator(4, nb["nbformat_minor"], name="fastjsonschema").iter_errors(nb):
            where = str(error.message).removeprefix("data.").removeprefix("data ")
            raise OptionError(f"{path} is not a valid notebook (nbformat {nb['nbformat']}.{nb['nbformat_minor']} "
                              f"schema): {clip(where, 300)}")
        return nbformat.versions[4].to_notebook_json(nb)
    except OptionError:
        raise
    except Exception as e:  # noqa: BLE001 - nbformat's own refusal of a version or a shape, as one line
        raise OptionError(f"{path} is not a notebook nbformat can read: {type(e).__name__}: "
                          f"{clip(' '.join(str(e).split()), 300)}") from None


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
    nb = read_notebook(args.notebook)
    if args.execute:
        from nbclient import NotebookClient
        from nbclient.exceptions import CellExecutionError

        try:
            NotebookClient(nb, timeout=args.timeout, resources={"metadata": {"path": str(source.parent.absolute())}}
                           ).execute()
        except CellExecutionError as e:
            err.write(f"tensorjob: a cell failed: {' '.join(str(e).split())[:500]}\n")
            return EXIT_FAILED
    if args.to == "ipynb":
        target = Path(args.output or source.with_suffix(".static.ipynb"))
        nbformat.write(static_views(nb), target)
    else:
        from tensorjob_jupyter.frontends.nbconvert_static import StaticHTMLExporter  # deferred: nbconvert

        target = Path(args.output or source.with_suffix(".html"))
        # static_views applied there, each view kept out of nbconvert's own pass over the page
        body, _ = StaticHTMLExporter().from_notebook_node(nb, resources={"metadata": {"name": source.stem}})
        target.write_text(body, encoding="utf-8")
    out.write(f"{os.fspath(target)}\n")
    return EXIT_OK


__all__ = ["MAX_NOTEBOOK_BYTES", "MAX_NOTEBOOK_VALUES", "add_export_parser", "cmd_export", "notebook_problem",
           "read_notebook"]

"""nbconvert's side of ``export``: a preprocessor and an HTML exporter that show finished views as static HTML.

Kept apart from ``export.py`` because importing nbconvert costs a few tenths
of a second that no other command should pay; nbconvert imports this module
itself through the ``nbconvert.exporters`` entry point ``tensorjob-html``
(``jupyter nbconvert --to tensorjob-html NOTEBOOK``).

nbconvert's HTML exporter parses the whole page it made once more with BeautifulSoup (for images' alt text and
the cells' tab order), in pure Python: a finished map view of 1,000 items (3 MB, 34,000 elements) cost 20 s
there. ``StaticHTMLExporter`` keeps each view, already made inert, out of that pass: the notebook it renders holds
a placeholder no notebook can guess, and the view goes in its place in the finished page. The ``StaticViews``
preprocessor, for nbconvert's own exporters, cannot do that: there each view pays nbconvert's pass, bounded by
``static_views.MAX_STATIC_VIEW_BYTES``.
"""

from __future__ import annotations

import copy
import re
import secrets
from typing import Any

from nbconvert.exporters import HTMLExporter
from nbconvert.preprocessors import Preprocessor

from tensorjob_jupyter.frontends.static_views import static_views


class StaticViews(Preprocessor):
    """Each finished tensorjob view exports as its static HTML, not its widget (``static_views.static_views``)."""

    def preprocess(self, nb, resources):
        return static_views(nb), resources


class StaticHTMLExporter(HTMLExporter):
    """nbconvert's HTML exporter with each finished view as its static HTML (``static_views``), put into the
    page after nbconvert's own work on it."""

    export_from_notebook = "HTML (tensorjob views static)"

    # returns a page, not a notebook: HTMLExporter's own override says the same
    def from_notebook_node(  # type: ignore[override]
            self, nb: Any, resources: dict[str, Any] | None = None, **kw: Any) -> tuple[str, dict[str, Any]]:
        nonce = secrets.token_hex(16)
        views: list[str] = []

        def hold(view: str) -> str:
            views.append(view)
            return f"tensorjob-view-{nonce}-{len(views) - 1}"

        nb = static_views(copy.deepcopy(nb), hold=hold)  # the caller's notebook stays as it was
        page, resources = super().from_notebook_node(nb, resources, **kw)
        if views:
            page = re.sub(rf"tensorjob-view-{nonce}-(\d+)", lambda m: views[int(m[1])], page)
        return page, resources


__all__ = ["StaticViews", "StaticHTMLExporter"]

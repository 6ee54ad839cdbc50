"""nbconvert's side of ``export``: a preprocessor and an HTML exporter that show finished views as static HTML.

Kept apart from ``export.py`` because importing nbconvert costs a few tenths
of a second that no other command should pay; nbconvert imports this module
itself through the ``nbconvert.exporters`` entry point ``tensorjob-html``
(``jupyter nbconvert --to tensorjob-html NOTEBOOK``).
"""

from __future__ import annotations

from nbconvert.exporters import HTMLExporter
from nbconvert.preprocessors import Preprocessor

from tensorjob_jupyter.frontends.static_views import static_views


class StaticViews(Preprocessor):
    """Each finished tensorjob view exports as its static HTML, not its widget (``static_views.static_views``)."""

    def preprocess(self, nb, resources):
        return static_views(nb), resources


class StaticHTMLExporter(HTMLExporter):
    """nbconvert's HTML exporter with ``StaticViews`` always on."""

    export_from_notebook = "HTML (tensorjob views static)"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.register_preprocessor(StaticViews, enabled=True)


__all__ = ["StaticViews", "StaticHTMLExporter"]

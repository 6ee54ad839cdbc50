"""What makes a notebook's finished views export as static HTML: the mark, and the one change to a notebook.

Once a job or a map ends, its view's output carries the final view twice: as
the live widget (``application/vnd.jupyter.widget-view+json``) and as inert
HTML (``text/html``, ``LiveView.finish_display``), marked in the output's
metadata (``STATIC_VIEW``). ``static_views(nb)`` keeps the static HTML of
those outputs and drops their widget, so any exporter shows the finished view
with no script at all; every other output, widgets of the user's own
included, is left as it is. Only outputs whose static HTML is the view's own
(``tensorjob-view tj-static`` or ``tensorjob-map-view tj-static``, as
``render.static`` and the map view write it) count besides the metadata mark,
so a notebook saved before the mark existed exports the same way.

Its own module, needing neither nbconvert nor widgets: the view marks its
output with it, ``export`` (the command) and ``nbconvert_static`` (nbconvert's
exporter) apply it.
"""

from __future__ import annotations

#: The output metadata key a finished view's output carries (``LiveView.finish_display``).
STATIC_VIEW = "tensorjob_static_view"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
_STATIC_MARKERS = ('class="tensorjob-view tj-static"', 'class="tensorjob-map-view tj-static"')


def is_static_view(output) -> bool:
    """Whether ``output`` is a finished view's: the widget beside its own static HTML."""
    data = output.get("data") or {}
    if WIDGET_VIEW not in data or not isinstance(data.get("text/html"), (str, list)):
        return False
    if (output.get("metadata") or {}).get(STATIC_VIEW):
        return True
    html = data["text/html"] if isinstance(data["text/html"], str) else "".join(data["text/html"])
    return html.lstrip().startswith("<div") and any(m in html[:200] for m in _STATIC_MARKERS)


def static_views(nb):
    """``nb`` with every finished view's widget dropped from its output, its static HTML kept (in place)."""
    for cell in nb.get("cells", []):
        for output in cell.get("outputs", []) if cell.get("cell_type") == "code" else []:
            if is_static_view(output):
                del output["data"][WIDGET_VIEW]
    return nb


__all__ = ["STATIC_VIEW", "WIDGET_VIEW", "is_static_view", "static_views"]

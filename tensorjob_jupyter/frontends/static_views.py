"""What makes a notebook's finished views export as static HTML: the mark, and the one change to a notebook.

``static_views(nb)`` keeps the static HTML of this package's finished views and drops their widget, leaving
every other output as it is. A shared notebook is input from elsewhere, so what is kept is nh3's rebuild of the
saved HTML from an allowlist, never the HTML itself. It is a module of its own, needing neither nbconvert nor
widgets: the view marks its output with it, and ``export`` and ``nbconvert_static`` apply it.

Design: docs/internals/frontends.md#static_viewspy
"""

from __future__ import annotations

import re

import nh3

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


#: The most characters of one view's static HTML an export keeps (a finished view of 1,000 map items with their
#: sources is a few MiB); a larger one is left out, with a line that says so.
MAX_STATIC_VIEW_CHARS = 16 << 20
_TAGS = {"div", "span", "b", "br", "code", "pre", "mark", "details", "summary", "table", "tbody", "tr", "td",
         "svg", "rect", "img", "a"}
_ATTRIBUTES = {"*": {"class", "style", "title"}, "svg": {"width", "height"},
               "rect": {"width", "height", "fill", "x", "y"}, "img": {"alt", "src"}, "a": {"href", "target"},
               "div": {"data-pages-read", "data-covered"}}
#: What a style or fill may say: the views write colours, sizes and layout, never a URL, an escape or a rule.
_PLAIN_STYLE = re.compile(r"[#%.,:;\w\s()'\"-]*")
_UNSAFE_STYLE = re.compile(r"url|expression|import|image|\\", re.I)
_PNG_DATA = re.compile(r"data:image/png;base64,[A-Za-z0-9+/=]*")


def _attribute(tag: str, name: str, value: str) -> str | None:
    """nh3's attribute filter: a style only plain, a URL only the thumbnail's PNG data or the dashboard's link."""
    if name in ("style", "fill"):
        return value if _PLAIN_STYLE.fullmatch(value) and not _UNSAFE_STYLE.search(value) else None
    if name == "src":
        return value if _PNG_DATA.fullmatch(value) else None
    if name == "href":
        return value if value.startswith(("http://", "https://")) else None
    return value


def inert_view_html(html: str) -> str:
    """A saved view's HTML rebuilt from the views' own tags, attributes and plain styles only; over
    ``MAX_STATIC_VIEW_CHARS``, a line that says it was left out."""
    if len(html) > MAX_STATIC_VIEW_CHARS:
        return (f'<div class="tensorjob-view tj-static tj-left-out">a finished tensorjob view of {len(html):,} '
                f'characters was left out: an export keeps views of up to {MAX_STATIC_VIEW_CHARS:,}</div>')
    return nh3.clean(html, tags=_TAGS, attributes=_ATTRIBUTES, attribute_filter=_attribute,
                     url_schemes={"http", "https", "data"}, strip_comments=True)


def static_views(nb):
    """``nb`` with every finished view's widget dropped from its output and its static HTML kept, made inert
    (``inert_view_html``), in place."""
    for cell in nb.get("cells", []):
        for output in cell.get("outputs", []) if cell.get("cell_type") == "code" else []:
            if is_static_view(output):
                data = output["data"]
                del data[WIDGET_VIEW]
                saved = data["text/html"] if isinstance(data["text/html"], str) else "".join(data["text/html"])
                data["text/html"] = inert_view_html(saved)
    return nb


__all__ = ["MAX_STATIC_VIEW_CHARS", "STATIC_VIEW", "WIDGET_VIEW", "inert_view_html", "is_static_view",
           "static_views"]

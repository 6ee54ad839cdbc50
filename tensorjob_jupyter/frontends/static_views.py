"""What makes a notebook's finished views export as static HTML: the mark, and the one change to a notebook.

``static_views(nb)`` keeps the static HTML of this package's finished views and drops their widget, leaving
every other output as it is. A shared notebook is input from elsewhere, so what is kept of a view is never its
saved HTML but ``inert_view_html``'s rebuild of it: bounded (past ``MAX_STATIC_VIEW_BYTES`` cut at the last
whole tag, said so); checked for shape (well-nested markup of the views' own tags, at most
``MAX_STATIC_VIEW_DEPTH`` deep, else left out: nh3's parser repairs misnesting in quadratic time); rebuilt by nh3
from an allowlist of tags, attributes, classes and the CSS properties the views write (``STYLE_PROPERTIES``: no
``position``, ``inset``, ``z-index``, ``transform`` or ``float``), in a box that clips. It never raises on what a
notebook holds, and needs neither nbconvert nor widgets. The reasons and figures: docs/internals/frontends.md.

Design: docs/internals/frontends.md#static_viewspy
"""

from __future__ import annotations

import html as html_lib
import re
from typing import Any, Callable

import nh3

#: The output metadata key a finished view's output carries (``LiveView.finish_display``).
STATIC_VIEW = "tensorjob_static_view"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
_STATIC_MARKERS = ('class="tensorjob-view tj-static"', 'class="tensorjob-map-view tj-static"')

#: The most bytes (UTF-8) of one view's static HTML an export keeps: a finished map view of its 1,000 items with
#: their sources is about 3 MB. A larger view is cut at the last whole tag before it, with a line that says so.
MAX_STATIC_VIEW_BYTES = 4 << 20
#: How deep a view's elements may nest (the views' own: a dozen levels of result tree inside a few panels).
MAX_STATIC_VIEW_DEPTH = 128

_TAGS = {"div", "span", "b", "br", "code", "pre", "mark", "details", "summary", "table", "tbody", "tr", "td",
         "svg", "rect", "img", "a"}
_VOID = {"br", "img"}
_ATTRIBUTES = {"*": {"class", "style", "title"}, "svg": {"width", "height"},
               "rect": {"width", "height", "fill", "x", "y"}, "img": {"alt", "src"}, "a": {"href", "target"},
               "div": {"data-pages-read", "data-covered"}}
#: The only CSS properties a kept style may set: those the views write (render.py, map_widget.py). Nothing that
#: takes a box out of the flow or stacks it over others (position, inset, top, left, z-index, float, transform).
STYLE_PROPERTIES = frozenset({
    "background", "border", "border-collapse", "border-left", "border-radius", "box-sizing", "color", "cursor",
    "display", "font-family", "font-size", "height", "line-height", "margin", "margin-left", "max-height",
    "max-width", "overflow", "overflow-y", "padding", "table-layout", "text-align", "text-overflow",
    "vertical-align", "white-space", "width", "word-break"})
#: Properties whose value must be one of a few keywords (a length would move the box: ``vertical-align:900px``).
_KEYWORDS = {"display": {"block", "inline", "inline-block", "none"},
             "vertical-align": {"baseline", "middle", "top", "bottom", "text-top", "text-bottom"}}
#: What a style may say at all: names, numbers, colours, spaces and the separators -- no quote, backslash (an
#: escape), slash (a comment), ``!``, brace, ``@`` or ``<``, so the browser splits it exactly as ``_style`` does.
_PLAIN_STYLE = re.compile(r"[#%.,:;\w\s()-]*")
_FUNCTION = re.compile(r"([\w-]*)\s*\(")
_COLOUR_FUNCTIONS = {"rgb", "rgba", "hsl", "hsla"}
_NEGATIVE = re.compile(r"(?<![\w.-])-\s*[\d.]")
_COLOUR = re.compile(r"#[0-9a-fA-F]{3,8}|[a-zA-Z]{1,30}")
_NUMBER = re.compile(r"\d{1,6}(?:\.\d{1,6})?(?:px|%)?")
_CLASS = re.compile(r"(?:tj|tensorjob)-[a-z0-9-]{1,64}")
_PNG_DATA = re.compile(r"data:image/png;base64,[A-Za-z0-9+/=]*")

# A view's markup, token by token, as html5ever tokenizes it (possessive: nothing here backtracks): text, an end
# tag, or a start tag with lower-case attributes, each valueless or quoted.
_SPACE = "[ \t\n\r\f]"
_TOKEN = re.compile(
    r"(?P<text>[^<]++)"
    rf"|</(?P<end>[a-z][a-z0-9]*+){_SPACE}*+>"
    rf"|<(?P<start>[a-z][a-z0-9]*+)(?:{_SPACE}++[a-z][a-z0-9-]*+(?:=\"[^\"]*+\"|='[^']*+')?)*+{_SPACE}*+"
    r"(?P<slash>/?)>")
#: Where each tag may stand, so that html5ever builds the tree the markup says (a cell outside its row, or a table
#: holding anything but rows, is moved or dropped by the parser, and repairs are what cost).
_CHILDREN = {"table": {"tbody", "tr"}, "tbody": {"tr"}, "tr": {"td"}, "svg": {"rect"}, "rect": set()}
_PARENTS = {"tbody": {"table"}, "tr": {"table", "tbody"}, "td": {"tr"}, "rect": {"svg"}}


def _html_text(value: Any) -> str | None:
    """A notebook's multi-line string (a string, or a list of strings) as one string; ``None`` for anything else."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(line, str) for line in value):
        return "".join(value)
    return None


def is_static_view(output: Any) -> bool:
    """Whether ``output`` is a finished view's: the widget beside its own static HTML (never for an output, or
    its data, that is not an object)."""
    if not isinstance(output, dict):
        return False
    data = output.get("data")
    if not isinstance(data, dict) or WIDGET_VIEW not in data or "text/html" not in data:
        return False
    metadata = output.get("metadata")
    if isinstance(metadata, dict) and metadata.get(STATIC_VIEW):
        return True
    text = _html_text(data["text/html"])
    return text is not None and text[:256].lstrip().startswith("<div") and any(m in text[:256]
                                                                                 for m in _STATIC_MARKERS)


def _style(value: str) -> str | None:
    """A style kept to the declarations ``STYLE_PROPERTIES`` allows, each with a plain value: no function but a
    colour, no negative number; ``None`` when nothing is left."""
    if not _PLAIN_STYLE.fullmatch(value):
        return None
    kept = []
    for declaration in value.split(";"):
        name, colon, setting = declaration.partition(":")
        name, setting = name.strip().lower(), setting.strip()
        if not colon or not setting or ":" in setting or name not in STYLE_PROPERTIES:
            continue
        if name in _KEYWORDS and setting.lower() not in _KEYWORDS[name]:
            continue
        if _NEGATIVE.search(setting) or setting.count("(") != setting.count(")"):
            continue
        if any(f.lower() not in _COLOUR_FUNCTIONS for f in _FUNCTION.findall(setting)):
            continue
        kept.append(f"{name}:{setting}")
    return ";".join(kept) or None


def _attribute(tag: str, name: str, value: str) -> str | None:
    """nh3's attribute filter: a style as ``_style`` keeps it, the views' own classes, a URL only the thumbnail's
    PNG data or the dashboard's link, sizes only as numbers."""
    if name == "style":
        return _style(value)
    if name == "class":
        return " ".join(c for c in value.split() if _CLASS.fullmatch(c)) or None
    if name == "fill":
        return value if _COLOUR.fullmatch(value) else None
    if name in ("width", "height", "x", "y"):
        return value if _NUMBER.fullmatch(value) else None
    if name == "src":
        return value if _PNG_DATA.fullmatch(value) else None
    if name == "href":
        return value if value.startswith(("http://", "https://")) else None
    if name == "target":
        return value if value == "_blank" else None
    return value


def _shape(text: str, limit: int) -> tuple[int, str | None]:
    """How much of ``text`` (at most ``limit`` characters, ending on a whole tag) is the views' own kind of markup:
    (the end of that part, ``None``), or (where it stops, what is wrong there)."""
    stack: list[str] = []
    at = 0
    while at < limit:
        token = _TOKEN.match(text, at)
        if token is None:
            return at, f"it has markup the views do not write at character {at:,}"
        if token["text"] is not None:
            if stack and stack[-1] in ("table", "tbody", "tr") and token["text"].strip(" \t\n\r\f"):
                return at, f"it has text directly in a <{stack[-1]}> at character {at:,}"
            at = min(token.end(), limit)
            continue
        if token.end() > limit:
            break
        if token["end"] is not None:
            if not stack or stack[-1] != token["end"]:
                return at, f"its </{token['end']}> at character {at:,} closes no open <{token['end']}>"
            stack.pop()
        else:
            name = token["start"]
            parent = stack[-1] if stack else None
            if name not in _TAGS:
                return at, f"it has a <{name}> tag, which the views do not write, at character {at:,}"
            if (parent in _CHILDREN and name not in _CHILDREN[parent]) or (
                    name in _PARENTS and parent not in _PARENTS[name]):
                return at, f"it has a <{name}> inside {f'a <{parent}>' if parent else 'nothing'} at character {at:,}"
            if name == "a" and "a" in stack:
                return at, f"it has an <a> inside an <a> at character {at:,}"
            if token["slash"] and name not in _VOID and name != "rect":
                return at, f"it has a self-closing <{name}/> at character {at:,}"
            if name not in _VOID and not (name == "rect" and token["slash"]):
                if len(stack) >= MAX_STATIC_VIEW_DEPTH:
                    return at, f"its elements nest more than {MAX_STATIC_VIEW_DEPTH} deep at character {at:,}"
                stack.append(name)
        at = token.end()
    return at, None


def _note(css_class: str, words: str) -> str:
    return (f'<div class="{css_class}" style="font-family:sans-serif;font-size:11px;color:#57606a">'
            f'{html_lib.escape(words, quote=False)}</div>')


def left_out(reason: str) -> str:
    """What an export shows for a finished view it cannot keep: one line that says why."""
    return ('<div class="tensorjob-view tj-static tj-left-out" style="font-family:sans-serif;font-size:12px">'
            f'a finished tensorjob view was left out: {html_lib.escape(reason, quote=False)}</div>')


def inert_view_html(saved: str) -> str:
    """A saved view's HTML as an export keeps it: at most ``MAX_STATIC_VIEW_BYTES`` of it (then a line saying it
    was cut), the views' own well-nested markup only (otherwise ``left_out``), rebuilt by nh3 from the views' own
    tags, attributes, classes and styles, in a box that clips."""
    data = saved.encode("utf-8", "replace")  # a lone surrogate (JSON allows one) is no text: it becomes "?"
    text = data.decode("utf-8")
    limit = len(text) if len(data) <= MAX_STATIC_VIEW_BYTES else \
        len(data[:MAX_STATIC_VIEW_BYTES].decode("utf-8", "ignore"))
    end, problem = _shape(text, limit)
    if problem is not None:
        return left_out(f"its saved HTML is not the views' own markup ({problem})")
    kept = nh3.clean(text[:end], tags=_TAGS, attributes=_ATTRIBUTES, attribute_filter=_attribute,
                     filter_style_properties=set(STYLE_PROPERTIES), url_schemes={"http", "https", "data"},
                     strip_comments=True)
    cut = "" if end == len(text) else _note(
        "tj-cut", f"this view was cut: an export keeps {MAX_STATIC_VIEW_BYTES:,} bytes of a view's HTML, and "
                  f"this one has {len(data):,}")
    return f'<div class="tj-static-box" style="overflow:auto">{kept}{cut}</div>'


def static_views(nb: Any, *, hold: Callable[[str], str] | None = None) -> Any:
    """``nb`` with every finished view's widget dropped from its output and its static HTML kept, made inert
    (``inert_view_html``), in place. ``hold``: given each view's inert HTML, what to put in the notebook instead
    (``nbconvert_static`` puts a placeholder there, and the HTML back into the finished page)."""
    cells = nb.get("cells") if isinstance(nb, dict) else None
    for cell in cells if isinstance(cells, list) else []:
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        outputs = cell.get("outputs")
        for output in outputs if isinstance(outputs, list) else []:
            if is_static_view(output):
                data = output["data"]
                del data[WIDGET_VIEW]
                saved = _html_text(data["text/html"])
                kept = left_out("its saved HTML is not text") if saved is None else inert_view_html(saved)
                data["text/html"] = hold(kept) if hold is not None else kept
    return nb


__all__ = ["MAX_STATIC_VIEW_BYTES", "MAX_STATIC_VIEW_DEPTH", "STATIC_VIEW", "STYLE_PROPERTIES", "WIDGET_VIEW",
           "inert_view_html", "is_static_view", "left_out", "static_views"]

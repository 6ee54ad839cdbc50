"""A saved view's HTML is input from elsewhere: what an export keeps of it is rebuilt inert and bounded.

``inert_view_html`` is what ``static_views`` keeps of a finished view read back from a notebook: the views'
own tags, attributes, classes and plain styles, nothing that runs, loads or is positioned, in a box that clips.
Hypothesis looks for markup that keeps a script, a handler or a foreign URL, and for styles that position an
element or stack it over the page (tinycss2, a CSS parser that follows the CSS syntax spec as browsers do, is the
judge); real views keep everything they show; a view past ``MAX_STATIC_VIEW_BYTES`` is cut with a line that
says so; markup html5ever would spend minutes repairing is left out at once; and a notebook whose outputs have
the wrong types is never a traceback.
"""

from __future__ import annotations

import copy
import html
import time
from html.parser import HTMLParser

import tinycss2
from hypothesis import given, settings, strategies as st

import tensorjob_jupyter as tj
from tensorjob_jupyter.frontends.static_views import (MAX_STATIC_VIEW_BYTES, MAX_STATIC_VIEW_DEPTH, STATIC_VIEW,
                                                      STYLE_PROPERTIES, WIDGET_VIEW, inert_view_html, static_views)
from tensorjob_jupyter.frontends.view import render
from tensorjob_jupyter.frontends.view.map_widget import item_row, render_items
from tensorjob_jupyter.frontends.view.render import thumbnail
from tensorjob_jupyter.frontends.view.state import ViewState
from tensorjob_jupyter.inference import ScriptedBackend

import wat

ALLOWED = {"div", "span", "b", "br", "code", "pre", "mark", "details", "summary", "table", "tbody", "tr", "td",
           "svg", "rect", "img", "a"}
VIEW = '<div class="tensorjob-view tj-static">'
BOX = '<div class="tj-static-box" style="overflow:auto">'


class Parsed(HTMLParser):
    """Every start tag with its attributes, and the text."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []
        self.text: list[str] = []
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)


def declarations(style: str) -> list:
    """A style attribute's declarations as a browser reads them (CSS Syntax Level 3, escapes resolved)."""
    return [d for d in tinycss2.parse_declaration_list(style, skip_comments=True, skip_whitespace=True)
            if d.type == "declaration"]


def assert_unpositioned(style: str) -> None:
    """Nothing in ``style`` takes its element out of the flow or moves it outside its own box."""
    for d in declarations(style):
        assert d.lower_name in STYLE_PROPERTIES, (d.lower_name, style)
        for token in d.value:
            assert token.type not in ("url", "function") or (
                token.type == "function" and token.lower_name in ("rgb", "rgba", "hsl", "hsla")), (token, style)
            assert token.type not in ("number", "dimension", "percentage") or token.value >= 0, (token, style)


def assert_inert(out: str) -> None:
    parsed = Parsed(out)
    assert parsed.tags, out
    for tag, attrs in parsed.tags:
        assert tag in ALLOWED, tag
        for name, value in attrs.items():
            assert not name.startswith("on"), (tag, name)
            value = value or ""
            if name == "src":
                assert value.startswith("data:image/png;base64,"), value
            if name == "href":
                assert value.startswith(("http://", "https://")), value
            if name == "class":
                assert all(c.startswith(("tj-", "tensorjob-")) for c in value.split()), value
            if name in ("style", "fill"):
                assert "url" not in value.lower() and "\\" not in value and "expression" not in value.lower()
            if name == "style" and (tag, attrs) != parsed.tags[0]:
                assert_unpositioned(value)
    if "tj-left-out" not in parsed.tags[0][1].get("class", ""):
        assert out.startswith(BOX) and out.endswith("</div>")  # whatever it holds, in a box that clips


HOSTILE = ["<script>alert(1)</script>", "<img src=x onerror=alert(1)>", '<a href="javascript:alert(1)">x</a>',
           '<span style="background:url(http://evil/t.png)">x</span>', "<svg><script>alert(2)</script></svg>",
           '<svg onload="alert(3)"><rect fill="url(#p)"/></svg>', "<iframe src=//evil></iframe>",
           '<div style="width:expression(alert(4))">', "<style>*{background:url(//evil)}</style>",
           '<a href=" javascript:alert(5)">', "<math><mtext><img src=x onerror=alert(6)></mtext></math>",
           '<img src="data:text/html;base64,PHNjcmlwdD4=">', '<object data="x.swf"></object>', "<!-- <script> -->",
           '<form action="//evil"><input name=q></form>', '<div style="color:red\\;background:url(//e)">',
           '<base href="//evil/">', '<meta http-equiv="refresh" content="0;url=//evil">',
           '<a href="https://evil/" style="position:fixed;top:0;left:0;width:100%;height:100%;z-index:99999">',
           "<style>a{position:fixed;inset:0}</style>", '<div class="jp-Dialog lm-Widget">',
           '<span style="margin-top:-9999px;display:block">', '<svg><rect x="-1e9" width="1e9"/></svg>']


@given(st.lists(st.one_of(st.sampled_from(HOSTILE), st.text(max_size=40),
                          st.sampled_from(["<div>", "</div>", "<span class='tj-x'>", '<td style="color:#fff">',
                                           "<details><summary>", '<a href="https://ok/">', "<", ">", '"', "'",
                                           '<span class="tj-x">', "</span>", "<b>", "</b>"])),
                max_size=30))
@settings(max_examples=300, deadline=None)
def test_no_markup_keeps_a_script_a_handler_or_a_foreign_url(pieces):
    assert_inert(inert_view_html(VIEW + "".join(pieces) + "</div>"))


# Hostile styles: every spelling of a declaration that positions, stacks or moves a box, with the tricks CSS
# allows (case, escapes, comments, strings, blocks, !important, entities in the HTML attribute).
PROPERTIES = ["position", "POSITION", "Position", "pos\\ition", "\\70 osition", "\\000070osition", "posi/**/tion",
              "inset", "top", "left", "z-index", "transform", "float", "margin", "margin-top", "color", "display",
              "width", "vertical-align", "line-height", "-webkit-transform", "translate", "all", "--x"]
VALUES = ["fixed", "absolute", "sticky", "FIXED", "f\\ixed", "\\66 ixed", "fix/**/ed", "relative", "0", "-9999px",
          "- 1px", "-.5em", "calc(0px - 100vh)", "var(--x)", "expression(1)", "translate(-100px)", "url(//e)",
          "100vw", "999999", "block", "red", "rgb(1,2,3)", "fixed !important", "'fixed'", "inherit", "900px"]
JOINERS = [":", " : ", ";", ";;", "/**/", "\\;", '"', "'", "(", ")", "{", "}", "\n", " ", "!important", "\\", ",", "&"]


@st.composite
def hostile_style(draw) -> str:
    parts = draw(st.lists(st.one_of(
        st.tuples(st.sampled_from(PROPERTIES), st.sampled_from([":", " : ", ":\n"]),
                  st.sampled_from(VALUES)).map("".join),
        st.sampled_from(JOINERS), st.text(alphabet="pos:itinfxed;-()\\/*'\" ", max_size=12)), max_size=12))
    return "".join(parts)


@st.composite
def style_attribute(draw) -> str:
    """The style as it may sit in a saved view: quoted either way, or with its characters as HTML entities."""
    style = draw(hostile_style())
    how = draw(st.sampled_from(["double", "single", "entities", "hex"]))
    if how == "single":
        return "style='" + style.replace("'", "&#39;") + "'"
    if how == "entities":
        return 'style="' + "".join(f"&#{ord(c)};" for c in style) + '"'
    if how == "hex":
        return 'style="' + html.escape(style).replace(":", "&colon;").replace("p", "&#x70;") + '"'
    return 'style="' + html.escape(style) + '"'


@given(st.lists(st.tuples(st.sampled_from(["div", "span", "a", "b", "td", "code", "pre", "details"]),
                          style_attribute()), min_size=1, max_size=6))
@settings(max_examples=400, deadline=None)
def test_no_style_positions_an_element_or_moves_it_out_of_its_box(elements):
    body = "".join(f'<{tag} href="https://x/" {attr}>t</{tag}>' if tag == "a" else f"<{tag} {attr}>t</{tag}>"
                   for tag, attr in elements)
    for saved in (VIEW + body + "</div>", VIEW + "<table><tbody><tr>" + "".join(
            f"<td {attr}>t</td>" for _, attr in elements) + "</tr></tbody></table></div>"):
        out = inert_view_html(saved)
        assert_inert(out)
        assert "position" not in out.lower() and "z-index" not in out.lower()


def test_a_positioned_link_over_the_whole_page_is_made_plain():
    """The reported case: a forged view whose link covers the exported page (seen in Chromium)."""
    forged = (VIEW + '<a href="https://evil.example/" style="position:fixed;top:0;left:0;width:100vw;'
              'height:100vh;z-index:2147483647;display:block;color:red">click</a></div>')
    out = inert_view_html(forged)
    [(_, box), (_, view), (tag, link)] = Parsed(out).tags
    assert box == {"class": "tj-static-box", "style": "overflow:auto"} and view == {"class": "tensorjob-view tj-static"}
    assert tag == "a" and link["href"] == "https://evil.example/"
    assert [d.lower_name for d in declarations(link["style"])] == ["width", "height", "display", "color"]
    for spelling in ("POSITION:FIXED", "pos\\ition:fixed", "position/**/:fixed", "position:fi\\xed", "inset:0",
                     "position&#58;fixed", "position:absolute", "position:sticky", "position:fixed!important"):
        out = inert_view_html(f'{VIEW}<a href="https://e/" style="{spelling};color:red">x</a></div>')
        assert "position" not in out.lower() and "inset" not in out and "fixed" not in out.lower(), out


def test_a_real_view_keeps_what_it_shows():
    rows = [{"item": i, "ok": i != 1, "outcome": "completed" if i != 1 else "ungrounded: facts.x",
             "input": f"<b>doc{i}</b>.txt", "input_json": f'{{"path": "doc{i}.txt"}}',
             "result": {"facts": {"customer": "Ada <Lovelace>", "order": 12345}},
             "sources": {"facts.customer": [{"file": "/d/doc.txt", "start": 0, "end": 3, "match": "exact",
                                             "score": 1.0}], "facts.order": []},
             "confidence": {"facts.customer": 0.93, "facts.order": 0.41}, "score": {"score": 0.5}}
            for i in range(12)]
    view = (f'<div class="tensorjob-map-view tj-static" style="border:1px solid #d0d7de;padding:4px">'
            f'{render_items([item_row({"type": "item.completed", **r}) for r in rows], finished=True, concluded=30)}'
            f'{thumbnail(bytes.fromhex("89504e470d0a1a0a"), "page 1")}'
            f'<a href="http://127.0.0.1:8787/status" target="_blank" class="tj-dashboard">Dask dashboard</a></div>')
    assert_keeps(view)


def assert_keeps(view: str) -> None:
    """``view`` comes through whole: the same text, tags, classes, titles, images and styles (as declarations)."""
    out = inert_view_html(view)
    before, after = Parsed(view), Parsed(out)
    assert after.tags[0] == ("div", {"class": "tj-static-box", "style": "overflow:auto"})
    assert after.text == before.text and "left out" not in "".join(after.text)

    def shown(tags):
        return [(t, a.get("class"), [(d.lower_name, tinycss2.serialize(d.value).strip())
                                     for d in declarations(a.get("style") or "")], a.get("title"), a.get("src"),
                 a.get("fill"), a.get("width")) for t, a in tags]
    assert shown(after.tags[1:]) == shown(before.tags)


def test_a_finished_job_s_view_with_every_panel_keeps_what_it_shows(tmp_path):
    """A real job's static view (render.static), log, files, tokens, output and a result nested as deep as the
    view draws, comes through the shape check and the allowlist whole."""
    (tmp_path / "doc.txt").write_text("<script>alert(4)</script> file text " * 20)
    deep: dict = {"leaf": "<b>x</b>"}
    for i in range(14):
        deep = {f"level{i}": deep, "list": [1, "two", None, {"k": [True]}]}
    guest = wat.script_guest(
        [{"cmd": "emit", "progress": "<script>alert(1)</script>"}, {"cmd": "emit", "progress": {"done": 1, "total": 2}},
         {"cmd": "open", "path": str(tmp_path / "doc.txt")}, {"cmd": "slice", "handle": 0, "offset": 0, "len": 100},
         {"cmd": "slice", "handle": 0, "offset": 300, "len": 50}, {"cmd": "infer", "prompt": "p", "max_tokens": 8},
         {"cmd": "done", "result": {"<b>key</b>": ["<img src=x onerror=alert(2)>"], "deep": deep}}])
    job = tj.Job(guest, read=[tmp_path], backend=ScriptedBackend("some <i>model</i> words"))
    assert job.start().wait(30).ok
    state = ViewState()
    for event in job.events:
        state.apply(event)
    view = render.static(state)
    assert "tj-result" in view and "tj-tokens" in view and "tj-coverage" in view and "level13" in view
    assert_keeps(view)


def test_a_view_past_the_cap_is_cut_at_a_whole_tag_with_a_line_that_says_so():
    huge = VIEW + "<span>0123456789</span>" * (3 * MAX_STATIC_VIEW_BYTES // 23) + "</div>"  # 12 MiB
    started = time.monotonic()
    out = inert_view_html(huge)
    assert time.monotonic() - started < 30  # (before the cap: 15 MiB of it took 130 s to export, and 1.3 GB)
    assert MAX_STATIC_VIEW_BYTES < len(out) < MAX_STATIC_VIEW_BYTES + 1000
    parsed = Parsed(out)
    assert f"keeps {MAX_STATIC_VIEW_BYTES:,} bytes" in parsed.text[-1] and f"{len(huge):,}" in parsed.text[-1]
    assert parsed.text[-2] in ("0123456789", "0123456789"[:len(parsed.text[-2])])  # cut inside a span, closed
    assert out.endswith("</div></div>")
    # the cap counts bytes, not characters: four-byte characters reach it four times sooner
    wide = VIEW + "<span>" + "\U0001F600" * (MAX_STATIC_VIEW_BYTES // 3) + "</span></div>"
    kept = "".join(Parsed(inert_view_html(wide)).text[:-1])
    assert len(kept.encode()) <= MAX_STATIC_VIEW_BYTES and set(kept) == {"\U0001F600"}


# Markup that costs html5ever (nh3's parser) time and memory quadratic in its size: each unit below, repeated,
# took from 5 s to 2 minutes (and 1 GB of output) at 10,000 units before the shape check.
QUADRATIC = {"nested divs": "<div>", "unclosed formatting": '<b class="a{}">x',
             "formatting around paragraphs": '<b class="a{}"><p>x', "stray end tags": '<b class="a{}"></p>x',
             "fostered in tables": '<table><b class="a{}"><table>', "links in links": '<a href="https://x/{}">x',
             "self-closed divs": "<div/>"}


def test_markup_the_parser_would_spend_minutes_repairing_is_left_out_at_once():
    for name, unit in QUADRATIC.items():
        saved = VIEW + "".join(unit.format(i) for i in range(100_000)) + "</div>"
        started = time.monotonic()
        out = inert_view_html(saved)
        assert time.monotonic() - started < 2, name
        assert "a finished tensorjob view was left out" in out and len(out) < 500, (name, out)
    deep = VIEW + "<span>" * (MAX_STATIC_VIEW_DEPTH - 1) + "x" + "</span>" * (MAX_STATIC_VIEW_DEPTH - 1) + "</div>"
    assert "x" in Parsed(inert_view_html(deep)).text
    assert "left out" in inert_view_html(VIEW + "<span>" * MAX_STATIC_VIEW_DEPTH + "</div>")


@given(st.recursive(st.text(alphabet="ab <>&\"'", max_size=5),
                    lambda children: st.tuples(st.sampled_from(sorted(ALLOWED)),
                                               st.sampled_from(["", ' class="tj-a"', ' title="t"', ' style="color:red"',
                                                                ' href="https://x/"']),
                                               st.lists(children, max_size=4)),
                    max_leaves=60))
@settings(max_examples=200, deadline=None)
def test_well_nested_markup_costs_nh3_a_bounded_multiple_of_its_size(tree):
    """Whatever nesting of the allowed tags the shape check lets through, what nh3 makes of it is at most a few
    times its size (html5ever's repairs, which clone elements, would make it grow with the square)."""
    def markup(node) -> str:
        if isinstance(node, str):
            return html.escape(node)
        tag, attrs, children = node
        if tag in ("br", "img"):
            return f"<{tag}{attrs}>"
        return f"<{tag}{attrs}>{''.join(markup(c) for c in children)}</{tag}>"
    saved = VIEW + markup(tree) * 20 + "</div>"
    assert len(inert_view_html(saved)) <= 4 * len(saved) + 600


def test_a_view_of_the_wrong_types_is_left_out_and_a_malformed_notebook_never_raises():
    marked = {STATIC_VIEW: True}
    widget = {"model_id": "v"}
    nb = {"cells": [
        {"cell_type": "code", "outputs": [
            {"output_type": "display_data", "data": {"text/html": ["<div>", 1, 2], WIDGET_VIEW: widget},
             "metadata": marked},
            {"output_type": "display_data", "data": {"text/html": VIEW + "ok</div>", WIDGET_VIEW: widget},
             "metadata": "a string"},
            {"output_type": "display_data", "data": {"text/html": {"not": "text"}, WIDGET_VIEW: widget},
             "metadata": "a string"},
            {"output_type": "display_data", "data": "not a bundle", "metadata": marked},
            "not an output", 7, None,
            {"output_type": "display_data", "data": {"text/html": VIEW + "\ud800 lone</div>", WIDGET_VIEW: widget},
             "metadata": marked}]},
        {"cell_type": "code", "outputs": "not a list"}, {"cell_type": "code"}, "not a cell", [], None,
        {"cell_type": ["code"], "outputs": []}]}
    [ints, by_marker, not_text, no_bundle, *rest, lone] = static_views(nb)["cells"][0]["outputs"]
    assert "left out" in ints["data"]["text/html"] and WIDGET_VIEW not in ints["data"]
    assert "ok" in Parsed(by_marker["data"]["text/html"]).text and WIDGET_VIEW not in by_marker["data"]
    assert not_text["data"] == {"text/html": {"not": "text"}, WIDGET_VIEW: widget}  # not a view: as it was
    assert no_bundle["data"] == "not a bundle" and rest == ["not an output", 7, None]
    assert "? lone" in lone["data"]["text/html"]
    lone["data"]["text/html"].encode("utf-8")
    for odd in (None, [], "x", {"cells": "x"}, {"cells": None}, {"cells": [{"cell_type": "code", "outputs": [[]]}]}):
        assert static_views(odd) == odd


def test_a_view_past_the_cap_and_the_notebook_s_own_outputs():
    huge = VIEW + "<span>0123456789</span>" * (MAX_STATIC_VIEW_BYTES // 20) + "</div>"
    own = {"output_type": "display_data", "data": {"text/html": "<script>mine()</script>",
                                                   WIDGET_VIEW: {"model_id": "m"}}, "metadata": {}}
    nb = {"cells": [{"cell_type": "code", "outputs": [
        {"output_type": "display_data", "data": {"text/html": huge, WIDGET_VIEW: {"model_id": "v"}},
         "metadata": {STATIC_VIEW: True}},
        {"output_type": "display_data", "data": {"text/html": [VIEW, "<b>ok</b></div>"],
                                                  WIDGET_VIEW: {"model_id": "w"}}, "metadata": {STATIC_VIEW: True}},
        own]}]}
    kept = copy.deepcopy(own)
    [cut, small, mine] = static_views(nb)["cells"][0]["outputs"]
    text = "".join(Parsed(cut["data"]["text/html"]).text)
    assert "this view was cut" in text and f"{len(huge):,}" in text
    assert len(cut["data"]["text/html"].encode()) < MAX_STATIC_VIEW_BYTES + 1000
    assert WIDGET_VIEW not in cut["data"] and WIDGET_VIEW not in small["data"]
    assert small["data"]["text/html"] == f"{BOX}{VIEW}<b>ok</b></div></div>"
    assert mine == kept  # not a view of ours: left as the notebook has it (nbconvert's own rules apply)

"""A saved view's HTML is input from elsewhere: what an export keeps of it is rebuilt inert and bounded.

``inert_view_html`` is what ``static_views`` keeps of a finished view read back from a notebook: the views'
own tags, attributes and plain styles, nothing that runs or loads. Hypothesis looks for markup that keeps a
script, a handler or a foreign URL; a real view's static HTML keeps everything it shows; a view past
``MAX_STATIC_VIEW_CHARS`` is one line that says it was left out.
"""

from __future__ import annotations

import copy
from html.parser import HTMLParser

from hypothesis import given, settings, strategies as st

from tensorjob_jupyter.frontends.static_views import (MAX_STATIC_VIEW_CHARS, STATIC_VIEW, WIDGET_VIEW,
                                                      inert_view_html, static_views)
from tensorjob_jupyter.frontends.view.map_widget import render_items
from tensorjob_jupyter.frontends.view.render import thumbnail

ALLOWED = {"div", "span", "b", "br", "code", "pre", "mark", "details", "summary", "table", "tbody", "tr", "td",
           "svg", "rect", "img", "a"}


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


def assert_inert(out: str) -> None:
    for tag, attrs in Parsed(out).tags:
        assert tag in ALLOWED, tag
        for name, value in attrs.items():
            assert not name.startswith("on"), (tag, name)
            value = value or ""
            if name == "src":
                assert value.startswith("data:image/png;base64,"), value
            if name == "href":
                assert value.startswith(("http://", "https://")), value
            if name in ("style", "fill"):
                assert "url" not in value.lower() and "\\" not in value and "expression" not in value.lower()


HOSTILE = ["<script>alert(1)</script>", "<img src=x onerror=alert(1)>", '<a href="javascript:alert(1)">x</a>',
           '<span style="background:url(http://evil/t.png)">x</span>', "<svg><script>alert(2)</script></svg>",
           '<svg onload="alert(3)"><rect fill="url(#p)"/></svg>', "<iframe src=//evil></iframe>",
           '<div style="width:expression(alert(4))">', "<style>*{background:url(//evil)}</style>",
           '<a href=" javascript:alert(5)">', "<math><mtext><img src=x onerror=alert(6)></mtext></math>",
           '<img src="data:text/html;base64,PHNjcmlwdD4=">', '<object data="x.swf"></object>', "<!-- <script> -->",
           '<form action="//evil"><input name=q></form>', '<div style="color:red\\;background:url(//e)">',
           '<base href="//evil/">', '<meta http-equiv="refresh" content="0;url=//evil">']


@given(st.lists(st.one_of(st.sampled_from(HOSTILE), st.text(max_size=40),
                          st.sampled_from(["<div>", "</div>", "<span class='tj-x'>", '<td style="color:#fff">',
                                           "<details><summary>", '<a href="https://ok/">', "<", ">", '"', "'"])),
                max_size=30))
@settings(max_examples=300, deadline=None)
def test_no_markup_keeps_a_script_a_handler_or_a_foreign_url(pieces):
    assert_inert(inert_view_html('<div class="tensorjob-view tj-static">' + "".join(pieces) + "</div>"))


def test_a_real_view_keeps_what_it_shows():
    rows = [{"item": i, "ok": i != 1, "outcome": "completed" if i != 1 else "ungrounded: facts.x",
             "input": f"<b>doc{i}</b>.txt", "input_json": f'{{"path": "doc{i}.txt"}}',
             "result": {"facts": {"customer": "Ada <Lovelace>", "order": 12345}},
             "sources": {"facts.customer": [{"file": "/d/doc.txt", "start": 0, "end": 3, "match": "exact",
                                             "score": 1.0}], "facts.order": []},
             "confidence": {"facts.customer": 0.93, "facts.order": 0.41}, "score": {"score": 0.5}}
            for i in range(3)]
    from tensorjob_jupyter.frontends.view.map_widget import item_row

    view = (f'<div class="tensorjob-map-view tj-static" style="border:1px solid #d0d7de;padding:4px">'
            f'{render_items([item_row({"type": "item.completed", **r}) for r in rows], finished=True, concluded=3)}'
            f'{thumbnail(bytes.fromhex("89504e470d0a1a0a"), "page 1")}'
            f'<a href="http://127.0.0.1:8787/status" target="_blank" class="tj-dashboard">Dask dashboard</a></div>')
    before, after = Parsed(view), Parsed(inert_view_html(view))
    assert after.text == before.text and "Ada <Lovelace>" in "".join(after.text)
    assert [(t, a.get("class"), a.get("style"), a.get("title"), a.get("src")) for t, a in after.tags] == \
           [(t, a.get("class"), a.get("style"), a.get("title"), a.get("src")) for t, a in before.tags]


def test_a_view_past_the_cap_is_one_line_and_the_notebook_keeps_its_own_outputs():
    huge = '<div class="tensorjob-view tj-static">' + "<span>0123456789</span>" * (MAX_STATIC_VIEW_CHARS // 20) + "</div>"
    own = {"output_type": "display_data", "data": {"text/html": "<script>mine()</script>",
                                                   WIDGET_VIEW: {"model_id": "m"}}, "metadata": {}}
    nb = {"cells": [{"cell_type": "code", "outputs": [
        {"output_type": "display_data", "data": {"text/html": huge, WIDGET_VIEW: {"model_id": "v"}},
         "metadata": {STATIC_VIEW: True}},
        {"output_type": "display_data", "data": {"text/html": ['<div class="tensorjob-view tj-static">',
                                                               "<script>x()</script>ok</div>"],
                                                  WIDGET_VIEW: {"model_id": "w"}}, "metadata": {STATIC_VIEW: True}},
        own]}]}
    kept = copy.deepcopy(own)
    [left_out, small, mine] = static_views(nb)["cells"][0]["outputs"]
    text = "".join(Parsed(left_out["data"]["text/html"]).text)
    assert "left out" in text and f"{len(huge):,}" in text and len(left_out["data"]["text/html"]) < 500
    assert WIDGET_VIEW not in left_out["data"] and WIDGET_VIEW not in small["data"]
    assert small["data"]["text/html"] == '<div class="tensorjob-view tj-static">ok</div>'
    assert mine == kept  # not a view of ours: left as the notebook has it (nbconvert's own rules apply)

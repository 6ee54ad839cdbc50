"""The review widget, as the kernel drives it: the doubtful value first, keys deciding, every text escaped.

A real map (a Python guest, the scripted model answering planted values with logprobs) is reviewed through
``ReviewWidget.press`` -- what the keyboard handler calls; a browser test drives the same widget with real keys
(tests/frontends/test_browser.py). The decisions land in ``reviews.jsonl`` as the terminal's do.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import tensorjob_jupyter as tj
from tensorjob_jupyter.frontends.view.review_widget import ReviewWidget, context_html, review_widget
from tensorjob_jupyter.fanout import ReviewQueue
from tensorjob_jupyter.inference import ScriptedBackend

GUEST = '''import tensorjob as tj

SCHEMA = {"type": "object", "properties": {"vendor": {"type": ["string", "null"]}, "total": {"type": "number"}},
          "required": ["vendor", "total"]}


def main(input):
    with tj.open(input["path"]) as f:
        text = f.read(4096)
    return tj.infer("Fields:\\n" + text, max_tokens=64, logprobs=True,
                    format={"type": "json_schema", "name": "invoice", "schema": SCHEMA}).json()
'''
HOSTILE = '<img src=x onerror="alert(1)"> Ltd'


def invoice(i: int) -> str:
    vendor = HOSTILE if i == 0 else f"Firm {i} Ltd"
    return f"Invoice date: 2024-03-0{i + 1}\nVendor: {vendor}\nTotal due: {100 + i}.50 EUR\n"


@pytest.fixture
def run(tmp_path) -> Path:
    return make_run(tmp_path)


def make_run(tmp_path: Path) -> Path:
    """A real map of four invoices (its ``run`` folder): the vendor of item 1 invented, item 0's hostile."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (tmp_path / "g.py").write_text(GUEST)
    answers = {}
    for i in range(4):
        (docs / f"inv{i}.txt").write_text(invoice(i), encoding="utf-8")
        vendor = HOSTILE if i == 0 else ("Globex Corporation" if i == 1 else f"Firm {i} Ltd")
        answers[invoice(i)] = json.dumps({"vendor": vendor, "total": 100 + i + 0.5})
    backend = ScriptedBackend(lambda prompt: next(a for t, a in answers.items() if t in prompt),
                              logprobs=lambda k, piece: -0.02 * (1 + len(piece) % 5))
    result = tj.map(tmp_path / "g.py", [{"path": str(docs / f"inv{i}.txt")} for i in range(4)], tmp_path / "run",
                    read=[docs], backend=backend)
    assert result.completed == 4
    return tmp_path / "run"


def decisions(run: Path) -> list[tuple[str, str, object]]:
    return [(r["field"], r["decision"], r.get("corrected")) for r in
            (json.loads(line) for line in (run / "reviews.jsonl").read_text().splitlines())]


def test_the_widget_shows_the_value_found_nowhere_first_and_the_keys_decide_it(run):
    view = ReviewWidget(ReviewQueue(run, seed=1, sample_share=0.0))
    first = view.queue.current
    assert first is not None and first.row.value == "Globex Corporation" and first.row.reason == "not_found"
    assert "Globex Corporation" in view.value.value and "✗" in view.value.value
    view.press("c")  # correct: the box takes the value, Enter keeps it
    view.correction.value = "Firm 1 Ltd"  # what Enter in the box does (continuous_update is off)
    view.press("a")
    view.press("b")  # back to the accepted one: its decision shows
    assert "decided: accept" in view.value.value
    view.press("x")  # not a key of the widget: nothing happens
    assert decisions(run) == [("vendor", "correct", "Firm 1 Ltd"), (view.queue.current.row.field, "accept", None)]
    assert "2 of 8 values reviewed, 1 corrected" in view.heading.value


def test_every_text_from_a_document_or_a_model_is_escaped(run):
    queue = ReviewQueue(run, seed=1, sample_share=0.0)
    view = ReviewWidget(queue)
    queue.select(0, "vendor")
    view._show(queue.current)
    shown = view.value.value + view.document.value
    assert "<img" not in shown and "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in shown
    assert "<mark>" in view.document.value  # the span highlighted in the document's own text


def test_the_span_in_its_context_is_marked_and_a_context_without_markers_is_shown_as_it_is():
    assert context_html("…Vendor: «<b>Acme</b>» Ltd…") == "…Vendor: <mark>&lt;b&gt;Acme&lt;/b&gt;</mark> Ltd…"
    assert context_html("no markers <i>") == "no markers &lt;i&gt;"
    assert "found nowhere" in context_html(None)


def test_when_every_value_is_decided_the_widget_says_so_and_the_certificate_covers_all(run):
    view = ReviewWidget(ReviewQueue(run, seed=1))
    for _ in range(8):
        view.press("a")
    assert "Nothing more to review" in view.value.value
    assert "all 8 values reviewed" in view.heading.value
    assert review_widget(run) is not None  # the convenience builds the same widget over the folder


def test_a_map_result_opens_its_own_review_widget_as_the_package_registers_it(run):
    widget = tj.MapResult.read(run).review_widget(seed=1)
    assert "tensorjob-review" in widget._dom_classes
    assert tj.review_widget(run)._dom_classes == widget._dom_classes

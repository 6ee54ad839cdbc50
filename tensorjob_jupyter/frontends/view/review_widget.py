"""The review widget: a map's values one at a time in the notebook, the doubtful first, decided from the keyboard.

A thin shell over ``fanout.ReviewQueue`` -- the queue ``tensorjob review`` drives in a terminal: the value with its
confidence, its evidence mark and why it is asked, the document's text around it with the span highlighted, the
progress and the certified statement. Keys (ipyevents, while the pointer is over the value's card): ``a`` or Enter
accept, ``c`` correct (type in the box, then Enter), ``n`` null, ``s`` skip, ``b`` back; the same as buttons.
Every text from a guest, a model or a document is escaped before HTML.

Design: docs/maps.md#review-correct-certify
"""

from __future__ import annotations

import json
from typing import Any

import ipywidgets as w
from ipyevents import Event

from tensorjob_jupyter.fanout import ReviewError, ReviewQueue
from tensorjob_jupyter.fanout.review_queue import QueueItem
from tensorjob_jupyter.fanout.reviews import typed_correction
from tensorjob_jupyter.frontends.view.map_widget import EVIDENCE_MARKS
from tensorjob_jupyter.frontends.view.render import GREY, PRE, RED
from tensorjob_jupyter.text import for_html

#: The keys the widget takes, and what each does (the buttons say the same).
KEYS = {"a": "accept", "Enter": "accept", "c": "correct", "n": "null", "s": "skip", "b": "back"}
REASON_WORDS = {"not_found": "found nowhere in what the item read", "elsewhere": "found under another field's label",
                "doubtful": "found only fuzzily or ambiguously", "least_confidence": "one of the least confident",
                "unmeasured": "no confidence was measured"}


def value_text(value: Any) -> str:
    """A value as the widget shows it: a string as itself, anything else as JSON (``null`` for None)."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def context_html(context: str | None) -> str:
    """The text around a value (``…before«span»after…``, ``ValueRow.context``) escaped, the span in a ``<mark>``."""
    if not context:
        return f'<span style="color:{GREY}">no document text to show (the value was found nowhere)</span>'
    before, marked, rest = context.partition("«")
    span, closed, after = rest.rpartition("»")
    if not marked or not closed:
        return for_html(context)
    return f"{for_html(before)}<mark>{for_html(span)}</mark>{for_html(after)}"


class ReviewWidget:
    """The widget of one ``ReviewQueue``; ``widget`` is what a cell displays. ``press(key)`` does what the key
    does (the keyboard's handler, and what a test calls)."""

    def __init__(self, queue: ReviewQueue) -> None:
        self.queue = queue
        self.heading = w.HTML()
        self.value = w.HTML()
        self.document = w.HTML()
        self.status = w.HTML()
        self.correction = w.Text(placeholder="the right value; Enter to keep it", continuous_update=False,
                                 layout=w.Layout(width="60%"))
        self.correction.observe(lambda change: self._correct(change["new"]), "value")  # on Enter (not per key)
        buttons = []
        for label, key in (("Accept (a)", "a"), ("Correct (c)", "c"), ("Null (n)", "n"), ("Skip (s)", "s"),
                           ("Back (b)", "b")):
            button = w.Button(description=label, layout=w.Layout(width="auto"))
            button.on_click(lambda _b, key=key: self.press(key))
            buttons.append(button)
        # the keys are the card's (the value and its document), so typing a correction is never a key press
        self.card = w.VBox([self.heading, self.value, self.document], layout=w.Layout(padding="4px"))
        self.card.add_class("tensorjob-review-card")
        self.widget = w.VBox([self.card, w.HBox(buttons), self.correction, self.status],
                             layout=w.Layout(border=f"1px solid {GREY}", padding="6px"))
        self.widget.add_class("tensorjob-review")
        self._keys = Event(source=self.card, watched_events=["keydown"], prevent_default_action=True)
        self._keys.on_dom_event(self._on_key)
        self._show(queue.next())

    def _on_key(self, event: dict) -> None:
        key = event.get("key")
        if isinstance(key, str):
            self.press(key)

    def press(self, key: str) -> None:
        action = KEYS.get(key)
        if action is None:
            return
        try:
            if action == "back":
                self._show(self.queue.back(), keep_status=True)
            elif action == "correct":
                self.status.value = "type the right value below and press Enter"
                self.correction.value = ""
                self.correction.focus()
            elif self.queue.current is not None:
                self.queue.decide(action)
                self._show(self.queue.next())
        except ReviewError as e:
            self.status.value = f'<span style="color:{RED}">{for_html(str(e))}</span>'

    def _correct(self, text: str) -> None:
        shown = self.queue.current
        if shown is None or not text:
            return  # the box emptied (by the widget itself), or nothing to correct
        try:
            value = typed_correction(text, shown.row.value)
            self.queue.decide("correct", value)
        except (ReviewError, ValueError) as e:
            self.status.value = f'<span style="color:{RED}">{for_html(str(e))}</span>'
            return
        self.correction.value = ""
        self._show(self.queue.next())

    def _show(self, item: QueueItem | None, *, keep_status: bool = False) -> None:
        certificate = self.queue.certificate()
        self.heading.value = (f"<b>{for_html(str(self.queue.progress()))}</b><br>"
                              f"<span>{for_html(certificate.statement())}</span>")
        if not keep_status:
            self.status.value = ""
        if item is None:
            self.value.value = "<b>Nothing more to review.</b>"
            self.document.value = ""
            return
        row = item.row
        # each evidence kind's mark, colour and words as the map view shows them
        mark, _cls, colour, words = EVIDENCE_MARKS.get(row.found or "", ("", "", GREY, "a null claims nothing"))
        sure = "-" if row.confidence is None else f"{row.confidence:.2f}"
        decided = (f" · decided: {for_html(item.review.decision)}" if item.review is not None else "")
        self.value.value = (
            f'<div>item <b>{for_html(row.key)}</b> · field <b>{for_html(row.field)}</b>{decided}</div>'
            f'<div style="font-size:1.2em"><code>{for_html(value_text(row.value))}</code> '
            f'<span style="color:{colour}" title="{for_html(words)}">{mark}</span></div>'
            f'<div>confidence {sure} · {for_html(words)} · asked because: '
            f'{for_html(REASON_WORDS.get(row.reason, row.reason))}'
            + (f' · under “{for_html(row.label)}”' if row.label else "") + "</div>")
        where = f"<div style='color:{GREY}'>{for_html(row.source)}</div>" if row.source else ""
        self.document.value = f'{where}<div style="{PRE}">{context_html(row.context)}</div>'


def review_widget(result: Any, **queue_options: Any) -> w.VBox:
    """The review widget of a map (a ``MapResult`` or its run folder); ``queue_options``: ``ReviewQueue``'s."""
    return ReviewWidget(ReviewQueue(result, **queue_options)).widget


__all__ = ["KEYS", "ReviewWidget", "review_widget", "context_html", "value_text"]

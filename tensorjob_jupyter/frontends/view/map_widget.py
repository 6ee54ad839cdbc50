"""The live view of a map: items done, failed and running (each from its first step), the rate, the latest answers.

Like the job view, it is a few plain widgets written by one updater thread at most ``refresh_hz`` times a
second, however fast items finish. A bounded table shows the latest items, every cell clipped and escaped
(inputs come from a manifest, results from guests and models), with each located or measured field's mark and
confidence, and its sources in a ``<details>`` that opens with no script.

Design: docs/internals/frontends.md#viewmap_widgetpy
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any

import ipywidgets as w

from tensorjob_jupyter.abi import dumps
from tensorjob_jupyter.fanout import MapProgress, MapRun
from tensorjob_jupyter.fanout.manifest import item_key
from tensorjob_jupyter.fanout.cascade import CascadeRun
from tensorjob_jupyter.fanout.map_folder_reader import FAILURES, RESULTS, read_records
from tensorjob_jupyter.frontends.view.cascade_panel import PHASE_TIERS, TIERS, part, render_cascade, tier_mark
from tensorjob_jupyter.frontends.view.in_flight import render_in_flight
from tensorjob_jupyter.frontends.view.live import LiveView, check_refresh_hz
from tensorjob_jupyter.frontends.view.render import AMBER, BLUE, GREEN, GREY, LIGHT_GREY, PALE, PRE, RED, status_badge
from tensorjob_jupyter.history.sources import excerpt_parts
from tensorjob_jupyter.host.fields import result_fields
from tensorjob_jupyter.host.grounding import (
    DOUBTFUL, ELSEWHERE, GROUNDED, NOT_FOUND, evidence_kind, source_label,
)
from tensorjob_jupyter.text import for_html

#: Concluded items the table shows while the map runs: the latest ones.
SHOW_ITEMS = 8
#: Items a finished map's view lists, in item order in a box that scrolls (the latest ones when there are more).
KEEP_ITEMS = 1000
#: Characters of an input, and of a result or error, the table shows on its one line.
INPUT_CHARS = 60
OUTCOME_CHARS = 120
#: A value longer than this (as JSON) is not turned into a line at all: its size is shown instead.
MAX_LINE_SOURCE_CHARS = 1 << 20

NOWRAP = "white-space:nowrap;overflow:hidden;text-overflow:ellipsis"
#: Fields of one result whose marks and sources a row shows (the rest are counted; ``tensorjob show --sources``
#: lists every one).
VIEW_FIELDS = 12
#: Characters of a field's value in its source's heading.
VALUE_CHARS = 60


def one_line(value: Any, limit: int) -> str:
    """A value as one line of compact JSON (a string as itself), clipped to ``limit`` characters with ``…``."""
    if isinstance(value, str):
        text = value
    else:
        try:
            text = dumps(value)
        except (TypeError, ValueError, RecursionError):
            text = str(type(value).__name__)
    if len(text) > MAX_LINE_SOURCE_CHARS:
        return f"({len(text)} characters)"
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


def item_row(event: dict) -> dict:
    """The table's row for an ``item.completed``/``item.failed`` event: short strings only."""
    ok = event["type"] == "item.completed"
    if ok:
        outcome = one_line(event.get("result"), OUTCOME_CHARS)
    else:
        error = event.get("error")
        error = error if isinstance(error, dict) else {}
        outcome = one_line(f"{error.get('code', '')}: {error.get('message', '')}", OUTCOME_CHARS)
    score = event.get("score")
    score = score if isinstance(score, dict) else {}
    value = score.get("score")
    item = event["item"]
    raw = event.get("input")
    key = item_key(raw, item) if isinstance(item, int) and not isinstance(item, bool) else str(item)
    named = key != str(item) or isinstance(raw, (str, int)) and not isinstance(raw, bool)
    phase = event.get("phase")
    tier = event.get("answered_by", PHASE_TIERS.get(phase) if isinstance(phase, str) else None)  # a cascade's
    return {"item": item, "ok": ok, "input": one_line(key if named else raw, INPUT_CHARS),
            "input_json": one_line(raw, INPUT_CHARS * 4), "outcome": outcome,
            "score": f"{value:.2f}" if isinstance(value, (int, float)) and not isinstance(value, bool) else "",
            "fields": result_evidence(event) if ok else None, "tier": tier if tier in TIERS else None}


def result_evidence(event: dict) -> dict | None:
    """The marks a completed item's cell shows: ``{"fields": [(name, value, sources, confidence)], "more": N,
    "verdicts": {name: right}}`` for the first ``VIEW_FIELDS`` fields of its result (``sources``: a list, ``[]``
    for found nowhere, None when not located; ``confidence``: 0 to 1, or None; ``verdicts``: the scorer's per
    field, where the map is scored), or None when the item has neither sources nor confidence. The sources are
    kept as the event gave them; their excerpts are read when the row is drawn."""
    sources = event.get("sources") if isinstance(event.get("sources"), dict) else None
    confidence = event.get("confidence") if isinstance(event.get("confidence"), dict) else None
    if sources is None and confidence is None:
        return None
    fields: list[tuple[str, Any, list[dict] | None, float | None]] = []
    total = 0
    for name, value in result_fields(event.get("result")):
        total += 1
        if len(fields) >= VIEW_FIELDS:
            continue
        found = sources.get(name) if sources is not None else None
        found = [f for f in found if isinstance(f, dict)] if isinstance(found, list) else None
        sure = confidence.get(name) if confidence is not None else None
        sure = float(sure) if (type(sure) is int or type(sure) is float) and 0 <= sure <= 1 else None
        fields.append((name, value, found, sure))
    score = event.get("score")
    given = score.get("fields") if isinstance(score, dict) else None
    given = given if isinstance(given, dict) else {}
    verdicts = {str(k): v for k, v in list(given.items())[:VIEW_FIELDS * 4] if isinstance(v, bool)}
    return {"fields": fields, "more": total - len(fields), "verdicts": verdicts} if fields else None


def render_header(name: str, p: MapProgress) -> str:
    link = ""
    if p.dashboard_link and p.dashboard_link.lower().startswith(("http://", "https://")):  # never javascript:
        href = for_html(p.dashboard_link)
        link = f' · <a href="{href}" target="_blank" rel="noopener" class="tj-dashboard">Dask dashboard</a>'
    rate = f" · {p.rate}" if p.rate else ""
    return (f'<div style="font-family:sans-serif;{NOWRAP}"><b>tensorjob map</b> {for_html(name)} '
            f'{status_badge(p.status)} <span class="tj-map-rate" style="color:{GREY}">{p.elapsed_s:.1f} s'
            f'{rate}{link}</span></div>')


def render_counts(p: MapProgress) -> str:
    score = ""
    if p.mean_score is not None:
        score = (f' · <span class="tj-map-score" title="the mean score of the items scored so far">score '
                 f'<b>{p.mean_score:.2f}</b> ({p.score_passed}/{p.scored} passed)</span>')
    needs = (f' · <span class="tj-map-needs-model" title="a replay whose recordings cannot answer these items: '
             f'replay them with --live">{p.needs_model} need the model</span>' if p.needs_model else "")
    return (f'<span class="tj-map-counts" style="font-family:sans-serif;font-size:12px;white-space:nowrap">'
            f'<b>{p.concluded}</b> / {p.total} · {p.completed} done · {p.failed - p.needs_model} failed{needs} · '
            f'{p.running} running · {p.skipped} skipped{score}</span>')


def render_items(rows: list[dict], *, finished: bool = False, concluded: int | None = None) -> str:
    """The latest concluded items, newest last: item, input, ✓ or ✗, the score (when scored), the result or
    the error. ``finished``: every row, in item order, in a box that scrolls (``concluded``: how many items
    ended, said when the box keeps fewer)."""
    if not rows:
        return ""
    if finished:
        rows = sorted(rows, key=lambda row: (not isinstance(row["item"], int), row["item"]))
        table = _items_table(rows)
        more = (concluded or 0) - len(rows)
        note = (f'<div class="tj-map-items-more" style="font-family:sans-serif;font-size:11px;color:{GREY}">'
                f'{more} earlier items are not listed here: <code>result.to_pandas()</code> or '
                f'<code>tensorjob runs --table RUN_DIR</code> lists every one</div>' if more > 0 else "")
        return (f'<div class="tj-map-items-all" style="max-height:18em;overflow-y:auto">{table}</div>{note}'
                if len(rows) > SHOW_ITEMS else table + note)
    return _items_table(rows[-SHOW_ITEMS:])


#: Each kind of evidence (``host.grounding.evidence_kind``): its mark, class, colour, and what it means.
EVIDENCE_MARKS = {
    GROUNDED: ("✓", "tj-grounded", GREEN, "found: the value itself, in what the item read"),
    ELSEWHERE: ("↗", "tj-elsewhere", AMBER, "found only under a label that names another field"),
    DOUBTFUL: ("~", "tj-doubtful", AMBER, "only a fuzzy match or an ambiguous spelling: not the value itself"),
    NOT_FOUND: ("✗", "tj-ungrounded", RED, "found in no window the item read"),
}
#: Right or wrong against the expected answer (the map's scorer, per field): words, so never read as found.
VERDICT_MARKS = {True: ("right", "tj-right", GREEN), False: ("wrong", "tj-wrong", RED)}


def evidence_legend(verdicts: bool) -> str:
    """The line under the items that says what each mark means (and, with expected answers, right and wrong)."""
    parts = [f'<span class="tj-legend-mark" style="color:{colour}">{mark}</span> {for_html(meaning)}'
             for mark, _cls, colour, meaning in EVIDENCE_MARKS.values()]
    if verdicts:
        parts.append(f'<span class="tj-legend-mark" style="color:{GREEN}">right</span> / <span class="tj-legend-mark" '
                     f'style="color:{RED}">wrong</span> against the expected answer')
    return (f'<div class="tj-evidence-legend" style="font-family:sans-serif;font-size:10px;color:{GREY};'
            f'margin:2px 0 0 0">{" · ".join(parts)}</div>')


def field_marks(evidence: dict) -> str:
    """One line of marks: each field's name, what its sources say (``EVIDENCE_MARKS``: ✓ found, ↗ elsewhere, ~
    doubtful, ✗ not found), right or wrong against the expected answer where the map is scored, and its
    confidence. Found and right are different marks: a value can be found and wrong."""
    marks = []
    verdicts = evidence.get("verdicts") or {}
    for name, _value, found, sure in evidence["fields"]:
        kind = evidence_kind(found)
        mark = ""
        if kind is not None:
            symbol, cls, colour, meaning = EVIDENCE_MARKS[kind]
            mark = f'<span class="{cls}" style="color:{colour}" title="{for_html(meaning)}">{symbol}</span>'
        verdict = verdicts.get(name)
        if verdict in VERDICT_MARKS:
            word, cls, colour = VERDICT_MARKS[verdict]
            mark += f' <span class="{cls}" style="color:{colour}">{word}</span>'
        conf = "" if sure is None else f' <span class="tj-confidence" style="color:{GREY}">{sure:.2f}</span>'
        marks.append(f'<span class="tj-field-mark">{for_html(name or "(result)")} {mark}{conf}</span>')
    more = f' <span style="color:{GREY}">+{evidence["more"]} fields</span>' if evidence["more"] else ""
    return " · ".join(marks) + more


def label_note(source: dict) -> str:
    """`` under «LABEL»`` for a source with a label, and ``, which names FIELD`` when that is another field's."""
    label = source.get("label")
    if not isinstance(label, str) or not label:
        return ""
    elsewhere = source.get("elsewhere") is True and isinstance(source.get("under"), str)
    return f" under «{one_line(label, 40)}»" + (f", which names {one_line(source['under'], 40)}" if elsewhere else "")


def field_sources(evidence: dict) -> str:
    """What a cell opens to: each field's value, its best source and match, its confidence, and an excerpt of
    the file around the span, the span highlighted (``<mark>``); a field found nowhere says so."""
    parts = []
    for name, value, found, sure in evidence["fields"]:
        head = f'<b>{for_html(name or "(result)")}</b> = {for_html(one_line(value, VALUE_CHARS))}'
        conf = "" if sure is None else f" · confidence {sure:.2f}"
        if found is None:
            parts.append(f'<div class="tj-field-source">{head}{conf}</div>')
            continue
        if not found:
            parts.append(f'<div class="tj-field-source tj-not-found">{head} · <span style="color:{RED}">not found '
                         f'in what the item read</span>{conf}</div>')
            continue
        best = found[0]
        more = f" (+{len(found) - 1} more)" if len(found) > 1 else ""
        where = f"{source_label(best)} {best.get('match', '')} {best.get('score', '')}{more}{label_note(best)}"
        excerpt = excerpt_parts(best)
        shown = ""
        if excerpt is not None:
            before, span, after, cut = excerpt
            shown = (f'<pre class="tj-preview tj-source-excerpt" style="{PRE}white-space:pre-wrap;margin:1px 0;'
                     f'background:{PALE};padding:2px">{"…" if cut else ""}{for_html(before)}<mark class="tj-span">'
                     f'{for_html(span)}</mark>{for_html(after)}…</pre>')
        parts.append(f'<div class="tj-field-source">{head} · <span style="color:{GREY}">{for_html(where)}'
                     f'</span>{conf}{shown}</div>')
    return "".join(parts)


def _outcome_cell(row: dict, cell: str) -> str:
    """The result or error cell: one clipped line; a result with evidence also marks each field, and opens
    (a click, no script) to its sources."""
    evidence = row.get("fields")
    if not evidence:
        return (f'<td style="{cell};color:{"inherit" if row["ok"] else RED}" title="{for_html(row["outcome"])}">'
                f'{for_html(row["outcome"])}</td>')
    opened = row.get("_sources_html")
    if opened is None:  # read once a row, when it is first drawn (not on the map's thread)
        opened = row["_sources_html"] = field_sources(evidence)
    return (f'<td class="tj-map-item-result" style="padding:1px 6px;max-width:0" title="{for_html(row["outcome"])}">'
            f'<details class="tj-map-item-sources"><summary style="{NOWRAP};cursor:pointer">{field_marks(evidence)}'
            f' <span style="color:{GREY}">{for_html(row["outcome"])}</span></summary>'
            f'<div style="font-family:sans-serif;font-size:11px;white-space:normal">{opened}</div></details></td>')


def _items_table(rows: list[dict]) -> str:
    cell = f"padding:1px 6px;max-width:0;{NOWRAP}"
    whole = "padding:1px 6px;white-space:nowrap;overflow:visible;box-sizing:content-box"  # numbers never clipped
    digits = max(len(str(row["item"])) for row in rows)
    scored = any(row.get("score") for row in rows)
    score_chars = max([len(row.get("score", "")) for row in rows] + [4])
    tiered = any(row.get("tier") for row in rows)  # a cascade's: who answered each item
    body = "".join(
        f'<tr><td class="tj-map-item-number" style="{whole};color:{GREY};width:{digits}ch;text-align:right">'
        f'{for_html(str(row["item"]))}</td>'
        f'<td class="tj-map-item-input" style="{cell};width:35%" title="{for_html(row.get("input_json", row["input"]))}">'
        f'{for_html(row["input"])}</td>'
        f'<td style="{cell};width:1.5em;color:{GREEN if row["ok"] else RED}">{"✓" if row["ok"] else "✗"}</td>'
        + (f'<td class="tj-map-item-tier" style="{whole};width:7ch">{tier_mark(row.get("tier"))}</td>'
           if tiered else "")
        + (f'<td class="tj-map-item-score" style="{whole};width:{score_chars}ch;color:{GREY}">'
           f'{for_html(row.get("score", ""))}</td>' if scored else "") +
        f'{_outcome_cell(row, cell)}</tr>' for row in rows)
    table = (f'<table class="tj-map-items" style="font-family:monospace;font-size:11px;border-collapse:collapse;'
             f'table-layout:fixed;width:100%;line-height:1.4"><tbody>{body}</tbody></table>')
    evidence = [row["fields"] for row in rows if row.get("fields")]
    if not evidence:
        return table
    return table + evidence_legend(any(e.get("verdicts") for e in evidence))


def render_bar(p: MapProgress, width: int = 240) -> str:
    """The progress bar as plain markup, for the static view."""
    fraction = p.concluded / p.total if p.total else 1.0
    colour = RED if p.status == "error" else GREEN if p.status == "finished" else BLUE
    return (f'<span style="display:inline-block;vertical-align:middle;width:{width}px;height:10px;'
            f'background:{LIGHT_GREY}"><span style="display:block;height:10px;width:{100 * fraction:.1f}%;'
            f'background:{colour}"></span></span>')


class MapView(LiveView):
    text_plain = "tensorjob map view (shown by the Jupyter widget front end)"

    def __init__(self, run: "MapRun | CascadeRun", name: str, *, refresh_hz: float = 10.0):
        self.refresh_s = check_refresh_hz(refresh_hz)
        self.run = run
        self.name = name
        self.pushes = 0
        self.header = w.HTML()
        self.bar = w.FloatProgress(value=0.0, min=0.0, max=1.0, layout=w.Layout(width="60%"))
        self.counts = w.HTML()
        self.items = w.HTML()
        self.cascade = w.HTML()  # a cascade's phases, sample and threshold (empty for a plain map)
        self.in_flight = w.HTML()  # the items running now (``in_flight``)
        self.cancel_button = self._cancel_button("Stop this map", run.cancel)
        self.widget = self._column([self.header, w.HBox([self.bar, self.cancel_button]), self.counts, self.cascade,
                                    self.in_flight, self.items], "tensorjob-map-view")
        self._sampled: set[int] = set()  # a cascade's sampled items the oracle concluded while this view watched
        self._rows: deque[dict] = deque(maxlen=KEEP_ITEMS)
        self._last: MapProgress = run.progress()
        self._lock = threading.Lock()
        self._unsubscribe = run.subscribe(self._on_event)
        self._thread = self._updater(self._loop, "tensorjob-map-view")
        self._render(self._last)

    def _on_event(self, event: dict) -> None:
        """On the map's thread: only remember the item's short row; the updater renders."""
        if event["type"] in ("item.completed", "item.failed"):
            row = item_row(event)
            with self._lock:
                self._rows.append(row)
                if event.get("phase") == "sample":
                    self._sampled.add(row["item"])

    def _loop(self) -> None:
        version = -1
        while True:
            progress = self.run.wait_for_update(version, timeout=self.refresh_s)
            version = progress.version
            self._render(progress)
            if self.run.done:
                self._fill_from_folder()
                self._render(self.run.progress())
                self._unsubscribe()
                self.finish_display()
                return
            time.sleep(self.refresh_s)  # at most refresh_hz renders a second

    def _render(self, p: MapProgress) -> None:
        self.pushes += 1
        self._last = p
        header = render_header(self.name, p)
        if self.header.value != header:
            self.header.value = header
        fraction = p.concluded / p.total if p.total else 1.0
        style = {"finished": "success" if not p.failed else "warning", "error": "danger"}.get(p.status, "")
        if (self.bar.value, self.bar.bar_style) != (fraction, style):
            with self.bar.hold_sync():
                self.bar.value = fraction
                self.bar.bar_style = style
        counts = render_counts(p)
        if self.counts.value != counts:
            self.counts.value = counts
        cascade = self._cascade_html(p)
        if self.cascade.value != cascade:
            self.cascade.value = cascade
        flights = render_in_flight(self.run.in_flight()) if p.status == "running" else ""
        if self.in_flight.value != flights:
            self.in_flight.value = flights
        items = self._items_html()
        if self.items.value != items:
            self.items.value = items
        if p.status != "running":
            self._finish_button(self.cancel_button, p.status)

    def _fill_from_folder(self) -> None:
        """Once the map has ended, rows for the items whose events came before the view subscribed (a quick
        map's first items), read back from the run folder."""
        p = self.run.progress()
        cascade = isinstance(self.run, CascadeRun)  # its phases' rows give way to the merged answers, one an item
        with self._lock:
            have = set() if cascade else {row["item"] for row in self._rows}
        if len(have) >= min(p.concluded, KEEP_ITEMS):
            return
        try:
            result = self.run.wait(0)
            scores = result.scores() or {}
            inputs = result.inputs
            found = {i: ("item.failed", i, {"error": e}) for i, e in result.failures().items()}
            sources, confidences = result.sources(), result.confidences()
            found.update({i: ("item.completed", i, {"result": r, "sources": sources.get(i),
                                                    "confidence": confidences.get(i)})
                          for i, r in result.results().items()})
            tiers = {r["item"]: r.get("answered_by") for name in (FAILURES, RESULTS)
                     for r in read_records(result.run_dir / name, total=result.total)} if cascade else {}
        except Exception:  # noqa: BLE001 - a folder that cannot be read back leaves the rows the events gave
            return
        rows = []
        for kind, item, outcome in sorted(found.values(), key=lambda f: f[1])[-KEEP_ITEMS:]:
            if item in have or not isinstance(item, int):
                continue
            score = scores.get(item)
            rows.append(item_row({"type": kind, "item": item, **outcome,
                                  "input": inputs[item] if 0 <= item < len(inputs) else None,
                                  "score": {"score": score.score, "fields": score.fields or {}}
                                  if score is not None else None, "answered_by": tiers.get(item)}))
        with self._lock:
            if cascade:
                self._rows.clear()
            self._rows.extend(rows)

    def _items_html(self) -> str:
        with self._lock:
            rows = list(self._rows)
        p = self._last
        return render_items(rows, finished=p.status != "running", concluded=p.concluded)

    def static_html(self) -> str:
        p = self._last
        return (f'<div class="tensorjob-map-view tj-static" style="border:1px solid {LIGHT_GREY};padding:4px">'
                f'{render_header(self.name, p)}<div>{render_bar(p)} {render_counts(p)}</div>'
                f'{self._cascade_html(p)}{self._items_html()}</div>')

    def _cascade_html(self, p: MapProgress) -> str:
        """A cascade's panel (``cascade_panel``); nothing for a plain map."""
        run = self.run
        if not isinstance(run, CascadeRun):
            return ""
        state = dict(run.state)  # the cascade's thread replaces its entries, never changes them in place
        sample = part(state, "sample") or {}
        size = len(sample.get("items") or [])
        with self._lock:
            seen = len(self._sampled)
        now = p.concluded if run.phase == "sample" and p.total == size else seen  # a resumed sample counts its own
        return render_cascade(run.phase, state, sample_done=min(now, size),
                              ended=p.status if run.done else None)


__all__ = [
    "SHOW_ITEMS", "KEEP_ITEMS", "INPUT_CHARS", "OUTCOME_CHARS", "MAX_LINE_SOURCE_CHARS", "NOWRAP", "VIEW_FIELDS",
    "VALUE_CHARS", "one_line", "item_row", "result_evidence", "field_marks", "field_sources",
    "render_header", "render_counts", "render_items", "render_bar", "MapView"
]

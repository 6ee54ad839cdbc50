"""The live view of a map: items done, failed and running, throughput, dashboard.

Like the job view, it is a few plain widgets written by one updater thread,
at most ``refresh_hz`` times a second however fast items finish: the thread
waits on ``MapRun.wait_for_update`` and renders a fresh ``MapProgress``
snapshot. A failure list shows the latest failed items with their error
codes (escaped: messages come from guests). On a Dask cluster the header
links to the cluster's dashboard. The Cancel button only asks the map to
stop; the Cancel click runs on a side thread while the cell waits, as for
jobs.
"""

from __future__ import annotations

import threading
import time

import ipywidgets as w

from ..fanout import MapProgress, MapRun
from ..text import for_html
from .live import LiveView, check_refresh_hz
from .render import GREY, RED, status_badge

SHOW_FAILURES = 5


def render_header(name: str, p: MapProgress) -> str:
    link = ""
    if p.dashboard_link:
        href = for_html(p.dashboard_link)
        link = f' · <a href="{href}" target="_blank" rel="noopener" class="tj-dashboard">Dask dashboard</a>'
    return (f'<div style="font-family:sans-serif"><b>tensorjob map</b> {for_html(name)} '
            f'{status_badge(p.status)} <span style="color:{GREY}">{p.elapsed_s:.1f} s · '
            f'{p.throughput:.1f} items/s{link}</span></div>')


def render_counts(p: MapProgress) -> str:
    return (f'<span class="tj-map-counts" style="font-family:sans-serif;font-size:12px">'
            f'<b>{p.concluded}</b> / {p.total} · {p.completed} done · {p.failed} failed · '
            f'{p.running} running · {p.skipped} skipped</span>')


def render_failures(failures: list[dict]) -> str:
    if not failures:
        return ""
    rows = "".join(f"<div>item {f['item']}: <b>{for_html(f['error'].get('code', ''))}</b> "
                   f"{for_html(f['error'].get('message', ''))}</div>" for f in failures)
    return (f'<div class="tj-map-failures" style="font-family:monospace;font-size:11px;color:{RED};'
            f'line-height:1.4">{rows}</div>')


class MapView(LiveView):
    text_plain = "tensorjob map view (shown by the Jupyter widget front end)"

    def __init__(self, run: MapRun, name: str, *, refresh_hz: float = 10.0):
        self.refresh_s = check_refresh_hz(refresh_hz)
        self.run = run
        self.name = name
        self.pushes = 0
        self.header = w.HTML()
        self.bar = w.FloatProgress(value=0.0, min=0.0, max=1.0, layout=w.Layout(width="60%"))
        self.counts = w.HTML()
        self.failures = w.HTML()
        self.cancel_button = self._cancel_button("Stop this map", run.cancel)
        self.widget = self._column([self.header, w.HBox([self.bar, self.counts, self.cancel_button]), self.failures],
                                   "tensorjob-map-view")
        self._failed: list[dict] = []
        self._lock = threading.Lock()
        self._unsubscribe = run.subscribe(self._on_event)
        self._thread = self._updater(self._loop, "tensorjob-map-view")
        self._render(run.progress())

    def _on_event(self, event: dict) -> None:
        """On the map's thread: only remember failures; the updater renders."""
        if event["type"] == "item.failed":
            with self._lock:
                self._failed = (self._failed + [{"item": event["item"], "error": event["error"]}])[-SHOW_FAILURES:]

    def _loop(self) -> None:
        version = -1
        while True:
            progress = self.run.wait_for_update(version, timeout=self.refresh_s)
            version = progress.version
            self._render(progress)
            if self.run.done:
                self._render(self.run.progress())
                self._unsubscribe()
                return
            time.sleep(self.refresh_s)  # at most refresh_hz renders a second

    def _render(self, p: MapProgress) -> None:
        self.pushes += 1
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
        with self._lock:
            failures = render_failures(self._failed)
        if self.failures.value != failures:
            self.failures.value = failures
        if p.status != "running":
            self._finish_button(self.cancel_button, p.status)

"""The live job view: small ipywidgets, written by one thread, throttled.

``JobView(job)`` builds a column of plain widgets -- a header (status,
elapsed, tokens per second), a progress bar and its label, a log, the
streamed tokens of each infer, a Files panel (path, size, coverage bar,
preview of the latest window), the guest's streamed output, the result as
collapsible JSON, the usage line and a Cancel button -- and one updater
thread that folds the job's events into a ``ViewState`` and pushes only the
sections that changed, at most ``refresh_hz`` times a second. Jupyter drops
IOPub traffic past 1000 messages a second, and every update of an HTML
widget resends its whole value, so the rate is bounded whatever the token
rate; the updater is the only thread that writes widget state (traitlets
take no locks). The Cancel button only asks the job to stop.

The job may also be a recorded run played back (``show.Playback``): it
subscribes, cancels (skips to the end) and names itself the same way, and
brings the clock its ViewState reads.

The view's ``text/plain`` form is ``LiveView.text_plain``, a fixed line, so a
notebook that shows it compares equal under nbval whatever happened live.
"""

from __future__ import annotations

import time

import ipywidgets as w

from ..jobs import Job
from ..show import Playback
from . import render
from .live import LiveView, check_refresh_hz
from .state import ViewState

#: Widget messages per second the view never exceeds, whatever the refresh rate.
MAX_MESSAGES_PER_S = 20


class JobView(LiveView):
    def __init__(self, job: "Job | Playback", *, refresh_hz: float = 10.0):
        self.refresh_s = check_refresh_hz(refresh_hz)
        self.job = job
        # A recorded run played back (show.Playback) brings the clock of its recording.
        self.state = ViewState(job.name, clock=getattr(job, "clock", time.monotonic))
        self.pushes = 0
        self.messages = 0
        self.header = w.HTML()
        self.progress = w.FloatProgress(value=0.0, min=0.0, max=1.0, layout=w.Layout(width="60%"))
        self.progress_label = w.Label()
        self.log = w.HTML()
        self.tokens = w.HTML()
        self.files = w.HTML()
        self.output = w.HTML()
        self.result = w.HTML()
        self.usage = w.HTML()
        self.cancel_requested = False
        self.cancel_button = self._cancel_button("Stop this job", self._on_cancel)
        self.widget = self._column([self.header, w.HBox([self.progress, self.progress_label, self.cancel_button]),
                                    self.log, self.tokens, self.files, self.output, self.result, self.usage],
                                   "tensorjob-view")
        self._sections = {"header": self.header, "log": self.log, "tokens": self.tokens, "files": self.files,
                          "output": self.output, "result": self.result, "usage": self.usage}
        self._subscription = job.subscribe()
        self._thread = self._updater(self._run, f"tensorjob-view-{job.id}")
        self._push(self.state.take_dirty())

    # -- front-end side ------------------------------------------------------------------

    def _on_cancel(self) -> None:
        """Runs on the kernel's main thread: only asks, never writes widgets."""
        self.cancel_requested = True
        self.job.cancel()

    # -- the updater thread ---------------------------------------------------------------

    def _run(self) -> None:
        next_push = time.monotonic()
        finished = False
        while not finished:
            wait = max(0.0, next_push - time.monotonic())
            event = self._subscription.get(timeout=wait if wait > 0 else 0.001)
            if event is not None:
                self.state.apply(event)
            elif self._subscription.ended:
                finished = True
            now = time.monotonic()
            if now >= next_push or finished:
                dirty = self.state.take_dirty()
                if not self.state.done:
                    dirty.add("header")  # the elapsed time moves
                sent = self._push(dirty)
                # Space pushes so that messages never exceed MAX_MESSAGES_PER_S.
                next_push = now + max(self.refresh_s, sent / MAX_MESSAGES_PER_S)
        for event in self._subscription.drain():
            self.state.apply(event)
        self._push(self.state.take_dirty() | {"header"})

    def _push(self, dirty: set[str]) -> int:
        """Write the changed sections; returns the number of widget messages sent."""
        if not dirty:
            return 0
        sent = 0
        for name in dirty:
            widget = self._sections.get(name)
            if widget is not None:
                value = render.RENDERERS[name](self.state)
                if widget.value != value:
                    widget.value = value
                    sent += 1
        if "progress" in dirty:
            fraction = self.state.fraction if self.state.fraction is not None else 0.0
            style = {"completed": "success", "failed": "danger"}.get(self.state.status, "")
            if (self.progress.value, self.progress.bar_style) != (fraction, style):
                with self.progress.hold_sync():
                    self.progress.value = fraction
                    self.progress.bar_style = style
                sent += 1
            if self.progress_label.value != self.state.progress_text:
                self.progress_label.value = self.state.progress_text
                sent += 1
        if self.state.done and self._finish_button(self.cancel_button, self.state.status):
            sent += 1
        self.pushes += 1
        self.messages += sent
        return sent

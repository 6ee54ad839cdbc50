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

The view's ``text/plain`` form is a fixed line, so a notebook that shows it
compares equal under nbval whatever happened live.
"""

from __future__ import annotations

import contextvars
import threading
import time

import ipywidgets as w

from ..jobs import Job
from . import render
from .side_channel import route_clicks_to_side_thread
from .state import ViewState

TEXT_PLAIN = "tensorjob live view (shown by the Jupyter widget front end)"
#: Widget messages per second the view never exceeds, whatever the refresh rate.
MAX_MESSAGES_PER_S = 20


class JobView:
    def __init__(self, job: Job, *, refresh_hz: float = 10.0):
        if not 0 < refresh_hz <= 20:
            raise ValueError("refresh_hz must be in (0, 20]")
        self.job = job
        self.refresh_s = 1.0 / refresh_hz
        self.state = ViewState(job.name)
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
        self.cancel_button = w.Button(description="Cancel", icon="stop", button_style="warning",
                                      tooltip="Stop this job")
        self.cancel_button.on_click(self._on_cancel)
        self.cancel_requested = False
        self.clicks_off_main_thread = route_clicks_to_side_thread(self.cancel_button)
        self.widget = w.VBox([self.header, w.HBox([self.progress, self.progress_label, self.cancel_button]),
                              self.log, self.tokens, self.files, self.output, self.result, self.usage],
                             layout=w.Layout(border="1px solid #d0d7de", padding="4px"))
        self.widget.add_class("tensorjob-view")
        self._sections = {"header": self.header, "log": self.log, "tokens": self.tokens, "files": self.files,
                          "output": self.output, "result": self.result, "usage": self.usage}
        self._subscription = job.subscribe()
        # The updater runs in a copy of the creating cell's context, so in a
        # kernel its messages stay attached to that cell (whatever runs later).
        context = contextvars.copy_context()
        self._thread = threading.Thread(target=context.run, args=(self._run,), name=f"tensorjob-view-{job.id}",
                                        daemon=True)
        self._push(self.state.take_dirty())

    # -- front-end side ------------------------------------------------------------------

    def _on_cancel(self, _button=None) -> None:
        """Runs on the kernel's main thread: only asks, never writes widgets."""
        self.cancel_requested = True
        self.job.cancel()

    def _repr_mimebundle_(self, **kwargs):
        bundle = self.widget._repr_mimebundle_(**kwargs)
        if isinstance(bundle, tuple):
            bundle = bundle[0]
        bundle = dict(bundle or {})
        bundle["text/plain"] = TEXT_PLAIN
        return bundle

    # -- the updater thread ---------------------------------------------------------------

    def start(self) -> "JobView":
        self._thread.start()
        return self

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

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
        if self._subscription.missed:
            # The queue overflowed at some point: rebuild from the full history.
            self.state = ViewState(self.job.name)
            for event in self.job.events:
                self.state.apply(event)
            self.state.started = self.job.started_monotonic or self.state.started
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
        if self.state.done and not self.cancel_button.disabled:
            with self.cancel_button.hold_sync():
                self.cancel_button.disabled = True
                self.cancel_button.button_style = ""
                self.cancel_button.icon = ""
                self.cancel_button.description = self.state.status.capitalize()
            sent += 1
        self.pushes += 1
        self.messages += sent
        return sent

"""The live job view: small ipywidgets, written by one thread, throttled.

``JobView(job)`` builds a column of plain widgets and one updater thread that folds the job's events into a
``ViewState`` and pushes only the sections that changed, at most ``refresh_hz`` times a second: Jupyter drops
IOPub traffic past 1000 messages a second, so the rate is bounded whatever the token rate. A job being debugged
gets a debug bar, and a finished one a slider to scrub through its events; their clicks go through the side
channel. The job may also be a recorded run played back (``show.Playback``).

Design: docs/internals/frontends.md#viewwidgetpy
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time

import ipywidgets as w

from tensorjob_jupyter.host import Job
from tensorjob_jupyter.history.show import Playback
from tensorjob_jupyter.frontends.view import render
from tensorjob_jupyter.text import for_html
from tensorjob_jupyter.frontends.view.live import LiveView, check_refresh_hz
from tensorjob_jupyter.frontends.view.side_channel import route_clicks_to_side_thread
from tensorjob_jupyter.frontends.view.state import SECTIONS, ViewState
from tensorjob_jupyter.frontends.view.scrub import Timeline

log = logging.getLogger("tensorjob_jupyter.frontends.view")

#: Widget messages per second the view never exceeds, whatever the refresh rate.
MAX_MESSAGES_PER_S = 20
#: A scrub thread with nothing to do for this long ends (the next move starts another).
SCRUB_IDLE_S = 60.0


class JobView(LiveView):
    def __init__(self, job: "Job | Playback", *, refresh_hz: float = 10.0):
        self.refresh_s = check_refresh_hz(refresh_hz)
        self.job = job
        # A recorded run played back (show.Playback) brings the clock of its recording.
        self.state = ViewState(job.name, clock=getattr(job, "clock", time.monotonic))
        self.pushes = 0
        self.messages = 0
        self.header = w.HTML()
        # Hidden until the guest reports progress: a job that never does shows no empty bar.
        self.progress = w.FloatProgress(value=0.0, min=0.0, max=1.0, layout=w.Layout(width="60%", display="none"))
        self.progress_label = w.Label(layout=w.Layout(display="none"))
        self.log = w.HTML()
        self.tokens = w.HTML()
        self.files = w.HTML()
        self.output = w.HTML()
        self.result = w.HTML()
        self.usage = w.HTML()
        self.cancel_requested = False
        self.cancel_button = self._cancel_button("Stop this job", self._on_cancel)
        self._context = contextvars.copy_context()
        rows = [self.header, w.HBox([self.progress, self.progress_label, self.cancel_button])]
        self._sections = {"header": self.header, "log": self.log, "tokens": self.tokens, "files": self.files,
                          "output": self.output, "result": self.result, "usage": self.usage}
        # The debugger: buttons for a live job being debugged, the panel also for a recorded one.
        self.debug_buttons: dict[str, w.Button] = {}
        if isinstance(job, Job) and job.debugging:
            self.debug_buttons = {
                "continue": self._debug_button("Continue", "play", "Run on; stop only at breakpoints",
                                               lambda: job.resume()),
                "step": self._debug_button("Step", "step-forward", "Carry out this command and pause before the next",
                                           lambda: job.step(wait=False)),
                "until": self._debug_button("Step to next infer", "forward",
                                            "Run on to the guest's next infer and pause before it",
                                            lambda: job.step("infer", wait=False)),
                "pause": self._debug_button("Pause", "pause", "Pause before the guest's next command",
                                            lambda: job.pause(wait=False)),
            }
            bar = w.HBox(list(self.debug_buttons.values()))
            bar.add_class("tj-debug-bar")
            rows.append(bar)
        self.debug_panel: w.HTML | None = None
        if self.debug_buttons or getattr(job, "debugging", False):
            self.debug_panel = w.HTML()
            self._sections["debug"] = self.debug_panel
            rows.append(self.debug_panel)
        rows += [self.log, self.tokens, self.files, self.output, self.result, self.usage]
        # Scrubbing a finished job: hidden until the job ends.
        self.scrub = w.IntSlider(value=0, min=0, max=0, step=1, description="event", continuous_update=True,
                                 readout=True, layout=w.Layout(width="60%"))
        self.scrub_label = w.HTML()
        self.scrub_row = w.HBox([self.scrub, self.scrub_label], layout=w.Layout(display="none"))
        self.scrub_row.add_class("tj-scrub")
        self.scrub.observe(self._on_scrub, names="value")
        route_clicks_to_side_thread(self.scrub)
        rows.append(self.scrub_row)
        self.widget = self._column(rows, "tensorjob-view")
        self._scrub_ready = False
        self._scrub_lock = threading.Lock()
        self._scrub_wanted = threading.Event()
        self._scrub_target = 0
        self._scrub_thread: threading.Thread | None = None
        self._timeline = None
        self._last_event: dict | None = None
        self.scrubbed_to: int | None = None  # the event the view shows, once scrubbed
        self._scrub_sent = 0
        self._subscription = job.subscribe()
        self._thread = self._updater(self._run, f"tensorjob-view-{job.id}")
        self._push(self.state.take_dirty())

    # -- front-end side ------------------------------------------------------------------

    def _on_cancel(self) -> None:
        """Runs on the kernel's main thread: only asks, never writes widgets."""
        self.cancel_requested = True
        self.job.cancel()

    def _debug_button(self, label: str, icon: str, tooltip: str, action) -> w.Button:
        """A debugger button: fixed label, disabled until the updater says otherwise; its clicks run on the
        side channel and only call a control that never waits."""
        button = w.Button(description=label, icon=icon, tooltip=tooltip, disabled=True)

        def clicked(_button) -> None:
            try:
                action()
            except Exception:  # noqa: BLE001 - a click must never raise into the kernel
                log.warning("tensorjob: the %s button failed", label, exc_info=True)

        button.on_click(clicked)
        route_clicks_to_side_thread(button)
        return button

    # -- the updater thread ---------------------------------------------------------------

    def _run(self) -> None:
        next_push = time.monotonic()
        finished = False
        while not finished:
            wait = max(0.0, next_push - time.monotonic())
            event = self._subscription.get(timeout=wait if wait > 0 else 0.001)
            if event is not None:
                self.state.apply(event)
                self._last_event = event
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
            self._last_event = event
        self._push(self.state.take_dirty() | {"header"})
        self.finish_display()
        self._open_scrub()

    def static_html(self) -> str:
        return render.static(self.state)

    def _push(self, dirty: set[str], state: ViewState | None = None) -> int:
        """Write the changed sections (of ``state``: the live one unless scrubbing); returns the number of
        widget messages sent."""
        if not dirty:
            return 0
        state = state if state is not None else self.state
        sent = 0
        for name in dirty:
            widget = self._sections.get(name)
            if widget is not None:
                value = render.RENDERERS[name](state)
                if widget.value != value:
                    widget.value = value
                    sent += 1
        if self.debug_buttons and ("header" in dirty or "debug" in dirty):
            sent += self._debug_button_states()
        if "progress" in dirty:
            shown = "" if state.fraction is not None else "none"
            for widget in (self.progress, self.progress_label):
                if widget.layout.display != shown:
                    widget.layout.display = shown
                    sent += 1
            fraction = state.fraction if state.fraction is not None else 0.0
            style = {"completed": "success", "failed": "danger"}.get(state.status, "")
            if (self.progress.value, self.progress.bar_style) != (fraction, style):
                with self.progress.hold_sync():
                    self.progress.value = fraction
                    self.progress.bar_style = style
                sent += 1
            if self.progress_label.value != state.progress_text:
                self.progress_label.value = state.progress_text
                sent += 1
        if self.state.done and self._finish_button(self.cancel_button, self.state.status):
            sent += 1
        self.pushes += 1
        self.messages += sent
        return sent

    def _debug_button_states(self) -> int:
        """Continue and the Steps while the live job is paused, Pause while it runs, nothing once it ended."""
        live = self.state
        paused = live.paused and not live.done
        running = not live.paused and not live.done
        sent = 0
        for name, button in self.debug_buttons.items():
            disabled = not (running if name == "pause" else paused)
            if button.disabled != disabled:
                button.disabled = disabled
                sent += 1
        return sent

    # -- scrubbing a finished job ----------------------------------------------------------

    def _open_scrub(self) -> None:
        """The job has ended: show the slider over its events (the updater's last write)."""
        count = self.state.events_seen
        if count < 2:
            return
        with self.scrub.hold_sync():
            self.scrub.max = count - 1
            self.scrub.value = count - 1
        self.scrub_label.value = self._scrub_text(count - 1, self.state.last_type)
        self._scrub_ready = True
        self.scrub_row.layout.display = "flex"

    def _scrub_text(self, index: int, kind: str | None) -> str:
        total = max(0, self.state.events_seen - 1)
        return (f'<span class="tj-scrub-at" style="font-family:sans-serif;font-size:12px">event {index} of {total}'
                f'{" · " + for_html(str(kind)) if kind else ""}</span>')

    def _on_scrub(self, change) -> None:
        """The slider moved (front end; on the side channel): remember where to, wake the scrub thread."""
        if not self._scrub_ready or int(change["new"]) == self.scrubbed_to:
            return
        self._scrub_target = int(change["new"])
        self._scrub_wanted.set()
        with self._scrub_lock:
            if self._scrub_thread is None:
                context = self._context.copy()
                self._scrub_thread = threading.Thread(target=context.run, args=(self._scrub_loop,),
                                                      name=f"tensorjob-scrub-{self.job.id}", daemon=True)
                self._scrub_thread.start()

    def timeline(self):
        """The job's events, re-foldable to any one (built on first use)."""
        if self._timeline is None:
            path = self.job.transcript_path
            timeline = Timeline(path, self.state.name)
            if len(timeline) < self.state.events_seen and self._last_event is not None:
                timeline = Timeline(path, self.state.name, extra=[self._last_event])  # show's synthetic end
            self._timeline = timeline
        return self._timeline

    def scrub_to(self, index: int) -> ViewState:
        """Show the view as it was just after event ``index`` (and move the slider there); returns that state.
        The slider calls it on the scrub thread; call it yourself only while nobody drags."""
        timeline = self.timeline()
        state = timeline.state_at(index)
        index = max(0, min(index, len(timeline) - 1))
        self._scrub_sent = self._push(set(SECTIONS), state) + 1
        self.scrub_label.value = self._scrub_text(index, state.last_type)
        self.scrubbed_to = index
        if self.scrub.value != index:
            self.scrub.value = index  # the observer sees scrubbed_to and does nothing
        return state

    def _scrub_loop(self) -> None:
        """Show the latest position asked for; moves in between are skipped, and shows are spaced as the
        updater spaces its pushes (``refresh_hz``, ``MAX_MESSAGES_PER_S``), however fast the slider moves."""
        next_show = 0.0
        while True:
            if not self._scrub_wanted.wait(SCRUB_IDLE_S):
                with self._scrub_lock:
                    if not self._scrub_wanted.is_set():
                        self._scrub_thread = None
                        return
                continue
            time.sleep(max(0.0, next_show - time.monotonic()))
            self._scrub_wanted.clear()
            self._scrub_sent = 0
            try:
                self.scrub_to(self._scrub_target)
            except Exception:  # noqa: BLE001 - a transcript gone or damaged: the view stays as it is
                log.warning("tensorjob: could not scrub to event %s", self._scrub_target, exc_info=True)
            next_show = time.monotonic() + max(self.refresh_s, self._scrub_sent / MAX_MESSAGES_PER_S)


__all__ = ["MAX_MESSAGES_PER_S", "SCRUB_IDLE_S", "JobView"]

"""Showing a recorded run again: the same folding and printing, at once or at its own speed.

A live job is watched through its subscription; a recorded one is played back through ``Playback``, an object
that looks the same and hands out the transcript's events at their recorded times (scaled by ``speed``), so the
widget and the terminal printer show a run again unchanged. A transcript that stops early ends with a synthetic
``job.interrupted``, and the times, which come from a file, are bounded.

Design: docs/internals/history.md#showpy
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Iterator

from tensorjob_jupyter.abi import event_types
from tensorjob_jupyter.record.events import ReadsEvents
from tensorjob_jupyter.record.job_folder import is_live
from tensorjob_jupyter.record.transcript import EventReader, read_header

#: The slowest a recorded run plays (a thousandth of its speed); 0 plays it at once.
MIN_SPEED = 0.001
#: The longest one wait for an event lasts before it is taken again (``threading``'s own bound is larger).
MAX_WAIT_S = 3600.0


def check_speed(speed: float) -> float:
    """``speed`` if a playback can use it; ``ValueError`` (one line, naming ``--speed``) if not."""
    if not isinstance(speed, (int, float)) or isinstance(speed, bool) or not (speed == 0 or speed >= MIN_SPEED):
        raise ValueError(f"--speed must be 0 (at once) or from {MIN_SPEED:g} (a thousandth of the recorded "
                         f"speed) up")
    return float(speed)


class Playback:
    """A recorded run, handed out as a live job's events would be (see the module doc)."""

    def __init__(self, run_dir: str | os.PathLike, *, speed: float = 0.0):
        speed = check_speed(speed)
        self.reader = EventReader(run_dir)
        self.run_dir = self.reader.run_dir
        header = read_header(self.run_dir)  # checks the version before anything is shown
        self.id = self.run_dir.name
        self.name = header.name
        #: The run was debugged (``--debug``, ``--break-on``): a view shows its pauses in the debugger's panel.
        self.debugging = isinstance((header.created or {}).get("debug"), dict)
        self.speed = speed
        self._skip = threading.Event()
        self._recorded_s = 0.0  # the recorded time of the latest event handed out
        self._started: float | None = None
        self._offset_s = 0.0  # the recorded time the pacing started from

    @property
    def transcript_path(self):
        """The recorded run's ``events.jsonl`` (what a finished view scrubs over, ``view/scrub.py``)."""
        return self.reader.path

    # -- the clock a ViewState reads ------------------------------------------------------

    def clock(self) -> float:
        """The recorded time now: the latest event's, or between events while pacing."""
        if self.speed > 0 and self._started is not None and not self._skip.is_set():
            return max(self._recorded_s, self._offset_s + (time.monotonic() - self._started) * self.speed)
        return self._recorded_s

    def cancel(self) -> None:
        """Skip to the end: every remaining event at once."""
        self._skip.set()

    # -- the events -------------------------------------------------------------------------

    def _all(self) -> Iterator[dict]:
        last = None
        for event in self.reader:
            last = event
            yield event
        if self.reader.terminal is None:
            if is_live(self.run_dir):
                status, message = "running", "the job is still running: shown as far as it has got"
            else:
                torn = " (its last line was torn)" if self.reader.torn else ""
                status, message = "interrupted", f"the transcript stops before the job's end: its process stopped{torn}"
            yield {"type": event_types.JOB_INTERRUPTED, "sequence_number": self.reader.count, "job_id": self.id,
                   "t_ms": (last or {}).get("t_ms", 0), "synthetic": True, "stats": None,
                   "envelope": {"status": status, "error": {"code": status, "message": message}, "usage": None}}

    def _due(self, event: dict) -> float:
        """Seconds to wait before ``event`` is due (0 when it is, or when not pacing)."""
        t = _seconds(event)
        if self.speed <= 0 or self._skip.is_set():
            return 0.0
        if self._started is None:
            self._started, self._offset_s = time.monotonic(), t
        due = self._started + (t - self._offset_s) / self.speed
        return min(MAX_WAIT_S, max(0.0, due - time.monotonic()))

    def _hand_out(self, event: dict) -> dict:
        self._recorded_s = max(self._recorded_s, _seconds(event))
        return event

    def events(self) -> Iterator[dict]:
        """Every event, each when it is due (blocking)."""
        for event in self._all():
            wait = self._due(event)
            while wait > 0 and not self._skip.wait(wait):
                wait = self._due(event)
            yield self._hand_out(event)

    def subscribe(self, *args: Any, **kwargs: Any) -> "PlaybackSubscription":
        return PlaybackSubscription(self)


class PlaybackSubscription(ReadsEvents):
    """``events.Subscription``'s reading side, over a playback."""

    def __init__(self, playback: Playback):
        self.playback = playback
        self._events = playback._all()
        self._next: dict | None = None
        self._ended = False
        self.error: Exception | None = None  # a transcript that turned out damaged part way

    @property
    def ended(self) -> bool:
        return self._ended and self._next is None

    def _peek(self) -> dict | None:
        if self._next is None and not self._ended:
            try:
                self._next = next(self._events)
            except StopIteration:
                self._ended = True
            except Exception as e:  # noqa: BLE001 - a damaged line: end the show there
                self.error = e
                self._ended = True
        return self._next

    def get(self, timeout: float | None = None) -> dict | None:
        event = self._peek()
        if event is None:
            return None
        wait = self.playback._due(event)
        if wait > 0:
            if timeout is not None and wait > timeout:
                self.playback._skip.wait(timeout)
                if self.playback._due(event) > 0:
                    return None
            else:
                while wait > 0 and not self.playback._skip.wait(wait):
                    wait = self.playback._due(event)
        self._next = None
        return self.playback._hand_out(event)

    def close(self) -> None:
        pass


def _seconds(event: dict) -> float:
    t = event.get("t_ms", 0)
    return t / 1000.0 if isinstance(t, (int, float)) and not isinstance(t, bool) else 0.0


__all__ = ["MIN_SPEED", "MAX_WAIT_S", "check_speed", "Playback", "PlaybackSubscription"]

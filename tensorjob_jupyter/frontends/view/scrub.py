"""Scrubbing a finished job: its view as it was at any event, re-folded on demand.

``Timeline(transcript)`` folds a run's events once as the live view did, keeping a checkpoint every ``every``
events; ``state_at(k)`` folds on from the nearest one, so any event costs at most ``every`` folds and a copy.
Memory stays bounded whatever the job's length (``MAX_CHECKPOINTS``), and times are the run's own.

Design: docs/internals/frontends.md#viewscrubpy
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, Iterator

from tensorjob_jupyter.regular_file import open_regular
from tensorjob_jupyter.frontends.view.state import ViewState
from tensorjob_jupyter.host import EVENTS_FILE, MAX_LINE_BYTES, TranscriptError, parse_event, read_line

#: Events between checkpoints at first (doubling as needed to stay within MAX_CHECKPOINTS).
CHECKPOINT_EVERY = 256
MAX_CHECKPOINTS = 256


class RecordedClock:
    """A clock that reads the recorded time of the event being folded."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def at(self, event: dict) -> None:
        t = event.get("t_ms", 0)
        if isinstance(t, (int, float)) and not isinstance(t, bool):
            self.now = t / 1000.0


class Timeline:
    """A finished job's view state at any event (see the module doc)."""

    def __init__(self, transcript: str | os.PathLike, name: str = "guest", *, extra: Iterable[dict] = (),
                 every: int = CHECKPOINT_EVERY, max_checkpoints: int = MAX_CHECKPOINTS):
        self.path = Path(transcript)
        if self.path.is_dir():
            self.path = self.path / EVENTS_FILE
        self.name = name
        self.clock = RecordedClock()
        self.every = max(1, every)
        self.max_checkpoints = max(2, max_checkpoints)
        self._extra = list(extra)
        self._checkpoints: list[tuple[int, int, ViewState]] = []  # (events folded, byte offset, state)
        self.file_events = 0
        self.last_event_type: str | None = None
        self._build()

    # -- building ---------------------------------------------------------------------------

    def _lines(self, offset: int) -> Iterator[tuple[int, bytes]]:
        """Complete lines from ``offset``: (the offset after the line, the line)."""
        with open_regular(self.path, follow_symlinks=False) as f:  # a FIFO planted there never blocks
            f.seek(offset)
            while True:
                line = read_line(f, MAX_LINE_BYTES)
                if not line or not line.endswith(b"\n"):
                    return  # the end, a torn last line, or a line too long to be an event
                offset += len(line)
                yield offset, line

    def _build(self) -> None:
        state = ViewState(self.name, clock=self.clock)
        offset = 0
        n = 0
        self._checkpoints.append((0, 0, state.copy()))
        for next_offset, line in self._lines(0):
            try:
                event = parse_event(line, n, self.path.parent)  # checked as every reader checks it
            except TranscriptError:
                break  # a damaged line: the timeline ends there
            if n and n % self.every == 0:
                self._checkpoint(n, offset, state)
            self.clock.at(event)
            state.apply(event)
            offset = next_offset
            n += 1
        self.file_events = n
        self._end_offset = offset
        for event in self._extra:
            self.clock.at(event)
            state.apply(event)
        self.last_event_type = state.last_type
        self.final = state

    def _checkpoint(self, n: int, offset: int, state: ViewState) -> None:
        self._checkpoints.append((n, offset, state.copy()))
        if len(self._checkpoints) > self.max_checkpoints:
            self.every *= 2
            self._checkpoints = [c for c in self._checkpoints if c[0] % self.every == 0]

    # -- reading ------------------------------------------------------------------------------

    def __len__(self) -> int:
        """The number of events (the slider goes from 0 to len - 1)."""
        return self.file_events + len(self._extra)

    @property
    def checkpoints(self) -> int:
        return len(self._checkpoints)

    def _events_from(self, index: int, offset: int) -> Iterator[dict]:
        if index < self.file_events:
            for _, line in self._lines(offset):
                if index >= self.file_events:
                    break
                try:
                    yield parse_event(line, index, self.path.parent)
                except TranscriptError:
                    return  # the file changed under the view since it was folded
                index += 1
        yield from self._extra[max(0, index - self.file_events):]

    def state_at(self, k: int) -> ViewState:
        """The view's state just after event ``k`` (0 is ``job.created``; clamped to the events there are).
        A new state each call: fold more into it, or render it, freely."""
        k = max(0, min(int(k), len(self) - 1))
        lo, hi = 0, len(self._checkpoints) - 1
        while lo < hi:  # the last checkpoint with at most k events folded... that is, at or before event k
            mid = (lo + hi + 1) // 2
            if self._checkpoints[mid][0] <= k:
                lo = mid
            else:
                hi = mid - 1
        index, offset, checkpoint = self._checkpoints[lo]
        state = checkpoint.copy()
        event: dict | None = None
        for event in self._events_from(index, offset):
            if index > k:
                break
            self.clock.at(event)
            state.apply(event)
            index += 1
        state.dirty = set(state.dirty) | {"header", "progress", "log", "tokens", "files", "output", "result",
                                          "usage", "debug"}
        return state


__all__ = ["CHECKPOINT_EVERY", "MAX_CHECKPOINTS", "RecordedClock", "Timeline"]

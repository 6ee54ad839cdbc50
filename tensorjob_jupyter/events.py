"""A job's ordered event stream, its subscribers and its on-disk transcript.

Every event is a JSON object with ``type``, ``sequence_number`` (counting
from 0 with no gaps, across the whole job) and ``job_id``, then its own
fields. Job-level events describe the reactor (``job.created``,
``job.progress``, ``job.file.opened``, ``job.file.sliced``, ``job.chunk``,
``job.embedded``, and one of ``job.completed``/``job.failed``/
``job.cancelled``); each infer adds one Open Responses sequence
(``response.*``, built by ``responses.py``).

Publishing happens on the job's thread and never waits for a reader: each
subscriber has a bounded queue, and a subscriber that falls behind loses
events (counted in ``missed``) rather than slowing the model or the guest.
The transcript is the lossless record: every event is appended to
``events.jsonl`` under the job's run folder, and the final ``envelope.json``
is written when the job ends, so a finished job can be reloaded and replayed
(``load_transcript``).
"""

from __future__ import annotations

import json
import os
import queue
import threading
import time
from pathlib import Path
from typing import Any, Iterator

from .abi import dumps

DEFAULT_SUBSCRIBER_QUEUE = 10_000
TRANSCRIPT_FLUSH_S = 0.2
TERMINAL_TYPES = frozenset({"job.completed", "job.failed", "job.cancelled"})


class EventBudgetExceeded(Exception):
    """Publishing this event would pass the job's ``max_event_bytes``."""


class Subscription:
    """One reader's bounded view of a stream. Iterate it, or ``get()``."""

    def __init__(self, stream: "EventStream", maxsize: int):
        self._stream = stream
        self._queue: queue.Queue = queue.Queue(maxsize=maxsize)
        self.missed = 0

    def _offer(self, event: dict) -> None:
        try:
            self._queue.put_nowait(event)
        except queue.Full:
            self.missed += 1

    def get(self, timeout: float | None = None) -> dict | None:
        """The next event; None once the stream has ended and been drained,
        or when ``timeout`` passes first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                return self._queue.get(timeout=0.05)
            except queue.Empty:
                if self._stream.closed and self._queue.empty():
                    return None
                if deadline is not None and time.monotonic() >= deadline:
                    return None

    @property
    def ended(self) -> bool:
        """True once the stream has closed (events may still wait in the queue)."""
        return self._stream.closed

    def drain(self) -> list[dict]:
        """Every event waiting now, without blocking."""
        out = []
        while True:
            try:
                out.append(self._queue.get_nowait())
            except queue.Empty:
                return out

    def __iter__(self) -> Iterator[dict]:
        while True:
            event = self.get()
            if event is None:
                return
            yield event

    def close(self) -> None:
        self._stream._unsubscribe(self)


class EventStream:
    """The ordered events of one job."""

    def __init__(self, job_id: str, run_dir: str | os.PathLike | None = None, *, keep: bool = True,
                 max_bytes: int | None = None):
        self.job_id = job_id
        self.max_bytes = max_bytes  # the job's max_event_bytes; the terminal event is always let through
        self.bytes = 0
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.closed = False
        self._keep = keep
        self._history: list[dict] = []
        self._next = 0
        self._lock = threading.Lock()
        self._subscribers: list[Subscription] = []
        self._file = None
        self._last_flush = 0.0
        if self.run_dir is not None:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self._file = open(self.run_dir / "events.jsonl", "w", encoding="utf-8")

    @property
    def transcript_path(self) -> Path | None:
        return self.run_dir / "events.jsonl" if self.run_dir is not None else None

    def publish(self, type: str, **fields: Any) -> dict:
        """Stamp, record and fan out one event; returns it."""
        with self._lock:
            if self.closed:
                raise RuntimeError(f"event stream of {self.job_id} is closed")
            event = {"type": type, "sequence_number": self._next, "job_id": self.job_id, **fields}
            line = dumps(event)  # first: an event that cannot be written is not published at all
            if (self.max_bytes is not None and self.bytes + len(line) > self.max_bytes
                    and type not in TERMINAL_TYPES):
                raise EventBudgetExceeded(f"the job's events passed {self.max_bytes} bytes (max_event_bytes)")
            self.bytes += len(line) + 1
            self._next += 1
            if self._keep:
                self._history.append(event)
            if self._file is not None:
                self._file.write(line)
                self._file.write("\n")
                now = time.monotonic()
                if now - self._last_flush > TRANSCRIPT_FLUSH_S or type in TERMINAL_TYPES:
                    self._file.flush()
                    self._last_flush = now
            for sub in self._subscribers:
                sub._offer(event)
        return event

    def subscribe(self, maxsize: int = DEFAULT_SUBSCRIBER_QUEUE, *, replay: bool = True) -> Subscription:
        """A new reader; with ``replay`` it first receives what already happened."""
        sub = Subscription(self, maxsize)
        with self._lock:
            if replay:
                for event in self._history:
                    sub._offer(event)
            self._subscribers.append(sub)
        return sub

    def _unsubscribe(self, sub: Subscription) -> None:
        with self._lock:
            if sub in self._subscribers:
                self._subscribers.remove(sub)

    def flush(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.flush()

    @property
    def history(self) -> list[dict]:
        with self._lock:
            return list(self._history)

    def __len__(self) -> int:
        return self._next

    def close(self, envelope: dict | None = None) -> None:
        with self._lock:
            if self.closed:
                return
            self.closed = True
            if self._file is not None:
                self._file.close()
                self._file = None
            if self.run_dir is not None and envelope is not None:
                tmp = self.run_dir / "envelope.json.tmp"
                tmp.write_text(json.dumps(envelope, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
                os.replace(tmp, self.run_dir / "envelope.json")


def load_transcript(run_dir: str | os.PathLike) -> tuple[list[dict], dict | None]:
    """Read a finished (or running) job's events and envelope back from disk."""
    run_dir = Path(run_dir)
    events = []
    with open(run_dir / "events.jsonl", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                events.append(json.loads(line))
    env_path = run_dir / "envelope.json"
    envelope = json.loads(env_path.read_text(encoding="utf-8")) if env_path.exists() else None
    return events, envelope

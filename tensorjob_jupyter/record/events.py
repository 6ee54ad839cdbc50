"""A job's ordered event stream, its subscribers and its on-disk transcript.

Every event is a JSON object with ``type``, ``sequence_number`` (from 0, no gaps, across the whole
job) and ``job_id``; each infer adds one Open Responses sequence (``responses.py``). An event is
written to the transcript (``events.jsonl``) before anyone sees it, so no reader ever sees a
number the file lacks. The stream keeps no history of its own -- the transcript is the history --
and each subscriber's queue is bounded, so memory is bounded by constants, not by what a guest publishes,
and a slow reader catches up from the file without slowing the model or the guest. Every event
carries ``t_ms``, the format is versioned (``TRANSCRIPT_VERSION``), a running job's transcript
holds a ``flock``, and ``close`` writes ``envelope.json``.

Design: docs/internals/record.md#eventspy
"""

from __future__ import annotations

import collections
import os
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import orjson

from tensorjob_jupyter.abi import TERMINAL_EVENT_TYPES, JobFailure, codes
from tensorjob_jupyter.record.glimpse import Glimpse, GlimpseTracker
from tensorjob_jupyter.record.job_folder import ENVELOPE_FILE, ENVELOPE_TMP_FILE, EVENTS_FILE, lock_transcript
from tensorjob_jupyter.regular_file import open_regular


#: The transcript format this host writes (``job.created``'s ``transcript_version``).
#: 0: before versioning (no prompts, no times); 1: adds ``t_ms`` on every event,
#: ``created_at``, the infer command on ``response.created``, ``guest_stopped_after``,
#: the embed's texts' hashes and vectors, and ``ended_during`` on the terminal event.
TRANSCRIPT_VERSION = 1
DEFAULT_SUBSCRIBER_QUEUE = 10_000
#: Bytes of encoded events a subscriber may have waiting before it reads them
#: back from the transcript instead.
SUBSCRIBER_QUEUE_BYTES = 8 * 1024 * 1024
#: Most bytes of transcript a lagging subscriber reads back at once.
CATCH_UP_BYTES = 1024 * 1024
TRANSCRIPT_FLUSH_S = 0.2


class EventBudgetExceeded(JobFailure):
    """Publishing this event would pass the job's ``max_event_bytes`` (``limit_exceeded``)."""

    def __init__(self, message: str):
        super().__init__(codes.LIMIT_EXCEEDED, message)


class TranscriptWriteError(JobFailure):
    """An event could not be encoded or written; it was not published (``internal_error``)."""

    def __init__(self, message: str):
        super().__init__(codes.INTERNAL_ERROR, message)


# --- where the events are kept -----------------------------------------------------------


#: How a job folder's own files are made: new files (what was in their place is removed first), never written
#: through a link, a hard link or anything else planted there.
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL


class _FileLog:
    """The transcript file: appended by the job, read back at any position."""

    def __init__(self, path: Path):
        self.path = path
        # Created under another name, locked, then renamed into place: no reader ever sees the
        # transcript unlocked while it is written. The lock goes when the file closes or the process dies.
        staging = path.with_name(path.name + ".new")
        staging.unlink(missing_ok=True)
        self._file = open_regular(staging, flags=_NEW_FILE, mode="wb", follow_symlinks=False)
        lock_transcript(self._file.fileno())
        os.replace(staging, path)
        self.position = 0

    def append(self, line: bytes) -> None:
        self._file.write(line)
        self.position += len(line)

    def flush(self) -> None:
        if not self._file.closed:
            self._file.flush()

    def read(self, cursor: int, count: int, max_bytes: int) -> tuple[list[bytes], int]:
        """Up to ``count`` lines from byte ``cursor`` (at least one); the new cursor."""
        lines: list[bytes] = []
        with open_regular(self.path, follow_symlinks=False) as f:  # the transcript this stream writes
            f.seek(cursor)
            size = 0
            while len(lines) < count and (not lines or size < max_bytes):
                line = f.readline()
                if not line.endswith(b"\n"):
                    break  # not written yet
                lines.append(line)
                size += len(line)
            return lines, cursor + size

    def close(self) -> None:
        self._file.close()


class _MemoryLog:
    """Encoded lines in memory, for a stream without a run folder."""

    def __init__(self) -> None:
        self.lines: list[bytes] = []

    @property
    def position(self) -> int:
        return len(self.lines)

    def append(self, line: bytes) -> None:
        self.lines.append(line)

    def flush(self) -> None:
        pass

    def read(self, cursor: int, count: int, max_bytes: int) -> tuple[list[bytes], int]:
        lines = self.lines[cursor:cursor + count]
        return lines, cursor + len(lines)

    def close(self) -> None:
        pass


# --- readers -------------------------------------------------------------------------------


class ReadsEvents:
    """What every reader of events offers on top of its ``get(timeout)``:
    ``drain()`` and iteration. (``Subscription`` here; ``show.PlaybackSubscription``.)"""

    def get(self, timeout: float | None = None) -> dict | None:  # pragma: no cover - each reader has its own
        raise NotImplementedError

    def drain(self) -> list[dict]:
        """Every event available now, without waiting."""
        out: list[dict] = []
        while True:
            event = self.get(timeout=0)
            if event is None:
                return out
            out.append(event)

    def __iter__(self) -> Iterator[dict]:
        while True:
            event = self.get()
            if event is None:
                return
            yield event


class Subscription(ReadsEvents):
    """One reader's view of a stream: every event, in order. Iterate it, or ``get()``."""

    def __init__(self, stream: "EventStream", maxsize: int, max_bytes: int):
        self._stream = stream
        self._maxsize = maxsize if maxsize > 0 else DEFAULT_SUBSCRIBER_QUEUE
        self._max_bytes = max_bytes
        self._queue: collections.deque[tuple[dict | None, bytes]] = collections.deque()
        self._queued_bytes = 0
        self._ready = threading.Condition(stream._lock)
        # While behind: the next event to read back from the transcript, and where it is.
        self._behind_at: tuple[int, int] | None = None
        self.read_back = 0  # events this reader got from the transcript rather than live

    # -- the stream's side (under its lock) --

    def _offer(self, seq: int, position: int, event: dict, line: bytes) -> None:
        if self._behind_at is not None:
            return
        if len(self._queue) >= self._maxsize or self._queued_bytes + len(line) > self._max_bytes:
            self._behind_at = (seq, position)
            return
        self._queue.append((event, line))
        self._queued_bytes += len(line)
        self._ready.notify()

    # -- the reader's side --

    def _catch_up(self) -> bool:
        """Read the next batch back from the transcript; True if any was queued."""
        stream = self._stream
        with stream._lock:
            if self._behind_at is None:
                return False
            seq, cursor = self._behind_at
            if seq >= stream._next:  # caught up: live again
                self._behind_at = None
                return False
            count = stream._next - seq
            stream._log.flush()
        lines, cursor = stream._log.read(cursor, min(count, self._maxsize), CATCH_UP_BYTES)
        with stream._lock:
            for line in lines:
                self._queue.append((None, line))
                self._queued_bytes += len(line)
            self._behind_at = (seq + len(lines), cursor)
            self.read_back += len(lines)
        return bool(lines)

    def get(self, timeout: float | None = None) -> dict | None:
        """The next event; None once the stream has ended and every event was read,
        or when ``timeout`` passes first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._stream._lock:
                if self._queue:
                    event, line = self._queue.popleft()
                    self._queued_bytes -= len(line)
                    return event if event is not None else orjson.loads(line)
                behind = self._behind_at is not None
                if not behind:
                    if self._stream.closed:
                        return None
                    wait = 0.05 if deadline is None else min(0.05, deadline - time.monotonic())
                    if wait <= 0:
                        return None
                    self._ready.wait(wait)
                    continue
            if self._catch_up():
                continue
            with self._stream._lock:
                stuck = self._behind_at is not None  # the transcript lacks what it should hold
                if stuck and self._stream.closed:
                    return None
            if deadline is not None and time.monotonic() >= deadline:
                return None
            if stuck:
                time.sleep(0.01)

    @property
    def ended(self) -> bool:
        """True once the stream has closed (events may still wait to be read)."""
        return self._stream.closed

    def close(self) -> None:
        self._stream._unsubscribe(self)


# --- the stream ----------------------------------------------------------------------------


class EventStream:
    """The ordered events of one job."""

    def __init__(self, job_id: str, run_dir: str | os.PathLike | None = None, *, max_bytes: int | None = None):
        self.job_id = job_id
        self.max_bytes = max_bytes  # the job's max_event_bytes; the terminal event is always let through
        self.bytes = 0
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.closed = False
        self._next = 0
        self._lock = threading.Lock()
        self._subscribers: list[Subscription] = []
        self._last_flush = 0.0
        self._t0 = time.monotonic()
        self._glimpse = GlimpseTracker()
        if self.run_dir is not None:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self._log: _FileLog | _MemoryLog = _FileLog(self.run_dir / EVENTS_FILE)
        else:
            self._log = _MemoryLog()

    def glimpse(self) -> Glimpse:
        """What the job is doing now (``record/glimpse.py``), from any thread."""
        return self._glimpse.glimpse()

    @property
    def transcript_path(self) -> Path | None:
        return self.run_dir / EVENTS_FILE if self.run_dir is not None else None

    def publish(self, type: str, **fields: Any) -> dict:
        """Stamp, encode, write, then fan out one event; returns it.

        Raises ``EventBudgetExceeded`` past ``max_bytes`` (never for the
        terminal event) and ``TranscriptWriteError`` if the event cannot be
        encoded or written; either way it was not published.
        """
        with self._lock:
            if self.closed:
                raise RuntimeError(f"event stream of {self.job_id} is closed")
            event = {"type": type, "sequence_number": self._next, "job_id": self.job_id,
                     "t_ms": int((time.monotonic() - self._t0) * 1000), **fields}
            try:
                line = orjson.dumps(event, option=orjson.OPT_APPEND_NEWLINE)
            except (TypeError, ValueError) as e:  # orjson.JSONEncodeError is a TypeError
                raise TranscriptWriteError(f"event {type} cannot be encoded as JSON: {e}") from None
            if (self.max_bytes is not None and self.bytes + len(line) > self.max_bytes
                    and type not in TERMINAL_EVENT_TYPES):
                raise EventBudgetExceeded(f"the job's events passed {self.max_bytes} bytes (max_event_bytes)")
            position = self._log.position
            try:
                self._log.append(line)
                now = time.monotonic()
                if now - self._last_flush > TRANSCRIPT_FLUSH_S or type in TERMINAL_EVENT_TYPES:
                    self._log.flush()
                    self._last_flush = now
            except OSError as e:
                raise TranscriptWriteError(f"cannot write the transcript: {e.strerror or e}") from None
            seq = self._next
            self._next += 1
            self.bytes += len(line)
            self._glimpse.see(type, fields)
            for sub in self._subscribers:
                sub._offer(seq, position, event, line)
        return event

    def subscribe(self, maxsize: int = DEFAULT_SUBSCRIBER_QUEUE, *, replay: bool = True,
                  max_bytes: int = SUBSCRIBER_QUEUE_BYTES) -> Subscription:
        """A new reader; with ``replay`` it first receives what already happened
        (read back from the transcript), then the live events."""
        sub = Subscription(self, maxsize, max_bytes)
        with self._lock:
            if replay and self._next > 0:
                sub._behind_at = (0, 0)
            if not self.closed:
                self._subscribers.append(sub)
        return sub

    def _unsubscribe(self, sub: Subscription) -> None:
        with self._lock:
            if sub in self._subscribers:
                self._subscribers.remove(sub)

    def flush(self) -> None:
        with self._lock:
            try:
                self._log.flush()
            except (OSError, ValueError):
                pass

    @property
    def history(self) -> list[dict]:
        """Every event so far, parsed from the transcript (the stream keeps none)."""
        return list(self.iter_history())

    def iter_history(self) -> Iterator[dict]:
        """Every event so far, one at a time, parsed from the transcript."""
        return (orjson.loads(line) for line in self.history_lines())

    def history_lines(self) -> Iterator[bytes]:
        """Every event so far as its encoded JSON line."""
        with self._lock:
            end = self._next
            self._log.flush()
        seq, cursor = 0, 0
        while seq < end:
            lines, cursor = self._log.read(cursor, end - seq, CATCH_UP_BYTES)
            if not lines:
                return
            seq += len(lines)
            yield from lines

    def __len__(self) -> int:
        return self._next

    def close(self, envelope: bytes | None = None) -> None:
        """End the stream; ``envelope`` (compact JSON bytes) goes to ``envelope.json``."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            subscribers, self._subscribers = self._subscribers, []
            for sub in subscribers:
                sub._ready.notify_all()
            # The envelope first, then the transcript's close releases its lock: a run is
            # never seen unlocked without its envelope unless its process died (runs.is_live).
            try:
                if self.run_dir is not None and envelope is not None:
                    tmp = self.run_dir / ENVELOPE_TMP_FILE
                    tmp.unlink(missing_ok=True)
                    with open_regular(tmp, flags=_NEW_FILE, mode="wb", follow_symlinks=False) as f:
                        f.write(envelope)
                        f.write(b"\n")
                    os.replace(tmp, self.run_dir / ENVELOPE_FILE)
            finally:
                self._log.close()


__all__ = [
    "TRANSCRIPT_VERSION", "DEFAULT_SUBSCRIBER_QUEUE", "SUBSCRIBER_QUEUE_BYTES", "CATCH_UP_BYTES",
    "TRANSCRIPT_FLUSH_S", "EventBudgetExceeded", "TranscriptWriteError", "ReadsEvents", "Subscription", "EventStream"
]

"""Reading a transcript back: its version, its events, its end, and the commands it records.

A run folder holds ``events.jsonl`` and ``envelope.json``. This is the one reader that every
consumer shares (listing, showing, replaying and diffing runs): ``read_header`` for what a listing
needs, ``EventReader`` for every event, parsed one at a time and checked as it is read
(``event_checks.py``: a transcript is a file from anywhere), and ``Recording``/``StepReader``
(``recording.py``) for the commands. Problems are ``TranscriptError``: one line naming the folder
and what is wrong with it, for the command line and the magics to print as they are.

Design: docs/internals/record.md#transcriptpy
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import orjson

from tensorjob_jupyter.abi import TERMINAL_EVENT_TYPES
from tensorjob_jupyter.record.event_checks import (
    MAX_LINE_BYTES, TranscriptError, check_envelope, check_shape, check_version, parse_event, shown_run,
)
from tensorjob_jupyter.record.events import TRANSCRIPT_VERSION
from tensorjob_jupyter.record.job_folder import ENVELOPE_FILE, EVENTS_FILE
from tensorjob_jupyter.regular_file import open_regular

#: Bytes of the first line (``job.created``) a listing reads at most; a job
#: whose input is larger is listed without its name.
HEADER_MAX_BYTES = 1024 * 1024
#: Bytes of ``envelope.json`` read at most (the result is at most 1 MiB by default).
ENVELOPE_MAX_BYTES = 64 * 1024 * 1024
#: A listing parses envelopes up to this size whole; of a larger one (a large
#: result) it reads only the head (the status) and the tail (the usage, last).
ENVELOPE_SUMMARY_BYTES = 64 * 1024

# --- the header: what a listing needs -----------------------------------------------------


@dataclass
class Header:
    """A run as a listing sees it: ``job.created`` (None when it is too large to read cheaply) and the
    envelope's status, error and usage."""

    path: Path
    created: dict | None
    envelope: dict | None
    version: int

    @property
    def id(self) -> str:
        return self.path.name

    @property
    def name(self) -> str:
        return str((self.created or {}).get("name", "?"))

    @property
    def created_at(self) -> float | None:
        value = (self.created or {}).get("created_at")
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    @property
    def replay_of(self) -> dict | None:
        value = (self.created or {}).get("replay_of")
        return value if isinstance(value, dict) else None


def _open_regular(path: Path):
    """``path`` opened for reading; ``OSError`` unless it is a regular file of the run folder's own (a FIFO
    would block, a device never end, a symbolic link lead out of the folder: ``regular_file``)."""
    return open_regular(path, follow_symlinks=False)


#: Bytes read at a time while a line is gathered (``read_line``).
READ_CHUNK_BYTES = 1024 * 1024


def read_line(f, limit: int) -> bytes | None:
    """The next line of the regular file ``f`` (with its newline; ``b""`` at the end), or None when it is
    longer than ``limit``. Never holds more than the line: a short line is one ``readline``; a long one
    is measured a chunk at a time, discarding, and then read once at its length (a ``readline(limit)``
    holds its pieces and their join at once, twice the line, and a too-long line is never held)."""
    start = f.tell()
    first = f.readline(min(READ_CHUNK_BYTES, limit + 1))
    if not first or first.endswith(b"\n"):
        return first if len(first) <= limit else None
    length = len(first)
    del first
    while length <= limit:
        piece = f.readline(min(READ_CHUNK_BYTES, limit + 1 - length))
        length += len(piece)
        if not piece or piece.endswith(b"\n"):
            break
    if length > limit:
        return None
    f.seek(start)
    return f.read(length)


def read_first_line(path: Path, limit: int) -> bytes | None:
    """The first line of ``path`` (with its newline), or None when it is longer than ``limit``
    or not yet complete."""
    with _open_regular(path) as f:
        line = f.readline(limit + 1)
    return line if line.endswith(b"\n") else None


def read_envelope(run_dir: Path) -> dict | None:
    """``envelope.json``, or None when the run has not written one (still running, or interrupted)."""
    path = run_dir / ENVELOPE_FILE
    try:
        with _open_regular(path) as f:
            size = os.fstat(f.fileno()).st_size
            too_long = size > ENVELOPE_MAX_BYTES
            data = b"" if too_long else f.read(size + 1)  # read(n) sets n bytes aside at once
    except FileNotFoundError:
        return None
    except OSError as e:
        raise TranscriptError(f"{shown_run(run_dir)}: cannot read {ENVELOPE_FILE}: {e.strerror}") from None
    if too_long or len(data) > ENVELOPE_MAX_BYTES:
        raise TranscriptError(f"{shown_run(run_dir)}: {ENVELOPE_FILE} is longer than {ENVELOPE_MAX_BYTES} bytes; "
                              f"it is damaged")
    problem = check_shape(data)
    if problem is not None:
        raise TranscriptError(f"{shown_run(run_dir)}: {ENVELOPE_FILE} {problem}; it is damaged")
    try:
        envelope = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise TranscriptError(f"{shown_run(run_dir)}: {ENVELOPE_FILE} is damaged (not JSON)") from None
    problem = check_envelope(envelope)
    if problem is not None:
        raise TranscriptError(f"{shown_run(run_dir)}: {ENVELOPE_FILE} is damaged: {problem}")
    return envelope


def read_envelope_summary(run_dir: Path) -> dict | None:
    """The envelope's status, error and usage, without reading a large result: compact envelopes
    are written ``{"status":..,"result":..,"error":..,"usage":{..}}``, usage last."""
    path = run_dir / ENVELOPE_FILE
    try:
        with _open_regular(path) as f:
            size = os.fstat(f.fileno()).st_size
            if size > ENVELOPE_SUMMARY_BYTES:
                head = f.read(256)
                f.seek(size - 4096)
                tail = f.read()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise TranscriptError(f"{shown_run(run_dir)}: cannot read {ENVELOPE_FILE}: {e.strerror}") from None
    if size <= ENVELOPE_SUMMARY_BYTES:
        envelope = read_envelope(run_dir)
        return None if envelope is None else {k: v for k, v in envelope.items() if k != "result"}
    try:
        status = orjson.loads(head[head.index(b":") + 1:head.index(b",")])
        usage = orjson.loads(tail[tail.rindex(b'"usage":') + 8:].rstrip()[:-1])
    except (ValueError, orjson.JSONDecodeError):
        raise TranscriptError(f"{shown_run(run_dir)}: {ENVELOPE_FILE} is damaged") from None
    if not head.startswith(b'{"status":') or not isinstance(usage, dict):
        raise TranscriptError(f"{shown_run(run_dir)}: {ENVELOPE_FILE} is damaged")
    summary = {"status": status, "usage": usage}
    problem = check_envelope(summary)
    if problem is not None:
        raise TranscriptError(f"{shown_run(run_dir)}: {ENVELOPE_FILE} is damaged: {problem}")
    return summary


def read_header(run_dir: str | os.PathLike) -> Header:
    """``job.created`` and the envelope of a run (its status, error and usage: not its result);
    ``TranscriptError`` if it is not a readable transcript."""
    run_dir = Path(run_dir)
    try:
        line = read_first_line(run_dir / EVENTS_FILE, HEADER_MAX_BYTES)
    except FileNotFoundError:
        raise TranscriptError(f"{shown_run(run_dir)}: no {EVENTS_FILE}; not a tensorjob run folder") from None
    except OSError as e:
        raise TranscriptError(f"{shown_run(run_dir)}: cannot read {EVENTS_FILE}: {e.strerror}") from None
    created = parse_event(line, 0, run_dir) if line is not None else None
    version = check_version(created, run_dir) if created is not None else TRANSCRIPT_VERSION
    return Header(run_dir, created, read_envelope_summary(run_dir), version)


# --- every event -------------------------------------------------------------------------------


class EventReader:
    """Iterate a run's events, checked; afterwards ``torn``, ``count`` and ``terminal`` say what was found.

    Iterating again reads the file again.
    """

    def __init__(self, run_dir: str | os.PathLike):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / EVENTS_FILE
        if not self.path.exists():
            raise TranscriptError(f"{shown_run(self.run_dir)}: no {EVENTS_FILE}; not a tensorjob run folder")
        self.created: dict | None = None
        self.version = 0
        self.torn = False  # the last line was incomplete and was dropped
        self.count = 0
        self.terminal: dict | None = None

    def __iter__(self) -> Iterator[dict]:
        self.torn, self.count, self.terminal = False, 0, None
        try:
            f = _open_regular(self.path)
        except OSError as e:
            raise TranscriptError(f"{shown_run(self.run_dir)}: cannot read {EVENTS_FILE}: {e.strerror}") from None
        with f:
            while True:
                line = read_line(f, MAX_LINE_BYTES)
                if line is None:
                    raise TranscriptError(f"{shown_run(self.run_dir)}: line {self.count + 1} of {EVENTS_FILE} is longer "
                                          f"than {MAX_LINE_BYTES} bytes (MAX_LINE_BYTES); the transcript is damaged")
                if not line:
                    break
                if not line.endswith(b"\n"):  # only the last line can lack its newline
                    self.torn = True  # a write that never finished: the run was interrupted
                    break
                event = self._event(line)
                del line  # hold the event only, not its bytes too
                yield event
        if self.count == 0:
            raise TranscriptError(f"{shown_run(self.run_dir)}: {EVENTS_FILE} is empty" + (
                " but for a torn first line (its process stopped while writing job.created)" if self.torn else ""))

    def _event(self, line: bytes) -> dict:
        n = self.count
        event = parse_event(line, n, self.run_dir)
        if n == 0:
            self.created = event
            self.version = check_version(event, self.run_dir)
        if self.terminal is not None:
            raise TranscriptError(f"{shown_run(self.run_dir)}: events follow the job's end at line {n + 1}")
        if event["type"] in TERMINAL_EVENT_TYPES:
            self.terminal = event
        self.count += 1
        return event


def read_run(run_dir: str | os.PathLike) -> tuple[list[dict], dict | None]:
    """Every event of a run and its envelope (None while it runs, or if it was interrupted), checked."""
    return list(EventReader(run_dir)), read_envelope(Path(run_dir))


__all__ = [
    "HEADER_MAX_BYTES", "ENVELOPE_MAX_BYTES", "ENVELOPE_SUMMARY_BYTES", "Header", "READ_CHUNK_BYTES", "read_line",
    "read_first_line", "read_envelope", "read_envelope_summary", "read_header", "EventReader", "read_run"
]

"""Reading a transcript back: its version, its events, its end, and the commands it records.

A run folder holds ``events.jsonl`` (one event a line, each written before
it was published) and ``envelope.json``. This is the one reader that every
consumer shares -- ``history/runs.py`` (listing), ``history/show.py`` (playing a run
again), ``history/replay.py`` and ``history/diff.py`` (its commands):

* ``read_header(dir)``: only ``job.created`` (the first line, read up to a
  bound) and ``envelope.json`` -- what a listing needs, without the events.
* ``EventReader(dir)``: every event, checked as it is read: the first is
  ``job.created`` with a ``transcript_version`` this host knows (an unknown
  one is refused), sequence numbers count from 0 with no gap; a torn last
  line (a process that died mid-write) is dropped and noted, a damaged line
  anywhere else is an error. Events are parsed one at a time, never all
  held.
* ``Recording.read(dir)``: the command sequence the events record, each
  command with the host's recorded answer (an infer's tokens, text and
  usage; a window's next offset and preview; ...), and how the run ended.
  Events map back to commands one to one (README, "Transcripts"); a command
  whose carrying-out failed left no event of its own, which is what the
  terminal event's ``ended_during`` says. ``StepReader(dir)`` hands the same
  steps out one at a time, never all held (what ``diff`` walks).

A transcript is a file from anywhere (copied between machines, edited by
hand, planted), so every value is checked as it is read, the way guest
output is checked at the ABI: a line is at most ``MAX_LINE_BYTES`` (a
longer one is measured, never held), holds at most ``MAX_EVENT_VALUES`` JSON values
nested at most ``MAX_EVENT_DEPTH`` levels (counted on its bytes before it is
parsed: parsed JSON costs about 25 bytes of memory a byte), and each field a
consumer uses has the type and range it was written with (``EVENT_FIELDS``:
counts are whole numbers from 0 to 2^53, times are finite and within
``MAX_T_MS``, a start time within the calendar, the envelope's status, error
and usage as the host writes them). What passes can be printed, folded into
a view, compared and replayed without a type or range error; strings still
carry whatever text they carry and are made inert where they are shown.

Problems are ``TranscriptError``: one line naming the folder and what is
wrong with it, for the command line and the magics to print as they are.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import orjson

from tensorjob_jupyter.abi import MAX_DEPTH, TERMINAL_EVENT_TYPES, JobStatus, dumps, event_types
from tensorjob_jupyter.record.events import TRANSCRIPT_VERSION
from tensorjob_jupyter.record.runs import ENVELOPE_FILE, EVENTS_FILE
from tensorjob_jupyter.text import for_terminal

#: Bytes of the first line (``job.created``) a listing reads at most; a job
#: whose input is larger is listed without its name.
HEADER_MAX_BYTES = 1024 * 1024
#: Bytes of ``envelope.json`` read at most (the result is at most 1 MiB by default).
ENVELOPE_MAX_BYTES = 64 * 1024 * 1024
#: A listing parses envelopes up to this size whole; of a larger one (a large
#: result) it reads only the head (the status) and the tail (the usage, last).
ENVELOPE_SUMMARY_BYTES = 64 * 1024

#: Bytes of one line of ``events.jsonl`` a reader accepts, its newline included; a longer line is
#: damage (read up to this bound, never whole). Under the default limits the longest event the host
#: writes is an infer's ``response.created``, which carries the command (at most 16 MiB,
#: ``max_command_bytes``) once.
MAX_LINE_BYTES = 64 * 1024 * 1024
#: JSON values (array elements, object members) one line or envelope may hold: a guest's command or
#: input holds at most 1,000,000 (``max_command_values``) and an embed's vectors about 200,000.
MAX_EVENT_VALUES = 2_000_000
#: Levels of nesting one event may have: a guest's value (at most ``abi.MAX_DEPTH``) inside the
#: event's own few.
MAX_EVENT_DEPTH = MAX_DEPTH + 8
#: The largest count a transcript may record (tokens, bytes, milliseconds, steps): 2^53, the largest
#: whole number every JSON reader holds exactly.
MAX_COUNT = 2 ** 53
#: The latest recorded time (``t_ms``, milliseconds since the job started) a transcript may hold: a
#: year. Later is damage, not a job (a paced ``show`` would wait for it).
MAX_T_MS = 366 * 24 * 3600 * 1000
#: The latest ``created_at`` (seconds since the epoch) a transcript may hold: the end of year 9999,
#: the last one a calendar date prints.
MAX_CREATED_AT = 253_402_300_799

#: Commands the host carries out itself (read live in a replay), and those the model answers.
LIVE_COMMANDS = frozenset({"emit", "open", "slice", "slice_bytes", "page_text", "page_text_opt", "document_text",
                           "page_image", "image_op", "fetch"})
MODEL_COMMANDS = frozenset({"infer", "embed"})
#: Every command a guest can return: those a step records, and the two that end a job.
COMMANDS = LIVE_COMMANDS | MODEL_COMMANDS | {"done", "fail"}


class TranscriptError(ValueError):
    """A run folder that cannot be read as a transcript (one line, names the folder)."""


def _where(run_dir: Path) -> str:
    return for_terminal(str(run_dir), one_line=True)


# --- checking what was read ----------------------------------------------------------------------

#: A JSON string, escapes included (unrolled, so a long string is scanned at the regex engine's speed).
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
#: Every byte but JSON's structure characters (what ``translate`` deletes to count the structure).
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b"[]{},:")


def check_shape(data: bytes) -> str | None:
    """What makes ``data`` too costly to parse -- more than ``MAX_EVENT_VALUES`` values, deeper than
    ``MAX_EVENT_DEPTH`` -- or None. Counted on the bytes, before parsing: the fast path counts bracket
    and separator bytes; only when those pass a bound are strings (which may hold any of them) cut out
    and the structure counted exactly."""
    opens = data.count(b"[") + data.count(b"{")
    if opens <= MAX_EVENT_DEPTH and opens + data.count(b",") + data.count(b":") < MAX_EVENT_VALUES:
        return None
    structure = _JSON_STRING.sub(b"", data).translate(None, _NOT_STRUCTURE)
    opens = structure.count(b"[") + structure.count(b"{")
    values = 1 + opens + structure.count(b",") + structure.count(b":")
    if values > MAX_EVENT_VALUES:
        return f"holds about {values} JSON values, more than {MAX_EVENT_VALUES} (MAX_EVENT_VALUES)"
    if opens > MAX_EVENT_DEPTH:
        codes = np.frombuffer(structure, dtype=np.uint8)
        step = np.isin(codes, (ord("["), ord("{"))).astype(np.int32) - np.isin(codes, (ord("]"), ord("}")))
        if int(np.cumsum(step).max()) > MAX_EVENT_DEPTH:
            return f"is nested more than {MAX_EVENT_DEPTH} levels deep (MAX_EVENT_DEPTH)"
    return None


def _is_count(value: Any) -> bool:
    return type(value) is int and 0 <= value <= MAX_COUNT


def _is_integer(value: Any) -> bool:
    return type(value) is int and -MAX_COUNT <= value <= MAX_COUNT


def _is_number_within(top: float) -> Callable[[Any], bool]:
    return lambda value: type(value) in (int, float) and 0 <= value <= top


#: A field's kind: a test, and what a value that fails it should have been (for the error line).
Kind = tuple[Callable[[Any], bool], str]
COUNT: Kind = (_is_count, "a whole number from 0 to 2^53")
INTEGER: Kind = (_is_integer, "a whole number within ±2^53")
TEXT: Kind = (lambda v: isinstance(v, str), "a string")
OBJECT: Kind = (lambda v: isinstance(v, dict), "an object")
LIST: Kind = (lambda v: isinstance(v, list), "a list")
FLAG: Kind = (lambda v: isinstance(v, bool), "true or false")
T_MS: Kind = (_is_number_within(MAX_T_MS), f"a time from 0 to {MAX_T_MS} ms (MAX_T_MS)")
CREATED_AT: Kind = (_is_number_within(MAX_CREATED_AT), f"a time from 0 to {MAX_CREATED_AT} s (MAX_CREATED_AT)")


def _is_vectors(value: Any) -> bool:
    """A list of vectors of one length, each a list of numbers (an embed's answer)."""
    if not isinstance(value, list) or not all(isinstance(v, list) for v in value):
        return False
    return len({len(v) for v in value}) <= 1 and all(type(x) in (int, float) for v in value for x in v)


VECTORS: Kind = (_is_vectors, "a list of equally long lists of numbers")


def _or_null(kind: Kind) -> Kind:
    test, what = kind
    return (lambda v: v is None or test(v), f"{what} or null")


COUNT_OR_NULL, INTEGER_OR_NULL, TEXT_OR_NULL, OBJECT_OR_NULL, LIST_OR_NULL = map(
    _or_null, (COUNT, INTEGER, TEXT, OBJECT, LIST))

#: The fields every event may carry, and those each type carries that a consumer reads (the printer,
#: the view, the folding into steps, diff, replay): a field that is present must be of its kind; a
#: dotted name is a field inside an object field. Fields not named are passed through unread.
COMMON_FIELDS: dict[str, Kind] = {"job_id": TEXT, "t_ms": T_MS}
_RESPONSE = {"response": OBJECT, "response.model": TEXT_OR_NULL, "response.status": TEXT_OR_NULL,
             "response.max_output_tokens": COUNT_OR_NULL, "response.output_text": TEXT_OR_NULL,
             "response.usage": OBJECT_OR_NULL, "response.incomplete_details": OBJECT_OR_NULL,
             "response.text": OBJECT_OR_NULL, "response.error": OBJECT_OR_NULL,
             "response.error.code": TEXT_OR_NULL, "response.error.message": TEXT_OR_NULL, "infer_index": COUNT,
             "command": OBJECT_OR_NULL, "finish_reason": TEXT_OR_NULL, "timing": OBJECT_OR_NULL,
             "guest_stopped_after": COUNT_OR_NULL}
_PART = {"item_id": TEXT, "output_index": COUNT, "content_index": COUNT}
_OPENED = {"handle": INTEGER, "len": COUNT, "kind": OBJECT, "kind.kind": TEXT, "kind.pages": COUNT_OR_NULL}
EVENT_FIELDS: dict[str, dict[str, Kind]] = {
    event_types.JOB_CREATED: {
        "created_at": CREATED_AT, "name": TEXT, "guest": OBJECT, "guest.sha256": TEXT_OR_NULL,
        "grants": LIST, "read": LIST, "fetch": LIST, "cwd": TEXT_OR_NULL, "input_bytes": OBJECT,
        "limits": OBJECT, "model": TEXT_OR_NULL, "infer": OBJECT, "debug": OBJECT_OR_NULL,
        "replay_of": OBJECT_OR_NULL},
    event_types.JOB_FILE_OPENED: {**_OPENED, "path": TEXT, "resolved": TEXT},
    event_types.JOB_FILE_SLICED: {
        "handle": INTEGER, "offset": COUNT, "requested": COUNT, "length": COUNT, "next_offset": COUNT,
        "binary": FLAG, "preview": TEXT, "preview_base64": TEXT},
    event_types.JOB_CHUNK: {"index": COUNT, "bytes_base64": TEXT},
    event_types.JOB_EMBEDDED: {"count": COUNT, "dimensions": COUNT, "text_sha256": LIST, "vectors": VECTORS},
    event_types.JOB_FETCH: {**_OPENED, "url": TEXT, "final_url": TEXT_OR_NULL, "status": INTEGER,
                            "redirects": COUNT},
    event_types.JOB_DOCUMENT_PAGE: {
        "handle": INTEGER, "command": TEXT, "page": COUNT_OR_NULL, "pages": COUNT_OR_NULL,
        "chars": COUNT_OR_NULL, "error": TEXT_OR_NULL, "preview": TEXT_OR_NULL},
    event_types.JOB_IMAGE_CREATED: {
        "handle": INTEGER, "source": INTEGER_OR_NULL, "len": COUNT, "width": COUNT, "height": COUNT,
        "label": TEXT, "thumbnail_base64": TEXT_OR_NULL},
    event_types.JOB_PAUSED: {
        "pause": COUNT, "step": COUNT_OR_NULL, "reason": TEXT_OR_NULL, "until": TEXT_OR_NULL,
        "command": OBJECT_OR_NULL, "last_command": OBJECT_OR_NULL, "last_event": OBJECT_OR_NULL,
        "error": OBJECT_OR_NULL, "handles": LIST_OR_NULL, "open_handles": COUNT_OR_NULL,
        "memory_bytes": COUNT_OR_NULL, "peak_memory_bytes": COUNT_OR_NULL},
    event_types.JOB_RESUMED: {"pause": COUNT, "step": COUNT, "how": TEXT_OR_NULL, "until": TEXT_OR_NULL,
                              "paused_ms": COUNT},
    event_types.JOB_REPLAY_DIVERGED: {"step": COUNT, "why": TEXT, "recorded": TEXT, "asked": TEXT,
                                      "kind": TEXT, "then": TEXT_OR_NULL},
    **{kind: {"envelope": OBJECT, "stats": OBJECT_OR_NULL, "ended_during": TEXT_OR_NULL}
       for kind in TERMINAL_EVENT_TYPES},
    **{kind: _RESPONSE for kind in (event_types.RESPONSE_CREATED, event_types.RESPONSE_IN_PROGRESS,
                                    event_types.RESPONSE_COMPLETED, event_types.RESPONSE_INCOMPLETE,
                                    event_types.RESPONSE_FAILED)},
    event_types.RESPONSE_OUTPUT_ITEM_ADDED: {"output_index": COUNT, "item": OBJECT, "item.type": TEXT_OR_NULL,
                                             "item.name": TEXT_OR_NULL},
    event_types.RESPONSE_OUTPUT_ITEM_DONE: {"output_index": COUNT, "item": OBJECT},
    event_types.RESPONSE_CONTENT_PART_ADDED: {**_PART, "part": OBJECT},
    event_types.RESPONSE_CONTENT_PART_DONE: {**_PART, "part": OBJECT},
    event_types.RESPONSE_OUTPUT_TEXT_DELTA: {**_PART, "delta": TEXT},
    event_types.RESPONSE_OUTPUT_TEXT_DONE: {**_PART, "text": TEXT},
    event_types.RESPONSE_FUNCTION_CALL_ARGUMENTS_DELTA: {"delta": TEXT},
    event_types.RESPONSE_FUNCTION_CALL_ARGUMENTS_DONE: {"arguments": TEXT},
    event_types.ERROR: {"code": TEXT_OR_NULL, "message": TEXT_OR_NULL, "error_type": TEXT_OR_NULL,
                        "error": OBJECT_OR_NULL, "error.code": TEXT_OR_NULL, "error.message": TEXT_OR_NULL,
                        "error.type": TEXT_OR_NULL},
}
#: The statuses an envelope may have, and the kinds of its usage's fields.
ENVELOPE_STATUSES = frozenset(s.value for s in JobStatus)
USAGE_FIELDS: dict[str, Kind] = {"tokens_in": COUNT, "tokens_out": COUNT, "duration_ms": COUNT,
                                 "model": TEXT_OR_NULL}
_ABSENT = object()


def _at(obj: dict, path: str) -> Any:
    for key in path.split("."):
        if not isinstance(obj, dict) or key not in obj:
            return _ABSENT
        obj = obj[key]
    return obj


def _check_fields(obj: dict, fields: dict[str, Kind], prefix: str = "") -> str | None:
    for name, (test, what) in fields.items():
        value = _at(obj, name)
        if value is not _ABSENT and not test(value):
            return f"its {prefix}{name} is not {what}"
    return None


def check_usage(usage: Any, prefix: str = "usage.") -> str | None:
    """What is wrong with an envelope's usage (each of its counts, its model), or None."""
    if usage is None:
        return None
    if not isinstance(usage, dict):
        return f"its {prefix.rstrip('.')} is not an object"
    return _check_fields(usage, USAGE_FIELDS, prefix)


def check_envelope(envelope: Any, prefix: str = "") -> str | None:
    """What is wrong with an envelope as a reader uses it -- its status, its error's code and message,
    its usage -- or None. (Its result is any JSON value.)"""
    if not isinstance(envelope, dict):
        return f"its {prefix.rstrip('.') or 'envelope'} is not an object"
    status = envelope.get("status")
    if not isinstance(status, str) or status not in ENVELOPE_STATUSES:
        return f"its {prefix}status is not one of {', '.join(sorted(ENVELOPE_STATUSES))}"
    error = envelope.get("error")
    if error is not None:
        if not isinstance(error, dict):
            return f"its {prefix}error is not an object"
        problem = _check_fields(error, {"code": TEXT, "message": TEXT}, prefix + "error.")
        if problem is not None:
            return problem
    return check_usage(envelope.get("usage"), prefix + "usage.")


def check_event(event: dict) -> str | None:
    """What is wrong with one parsed event's fields (``EVENT_FIELDS``), or None."""
    problem = _check_fields(event, COMMON_FIELDS)
    if problem is None:
        problem = _check_fields(event, EVENT_FIELDS.get(event["type"], {}))
    if problem is None and event["type"] in TERMINAL_EVENT_TYPES and "envelope" in event:
        problem = check_envelope(event["envelope"], "envelope.")
    return problem


def parse_event(line: bytes, n: int, run_dir: Path) -> dict:
    """Line ``n + 1`` of a transcript as event ``n``, checked (shape, JSON, numbering, fields);
    ``TranscriptError`` if it is not one. The one parser every reader of ``events.jsonl`` uses."""
    where = f"{_where(run_dir)}: line {n + 1} of {EVENTS_FILE}"
    if len(line) > MAX_LINE_BYTES:
        raise TranscriptError(f"{where} is longer than {MAX_LINE_BYTES} bytes (MAX_LINE_BYTES); "
                              f"the transcript is damaged")
    problem = check_shape(line)
    if problem is not None:
        raise TranscriptError(f"{where} {problem}; the transcript is damaged")
    try:
        event = orjson.loads(line)
    except orjson.JSONDecodeError:
        if n == 0:
            raise TranscriptError(f"{_where(run_dir)}: the first line of {EVENTS_FILE} is not JSON") from None
        raise TranscriptError(f"{where} is not JSON; the transcript is damaged") from None
    numbered = isinstance(event, dict) and _is_count(event.get("sequence_number")) and event["sequence_number"] == n
    if n == 0:
        if not numbered or event.get("type") != event_types.JOB_CREATED:
            raise TranscriptError(f"{_where(run_dir)}: {EVENTS_FILE} does not start with job.created; "
                                  f"not a tensorjob transcript")
        check_version(event, run_dir)
    elif not numbered or not isinstance(event.get("type"), str):
        raise TranscriptError(f"{where} is not event {n}; the transcript is damaged")
    problem = check_event(event)
    if problem is not None:
        kind = for_terminal(event["type"], one_line=True)[:60]
        raise TranscriptError(f"{where} ({kind}): {problem}; the transcript is damaged")
    return event


def check_version(created: dict, run_dir: Path) -> int:
    """The transcript's format version; ``TranscriptError`` if this host does not know it."""
    version = created.get("transcript_version", 0)
    if not isinstance(version, int) or isinstance(version, bool) or not 0 <= version <= TRANSCRIPT_VERSION:
        shown = for_terminal(dumps(version), one_line=True)[:40]
        raise TranscriptError(f"{_where(run_dir)}: transcript format version {shown} is not one this tensorjob "
                              f"reads (0 to {TRANSCRIPT_VERSION}); it was written by a newer tensorjob-jupyter, "
                              f"or it is not a tensorjob transcript")
    return version


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
    """``path`` opened for reading; ``OSError`` unless it is a regular file (a FIFO would block)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise IsADirectoryError(errno.EISDIR, "not a regular file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


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
        raise TranscriptError(f"{_where(run_dir)}: cannot read {ENVELOPE_FILE}: {e.strerror}") from None
    if too_long or len(data) > ENVELOPE_MAX_BYTES:
        raise TranscriptError(f"{_where(run_dir)}: {ENVELOPE_FILE} is longer than {ENVELOPE_MAX_BYTES} bytes; "
                              f"it is damaged")
    problem = check_shape(data)
    if problem is not None:
        raise TranscriptError(f"{_where(run_dir)}: {ENVELOPE_FILE} {problem}; it is damaged")
    try:
        envelope = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise TranscriptError(f"{_where(run_dir)}: {ENVELOPE_FILE} is damaged (not JSON)") from None
    problem = check_envelope(envelope)
    if problem is not None:
        raise TranscriptError(f"{_where(run_dir)}: {ENVELOPE_FILE} is damaged: {problem}")
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
        raise TranscriptError(f"{_where(run_dir)}: cannot read {ENVELOPE_FILE}: {e.strerror}") from None
    if size <= ENVELOPE_SUMMARY_BYTES:
        envelope = read_envelope(run_dir)
        return None if envelope is None else {k: v for k, v in envelope.items() if k != "result"}
    try:
        status = orjson.loads(head[head.index(b":") + 1:head.index(b",")])
        usage = orjson.loads(tail[tail.rindex(b'"usage":') + 8:].rstrip()[:-1])
    except (ValueError, orjson.JSONDecodeError):
        raise TranscriptError(f"{_where(run_dir)}: {ENVELOPE_FILE} is damaged") from None
    if not head.startswith(b'{"status":') or not isinstance(usage, dict):
        raise TranscriptError(f"{_where(run_dir)}: {ENVELOPE_FILE} is damaged")
    summary = {"status": status, "usage": usage}
    problem = check_envelope(summary)
    if problem is not None:
        raise TranscriptError(f"{_where(run_dir)}: {ENVELOPE_FILE} is damaged: {problem}")
    return summary


def read_header(run_dir: str | os.PathLike) -> Header:
    """``job.created`` and the envelope of a run (its status, error and usage: not its result);
    ``TranscriptError`` if it is not a readable transcript."""
    run_dir = Path(run_dir)
    try:
        line = read_first_line(run_dir / EVENTS_FILE, HEADER_MAX_BYTES)
    except FileNotFoundError:
        raise TranscriptError(f"{_where(run_dir)}: no {EVENTS_FILE}; not a tensorjob run folder") from None
    except OSError as e:
        raise TranscriptError(f"{_where(run_dir)}: cannot read {EVENTS_FILE}: {e.strerror}") from None
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
            raise TranscriptError(f"{_where(self.run_dir)}: no {EVENTS_FILE}; not a tensorjob run folder")
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
            raise TranscriptError(f"{_where(self.run_dir)}: cannot read {EVENTS_FILE}: {e.strerror}") from None
        with f:
            while True:
                line = read_line(f, MAX_LINE_BYTES)
                if line is None:
                    raise TranscriptError(f"{_where(self.run_dir)}: line {self.count + 1} of {EVENTS_FILE} is longer "
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
            raise TranscriptError(f"{_where(self.run_dir)}: {EVENTS_FILE} is empty" + (
                " but for a torn first line (its process stopped while writing job.created)" if self.torn else ""))

    def _event(self, line: bytes) -> dict:
        n = self.count
        event = parse_event(line, n, self.run_dir)
        if n == 0:
            self.created = event
            self.version = check_version(event, self.run_dir)
        if self.terminal is not None:
            raise TranscriptError(f"{_where(self.run_dir)}: events follow the job's end at line {n + 1}")
        if event["type"] in TERMINAL_EVENT_TYPES:
            self.terminal = event
        self.count += 1
        return event


def read_run(run_dir: str | os.PathLike) -> tuple[list[dict], dict | None]:
    """Every event of a run and its envelope (None while it runs, or if it was interrupted), checked."""
    return list(EventReader(run_dir)), read_envelope(Path(run_dir))


# --- the commands a run records ------------------------------------------------------------------


@dataclass(slots=True)
class InferAnswer:
    """What the model answered to one infer, as recorded."""

    max_output_tokens: int | None = None
    model: str = ""
    pieces: list[str] = field(default_factory=list)
    #: completed | incomplete | failed; None when the transcript ends inside the answer.
    status: str | None = None
    #: Why it ended, in the events' ``finish_reason`` words: stop, length, guest_stop or cancelled.
    reason: str | None = None
    text: str | None = None
    usage: dict | None = None
    timing: dict | None = None
    guest_stopped_after: int | None = None
    error: dict | None = None

    def _usage(self, key: str, within: str | None = None) -> int:
        usage = self.usage if isinstance(self.usage, dict) else {}
        if within is not None:
            usage = usage.get(within) if isinstance(usage.get(within), dict) else {}
        value = usage.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0

    @property
    def tokens_in(self) -> int:
        return self._usage("input_tokens")

    @property
    def tokens_out(self) -> int:
        return self._usage("output_tokens")

    @property
    def cached_tokens(self) -> int:
        return self._usage("cached_tokens", "input_tokens_details")


@dataclass(slots=True)
class Step:
    """One command the guest returned and the host carried out, with its recorded answer."""

    number: int  # 1-based: the guest's first command (cf_init's) is step 1
    command: dict  # as the guest sent it (an embed's texts as their SHA-256s)
    outcome: dict  # the fields of the host's answer that say what happened
    infer: InferAnswer | None = None


@dataclass
class End:
    """How a recorded run ended: its terminal event."""

    status: str
    envelope: dict
    ended_during: str | None  # the command being carried out, or None (in the guest, or between steps)
    stats: dict | None

    @property
    def error(self) -> dict | None:
        error = self.envelope.get("error")
        return error if isinstance(error, dict) else None


def _sha256_texts(texts) -> list[str]:
    return [hashlib.sha256(t.encode("utf-8")).hexdigest() for t in texts]


def normalise(command: dict) -> dict:
    """A command as a step records it: an embed's texts become their SHA-256s; nulls are dropped."""
    out = {k: v for k, v in command.items() if v is not None}
    if out.get("cmd") == "embed" and "texts" in out:
        out["texts_sha256"] = _sha256_texts(out.pop("texts"))
    if out.get("cmd") == "infer":
        out.setdefault("images", [])
    return out


def _pick(event: dict, *keys: str) -> dict:
    return {k: event[k] for k in keys if k in event}


def _step_of(event: dict) -> tuple[dict, dict] | None:
    """The command a command-level event records, and its outcome; None for any other event."""
    kind = event["type"]
    if kind == event_types.JOB_PROGRESS:
        return {"cmd": "emit", "progress": event.get("progress")}, {}
    if kind == event_types.JOB_FILE_OPENED:
        return {"cmd": "open", "path": event.get("path")}, _pick(event, "handle", "len", "kind")
    if kind == event_types.JOB_FILE_SLICED:
        binary = bool(event.get("binary"))
        command = {"cmd": "slice_bytes" if binary else "slice", "handle": event.get("handle"),
                   "offset": event.get("offset"), "len": event.get("requested")}
        return command, _pick(event, "length", "next_offset", "preview_base64" if binary else "preview")
    if kind == event_types.JOB_EMBEDDED:
        return ({"cmd": "embed", "texts_sha256": event.get("text_sha256")},
                {"vectors": event.get("vectors")} if "vectors" in event else {})
    if kind == event_types.JOB_DOCUMENT_PAGE:
        command = {"cmd": event.get("command"), "handle": event.get("handle")}
        if event.get("page") is not None:
            command["page"] = event["page"]
        outcome = _pick(event, "chars", "error", "preview") if event.get("command") != "page_image" else {}
        return command, outcome
    if kind == event_types.JOB_IMAGE_CREATED:  # image_op's (page_image's follows its job.document.page)
        return ({"cmd": "image_op", "handle": event.get("source"), "op": event.get("op")},
                _pick(event, "handle"))
    if kind == event_types.JOB_FETCH:
        return {"cmd": "fetch", "url": event.get("url")}, _pick(event, "handle", "len", "kind")
    return None


@dataclass
class Recording:
    """A recorded run: how it was set up (``created``), its steps, and how it ended."""

    path: Path
    created: dict
    version: int
    steps: list[Step]
    end: End | None  # None: the transcript stops before the job's end (interrupted or torn)
    torn: bool
    chunks: int = 0
    chunk_bytes: int = 0

    @classmethod
    def read(cls, run_dir: str | os.PathLike) -> "Recording":
        reader = StepReader(run_dir)
        steps = list(reader)
        events = reader.events
        assert events.created is not None
        return cls(events.run_dir, events.created, events.version, steps, reader.end, events.torn, reader.chunks,
                   reader.chunk_bytes)

    # -- how the run was set up (job.created) --

    @property
    def id(self) -> str:
        return str(self.created.get("job_id", self.path.name))

    @property
    def name(self) -> str:
        return str(self.created.get("name", "?"))

    @property
    def guest(self) -> dict:
        return self.created.get("guest") or {}

    @property
    def model(self) -> str | None:
        return self.created.get("model")

    @property
    def status(self) -> str:
        return self.end.status if self.end is not None else "interrupted"

    @property
    def envelope(self) -> dict | None:
        return self.end.envelope if self.end is not None else None


class StepReader:
    """A run's steps one at a time, folded from its events as they are read: never all held, so
    comparing two long runs (``history/diff.py``) costs the memory of one step each. Afterwards
    ``end``, ``chunks``, ``chunk_bytes`` and ``count`` say how the run ended and what it streamed;
    ``events`` is the ``EventReader`` (``created``, ``version``, ``torn``). Iterating again reads the
    file again."""

    def __init__(self, run_dir: str | os.PathLike):
        self.events = EventReader(run_dir)
        self.end: End | None = None  # None: the transcript stops before the job's end (interrupted or torn)
        self.chunks = self.chunk_bytes = self.count = 0

    def __iter__(self) -> Iterator[Step]:
        self.end, self.chunks, self.chunk_bytes, self.count = None, 0, 0, 0
        current: Step | None = None  # the step being folded: later events may still add to it
        for event in self.events:
            try:
                started = self._fold(event, current)
            except (AttributeError, KeyError, TypeError, ValueError):
                raise TranscriptError(f"{_where(self.events.run_dir)}: event {event.get('sequence_number')} "
                                      f"({for_terminal(str(event.get('type')), one_line=True)[:60]}) is malformed; "
                                      f"the transcript is damaged") from None
            if started is not None:
                if current is not None:
                    yield current
                current = started
                self.count += 1
        if current is not None:
            yield current
        if self.end is None:
            envelope = read_envelope(self.events.run_dir)  # a run that ended without its terminal event (rare)
            if envelope is not None:
                self.end = End(envelope["status"], envelope, None, None)

    def _fold(self, event: dict, current: Step | None) -> Step | None:
        """Fold one event into the step being built; the step it starts, if it starts one."""
        kind = event["type"]
        if kind == event_types.JOB_CREATED:
            return None
        if kind in TERMINAL_EVENT_TYPES:
            envelope = event.get("envelope") if isinstance(event.get("envelope"), dict) else {}
            self.end = End(kind.split(".", 1)[1], envelope, event.get("ended_during"), event.get("stats"))
        elif kind == event_types.JOB_CHUNK:
            self.chunks += 1
            self.chunk_bytes += len(event.get("bytes_base64") or "") * 3 // 4
        elif kind == event_types.RESPONSE_CREATED:
            response = event.get("response") or {}
            answer = InferAnswer(max_output_tokens=response.get("max_output_tokens"),
                                 model=str(response.get("model") or ""))
            command = event.get("command") if isinstance(event.get("command"), dict) else {"cmd": "infer"}
            return Step(self.count + 1, normalise(command), {}, answer)
        elif kind.startswith("response.") or kind == event_types.ERROR:
            if current is not None and current.infer is not None:
                _fold_answer(current.infer, event)
        elif (kind == event_types.JOB_IMAGE_CREATED and "op" not in event and current is not None
              and current.command.get("cmd") == "page_image" and "handle" not in current.outcome):
            current.outcome["handle"] = event.get("handle")
        else:
            found = _step_of(event)
            if found is not None:
                return Step(self.count + 1, normalise(found[0]), found[1])
        return None


def _fold_answer(answer: InferAnswer, event: dict) -> None:
    kind = event["type"]
    if kind == event_types.RESPONSE_OUTPUT_TEXT_DELTA:
        answer.pieces.append(str(event.get("delta", "")))
    elif kind in (event_types.RESPONSE_COMPLETED, event_types.RESPONSE_INCOMPLETE):
        response = event.get("response") or {}
        answer.status = kind.split(".", 1)[1]
        details = (response.get("incomplete_details") or {}).get("reason")
        if response.get("status") == "cancelled":
            answer.reason = "cancelled"
        elif details == "max_output_tokens":
            answer.reason = "length"
        elif details in ("guest_stop", "cancelled"):  # as a transcript of version 0 said it
            answer.reason = details
        else:
            answer.reason = event.get("finish_reason") or "stop"
        text = response.get("output_text")
        answer.text = text if isinstance(text, str) else "".join(answer.pieces)
        answer.usage = response.get("usage")
        answer.timing = event.get("timing")
        stopped = event.get("guest_stopped_after")
        answer.guest_stopped_after = stopped if isinstance(stopped, int) and not isinstance(stopped, bool) else None
    elif kind == event_types.ERROR:
        answer.error = event.get("error") or {  # flat since the events follow the openai SDK
            "code": event.get("code"), "message": event.get("message"), "type": event.get("error_type")}
    elif kind == event_types.RESPONSE_FAILED:
        answer.status = "failed"
        if answer.error is None:
            answer.error = (event.get("response") or {}).get("error")


# --- saying what a command is ---------------------------------------------------------------------

DESCRIBE_CHARS = 80


def _quote(text: Any, limit: int = DESCRIBE_CHARS) -> str:
    text = str(text)
    clipped = text if len(text) <= limit else text[:limit] + "…"
    return '"' + for_terminal(clipped, one_line=True) + '"'


#: Characters of one line ``describe`` writes at most.
DESCRIBE_LINE_CHARS = 1000


def describe(command: dict | None) -> str:
    """One inert line saying what a command asked for (every field of it made inert: a recorded command
    comes from a file)."""
    text = _describe(command)
    text = for_terminal(text, one_line=True)
    return text if len(text) <= DESCRIBE_LINE_CHARS else text[:DESCRIBE_LINE_CHARS] + "…"


def _describe(command: dict | None) -> str:
    if command is None:
        return "nothing"
    cmd = command.get("cmd")
    if cmd == "infer":
        prompt = str(command.get("prompt", ""))
        images = command.get("images")
        images = f", {len(images)} images" if isinstance(images, list) and images else ""
        return f"infer of at most {command.get('max_tokens')} tokens{images}, prompt {_quote(prompt)} " \
               f"({len(prompt)} characters)"
    if cmd in ("slice", "slice_bytes"):
        return f"{cmd} #{command.get('handle')} from byte {command.get('offset')} ({command.get('len')} bytes)"
    if cmd in ("open", "fetch"):
        return f"{cmd} {_quote(command.get('path', command.get('url')))}"
    if cmd == "embed":
        texts = command.get("texts_sha256")
        return f"embed of {len(texts) if isinstance(texts, list) else '?'} texts"
    if cmd == "emit":
        return f"emit {for_terminal(dumps(command.get('progress')), one_line=True)[:DESCRIBE_CHARS]}"
    if cmd in ("page_text", "page_text_opt", "page_image"):
        return f"{cmd} #{command.get('handle')} page {command.get('page')}"
    if cmd == "document_text":
        return f"document_text #{command.get('handle')}"
    if cmd == "image_op":
        return f"image_op #{command.get('handle')} {for_terminal(dumps(command.get('op')), one_line=True)[:DESCRIBE_CHARS]}"
    if cmd == "done":
        return "done"
    if cmd == "fail":
        return f"fail with {_quote(command.get('code', ''), 40)}"
    return for_terminal(str(cmd), one_line=True)[:DESCRIBE_CHARS]


def first_difference(a: str, b: str) -> int:
    """The index of the first character where ``a`` and ``b`` differ (the shorter one's length if one
    is a prefix of the other)."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _around(text: str, at: int, before: int = 20, after: int = 40) -> str:
    start = max(0, at - before)
    part = text[start:at + after]
    return ("…" if start else "") + for_terminal(part, one_line=True) + ("…" if at + after < len(text) else "")


def compare_commands(recorded: dict, asked: dict, *, max_tokens: bool = True) -> tuple[str, str, str] | None:
    """None when ``asked`` is the command ``recorded``; else (why, what was recorded, what was asked),
    each one inert line. ``max_tokens=False`` leaves an infer's token limit to the caller."""
    if recorded.get("cmd") != asked.get("cmd"):
        return "another command", describe(recorded), describe(asked)
    cmd = recorded["cmd"]
    if cmd == "infer":
        a, b = str(recorded.get("prompt", "")), str(asked.get("prompt", ""))
        if a != b:
            at = first_difference(a, b)
            return (f"another prompt (they differ from character {at})",
                    f"infer, prompt {_quote(_around(a, at), 200)}", f"infer, prompt {_quote(_around(b, at), 200)}")
        if (recorded.get("images") or []) != (asked.get("images") or []):
            return "other images", describe(recorded), describe(asked)
        if max_tokens and recorded.get("max_tokens") != asked.get("max_tokens"):
            return "another token limit", describe(recorded), describe(asked)
        return None
    if recorded == asked:
        return None
    why = {"slice": "another window", "slice_bytes": "another window", "open": "another file",
           "fetch": "another URL", "emit": "other progress", "embed": "other texts"}.get(cmd, "other arguments")
    return why, describe(recorded), describe(asked)

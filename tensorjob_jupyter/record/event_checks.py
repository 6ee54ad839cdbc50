"""A transcript's events checked as they are read: sizes, depth, and each field's type and range.

A transcript is a file from anywhere (copied between machines, edited by hand, planted), so every
value is checked as it is read, the way guest output is checked at the ABI: a line's size
(``MAX_LINE_BYTES``), its JSON values and depth (counted on its bytes before it is parsed), and
each field a consumer uses (``EVENT_FIELDS``: its type and range). What passes can be printed,
folded into a view, compared and replayed without a type or range error. Problems are
``TranscriptError``: one line naming the folder and what is wrong with it.

Design: docs/internals/record.md#event_checkspy
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable, TypeGuard

import numpy as np
import orjson

from tensorjob_jupyter.abi import MAX_COUNT, MAX_DEPTH, TERMINAL_EVENT_TYPES, JobStatus, dumps, event_types, TensorjobError
from tensorjob_jupyter.record.events import TRANSCRIPT_VERSION
from tensorjob_jupyter.record.job_folder import EVENTS_FILE
from tensorjob_jupyter.text import for_terminal

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
#: The latest recorded time (``t_ms``, milliseconds since the job started) a transcript may hold: a
#: year. Later is damage, not a job (a paced ``show`` would wait for it).
MAX_T_MS = 366 * 24 * 3600 * 1000
#: The latest ``created_at`` (seconds since the epoch) a transcript may hold: the end of year 9999,
#: the last one a calendar date prints.
MAX_CREATED_AT = 253_402_300_799

class TranscriptError(TensorjobError, ValueError):
    """A run folder that cannot be read as a transcript (one line, names the folder)."""


def shown_run(run_dir: Path) -> str:
    """A run folder as an error message names it: one inert line."""
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


def _is_count(value: Any) -> TypeGuard[int]:
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


COUNT_OR_NULL, INTEGER_OR_NULL, TEXT_OR_NULL, OBJECT_OR_NULL, LIST_OR_NULL, FLAG_OR_NULL = map(
    _or_null, (COUNT, INTEGER, TEXT, OBJECT, LIST, FLAG))

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
        "replay_of": OBJECT_OR_NULL, "require_grounded": LIST_OR_NULL, "model_ref": OBJECT_OR_NULL,
        "require_present": LIST_OR_NULL, "fail_item": FLAG_OR_NULL},
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


#: What a reader accepts of a result's sources and confidence (the host gives at most 1,000 fields, 3 sources
#: each, ``host/grounding.py``): fields, sources per field, the characters of a field's name, file or URL.
MAX_SOURCE_FIELDS = 10_000
MAX_FIELD_SOURCES = 64
MAX_SOURCE_TEXT = 64 * 1024
#: The longest label, or name of the field a label names, a source may carry (``host.labels``: 80 are given).
MAX_LABEL_TEXT = 1024
#: How a field was matched (``host.grounding.MATCHES``).
SOURCE_MATCHES = frozenset({"exact", "normalised", "fuzzy", "ambiguous"})


def _is_fraction(value: Any) -> bool:
    return type(value) in (int, float) and 0 <= value <= 1


def _short_text_or_null(value: Any) -> bool:
    return value is None or isinstance(value, str) and len(value) <= MAX_SOURCE_TEXT


def check_source(source: Any) -> str | None:
    """What is wrong with one source (``{file, url, page, start, end, match, score}``), or None."""
    if not isinstance(source, dict):
        return "is not an object"
    if not _short_text_or_null(source.get("file")) or not _short_text_or_null(source.get("url")):
        return "has a file or url that is not text (of at most 64 KiB) or null"
    if source.get("file") is None and source.get("url") is None:
        return "names neither a file nor a url"
    page = source.get("page")
    if page is not None and not _is_count(page):
        return "has a page that is not a whole number from 0 or null"
    start, end = source.get("start"), source.get("end")
    if not (_is_count(start) and _is_count(end) and start <= end):
        return "has a start and end that are not byte offsets, start before end"
    if source.get("match") not in SOURCE_MATCHES:
        return f"has a match that is not one of {', '.join(sorted(SOURCE_MATCHES))}"
    if not _is_fraction(source.get("score")):
        return "has a score that is not a number from 0 to 1"
    label, under = source.get("label"), source.get("under")
    if not (label is None or (isinstance(label, str) and len(label) <= MAX_LABEL_TEXT)) or not (
            under is None or (isinstance(under, str) and len(under) <= MAX_LABEL_TEXT)):
        return f"has a label or the field it names that is not text (of at most {MAX_LABEL_TEXT} characters) or null"
    if source.get("elsewhere", False) not in (True, False):
        return "has an elsewhere that is not true or false"
    return None


def _check_by_field(value: Any, each: Callable[[Any], str | None]) -> str | None:
    """What is wrong with a map of a result's fields to something (``each`` says what is wrong with one), or
    None: an object of at most ``MAX_SOURCE_FIELDS`` fields, each named in at most 64 KiB."""
    if not isinstance(value, dict):
        return "is not an object"
    if len(value) > MAX_SOURCE_FIELDS:
        return f"names more than {MAX_SOURCE_FIELDS} fields"
    for name, given in value.items():
        if len(name) > MAX_SOURCE_TEXT:
            return "names a field longer than 64 KiB"
        problem = each(given)
        if problem is not None:
            return problem
    return None


def _field_sources_problem(found: Any) -> str | None:
    if not isinstance(found, list) or len(found) > MAX_FIELD_SOURCES:
        return f"gives a field something other than a list of at most {MAX_FIELD_SOURCES} sources"
    for source in found:
        problem = check_source(source)
        if problem is not None:
            return f"has a source that {problem}"
    return None


def check_sources(sources: Any) -> str | None:
    """What is wrong with a result's sources (``{field: [source, ...]}``), or None."""
    return _check_by_field(sources, _field_sources_problem)


def check_rejected(rejected: Any) -> str | None:
    """What is wrong with a result's rejected fields (``{field: why, one line of text}``), or None."""
    return _check_by_field(rejected, lambda why: None if isinstance(why, str) and len(why) <= MAX_SOURCE_TEXT
                           else "gives a field something other than why, as text of at most 64 KiB")


def check_confidence(confidence: Any) -> str | None:
    """What is wrong with a result's confidence (``{field: number from 0 to 1, or null}``), or None."""
    return _check_by_field(confidence, lambda value: None if value is None or _is_fraction(value)
                           else "gives a field something other than a number from 0 to 1 or null")


def check_envelope(envelope: Any, prefix: str = "") -> str | None:
    """What is wrong with an envelope as a reader uses it -- its status, its error's code and message,
    its usage, a completed one's sources, confidence and rejected fields -- or None. (Its result is any JSON
    value.)"""
    if not isinstance(envelope, dict):
        return f"its {prefix.rstrip('.') or 'envelope'} is not an object"
    status = envelope.get("status")
    if not isinstance(status, str) or status not in ENVELOPE_STATUSES:
        return f"its {prefix}status is not one of {', '.join(sorted(ENVELOPE_STATUSES))}"
    error = envelope.get("error")
    ended_badly = status in (JobStatus.FAILED.value, JobStatus.CANCELLED.value)
    if ended_badly != (error is not None):  # as the host writes it: an error exactly when it failed
        return f"its {prefix}error is {'missing' if ended_badly else 'there'} for a {status} job"
    if status != JobStatus.COMPLETED.value and envelope.get("result") is not None:
        return f"its {prefix}result is there for a {status} job"
    for name, check in (("sources", check_sources), ("confidence", check_confidence), ("rejected", check_rejected)):
        value = envelope.get(name)
        if value is None:
            continue
        if status != JobStatus.COMPLETED.value:
            return f"its {prefix}{name} are there for a {status} job"
        problem = check(value)
        if problem is not None:
            return f"its {prefix}{name} {problem}"
    if error is not None:
        if not isinstance(error, dict):
            return f"its {prefix}error is not an object"
        for key in ("code", "message"):
            if not isinstance(error.get(key), str):
                return f"its {prefix}error.{key} is not text"
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
    def where() -> str:  # named only when the line is refused: a good line costs no formatting
        return f"{shown_run(run_dir)}: line {n + 1} of {EVENTS_FILE}"

    if len(line) > MAX_LINE_BYTES:
        raise TranscriptError(f"{where()} is longer than {MAX_LINE_BYTES} bytes (MAX_LINE_BYTES); "
                              f"the transcript is damaged")
    problem = check_shape(line)
    if problem is not None:
        raise TranscriptError(f"{where()} {problem}; the transcript is damaged")
    try:
        event = orjson.loads(line)
    except orjson.JSONDecodeError:
        if n == 0:
            raise TranscriptError(f"{shown_run(run_dir)}: the first line of {EVENTS_FILE} is not JSON") from None
        raise TranscriptError(f"{where()} is not JSON; the transcript is damaged") from None
    numbered = isinstance(event, dict) and _is_count(event.get("sequence_number")) and event["sequence_number"] == n
    if n == 0:
        if not numbered or event.get("type") != event_types.JOB_CREATED:
            raise TranscriptError(f"{shown_run(run_dir)}: {EVENTS_FILE} does not start with job.created; "
                                  f"not a tensorjob transcript")
        check_version(event, run_dir)
    elif not numbered or not isinstance(event.get("type"), str):
        raise TranscriptError(f"{where()} is not event {n}; the transcript is damaged")
    problem = check_event(event)
    if problem is not None:
        kind = for_terminal(event["type"], one_line=True)[:60]
        raise TranscriptError(f"{where()} ({kind}): {problem}; the transcript is damaged")
    return event


def check_version(created: dict, run_dir: Path) -> int:
    """The transcript's format version; ``TranscriptError`` if this host does not know it."""
    version = created.get("transcript_version", 0)
    if not isinstance(version, int) or isinstance(version, bool) or not 0 <= version <= TRANSCRIPT_VERSION:
        shown = for_terminal(dumps(version), one_line=True)[:40]
        raise TranscriptError(f"{shown_run(run_dir)}: transcript format version {shown} is not one this tensorjob "
                              f"reads (0 to {TRANSCRIPT_VERSION}); it was written by a newer tensorjob-jupyter, "
                              f"or it is not a tensorjob transcript")
    return version


__all__ = [
    "MAX_LINE_BYTES", "MAX_EVENT_VALUES", "MAX_EVENT_DEPTH", "MAX_T_MS", "MAX_CREATED_AT", "TranscriptError",
    "shown_run", "check_shape", "Kind", "COUNT", "INTEGER", "TEXT", "OBJECT", "LIST", "FLAG", "T_MS", "CREATED_AT",
    "VECTORS", "COMMON_FIELDS", "EVENT_FIELDS", "ENVELOPE_STATUSES", "USAGE_FIELDS", "check_usage", "MAX_SOURCE_FIELDS", "MAX_FIELD_SOURCES",
    "MAX_SOURCE_TEXT", "SOURCE_MATCHES", "check_source", "check_sources", "check_confidence", "check_rejected", "check_envelope",
    "check_event", "parse_event", "check_version"
]

"""What a job view shows, folded from the job's events; no widgets here.

``ViewState.apply(event)`` turns the event stream into the handful of facts a person watches, each section
recording whether it changed so a view resends only what moved; ``copy()`` is cheap, for scrubbing. Keeping
this pure makes the view testable without a front end and lets every renderer share one reading of the stream.
Times come from ``clock``: the monotonic clock live, the recorded times for a run shown again.

Design: docs/internals/frontends.md#viewstatepy
"""

from __future__ import annotations

import base64
import bisect
import codecs
import json
import copy as _copy
import logging
import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, TypeGuard
from tensorjob_jupyter.abi import dumps
from tensorjob_jupyter.host import busy_machine_line
from tensorjob_jupyter.host.debugger import bounded
from tensorjob_jupyter.history.report import divergence_line

log = logging.getLogger("tensorjob_jupyter.frontends.view")

MAX_LOG_LINES = 50
MAX_LOG_LINE_CHARS = 1000
MAX_TEXT_CHARS = 20_000  # per infer and for streamed output: the tail is kept
#: Read ranges kept per file; past it, gaps narrower than length/MAX_RANGES are
#: filled, so the coverage shown may be slightly more than was read.
MAX_RANGES = 4096

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
MAX_THUMBNAIL_BYTES = 64 * 1024  # a thumbnail bigger than this is not shown

SECTIONS = ("header", "progress", "log", "tokens", "files", "output", "result", "usage", "debug")
#: Open handles a pause's panel lists at most.
MAX_DEBUG_HANDLES = 64


@dataclass
class FileState:
    handle: int
    path: str
    length: int
    kind: str
    ranges: list[list[int]] = field(default_factory=list)  # merged [start, end)
    preview: str | None = None
    preview_bytes: bytes | None = None
    preview_offset: int = 0
    approximate: bool = False  # narrow gaps were filled to bound the ranges kept
    # Documents (job.document.page), images made by the host (job.image.created):
    pages: int | None = None
    pages_read: set[int] = field(default_factory=set)
    all_pages_read: bool = False
    page_text: str | None = None  # the latest page's text preview (or error)
    page_no: int | None = None
    page_error: bool = False
    thumbnail: bytes | None = None  # a small PNG the host made of the guest's image
    size_px: tuple[int, int] | None = None

    def add_range(self, start: int, end: int) -> None:
        """Merge [start, end) into the sorted, disjoint ranges (log n to find)."""
        if end <= start:
            return
        ranges = self.ranges
        i = bisect.bisect_left(ranges, [start, start])
        if i > 0 and ranges[i - 1][1] >= start:
            i -= 1
        j = i
        while j < len(ranges) and ranges[j][0] <= end:
            start, end = min(start, ranges[j][0]), max(end, ranges[j][1])
            j += 1
        ranges[i:j] = [[start, end]]
        if len(ranges) > MAX_RANGES:
            self._coarsen()

    def _coarsen(self) -> None:
        gap = max(1, self.length // MAX_RANGES)
        merged = [self.ranges[0]]
        for a, b in self.ranges[1:]:
            if a - merged[-1][1] <= gap:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        self.ranges = merged
        self.approximate = True

    @property
    def bytes_covered(self) -> int:
        return sum(b - a for a, b in self.ranges)

    def copy(self) -> "FileState":
        new = _copy.copy(self)
        new.ranges = [r[:] for r in self.ranges]
        new.pages_read = set(self.pages_read)
        return new


#: Structured output (a JSON format, a tool call's arguments) longer than this is not parsed for the tree.
MAX_TREE_TEXT_CHARS = 64 * 1024


@dataclass
class InferState:
    index: int
    parts: list[str] = field(default_factory=list)
    chars: int = 0
    tokens: int = 0
    status: str = "running"
    reason: str | None = None
    #: ``text``, ``json`` (the infer asked for a JSON format) or ``call`` (the model calls a tool)
    kind: str = "text"
    call_name: str | None = None
    #: the parsed JSON of a finished structured answer or tool call, for the tree
    value: Any = None
    has_value: bool = False

    @property
    def text(self) -> str:
        text = "".join(self.parts)
        if len(text) > MAX_TEXT_CHARS:
            self.parts = [text[-MAX_TEXT_CHARS:]]
            return "…" + self.parts[0]
        return text

    def parse_value(self, text: str) -> None:
        """Keep the JSON of a finished structured answer (or call's arguments), if it is small and parses."""
        if self.kind == "text" or len(text) > MAX_TREE_TEXT_CHARS:
            return
        try:
            self.value, self.has_value = json.loads(text), True
        except ValueError:
            pass

    def copy(self) -> "InferState":
        if len(self.parts) > 1:
            self.parts = ["".join(self.parts)]  # the same text, one string: copies stay cheap
        new = _copy.copy(self)
        new.parts = list(self.parts)
        return new


class ViewState:
    def __init__(self, name: str = "guest", *, clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self.clock = clock
        self.status = "running"
        self.started = clock()
        self.finished: float | None = None
        self.error: dict | None = None
        self.result: Any = None
        self.has_result = False
        self.usage: dict | None = None
        self.stats: dict | None = None
        self.fraction: float | None = None
        self.progress_text = ""
        self.log: deque[str] = deque(maxlen=MAX_LOG_LINES)
        self.infers: list[InferState] = []
        self.tokens = 0
        self.first_token_at: float | None = None
        self.last_token_at: float | None = None
        #: the latest finished answer's line when the model decoded it with fewer threads than its own (a busy
        #: machine: ``busy_machine_line``); None once one is decoded with all of them again
        self.busy_machine: str | None = None
        self.files: dict[int, FileState] = {}
        self.output_parts: list[str] = []
        self._output_decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self.output_bytes = 0
        self.chunks = 0
        self.events_seen = 0
        # A job being debugged: whether it is paused now, and its latest pause (a job.paused event, checked).
        self.debugging = False
        self.paused = False
        self.debug: dict | None = None
        self.last_type: str | None = None  # the type of the latest event folded in
        self.dirty: set[str] = set(SECTIONS)

    # -- derived -------------------------------------------------------------------

    @property
    def done(self) -> bool:
        return self.status in ("completed", "failed", "cancelled", "interrupted")

    @property
    def elapsed_s(self) -> float:
        return (self.finished if self.finished is not None else self.clock()) - self.started

    @property
    def tokens_per_second(self) -> float | None:
        if self.first_token_at is None or self.last_token_at is None or self.tokens < 2:
            return None
        span = self.last_token_at - self.first_token_at
        return (self.tokens - 1) / span if span > 0 else None

    @property
    def output_text(self) -> str:
        text = "".join(self.output_parts)
        if len(text) > MAX_TEXT_CHARS:
            self.output_parts = [text[-MAX_TEXT_CHARS:]]
            return "…" + self.output_parts[0]
        return text

    def take_dirty(self) -> set[str]:
        dirty, self.dirty = self.dirty, set()
        return dirty

    def copy(self) -> "ViewState":
        """An independent copy: folding more events into it leaves this one as it is."""
        new = _copy.copy(self)
        new.log = deque(self.log, maxlen=MAX_LOG_LINES)
        new.infers = [i.copy() for i in self.infers]
        new.files = {h: f.copy() for h, f in self.files.items()}
        if len(self.output_parts) > 1:
            self.output_parts = ["".join(self.output_parts)]
        new.output_parts = list(self.output_parts)
        new._output_decoder = codecs.getincrementaldecoder("utf-8")("replace")
        new._output_decoder.setstate(self._output_decoder.getstate())
        new.dirty = set(self.dirty)
        return new

    # -- folding events ------------------------------------------------------------------

    def apply(self, event: dict) -> None:
        """Fold one event in. A malformed event is logged and skipped: the view goes on."""
        self.events_seen += 1
        self.last_type = event.get("type")
        handler = getattr(self, "_on_" + event["type"].replace(".", "_"), None)
        if handler is not None:
            try:
                handler(event)
            except Exception:  # noqa: BLE001 - hostile payloads must not stop the view
                log.warning("could not show event %s", event.get("type"), exc_info=True)

    def _on_job_progress(self, event: dict) -> None:
        payload = event["progress"]
        fraction = progress_fraction(payload)
        if fraction is not None:
            self.fraction = fraction
            self.progress_text = progress_label(payload)
            self.dirty.add("progress")
        else:
            line = payload if isinstance(payload, str) else dumps(payload)
            if len(line) > MAX_LOG_LINE_CHARS:
                line = line[:MAX_LOG_LINE_CHARS] + f"… ({len(line) - MAX_LOG_LINE_CHARS} more characters)"
            self.log.append(line)
            self.dirty.add("log")

    def _on_job_log(self, event: dict) -> None:
        """A Python guest's printed lines (``job.log``), in the log: ``›`` stdout, ``!`` stderr."""
        mark = "! " if event.get("stream") == "stderr" else "› "
        for line in list(event.get("lines") or ())[-MAX_LOG_LINES:]:
            line = str(line)
            if len(line) > MAX_LOG_LINE_CHARS:
                line = line[:MAX_LOG_LINE_CHARS] + f"… ({len(line) - MAX_LOG_LINE_CHARS} more characters)"
            self.log.append(mark + line)
        dropped = event.get("dropped")
        if isinstance(dropped, int) and dropped > 0:
            self.log.append(f"! … {dropped} more printed lines were not kept")
        self.dirty.add("log")

    def _on_job_file_opened(self, event: dict) -> None:
        self.files[event["handle"]] = FileState(event["handle"], event["path"], event["len"], event["kind"]["kind"])
        self._document_pages(event)
        self.dirty.add("files")

    def _on_job_file_sliced(self, event: dict) -> None:
        f = self.files.get(event["handle"])
        if f is None:
            return
        f.add_range(event["offset"], event["offset"] + event["length"])
        f.preview_offset = event["offset"]
        if event.get("binary"):
            f.preview, f.preview_bytes = None, base64.b64decode(event.get("preview_base64", ""))
        else:
            preview = str(event.get("preview", ""))
            cut = len(preview.encode("utf-8", "replace")) < event["length"]  # the host sent the window's start
            f.preview, f.preview_bytes = (cut_at_boundary(preview) if cut else preview), None
        self.dirty.add("files")

    def _on_job_fetch(self, event: dict) -> None:
        self.files[event["handle"]] = FileState(event["handle"], event["url"], event["len"], event["kind"]["kind"])
        self._document_pages(event)
        self.dirty.add("files")

    def _document_pages(self, event: dict) -> None:
        """A document's page count, from ``opened``'s kind, so the view shows its pages at once."""
        kind = event["kind"]
        if kind.get("kind") == "document" and _count(kind.get("pages")):
            self.files[event["handle"]].pages = kind["pages"]

    def _on_job_document_page(self, event: dict) -> None:
        f = self.files.get(event["handle"])
        if f is None:
            return
        command, pages, page = event["command"], event.get("pages"), event.get("page")
        if _count(pages):
            f.pages = pages
        if not _count(page) or (f.pages is not None and page >= f.pages):
            page = None
        ok = event.get("error") is None
        if command == "document_text":
            f.all_pages_read = f.all_pages_read or (ok and f.pages is not None)
        elif page is not None and ok:
            f.pages_read.add(page)
        if command != "page_image" and (page is not None or command == "document_text"):
            f.page_no = page
            f.page_error = not ok
            text = str(event.get("error") or event.get("preview") or "")
            chars = event.get("chars")
            f.page_text = cut_at_boundary(text) if _count(chars) and chars > len(text) else text
        self.dirty.add("files")

    def _on_job_image_created(self, event: dict) -> None:
        f = FileState(event["handle"], str(event["label"]), event["len"], "image")
        f.size_px = (int(event["width"]), int(event["height"]))
        encoded = event.get("thumbnail_base64") or ""
        try:
            thumb = base64.b64decode(encoded, validate=True) if len(encoded) <= 2 * MAX_THUMBNAIL_BYTES else b""
        except ValueError:
            thumb = b""
        f.thumbnail = thumb if thumb.startswith(PNG_MAGIC) and len(thumb) <= MAX_THUMBNAIL_BYTES else None
        self.files[f.handle] = f
        self.dirty.add("files")

    def _on_job_chunk(self, event: dict) -> None:
        self.chunks += 1
        data = base64.b64decode(event["bytes_base64"])
        self.output_bytes += len(data)
        # Decode across chunks: a character split between two chunks stays whole.
        self.output_parts.append(self._output_decoder.decode(data))
        self.dirty.add("output")

    def _on_response_created(self, event: dict) -> None:
        infer = InferState(len(self.infers))
        text = (event.get("response") or {}).get("text") or {}
        if isinstance(text, dict) and isinstance(text.get("format"), dict) and \
                text["format"].get("type") in ("json_schema", "json_object"):
            infer.kind = "json"
        self.infers.append(infer)
        self.dirty.add("tokens")

    def _on_response_output_item_added(self, event: dict) -> None:
        item = event.get("item") or {}
        if item.get("type") == "function_call" and self.infers:
            infer = self.infers[-1]
            infer.kind, infer.call_name, infer.parts = "call", str(item.get("name", "")), []
            self.dirty.add("tokens")

    def _on_response_function_call_arguments_delta(self, event: dict) -> None:
        self._on_response_output_text_delta(event)

    def _on_response_function_call_arguments_done(self, event: dict) -> None:
        if self.infers and self.infers[-1].kind == "call":
            self.infers[-1].parse_value(str(event.get("arguments", "")))
            self.dirty.add("tokens")

    def _on_response_output_text_delta(self, event: dict) -> None:
        if not self.infers:
            self.infers.append(InferState(0))
        now = self.clock()
        infer = self.infers[-1]
        infer.parts.append(event["delta"])
        infer.tokens += 1
        self.tokens += 1
        self.first_token_at = self.first_token_at if self.first_token_at is not None else now
        self.last_token_at = now
        self.dirty.update(("tokens", "header"))

    def _finish_infer(self, status: str, reason: str | None = None) -> None:
        if self.infers:
            self.infers[-1].status, self.infers[-1].reason = status, reason
            self.dirty.add("tokens")

    def _on_response_completed(self, event: dict) -> None:
        reason = event.get("finish_reason")
        self._finish_infer("completed", reason if reason not in (None, "stop") else None)
        if self.infers and self.infers[-1].kind == "json" and reason != "guest_stop":
            self.infers[-1].parse_value(str((event.get("response") or {}).get("output_text", "")))
        self._note_busy_machine(event)

    def _on_response_incomplete(self, event: dict) -> None:
        self._finish_infer(event["response"].get("status") or "incomplete", event.get("finish_reason"))
        self._note_busy_machine(event)

    def _note_busy_machine(self, event: dict) -> None:
        line = busy_machine_line(event)
        if line != self.busy_machine:
            self.busy_machine = line
            self.dirty.add("header")

    def _on_response_failed(self, event: dict) -> None:
        self._finish_infer("failed")

    def _end(self, event: dict) -> None:
        env = event["envelope"]
        self.status = env["status"]
        self.finished = self.clock()
        self.error = env.get("error")
        self.usage = env.get("usage")
        self.stats = event.get("stats")
        if "result" in env:
            self.result, self.has_result = env["result"], True
        if self.status == "completed" and self.fraction is not None:
            self.fraction = 1.0
        self.paused = False
        self.dirty.update(SECTIONS)

    #: ``job.interrupted`` is made by ``show.Playback`` for a transcript that stops before the job's end.
    _on_job_completed = _on_job_failed = _on_job_cancelled = _on_job_interrupted = _end

    def _on_job_created(self, event: dict) -> None:
        if isinstance(event.get("debug"), dict):
            self.debugging = True
            self.dirty.add("debug")

    def _on_job_paused(self, event: dict) -> None:
        """A debugger paused the job (``host/debugger.py``). Every field is checked and bounded again here: a
        transcript shown later is a file anyone may have written."""
        def count(key: str) -> int | None:
            value = event.get(key)
            return value if _count(value) else None

        handles = event.get("handles")
        handles = handles if isinstance(handles, list) else []
        error = event.get("error") if isinstance(event.get("error"), dict) else None
        self.debugging = self.paused = True
        self.debug = {
            "pause": count("pause"), "step": count("step"),
            "reason": str(event.get("reason"))[:40], "until": str(event["until"])[:40] if event.get("until") else None,
            "command": bounded(event.get("command")), "last_command": bounded(event.get("last_command")),
            "last_event": bounded(event.get("last_event")),
            "error": {"code": str(error.get("code"))[:200], "message": str(error.get("message"))[:2000]} if error
            else None,
            "handles": [(h.get("handle"), str(h.get("path"))[:512], h.get("len"), str(h.get("kind"))[:40])
                        for h in handles[:MAX_DEBUG_HANDLES] if isinstance(h, dict) and _count(h.get("handle"))
                        and _count(h.get("len"))],
            "open_handles": count("open_handles"),
            "memory_bytes": count("memory_bytes"), "peak_memory_bytes": count("peak_memory_bytes"),
        }
        self.dirty.update(("debug", "header"))

    def _on_job_resumed(self, event: dict) -> None:
        self.paused = False
        self.dirty.update(("debug", "header"))

    def _on_job_replay_diverged(self, event: dict) -> None:
        """A replay met a command its recording lacks (``history/replay.py``): one log line."""
        self.log.append(divergence_line(event))
        self.dirty.add("log")


def progress_fraction(payload: Any) -> float | None:
    """The fraction an ``emit`` payload reports, or None if it is not progress."""
    if not isinstance(payload, dict):
        return None
    done, total, fraction = payload.get("done"), payload.get("total"), payload.get("fraction")
    try:
        if _number(done) and _number(total) and total > 0:
            value = float(done) / float(total)
        elif _number(fraction):
            value = float(fraction)
        else:
            return None
    except (OverflowError, ValueError):  # numbers too large for a float
        return None
    return max(0.0, min(1.0, value)) if math.isfinite(value) else None


def _count(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


#: A preview cut short is cut back to a line break at most this far from its end, else to a space at most
#: ``MAX_WORD_BACKTRACK`` from it.
MAX_LINE_BACKTRACK = 40
MAX_WORD_BACKTRACK = 120


def cut_at_boundary(text: str) -> str:
    """A preview the host cut short, ended at a line break or else a word break near its end and marked
    ``…``, so it never stops in the middle of a word."""
    for mark, reach in (("\n", MAX_LINE_BACKTRACK), (" ", MAX_WORD_BACKTRACK)):
        at = text.rfind(mark, max(0, len(text) - reach))
        if at > 0:
            return text[:at + 1] + "…"
    return text + "…"


def progress_label(payload: dict) -> str:
    if "done" in payload and "total" in payload:
        return f"{payload['done']} / {payload['total']}"
    return f"{100 * float(payload['fraction']):.0f}%"


__all__ = [
    "MAX_LOG_LINES", "MAX_LOG_LINE_CHARS", "MAX_TEXT_CHARS", "MAX_RANGES", "PNG_MAGIC", "MAX_THUMBNAIL_BYTES",
    "SECTIONS", "MAX_DEBUG_HANDLES", "FileState", "MAX_TREE_TEXT_CHARS", "InferState", "ViewState",
    "progress_fraction", "MAX_LINE_BACKTRACK", "MAX_WORD_BACKTRACK", "cut_at_boundary", "progress_label"
]

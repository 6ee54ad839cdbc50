"""Reading a transcript back: its version, its events, its end, and the commands it records.

A run folder holds ``events.jsonl`` (one event a line, each written before
it was published) and ``envelope.json``. This is the one reader that every
consumer shares -- ``history.py`` (listing), ``show.py`` (playing a run
again), ``replay.py`` and ``diff.py`` (its commands):

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
  terminal event's ``ended_during`` says.

Problems are ``TranscriptError``: one line naming the folder and what is
wrong with it, for the command line and the magics to print as they are.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import orjson

from .abi import dumps
from .events import TERMINAL_TYPES, TRANSCRIPT_VERSION
from .text import for_terminal

EVENTS_FILE = "events.jsonl"
ENVELOPE_FILE = "envelope.json"
#: Bytes of the first line (``job.created``) a listing reads at most; a job
#: whose input is larger is listed without its name.
HEADER_MAX_BYTES = 1024 * 1024
#: Bytes of ``envelope.json`` read at most (the result is at most 1 MiB by default).
ENVELOPE_MAX_BYTES = 64 * 1024 * 1024
#: A listing parses envelopes up to this size whole; of a larger one (a large
#: result) it reads only the head (the status) and the tail (the usage, last).
ENVELOPE_SUMMARY_BYTES = 64 * 1024

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


def check_version(created: dict, run_dir: Path) -> int:
    """The transcript's format version; ``TranscriptError`` if this host does not know it."""
    version = created.get("transcript_version", 0)
    if not isinstance(version, int) or isinstance(version, bool) or not 0 <= version <= TRANSCRIPT_VERSION:
        shown = for_terminal(dumps(version), one_line=True)[:40]
        raise TranscriptError(f"{_where(run_dir)}: transcript format version {shown} is not one this tensorjob "
                              f"reads (0 to {TRANSCRIPT_VERSION}); it was written by a newer tensorjob-jupyter, "
                              f"or it is not a tensorjob transcript")
    return version


def _created(line: bytes, run_dir: Path) -> dict:
    try:
        event = orjson.loads(line)
    except orjson.JSONDecodeError:
        raise TranscriptError(f"{_where(run_dir)}: the first line of {EVENTS_FILE} is not JSON") from None
    if not isinstance(event, dict) or event.get("type") != "job.created" or event.get("sequence_number") != 0:
        raise TranscriptError(f"{_where(run_dir)}: {EVENTS_FILE} does not start with job.created; "
                              f"not a tensorjob transcript")
    return event


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
            data = f.read(ENVELOPE_MAX_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise TranscriptError(f"{_where(run_dir)}: cannot read {ENVELOPE_FILE}: {e.strerror}") from None
    try:
        envelope = orjson.loads(data) if len(data) <= ENVELOPE_MAX_BYTES else None
    except orjson.JSONDecodeError:
        envelope = None
    if not isinstance(envelope, dict) or not isinstance(envelope.get("status"), str):
        raise TranscriptError(f"{_where(run_dir)}: {ENVELOPE_FILE} is damaged")
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
    if not head.startswith(b'{"status":') or not isinstance(status, str) or not isinstance(usage, dict):
        raise TranscriptError(f"{_where(run_dir)}: {ENVELOPE_FILE} is damaged")
    return {"status": status, "usage": usage}


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
    created = _created(line, run_dir) if line is not None else None
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
            pending: bytes | None = None
            for line in f:
                if pending is not None:
                    yield self._event(pending, last=False)
                pending = line
            if pending is not None:
                if not pending.endswith(b"\n"):
                    self.torn = True  # a write that never finished: the run was interrupted
                else:
                    yield self._event(pending, last=True)
        if self.count == 0 and not self.torn:
            raise TranscriptError(f"{_where(self.run_dir)}: {EVENTS_FILE} is empty")

    def _event(self, line: bytes, *, last: bool) -> dict:
        n = self.count
        if n == 0:
            self.created = _created(line, self.run_dir)
            self.version = check_version(self.created, self.run_dir)
            event = self.created
        else:
            try:
                event = orjson.loads(line)
            except orjson.JSONDecodeError:
                raise TranscriptError(f"{_where(self.run_dir)}: line {n + 1} of {EVENTS_FILE} is not JSON; "
                                      f"the transcript is damaged") from None
            if not isinstance(event, dict) or event.get("sequence_number") != n or not isinstance(
                    event.get("type"), str):
                raise TranscriptError(f"{_where(self.run_dir)}: line {n + 1} of {EVENTS_FILE} is not event {n}; "
                                      f"the transcript is damaged")
        if self.terminal is not None:
            raise TranscriptError(f"{_where(self.run_dir)}: events follow the job's end at line {n + 1}")
        if event["type"] in TERMINAL_TYPES:
            self.terminal = event
        self.count += 1
        return event


# --- the commands a run records ------------------------------------------------------------------


@dataclass
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


@dataclass
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
    if kind == "job.progress":
        return {"cmd": "emit", "progress": event.get("progress")}, {}
    if kind == "job.file.opened":
        return {"cmd": "open", "path": event.get("path")}, _pick(event, "handle", "len", "kind")
    if kind == "job.file.sliced":
        binary = bool(event.get("binary"))
        command = {"cmd": "slice_bytes" if binary else "slice", "handle": event.get("handle"),
                   "offset": event.get("offset"), "len": event.get("requested")}
        return command, _pick(event, "length", "next_offset", "preview_base64" if binary else "preview")
    if kind == "job.embedded":
        return ({"cmd": "embed", "texts_sha256": event.get("text_sha256")},
                {"vectors": event.get("vectors")} if "vectors" in event else {})
    if kind == "job.document.page":
        command = {"cmd": event.get("command"), "handle": event.get("handle")}
        if event.get("page") is not None:
            command["page"] = event["page"]
        outcome = _pick(event, "chars", "error", "preview") if event.get("command") != "page_image" else {}
        return command, outcome
    if kind == "job.image.created":  # image_op's (page_image's follows its job.document.page)
        return ({"cmd": "image_op", "handle": event.get("source"), "op": event.get("op")},
                _pick(event, "handle"))
    if kind == "job.fetch":
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
        reader = EventReader(run_dir)
        steps: list[Step] = []
        end: End | None = None
        chunks = chunk_bytes = 0
        answer: InferAnswer | None = None
        for event in reader:
            try:
                answer, end, chunks, chunk_bytes = _fold(event, steps, answer, end, chunks, chunk_bytes)
            except (AttributeError, KeyError, TypeError, ValueError):
                raise TranscriptError(f"{_where(reader.run_dir)}: event {event.get('sequence_number')} "
                                      f"({for_terminal(str(event.get('type')), one_line=True)[:60]}) is malformed; "
                                      f"the transcript is damaged") from None
        assert reader.created is not None
        if end is None:
            envelope = read_envelope(reader.run_dir)  # a run that ended without its terminal event (rare)
            if envelope is not None:
                end = End(envelope["status"], envelope, None, None)
        return cls(reader.run_dir, reader.created, reader.version, steps, end, reader.torn, chunks, chunk_bytes)

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


def _fold(event: dict, steps: list[Step], answer: "InferAnswer | None", end: "End | None", chunks: int,
          chunk_bytes: int):
    """Fold one event into the steps being built; returns the new (answer, end, chunks, chunk_bytes)."""
    kind = event["type"]
    if kind == "job.created":
        return answer, end, chunks, chunk_bytes
    if kind in TERMINAL_TYPES:
        envelope = event.get("envelope") if isinstance(event.get("envelope"), dict) else {}
        end = End(kind.split(".", 1)[1], envelope, event.get("ended_during"), event.get("stats"))
    elif kind == "job.chunk":
        chunks += 1
        chunk_bytes += len(event.get("bytes_base64") or "") * 3 // 4
    elif kind == "response.created":
        response = event.get("response") or {}
        answer = InferAnswer(max_output_tokens=response.get("max_output_tokens"),
                             model=str(response.get("model") or ""))
        command = event.get("command") if isinstance(event.get("command"), dict) else {"cmd": "infer"}
        steps.append(Step(len(steps) + 1, normalise(command), {}, answer))
    elif kind.startswith("response.") or kind == "error":
        if answer is not None:
            _fold_answer(answer, event)
    elif (kind == "job.image.created" and "op" not in event and steps
          and steps[-1].command.get("cmd") == "page_image" and "handle" not in steps[-1].outcome):
        steps[-1].outcome["handle"] = event.get("handle")
    else:
        found = _step_of(event)
        if found is not None:
            steps.append(Step(len(steps) + 1, normalise(found[0]), found[1]))
    return answer, end, chunks, chunk_bytes


def _fold_answer(answer: InferAnswer, event: dict) -> None:
    kind = event["type"]
    if kind == "response.output_text.delta":
        answer.pieces.append(str(event.get("delta", "")))
    elif kind in ("response.completed", "response.incomplete"):
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
    elif kind == "error":
        answer.error = event.get("error") or {  # flat since the events follow the openai SDK
            "code": event.get("code"), "message": event.get("message"), "type": event.get("error_type")}
    elif kind == "response.failed":
        answer.status = "failed"
        if answer.error is None:
            answer.error = (event.get("response") or {}).get("error")


# --- saying what a command is ---------------------------------------------------------------------

DESCRIBE_CHARS = 80


def _quote(text: Any, limit: int = DESCRIBE_CHARS) -> str:
    text = str(text)
    clipped = text if len(text) <= limit else text[:limit] + "…"
    return '"' + for_terminal(clipped, one_line=True) + '"'


def describe(command: dict | None) -> str:
    """One inert line saying what a command asked for."""
    if command is None:
        return "nothing"
    cmd = command.get("cmd")
    if cmd == "infer":
        prompt = str(command.get("prompt", ""))
        images = f", {len(command['images'])} images" if command.get("images") else ""
        return f"infer of at most {command.get('max_tokens')} tokens{images}, prompt {_quote(prompt)} " \
               f"({len(prompt)} characters)"
    if cmd in ("slice", "slice_bytes"):
        return f"{cmd} #{command.get('handle')} from byte {command.get('offset')} ({command.get('len')} bytes)"
    if cmd in ("open", "fetch"):
        return f"{cmd} {_quote(command.get('path', command.get('url')))}"
    if cmd == "embed":
        return f"embed of {len(command.get('texts_sha256') or [])} texts"
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
        if list(recorded.get("images") or []) != list(asked.get("images") or []):
            return "other images", describe(recorded), describe(asked)
        if max_tokens and recorded.get("max_tokens") != asked.get("max_tokens"):
            return "another token limit", describe(recorded), describe(asked)
        return None
    if recorded == asked:
        return None
    why = {"slice": "another window", "slice_bytes": "another window", "open": "another file",
           "fetch": "another URL", "emit": "other progress", "embed": "other texts"}.get(cmd, "other arguments")
    return why, describe(recorded), describe(asked)

"""The commands a transcript records: each command with the host's answer, and how the run ended.

``Recording.read(dir)`` folds a run's checked events (``transcript``) into
its command sequence, each command with the host's recorded answer (an
infer's tokens, text and usage; a window's next offset and preview; ...),
and how the run ended. Events map back to commands one to one (the
documentation's "Transcripts"); a command whose carrying-out failed left no
event of its own, which is what the terminal event's ``ended_during`` says.
``StepReader(dir)`` hands the same steps out one at a time, never all held
(what ``diff`` walks). ``describe`` and ``compare_commands`` say what a
command is and where two differ, in one inert line: what replay and diff
print.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np


from tensorjob_jupyter.abi import TERMINAL_EVENT_TYPES, dumps, event_types
from tensorjob_jupyter.record.event_checks import TranscriptError, shown_run
from tensorjob_jupyter.record.transcript import EventReader, read_envelope
from tensorjob_jupyter.text import for_terminal

#: Commands the host carries out itself (read live in a replay), and those the model answers.
LIVE_COMMANDS = frozenset({"emit", "open", "slice", "slice_bytes", "page_text", "page_text_opt", "document_text",
                           "page_image", "image_op", "fetch"})
MODEL_COMMANDS = frozenset({"infer", "embed"})
#: Every command a guest can return: those a step records, and the two that end a job.
COMMANDS = LIVE_COMMANDS | MODEL_COMMANDS | {"done", "fail"}


# --- the commands a run records ------------------------------------------------------------------


@dataclass(slots=True)
class InferAnswer:
    """What the model answered to one infer, as recorded."""

    max_output_tokens: int | None = None
    model: str = ""
    pieces: list[str] = field(default_factory=list)
    #: Each piece's token records as its delta gave them (``logprobs``: untrusted JSON, read by the replay;
    #: None where a delta gave none). As long as ``pieces``, or empty (a function call's raw pieces).
    piece_logprobs: list[Any] = field(default_factory=list)
    #: completed | incomplete | failed; None when the transcript ends inside the answer.
    status: str | None = None
    #: Why it ended, in the events' ``finish_reason`` words: stop, length, guest_stop or cancelled.
    reason: str | None = None
    text: str | None = None
    usage: dict | None = None
    timing: dict | None = None
    guest_stopped_after: int | None = None
    error: dict | None = None
    call_id: str | None = None  # a function call's id, which the guest saw

    def _usage(self, key: str, within: str | None = None) -> int:
        usage = self.usage if isinstance(self.usage, dict) else {}
        if within is not None:
            inner = usage.get(within)
            usage = inner if isinstance(inner, dict) else {}
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
        vectors = event.get("vectors")
        # kept as arrays: 8 bytes a number, where parsed JSON floats cost about 32 (a replay holds them all)
        outcome = {"vectors": [np.asarray(v, dtype=np.float64) for v in vectors]} if isinstance(vectors, list) else {}
        return {"cmd": "embed", "texts_sha256": event.get("text_sha256")}, outcome
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
        """The model the run used: its envelope's (a served model is named once its server has been asked,
        after ``job.created``), else the one ``job.created`` names."""
        used = ((self.envelope or {}).get("usage") or {}).get("model")
        return used if isinstance(used, str) and used else self.created.get("model")

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
                raise TranscriptError(f"{shown_run(self.events.run_dir)}: event {event.get('sequence_number')} "
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
            envelope = event.get("envelope")
            envelope = envelope if isinstance(envelope, dict) else {}
            self.end = End(kind.split(".", 1)[1], envelope, event.get("ended_during"), event.get("stats"))
        elif kind == event_types.JOB_CHUNK:
            self.chunks += 1
            self.chunk_bytes += len(event.get("bytes_base64") or "") * 3 // 4
        elif kind == event_types.RESPONSE_CREATED:
            response = event.get("response") or {}
            answer = InferAnswer(max_output_tokens=response.get("max_output_tokens"),
                                 model=str(response.get("model") or ""))
            command = event.get("command")
            command = command if isinstance(command, dict) else {"cmd": "infer"}
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
        logprobs = event.get("logprobs")
        answer.piece_logprobs.append(logprobs if isinstance(logprobs, list) and logprobs else None)
    elif kind == event_types.RESPONSE_OUTPUT_ITEM_ADDED:
        item = event.get("item")
        item = item if isinstance(item, dict) else {}
        call_id = item.get("call_id")
        if item.get("type") == "function_call" and isinstance(call_id, str) and len(call_id) <= 128:
            answer.call_id = call_id
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
        raw = event.get("raw_pieces")  # a function call's model text, which no text delta carries
        if isinstance(raw, list) and all(isinstance(x, str) for x in raw):
            answer.pieces = list(raw)
            answer.piece_logprobs = []
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


def _json(value: Any) -> str:
    return "absent" if value is None else dumps(value)


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
        for key in sorted((set(recorded) | set(asked)) - {"cmd", "prompt", "images", "max_tokens"}):
            if recorded.get(key) != asked.get(key):  # a format, tools or sampling of the infer's own
                return (f"another {key.replace('_', ' ')}", f"infer, {key} {_quote(_json(recorded.get(key)), 200)}",
                        f"infer, {key} {_quote(_json(asked.get(key)), 200)}")
        return None
    if recorded == asked:
        return None
    why = {"slice": "another window", "slice_bytes": "another window", "open": "another file",
           "fetch": "another URL", "emit": "other progress", "embed": "other texts"}.get(cmd, "other arguments")
    return why, describe(recorded), describe(asked)


__all__ = [
    "LIVE_COMMANDS", "MODEL_COMMANDS", "COMMANDS", "InferAnswer", "Step", "End", "normalise", "Recording",
    "StepReader", "DESCRIBE_CHARS", "DESCRIBE_LINE_CHARS", "describe", "first_difference", "compare_commands"
]

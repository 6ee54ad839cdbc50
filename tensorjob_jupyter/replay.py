"""Replay: run a guest again against a recorded run's world, with no model.

``ReplayJob(guest, run)`` (``tj.replay``, ``tensorjob replay GUEST --from
RUN``, ``%tensorjob replay``) is a ``Job`` whose reactor, ``ReplayReactor``,
walks the recording's steps (``transcript.Recording``) beside the guest --
the same guest or a changed one. Each command the guest returns is compared
with the recorded command of the same step *before* anything is done:

* ``infer`` is answered from the recording, token by token through the
  guest's ``cf_on_token``, on the job's own thread: no model is loaded and no
  worker thread runs. The answer is published as the same Open Responses
  events and counted in the same usage, so the replay's own transcript, view
  and envelope look like a live run's. A guest that stops generation at the
  recorded token gets the recorded text; one that stops *sooner* gets the
  recorded tokens up to its stop (the model's greedy output has that prefix;
  ``tokens_out`` then counts the pieces it was given).
* ``embed`` gets the recorded vectors.
* ``open``, ``slice``, the document and image commands, ``fetch`` and
  ``emit`` are carried out live, under the run's grants and limits (files
  are read again), and what they answer is compared with what was recorded,
  so a file that changed since is noticed where it is read.

The first command the recording cannot answer -- another command, another
prompt, another window, more tokens than were recorded, a different
answer from a file, or a step past the recording's end -- is the
*divergence*. The replay stops there with ``replay_divergence`` (one line:
the step, what was recorded, what the guest asked) and publishes
``job.replay.diverged``; with ``live=True`` (``--live``) the model answers
from that step on instead. A guest that finishes (``done``/``fail``) where the
run went on is noted as a divergence too, but its result stands.

Where the recording ends because the host stopped the run -- cancelled, timed
out, the model failed -- the replay ends the same way at the same step (the
error's message says "as recorded"), so a cancelled run replays as one.

What a replay takes from the recording, unless given again: the input, the
grants (``read``, with the job's directory), the fetch prefixes, the limits
and the sampler. What it cannot: the bytes staged for ``read-input``
(``--input-file``) are recorded only as their length and SHA-256, so they
must be given again, and must match; the wasm itself (the guest is named
again, and may differ). Transcripts older than format version 1 record no
prompts and cannot be replayed (``tensorjob show`` still shows them).
"""

from __future__ import annotations

import base64
import hashlib
import os
import queue
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Iterable

from . import abi
from .abi import Envelope, codes
from .caps import AccessError
from .guest import GuestTrap
from .inference.base import (Backend, GenerateRequest, LoraChoice, ModelError, QueueFull, Sampler)
from .jobs import Job
from .limits import FIELDS as LIMIT_FIELDS
from .limits import Limits
from .responses import ResponseStream
from .runner import POLL_S, PREVIEW_BYTES, PREVIEW_CHARS, InferOptions, JobEnd, Reactor
from .text import for_terminal
from .transcript import (LIVE_COMMANDS, End, InferAnswer, Recording, Step, TranscriptError, compare_commands,
                         describe, normalise)

#: How a recorded run can end that a replay reproduces at the same step rather than carry out:
#: the host stopped it (a cancel, its time limit, the model or the host failing).
HOST_ENDS = frozenset({codes.CANCELLED, codes.TIMEOUT, codes.BUSY, codes.MODEL_LOAD_FAILED, codes.INTERNAL_ERROR,
                       codes.WORKER_LOST})
#: Characters of a divergence line a view keeps.
MAX_LINE_CHARS = 1000
_END = object()


class ReplayError(ValueError):
    """A replay that cannot start: its run cannot be replayed, or what it needs was not given (one line)."""


@dataclass(frozen=True)
class Divergence:
    """The first place a replay left its recording."""

    step: int  # 1-based: the guest's first command is step 1
    why: str
    recorded: str  # one inert line each
    asked: str
    kind: str = "command"  # command: the guest asked otherwise; answer: the world answered otherwise; end

    def message(self) -> str:
        verb = "now" if self.kind == "answer" else "the guest asked"
        return f"replay diverged at step {self.step} ({self.why}): the run recorded {self.recorded}; {verb} {self.asked}"

    def to_json(self) -> dict:
        return {"step": self.step, "why": self.why, "recorded": self.recorded, "asked": self.asked,
                "kind": self.kind}

    @classmethod
    def from_json(cls, obj: dict) -> "Divergence":
        return cls(int(obj["step"]), str(obj["why"]), str(obj["recorded"]), str(obj["asked"]),
                   str(obj.get("kind", "command")))


def divergence_line(event: dict) -> str:
    """A ``job.replay.diverged`` event as one inert line (the view's log, the terminal)."""
    try:
        text = Divergence.from_json(event).message()
    except (KeyError, TypeError, ValueError):
        text = "replay diverged"
    then = event.get("then")
    if then == "live":
        text += " -- the model answers from here (live)"
    elif then == "finished":
        text += " -- the guest finished there"
    text = for_terminal(text, one_line=True)
    return text if len(text) <= MAX_LINE_CHARS else text[:MAX_LINE_CHARS] + "…"


class RecordedModel:
    """The backend of a replay that is not live: the recorded model's name, and no model at all."""

    def __init__(self, name: str):
        self._name = name

    @property
    def model_name(self) -> str:
        return self._name

    def generate_stream(self, request, on_token) -> Future:
        raise ModelError("a replay has no model; answers come from the recording (--live falls back to the model)")

    def embed(self, texts) -> Future:
        raise ModelError("a replay has no model; answers come from the recording (--live falls back to the model)")


# --- what a replay takes from its recording --------------------------------------------------------

_RECORDED: Any = type("Recorded", (), {"__repr__": lambda self: "RECORDED"})()
#: A keyword left as ``RECORDED`` takes the recorded run's value.
RECORDED = _RECORDED


def load_recording(run: Any, runs: str | os.PathLike | None = None) -> Recording:
    """The recording of ``run`` (an id, a path, a ``Job`` or a ``Recording``), ready to replay."""
    if isinstance(run, Recording):
        recording = run
    else:
        from .history import resolve_run

        recording = Recording.read(resolve_run(run, runs))
    if recording.version < 1:
        raise ReplayError(f"{for_terminal(recording.id, one_line=True)}: its transcript predates format version 1 "
                          f"and records no prompts, so it cannot be replayed (tensorjob show still shows it)")
    try:  # a transcript is a file from anywhere: check the setup replay reads from it, once
        recorded_limits(recording)
        recorded_infer_options(recording)
        created = recording.created
        for key in ("read", "grants", "fetch"):
            if not all(isinstance(x, str) for x in created.get(key) or []):
                raise ValueError(f"{key} is not a list of strings")
        if not isinstance(created.get("input_bytes") or {}, dict):
            raise ValueError("input_bytes is not an object")
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise ReplayError(f"{for_terminal(recording.id, one_line=True)}: its job.created cannot be replayed: "
                          f"{for_terminal(str(e), one_line=True)[:200]}") from None
    return recording


def recorded_limits(recording: Recording) -> Limits:
    values = recording.created.get("limits") or {}
    return Limits(**{k: v for k, v in values.items() if k in LIMIT_FIELDS})


def recorded_infer_options(recording: Recording) -> InferOptions:
    obj = recording.created.get("infer") or {}
    sampler = dict(obj.get("sampler") or {})
    sampler["stop"] = tuple(sampler.get("stop") or ())
    known = {k: v for k, v in sampler.items() if k in Sampler.__dataclass_fields__}
    return InferOptions(sampler=Sampler(**known), cache_prompt=bool(obj.get("cache_prompt", True)),
                        lora=tuple(LoraChoice(str(c["name"]), float(c.get("scale", 1.0)))
                                   for c in obj.get("lora") or ()),
                        chat=obj.get("chat") if isinstance(obj.get("chat"), bool) else None)


def recorded_read(recording: Recording) -> list[str]:
    """The grants as the run was given them (all their names), else its canonical roots."""
    created = recording.created
    return list(created.get("read") or created.get("grants") or [])


def recorded_cwd(recording: Recording) -> str | None:
    """The run's directory (guest paths are relative to it), if it exists here."""
    cwd = recording.created.get("cwd")
    return cwd if isinstance(cwd, str) and os.path.isdir(cwd) else None


def _sampling(options: InferOptions) -> dict:
    return {"sampler": options.sampler.to_json(), "chat": options.chat,
            "lora": [{"name": c.name, "scale": c.scale} for c in options.lora]}


#: The job options that change how the model is asked (given anew, they replace the run's own).
SAMPLING_OPTIONS = frozenset({"temperature", "top_p", "repeat_penalty", "seed", "chat", "lora", "no_prompt_cache"})


def options_for(recording: Recording, args: Any, *, defaults: Any = None,
                variables: Any = None) -> tuple[dict, Any]:
    """``ReplayJob`` keywords (and the ``JobOptions`` they came from) from parsed job options (``options.add_job_arguments``): the run's own
    setup, with each option given on the command line (or in the magic) in its place."""
    from .options import OPTIONS, JobOptions

    given = {o.name for o in OPTIONS if getattr(args, o.name, None) is not None}
    defaults = defaults or JobOptions()
    read: list[str] = []
    if "read" not in given:
        missing = [g for g in recording.created.get("grants") or [] if not os.path.exists(g)]
        if missing:
            raise ReplayError(f"the run was granted {for_terminal(missing[0], one_line=True)}, which does not exist "
                              f"here; files are read live, so give the grants again with --read")
        read = [r for r in recorded_read(recording) if os.path.exists(r)]
    infer = recorded_infer_options(recording)
    base = JobOptions(read=tuple(read), fetch=tuple(recording.created.get("fetch") or ()),
                      input=recording.created.get("input"), limits=recorded_limits(recording),
                      chat=infer.chat, temperature=infer.sampler.temperature, top_p=infer.sampler.top_p,
                      repeat_penalty=infer.sampler.repeat_penalty, seed=infer.sampler.seed,
                      no_prompt_cache=not infer.cache_prompt,
                      runs=defaults.runs, model=defaults.model, cflags=defaults.cflags, zigflags=defaults.zigflags)
    options = JobOptions.from_args(args, defaults=base, variables=variables)
    return {"input": options.input, "read": list(options.read), "fetch": list(options.fetch),
            "limits": options.limits, "runs_dir": options.runs, "model": options.model,
            "infer": options.infer_options() if given & SAMPLING_OPTIONS else RECORDED,
            "debug": options.debug, "break_on": options.break_on,
            "input_bytes": options.input_bytes() if options.input_file is not None else None}, options


# --- the reactor ------------------------------------------------------------------------------------


class ReplayReactor(Reactor):
    """A reactor that answers from a recording (see the module doc); ``live`` falls back to ``backend``."""

    def __init__(self, *, recording: Recording, live: bool, **kwargs: Any):
        super().__init__(**kwargs)
        self.recording = recording
        self.steps = recording.steps
        self.live = live
        self.cursor = 0  # recorded steps answered so far
        self.divergence: Divergence | None = None
        self.then: str | None = None
        self.live_from: int | None = None
        self.reproduced_end = False
        self._past_end_tried = False
        self._recorded_sampling = _sampling(recorded_infer_options(recording))

    # -- the loop ----------------------------------------------------------------------------

    def run(self) -> Envelope:
        envelope = super().run()
        if self.divergence is None and not self.reproduced_end and self.pending_command in ("done", "fail"):
            self._note_finish()
        return envelope

    def _note_finish(self) -> None:
        """The guest finished: a divergence if the run went on, or ended otherwise."""
        step = self.cursor + 1
        asked = "done" if self.pending_command == "done" else "fail"
        end = self.recording.end
        if self.cursor < len(self.steps):
            recorded = describe(self.steps[self.cursor].command)
        elif end is None:
            recorded = "nothing more (the transcript ends before the job's end)"
        elif end.ended_during == self.pending_command:
            return
        else:
            recorded = _end_text(end)
        self.divergence = Divergence(step, "the guest finished", recorded, asked)
        self._publish("finished")

    def _publish(self, then: str) -> None:
        self.then = then
        try:
            self.stream.publish("job.replay.diverged", **self.divergence.to_json(), then=then)
        except Exception:  # noqa: BLE001 - the envelope still says it
            pass

    def _diverge(self, divergence: Divergence, command: abi.Command | None) -> abi.Event | None:
        """Record the divergence; stop the job, or (live) let the host and the model carry on from here."""
        self.divergence = divergence
        if not self.live:
            self._publish("stopped")
            raise JobEnd(codes.REPLAY_DIVERGENCE, divergence.message())
        self.live_from = divergence.step
        self._publish("live")
        return super()._execute(command) if command is not None else None

    # -- commands ------------------------------------------------------------------------------

    def _execute(self, command: abi.Command) -> abi.Event:
        if self.live_from is not None:
            return super()._execute(command)
        asked = normalise(command.to_json())
        if self.cursor >= len(self.steps):
            return self._past_the_end(command, asked)
        step = self.steps[self.cursor]
        differs = compare_commands(step.command, asked, max_tokens=False)
        if differs is not None:
            return self._diverge(Divergence(step.number, *differs), command)
        if isinstance(command, abi.Infer):
            return self._replay_infer(command, step)
        if isinstance(command, abi.Embed):
            return self._replay_embed(command, step)
        self.cursor += 1
        try:
            event = super()._execute(command)
        except (JobEnd, AccessError) as e:
            if e.code in (codes.CANCELLED, codes.TIMEOUT) or self.live:
                raise
            self._diverge(Divergence(step.number, "the world changed", f"{describe(step.command)} answered",
                                     f"{e.code}: {e.message}", "answer"), None)
            raise  # pragma: no cover - _diverge raised
        changed = _compare_outcome(step, event)
        if changed is not None:
            self._diverge(Divergence(step.number, "the world changed", *changed, "answer"), None)
        return event

    def _past_the_end(self, command: abi.Command, asked: dict) -> abi.Event:
        """A command past the last recorded step: the run's end answers it, or it is a divergence."""
        step = self.cursor + 1
        end = self.recording.end
        if end is None:
            torn = "; its last line was torn" if self.recording.torn else ""
            return self._diverge(Divergence(step, "the transcript ends here", f"nothing more (the run was "
                                            f"interrupted before its end{torn})", describe(asked), "end"), command)
        if end.status == "completed":
            return self._diverge(Divergence(step, "another command", "done (the run completed)", describe(asked)),
                                 command)
        code = (end.error or {}).get("code")
        first = not self._past_end_tried
        self._past_end_tried = True
        if first and end.ended_during in (None, command.cmd) and (end.status == "cancelled" or code in HOST_ENDS):
            self._reproduce_end(end)
        live_kind = command.cmd in LIVE_COMMANDS or (isinstance(command, abi.Infer) and command.images)
        if first and live_kind and end.ended_during == command.cmd:
            return super()._execute(command)  # the run failed carrying this out: see that it fails again
        return self._diverge(Divergence(step, "the recording ends here", _end_text(end), describe(asked), "end"),
                             command)

    def _reproduce_end(self, end: End) -> None:
        """End the replay as the recorded run ended here (its error and its usage)."""
        self.reproduced_end = True
        error = end.error or {"code": codes.CANCELLED, "message": "job cancelled"}
        usage = end.envelope.get("usage") if isinstance(end.envelope.get("usage"), dict) else {}
        for key in ("tokens_in", "tokens_out"):
            value = usage.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                setattr(self.usage, key, value)
        raise JobEnd(str(error.get("code")), f"{error.get('message')} (as recorded)")

    # -- infer from the recording ---------------------------------------------------------------

    def _replay_infer(self, cmd: abi.Infer, step: Step) -> abi.Event:
        answer = step.infer or InferAnswer()
        sampling = _sampling(self.infer_options)
        if sampling != self._recorded_sampling:
            return self._diverge(Divergence(step.number, "other sampling settings",
                                            _json_line(self._recorded_sampling), _json_line(sampling)), cmd)
        remaining = self.limits.max_tokens - self.usage.tokens_out
        if remaining <= 0:
            raise JobEnd(codes.LIMIT_EXCEEDED,
                         f"the job's token budget of {self.limits.max_tokens} tokens is spent (max_tokens)")
        max_tokens = min(cmd.max_tokens, remaining)
        if not _same_budget(answer, max_tokens):
            return self._diverge(Divergence(step.number, "another token limit",
                                            f"infer of at most {answer.max_output_tokens} tokens "
                                            f"({_answer_text(answer)})", f"infer of at most {max_tokens} tokens"), cmd)
        self.cursor += 1
        opts = self.infer_options
        response = ResponseStream(self.stream, model=answer.model or self.usage.model, max_output_tokens=max_tokens,
                                  temperature=opts.sampler.temperature, top_p=opts.sampler.top_p,
                                  index=self.stats.infers)
        self.stats.infers += 1
        response.start(command=cmd.to_json())
        pieces = answer.pieces
        recorded_stop = answer.guest_stopped_after if answer.reason == "guest_stop" else None
        stopped_after: int | None = None
        for i, piece in enumerate(pieces):
            try:
                self._check_running()
            except JobEnd as e:
                self._count(answer.tokens_in, len(response.text_parts))
                self._close_early(response, e)
                raise
            response.delta(piece)
            if stopped_after is None:
                try:
                    keep = self.guest.on_token(piece)
                except GuestTrap as e:
                    self._count(answer.tokens_in, i + 1)
                    response.fail(e.message, code=e.code, error_type="server_error")
                    raise
                if not keep:
                    stopped_after = i + 1
                    if stopped_after != recorded_stop:
                        break  # sooner than the recorded guest: the answer ends with this token
        if stopped_after is not None and stopped_after != recorded_stop:
            text = "".join(pieces[:stopped_after])
            self._count(answer.tokens_in, stopped_after)
            response.finish(text, usage=response.usage_json(answer.tokens_in, stopped_after, answer.cached_tokens),
                            reason="guest_stop", extra={"timing": None, "guest_stopped_after": stopped_after})
            return abi.InferDone(text, stopped_after)
        if recorded_stop is not None and stopped_after is None:
            divergence = Divergence(step.number, "more tokens than were recorded",
                                    f"an answer the guest stopped after {recorded_stop} tokens",
                                    f"more: the guest did not stop after token {recorded_stop}")
            return self._more_than_recorded(cmd, response, answer, max_tokens, divergence)
        if answer.status in ("completed", "incomplete") and answer.reason != "cancelled":
            self._count(answer.tokens_in, answer.tokens_out)
            text = answer.text if answer.text is not None else "".join(pieces)
            response.finish(text, usage=response.usage_json(answer.tokens_in, answer.tokens_out, answer.cached_tokens),
                            reason=answer.reason or "stop",
                            extra={"timing": answer.timing, "guest_stopped_after": stopped_after})
            return abi.InferDone(text, answer.tokens_out)
        if answer.status is None:  # the transcript stops inside this answer
            divergence = Divergence(step.number, "the transcript ends inside this answer",
                                    f"{len(pieces)} tokens and no end", "the rest of the answer", "end")
            return self._more_than_recorded(cmd, response, answer, max_tokens, divergence)
        # The run ended during this answer: cancelled, timed out, or the model failed.
        if answer.reason == "cancelled":
            response.finish("".join(pieces), usage=answer.usage or response.usage_json(answer.tokens_in, len(pieces)),
                            reason="cancelled")
        else:
            error = answer.error or {}
            response.fail(str(error.get("message", "the model failed")), code=error.get("code"),
                          error_type=str(error.get("type", "model_error")))
        end = self.recording.end or End("failed", {"status": "failed", "error": {
            "code": (answer.error or {}).get("code") or codes.CANCELLED,
            "message": (answer.error or {}).get("message") or "cancelled during inference"}}, "infer", None)
        self._reproduce_end(end)
        raise AssertionError("unreachable")  # pragma: no cover

    def _count(self, tokens_in: int, tokens_out: int) -> None:
        self.usage.tokens_in += tokens_in
        self.usage.tokens_out += tokens_out

    @staticmethod
    def _close_early(response: ResponseStream, e: JobEnd) -> None:
        if e.code == codes.CANCELLED:
            response.finish("".join(response.text_parts), usage=response.usage_json(0, len(response.text_parts)),
                            incomplete_reason="cancelled")
        else:
            response.fail(e.message, code=e.code, error_type="server_error")

    def _more_than_recorded(self, cmd: abi.Infer, response: ResponseStream, answer: InferAnswer, max_tokens: int,
                            divergence: Divergence) -> abi.Event:
        """The guest wants more of an answer than the recording holds: stop, or (live) let the model go on.

        The model goes on from the middle of an answer only for a plain infer: a constrained one
        (``format``, ``tools``) or one with its own sampling cannot be continued faithfully, so it stops.
        """
        self.divergence = divergence
        extended = [name for name in abi.INFER_EXTENSIONS if getattr(cmd, name) is not None]
        if self.live and extended:
            divergence = Divergence(divergence.step, divergence.why, divergence.recorded,
                                    f"{divergence.asked}; --live cannot continue an answer with "
                                    f"{', '.join(extended)} from its middle", divergence.kind)
            self.divergence = divergence
        if not self.live or extended:
            self._count(answer.tokens_in, len(response.text_parts))
            response.fail(divergence.message(), code=codes.REPLAY_DIVERGENCE, error_type="server_error")
            self._publish("stopped")
            raise JobEnd(codes.REPLAY_DIVERGENCE, divergence.message())
        self.live_from = divergence.step
        self._publish("live")
        return self._live_rest(cmd, response, max_tokens, skip=len(response.text_parts))

    def _live_rest(self, cmd: abi.Infer, response: ResponseStream, max_tokens: int, *, skip: int) -> abi.Event:
        """Generate the answer with the model and give the guest the pieces after the first ``skip``
        (those it already judged from the recording; greedy decoding repeats them)."""
        opts = self.infer_options
        request = GenerateRequest(cmd.prompt, max_tokens, opts.sampler, opts.cache_prompt, opts.lora, opts.chat)
        pieces: queue.SimpleQueue = queue.SimpleQueue()
        stop = threading.Event()

        def on_token(piece: str) -> bool:  # the model's thread
            pieces.put(piece)
            return not stop.is_set() and not self.cancel.is_set()

        try:
            fut = self._backend().generate_stream(request, on_token)
        except (QueueFull, ModelError) as e:
            code = codes.BUSY if isinstance(e, QueueFull) else codes.MODEL_LOAD_FAILED
            response.fail(str(e), code=code)
            raise JobEnd(code, str(e)) from None
        fut.add_done_callback(lambda _fut: pieces.put(_END))
        seen, stopped_after = 0, None
        try:
            while True:
                try:
                    self._check_running()
                except JobEnd as e:
                    stop.set()
                    fut.cancel()
                    self._close_early(response, e)
                    raise
                try:
                    item = pieces.get(timeout=POLL_S)
                except queue.Empty:
                    continue
                if item is _END:
                    break
                seen += 1
                if seen <= skip:
                    continue
                response.delta(item)
                if stopped_after is None:
                    try:
                        keep = self.guest.on_token(item)
                    except GuestTrap as e:
                        stop.set()
                        response.fail(e.message, code=e.code, error_type="server_error")
                        raise
                    if not keep:
                        stopped_after = len(response.text_parts)
                        stop.set()
        finally:
            stop.set()
        try:
            result = fut.result()
        except Exception as e:  # noqa: BLE001 - ModelError, a cancel, anything the engine raised
            response.fail(str(e), code=codes.MODEL_LOAD_FAILED)
            raise JobEnd(codes.MODEL_LOAD_FAILED, str(e)) from None
        u = result.usage
        self._count(u.prompt_tokens, u.completion_tokens)
        reason = "guest_stop" if stopped_after is not None else (
            "length" if result.finish_reason == "length" else "stop")
        response.finish(result.text, usage=response.usage_json(u.prompt_tokens, u.completion_tokens, u.cached_tokens),
                        reason=reason, extra={"timing": {
                            "time_to_first_token_s": u.time_to_first_token_s,
                            "tokens_per_second": u.tokens_per_second}, "guest_stopped_after": stopped_after})
        return abi.InferDone(result.text, u.completion_tokens)

    # -- embed from the recording -----------------------------------------------------------------

    def _replay_embed(self, cmd: abi.Embed, step: Step) -> abi.Event:
        size = sum(len(t.encode("utf-8")) for t in cmd.texts)
        if len(cmd.texts) > self.limits.max_embed_texts or size > self.limits.max_embed_bytes:
            return super()._embed(cmd)  # the same limit_exceeded as a live run
        vectors = step.outcome.get("vectors")
        if not isinstance(vectors, list):
            return self._diverge(Divergence(step.number, "the recording lacks the vectors", "an embed without its "
                                            "vectors", describe(normalise(cmd.to_json())), "end"), cmd)
        self.cursor += 1
        self.stats.embeds += 1
        self.stream.publish("job.embedded", count=len(vectors), dimensions=len(vectors[0]) if vectors else 0,
                            text_sha256=[hashlib.sha256(t.encode("utf-8")).hexdigest() for t in cmd.texts],
                            vectors=vectors)
        return abi.Embedded(vectors)


def _same_budget(answer: InferAnswer, max_tokens: int) -> bool:
    """Whether an answer recorded under one token limit is the answer under ``max_tokens``:
    the same limit, or an answer the model ended itself well within both."""
    if answer.max_output_tokens == max_tokens:
        return True
    natural = answer.reason in ("stop", "guest_stop")  # the model ended it, or the guest did
    return natural and answer.tokens_out < max_tokens


def _answer_text(answer: InferAnswer) -> str:
    if answer.reason == "stop":
        return f"the model ended its answer after {answer.tokens_out} tokens"
    if answer.reason:
        return f"{answer.tokens_out} tokens, cut by {answer.reason}"
    return f"{len(answer.pieces)} tokens"


def _json_line(value: Any) -> str:
    return for_terminal(abi.dumps(value), one_line=True)[:200]


def _end_text(end: End) -> str:
    error = end.error
    if error:
        return for_terminal(f"the end of the run: {end.status}, {error.get('code')}: {error.get('message')}",
                            one_line=True)[:300]
    return f"the end of the run: {end.status}"


def _outcome_of(event: abi.Event) -> dict:
    """The fields of a live answer that a step's recorded outcome can be checked against."""
    if isinstance(event, abi.Opened):
        return {"handle": event.handle, "len": event.len, "kind": event.kind.to_json()}
    if isinstance(event, abi.Sliced):
        return {"next_offset": event.next_offset, "preview": event.text[:PREVIEW_CHARS]}
    if isinstance(event, abi.SlicedBytes):
        data = base64.b64decode(event.bytes_base64)
        return {"length": len(data), "next_offset": event.next_offset,
                "preview_base64": base64.b64encode(data[:PREVIEW_BYTES]).decode("ascii")}
    if isinstance(event, abi.PageTexted):
        return {"chars": len(event.text), "preview": event.text[:PREVIEW_CHARS]}
    if isinstance(event, abi.PageTextAttempted):
        return {"chars": len(event.text or ""), "error": event.error, "preview": (event.text or "")[:PREVIEW_CHARS]}
    if isinstance(event, abi.PageImaged):
        return {"handle": event.handle}
    return {}


def _compare_outcome(step: Step, event: abi.Event) -> tuple[str, str] | None:
    """(what was recorded, what came now) for the first field of the answer that differs, else None."""
    now = _outcome_of(event)
    for key, value in now.items():
        if key in step.outcome and step.outcome[key] != value:
            before = f"{describe(step.command)} answered with {key} {_json_line(step.outcome[key])[:120]}"
            return before, f"{key} {_json_line(value)[:120]}"
    return None


# --- the job ------------------------------------------------------------------------------------------


class ReplayJob(Job):
    """A job that replays ``guest`` against the recorded run ``run`` (see the module doc).

    Keywords left as ``RECORDED`` take the run's own: ``input``, ``read``,
    ``fetch``, ``infer``, ``limits`` (limit keywords such as ``max_tokens=``
    apply on top) and ``cwd``. ``input_bytes`` must be the bytes the run
    staged (checked by SHA-256). ``live=True`` falls back to a model from the
    first divergence: ``backend``, else ``model`` (a GGUF path), else the
    embedded model -- which must be the recorded one unless ``model`` names
    another.
    """

    def __init__(self, guest: Any, run: Any, *, live: bool = False, input: Any = RECORDED,
                 read: Iterable[str | os.PathLike] | Any = RECORDED, fetch: Iterable[str] | Any = RECORDED,
                 infer: InferOptions | Any = RECORDED, limits: Limits | Any = RECORDED,
                 input_bytes: bytes | None = None, model: str | os.PathLike | None = None,
                 backend: Backend | None = None, runs_dir: str | os.PathLike | None = None,
                 cwd: str | os.PathLike | Any = RECORDED, name: str | None = None, debug: bool = False,
                 break_on: Any = (), **limit_keywords: Any):
        recording = load_recording(run, runs_dir)
        self.recording = recording
        self.live = live
        recorded_bytes = recording.created.get("input_bytes") or {}
        given = b"" if input_bytes is None else bytes(input_bytes)
        if hashlib.sha256(given).hexdigest() != recorded_bytes.get("sha256", hashlib.sha256(b"").hexdigest()):
            if input_bytes is None:
                raise ReplayError(f"the run staged {recorded_bytes.get('bytes')} bytes for read-input (SHA-256 "
                                  f"{str(recorded_bytes.get('sha256'))[:16]}…), which a transcript does not keep: "
                                  f"give them again (--input-file F, input_bytes=)")
            raise ReplayError(f"the bytes given for read-input ({len(given)} bytes) are not the ones the run staged "
                              f"({recorded_bytes.get('bytes')} bytes, SHA-256 {str(recorded_bytes.get('sha256'))[:16]}…)")
        if live:
            if backend is None:
                from .inference.lazy import DEFAULT_MODEL_NAME, model_backend

                if model is None and recording.model not in (None, DEFAULT_MODEL_NAME):
                    raise ReplayError(f"--live: the run used the model {for_terminal(str(recording.model), one_line=True)}; "
                                      f"name its GGUF file with --model PATH")
                backend = model_backend(model)
        else:
            backend = RecordedModel(recording.model or "")
        if limits is RECORDED:
            limits = recorded_limits(recording)
        if cwd is RECORDED:
            cwd = recorded_cwd(recording)
        super().__init__(guest, input=recording.created.get("input") if input is RECORDED else input,
                         read=recorded_read(recording) if read is RECORDED else read,
                         fetch=list(recording.created.get("fetch") or []) if fetch is RECORDED else fetch,
                         infer=recorded_infer_options(recording) if infer is RECORDED else infer,
                         backend=backend, limits=limits, input_bytes=given, runs_dir=runs_dir, cwd=cwd, name=name,
                         debug=debug, break_on=break_on, **limit_keywords)

    def _make_reactor(self, **kwargs: Any) -> Reactor:
        return ReplayReactor(recording=self.recording, live=self.live, **kwargs)

    def _created_fields(self) -> dict:
        return {"replay_of": {"run": self.recording.id, "path": str(self.recording.path),
                              "guest_sha256": self.recording.guest.get("sha256"), "live": self.live}}

    @property
    def guest_changed(self) -> bool:
        return self.guest_sha256 != self.recording.guest.get("sha256")

    @property
    def report(self) -> "ReplayReport | None":
        """How the replay went, once it has ended (None before)."""
        envelope = self.envelope
        if envelope is None:
            return None
        reactor: ReplayReactor = self._reactor  # type: ignore[assignment]
        return ReplayReport(self, envelope, self.recording.envelope, reactor.divergence,
                            reactor.then == "stopped", reactor.live_from, reactor.reproduced_end)


@dataclass
class ReplayReport:
    """A finished replay: its envelope beside the recorded one, and where (if anywhere) it diverged."""

    job: ReplayJob
    envelope: Envelope
    recorded: dict | None  # the recorded run's envelope (None: the run never ended)
    divergence: Divergence | None
    stopped: bool  # the replay stopped at the divergence
    live_from: int | None  # the step from which the model answered (live)
    reproduced_end: bool  # the replay ended as the recorded run did (cancelled, timed out, ...)

    @property
    def result(self) -> Any:
        return self.envelope.result

    @property
    def status(self) -> str:
        return self.envelope.status.value

    @property
    def guest_changed(self) -> bool:
        return self.job.guest_changed

    @property
    def same_result(self) -> bool:
        """The replay ended as the run did: the same status, and the same result or error code."""
        if self.recorded is None:
            return False
        mine = self.envelope.to_json()
        if mine["status"] != self.recorded.get("status"):
            return False
        if mine["status"] == "completed":
            return abi.encode_json(mine.get("result")) == abi.encode_json(self.recorded.get("result"))
        return (mine.get("error") or {}).get("code") == (self.recorded.get("error") or {}).get("code")

    def lines(self) -> list[str]:
        """The replay in a few plain lines, with no ids, paths or timings (deterministic)."""
        if self.stopped and self.divergence is not None:
            return [f"replay: stopped at step {self.divergence.step}, the first command the recording cannot answer"]
        out = []
        if self.recorded is None:
            out.append("replay: the recorded run never ended, so there is no result to compare")
        elif self.same_result:
            out.append("replay: the same result as the recorded run" + (" (its end reproduced from the recording)"
                                                                        if self.reproduced_end else ""))
        else:
            was = self.recorded.get("status")
            out.append(f"replay: the result differs from the recorded run ({was} then, {self.status} now)")
        if self.divergence is not None:
            out.append(for_terminal(self.divergence.message(), one_line=True))
        if self.live_from is not None:
            out.append(f"replay: the model answered from step {self.live_from} on (live)")
        return out

    def to_json(self) -> dict:
        return {"status": self.status, "same_result": self.same_result, "guest_changed": self.guest_changed,
                "divergence": self.divergence.to_json() if self.divergence else None, "stopped": self.stopped,
                "live_from": self.live_from, "reproduced_end": self.reproduced_end, "run": self.job.recording.id,
                "replay": self.job.id, "envelope": self.envelope.to_json(), "recorded": self.recorded}

    def __repr__(self) -> str:
        where = f"diverged at step {self.divergence.step}" if self.divergence else "no divergence"
        same = "the same result" if self.same_result else "a different result"
        return f"<ReplayReport {self.status}, {same}, {where}>"


def replay(guest: Any, run: Any, *, live: bool = False, timeout: float | None = None, **kwargs: Any) -> ReplayReport:
    """Replay ``guest`` against the recorded run ``run`` to the end; see ``ReplayJob`` for the keywords."""
    job = ReplayJob(guest, run, live=live, **kwargs).start()
    try:
        job.wait(timeout)
    except KeyboardInterrupt:
        job.cancel()
        job.wait()
    report = job.report
    assert report is not None
    return report


__all__ = ["RECORDED", "Divergence", "RecordedModel", "ReplayError", "ReplayJob", "ReplayReactor", "ReplayReport",
           "TranscriptError", "load_recording", "replay"]

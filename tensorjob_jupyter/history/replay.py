"""Replay: run a guest again against a recorded run's world, with no model.

``ReplayJob(guest, run)`` (``tj.replay``, ``tensorjob replay``) is a ``Job`` whose commands a ``RecordedWorld``
answers (``host/answerer.py``): each command is compared with the recorded one before anything is done; infers
and embeds are answered from the recording, the rest carried out live and compared -- files are read, and URLs
fetched, only under the grants given to the replay on this machine, never the recorded ones (an open or fetch
they do not cover fails ``capability_denied``, naming the grant it would need). The first command the
recording cannot answer is the divergence: the replay stops there, or with ``--live`` the model takes over. A
transcript is a file from anywhere, so what a replay adopts from it is said first, no grant is taken from it
unasked, and no recorded limit looser than the default is taken.

Design: docs/internals/history.md#replaypy
"""

from __future__ import annotations

import base64
import hashlib
import posixpath
from concurrent.futures import Future
from typing import Any, overload

from tensorjob_jupyter import abi
from tensorjob_jupyter.abi import JobFailure, codes, event_types
from tensorjob_jupyter.world.grants import SHOWN_PATH_CHARS, UNGRANTED, AccessError, shown
from tensorjob_jupyter.inference.base import (
    FINISH_CANCELLED, FINISH_GUEST_STOP, FINISH_LENGTH, FINISH_STOP, Backend, GenerateResult, GenerateUsage, ModelError,
)
from tensorjob_jupyter.host.jobs import Job
from tensorjob_jupyter.host.waiting import wait_or_cancel
from tensorjob_jupyter.history.report import Divergence, ReplayReport
from tensorjob_jupyter.history.replay_setup import (
    RecordedRun, ReplayError, adoption_lines, embedded_model_will_do, live_model_needed, load_run, replay_spec,
    sampling_of,
)
from tensorjob_jupyter.record.responses import ResponseStream
from tensorjob_jupyter.host.reactor import PREVIEW_BYTES, PREVIEW_CHARS, InferPlan, Reactor
from tensorjob_jupyter.host.spec import JobSpec
from tensorjob_jupyter.host.structured import OutputRouter
from tensorjob_jupyter.host.tokens import ModelTokens, PrefixMismatch, RecordedTokens
from tensorjob_jupyter.sandbox.python.guest import Determinism
from tensorjob_jupyter.text import for_terminal
from tensorjob_jupyter.record.transcript import EventReader
from tensorjob_jupyter.record.recording import (
    LIVE_COMMANDS, End, InferAnswer, Step, compare_commands, describe, normalise,
)
from tensorjob_jupyter.inference.logprobs import TokenLogprob, TokenText
from tensorjob_jupyter.inference.providers import ModelRef

#: How a recorded run can end that a replay reproduces at the same step rather than carry out:
#: the host stopped it (a cancel, its time limit, the model or the host failing).
HOST_ENDS = frozenset({codes.CANCELLED, codes.TIMEOUT, codes.BUSY, codes.MODEL_LOAD_FAILED, codes.INTERNAL_ERROR,
                       codes.WORKER_LOST})


#: The most token records one recorded delta may carry (a delta is a few tokens: the text stream holds back
#: only a partial character or a possible stop string).
MAX_RECORDS_PER_PIECE = 1024


def recorded_pieces(answer: InferAnswer) -> list[str]:
    """An answer's recorded pieces, each carrying the token records its delta gave (``TokenText``), so the
    replay's answers have the logprobs -- and the result the confidence -- of the run. A delta's records
    are untrusted: any that is not one as written (``TokenLogprob.from_json``) drops that piece's records,
    and with them the answer's confidence (its tokens no longer spell its text)."""
    out: list[str] = []
    given = answer.piece_logprobs if len(answer.piece_logprobs) == len(answer.pieces) else []
    for n, piece in enumerate(answer.pieces):
        raw = given[n] if given else None
        if isinstance(raw, list) and 0 < len(raw) <= MAX_RECORDS_PER_PIECE:
            try:
                piece = TokenText(piece, [TokenLogprob.from_json(r) for r in raw])
            except ValueError:
                pass
        out.append(piece)
    return out


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


# --- the reactor ------------------------------------------------------------------------------------


class RecordedWorld:
    """The answerer of a replay (``host/answerer.py``): each command answered from the recording, compared
    with the recorded one first (see the module doc); ``live``: the live world answers from a divergence on."""

    def __init__(self, run: RecordedRun, live: bool):
        self.run = run
        self.recording = recording = run.recording
        self.steps = recording.steps
        self.live = live
        self.cursor = 0  # recorded steps answered so far
        self.divergence: Divergence | None = None
        self.then: str | None = None
        self.live_from: int | None = None
        self.reproduced_end = False
        #: the grant the replay would have needed to go on (``--read PATH``, ``--fetch PREFIX``), if it was denied
        self.denied: str | None = None
        self._past_end_tried = False
        self._recorded_sampling = sampling_of(run.infer)

    # -- the loop ----------------------------------------------------------------------------

    def determinism(self, job: Reactor) -> Any:
        """A Python guest gets the recorded seed, clock origin and clock readings (none recorded: fresh ones)."""
        return Determinism.from_events(EventReader(self.recording.path))

    def finished(self, job: Reactor) -> None:
        """The guest finished: a divergence if the run went on, or ended otherwise."""
        if self.divergence is not None or self.reproduced_end:
            return
        step = self.cursor + 1
        asked = "done" if job.pending_command == "done" else "fail"
        end = self.recording.end
        if self.cursor < len(self.steps):
            recorded = describe(self.steps[self.cursor].command)
        elif end is None:
            recorded = "nothing more (the transcript ends before the job's end)"
        elif end.ended_during == job.pending_command:
            return
        else:
            recorded = _end_text(end)
        self.divergence = Divergence(step, "the guest finished", recorded, asked)
        self._publish(job, "finished")

    def _publish(self, job: Reactor, then: str) -> None:
        assert self.divergence is not None, "the divergence is recorded before it is published"
        self.then = then
        try:
            job.stream.publish(event_types.JOB_REPLAY_DIVERGED, **self.divergence.to_json(), then=then)
        except Exception:  # noqa: BLE001 - the envelope still says it
            pass

    @overload
    def _diverge(self, job: Reactor, divergence: Divergence, command: abi.Command) -> abi.Event: ...

    @overload
    def _diverge(self, job: Reactor, divergence: Divergence, command: None) -> None: ...

    def _diverge(self, job: Reactor, divergence: Divergence, command: abi.Command | None) -> abi.Event | None:
        """Record the divergence; stop the job, or (live) let the host and the model carry on from here."""
        self.divergence = divergence
        if not self.live:
            self._publish(job, "stopped")
            raise JobFailure(codes.REPLAY_DIVERGENCE, divergence.message())
        self.live_from = divergence.step
        self._publish(job, "live")
        return job.carry_out(command) if command is not None else None

    # -- commands ------------------------------------------------------------------------------

    def answer(self, command: abi.Command, job: Reactor) -> abi.Event:
        if self.live_from is not None:
            return job.carry_out(command)
        asked = normalise(command.to_json())
        if self.cursor >= len(self.steps):
            return self._past_the_end(job, command, asked)
        step = self.steps[self.cursor]
        differs = compare_commands(step.command, asked, max_tokens=False)
        if differs is not None:
            return self._diverge(job, Divergence(step.number, *differs), command)
        if isinstance(command, abi.Infer):
            return self._replay_infer(job, command, step)
        if isinstance(command, abi.Embed):
            return self._replay_embed(job, command, step)
        self.cursor += 1
        try:
            event = job.carry_out(command)
        except (JobFailure, AccessError) as e:
            if _ungranted(job, command, e):
                raise self._not_granted(job, step, command) from None
            if e.code in (codes.CANCELLED, codes.TIMEOUT) or self.live:
                raise
            self._diverge(job, Divergence(step.number, "the world changed", f"{describe(step.command)} answered",
                                          f"{e.code}: {e.message}", "answer"), None)
            raise  # pragma: no cover - _diverge raised
        changed = _compare_outcome(step, event)
        if changed is not None:
            self._diverge(job, Divergence(step.number, "the world changed", *changed, "answer"), None)
        return event

    def _not_granted(self, job: Reactor, step: Step, command: abi.Command) -> JobFailure:
        """The failure of a replay that may not open (or fetch) what the recording says the run opened: it runs
        under the grants given now, never the recorded ones, so it names the grant it would need -- the path
        (made absolute where the job resolves it) or the URL -- and ``denied`` keeps it for a map's summary."""
        if isinstance(command, abi.Open):
            path = command.path
            absolute = "/" + posixpath.normpath(posixpath.join(str(job.grants.cwd), path)).lstrip("/")
            needed = "--read " + shown(absolute)
            what = f"opens {shown(path)}, which this replay may not read"
        else:
            assert isinstance(command, abi.Fetch), "only an open or a fetch needs a grant"
            url = str(command.url)
            needed = "--fetch " + url.split("#", 1)[0].split("?", 1)[0][:SHOWN_PATH_CHARS]
            what = f"fetches {url[:SHOWN_PATH_CHARS]}, which this replay may not fetch"
        self.denied = for_terminal(needed, one_line=True)
        return JobFailure(codes.CAPABILITY_DENIED, for_terminal(
            f"replay: step {step.number} {what} (a replay takes no grant from its recording): give "
            f"{needed} to let it", one_line=True))

    def _past_the_end(self, job: Reactor, command: abi.Command, asked: dict) -> abi.Event:
        """A command past the last recorded step: the run's end answers it, or it is a divergence."""
        step = self.cursor + 1
        end = self.recording.end
        if end is None:
            torn = "; its last line was torn" if self.recording.torn else ""
            return self._diverge(job, Divergence(step, "the transcript ends here", f"nothing more (the run was "
                                                 f"interrupted before its end{torn})", describe(asked), "end"), command)
        if end.status == "completed":
            return self._diverge(job, Divergence(step, "another command", "done (the run completed)",
                                                 describe(asked)), command)
        code = (end.error or {}).get("code")
        first = not self._past_end_tried
        self._past_end_tried = True
        if first and end.ended_during in (None, command.cmd) and (end.status == "cancelled" or code in HOST_ENDS):
            self._reproduce_end(job, end)
        live_kind = command.cmd in LIVE_COMMANDS or (isinstance(command, abi.Infer) and command.images)
        if first and live_kind and end.ended_during == command.cmd:
            return job.carry_out(command)  # the run failed carrying this out: see that it fails again
        return self._diverge(job, Divergence(step, "the recording ends here", _end_text(end), describe(asked), "end"),
                             command)

    def _reproduce_end(self, job: Reactor, end: End) -> None:
        """End the replay as the recorded run ended here (its error and its usage)."""
        self.reproduced_end = True
        error = end.error or {"code": codes.CANCELLED, "message": "job cancelled"}
        usage = end.envelope.get("usage")
        usage = usage if isinstance(usage, dict) else {}
        for key in ("tokens_in", "tokens_out"):
            value = usage.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                setattr(job.usage, key, value)
        raise JobFailure(str(error.get("code")), f"{error.get('message')} (as recorded)")

    # -- infer from the recording ---------------------------------------------------------------

    def _replay_infer(self, job: Reactor, cmd: abi.Infer, step: Step) -> abi.Event:
        """An infer answered from the recording through the live path's own steps: the same plan
        (format, tools, sampling, budget), the same router and the same checks of the answer."""
        answer = step.infer or InferAnswer()
        sampling = sampling_of(job.infer_options)
        if sampling != self._recorded_sampling:
            return self._diverge(job, Divergence(step.number, "other sampling settings",
                                                 _json_line(self._recorded_sampling), _json_line(sampling)), cmd)
        plan = job.plan_infer(cmd)
        max_tokens = plan.request.max_tokens
        if not _same_budget(answer, max_tokens):
            return self._diverge(job, Divergence(step.number, "another token limit",
                                                 f"infer of at most {answer.max_output_tokens} tokens "
                                                 f"({_answer_text(answer)})", f"infer of at most {max_tokens} tokens"),
                                 cmd)
        self.cursor += 1
        response = job.open_response(cmd, plan, answer.model or job.usage.model, call_id=answer.call_id)
        router = OutputRouter(plan.spec, response)
        pieces = recorded_pieces(answer)
        recorded_stop = answer.guest_stopped_after if answer.reason == FINISH_GUEST_STOP else None
        source = RecordedTokens(pieces, recorded_stop=recorded_stop, tokens_in=answer.tokens_in)
        delivery = job.token_loop(response, router.delta).run(source)
        stopped_after = delivery.stopped_after
        if stopped_after is not None and stopped_after != recorded_stop:
            # sooner than the recorded guest: the answer ends with this token (the model's greedy
            # output has this prefix)
            usage = GenerateUsage(answer.tokens_in, stopped_after, answer.cached_tokens)
            return job.answer_infer(plan, router, response, GenerateResult("".join(pieces[:stopped_after]),
                                                                           FINISH_STOP, usage), delivery)
        if recorded_stop is not None and stopped_after is None:
            divergence = Divergence(step.number, "more tokens than were recorded",
                                    f"an answer the guest stopped after {recorded_stop} tokens",
                                    f"more: the guest did not stop after token {recorded_stop}")
            return self._more_than_recorded(job, plan, router, response, answer, divergence)
        if answer.status in ("completed", "incomplete") and answer.reason != FINISH_CANCELLED:
            # what the recorded model said it made, never fewer than the pieces it delivered
            usage = GenerateUsage(answer.tokens_in, max(answer.tokens_out, len(pieces)), answer.cached_tokens,
                                  *_recorded_timing(answer))
            reason = FINISH_LENGTH if answer.reason == FINISH_LENGTH else FINISH_STOP
            return job.answer_infer(plan, router, response, GenerateResult("".join(pieces), reason, usage), delivery)
        if answer.status is None:  # the transcript stops inside this answer
            divergence = Divergence(step.number, "the transcript ends inside this answer",
                                    f"{len(pieces)} tokens and no end", "the rest of the answer", "end")
            return self._more_than_recorded(job, plan, router, response, answer, divergence)
        # The run ended during this answer: cancelled, timed out, or the model failed.
        if answer.reason == FINISH_CANCELLED:
            response.finish("".join(pieces), usage=response.usage_json(answer.tokens_in, len(pieces)),
                            reason=FINISH_CANCELLED)
        else:
            error = answer.error or {}
            response.fail(str(error.get("message", "the model failed")), code=error.get("code"),
                          error_type=str(error.get("type", "model_error")))
        end = self.recording.end or End("failed", {"status": "failed", "error": {
            "code": (answer.error or {}).get("code") or codes.CANCELLED,
            "message": (answer.error or {}).get("message") or "cancelled during inference"}}, "infer", None)
        self._reproduce_end(job, end)
        raise AssertionError("unreachable")  # pragma: no cover

    def _more_than_recorded(self, job: Reactor, plan: InferPlan, router: OutputRouter, response: ResponseStream,
                            answer: InferAnswer, divergence: Divergence) -> abi.Event:
        """The guest wants more of an answer than the recording holds: stop, or (live) let the model go on.

        Live, the model answers the same request again and the one token loop
        skips the pieces the guest already judged -- checking that the model
        repeats them, so a constrained (``format``, ``tools``) or per-infer
        sampled answer continues too. Only sampling that is not greedy cannot
        be repeated: that answer stops with the divergence.
        """
        self.divergence = divergence
        temperature = plan.request.sampler.temperature
        if self.live and temperature > 0:
            self.divergence = divergence = Divergence(
                divergence.step, divergence.why, divergence.recorded,
                f"{divergence.asked}; --live cannot continue an answer sampled at temperature "
                f"{temperature:g} from its middle (only greedy answers repeat)", divergence.kind)
        if not self.live or temperature > 0:
            job.count_tokens(answer.tokens_in, len(answer.pieces))
            response.fail(divergence.message(), code=codes.REPLAY_DIVERGENCE, error_type="server_error")
            self._publish(job, "stopped")
            raise JobFailure(codes.REPLAY_DIVERGENCE, divergence.message())
        self.live_from = divergence.step
        self._publish(job, "live")
        return self._live_rest(job, plan, router, response, already=recorded_pieces(answer))

    def _live_rest(self, job: Reactor, plan: InferPlan, router: OutputRouter, response: ResponseStream, *,
                   already: list[str]) -> abi.Event:
        """The rest of an answer from the model, past the pieces ``already`` judged from the recording."""
        assert self.divergence is not None, "_more_than_recorded records the divergence first"
        assert job.guest is not None, "an infer comes from the running guest"
        source = ModelTokens(job.model_backend(), plan.request, job.cancel, response, judged=job.guest.judges_tokens)
        try:
            delivery = job.token_loop(response, router.delta).run(source, already=already)
        except PrefixMismatch as e:
            divergence = Divergence(self.divergence.step, "the model answered otherwise",
                                    f"token {e.index + 1} {_json_line(e.expected)}",
                                    ("the model's answer ends there" if e.got is None else
                                     f"the model gives {_json_line(e.got)} there") +
                                    ", so the rest cannot follow the recording", "answer")
            self.divergence = divergence
            job.count_tokens(0, len(already))
            response.fail(divergence.message(), code=codes.REPLAY_DIVERGENCE, error_type="server_error")
            raise JobFailure(codes.REPLAY_DIVERGENCE, divergence.message()) from None
        return job.answer_infer(plan, router, response, source.result(response, job.count_tokens), delivery,
                                already=already)

    # -- embed from the recording -----------------------------------------------------------------

    def _replay_embed(self, job: Reactor, cmd: abi.Embed, step: Step) -> abi.Event:
        size = sum(len(t.encode("utf-8")) for t in cmd.texts)
        if len(cmd.texts) > job.limits.max_embed_texts or size > job.limits.max_embed_bytes:
            return job.carry_out(cmd)  # the same limit_exceeded as a live run (checked before the model)
        vectors = step.outcome.get("vectors")
        if isinstance(vectors, list):
            vectors = [v.tolist() for v in vectors]  # the recording keeps them as arrays
        if not isinstance(vectors, list):
            return self._diverge(job, Divergence(step.number, "the recording lacks the vectors", "an embed without "
                                                 "its vectors", describe(normalise(cmd.to_json())), "end"), cmd)
        self.cursor += 1
        job.stats.embeds += 1
        job.stream.publish(event_types.JOB_EMBEDDED, count=len(vectors), dimensions=len(vectors[0]) if vectors else 0,
                            text_sha256=[hashlib.sha256(t.encode("utf-8")).hexdigest() for t in cmd.texts],
                            vectors=vectors)
        return abi.Embedded(vectors)


def _ungranted(job: Reactor, command: abi.Command, error: JobFailure) -> bool:
    """Whether ``error`` refused ``command`` for want of a grant: an open of a path under no read grant, a fetch
    of a URL under no fetch grant (not a link leading out of a grant, a folder, a redirect: the world's own)."""
    if error.code != codes.CAPABILITY_DENIED:
        return False
    if isinstance(command, abi.Open):
        path = command.path
        return isinstance(path, str) and bool(path) and "\0" not in path and error.message.endswith(UNGRANTED)
    return isinstance(command, abi.Fetch) and not job.fetch_grants.allows(command.url)


def _same_budget(answer: InferAnswer, max_tokens: int) -> bool:
    """Whether an answer recorded under one token limit is the answer under ``max_tokens``:
    the same limit, or an answer the model ended itself well within both."""
    if answer.max_output_tokens == max_tokens:
        return True
    natural = answer.reason in (FINISH_STOP, FINISH_GUEST_STOP)  # the model ended it, or the guest did
    return natural and answer.tokens_out < max_tokens


def _recorded_timing(answer: InferAnswer) -> tuple[float | None, float | None]:
    """(time to first token, tokens per second) as recorded, when they are numbers."""
    timing = answer.timing if isinstance(answer.timing, dict) else {}
    values = [timing.get("time_to_first_token_s"), timing.get("tokens_per_second")]
    first_token_s, tokens_per_s = (v if isinstance(v, (int, float)) and not isinstance(v, bool) else None
                                   for v in values)
    return first_token_s, tokens_per_s


def _answer_text(answer: InferAnswer) -> str:
    if answer.reason == FINISH_STOP:
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
    """A job that replays a guest against a recorded run (see the module doc): a ``Job`` whose commands a
    ``RecordedWorld`` answers.

    ``ReplayJob(spec, run)``: ``spec`` is the replay's ``JobSpec`` (``replay_setup.replay_spec`` builds it
    from the run with what is given anew), ``run`` a ``RecordedRun`` (``replay_setup.load_run``).
    ``ReplayJob(guest, run, **keywords)`` is the same with ``run`` an id, a path, a ``Job`` or a recording and
    the spec built by ``replay_spec``: the run's own setup with what is given in place -- ``overrides=`` (an
    ``Overrides``, what a front end was given) or the Python API's keywords (``read=``, ``max_tokens=``, ...);
    a replay reads and fetches only what they grant (``read=``, ``fetch=``; none when not given), never what the
    recording says the run was granted -- unless ``recorded_grants=True`` asks for that. A command the recording
    answered that needs a grant not given fails ``capability_denied``, naming it (``--read PATH``).
    The spec's ``input_bytes`` must be the bytes the run staged (checked by SHA-256). ``live=True`` falls
    back to a model from the first divergence: ``backend``, else the spec's model -- the recorded one unless
    another is given (a recorded server is never taken: it must be named again).
    """

    def __init__(self, spec: Any, run: Any, /, *, live: bool = False, backend: Backend | None = None,
                 **keywords: Any):
        overrides = keywords.get("overrides")
        runs = overrides.runs_dir if overrides is not None else keywords.get("runs_dir")
        recorded = load_run(run, runs)
        own_model = live and backend is None  # the spec's model answers, not a backend of the caller's
        recorded_grants = bool(keywords.pop("recorded_grants", False))
        if not isinstance(spec, JobSpec):
            spec = replay_spec(spec, recorded, live=live, backend_given=backend is not None,
                               recorded_grants=recorded_grants, **keywords)
        elif keywords:
            raise TypeError(f"ReplayJob takes a JobSpec, or a guest and keywords, not both ({', '.join(keywords)})")
        self.recording = recorded.recording
        self.recorded = recorded
        self.live = live
        given = spec.input_bytes
        if hashlib.sha256(given).hexdigest() != recorded.input_sha256:
            if not given:
                raise ReplayError(f"the run staged {recorded.input_bytes} bytes for read-input (SHA-256 "
                                  f"{recorded.input_sha256[:16]}…), which a transcript does not keep: "
                                  f"give them again (--input-file F, input_bytes=)")
            raise ReplayError(f"the bytes given for read-input ({len(given)} bytes) are not the ones the run staged "
                              f"({recorded.input_bytes} bytes, SHA-256 {recorded.input_sha256[:16]}…)")
        if live:
            if backend is None:
                if spec.model == ModelRef() and not embedded_model_will_do(recorded):
                    raise ReplayError(live_model_needed(recorded))
                try:
                    backend = spec.model.backend()
                except ModelError as e:
                    raise ReplayError(f"--live: {e}") from None
        else:
            backend = RecordedModel(recorded.model or "")
        self.world = RecordedWorld(recorded, live)
        super().__init__(spec, backend=backend, answerer=self.world, created_fields={"replay_of": {
            "run": recorded.id, "path": str(self.recording.path), "guest_sha256": recorded.guest_sha256,
            "live": live}})
        #: What this replay took from its recording that widens what the guest may do, and the looser
        #: recorded limits it did not take: one inert line each, for a front end to show before it runs.
        self.adopted: list[str] = adoption_lines(recorded, read=spec.read, fetch=spec.fetch, limits=self.limits,
                                                 live=live, model=spec.model if own_model else None,
                                                 recorded_grants=recorded_grants)

    @property
    def guest_changed(self) -> bool:
        return self.guest_sha256 != self.recorded.guest_sha256

    @property
    def report(self) -> "ReplayReport | None":
        """How the replay went, once it has ended (None before)."""
        envelope = self.envelope
        if envelope is None:
            return None
        world = self.world
        return ReplayReport(self, envelope, self.recording.envelope, world.divergence, world.then == "stopped",
                            world.live_from, world.reproduced_end)


def replay(guest: Any, run: Any, *, live: bool = False, timeout: float | None = None, **kwargs: Any) -> ReplayReport:
    """Replay ``guest`` against the recorded run ``run`` to the end; see ``ReplayJob`` for the keywords."""
    job = ReplayJob(guest, run, live=live, **kwargs).start()
    wait_or_cancel(job.wait_done, job.cancel, timeout=timeout, what=f"replay {job.id}")
    job.wait()
    report = job.report
    assert report is not None
    return report


__all__ = ["RecordedModel", "RecordedWorld", "ReplayJob", "replay"]

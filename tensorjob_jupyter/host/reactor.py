"""The reactor: drive one guest from ``cf_init`` to ``done`` or ``fail``.

A guest never calls the host and waits: it returns a command, and the reactor carries it out and steps the
guest again with the resulting event. Because every iteration passes through here, the host sees and decides
everything -- grants, windows, budgets, cancellation without the guest's cooperation -- and the one token loop
(``tokens.py``) forwards each token of an ``infer``. Every exit path produces an ``Envelope`` with usage set,
never a partial result: failures are values, and an unexpected exception is the host's bug (``internal_error``).

Design: docs/internals/host.md#reactorpy
"""

from __future__ import annotations

import base64
import hashlib
import dataclasses
import logging
import threading
import time
from concurrent.futures import CancelledError, Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any, Sequence

from tensorjob_jupyter import abi
from tensorjob_jupyter.abi import Envelope, JobError, JobFailure, JobStatus, Usage, codes, event_types
from tensorjob_jupyter.world.grants import Grants
from tensorjob_jupyter.world.documents import JobDocuments
from tensorjob_jupyter.record.events import EventBudgetExceeded, EventStream, TranscriptWriteError
from tensorjob_jupyter.world.files import Handles
from tensorjob_jupyter.sandbox.guest import Guest
from tensorjob_jupyter.sandbox.instance import open_guest
from tensorjob_jupyter.sandbox.python.guest import PythonGuest
from tensorjob_jupyter.inference.base import (
    FINISH_GUEST_STOP, FINISH_LENGTH, FINISH_STOP, Backend, GenerateRequest, GenerateResult, GenerateUsage,
)
from tensorjob_jupyter.inference.topology import load_per_core
from tensorjob_jupyter.limits import Limits
from tensorjob_jupyter.text import clip
from tensorjob_jupyter.record.responses import ResponseStream
from tensorjob_jupyter.sandbox.streaming import StreamingHost
from tensorjob_jupyter.host.structured import OutputRouter, OutputSpec
from tensorjob_jupyter.host.quoting import Quotes
from tensorjob_jupyter.host.schemas import SchemaError
from tensorjob_jupyter.host.tokens import POLL_S, Delivery, ModelTokens, TokenLoop
from tensorjob_jupyter.host.answerer import Answerer, LiveWorld
from tensorjob_jupyter.host.spec import InferOptions
from tensorjob_jupyter.host.confidence import CONFIDENT_KINDS, FieldConfidence, answer_confidence, leaves_json
from tensorjob_jupyter.inference.logprobs import logprobs_of
from tensorjob_jupyter.host.requirements import Requirements, ground
from tensorjob_jupyter.host.windows import ReadWindows
from tensorjob_jupyter.world.fetch import FetchGrants, fetch_url

PREVIEW_CHARS = 512
PREVIEW_BYTES = 256
#: Characters of a guest's ``fail`` message (and code) an envelope keeps.
MAX_GUEST_MESSAGE_CHARS = 16_384
MAX_GUEST_CODE_CHARS = 128
log = logging.getLogger("tensorjob_jupyter")


class GuestFailed(JobFailure):
    """The guest returned ``fail``: its code and message; always ``failed``.

    Only the host cancels: a guest whose code is ``"cancelled"`` still fails.
    Codes only the host may report (``abi.HOST_ONLY_CODES``) become
    ``script_error``, with the guest's code at the head of the message, and
    an over-long code or message is cut, so the envelope stays small.
    """

    def __init__(self, code: str, message: str):
        message = clip(message, MAX_GUEST_MESSAGE_CHARS)
        if code in abi.HOST_ONLY_CODES:
            code, message = codes.SCRIPT_ERROR, f"the guest failed with `{code}`, a code only the host reports: {message}"
        super().__init__(clip(code, MAX_GUEST_CODE_CHARS), message)


def decode_timing(u: GenerateUsage) -> dict:
    """How an answer was decoded, as its response event records it: time to first token, tokens a second,
    the most sequences decoded with it (``batch``), the decode threads (and the engine's own count, when it
    decoded with fewer because other work took the CPUs: ``own_threads``), and the machine's load a CPU as it
    ended (``load_per_core``: the one-minute load average over the CPUs this process may use) -- what an
    estimate needs to tell a quiet machine's speed from a busy one's (``fanout/estimate.py``)."""
    timing = {"time_to_first_token_s": u.time_to_first_token_s, "tokens_per_second": u.tokens_per_second}
    if u.batch is not None:
        timing["batch"] = u.batch
    if u.threads is not None:
        timing["threads"] = u.threads
    if u.own_threads is not None and u.threads is not None and u.threads < u.own_threads:
        timing["own_threads"] = u.own_threads  # fewer fitted to a busy machine (``busy_machine_line``)
    if u.quiet_tokens_per_second is not None:
        timing["quiet_tokens_per_second"] = round(u.quiet_tokens_per_second, 2)  # what tokens/s is read against
    load = load_per_core()
    if load is not None:
        timing["load_per_core"] = round(load, 2)
    return timing


@dataclass
class JobStats:
    """What the job did, beyond the envelope's usage."""

    steps: int = 0
    peak_memory_bytes: int = 0
    files_opened: int = 0
    bytes_read: int = 0
    infers: int = 0
    embeds: int = 0
    chunks: int = 0
    stream_bytes: int = 0
    paused_ms: int = 0  # time a debugger held the job paused (not counted against job_timeout_s)

    def to_json(self) -> dict:
        return dict(self.__dict__)


class Reactor:
    """Runs one job to its envelope. Construct and ``run()`` on the job's thread."""

    def __init__(self, *, job_id: str, wasm: bytes, input_json: bytes, grants: Grants, backend: Backend | None,
                 limits: Limits, stream: EventStream, cancel: threading.Event,
                 input_bytes: bytes = b"", infer: InferOptions | None = None, fetch: FetchGrants | None = None,
                 debugger: Any = None, answerer: Answerer | None = None, required: Requirements = Requirements()):
        self.job_id = job_id
        self.wasm = wasm
        self.input_json = input_json
        self.grants = grants
        self.backend = backend
        self.limits = limits
        self.stream = stream
        self.cancel = cancel
        self.input_bytes = input_bytes
        self.infer_options = infer or InferOptions()
        self.stats = JobStats()
        self.usage = Usage(model=backend.model_name if backend is not None else "")
        self._model_named = False  # ``_backend``: the backend has said which model it serves
        self.handles = Handles(limits.max_handles, limits.max_window_bytes, limits.max_handle_bytes)
        self.fetch_grants = fetch or FetchGrants(())
        self.documents: JobDocuments | None = None  # started on the first document or image command
        self.guest: Guest | PythonGuest | None = None
        #: The command the guest returned and the host has not yet answered (its ``cmd``),
        #: None while the guest runs: where the job was when it ended (``ended_during``).
        self.pending_command: str | None = None
        self._started = 0.0
        self.deadline: float | None = None
        #: A ``host.debugger.Debugger`` when the job is being debugged, else None.
        self.debugger = debugger
        #: Who carries out the guest's commands (``answerer.py``): the live world, or a recording.
        self.answerer: Answerer = answerer if answerer is not None else LiveWorld()
        #: Each answer's fields' confidence, for the result's (``confidence.py``).
        self.confidence = FieldConfidence()
        #: The text windows the job read (``windows.py``), where its result's fields are located (``grounding.py``),
        #: and what the job requires of its result's fields (``requirements.py``).
        self.windows = ReadWindows()
        self.required = required

    # -- cancellation (any thread) ----------------------------------------------------

    def request_cancel(self) -> None:
        self.cancel.set()
        guest = self.guest
        if guest is not None:
            guest.interrupt()
        if self.debugger is not None:
            self.debugger.wake()

    def paused_for(self, seconds: float) -> None:
        """A debugger held the job for ``seconds``: that time does not count against ``job_timeout_s``."""
        self.stats.paused_ms += int(seconds * 1000)
        if self.deadline is not None:
            self.deadline += seconds
            if self.guest is not None:
                self.guest.deadline = self.deadline

    # -- the loop ---------------------------------------------------------------------

    def run(self) -> Envelope:
        self._started = time.monotonic()
        if self.limits.job_timeout_s is not None:
            self.deadline = self._started + self.limits.job_timeout_s
        try:
            try:
                result = self._drive()
            finally:
                if self.pending_command in ("done", "fail"):
                    self.answerer.finished(self)
            sources, rejected = ground(result, self.windows, self.required, check=self.check_running)
            envelope = Envelope(JobStatus.COMPLETED, self.usage, result=result, sources=sources,
                                confidence=self.confidence.of(result), rejected=rejected or None)
        except JobFailure as e:
            # --break-on fail: see the state before the failure is final (not when the record itself failed)
            if self.debugger is not None and not isinstance(e, (GuestFailed, EventBudgetExceeded, TranscriptWriteError)):
                self.debugger.at_failure(self, e)
            cancelled = e.code in (codes.CANCELLED, codes.PAUSED_TOO_LONG) and not isinstance(e, GuestFailed)
            status = JobStatus.CANCELLED if cancelled else JobStatus.FAILED
            envelope = Envelope(status, self.usage, error=JobError(e.code, e.message))
        except Exception as e:  # a host bug must still end the job cleanly
            envelope = Envelope(JobStatus.FAILED, self.usage, error=internal_error(self.job_id, e))
        finally:
            try:
                self._release()
            finally:
                if self.debugger is not None:
                    self.debugger.end()
        self.usage.duration_ms = int((time.monotonic() - self._started) * 1000)
        return envelope

    def _release(self) -> None:
        """Close the guest and the files; keep nothing bulky once the job has ended."""
        try:
            if self.guest is not None:
                self.stats.peak_memory_bytes = self.guest.peak_memory_bytes
                self.guest.close()
        finally:
            self.guest = None
            self.wasm = b""
            self.input_bytes = b""
            self.input_json = b""
            self.windows.clear()
            try:
                if self.documents is not None:
                    self.documents.close()
            finally:
                self.handles.close()

    def check_running(self) -> None:
        if self.cancel.is_set():
            raise JobFailure(codes.CANCELLED, "job cancelled")
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise JobFailure(codes.TIMEOUT, f"the job ran past its time limit of {self.limits.job_timeout_s} s")

    def _drive(self) -> Any:
        self.check_running()
        streaming = StreamingHost(self.limits, self._on_chunk, self.input_bytes,
                                  listening=lambda: not self.cancel.is_set(), on_flush=self.stream.flush)
        # A wasm Guest, or a PythonGuest for a Python program (same interface; its log,
        # clock readings and seed go to the event stream).
        self.guest = guest = open_guest(self.wasm, self.limits, [streaming], deadline=self.deadline,
                                        publish=self.stream.publish,
                                        determinism=lambda: self.answerer.determinism(self))
        if self.cancel.is_set():
            guest.interrupt()
        debugger = self.debugger
        if debugger is not None:
            debugger.stop_point(self, None)  # --debug: paused before cf_init
            self.check_running()
        command = guest.init(self.input_json)
        self.stats.steps = 1
        while True:
            self.pending_command = command.cmd
            if debugger is not None:
                debugger.stop_point(self, command)  # before the host carries it out
            self.check_running()
            if isinstance(command, abi.Done):
                return self._result(command)
            if isinstance(command, abi.Fail):
                raise GuestFailed(command.code, command.message)
            event = self.answerer.answer(command, self)
            self.windows.note(command, event, self.handles)
            if debugger is not None:
                debugger.answered(command, event)
            if self.stats.steps >= self.limits.max_steps:
                raise JobFailure(codes.LIMIT_EXCEEDED,
                             f"the guest returned {self.stats.steps} commands without finishing (max_steps)")
            self.check_running()
            self.pending_command = None
            command = guest.step(event)
            self.stats.steps += 1

    def _result(self, command: abi.Done) -> Any:
        size = len(abi.encode_json(command.result))
        if size > self.limits.max_result_bytes:
            raise JobFailure(codes.LIMIT_EXCEEDED, f"the result is {size} bytes of JSON, over the "
                                               f"{self.limits.max_result_bytes}-byte limit (max_result_bytes); "
                                               f"stream large output with emit-chunk instead")
        return command.result

    def carry_out(self, command: abi.Command) -> abi.Event:
        """Carry ``command`` out in the live world -- files under the job's grants, fetch, documents, the model --
        and return the event that answers it (``LiveWorld``'s answer; a replay's for what it reads live)."""
        if isinstance(command, abi.Emit):
            return self._emit(command)
        if isinstance(command, abi.Open):
            return self._open(command)
        if isinstance(command, abi.Slice):
            return self._slice(command)
        if isinstance(command, abi.SliceBytes):
            return self._slice_bytes(command)
        if isinstance(command, abi.Infer):
            return self._infer(command)
        if isinstance(command, abi.Embed):
            return self._embed(command)
        if isinstance(command, (abi.PageText, abi.PageTextOpt, abi.DocumentText, abi.PageImage, abi.ImageOp)):
            return self._document_command(command)
        if isinstance(command, abi.Fetch):
            return self._fetch(command)
        raise JobFailure(codes.UNSUPPORTED, f"unexpected command {command!r}")  # pragma: no cover

    # -- commands -----------------------------------------------------------------------

    def _emit(self, cmd: abi.Emit) -> abi.Event:
        size = len(abi.encode_json(cmd.progress))
        if size > self.limits.max_emit_bytes:
            raise JobFailure(codes.LIMIT_EXCEEDED, f"emit payload of {size} bytes is over the "
                                               f"{self.limits.max_emit_bytes}-byte limit (max_emit_bytes)")
        self.stream.publish(event_types.JOB_PROGRESS, progress=cmd.progress)
        return abi.Emitted()

    def _open(self, cmd: abi.Open) -> abi.Event:
        if len(self.handles) >= self.limits.max_handles:
            raise JobFailure(codes.LIMIT_EXCEEDED,
                         f"the job already holds {self.limits.max_handles} open files (max_handles)")
        fd, canonical = self.grants.open_checked(cmd.path)
        f = self.handles.add(fd, canonical)
        if f.kind.kind == "document":
            f.kind = self._documents().inspect(f, cmd.path)
        self.stats.files_opened += 1
        self.stream.publish(event_types.JOB_FILE_OPENED, handle=f.handle, path=cmd.path, resolved=str(canonical),
                            len=f.len, kind=f.kind.to_json())
        return abi.Opened(f.handle, f.len, f.kind)

    def _slice(self, cmd: abi.Slice) -> abi.Event:
        window = self.handles.slice(cmd.handle, cmd.offset, cmd.len)
        text = window.text
        assert text is not None, "slice decodes its window"
        self.stats.bytes_read += len(window.data)
        self.stream.publish(event_types.JOB_FILE_SLICED, handle=cmd.handle, offset=cmd.offset, requested=cmd.len,
                            length=len(window.data), next_offset=window.next_offset, binary=False,
                            preview=text[:PREVIEW_CHARS])
        return abi.Sliced(text, window.next_offset)

    def _slice_bytes(self, cmd: abi.SliceBytes) -> abi.Event:
        window = self.handles.slice_bytes(cmd.handle, cmd.offset, cmd.len)
        self.stats.bytes_read += len(window.data)
        self.stream.publish(event_types.JOB_FILE_SLICED, handle=cmd.handle, offset=cmd.offset, requested=cmd.len,
                            length=len(window.data), next_offset=window.next_offset, binary=True,
                            preview_base64=base64.b64encode(window.data[:PREVIEW_BYTES]).decode("ascii"))
        return abi.SlicedBytes(base64.b64encode(window.data).decode("ascii"), window.next_offset)

    # -- documents, images and fetch (world/documents.py, world/fetch.py) -----------------------------

    def _documents(self) -> JobDocuments:
        if self.documents is None:
            self.documents = JobDocuments(self.handles, self.limits, check=self.check_running,
                                          publish=self.stream.publish)
        return self.documents

    def _document_command(self, cmd) -> abi.Event:
        docs = self._documents()
        if isinstance(cmd, abi.PageText):
            return abi.PageTexted(docs.page_text(cmd.handle, cmd.page))
        if isinstance(cmd, abi.PageTextOpt):
            return abi.PageTextAttempted(*docs.page_text_opt(cmd.handle, cmd.page))
        if isinstance(cmd, abi.DocumentText):
            return abi.PageTexted(docs.document_text(cmd.handle))
        if isinstance(cmd, abi.PageImage):
            f = docs.page_image(cmd.handle, cmd.page)
        else:
            f = docs.image_op(cmd.handle, cmd.op.to_json())
        return abi.PageImaged(f.handle, f.len)

    def _fetch(self, cmd: abi.Fetch) -> abi.Event:
        if len(self.handles) >= self.limits.max_handles:
            raise JobFailure(codes.LIMIT_EXCEEDED,
                         f"the job already holds {self.limits.max_handles} open files (max_handles)")
        fetched = fetch_url(cmd.url, self.fetch_grants, self.limits, self.check_running, room=self.handles.room())
        f = self.handles.add(fetched.fd, cmd.url, held=True)  # counted against max_handle_bytes
        if f.kind.kind == "document":
            f.kind = self._documents().inspect(f, cmd.url)
        self.stats.files_opened += 1
        self.stream.publish(event_types.JOB_FETCH, handle=f.handle, url=cmd.url, final_url=fetched.final_url,
                            status=fetched.status, content_type=fetched.content_type, redirects=fetched.redirects,
                            len=f.len, kind=f.kind.to_json())
        return abi.Opened(f.handle, f.len, f.kind)

    def _on_chunk(self, data: bytes) -> None:
        self.stats.chunks += 1
        self.stats.stream_bytes += len(data)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        self.stream.publish(event_types.JOB_CHUNK, index=self.stats.chunks - 1,
                            bytes_base64=base64.b64encode(data).decode("ascii"), text=text)

    def model_backend(self) -> Backend:
        """The job's model, named: a backend that must ask which model it serves (a server's only model:
        ``resolve_model``) is asked here, on the job's thread, under its deadline and cancel."""
        if self.backend is None:
            raise JobFailure(codes.MODEL_LOAD_FAILED, "this job has no model, so it cannot infer or embed")
        resolve = getattr(self.backend, "resolve_model", None)
        if resolve is not None and not self._model_named:
            self.usage.model = self._await(resolve())
            self._model_named = True
        return self.backend

    def _await(self, fut: Future) -> Any:
        """Wait for a model future while honouring cancel and the job deadline."""
        while True:
            try:
                self.check_running()
            except JobFailure:
                fut.cancel()
                raise
            try:
                return fut.result(timeout=POLL_S)
            except FutureTimeout:
                continue
            except CancelledError:
                raise JobFailure(codes.CANCELLED, "cancelled during inference") from None

    def token_loop(self, response: ResponseStream, publish) -> TokenLoop:
        """The one token loop (``tokens.py``), wired to this job: its guest, its cancel and deadline, its usage."""
        assert self.guest is not None, "an infer comes from the running guest"
        return TokenLoop(response, publish=publish, judge=self.guest.on_token, check_running=self.check_running,
                         count=self.count_tokens)

    def count_tokens(self, tokens_in: int, tokens_out: int) -> None:
        """Add to the job's usage; the totals stop at ``MAX_COUNT``, the largest count a transcript records."""
        self.usage.tokens_in = min(abi.MAX_COUNT, self.usage.tokens_in + tokens_in)
        self.usage.tokens_out = min(abi.MAX_COUNT, self.usage.tokens_out + tokens_out)

    def _embed(self, cmd: abi.Embed) -> abi.Event:
        size = sum(len(t.encode("utf-8")) for t in cmd.texts)
        if len(cmd.texts) > self.limits.max_embed_texts or size > self.limits.max_embed_bytes:
            raise JobFailure(codes.LIMIT_EXCEEDED,
                         f"embed of {len(cmd.texts)} texts ({size} bytes) is over the limit of "
                         f"{self.limits.max_embed_texts} texts and {self.limits.max_embed_bytes} bytes "
                         f"(max_embed_texts, max_embed_bytes)")
        # a ModelError is the job's failure as it stands: busy, model_load_failed or timeout
        vectors = self._await(self.model_backend().embed(list(cmd.texts)))
        self.stats.embeds += 1
        # The texts' hashes and the vectors, so a replay can answer this embed (replay.py).
        self.stream.publish(event_types.JOB_EMBEDDED, count=len(vectors), dimensions=len(vectors[0]) if vectors else 0,
                            text_sha256=[hashlib.sha256(t.encode("utf-8")).hexdigest() for t in cmd.texts],
                            vectors=vectors)
        return abi.Embedded(vectors)

    def _infer(self, cmd: abi.Infer) -> abi.Event:
        if cmd.images:
            raise JobFailure(codes.UNSUPPORTED, "infer with images needs a vision-capable model; "
                                                "this host serves text models only (vision models are not yet "
                                                "supported), so page images can be made and read but not shown "
                                                "to the model")
        backend = self.model_backend()
        plan = self.plan_infer(cmd)
        response = self.open_response(cmd, plan, backend.model_name)
        router = OutputRouter(plan.spec, response)
        assert self.guest is not None, "an infer comes from the running guest"
        source = ModelTokens(backend, plan.request, self.cancel, response, judged=self.guest.judges_tokens)
        delivery = self.token_loop(response, router.delta).run(source)
        return self.answer_infer(plan, router, response, source.result(response, self.count_tokens), delivery)

    def plan_infer(self, cmd: abi.Infer) -> "InferPlan":
        """What an ``infer`` asks of the model, checked: its output spec, sampling and token budget."""
        remaining = self.limits.max_tokens - self.usage.tokens_out
        if remaining <= 0:
            raise JobFailure(codes.LIMIT_EXCEEDED,
                             f"the job's token budget of {self.limits.max_tokens} tokens is spent (max_tokens)")
        max_tokens = min(cmd.max_tokens, remaining)
        opts = self.infer_options
        try:
            # a schema the grammar cannot enforce ends here, before any token; a slow check ends at the deadline
            spec = OutputSpec.of(cmd, check_running=self.check_running)
            # quote mode: the string fields' constraint is made from the windows read so far
            quotes = Quotes.of(spec, self.windows.texts()) if spec.quote else None
        except SchemaError as e:
            raise JobFailure(codes.SCHEMA_VALIDATION_FAILED, f"infer: {e}") from None
        sampler = dataclasses.replace(opts.sampler, **cmd.sampling())
        request = GenerateRequest(cmd.prompt, max_tokens, sampler, opts.cache_prompt, opts.lora, opts.chat,
                                  constraint=spec.constraint if quotes is None else quotes.constraint,
                                  system=spec.system, tools=spec.tool_use(), alone=opts.alone,
                                  threads=opts.threads, top_logprobs=cmd.top_logprobs or 0)
        return InferPlan(spec, request, cmd.wants_logprobs, quotes)

    def open_response(self, cmd: abi.Infer, plan: "InferPlan", model: str, *,
                       call_id: str | None = None) -> ResponseStream:
        """The infer's Open Responses response, created and in progress (``call_id``: a function call's id,
        when a replay gives the recorded one)."""
        sampler = plan.request.sampler
        response = ResponseStream(self.stream, model=model, max_output_tokens=plan.request.max_tokens,
                                  temperature=sampler.temperature, top_p=sampler.top_p,
                                  index=self.stats.infers, output=plan.spec.response_fields(),
                                  sampler=sampler.to_json(), call_id=call_id,
                                  top_logprobs=plan.request.top_logprobs)
        self.stats.infers += 1
        response.start(command=cmd.to_json())  # the request as the guest sent it, for replay
        return response

    def answer_infer(self, plan: "InferPlan", router: OutputRouter, response: ResponseStream, result: GenerateResult,
                delivery: Delivery, *, already: Sequence[str] = ()) -> abi.Event:
        """The model's answer, counted, checked against the infer's format and closed: the guest's ``infer_done``.

        ``already``: pieces of this answer the guest judged before ``delivery`` began (a replay that
        went on live from the middle of an answer)."""
        spec, max_tokens = plan.spec, plan.request.max_tokens
        u = result.usage
        self.count_tokens(u.prompt_tokens, u.completion_tokens)
        stopped_after = None if delivery.stopped_after is None else len(already) + delivery.stopped_after
        reason = FINISH_GUEST_STOP if stopped_after is not None else (
            FINISH_LENGTH if result.finish_reason == FINISH_LENGTH else FINISH_STOP)
        usage = response.usage_json(u.prompt_tokens, u.completion_tokens, u.cached_tokens)
        extra: dict[str, Any] = {"timing": decode_timing(u), "guest_stopped_after": stopped_after}
        text, tool_calls = result.text, None
        if reason == FINISH_STOP or (reason == FINISH_LENGTH and not spec.constrained and not router.is_call):
            try:
                text, calls = spec.check(result.text, call_id=response.call_id)
                if plan.quotes is not None:
                    plan.quotes.check(text)
            except SchemaError as e:
                response.fail(str(e), code=codes.SCHEMA_VALIDATION_FAILED)
                raise JobFailure(codes.SCHEMA_VALIDATION_FAILED, f"infer: {e}") from None
            tool_calls = tuple(c.to_json() for c in calls) if calls else None
        elif router.is_call:
            text = ""  # a call cut short (guest stop): no message, and no call to report
        if router.is_call:  # no text delta carries a call's model text: keep its pieces, for replay
            extra["raw_pieces"] = [*already, *delivery.pieces]
        records = [record for piece in (*already, *delivery.pieces) for record in logprobs_of(piece)]
        leaves = None
        if reason == FINISH_STOP and not router.is_call and spec.kind in CONFIDENT_KINDS:
            leaves = answer_confidence(text, records, spec.kind, spec.output_schema)
            self.confidence.add(leaves)
            extra["confidence"] = leaves_json(leaves)
        response.finish(text, usage=usage, reason=reason, extra=extra)
        if reason == FINISH_LENGTH and (spec.constrained or router.is_call):
            what, bound = (("tool call", "bound the schema (maxLength, maxItems)") if router.is_call else
                           ("JSON", "bound the schema (maxLength, maxItems)") if spec.kind == "json" else
                           (f"answer to the infer's {spec.kind}", f"bound the {spec.kind}"))
            raise JobFailure(codes.LIMIT_EXCEEDED,
                             f"infer: the output reached its token limit ({max_tokens} tokens: the infer's max_tokens "
                             f"or what is left of the job's max_tokens) before the {what} was complete; raise "
                             f"max_tokens, or {bound}")
        asked = plan.asked_logprobs and (records or not text)
        return abi.InferDone(text, u.completion_tokens, tool_calls,
                             logprobs=tuple(r.to_json() for r in records) if asked else None,
                             confidence=leaves_json(leaves) if asked else None)


@dataclass(frozen=True)
class InferPlan:
    """One ``infer`` as the model will be asked it: the output it must have, and the request."""

    spec: OutputSpec
    request: GenerateRequest
    #: The guest asked for the tokens' logprobs in ``infer_done``.
    asked_logprobs: bool = False
    #: Quote mode: the fields copied from the windows read, and what they may be copied from.
    quotes: Quotes | None = None


def internal_error(job_id: str, e: BaseException) -> JobError:
    """The error of a job ended by a bug in the host; the traceback goes to the log. Never fails: an
    exception whose text cannot be made (or logged) is named by its type alone."""
    try:
        log.error("tensorjob: internal error in job %s", job_id, exc_info=(type(e), e, e.__traceback__))
    except Exception:  # noqa: BLE001 - a logging handler that breaks must not break the job's end
        pass
    try:
        said = clip(str(e), 1000).encode("utf-8", "replace").decode("utf-8")
    except Exception:  # noqa: BLE001 - an exception whose str() fails (or is not text)
        said = "(its message cannot be shown)"
    return JobError(codes.INTERNAL_ERROR, f"internal error in the host (not the guest): {type(e).__name__}: "
                                          f"{said}; the traceback is in the tensorjob_jupyter log")


__all__ = [
    "PREVIEW_CHARS", "PREVIEW_BYTES", "MAX_GUEST_MESSAGE_CHARS", "MAX_GUEST_CODE_CHARS", "GuestFailed",
    "JobStats", "Reactor", "InferPlan", "internal_error"
]

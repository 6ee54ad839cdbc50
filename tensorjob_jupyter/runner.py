"""The reactor: drive one guest from ``cf_init`` to ``done`` or ``fail``.

A guest never calls the host and waits. It *returns* a command; the reactor
carries it out and steps the guest again with the resulting event:

    command = guest.init(input)
    loop: check cancel and time -> execute(command) -> event -> command = guest.step(event)

Because every iteration passes through here, the host sees everything and
decides everything: ``open`` is checked against the job's grants (the one
place a path enters the system; later ``slice``s name handles), windows are
capped, ``emit`` payloads are measured and published verbatim, steps and
tokens are counted against their budgets, and cancellation needs no
cooperation from the guest -- between steps the reactor simply stops, and
inside a step ``Guest.interrupt`` ends the call.

A job being debugged (``debug.Debugger``) may pause at the loop's stop
points: before ``cf_init``, and after the guest returned a command, before
it is carried out -- between commands, never on the per-token path. Paused
time moves the job's deadline on (``paused_for``); a job without a debugger
checks one local variable per command.

``infer`` runs on the model's worker thread while this thread forwards each
token first to the event stream (as an Open Responses delta) and then to the
guest's ``cf_on_token``; a stop verdict travels back to the decoder through
the token callback's return value, so generation ends within a token or two.

Every exit path -- done, fail, trap, denial, limit, timeout, cancel --
produces an ``Envelope`` with usage set and never a partial result; failures
are values, not exceptions. An exception nobody expected is a bug in the
host, never the guest's fault: it ends the job with ``internal_error`` and
its traceback goes to the ``tensorjob_jupyter`` logger.
"""

from __future__ import annotations

import base64
import hashlib
import dataclasses
import logging
import queue
import threading
import time
from concurrent.futures import CancelledError, Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any

from . import abi
from .abi import Envelope, JobError, JobStatus, Usage, codes
from .caps import AccessError, Grants
from .documents import DocumentError, JobDocuments
from .events import EventBudgetExceeded, EventStream, TranscriptError
from .files import Handles
from .guest import Guest, GuestTrap
from .inference.base import (DEFAULT_REPEAT_PENALTY, FINISH_LENGTH, Backend, ConstraintError, GenerateRequest,
                             LoraChoice, ModelError, QueueFull, Sampler)
from .limits import Limits
from .responses import ResponseStream
from .streaming import StreamingHost
from .structured import OutputRouter, OutputSpec, SchemaError
from .web import FetchError, FetchGrants, fetch_url

PREVIEW_CHARS = 512
PREVIEW_BYTES = 256
POLL_S = 0.02
LOOKAHEAD_WAIT_S = 0.05
PARTIAL_USAGE_WAIT_S = 0.5
#: Characters of a guest's ``fail`` message (and code) an envelope keeps.
MAX_GUEST_MESSAGE_CHARS = 16_384
MAX_GUEST_CODE_CHARS = 128
_END_OF_TOKENS = object()
log = logging.getLogger("tensorjob_jupyter")


class JobEnd(Exception):
    """Ends the job with an error code (raised anywhere inside the reactor)."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


class GuestFailed(JobEnd):
    """The guest returned ``fail``: its code and message; always ``failed``.

    Only the host cancels: a guest whose code is ``"cancelled"`` still fails.
    Codes only the host may report (``abi.HOST_ONLY_CODES``) become
    ``script_error``, with the guest's code at the head of the message, and
    an over-long code or message is cut, so the envelope stays small.
    """

    def __init__(self, code: str, message: str):
        message = _clip(message, MAX_GUEST_MESSAGE_CHARS)
        if code in abi.HOST_ONLY_CODES:
            code, message = codes.SCRIPT_ERROR, f"the guest failed with `{code}`, a code only the host reports: {message}"
        super().__init__(_clip(code, MAX_GUEST_CODE_CHARS), message)


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text) - limit} more characters)"


@dataclass(frozen=True)
class InferOptions:
    """How this job's ``infer`` commands are sent to the model.

    The defaults: greedy decoding (temperature 0, seed 0) with a mild
    repetition penalty (``DEFAULT_REPEAT_PENALTY``), the prompt cache on, no
    adapter, and ``chat=None``: the model's chat template when it has one
    (instruct models do), raw text otherwise. An ``infer`` may set its own
    sampling (``temperature``, ``top_p``, ... ``stop``) over these.
    """

    sampler: Sampler = field(default_factory=lambda: Sampler(repeat_penalty=DEFAULT_REPEAT_PENALTY))
    cache_prompt: bool = True
    lora: tuple[LoraChoice, ...] = ()
    chat: bool | None = None

    def to_json(self) -> dict:
        return {"sampler": self.sampler.to_json(), "cache_prompt": self.cache_prompt,
                "lora": [{"name": c.name, "scale": c.scale} for c in self.lora], "chat": self.chat}


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
                 debugger: Any = None):
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
        self.handles = Handles(limits.max_handles, limits.max_window_bytes)
        self.fetch_grants = fetch or FetchGrants(())
        self.documents: JobDocuments | None = None  # started on the first document or image command
        self.guest: Guest | None = None
        #: The command the guest returned and the host has not yet answered (its ``cmd``),
        #: None while the guest runs: where the job was when it ended (``ended_during``).
        self.pending_command: str | None = None
        self._started = 0.0
        self.deadline: float | None = None
        #: A ``debug.Debugger`` when the job is being debugged, else None.
        self.debugger = debugger

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
            result = self._drive()
            envelope = Envelope(JobStatus.COMPLETED, self.usage, result=result)
        except (JobEnd, GuestTrap, AccessError) as e:
            if self.debugger is not None and not isinstance(e, GuestFailed):
                self.debugger.at_failure(self, e)  # --break-on fail: see the state before the failure is final
            cancelled = e.code in (codes.CANCELLED, codes.PAUSED_TOO_LONG) and not isinstance(e, GuestFailed)
            status = JobStatus.CANCELLED if cancelled else JobStatus.FAILED
            envelope = Envelope(status, self.usage, error=JobError(e.code, e.message))
        except EventBudgetExceeded as e:
            envelope = Envelope(JobStatus.FAILED, self.usage, error=JobError(codes.LIMIT_EXCEEDED, str(e)))
        except TranscriptError as e:
            envelope = Envelope(JobStatus.FAILED, self.usage, error=JobError(codes.INTERNAL_ERROR, str(e)))
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
            try:
                if self.documents is not None:
                    self.documents.close()
            finally:
                self.handles.close()

    def _check_running(self) -> None:
        if self.cancel.is_set():
            raise JobEnd(codes.CANCELLED, "job cancelled")
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise JobEnd(codes.TIMEOUT, f"the job ran past its time limit of {self.limits.job_timeout_s} s")

    def _drive(self) -> Any:
        self._check_running()
        streaming = StreamingHost(self.limits, self._on_chunk, self.input_bytes,
                                  listening=lambda: not self.cancel.is_set(), on_flush=self.stream.flush)
        self.guest = Guest(self.wasm, self.limits, [streaming], deadline=self.deadline)
        if self.cancel.is_set():
            self.guest.interrupt()
        debugger = self.debugger
        if debugger is not None:
            debugger.stop_point(self, None)  # --debug: paused before cf_init
            self._check_running()
        command = self.guest.init(self.input_json)
        self.stats.steps = 1
        while True:
            self.pending_command = command.cmd
            if debugger is not None:
                debugger.stop_point(self, command)  # before the host carries it out
            self._check_running()
            if isinstance(command, abi.Done):
                return self._result(command)
            if isinstance(command, abi.Fail):
                raise GuestFailed(command.code, command.message)
            event = self._execute(command)
            if debugger is not None:
                debugger.answered(command, event)
            if self.stats.steps >= self.limits.max_steps:
                raise JobEnd(codes.LIMIT_EXCEEDED,
                             f"the guest returned {self.stats.steps} commands without finishing (max_steps)")
            self._check_running()
            self.pending_command = None
            command = self.guest.step(event)
            self.stats.steps += 1

    def _result(self, command: abi.Done) -> Any:
        size = len(abi.encode_json(command.result))
        if size > self.limits.max_result_bytes:
            raise JobEnd(codes.LIMIT_EXCEEDED, f"the result is {size} bytes of JSON, over the "
                                               f"{self.limits.max_result_bytes}-byte limit (max_result_bytes); "
                                               f"stream large output with emit-chunk instead")
        return command.result

    def _execute(self, command: abi.Command) -> abi.Event:
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
        raise JobEnd(codes.UNSUPPORTED, f"unexpected command {command!r}")  # pragma: no cover

    # -- commands -----------------------------------------------------------------------

    def _emit(self, cmd: abi.Emit) -> abi.Event:
        size = len(abi.encode_json(cmd.progress))
        if size > self.limits.max_emit_bytes:
            raise JobEnd(codes.LIMIT_EXCEEDED, f"emit payload of {size} bytes is over the "
                                               f"{self.limits.max_emit_bytes}-byte limit (max_emit_bytes)")
        self.stream.publish("job.progress", progress=cmd.progress)
        return abi.Emitted()

    def _open(self, cmd: abi.Open) -> abi.Event:
        if len(self.handles) >= self.limits.max_handles:
            raise JobEnd(codes.LIMIT_EXCEEDED,
                         f"the job already holds {self.limits.max_handles} open files (max_handles)")
        fd, canonical = self.grants.open_checked(cmd.path)
        f = self.handles.add(fd, canonical)
        if f.kind.kind == "document":
            f.kind = self._doc_call(self._documents().inspect, f, cmd.path)
        self.stats.files_opened += 1
        self.stream.publish("job.file.opened", handle=f.handle, path=cmd.path, resolved=str(canonical),
                            len=f.len, kind=f.kind.to_json())
        return abi.Opened(f.handle, f.len, f.kind)

    def _slice(self, cmd: abi.Slice) -> abi.Event:
        window = self.handles.slice(cmd.handle, cmd.offset, cmd.len)
        text = window.text
        self.stats.bytes_read += len(window.data)
        self.stream.publish("job.file.sliced", handle=cmd.handle, offset=cmd.offset, requested=cmd.len,
                            length=len(window.data), next_offset=window.next_offset, binary=False,
                            preview=text[:PREVIEW_CHARS])
        return abi.Sliced(text, window.next_offset)

    def _slice_bytes(self, cmd: abi.SliceBytes) -> abi.Event:
        window = self.handles.slice_bytes(cmd.handle, cmd.offset, cmd.len)
        self.stats.bytes_read += len(window.data)
        self.stream.publish("job.file.sliced", handle=cmd.handle, offset=cmd.offset, requested=cmd.len,
                            length=len(window.data), next_offset=window.next_offset, binary=True,
                            preview_base64=base64.b64encode(window.data[:PREVIEW_BYTES]).decode("ascii"))
        return abi.SlicedBytes(base64.b64encode(window.data).decode("ascii"), window.next_offset)

    # -- documents, images and fetch (documents.py, web.py) -----------------------------

    def _documents(self) -> JobDocuments:
        if self.documents is None:
            self.documents = JobDocuments(self.handles, self.limits, check=self._check_running,
                                          publish=self.stream.publish)
        return self.documents

    @staticmethod
    def _doc_call(fn, *args):
        try:
            return fn(*args)
        except (DocumentError, FetchError) as e:
            raise JobEnd(e.code, e.message) from None

    def _document_command(self, cmd) -> abi.Event:
        docs = self._documents()
        if isinstance(cmd, abi.PageText):
            return abi.PageTexted(self._doc_call(docs.page_text, cmd.handle, cmd.page))
        if isinstance(cmd, abi.PageTextOpt):
            return abi.PageTextAttempted(*self._doc_call(docs.page_text_opt, cmd.handle, cmd.page))
        if isinstance(cmd, abi.DocumentText):
            return abi.PageTexted(self._doc_call(docs.document_text, cmd.handle))
        if isinstance(cmd, abi.PageImage):
            f = self._doc_call(docs.page_image, cmd.handle, cmd.page)
        else:
            f = self._doc_call(docs.image_op, cmd.handle, cmd.op.to_json())
        return abi.PageImaged(f.handle, f.len)

    def _fetch(self, cmd: abi.Fetch) -> abi.Event:
        if len(self.handles) >= self.limits.max_handles:
            raise JobEnd(codes.LIMIT_EXCEEDED,
                         f"the job already holds {self.limits.max_handles} open files (max_handles)")
        fetched = self._doc_call(fetch_url, cmd.url, self.fetch_grants, self.limits, self._check_running)
        f = self.handles.add(fetched.fd, cmd.url)
        if f.kind.kind == "document":
            f.kind = self._doc_call(self._documents().inspect, f, cmd.url)
        self.stats.files_opened += 1
        self.stream.publish("job.fetch", handle=f.handle, url=cmd.url, final_url=fetched.final_url,
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
        self.stream.publish("job.chunk", index=self.stats.chunks - 1,
                            bytes_base64=base64.b64encode(data).decode("ascii"), text=text)

    def _backend(self) -> Backend:
        if self.backend is None:
            raise JobEnd(codes.MODEL_LOAD_FAILED, "this job has no model, so it cannot infer or embed")
        return self.backend

    def _await(self, fut: Future) -> Any:
        """Wait for a model future while honouring cancel and the job deadline."""
        while True:
            try:
                self._check_running()
            except JobEnd:
                fut.cancel()
                raise
            try:
                return fut.result(timeout=POLL_S)
            except FutureTimeout:
                continue
            except CancelledError:
                raise JobEnd(codes.CANCELLED, "cancelled during inference") from None

    def _end_infer_early(self, response: ResponseStream, fut: Future, code: str, message: str) -> None:
        """Count and close an infer ended by cancel, timeout or a trap in ``cf_on_token``.

        A cancel closes the response ``incomplete`` and raises the job's
        ``cancelled``; anything else is ``error`` then ``response.failed``,
        and the caller re-raises what ended it.
        """
        tokens_in, tokens_out = self._partial_usage(fut, len(response.text_parts))
        if code == codes.CANCELLED:
            response.finish("".join(response.text_parts), usage=response.usage_json(tokens_in, tokens_out),
                            reason="cancelled")
            raise JobEnd(codes.CANCELLED, "cancelled during inference") from None
        response.fail(message, code=code, error_type="server_error")

    def _partial_usage(self, fut: Future, delivered: int) -> tuple[int, int]:
        """Count an infer that ends early (cancel, timeout, trap) in the job's usage.

        The decoder stops within a token once told, so its own count usually
        arrives at once; if it does not, the tokens delivered so far stand in.
        """
        try:
            u = fut.result(timeout=PARTIAL_USAGE_WAIT_S).usage
            tokens_in, tokens_out = u.prompt_tokens, u.completion_tokens
        except Exception:  # still prefilling, cancelled in the queue, or failed
            tokens_in, tokens_out = 0, delivered
        self.usage.tokens_in += tokens_in
        self.usage.tokens_out += tokens_out
        return tokens_in, tokens_out

    def _embed(self, cmd: abi.Embed) -> abi.Event:
        size = sum(len(t.encode("utf-8")) for t in cmd.texts)
        if len(cmd.texts) > self.limits.max_embed_texts or size > self.limits.max_embed_bytes:
            raise JobEnd(codes.LIMIT_EXCEEDED,
                         f"embed of {len(cmd.texts)} texts ({size} bytes) is over the limit of "
                         f"{self.limits.max_embed_texts} texts and {self.limits.max_embed_bytes} bytes "
                         f"(max_embed_texts, max_embed_bytes)")
        backend = self._backend()
        try:
            fut = backend.embed(list(cmd.texts))
        except QueueFull as e:
            raise JobEnd(codes.BUSY, str(e)) from None
        except ModelError as e:
            raise JobEnd(codes.MODEL_LOAD_FAILED, str(e)) from None
        try:
            vectors = self._await(fut)
        except ModelError as e:
            raise JobEnd(codes.MODEL_LOAD_FAILED, str(e)) from None
        self.stats.embeds += 1
        # The texts' hashes and the vectors, so a replay can answer this embed (replay.py).
        self.stream.publish("job.embedded", count=len(vectors), dimensions=len(vectors[0]) if vectors else 0,
                            text_sha256=[hashlib.sha256(t.encode("utf-8")).hexdigest() for t in cmd.texts],
                            vectors=vectors)
        return abi.Embedded(vectors)

    def _infer(self, cmd: abi.Infer) -> abi.Event:
        if cmd.images:
            raise JobEnd(codes.UNSUPPORTED, "infer with images needs a vision-capable model; "
                                            "this host serves text models only (vision models are not yet "
                                            "supported), so page images can be made and read but not shown "
                                            "to the model")
        backend = self._backend()
        remaining = self.limits.max_tokens - self.usage.tokens_out
        if remaining <= 0:
            raise JobEnd(codes.LIMIT_EXCEEDED,
                         f"the job's token budget of {self.limits.max_tokens} tokens is spent (max_tokens)")
        max_tokens = min(cmd.max_tokens, remaining)
        opts = self.infer_options
        try:
            spec = OutputSpec.of(cmd)  # a schema the grammar cannot enforce ends here, before any token
        except SchemaError as e:
            raise JobEnd(codes.SCHEMA_VALIDATION_FAILED, f"infer: {e}") from None
        sampler = dataclasses.replace(opts.sampler, **cmd.sampling())
        response = ResponseStream(self.stream, model=backend.model_name, max_output_tokens=max_tokens,
                                  temperature=sampler.temperature, top_p=sampler.top_p,
                                  index=self.stats.infers, output=spec.response_fields(),
                                  sampler=sampler.to_json())
        self.stats.infers += 1
        response.start(command=cmd.to_json())  # the request as the guest sent it, for replay
        router = OutputRouter(spec, response)
        tokens: queue.SimpleQueue = queue.SimpleQueue()
        stop = threading.Event()
        # The decoder may run at most one token ahead of the guest, so
        # a stop verdict always lands within a token or two, however fast the
        # model is: cf_on_token takes microseconds, a token milliseconds. But
        # the model is shared, so a guest slow to answer never holds it: once
        # a credit takes longer than LOOKAHEAD_WAIT_S, this generation runs
        # free (tokens queue up, bounded by max_tokens; the verdict lands late).
        # The one credit is a plain lock, held while the decoder is a token
        # ahead: both sides wait in C, so a token costs two thread wake-ups.
        credit = threading.Lock()
        free_running = False

        def on_token(piece: str) -> bool:  # runs on the model's worker thread
            nonlocal free_running
            took = not free_running and credit.acquire(timeout=LOOKAHEAD_WAIT_S)
            free_running = not took
            tokens.put((piece, took))
            return not stop.is_set() and not self.cancel.is_set()

        request = GenerateRequest(cmd.prompt, max_tokens, sampler, opts.cache_prompt, opts.lora, opts.chat,
                                  constraint=spec.constraint, system=spec.system)
        try:
            fut = backend.generate_stream(request, on_token)
        except QueueFull as e:
            response.fail(str(e), code=codes.BUSY, error_type="too_many_requests")
            raise JobEnd(codes.BUSY, str(e)) from None
        except ModelError as e:
            response.fail(str(e), code=codes.MODEL_LOAD_FAILED)
            raise JobEnd(codes.MODEL_LOAD_FAILED, str(e)) from None

        # When generation ends, an end marker follows the last token, so the
        # loop below finishes at once instead of on its next poll.
        fut.add_done_callback(lambda _fut: tokens.put(_END_OF_TOKENS))
        guest_stopped = False
        stopped_after = None  # tokens the guest had judged when it said stop
        try:
            while True:
                try:
                    self._check_running()
                except JobEnd as e:
                    stop.set()
                    fut.cancel()
                    self._end_infer_early(response, fut, e.code, e.message)
                    raise
                try:
                    item = tokens.get(timeout=POLL_S)
                except queue.Empty:
                    continue
                if item is _END_OF_TOKENS:
                    break
                piece, took_credit = item
                router.delta(piece)
                if not guest_stopped:
                    try:
                        keep = self.guest.on_token(piece)
                    except GuestTrap as e:
                        stop.set()
                        self._end_infer_early(response, fut, e.code, e.message)
                        raise
                    if not keep:
                        guest_stopped = True
                        stopped_after = len(response.text_parts)
                        stop.set()
                if took_credit:
                    credit.release()
        finally:
            if not fut.done():
                stop.set()

        try:
            result = fut.result()
        except CancelledError:
            raise JobEnd(codes.CANCELLED, "cancelled during inference") from None
        except ConstraintError as e:  # llama.cpp refused the grammar: before any token
            response.fail(str(e), code=codes.SCHEMA_VALIDATION_FAILED, error_type="invalid_request")
            raise JobEnd(codes.SCHEMA_VALIDATION_FAILED, f"infer: {e}") from None
        except Exception as e:  # ModelError, or anything the engine raised
            response.fail(str(e), code=codes.MODEL_LOAD_FAILED)
            raise JobEnd(codes.MODEL_LOAD_FAILED, str(e)) from None

        u = result.usage
        self.usage.tokens_in += u.prompt_tokens
        self.usage.tokens_out += u.completion_tokens
        reason = "guest_stop" if guest_stopped else ("length" if result.finish_reason == FINISH_LENGTH else "stop")
        usage = response.usage_json(u.prompt_tokens, u.completion_tokens, u.cached_tokens)
        extra = {"timing": {"time_to_first_token_s": u.time_to_first_token_s,
                            "tokens_per_second": u.tokens_per_second}, "guest_stopped_after": stopped_after}
        text, tool_calls = result.text, None
        if reason == "stop" or (reason == "length" and not spec.constrained and not router.is_call):
            try:
                text, calls = spec.check(result.text, call_id=response.call_id)
            except SchemaError as e:
                response.fail(str(e), code=codes.SCHEMA_VALIDATION_FAILED)
                raise JobEnd(codes.SCHEMA_VALIDATION_FAILED, f"infer: {e}") from None
            tool_calls = tuple(c.to_json() for c in calls) if calls else None
        elif router.is_call:
            text = ""  # a call cut short (guest stop): no message, and no call to report
        response.finish(text, usage=usage, reason=reason, extra=extra)
        if reason == "length" and (spec.constrained or router.is_call):
            what = "tool call" if router.is_call else "JSON"
            raise JobEnd(codes.LIMIT_EXCEEDED,
                         f"infer: the output reached its token limit ({max_tokens} tokens: the infer's max_tokens or "
                         f"what is left of the job's max_tokens) before the {what} was complete, so it would not "
                         f"parse; raise max_tokens, or bound the schema (maxLength, maxItems)")
        return abi.InferDone(text, u.completion_tokens, tool_calls)


def internal_error(job_id: str, e: BaseException) -> JobError:
    """The error of a job ended by a bug in the host; the traceback goes to the log."""
    log.error("tensorjob: internal error in job %s", job_id, exc_info=(type(e), e, e.__traceback__))
    return JobError(codes.INTERNAL_ERROR, f"internal error in the host (not the guest): {type(e).__name__}: "
                                          f"{_clip(str(e), 1000)}; the traceback is in the tensorjob_jupyter log")

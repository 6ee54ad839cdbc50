"""``Job``: one tensor job on its own thread -- start, watch, cancel, wait.

This is the public face of the host for Python, the command line and the notebook alike: a ``Job`` resolves
its guest, canonicalises its grants, opens its event stream and transcript, and runs the reactor on a
background thread so that the caller stays free (``wait()``, ``cancel()``, ``subscribe()``, and the debugger's
controls). ``run(...)`` is the one-line form. Whatever the guest does the job ends, and what a finished job
keeps in memory is bounded by constants, not by what it published.

Design: docs/internals/host.md#jobspy
"""

from __future__ import annotations

import collections
import hashlib
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, Self

import orjson

from tensorjob_jupyter import abi
from tensorjob_jupyter.abi import Envelope, JobError, JobFailure, JobStatus, Usage, event_types
from tensorjob_jupyter.world.grants import Grants, Withheld
from tensorjob_jupyter.host.debugger import Debugger
from tensorjob_jupyter.inference.providers import ModelRef
from tensorjob_jupyter.host.requirements import Requirements
from tensorjob_jupyter.host.spec import JobSpec
from tensorjob_jupyter.host.waiting import wait_or_cancel
from tensorjob_jupyter.record.events import TRANSCRIPT_VERSION, EventStream, Subscription
from tensorjob_jupyter.inference.base import Backend

from tensorjob_jupyter.host.reactor import JobStats, Reactor, internal_error
from tensorjob_jupyter.record.job_folder import ENVELOPE_FILE, EVENTS_FILE, default_runs_dir, new_job_id
from tensorjob_jupyter.record.glimpse import Glimpse
from tensorjob_jupyter.sandbox.compile import GuestSource

log = logging.getLogger("tensorjob_jupyter")

#: The event a job's stream ends with, by how the job ended.
JOB_END_EVENT = {JobStatus.COMPLETED: event_types.JOB_COMPLETED, JobStatus.FAILED: event_types.JOB_FAILED,
                 JobStatus.CANCELLED: event_types.JOB_CANCELLED}

_JOBS_LOCK = threading.Lock()
_JOBS: dict[str, "Job"] = {}


class _DefaultModel:
    def __repr__(self) -> str:
        return "DEFAULT_MODEL"


#: ``backend=DEFAULT_MODEL`` (the default): the process's shared backend for
#: ``model`` (a GGUF path, ``hf:ORG/REPO[:FILE_OR_QUANT]`` from the Hugging
#: Face cache, or the http(s) URL of an OpenAI-compatible server; None means
#: the embedded model) with ``model_options`` for the engine
#: (``{"loras": {"name": "adapter.gguf"}}``; for a server ``{"model_name": ...,
#: "api_key_env": ...}``), loaded on first use.
#: Pass ``backend=None`` for a job with no model at all.
DEFAULT_MODEL = _DefaultModel()


def _model_server(backend: Any) -> dict:
    """``model_server`` for ``job.created`` when the model is served elsewhere: its URL and the name of its
    key's variable (``ServedBackend.server``), never the key."""
    server = getattr(backend, "server", None)
    return {"model_server": server} if isinstance(server, dict) else {}



def _without_runs_folder(grants: Grants, spec: JobSpec, runs: Path) -> Grants:
    """``grants`` less the runs folder where a grant covers it from above (``--read ~`` with ``~/.tensorjob/runs``):
    earlier jobs' transcripts hold their answers, which a guest must not read back as if it had found them. A
    runs folder granted itself (or a folder in it) stays readable: that is asked for."""
    if not grants.grants:
        return grants  # nothing granted: nothing to take away
    where = Path(os.path.realpath(runs))  # where the transcripts are written: the process's directory, as they are
    if not any(where.is_relative_to(root) and where != root for root in grants.roots):
        return grants
    return Grants.for_paths(spec.read, spec.cwd, withheld=[Withheld(str(where), "the runs folder")])

class Job:
    """A tensor job. Construct, ``start()``, then ``wait()`` or ``cancel()``.

    ``Job(spec)`` takes a ``JobSpec`` (``host/spec.py``): everything that shapes the job. ``Job(guest,
    **keywords)`` is the same with the spec built by ``JobSpec.of(guest, **keywords)`` -- each keyword the
    job option of the same name in a magic and a terminal:

    * ``guest``: wasm bytes, a ``GuestSource``, or a path -- a ``.py`` script, a ``.wasm``, or ``.c``, ``.zig``
      or ``.wat`` source compiled on the way;
    * ``input``: the job input, a JSON value (default ``{}``);
    * ``read``: paths the guest may read (files or folders); ``fetch``: http(s) URL prefixes it may fetch;
    * ``model``: a GGUF path, ``hf:ORG/REPO[:FILE_OR_QUANT]``, an OpenAI-compatible server's URL or a
      ``ModelRef`` (None: the embedded model), with ``model_options``;
    * ``limits``: a ``Limits``, and any limit as a keyword of its own (``max_tokens=64``, ``job_timeout_s=30``);
    * ``infer``: an ``InferOptions`` -- sampling, the chat template, LoRA -- for every infer;
    * ``input_bytes``: bytes staged for the guest's ``read-input``;
    * ``runs_dir``: where the transcript goes (default ``$TENSORJOB_RUNS``, else ``~/.tensorjob/runs``);
      ``cwd``: what relative paths are relative to; ``name``: the job's name in views and listings;
    * ``debug``, ``break_on``: start paused, or pause before such commands (``host/debugger.py``);
    * ``require_grounded``: result fields that must be grounded in what the job read, else each is rejected
      alone (``envelope.rejected``; ``fail_item``: the job fails ``ungrounded``); ``require_present``: fields
      that must hold a value, else the job fails (``host/requirements.py``).

    ``backend``: the model's backend as an object, in place of the spec's model (a map's shared one, a
    ``ScriptedBackend`` in tests); ``None`` for a job with no model. ``answerer``: who carries out the
    guest's commands (``host/answerer.py``; default the live world -- a replay answers from a recording);
    ``created_fields``: what ``job.created`` carries beyond every job's (a replay names the run it replays).

    Bad options raise at once (``ValueError``, ``FileNotFoundError``, ``CompileError``, ``TypeError``
    for an unknown keyword), before anything runs.
    """

    def __init__(self, spec: "JobSpec | GuestSource | bytes | str | os.PathLike", /, *,
                 backend: Backend | None | _DefaultModel = DEFAULT_MODEL, answerer: Any = None,
                 created_fields: dict | None = None, **keywords: Any):
        if not isinstance(spec, JobSpec):
            spec = JobSpec.of(spec, **keywords)
        elif keywords:
            raise TypeError(f"Job takes a JobSpec, or a guest and keywords, not both ({', '.join(keywords)})")
        self.id = new_job_id()  # the spec itself is not kept: a finished job holds no guest, input or bytes
        self.limits = spec.limits
        #: The job's ``host.debugger.Debugger`` when it is being debugged (``debug``, ``break_on``), else None.
        self.debugger = (Debugger(start_paused=spec.debug, break_on=spec.break_on, max_paused_s=self.limits.max_paused_s)
                         if spec.debug or spec.break_on else None)
        input_value, input_json = abi.checked_input({} if spec.input is None else spec.input, "the job input",
                                                    max_values=self.limits.max_command_values)
        self._input_json = input_json  # kept as bytes, counted in ``retained_bytes``: not as parsed values
        source = spec.guest
        self.name = spec.name or source.name
        wasm = source.wasm
        self.guest_sha256 = source.sha256
        runs = Path(spec.runs_dir if spec.runs_dir is not None else default_runs_dir())
        self.grants = _without_runs_folder(Grants.for_paths(spec.read, spec.cwd), spec, runs)
        self.fetch_grants = spec.fetch
        # the model, whole, for a replay to find again (never a key): the spec's, or the one a backend given
        # was made for (``ModelRef.backend``); a backend no reference names (a test's, a recording) has none
        ref = spec.model if isinstance(backend, _DefaultModel) else getattr(backend, "model_ref", None)
        model_ref = {"model_ref": ref.to_json()} if isinstance(ref, ModelRef) else {}
        if isinstance(backend, _DefaultModel):  # DEFAULT_MODEL, its one instance
            backend = spec.model.backend()
        self.backend = backend
        self.run_dir = runs / self.id
        self.stream = EventStream(self.id, self.run_dir, max_bytes=self.limits.max_event_bytes)
        input_bytes = spec.input_bytes
        try:
            self._cancel = threading.Event()
            self._reactor = Reactor(job_id=self.id, wasm=wasm, input_json=input_json, grants=self.grants,
                                    backend=backend, limits=self.limits, stream=self.stream, cancel=self._cancel,
                                    input_bytes=input_bytes, infer=spec.infer, fetch=self.fetch_grants,
                                    debugger=self.debugger, answerer=answerer,
                                    required=Requirements(spec.require_grounded, spec.require_present,
                                                          spec.fail_item))
            self._envelope_json: bytes | None = None
            self._status: JobStatus | None = None
            self._done = threading.Event()
            self._callbacks: list = []
            self._callbacks_lock = threading.Lock()
            self._thread: threading.Thread | None = None  # its own, or the one that ran it (run_here)
            self.started_at: float | None = None
            self.started_monotonic: float | None = None
            self.finished_at: float | None = None
            self.stream.publish(event_types.JOB_CREATED, transcript_version=TRANSCRIPT_VERSION, created_at=round(time.time(), 3),
                                name=self.name,
                                guest={"name": source.name, "language": source.language, "origin": source.origin,
                                       "sha256": self.guest_sha256, "bytes": len(wasm)},
                                input=input_value, grants=[str(r) for r in self.grants.roots],
                                read=sorted({name for root in self.grants.grants for name in root.names}),
                                cwd=str(self.grants.cwd),
                                input_bytes={"bytes": len(input_bytes), "sha256": hashlib.sha256(input_bytes).hexdigest()},
                                limits=self.limits.to_json(), model=backend.model_name if backend else None,
                                **_model_server(backend), **model_ref,
                                infer=self._reactor.infer_options.to_json(), fetch=self.fetch_grants.prefixes,
                                **({"debug": self.debugger.to_json()} if self.debugger is not None else {}),
                                **({"require_grounded": list(spec.require_grounded)} if spec.require_grounded
                                   else {}),
                                **({"require_present": list(spec.require_present)} if spec.require_present
                                   else {}),
                                **({"fail_item": True} if spec.fail_item else {}),
                                **(created_fields or {}))
        except BaseException as e:  # the job cannot start: its folder is a failed run, not a locked one
            error = JobError(e.code, e.message) if isinstance(e, JobFailure) else internal_error(self.id, e)
            self.stream.close(encode_envelope(self.id, Envelope(JobStatus.FAILED, Usage(), error=error)))
            raise
        _register(self)

    # -- lifecycle -----------------------------------------------------------------

    def start(self) -> Self:
        if self._thread is not None:
            raise RuntimeError(f"job {self.id} was already started")
        self.started_at = time.time()
        self.started_monotonic = time.monotonic()
        self._thread = threading.Thread(target=self._run, name=f"tensorjob-{self.id}", daemon=True)
        self._thread.start()
        return self

    def run_here(self) -> Envelope:
        """Run the job on the calling thread to its end (``start`` and ``wait`` without a thread of its own:
        a map's item on its pool thread); ``cancel`` from another thread ends it as it would a started job."""
        if self._thread is not None:
            raise RuntimeError(f"job {self.id} was already started")
        self.started_at = time.time()
        self.started_monotonic = time.monotonic()
        self._thread = threading.current_thread()
        self._run()
        envelope = self.envelope
        assert envelope is not None
        return envelope

    def _run(self) -> None:
        """The job's thread: run the reactor, then always publish the end and finish."""
        try:
            try:
                envelope = self._reactor.run()
            except BaseException as e:  # noqa: BLE001 - the reactor ends every job itself; this is a bug
                envelope = Envelope(JobStatus.FAILED, self._reactor.usage, error=internal_error(self.id, e))
            envelope_json = encode_envelope(self.id, envelope)
            written = orjson.loads(envelope_json)  # what was written, which may be the internal error's
            self._status = JobStatus(written["status"])
            self.finished_at = time.time()
            try:
                self.stream.publish(JOB_END_EVENT[self._status], envelope=written,
                                    stats=self._reactor.stats.to_json(),
                                    ended_during=self._reactor.pending_command)
            except Exception:  # noqa: BLE001 - the transcript broke (disk full?): the job still ends
                log.exception("tensorjob: could not write the end of job %s", self.id)
            self._envelope_json = envelope_json
        finally:
            if self._envelope_json is None:  # a host bug past every fallback: the job still ends, failed
                self._status, self._envelope_json = JobStatus.FAILED, _LAST_RESORT_ENVELOPE
            try:
                self.stream.close(self._envelope_json)
            except Exception:  # noqa: BLE001
                log.exception("tensorjob: could not write envelope.json of job %s", self.id)
            with self._callbacks_lock:
                self._done.set()
                callbacks = list(self._callbacks)
            _remember_finished(self)
            for callback in callbacks:
                try:
                    callback(self)
                except Exception:  # a listener's bug must not break the job
                    log.exception("tensorjob: a done callback of job %s failed", self.id)

    def add_done_callback(self, callback) -> None:
        """Call ``callback(job)`` when the job ends (at once if it already has)."""
        with self._callbacks_lock:
            if not self._done.is_set():
                self._callbacks.append(callback)
                return
        callback(self)

    def cancel(self) -> None:
        """Ask the job to stop; it ends ``cancelled`` within moments."""
        self._reactor.request_cancel()

    # -- debugging (debugger.py) ----------------------------------------------------------

    def _debug(self) -> Debugger:
        if self.debugger is None:
            raise RuntimeError(f"job {self.id} is not being debugged: start it with debug=True (--debug) or "
                               f"break_on=[...] (--break-on)")
        return self.debugger

    @property
    def debugging(self) -> bool:
        """True for a job started with ``debug`` or ``break_on``."""
        return self.debugger is not None

    @property
    def paused(self) -> bool:
        """True while the job waits at a stop point (see ``host/debugger.py``)."""
        return self.debugger is not None and self.debugger.paused

    @property
    def debug_state(self) -> dict | None:
        """What the current pause shows -- ``step``, ``reason``, ``command`` (about to be carried out),
        ``last_command`` and ``last_event`` (the event that answered it), ``handles``, ``memory_bytes``, ... --
        every guest-made value bounded; None while the job is not paused."""
        return self.debugger.state if self.debugger is not None else None

    def pause(self, *, wait: bool = True, timeout: float | None = None) -> dict | None:
        """Stop at the next stop point (a guest call or an infer under way finishes first); with ``wait``,
        return that pause's ``debug_state`` (None if the job ended first)."""
        wait = wait and self._thread is not None
        return self._ended_if_none(self._debug().pause(wait=wait, timeout=timeout), wait)

    def step(self, until: str | None = None, *, wait: bool = True, timeout: float | None = None) -> dict | None:
        """From a pause, carry out one command and pause again (``until="infer"``: run to the guest's next
        ``infer``, or any other command kind); with ``wait``, return the new pause's ``debug_state`` (None if
        the job ended first). A job not yet at its first pause gets there first; a job running free pauses
        at its next stop point. ``TimeoutError`` if ``timeout`` passes first."""
        debugger = self._debug()
        if self._thread is None:
            raise RuntimeError(f"job {self.id} has not been started: start() it first")
        return self._ended_if_none(debugger.step(until, wait=wait, timeout=timeout), wait)

    def resume(self) -> None:
        """Run on from a pause (the view's Continue), stopping only at breakpoints."""
        self._debug().resume()

    def wait_paused(self, timeout: float | None = None) -> dict | None:
        """Block until the job is paused (a breakpoint, a step, a pause) or has ended; the pause's
        ``debug_state``, or None if the job ended. ``TimeoutError`` if ``timeout`` passes first."""
        return self._ended_if_none(self._debug().wait_paused(timeout), True)

    def _ended_if_none(self, state: dict | None, waited: bool) -> dict | None:
        """No pause came because the job ended: return once it has wholly ended (envelope written)."""
        if state is None and waited:
            self._done.wait(10)
        return state

    def wait(self, timeout: float | None = None) -> Envelope:
        """Block until the job ends; returns its envelope.

        Raises ``TimeoutError`` if ``timeout`` passes first (the job goes on).
        """
        if self._thread is None:
            self.start()
        if not self._done.wait(timeout):
            raise TimeoutError(f"job {self.id} still running after {timeout} s")
        envelope = self.envelope
        assert envelope is not None
        return envelope

    def wait_done(self, timeout: float | None = None) -> bool:
        """Block until the job ends or ``timeout`` passes; True if it ended."""
        return self._done.wait(timeout)

    # -- state -----------------------------------------------------------------------

    @property
    def done(self) -> bool:
        return self._done.is_set()

    @property
    def status(self) -> JobStatus:
        if self._status is not None and self._done.is_set():
            return self._status
        return JobStatus.RUNNING if self._thread is not None else JobStatus.QUEUED

    @property
    def envelope(self) -> Envelope | None:
        """The envelope once the job has ended (decoded afresh on each access)."""
        if self._envelope_json is None or not self._done.is_set():
            return None
        return Envelope.from_json(orjson.loads(self._envelope_json))

    @property
    def result(self) -> Any:
        """The result of a completed job (None until then, or if it did not complete)."""
        envelope = self.envelope
        return envelope.result if envelope is not None else None

    @property
    def input(self) -> Any:
        """The job input, as checked (decoded afresh on each access from the JSON the job keeps)."""
        return orjson.loads(self._input_json)

    @property
    def retained_bytes(self) -> int:
        """Roughly what this finished job keeps in memory beyond a fixed size: its envelope and its input,
        each as compact JSON."""
        return len(self._envelope_json or b"") + len(self._input_json)

    @property
    def stats(self) -> JobStats:
        return self._reactor.stats

    @property
    def events(self) -> list[dict]:
        """Every event so far, read back from the transcript (the job keeps none in memory)."""
        return self.stream.history

    def subscribe(self, maxsize: int = 10_000, *, replay: bool = True) -> Subscription:
        return self.stream.subscribe(maxsize, replay=replay)

    def glimpse(self) -> Glimpse:
        """What the job is doing now -- its phase, infers, tokens and the tail of its text -- from any thread, at
        no cost to the job (``record/glimpse.py``)."""
        return self.stream.glimpse()

    @property
    def transcript_path(self) -> Path:
        return self.run_dir / EVENTS_FILE

    @property
    def envelope_path(self) -> Path:
        return self.run_dir / ENVELOPE_FILE

    def __repr__(self) -> str:
        return f"<Job {self.id} {self.name} {self.status.value}>"


#: Finished jobs this process remembers for ``jobs()``, at most, and the most
#: bytes of envelopes and inputs they may hold in all; the oldest finished are forgotten first.
KEEP_FINISHED_JOBS = 100
KEEP_FINISHED_BYTES = 16 * 1024 * 1024


#: The finished jobs ``jobs()`` remembers, in the order they finished, with what each keeps (``retained_bytes``),
#: and those bytes in all: a job's end costs the same however many jobs the process has run.
_FINISHED: collections.OrderedDict[str, int] = collections.OrderedDict()
_finished_bytes = 0


def _register(job: Job) -> None:
    """Remember a job for ``jobs()``."""
    with _JOBS_LOCK:
        _JOBS[job.id] = job


def _remember_finished(job: Job) -> None:
    """Count ``job`` among the finished, then forget the oldest finished past the count and byte bounds (the
    newest stays)."""
    global _finished_bytes
    with _JOBS_LOCK:
        if job.id in _JOBS and job.id not in _FINISHED:
            size = job.retained_bytes
            _FINISHED[job.id] = size
            _finished_bytes += size
        while len(_FINISHED) > 1 and (len(_FINISHED) > KEEP_FINISHED_JOBS or _finished_bytes > KEEP_FINISHED_BYTES):
            old, size = _FINISHED.popitem(last=False)
            _finished_bytes -= size
            _JOBS.pop(old, None)


def encode_envelope(job_id: str, envelope: Envelope) -> bytes:
    """Compact JSON of the envelope; if even that fails (a host bug), an internal error's, with only
    the usage's counts that a transcript can hold; and if that fails too, a fixed one. Never fails."""
    try:
        return abi.encode_json(envelope.to_json())
    except Exception as e:  # noqa: BLE001
        try:
            fallback = Envelope(JobStatus.FAILED, _recordable_usage(envelope.usage), error=internal_error(job_id, e))
            return abi.encode_json(fallback.to_json())
        except Exception:  # noqa: BLE001
            return _LAST_RESORT_ENVELOPE


def _recordable_usage(usage: Any) -> Usage:
    """``usage`` with each count a transcript cannot hold (not a whole number from 0 to 2^53) as 0."""
    def count(value: Any) -> int:
        return value if type(value) is int and 0 <= value <= abi.MAX_COUNT else 0

    model = getattr(usage, "model", "")
    return Usage(count(getattr(usage, "tokens_in", 0)), count(getattr(usage, "tokens_out", 0)),
                 count(getattr(usage, "duration_ms", 0)), model if isinstance(model, str) else "")


_LAST_RESORT_ENVELOPE = abi.encode_json(Envelope(JobStatus.FAILED, Usage(), error=JobError(
    abi.codes.INTERNAL_ERROR, "internal error in the host (not the guest): the job's envelope could not be "
                              "written; the traceback is in the tensorjob_jupyter log")).to_json())


def jobs() -> list[Job]:
    """Every job created in this process, oldest first."""
    with _JOBS_LOCK:
        return list(_JOBS.values())


def get_job(job_id: str) -> Job:
    with _JOBS_LOCK:
        try:
            return _JOBS[job_id]
        except KeyError:
            raise KeyError(f"no job with id {job_id!r}") from None


def run(guest: bytes | str | os.PathLike, *, timeout: float | None = None, **kwargs: Any) -> Envelope:
    """Run a job to the end and return its envelope. Every keyword is ``Job``'s (``input``, ``read``, ``model``,
    ``limits`` and any limit, ...); ``timeout``: raise ``TimeoutError`` if it has not ended by then (it goes on).
    Ctrl-C cancels it and returns its envelope."""
    job = Job(guest, **kwargs).start()
    wait_or_cancel(job.wait_done, job.cancel, timeout=timeout, what=f"job {job.id}")
    return job.wait()


__all__ = [
    "JOB_END_EVENT", "DEFAULT_MODEL", "Job", "KEEP_FINISHED_JOBS", "KEEP_FINISHED_BYTES", "encode_envelope", "jobs",
    "get_job", "run"
]

"""``Job``: one tensor job on its own thread -- start, watch, cancel, wait.

This is the public face of the host for Python, the command line and the
notebook alike. A ``Job`` resolves its guest (wasm bytes, or a ``.wasm``,
``.c``, ``.zig`` or ``.wat`` file compiled on the way), canonicalises its
read grants, opens its event stream and transcript under the runs folder,
and runs the reactor on a background thread so that the caller stays free:
``wait()`` for the envelope, ``cancel()`` at any moment (even while the
guest spins inside a step), ``subscribe()`` to the live events.

``run(...)`` is the one-line form: start a job and return its envelope.
"""

from __future__ import annotations

import os
import secrets
import threading
import time
from pathlib import Path
from typing import Any, Iterable

from .abi import Envelope, JobStatus
from .caps import Grants
from .events import EventStream, Subscription
from .inference.base import Backend
from .limits import Limits
from .runner import InferOptions, JobStats, Reactor
from .web import FetchGrants

_JOBS_LOCK = threading.Lock()
_JOBS: dict[str, "Job"] = {}


def default_runs_dir() -> Path:
    """``$TENSORJOB_RUNS``, else ``~/.tensorjob/runs``."""
    env = os.environ.get("TENSORJOB_RUNS")
    return Path(env) if env else Path.home() / ".tensorjob" / "runs"


def new_job_id() -> str:
    return time.strftime("%Y%m%dT%H%M%S") + "-" + secrets.token_hex(3)


def resolve_guest(guest: bytes | bytearray | str | os.PathLike) -> bytes:
    """Wasm bytes for ``guest``: bytes pass through, files load or compile."""
    if isinstance(guest, (bytes, bytearray, memoryview)):
        return bytes(guest)
    from .compile import load_guest  # the compiler is only needed for sources

    return load_guest(guest)


class _DefaultModel:
    def __repr__(self) -> str:
        return "DEFAULT_MODEL"


#: ``backend=DEFAULT_MODEL`` (the default): the process's shared backend for
#: ``model`` (a GGUF path; None means the embedded model), loaded on first use.
#: Pass ``backend=None`` for a job with no model at all.
DEFAULT_MODEL = _DefaultModel()


class Job:
    """A tensor job. Construct, ``start()``, then ``wait()`` or ``cancel()``."""

    def __init__(self, guest: bytes | str | os.PathLike, *, input: Any = None,
                 read: Iterable[str | os.PathLike] = (), backend: Backend | None | _DefaultModel = DEFAULT_MODEL,
                 model: str | os.PathLike | None = None,
                 limits: Limits | None = None, input_bytes: bytes = b"",
                 infer: InferOptions | None = None, runs_dir: str | os.PathLike | None = None,
                 cwd: str | os.PathLike | None = None, name: str | None = None, fetch: Iterable[str] = ()):
        self.id = new_job_id()
        self.name = name or (Path(guest).name if isinstance(guest, (str, os.PathLike)) else "guest")
        self.wasm = resolve_guest(guest)
        self.input = {} if input is None else input
        self.limits = limits or Limits()
        self.grants = Grants.for_paths(read, cwd)
        self.fetch_grants = FetchGrants.parse(fetch)  # ValueError names a prefix that is not an http(s) URL
        if backend is DEFAULT_MODEL:
            from .inference.lazy import model_backend

            backend = model_backend(model)
        self.backend = backend
        self.run_dir = Path(runs_dir if runs_dir is not None else default_runs_dir()) / self.id
        self.stream = EventStream(self.id, self.run_dir, max_bytes=self.limits.max_event_bytes)
        self._cancel = threading.Event()
        self._reactor = Reactor(job_id=self.id, wasm=self.wasm, input=self.input, grants=self.grants,
                                backend=backend, limits=self.limits, stream=self.stream,
                                cancel=self._cancel, input_bytes=input_bytes, infer=infer,
                                fetch=self.fetch_grants)
        self._envelope: Envelope | None = None
        self._done = threading.Event()
        self._callbacks: list = []
        self._callbacks_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.started_at: float | None = None
        self.started_monotonic: float | None = None
        self.finished_at: float | None = None
        self.stream.publish("job.created", name=self.name,
                            guest={"sha256": self._reactor_digest(), "bytes": len(self.wasm)},
                            input=self.input, grants=[str(r) for r in self.grants.roots],
                            fetch=self.fetch_grants.prefixes,
                            limits=self.limits.to_json(), model=backend.model_name if backend else None)
        _register(self)

    def _reactor_digest(self) -> str:
        from .guest import module_digest

        return module_digest(self.wasm)

    # -- lifecycle -----------------------------------------------------------------

    def start(self) -> "Job":
        if self._thread is not None:
            raise RuntimeError(f"job {self.id} was already started")
        self.started_at = time.time()
        self.started_monotonic = time.monotonic()
        self._thread = threading.Thread(target=self._run, name=f"tensorjob-{self.id}", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        envelope = self._reactor.run()
        self._envelope = envelope
        self.finished_at = time.time()
        payload = envelope.to_json()
        try:
            self.stream.publish(f"job.{envelope.status.value}", envelope=payload,
                                stats=self._reactor.stats.to_json())
        except Exception:  # noqa: BLE001 - the job still ends, its envelope still saved
            pass
        finally:
            self.stream.close(payload)
            with self._callbacks_lock:
                self._done.set()
                callbacks = list(self._callbacks)
            for callback in callbacks:
                try:
                    callback(self)
                except Exception:  # a listener's bug must not break the job
                    pass

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

    def wait(self, timeout: float | None = None) -> Envelope:
        """Block until the job ends; returns its envelope.

        Raises ``TimeoutError`` if ``timeout`` passes first (the job goes on).
        """
        if self._thread is None:
            self.start()
        if not self._done.wait(timeout):
            raise TimeoutError(f"job {self.id} still running after {timeout} s")
        assert self._envelope is not None
        return self._envelope

    def wait_done(self, timeout: float | None = None) -> bool:
        """Block until the job ends or ``timeout`` passes; True if it ended."""
        return self._done.wait(timeout)

    # -- state -----------------------------------------------------------------------

    @property
    def done(self) -> bool:
        return self._done.is_set()

    @property
    def status(self) -> JobStatus:
        if self._envelope is not None:
            return self._envelope.status
        return JobStatus.RUNNING if self._thread is not None else JobStatus.QUEUED

    @property
    def envelope(self) -> Envelope | None:
        return self._envelope

    @property
    def result(self) -> Any:
        """The result of a completed job (None until then, or if it did not complete)."""
        return self._envelope.result if self._envelope is not None else None

    @property
    def stats(self) -> JobStats:
        return self._reactor.stats

    @property
    def events(self) -> list[dict]:
        return self.stream.history

    def subscribe(self, maxsize: int = 10_000, *, replay: bool = True) -> Subscription:
        return self.stream.subscribe(maxsize, replay=replay)

    @property
    def transcript_path(self) -> Path:
        return self.run_dir / "events.jsonl"

    @property
    def envelope_path(self) -> Path:
        return self.run_dir / "envelope.json"

    def __repr__(self) -> str:
        return f"<Job {self.id} {self.name} {self.status.value}>"


KEEP_FINISHED_JOBS = 200


def _register(job: Job) -> None:
    """Remember a job for ``jobs()``; forget the oldest finished ones past a bound."""
    with _JOBS_LOCK:
        _JOBS[job.id] = job
        finished = [j for j in _JOBS.values() if j.done]
        for old in finished[: max(0, len(finished) - KEEP_FINISHED_JOBS)]:
            del _JOBS[old.id]


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
    """Run a job to the end and return its envelope (see ``Job`` for options)."""
    job = Job(guest, **kwargs).start()
    try:
        return job.wait(timeout)
    except KeyboardInterrupt:
        job.cancel()
        return job.wait()

"""One item, and what every item shares: ``ItemSpec``, the backend per process, ``run_item``.

Everything here runs on a Dask worker as well as in this process, and is
shaped for that. The spec is small, frozen and picklable: it travels once
per worker. Backends hold threads and cannot travel, so a ``BackendSpec``
says how to build one and each process builds one per key and keeps it
(``process_backend``). And ``run_item`` is pure and never raises: it writes
only its own job transcript and returns the outcome as a plain dict, so a
retried item cannot be recorded twice -- recording is the map's job.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from tensorjob_jupyter.abi import AbiError, JobStatus, codes
from tensorjob_jupyter.inference.base import Backend
from tensorjob_jupyter.host.jobs import Job
from tensorjob_jupyter.host.reactor import internal_error
from tensorjob_jupyter.host.spec import JobSpec
from tensorjob_jupyter.inference.providers import ModelRef
from tensorjob_jupyter.record.glimpse import Glimpse

CANCEL_POLL_S = 0.25
#: The error code of an item whose worker process died every time it was
#: tried (Dask's ``KilledWorker``). Not one of cuttlefish's codes.
WORKER_LOST = codes.WORKER_LOST


@dataclass(frozen=True)
class BackendSpec:
    """How a process gets its model backend; small and picklable.

    Backends hold threads and cannot travel, so a worker builds its own from
    a ``factory`` (any picklable callable, e.g.
    ``functools.partial(ScriptedBackend, reply="...")``) or from ``model``, a
    ``ModelRef`` (a small frozen value: a served model travels as its URL, its
    id and the *name* of its key's variable, so each worker reads the key from
    its own environment and the key is never pickled). Each process builds one
    per ``key`` and keeps it (``process_backend``).
    """

    factory: Callable[[], Backend] | None = None
    model: ModelRef = ModelRef()
    key: str = ""

    @classmethod
    def of(cls, factory: Callable[[], Backend] | None, model: ModelRef = ModelRef()) -> "BackendSpec":
        """``factory``, else ``model`` (a ``ModelRef``, read where it was given: this only keys it)."""
        if factory is not None:
            return cls(factory=factory, key="factory:" + _digest_of(factory))
        return cls(model=model, key=f"model:{model!r}")

    def build(self) -> Backend:
        if self.factory is not None:
            return self.factory()
        return self.model.backend()


def _digest_of(obj: Any) -> str:
    """A content key for a factory; its identity when it cannot be pickled."""
    try:
        import cloudpickle as pickler
    except ImportError:  # pragma: no cover - distributed brings cloudpickle
        import pickle as pickler
    try:
        return hashlib.sha256(pickler.dumps(obj)).hexdigest()
    except Exception:  # noqa: BLE001 - unpicklable: only usable in this process
        return f"id-{id(obj)}"


_PROCESS_BACKENDS: dict[str, Backend] = {}
_PROCESS_LOCK = threading.Lock()


def process_backend(spec: BackendSpec) -> Backend:
    """This process's backend for ``spec``: built on first use, then kept."""
    with _PROCESS_LOCK:
        backend = _PROCESS_BACKENDS.get(spec.key)
        if backend is None:
            backend = _PROCESS_BACKENDS[spec.key] = spec.build()
        return backend


def process_backend_count() -> int:
    """How many backends this process has built for maps (one per model)."""
    with _PROCESS_LOCK:
        return len(_PROCESS_BACKENDS)


@dataclass(frozen=True)
class ItemSpec:
    """Everything an item needs besides its input; travels to a worker once.

    ``job`` is every item's ``JobSpec`` but for its input and name (its grants absolute, its ``cwd`` and
    ``runs_dir`` set), ``backend`` how a process gets the model."""

    job: JobSpec
    backend: BackendSpec

    @property
    def sha256(self) -> str:
        return self.job.guest.sha256

    @property
    def name(self) -> str:
        return self.job.name or self.job.guest.name

    def item_job(self, index: int, item: Any) -> JobSpec:
        """Item ``index``'s job: the template with the item as its input, named ``guest[index]``."""
        return self.job.replace(input=item, name=f"{self.name}[{index}]")


# --- one item -----------------------------------------------------------------------


class RunningJobs:
    """The jobs a process's pool threads are running, each on its own thread (``Job.run_here``), and the cancel
    of all of them at once: one thread an item instead of two, and no poll of the map's cancel. ``in_flight``
    glances at each (its item and what it does now) for a view of the map."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: dict[Job, int] = {}  # each running job, and its item
        self._cancelled = False

    def run(self, job: Job, index: int) -> Any:
        """``job``'s envelope (item ``index``'s), run on this thread; cancelled at once if ``cancel_all`` came
        first."""
        with self._lock:
            self._jobs[job] = index
            cancelled = self._cancelled
        try:
            if cancelled:
                job.cancel()
            return job.run_here()
        finally:
            with self._lock:
                self._jobs.pop(job, None)

    def in_flight(self) -> list[tuple[int, Glimpse]]:
        """Each running item and what its job does now (``Job.glimpse``), in item order."""
        with self._lock:
            running = list(self._jobs.items())
        return sorted(((index, job.glimpse()) for job, index in running), key=lambda pair: pair[0])

    def cancel_all(self) -> None:
        """Cancel every running job, and every one started from now on."""
        with self._lock:
            self._cancelled = True
            jobs = list(self._jobs)
        for job in jobs:
            job.cancel()


def run_item(spec: ItemSpec, backend: Backend, index: int, item: Any,
             cancelled: Callable[[], bool] = lambda: False, *, running: RunningJobs | None = None) -> dict:
    """Run one item as a ``Job``; its outcome as a plain dict. Never raises.

    Pure in the sense Dask needs: it writes only its own job transcript and
    returns the outcome; the run folder is written by the map alone, so a
    retried item cannot be recorded twice. With ``running``, the job runs on
    the calling thread and ``running.cancel_all`` cancels it (``cancelled`` is
    not polled); else on a thread of its own, cancelled once ``cancelled()``.
    """
    started = time.perf_counter()
    try:
        job = Job(spec.item_job(index, item), backend=backend)
    except AbiError as e:  # the item holds more values than the job's max_command_values
        return failed_outcome(index, codes.LIMIT_EXCEEDED, str(e))
    except Exception as e:  # noqa: BLE001 - a host error fails this item only
        error = internal_error(f"{spec.name}[{index}]", e)
        return failed_outcome(index, error.code, error.message)
    ready = time.perf_counter()
    envelope = running.run(job, index) if running is not None else await_job(job.start(), cancelled)
    return job_outcome(index, job, envelope, started=started, ready=ready)


def job_outcome(index: int, job: Job, envelope: Any, *, started: float, ready: float) -> dict:
    """Item ``index``'s outcome from its finished ``job``: its status, job, usage and times (``setup_s``: from
    ``started`` to ``ready`` to run, ``run_s``: from then to now), with the envelope's result or error."""
    outcome = {"item": index, "status": envelope.status.value, "job_id": job.id, "pid": os.getpid(),
               "usage": envelope.usage.to_json(), "setup_s": ready - started, "run_s": time.perf_counter() - ready}
    outcome.update(envelope_outcome(envelope))
    return outcome


def envelope_outcome(envelope: Any) -> dict:
    """What an item's outcome carries of its job's envelope: the result, with its ``sources``, ``confidence`` and
    ``rejected`` fields where the envelope has them, or the error."""
    if envelope.ok:
        out = {"result": envelope.result}
        if envelope.sources is not None:
            out["sources"] = envelope.sources
        if envelope.confidence is not None:
            out["confidence"] = envelope.confidence
        if envelope.rejected is not None:
            out["rejected"] = envelope.rejected
        return out
    return {"error": envelope.error.to_json()} if envelope.error is not None else {}


def await_job(job: Job, cancelled: Callable[[], bool]):
    """The job's envelope; the job is cancelled once ``cancelled()`` says the map is."""
    while True:
        try:
            return job.wait(CANCEL_POLL_S)
        except TimeoutError:
            if cancelled():
                job.cancel()
                return job.wait()


def failed_outcome(index: int, code: str, message: str) -> dict:
    return {"item": index, "status": JobStatus.FAILED.value, "error": {"code": code, "message": message}}


__all__ = [
    "CANCEL_POLL_S", "WORKER_LOST", "BackendSpec", "process_backend", "process_backend_count", "ItemSpec",
    "RunningJobs", "run_item", "job_outcome", "envelope_outcome", "await_job", "failed_outcome"
]

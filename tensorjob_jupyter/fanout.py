"""Map one guest over many inputs: locally, resumably, or on a Dask cluster.

    result = tj.map("summarise.wasm", "pages.jsonl", "runs/pages", read=["book.pdf"],
                    concurrency=4)                       # or cluster="tcp://scheduler:8786"

Each non-blank line of the manifest (JSONL) is one item; its JSON value is
that item's job input. Items are numbered from 0 in manifest order, counting
only non-blank lines, so item ``i`` is the ``i``-th JSON value. Every item is
an ordinary ``Job`` with the same guest, read grants, limits and model. One
bad item never fails the others: it is recorded with its error and the map
goes on.

The run folder is the map's ledger (cuttlefish's fan-out, reference §9.5):

    ledger.json      what this folder is: the manifest's SHA-256, the guest's
                     SHA-256, the item count, one entry per session
    results.jsonl    {"item": i, "result": ...}                       per completed item
    failures.jsonl   {"item": i, "error": {"code": ..., "message": ...}} per failed item
    jobs/            each item's job transcript (events.jsonl, envelope.json)

Lines are appended, flushed and fsynced as each item finishes, so a crash
loses nothing already finished (a torn last line is cut off on resume and
its item runs again). Lines are in finishing order, not item order. Running
the same map into the same folder resumes it: items already *concluded*
(completed or failed, as in cuttlefish) are skipped; ``retry_failed=True``
runs the failed ones again. A folder started with a different manifest or a
different guest is refused (``ResumeRefused``), since mixing them would make
the results files lie. An item whose job was cancelled (the map was
cancelled) is not concluded: it runs on resume.

The manifest is read and checked completely before any item runs: a line
that is not UTF-8 or not JSON, or a manifest with no items, raises
``ManifestError`` naming the 1-based line number in the file.

Where items run is an executor with one method, ``run(todo, sink)``: the
local one here (``concurrency`` jobs at a time on threads, sharing this
process's model backend), or the Dask one in ``fanout_dask`` (imported only
when a cluster is named). Both hand every finished item's outcome -- a small
picklable dict -- to the ``MapRun``, the only writer of the run folder and
the owner of the live counters the notebook view reads (``progress()``,
``subscribe()``, ``wait_for_update()``).

The command line (``tensorjob map``) is at the bottom: ``add_map_parser``
and ``cmd_map``.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence, TextIO

from .abi import JobStatus, codes, dumps
from .inference.base import Backend
from .jobs import Job, resolve_guest
from .limits import Limits
from .runner import InferOptions

__all__ = ["BackendSpec", "ItemSpec", "Manifest", "ManifestError", "MapError", "MapProgress", "MapResult",
           "MapRun", "ResumeRefused", "RunFolder", "WORKER_LOST", "add_map_parser", "cmd_map", "map",
           "parse_manifest", "process_backend", "read_manifest", "run_item", "start_map"]

LEDGER = "ledger.json"
RESULTS = "results.jsonl"
FAILURES = "failures.jsonl"
JOBS = "jobs"
LEDGER_FORMAT = "tensorjob-map/1"
DEFAULT_CONCURRENCY = 4
CANCEL_POLL_S = 0.25
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct.Q4_1"
#: The error code of an item whose worker process died every time it was
#: tried (Dask's ``KilledWorker``). Not one of cuttlefish's codes.
WORKER_LOST = "worker_lost"


class MapError(Exception):
    """A map could not start (nothing ran)."""


class ManifestError(MapError, ValueError):
    """The manifest is unreadable, has a bad line, or has no items."""

    def __init__(self, message: str, line: int | None = None):
        super().__init__(message)
        self.line = line


class ResumeRefused(MapError):
    """The run folder belongs to another map, or another map is writing to it."""


# --- the manifest -------------------------------------------------------------------


@dataclass(frozen=True)
class Manifest:
    items: tuple[Any, ...]
    sha256: str
    source: str  # the file's absolute path, or "<list>"

    def __len__(self) -> int:
        return len(self.items)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse_manifest(data: bytes, source: str = "<bytes>") -> Manifest:
    """Every item of a JSONL manifest, or ``ManifestError`` naming the line."""
    items = []
    for number, raw in enumerate(data.split(b"\n"), start=1):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ManifestError(f"{source}: line {number} is not UTF-8 (byte {raw[e.start]:#04x} at "
                                f"column {e.start + 1})", number) from None
        if not text.strip():
            continue
        try:
            items.append(json.loads(text, parse_constant=_reject_constant))
        except json.JSONDecodeError as e:
            raise ManifestError(f"{source}: line {number} is not valid JSON: {e.msg} at column {e.colno}",
                                number) from None
        except ValueError as e:
            raise ManifestError(f"{source}: line {number} is not valid JSON: {e}", number) from None
    if not items:
        raise ManifestError(f"{source}: the manifest has no items (every line is blank)")
    return Manifest(tuple(items), hashlib.sha256(data).hexdigest(), source)


def read_manifest(manifest: str | os.PathLike | Sequence[Any]) -> Manifest:
    """A manifest from a JSONL file, or from a list of inputs (hashed as JSONL)."""
    if isinstance(manifest, (str, os.PathLike)):
        path = Path(manifest).absolute()
        try:
            data = path.read_bytes()
        except OSError as e:
            raise ManifestError(f"cannot read manifest {manifest}: {e.strerror}") from None
        return parse_manifest(data, str(path))
    try:
        data = "".join(dumps(item) + "\n" for item in manifest).encode("utf-8")
    except (TypeError, ValueError) as e:
        raise ManifestError(f"a manifest item is not JSON: {e}") from None
    return parse_manifest(data, "<list>")


# --- what every item shares: the spec, and the model backend per process --------------


@dataclass(frozen=True)
class BackendSpec:
    """How a process gets its model backend; small and picklable.

    Backends hold threads and cannot travel, so a worker builds its own from
    a ``factory`` (any picklable callable, e.g.
    ``functools.partial(ScriptedBackend, reply="...")``) or from ``model``
    (a GGUF path; None is the embedded model) and ``model_options`` (e.g.
    ``n_threads``) through ``get_backend``. Each process builds one per
    ``key`` and keeps it (``process_backend``).
    """

    factory: Callable[[], Backend] | None = None
    model: str | None = None
    model_options: tuple[tuple[str, Any], ...] = ()
    key: str = ""

    @classmethod
    def of(cls, factory: Callable[[], Backend] | None, model: str | os.PathLike | None,
           model_options: dict | None = None) -> "BackendSpec":
        if factory is not None:
            return cls(factory=factory, key="factory:" + _digest_of(factory))
        model = os.path.abspath(model) if model is not None else None
        options = tuple(sorted((model_options or {}).items()))
        return cls(model=model, model_options=options, key=f"model:{model or ''}:{options!r}")

    def build(self) -> Backend:
        if self.factory is not None:
            return self.factory()
        from .inference.lazy import LazyBackend

        model, options = self.model, dict(self.model_options)

        def load() -> Backend:
            from .inference.models import get_backend

            return get_backend(model, **options)

        return LazyBackend(load, Path(model).stem if model else DEFAULT_MODEL_NAME)


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
    """Everything an item needs besides its input; travels to a worker once."""

    wasm: bytes
    read: tuple[str, ...]
    cwd: str
    limits: Limits
    infer: InferOptions | None
    backend: BackendSpec
    runs_dir: str
    name: str = "guest"


# --- one item -----------------------------------------------------------------------


def run_item(spec: ItemSpec, backend: Backend, index: int, item: Any,
             cancelled: Callable[[], bool] = lambda: False) -> dict:
    """Run one item as a ``Job``; its outcome as a plain dict. Never raises.

    Pure in the sense Dask needs: it writes only its own job transcript and
    returns the outcome; the run folder is written by the map alone, so a
    retried item cannot be recorded twice.
    """
    started = time.perf_counter()
    try:
        job = Job(spec.wasm, input=item, read=spec.read, backend=backend, limits=spec.limits,
                  infer=spec.infer, runs_dir=spec.runs_dir, cwd=spec.cwd, name=f"{spec.name}[{index}]")
    except Exception as e:  # noqa: BLE001 - a host error fails this item only
        return failed_outcome(index, codes.WASM_TRAP, f"internal host error: {type(e).__name__}: {e}")
    ready = time.perf_counter()
    job.start()
    envelope = _await_job(job, cancelled)
    outcome = {"item": index, "status": envelope.status.value, "job_id": job.id, "pid": os.getpid(),
               "usage": envelope.usage.to_json(), "setup_s": ready - started,
               "run_s": time.perf_counter() - ready}
    if envelope.ok:
        outcome["result"] = envelope.result
    elif envelope.error is not None:
        outcome["error"] = envelope.error.to_json()
    return outcome


def _await_job(job: Job, cancelled: Callable[[], bool]):
    while True:
        try:
            return job.wait(CANCEL_POLL_S)
        except TimeoutError:
            if cancelled():
                job.cancel()
                return job.wait()


def failed_outcome(index: int, code: str, message: str) -> dict:
    return {"item": index, "status": JobStatus.FAILED.value, "error": {"code": code, "message": message}}


# --- the run folder -------------------------------------------------------------------


def _fsync_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _read_records(path: Path, *, repair: bool = False) -> list[dict]:
    """The records of a results/failures file, without a torn last line
    (a crash mid-append); ``repair`` also cuts it off the file."""
    if not path.exists():
        return []
    data = path.read_bytes()
    cut = data.rfind(b"\n") + 1
    if cut < len(data) and repair:  # its item runs again
        with open(path, "r+b") as f:
            f.truncate(cut)
    data = data[:cut]
    records = []
    for number, line in enumerate(data.splitlines(), start=1):
        try:
            record = json.loads(line)
            int(record["item"])
        except (ValueError, KeyError, TypeError):
            raise ResumeRefused(f"{path}: line {number} is not a record this map wrote; "
                                f"the run folder was edited or is corrupt") from None
        records.append(record)
    return records


class RunFolder:
    """The ledger, the results files and the lock of one map's run folder."""

    def __init__(self, path: str | os.PathLike, *, fsync: bool = True):
        self.path = Path(path).absolute()
        self.results_path = self.path / RESULTS
        self.failures_path = self.path / FAILURES
        self.jobs_path = self.path / JOBS
        self.fsync = fsync
        self.completed: set[int] = set()
        self.failed: set[int] = set()
        self._ledger: dict = {}
        self._lock_file = None
        self._results = None
        self._failures = None

    def open(self, manifest: Manifest, wasm_sha256: str, *, retry_failed: bool, where: str) -> None:
        """Create or resume the folder; refuses a different manifest or guest."""
        self.path.mkdir(parents=True, exist_ok=True)
        self._lock()
        try:
            self._ledger = self._check_ledger(manifest, wasm_sha256)
            self.completed = {r["item"] for r in _read_records(self.results_path, repair=True)}
            failures = [r for r in _read_records(self.failures_path, repair=True)
                        if r["item"] not in self.completed]
            if retry_failed and failures:
                _fsync_write(self.failures_path, "")
                failures = []
            self.failed = {r["item"] for r in failures}
            self._ledger["sessions"].append({"started_at": _now(), "finished_at": None, "where": where})
            _fsync_write(self.path / LEDGER, json.dumps(self._ledger, indent=2) + "\n")
            self.jobs_path.mkdir(exist_ok=True)
            self._results = open(self.results_path, "a", encoding="utf-8")
            self._failures = open(self.failures_path, "a", encoding="utf-8")
        except BaseException:
            self.close()
            raise

    def _lock(self) -> None:
        try:
            import fcntl
        except ImportError:  # pragma: no cover - no advisory locks on this platform
            return
        self._lock_file = open(self.path / ".lock", "w")
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._lock_file.close()
            self._lock_file = None
            raise ResumeRefused(f"run folder {self.path} is in use by another map right now") from None

    def _check_ledger(self, manifest: Manifest, wasm_sha256: str) -> dict:
        path = self.path / LEDGER
        if not path.exists():
            if self.results_path.exists() or self.failures_path.exists():
                raise ResumeRefused(f"run folder {self.path} has results but no {LEDGER}; "
                                    f"it was not made by tensorjob map")
            return {"format": LEDGER_FORMAT, "created_at": _now(),
                    "manifest": {"source": manifest.source, "sha256": manifest.sha256, "items": len(manifest)},
                    "guest": {"sha256": wasm_sha256}, "sessions": []}
        try:
            ledger = json.loads(path.read_text(encoding="utf-8"))
            old_manifest, old_guest = ledger["manifest"]["sha256"], ledger["guest"]["sha256"]
        except (ValueError, KeyError, TypeError):
            raise ResumeRefused(f"{path} is not a tensorjob map ledger") from None
        if old_manifest != manifest.sha256:
            raise ResumeRefused(
                f"manifest changed: run folder {self.path} was started with a manifest whose SHA-256 is "
                f"{old_manifest[:16]}..., this one's is {manifest.sha256[:16]}...; "
                f"use a new run folder (or restore the original manifest to resume)")
        if old_guest != wasm_sha256:
            raise ResumeRefused(
                f"guest changed: run folder {self.path} was started with a guest whose SHA-256 is "
                f"{old_guest[:16]}..., this one's is {wasm_sha256[:16]}...; use a new run folder")
        return ledger

    def record(self, outcome: dict) -> bool:
        """Append a concluded item; False (nothing written) if it already was."""
        index = outcome["item"]
        if index in self.completed or index in self.failed:
            return False
        if outcome["status"] == JobStatus.COMPLETED.value:
            f, line = self._results, {"item": index, "result": outcome.get("result")}
            self.completed.add(index)
        else:
            f, line = self._failures, {"item": index, "error": outcome["error"]}
            self.failed.add(index)
        f.write(dumps(line) + "\n")
        f.flush()
        if self.fsync:
            os.fsync(f.fileno())
        return True

    def finish(self, summary: dict) -> None:
        if self._ledger.get("sessions"):
            self._ledger["sessions"][-1].update(finished_at=_now(), **summary)
            _fsync_write(self.path / LEDGER, json.dumps(self._ledger, indent=2) + "\n")

    def close(self) -> None:
        for f in (self._results, self._failures, self._lock_file):
            if f is not None:
                f.close()
        self._results = self._failures = self._lock_file = None


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


# --- live state ---------------------------------------------------------------------


@dataclass(frozen=True)
class MapProgress:
    """One consistent look at a map. ``completed``/``failed`` count this
    session's items; ``skipped_*`` those concluded before it (resume)."""

    total: int
    completed: int = 0
    failed: int = 0
    running: int = 0
    skipped_completed: int = 0
    skipped_failed: int = 0
    cancelled: int = 0
    peak_running: int = 0
    elapsed_s: float = 0.0
    status: str = "running"  # running | finished | cancelled | error
    dashboard_link: str | None = None
    version: int = 0

    @property
    def skipped(self) -> int:
        return self.skipped_completed + self.skipped_failed

    @property
    def concluded(self) -> int:
        return self.skipped + self.completed + self.failed

    @property
    def remaining(self) -> int:
        return self.total - self.concluded

    @property
    def throughput(self) -> float:
        """Items concluded per second in this session."""
        return (self.completed + self.failed) / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def to_json(self) -> dict:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        out.update(skipped=self.skipped, remaining=self.remaining, throughput=round(self.throughput, 3))
        return out


@dataclass(frozen=True)
class MapResult:
    """How a map ended; counts cover the whole run folder, resumes included."""

    run_dir: Path
    total: int
    completed: int
    failed: int
    skipped: int
    ran: int
    status: str
    elapsed_s: float
    throughput: float
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "finished" and self.completed == self.total

    @property
    def results_path(self) -> Path:
        return self.run_dir / RESULTS

    @property
    def failures_path(self) -> Path:
        return self.run_dir / FAILURES

    def results(self) -> dict[int, Any]:
        """Each completed item's result, by item number."""
        return {r["item"]: r["result"] for r in _read_records(self.results_path)}

    def failures(self) -> dict[int, dict]:
        """Each failed item's error (``code``, ``message``), by item number."""
        return {r["item"]: r["error"] for r in _read_records(self.failures_path)}

    def to_json(self) -> dict:
        return {"status": self.status, "run_dir": str(self.run_dir), "results": str(self.results_path),
                "failures": str(self.failures_path), "total": self.total, "completed": self.completed,
                "failed": self.failed, "skipped": self.skipped, "ran": self.ran,
                "elapsed_s": round(self.elapsed_s, 3), "throughput": round(self.throughput, 3),
                "error": self.error}


@dataclass
class ItemTimes:
    """Where item time went, summed over this session (for benchmarks)."""

    items: int = 0
    setup_s: float = 0.0    # building the Job (grants, event stream, transcript folder)
    run_s: float = 0.0      # start -> envelope: thread, reactor, transcript close
    reactor_s: float = 0.0  # of which the reactor: instantiate, guest calls, inference
    latency_s: float = 0.0  # submitted -> outcome back in the map's thread

    def to_json(self) -> dict:
        n = self.items or 1
        return {"items": self.items, "setup_ms": 1000 * self.setup_s / n, "run_ms": 1000 * self.run_s / n,
                "reactor_ms": 1000 * self.reactor_s / n, "latency_ms": 1000 * self.latency_s / n}


class MapRun:
    """A map in progress: live counters, subscribers, ``wait()`` and ``cancel()``.

    Built by ``start_map``. The map's own thread is the only writer of the
    run folder; everything here is safe to read from any thread.
    """

    RECENT = 1000

    def __init__(self, folder: RunFolder, manifest: Manifest, executor: Any):
        self.folder = folder
        self.manifest = manifest
        self.executor = executor
        self._times = ItemTimes()
        self._recent: collections.deque[dict] = collections.deque(maxlen=self.RECENT)
        self._cond = threading.Condition()
        self._subscribers: list[Callable[[dict], None]] = []
        self._cancel = threading.Event()
        self._done = threading.Event()
        self._submitted: dict[int, float] = {}
        self._progress = MapProgress(total=len(manifest), skipped_completed=len(folder.completed),
                                     skipped_failed=len(folder.failed),
                                     dashboard_link=getattr(executor, "dashboard_link", None))
        self._started = time.monotonic()
        self._error: str | None = None
        self._result: MapResult | None = None
        self._finished_event: dict | None = None
        self._thread = threading.Thread(target=self._drive, name="tensorjob-map", daemon=True)

    # -- reading (any thread) -----------------------------------------------------------

    @property
    def run_dir(self) -> Path:
        return self.folder.path

    @property
    def dashboard_link(self) -> str | None:
        return self._progress.dashboard_link

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def progress(self) -> MapProgress:
        with self._cond:
            return self._stamp(self._progress)

    @property
    def recent(self) -> list[dict]:
        """The last items to finish (item, status, error, job_id, pid), oldest first."""
        with self._cond:
            return list(self._recent)

    @property
    def times(self) -> ItemTimes:
        """Where this session's item time went (a copy)."""
        with self._cond:
            return replace(self._times)

    def _stamp(self, progress: MapProgress) -> MapProgress:
        if progress.status == "running":
            return replace(progress, elapsed_s=time.monotonic() - self._started)
        return progress

    def wait_for_update(self, since_version: int = -1, timeout: float | None = None) -> MapProgress:
        """The progress once its ``version`` passes ``since_version`` (or at timeout)."""
        with self._cond:
            self._cond.wait_for(lambda: self._progress.version > since_version or self.done, timeout)
            return self._stamp(self._progress)

    def subscribe(self, callback: Callable[[dict], None]) -> Callable[[], None]:
        """Call ``callback(event)`` on every item and at the end; returns an unsubscribe.

        Events: ``{"type": "item.completed"|"item.failed", "item", "error"?,
        "progress"}`` and ``{"type": "map.finished", "progress"}``. Callbacks run
        on the map's thread: keep them quick (a view should throttle).
        """
        with self._cond:
            finished = self._finished_event
            if finished is None:
                self._subscribers.append(callback)
        if finished is not None:
            callback(finished)

        def unsubscribe() -> None:
            with self._cond:
                if callback in self._subscribers:
                    self._subscribers.remove(callback)
        return unsubscribe

    # -- control ----------------------------------------------------------------------------

    def start(self) -> "MapRun":
        self._thread.start()
        return self

    def cancel(self) -> None:
        """Stop starting items and cancel the running ones; the map ends ``cancelled``."""
        self._cancel.set()
        cancel = getattr(self.executor, "cancel", None)
        if cancel is not None:
            cancel()

    def wait(self, timeout: float | None = None) -> MapResult:
        if not self._done.wait(timeout):
            raise TimeoutError(f"map into {self.run_dir} still running after {timeout} s")
        assert self._result is not None
        return self._result

    # -- the sink the executor reports to (the map's thread) ---------------------------------

    def todo(self) -> Iterator[tuple[int, Any]]:
        concluded = self.folder.completed | self.folder.failed
        for index, item in enumerate(self.manifest.items):
            if index not in concluded:
                yield index, item

    def started(self, index: int) -> None:
        self._submitted[index] = time.monotonic()
        self._update(lambda p: replace(p, running=p.running + 1, peak_running=max(p.peak_running, p.running + 1)))

    def finished(self, outcome: dict) -> None:
        index = outcome["item"]
        submitted = self._submitted.pop(index, None)
        if submitted is None:
            return  # a duplicate report (a retried task): already handled
        self._account(outcome, time.monotonic() - submitted)
        status = outcome["status"]
        if status == JobStatus.CANCELLED.value:
            self._update(lambda p: replace(p, running=p.running - 1, cancelled=p.cancelled + 1))
            return
        self.folder.record(outcome)
        ok = status == JobStatus.COMPLETED.value
        progress = self._update(lambda p: replace(p, running=p.running - 1, completed=p.completed + ok,
                                                  failed=p.failed + (not ok)))
        event = {"type": "item.completed" if ok else "item.failed", "item": index,
                 "progress": progress.to_json()}
        if not ok:
            event["error"] = outcome["error"]
        self._notify(event)

    def _account(self, outcome: dict, latency: float) -> None:
        with self._cond:
            if "run_s" in outcome:
                times = self._times
                times.items += 1
                times.setup_s += outcome["setup_s"]
                times.run_s += outcome["run_s"]
                times.reactor_s += outcome["usage"]["duration_ms"] / 1000
                times.latency_s += latency
            self._recent.append({k: outcome[k] for k in ("item", "status", "error", "job_id", "pid")
                                 if k in outcome})

    def _update(self, change: Callable[[MapProgress], MapProgress]) -> MapProgress:
        with self._cond:
            progress = change(self._progress)
            self._progress = replace(progress, version=progress.version + 1,
                                     elapsed_s=time.monotonic() - self._started)
            self._cond.notify_all()
            return self._progress

    def _notify(self, event: dict) -> None:
        with self._cond:
            subscribers = list(self._subscribers)
        for callback in subscribers:
            try:
                callback(event)
            except Exception:  # noqa: BLE001 - a broken view must not break the map
                pass

    def _drive(self) -> None:
        try:
            self.executor.run(self.todo(), self)
        except BaseException as e:  # noqa: BLE001 - reported on the result
            self._error = f"{type(e).__name__}: {e}"
        finally:
            self._finish()

    def _status(self) -> str:
        return "error" if self._error else "cancelled" if self._cancel.is_set() else "finished"

    def _finish(self) -> None:
        p = self.progress()
        summary = {"completed": p.completed, "failed": p.failed, "skipped": p.skipped,
                   "status": self._status(), "error": self._error}
        for step in (lambda: self.folder.finish(summary), self.folder.close,
                     getattr(self.executor, "close", lambda: None)):
            try:
                step()
            except Exception as e:  # noqa: BLE001 - the items are recorded; say what went wrong
                self._error = self._error or f"{type(e).__name__}: {e}"
        status = self._status()
        progress = self._update(lambda p: replace(p, status=status, running=0))
        self._result = MapResult(
            run_dir=self.run_dir, total=progress.total, completed=len(self.folder.completed),
            failed=len(self.folder.failed), skipped=progress.skipped, ran=progress.completed + progress.failed,
            status=status, elapsed_s=progress.elapsed_s, throughput=progress.throughput, error=self._error)
        with self._cond:
            self._finished_event = {"type": "map.finished", "progress": progress.to_json()}
        self._notify(self._finished_event)  # before wait() returns: views are complete by then
        with self._cond:
            self._done.set()
            self._cond.notify_all()


# --- running items in this process ---------------------------------------------------------


class LocalExecutor:
    """``concurrency`` items at a time on threads, sharing one model backend."""

    def __init__(self, spec: ItemSpec, backend: Backend, concurrency: int):
        self.spec = spec
        self.backend = backend
        self.concurrency = concurrency

    def run(self, todo: Iterable[tuple[int, Any]], sink: MapRun) -> None:
        def cancelled() -> bool:
            return sink.cancelled

        with ThreadPoolExecutor(self.concurrency, thread_name_prefix="tensorjob-map-item") as pool:
            in_flight: set = set()
            try:
                for index, item in todo:
                    if len(in_flight) >= self.concurrency:
                        in_flight = _report_some(in_flight, sink)
                    if sink.cancelled:
                        break
                    sink.started(index)
                    in_flight.add(pool.submit(run_item, self.spec, self.backend, index, item, cancelled))
                while in_flight:
                    in_flight = _report_some(in_flight, sink)
            except BaseException:
                sink.cancel()  # end the running jobs before the pool waits for them
                raise


def _report_some(in_flight: set, sink: MapRun) -> set:
    """Wait for at least one item to finish and report it; the rest stay in flight."""
    finished, pending = wait(in_flight, return_when=FIRST_COMPLETED)
    for fut in finished:
        sink.finished(fut.result())
    return pending


# --- the entry points ------------------------------------------------------------------------


def start_map(guest: bytes | str | os.PathLike, manifest: str | os.PathLike | Sequence[Any],
              run_dir: str | os.PathLike, *, read: Iterable[str | os.PathLike] = (),
              limits: Limits | None = None, backend: Backend | Callable[[], Backend] | None = None,
              model: str | os.PathLike | None = None, model_options: dict | None = None,
              infer: InferOptions | None = None, concurrency: int | None = None, cluster: Any = None,
              retry_failed: bool = False, retries: int = 1, fsync: bool = True) -> MapRun:
    """Check everything, open the run folder and start the map on a background thread.

    ``backend``: a backend instance (local runs only), or a picklable factory
    returning one (built once per process, on every Dask worker); without it,
    ``model`` (a GGUF path; None is the embedded model) loads on first infer,
    with ``model_options`` for ``get_backend`` (give each of N worker
    processes on one machine ``{"n_threads": cores // N}``: llama.cpp threads
    that outnumber the cores spin against each other).
    ``concurrency``: items at once locally (default 4); on Dask, items in
    flight (default twice the cluster's threads). ``cluster``: None (this
    process), a scheduler address, a ``distributed.Client`` or a Dask cluster
    object. ``retries``: Dask retries of an item whose task raised (a worker
    that dies is retried by Dask regardless, up to ``allowed-failures``).
    Raises ``ManifestError``/``ResumeRefused``/``ValueError`` before any item runs.
    """
    items = read_manifest(manifest)
    if concurrency is not None and concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, got {concurrency}")
    spec, instance = _item_spec(guest, read, limits, backend, model, model_options, infer, run_dir)
    folder = RunFolder(run_dir, fsync=fsync)
    executor = _executor(spec, instance, concurrency, cluster, retries)
    try:
        from .guest import module_digest

        folder.open(items, module_digest(spec.wasm), retry_failed=retry_failed,
                    where=getattr(executor, "where", "local"))
    except BaseException:
        close = getattr(executor, "close", None)
        if close is not None:
            close()
        raise
    return MapRun(folder, items, executor).start()


def map(guest: bytes | str | os.PathLike, manifest: str | os.PathLike | Sequence[Any],
        run_dir: str | os.PathLike, **kwargs: Any) -> MapResult:
    """Run ``guest`` once per manifest item into ``run_dir``; see ``start_map``."""
    run = start_map(guest, manifest, run_dir, **kwargs)
    try:
        return run.wait()
    except KeyboardInterrupt:
        run.cancel()
        return run.wait()


def _item_spec(guest, read, limits, backend, model, model_options, infer,
               run_dir) -> tuple[ItemSpec, Backend | None]:
    cwd = os.getcwd()
    grants = []
    for p in read:
        path = os.path.abspath(os.path.join(cwd, os.fspath(p)))
        if not os.path.exists(path):
            raise FileNotFoundError(f"read grant not found: {p}")
        grants.append(path)
    is_instance = not isinstance(backend, type) and hasattr(backend, "generate_stream")
    instance = backend if backend is not None and is_instance else None
    factory = backend if backend is not None and instance is None else None
    if factory is not None and not callable(factory):
        raise ValueError(f"backend must be a backend or a factory returning one, got {backend!r}")
    name = Path(guest).name if isinstance(guest, (str, os.PathLike)) else "guest"
    spec = ItemSpec(wasm=resolve_guest(guest), read=tuple(grants), cwd=cwd, limits=limits or Limits(),
                    infer=infer, backend=BackendSpec.of(factory, model, model_options),
                    runs_dir=str(Path(run_dir).absolute() / JOBS), name=name)
    return spec, instance


def _executor(spec: ItemSpec, instance: Backend | None, concurrency: int | None, cluster: Any, retries: int):
    if cluster is None:
        backend = instance if instance is not None else process_backend(spec.backend)
        return LocalExecutor(spec, backend, concurrency or DEFAULT_CONCURRENCY)
    if instance is not None:
        raise ValueError("a backend object cannot be sent to Dask workers (it holds threads); pass a "
                         "picklable factory, e.g. functools.partial(ScriptedBackend, reply=...), or model=PATH")
    from .fanout_dask import DaskExecutor

    return DaskExecutor(spec, cluster, concurrency=concurrency, retries=retries)


# --- the command line: tensorjob map ---------------------------------------------------------

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_CANCELLED = 0, 1, 2, 130
SHOW_FAILURES = 20


class _Usage(Exception):
    pass


def add_map_parser(subparsers) -> argparse.ArgumentParser:
    """Add ``tensorjob map`` to the ``tensorjob`` command's subparsers."""
    p = subparsers.add_parser("map", help="run a guest once per line of a JSONL manifest",
                              description="Run a guest once per manifest line (each line's JSON value is "
                                          "that item's input), resumably, here or on a Dask cluster.")
    p.add_argument("guest", help="the guest: a .wasm module, or .c / .zig / .wat source to compile")
    p.add_argument("--over", required=True, metavar="MANIFEST", help="the items: a JSONL file, one input a line")
    p.add_argument("--run-dir", required=True, metavar="DIR",
                   help="where results.jsonl, failures.jsonl and the ledger go; rerun to resume")
    p.add_argument("--read", action="append", default=[], metavar="PATH",
                   help="grant every item read access to a file or directory (repeatable)")
    p.add_argument("--concurrency", type=int, default=None, metavar="N",
                   help=f"items at once (default {DEFAULT_CONCURRENCY}; on a cluster, in flight)")
    p.add_argument("--cluster", default=None, metavar="ADDRESS", help="run items on this Dask scheduler")
    p.add_argument("--max-tokens", type=int, default=None, metavar="N", help="token budget for each item")
    p.add_argument("--timeout", type=float, default=None, metavar="S", help="time limit for each item, seconds")
    p.add_argument("--model", default=None, metavar="PATH",
                   help="a GGUF model file (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--chat", action="store_true", help="apply the model's chat template to each prompt")
    p.add_argument("--retry-failed", action="store_true", help="on resume, run the failed items again")
    p.add_argument("--json", action="store_true", help="print the summary as JSON on stdout, nothing else")
    p.add_argument("--quiet", "-q", action="store_true", help="no live progress on stderr")
    return p


def cmd_map(args, out: TextIO, err: TextIO) -> int:
    """``tensorjob map``: 0 every item completed, 1 some failed, 2 usage error, 130 Ctrl-C."""
    from .text import for_terminal

    try:
        run = _start_from_args(args)
    except _Usage as e:
        err.write(f"tensorjob: error: {e}\n")
        return EXIT_USAGE
    printer = _ProgressPrinter(err, quiet=args.quiet)
    run.subscribe(printer)
    try:
        result = run.wait()
    except KeyboardInterrupt:
        run.cancel()
        result = run.wait()
    if args.json:
        out.write(json.dumps(result.to_json(), indent=2) + "\n")
    else:
        out.write(for_terminal(_summary_text(result)) + "\n")
    out.flush()
    if result.status == "cancelled":
        return EXIT_CANCELLED
    return EXIT_OK if result.ok else EXIT_FAILED


def _start_from_args(args) -> MapRun:
    if not Path(args.guest).is_file():
        raise _Usage(f"guest file not found: {args.guest}")
    for path in args.read:
        if not Path(path).exists():
            raise _Usage(f"--read {path}: no such file or directory")
    if args.model is not None and not Path(args.model).is_file():
        raise _Usage(f"model file not found: {args.model}")
    limits = Limits()
    try:
        if args.max_tokens is not None:
            limits = limits.replace(max_tokens=args.max_tokens)
        if args.timeout is not None:
            limits = limits.replace(job_timeout_s=args.timeout)
    except ValueError:
        raise _Usage("--max-tokens and --timeout must be positive numbers") from None
    if args.concurrency is not None and args.concurrency < 1:
        raise _Usage("--concurrency must be at least 1")
    from .compile import CompileError

    try:
        return start_map(args.guest, args.over, args.run_dir, read=args.read, limits=limits, model=args.model,
                         infer=InferOptions(chat=args.chat), concurrency=args.concurrency,
                         cluster=args.cluster, retry_failed=args.retry_failed)
    except (MapError, CompileError, OSError) as e:
        raise _Usage(_one_line(e)) from None
    except Exception as e:  # noqa: BLE001 - e.g. the cluster cannot be reached
        raise _Usage(f"{type(e).__name__}: {_one_line(e)}") from None


def _one_line(e: object) -> str:
    return " ".join(str(e).split())


def _summary_text(result: MapResult) -> str:
    lines = [f"{result.total} items: {result.completed} completed, {result.failed} failed "
             f"({result.ran} ran, {result.skipped} skipped) in {result.elapsed_s:.1f} s "
             f"({result.throughput:.1f} items/s) -- {result.status}",
             f"results:  {result.results_path}", f"failures: {result.failures_path}"]
    if result.error:
        lines.append(f"error: {result.error}")
    return "\n".join(lines)


class _ProgressPrinter:
    """Throttled progress lines on stderr, plus the first few failures."""

    def __init__(self, err: TextIO, *, quiet: bool, every_s: float = 1.0):
        self.err, self.quiet, self.every_s = err, quiet, every_s
        self._last = 0.0
        self._failures = 0

    def __call__(self, event: dict) -> None:
        if self.quiet:
            return
        from .text import for_terminal

        if event["type"] == "item.failed":
            self._failures += 1
            if self._failures <= SHOW_FAILURES:
                e = event["error"]
                self.err.write(for_terminal(f"✗ item {event['item']}: {e['code']}: {_one_line(e['message'])}") + "\n")
            elif self._failures == SHOW_FAILURES + 1:
                self.err.write("✗ ... more failures in failures.jsonl\n")
        now = time.monotonic()
        if event["type"] == "map.finished" or now - self._last >= self.every_s:
            self._last = now
            p = event["progress"]
            self.err.write(f"· {p['skipped'] + p['completed'] + p['failed']}/{p['total']} "
                           f"({p['completed']} completed, {p['failed']} failed, {p['skipped']} skipped, "
                           f"{p['running']} running, {p['throughput']:.1f} items/s)\n")
        self.err.flush()

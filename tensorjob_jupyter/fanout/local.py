"""``LocalExecutor``: a map's items on threads in this process, ``concurrency`` at a time.

Items share this process's one model backend, and at most ``concurrency``
are submitted at once, so a huge manifest is never queued whole and a
cancel has little to drain. Each outcome goes to the ``MapRun`` as soon as
its item finishes; if the loop is interrupted (an error, Ctrl-C), the
running jobs are cancelled before the pool waits for them.
"""

from __future__ import annotations

from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from typing import Any, Iterable

from tensorjob_jupyter.inference.base import Backend
from tensorjob_jupyter.fanout.items import ItemSpec, RunningJobs, run_item
from tensorjob_jupyter.fanout.run import MapRun
from tensorjob_jupyter.record.glimpse import Glimpse


class LocalExecutor:
    """``concurrency`` items at a time on threads, sharing one model backend."""

    def __init__(self, spec: ItemSpec | None, backend: Backend, concurrency: int):
        self.spec = spec
        self.backend = backend
        self.concurrency = concurrency
        self.running = RunningJobs()

    def cancel(self) -> None:
        """End the running jobs (``MapRun.cancel``); the map's loop starts no more."""
        self.running.cancel_all()

    def in_flight(self) -> list[tuple[int, Glimpse]]:
        """The items running now and what each does (``RunningJobs.in_flight``)."""
        return self.running.in_flight()

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
                    in_flight.add(pool.submit(self.run_item, index, item, cancelled))
                while in_flight:
                    in_flight = _report_some(in_flight, sink)
            except BaseException:
                sink.cancel()  # end the running jobs before the pool waits for them
                raise

    def run_item(self, index: int, item: Any, cancelled) -> dict:
        """One item's outcome, on a pool thread (never raises); a replay of a map runs its own here."""
        assert self.spec is not None, "an executor with no item spec runs its own items"
        return run_item(self.spec, self.backend, index, item, cancelled, running=self.running)


def _report_some(in_flight: set, sink: MapRun) -> set:
    """Wait for at least one item to finish and report it; the rest stay in flight."""
    finished, pending = wait(in_flight, return_when=FIRST_COMPLETED)
    for fut in finished:
        sink.finished(fut.result())
    return pending


__all__ = ["LocalExecutor"]

"""``LocalExecutor``: a map's items on threads in this process, ``concurrency`` at a time.

Items share this process's one model backend, and at most ``concurrency``
are submitted at once, so a huge manifest is never queued whole and a
cancel has little to drain. Each outcome goes to the ``MapRun`` as soon as
its item finishes; if the loop is interrupted (an error, Ctrl-C), the
running jobs are cancelled before the pool waits for them.
"""

from __future__ import annotations

import queue
from concurrent.futures import Future, ThreadPoolExecutor
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

        ended: queue.SimpleQueue[Future] = queue.SimpleQueue()  # each item's future as it ends, in that order
        with ThreadPoolExecutor(self.concurrency, thread_name_prefix="tensorjob-map-item") as pool:
            in_flight = 0
            try:
                for index, item in todo:
                    if in_flight >= self.concurrency:
                        in_flight -= _report_some(ended, sink)
                    if sink.cancelled:
                        break
                    sink.started(index)
                    pool.submit(self.run_item, index, item, cancelled).add_done_callback(ended.put)
                    in_flight += 1
                while in_flight:
                    in_flight -= _report_some(ended, sink)
            except BaseException:
                sink.cancel()  # end the running jobs before the pool waits for them
                raise

    def run_item(self, index: int, item: Any, cancelled) -> dict:
        """One item's outcome, on a pool thread (never raises); a replay of a map runs its own here."""
        assert self.spec is not None, "an executor with no item spec runs its own items"
        return run_item(self.spec, self.backend, index, item, cancelled, running=self.running)


def _report_some(ended: "queue.SimpleQueue[Future]", sink: MapRun) -> int:
    """Wait for at least one item to end and report it, with any others that have ended; how many."""
    finished = [ended.get()]
    while not ended.empty():
        finished.append(ended.get())
    for fut in finished:
        sink.finished(fut.result())
    return len(finished)


__all__ = ["LocalExecutor"]

"""``MapRun``: a map in progress -- its live counters, subscribers, ``wait()`` and ``cancel()``.

It is the sink every executor reports to (``todo``, ``started``,
``finished``), on the map's own thread, and the only writer of the run
folder; so a local run and a Dask run leave the same files, and a retried
task reported twice is recorded once. Everything a view reads
(``progress()``, ``subscribe()``, ``wait_for_update()``) is safe from any
thread.

Two things ride on the map's thread with the recording: the scores, when the map has expected answers
(``scoring.Scoring``: each concluded item is scored as it is recorded, and the running score is part of
every ``MapProgress``), and the token budget (``max_total_tokens``): once this session's items have used
that many tokens (in and out, as their envelopes count them), no item starts and the running ones are
cancelled -- they are not concluded, so running the map again resumes with them -- and the map ends
``stopped``. Items in flight are counted only as they end, so the budget can be passed by what they used.
"""

from __future__ import annotations

import collections
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterator

from tensorjob_jupyter.abi import JobStatus, codes
from tensorjob_jupyter.fanout.map_folder import MapFolder
from tensorjob_jupyter.fanout.manifest import Manifest, item_key
from tensorjob_jupyter.fanout.progress import ItemTimes, MapProgress, MapResult
from tensorjob_jupyter.fanout.scoring import ItemScore, Scoring

#: A map that ended because its token budget (``max_total_tokens``) was spent.
STOPPED = "stopped"


class MapRun:
    """A map in progress: live counters, subscribers, ``wait()`` and ``cancel()``.

    Built by ``start_map``. The map's own thread is the only writer of the
    run folder; everything here is safe to read from any thread.
    """

    RECENT = 1000
    #: Item events a subscriber that comes late (a view shown once the map runs) is given first.
    REPLAYED_EVENTS = 16

    def __init__(self, folder: MapFolder, manifest: Manifest, executor: Any, *, scoring: Scoring | None = None,
                 max_total_tokens: int | None = None):
        self.folder = folder
        self.manifest = manifest
        self.executor = executor
        self.scoring = scoring
        self.max_total_tokens = max_total_tokens
        self._budget_spent = False
        self._times = ItemTimes()
        self._recent: collections.deque[dict] = collections.deque(maxlen=self.RECENT)
        self._latest_events: collections.deque[dict] = collections.deque(maxlen=self.REPLAYED_EVENTS)
        self._cond = threading.Condition()
        self._subscribers: list[Callable[[dict], None]] = []
        self._cancel = threading.Event()
        self._done = threading.Event()
        self._submitted: dict[int, float] = {}
        self._progress = MapProgress(total=len(manifest), skipped_completed=len(folder.completed),
                                     skipped_failed=len(folder.failed),
                                     dashboard_link=getattr(executor, "dashboard_link", None))
        if scoring is not None:
            self._progress = replace(self._progress, **scoring.tally())
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

        Events: ``{"type": "item.completed"|"item.failed", "item", "input",
        "result"|"error", "progress"}`` and ``{"type": "map.finished",
        "progress"}``. Callbacks run on the map's thread: keep them quick (a
        view should throttle), and treat ``input`` and ``result`` as read-only.
        A subscriber that comes once items have ended is first given the latest
        ``REPLAYED_EVENTS`` of their events (on the caller's thread), each event
        exactly once: the map starts before its view can subscribe.
        """
        with self._cond:
            earlier = list(self._latest_events)
            finished = self._finished_event
            if finished is None:
                self._subscribers.append(callback)
        for event in earlier + ([finished] if finished is not None else []):
            try:
                callback(event)
            except Exception:  # noqa: BLE001 - as in _notify: a broken view must not break its caller
                pass

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

    def wait_done(self, timeout: float | None = None) -> bool:
        """Block until the map ends or ``timeout`` passes; True if it ended (as ``Job.wait_done``)."""
        return self._done.wait(timeout)

    def wait(self, timeout: float | None = None) -> MapResult:
        if not self._done.wait(timeout):
            raise TimeoutError(f"map into {self.run_dir} still running after {timeout} s")
        assert self._result is not None
        return self._result

    # -- the sink the executor reports to (the map's thread) ---------------------------------

    def todo(self) -> Iterator[tuple[int, Any]]:
        """The items still to run, each as its checked bytes (``CheckedJson``): its job parses it, once."""
        completed, failed = self.folder.completed, self.folder.failed  # only items already given are added
        items = self.manifest.items
        for index in range(len(items)):
            if index not in completed and index not in failed:
                yield index, items.checked(index)

    def started(self, index: int) -> None:
        self._submitted[index] = time.monotonic()
        self._update(lambda p: replace(p, running=p.running + 1, peak_running=max(p.peak_running, p.running + 1)))

    def finished(self, outcome: dict) -> None:
        index = outcome["item"]
        submitted = self._submitted.pop(index, None)
        if submitted is None:
            return  # a duplicate report (a retried task): already handled
        self._account(outcome, time.monotonic() - submitted)
        tokens = _tokens(outcome)
        status = outcome["status"]
        if status == JobStatus.CANCELLED.value:
            self._update(lambda p: replace(p, running=p.running - 1, cancelled=p.cancelled + 1,
                                           tokens=p.tokens + tokens))
            return
        item = self.manifest.items[index]
        self.folder.record(outcome, item_key(item, index))
        ok = status == JobStatus.COMPLETED.value
        unanswered = not ok and (outcome.get("error") or {}).get("code") == codes.REPLAY_DIVERGENCE
        score = self._score(index, ok, outcome.get("result"))
        scoring = self.scoring if score else None
        progress = self._update(lambda p: replace(p, running=p.running - 1, completed=p.completed + ok,
                                                  failed=p.failed + (not ok), tokens=p.tokens + tokens,
                                                  needs_model=p.needs_model + unanswered,
                                                  **(scoring.tally() if scoring is not None else {})))
        event = {"type": "item.completed" if ok else "item.failed", "item": index,
                 "input": item, "progress": progress.to_json()}
        if ok:
            event["result"] = outcome.get("result")
            event.update({k: outcome[k] for k in ("sources", "confidence") if k in outcome})
        else:
            event["error"] = outcome["error"]
        if score is not None:
            event["score"] = score.to_json()
        self._notify(event, remember=True)
        self._check_budget(progress)

    def _score(self, index: int, ok: bool, result: Any) -> ItemScore | None:
        """The item's score; none once the map is cancelled (or its budget spent), so a slow scorer never holds
        the end: at most the call under way finishes, and the next session scores what this one left."""
        if self.scoring is None or self._cancel.is_set():
            return None
        return self.scoring.add(index, ok, result)

    def _check_budget(self, progress: MapProgress) -> None:
        budget = self.max_total_tokens
        if budget is not None and not self._budget_spent and progress.tokens >= budget and progress.remaining:
            self._budget_spent = True
            self.cancel()

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

    def _notify(self, event: dict, *, remember: bool = False) -> None:
        with self._cond:  # remembered and sent to the subscribers of the moment at once: never both or neither
            if remember:
                self._latest_events.append(event)
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
        if self._error:
            return "error"
        if self._budget_spent:
            return STOPPED
        return "cancelled" if self._cancel.is_set() else "finished"

    def _finish(self) -> None:
        p = self.progress()
        summary = {"completed": p.completed, "failed": p.failed, "skipped": p.skipped,
                   "status": self._status(), "error": self._error}
        scoring = self.scoring
        keep_scores = (lambda: scoring.finish(self.folder.path)) if scoring is not None else (lambda: None)
        for step in (keep_scores, lambda: self.folder.finish(summary), self.folder.close,
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
            status=status, elapsed_s=progress.elapsed_s, throughput=progress.throughput, error=self._error,
            inputs=self.manifest.items, tokens=progress.tokens)  # parsed an item at a time, as asked for
        with self._cond:
            self._finished_event = {"type": "map.finished", "progress": progress.to_json()}
        self._notify(self._finished_event)  # before wait() returns: views are complete by then
        with self._cond:
            self._done.set()
            self._cond.notify_all()


def _tokens(outcome: dict) -> int:
    """Tokens in and out an item's envelope counts (0 for an item whose job never ran)."""
    usage = outcome.get("usage")
    usage = usage if isinstance(usage, dict) else {}
    return sum(v for v in (usage.get("tokens_in"), usage.get("tokens_out"))
               if isinstance(v, int) and not isinstance(v, bool) and v > 0)


__all__ = ["STOPPED", "MapRun"]

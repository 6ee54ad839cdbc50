"""``MapRun``: a map in progress -- its live counters, subscribers, ``wait()`` and ``cancel()``.

It is the sink every executor reports to (``todo``, ``started``, ``finished``), on the map's own thread,
and the only writer of the run folder; so a local run and a Dask run leave the same files, and a retried
task reported twice is recorded once. An item is reported concluded (progress, events) only once its
record is fsynced: by the map's commit thread, a batch at a time (``group_commit``). Everything a view
reads (``progress()``, ``subscribe()``, ``wait_for_update()``) is safe from any thread.

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
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterator

from tensorjob_jupyter.abi import JobStatus, codes
from tensorjob_jupyter.fanout.group_commit import GroupCommit
from tensorjob_jupyter.fanout.map_folder import MapFolder
from tensorjob_jupyter.fanout.manifest import Manifest, item_key
from tensorjob_jupyter.fanout.progress import ItemTimes, MapProgress, MapResult
from tensorjob_jupyter.fanout.scoring import ItemScore, Scoring
from tensorjob_jupyter.record.glimpse import Glimpse

#: A map that ended because its token budget (``max_total_tokens``) was spent.
STOPPED = "stopped"


@dataclass(frozen=True)
class InFlight:
    """One item running now: its index and key, and what its job does (``Glimpse``: phase, infers, tokens, the
    tail of its text)."""

    item: int
    key: str
    glimpse: Glimpse

    def to_json(self) -> dict[str, Any]:
        return {"item": self.item, "key": self.key, **self.glimpse.to_json()}


class MapRun:
    """A map in progress: live counters, subscribers, ``wait()`` and ``cancel()``.

    Built by ``start_map``. The map's own thread is the only writer of the
    run folder; everything here is safe to read from any thread.
    """

    RECENT = 1000
    #: Item events a subscriber that comes late (a view shown once the map runs) is given first.
    REPLAYED_EVENTS = 16

    def __init__(self, folder: MapFolder, manifest: Manifest, executor: Any, *, scoring: Scoring | None = None,
                 max_total_tokens: int | None = None, notes: list[str] | tuple[str, ...] = (),
                 model: str | None = None, only: "frozenset[int] | None" = None):
        self.folder = folder
        #: The model every item of this session runs on, as each record names it (``start.model_label``).
        self.model = model
        #: The items this session runs, when not all of them (a cascade's oracle: ``cascade.py``).
        self.only = only
        #: One line each about how the map runs that a person should know before it does (a front end prints
        #: them): a run folder withheld from a read grant that covers it (``start.withheld_notes``).
        self.notes: tuple[str, ...] = tuple(notes)
        self.manifest = manifest
        self.executor = executor
        self.scoring = scoring
        self.max_total_tokens = max_total_tokens
        self._budget_spent = False
        self._recorded = 0  # items this session recorded (on the map's thread; reported once durable)
        self._times = ItemTimes()
        self._recent: collections.deque[dict] = collections.deque(maxlen=self.RECENT)
        self._latest_events: collections.deque[dict] = collections.deque(maxlen=self.REPLAYED_EVENTS)
        self._cond = threading.Condition()
        self._subscribers: list[Callable[[dict], None]] = []
        self._cancel = threading.Event()
        self._done = threading.Event()
        self._submitted: dict[int, float] = {}
        wanted = range(len(manifest)) if only is None else sorted(only)
        self._progress = MapProgress(total=len(wanted) if only is not None else len(manifest),
                                     skipped_completed=(len(folder.completed) if only is None else
                                                        sum(1 for i in wanted if i in folder.completed)),
                                     skipped_failed=(len(folder.failed) if only is None else
                                                     sum(1 for i in wanted if i in folder.failed)),
                                     dashboard_link=getattr(executor, "dashboard_link", None))
        if scoring is not None:
            self._progress = replace(self._progress, **scoring.tally())
        self._started = time.monotonic()
        self._error: str | None = None
        self._result: MapResult | None = None
        self._finished_event: dict | None = None
        self._thread = threading.Thread(target=self._drive, name="tensorjob-map", daemon=True)
        self._commit = GroupCommit(fsync=folder.fsync, on_failure=self._disk_failed)

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

    def in_flight(self) -> list[InFlight]:
        """The items running now, in item order, each with what its job does -- from its first step, before it
        concludes (empty where the executor cannot tell: a Dask cluster's items run in other processes)."""
        glance = getattr(self.executor, "in_flight", None)
        if glance is None or self.done:
            return []
        items = self.manifest.items
        return [InFlight(index, item_key(items[index], index), glimpse) for index, glimpse in glance()]

    def wait_for_update(self, since_version: int = -1, timeout: float | None = None) -> MapProgress:
        """The progress once its ``version`` passes ``since_version`` (or at timeout)."""
        with self._cond:
            self._cond.wait_for(lambda: self._progress.version > since_version or self.done, timeout)
            return self._stamp(self._progress)

    def subscribe(self, callback: Callable[[dict], None]) -> Callable[[], None]:
        """Call ``callback(event)`` on every item and at the end; returns an unsubscribe.

        Events: ``{"type": "item.completed"|"item.failed", "item", "input",
        "result"|"error", "progress"}`` and ``{"type": "map.finished",
        "progress"}``. Callbacks run on the map's commit thread, in order, once the item's record is
        durable: keep them quick (a view should throttle), and treat ``input`` and ``result`` as read-only.
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
        for index in (range(len(items)) if self.only is None else sorted(self.only)):
            if index not in completed and index not in failed:
                yield index, items.checked(index)

    def started(self, index: int) -> None:
        self._submitted[index] = time.monotonic()
        self._update(lambda p: dict(running=p.running + 1, peak_running=max(p.peak_running, p.running + 1)))

    def finished(self, outcome: dict) -> None:
        index = outcome["item"]
        submitted = self._submitted.pop(index, None)
        if submitted is None:
            return  # a duplicate report (a retried task): already handled
        self._account(outcome, time.monotonic() - submitted)
        tokens = _tokens(outcome)
        status = outcome["status"]
        if status == JobStatus.CANCELLED.value:
            self._update(lambda p: dict(running=p.running - 1, cancelled=p.cancelled + 1,
                                           tokens=p.tokens + tokens))
            return
        # its job has ended and its tokens are spent (the budget is checked now, before another item starts);
        # it is reported concluded once its record is durable
        progress = self._update(lambda p: dict(running=p.running - 1, tokens=p.tokens + tokens))
        item = self.manifest.items[index]
        if self.model is not None:
            outcome["model"] = self.model
        fd = self.folder.record(outcome, item_key(item, index))
        self._recorded += 1
        ok = status == JobStatus.COMPLETED.value
        score = self._score(index, ok, outcome.get("result"))
        tally = self.scoring.tally() if score is not None and self.scoring is not None else {}
        self._commit.after_sync(fd, lambda: self._report(index, item, outcome, score, tally))
        self._check_budget(progress)

    def _report(self, index: int, item: Any, outcome: dict, score: ItemScore | None, tally: dict) -> None:
        """Say item ``index`` concluded -- its progress, its event -- once its record is durable
        (``group_commit``, in the order items were recorded); ``tally``: the scores as of this item."""
        ok = outcome["status"] == JobStatus.COMPLETED.value
        unanswered = not ok and (outcome.get("error") or {}).get("code") == codes.REPLAY_DIVERGENCE
        progress = self._update(lambda p: dict(completed=p.completed + ok, failed=p.failed + (not ok),
                                               needs_model=p.needs_model + unanswered, **tally))
        event = {"type": "item.completed" if ok else "item.failed", "item": index,
                 "input": item, "progress": progress.to_json()}
        if ok:
            event["result"] = outcome.get("result")
            event.update({k: outcome[k] for k in ("sources", "confidence", "rejected") if k in outcome})
        else:
            event["error"] = outcome["error"]
        if score is not None:
            event["score"] = score.to_json()
        self._notify(event, remember=True)

    def _disk_failed(self, error: BaseException) -> None:
        """The run folder could not be fsynced: no item is reported concluded from now on, and the map ends."""
        self._error = self._error or f"{type(error).__name__}: {error}"
        self.cancel()

    def _score(self, index: int, ok: bool, result: Any) -> ItemScore | None:
        """The item's score; none once the map is cancelled (or its budget spent), so a slow scorer never holds
        the end: at most the call under way finishes, and the next session scores what this one left."""
        if self.scoring is None or self._cancel.is_set():
            return None
        return self.scoring.add(index, ok, result)

    def _check_budget(self, progress: MapProgress) -> None:
        budget = self.max_total_tokens
        left = progress.total - progress.skipped - self._recorded  # items not yet ended (reported or not)
        if budget is not None and not self._budget_spent and progress.tokens >= budget and left:
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

    def _update(self, change: Callable[[MapProgress], dict]) -> MapProgress:
        """The progress with ``change(progress)``'s fields, its next version; told to every waiter."""
        with self._cond:
            p = self._progress
            self._progress = replace(p, **change(p), version=p.version + 1, elapsed_s=time.monotonic() - self._started)
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
        try:
            self._commit.drain()  # every item recorded is reported before the map's summary is taken
        except Exception:  # noqa: BLE001 - close() below says what went wrong
            pass
        p = self.progress()
        summary = {"completed": p.completed, "failed": p.failed, "skipped": p.skipped,
                   "status": self._status(), "error": self._error}
        scoring = self.scoring
        keep_scores = (lambda: scoring.finish(self.folder.path)) if scoring is not None else (lambda: None)
        for step in (self._commit.close, keep_scores, lambda: self.folder.finish(summary), self.folder.close,
                     getattr(self.executor, "close", lambda: None)):
            try:
                step()
            except Exception as e:  # noqa: BLE001 - the items are recorded; say what went wrong
                self._error = self._error or f"{type(e).__name__}: {e}"
        status = self._status()
        progress = self._update(lambda p: dict(status=status, running=0))
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


__all__ = ["STOPPED", "InFlight", "MapRun"]

"""``GroupCommit``: a map's concluded items made durable a batch at a time, each reported only once it is.

An fsync costs milliseconds, so one an item on the map's thread would bound a map with a fast model
to a few hundred items a second. Instead the map's thread writes an item's record (out of this process:
a crash after that loses nothing but power loss) and hands ``after_sync`` what reports it; one commit
thread fsyncs every record written since its last fsync -- what the map wrote while the previous fsync
ran -- and then runs the reports of that batch, in the order they were handed over. So an item reported
concluded (its progress, its event, its place in the result) is always durable, and a batch forms by
itself: no timer, no wait when the map is slow. A failed fsync reports nothing more, is told to
``on_failure`` (the map cancels) and is raised by ``close``.
"""

from __future__ import annotations

import os
import threading
from typing import Callable

Report = Callable[[], None]


class GroupCommit:
    """For each ``after_sync(fd, report)``: fsync ``fd`` (what was written to it so far), then ``report()``;
    the reports in the order they were handed over."""

    def __init__(self, *, fsync: bool = True, on_failure: Callable[[BaseException], None] | None = None,
                 name: str = "tensorjob-map-commit"):
        self._fsync = fsync
        self._on_failure = on_failure  # told of a failed fsync, on the commit thread (a map cancels)
        self._cond = threading.Condition()
        self._pending: list[tuple[int | None, Report]] = []
        self._closing = False
        self._busy = False
        self._error: BaseException | None = None  # a failed fsync
        self._report_error: BaseException | None = None  # a report that raised (a host bug)
        self._thread: threading.Thread | None = None
        self._name = name
        self.batches = 0  # fsyncs made (each for one batch of records)

    def after_sync(self, fd: int | None, report: Report) -> None:
        """Run ``report`` once what was written to ``fd`` so far is on disk (``fd`` None: nothing to wait
        for but the reports before it); at once, here, when the map does not fsync."""
        if not self._fsync:
            report()
            return
        with self._cond:
            if self._error is not None:
                return  # the disk failed: nothing more is reported concluded
            self._pending.append((fd, report))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending or self._closing)
                if not self._pending:
                    return
                batch, self._pending = self._pending, []
                self._busy = True
            try:
                for fd in dict.fromkeys(fd for fd, _ in batch if fd is not None):  # each written before handed over
                    os.fsync(fd)
                self.batches += 1
            except BaseException as e:  # noqa: BLE001 - raised by close(); the batch is never reported
                with self._cond:
                    self._error, self._pending, self._busy = e, [], False
                    self._cond.notify_all()
                if self._on_failure is not None:
                    self._on_failure(e)
                return
            for _, report in batch:
                try:
                    report()
                except BaseException as e:  # noqa: BLE001 - the other items are still reported; close() raises it
                    self._report_error = self._report_error or e
            with self._cond:
                self._busy = False
                self._cond.notify_all()

    def drain(self) -> None:
        """Wait until every report handed over so far has run (or the disk failed)."""
        with self._cond:
            self._cond.wait_for(lambda: self._error is not None or (not self._pending and not self._busy)
                                or self._thread is None)

    def close(self) -> None:
        """Drain, end the commit thread, and raise the fsync's error if one failed."""
        self.drain()
        with self._cond:
            self._closing = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        error = self._error or self._report_error
        if error is not None:
            raise error


__all__ = ["GroupCommit"]

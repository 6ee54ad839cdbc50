"""Stepping through a guest: pauses between commands, breakpoints, and what a pause shows.

A job started with ``debug=True`` or ``break_on=[...]`` carries a ``Debugger``, which its reactor consults at
stop points between commands -- never inside a guest call, never on the per-token path -- and where it stops,
publishes a bounded snapshot (``job.paused``) and waits. The controls (``pause``, ``step``, ``resume``) may be
called from any thread and never wait on the guest; paused time does not count against the job's time limit,
though one pause lasts at most ``max_paused_s``. A job without a debugger pays one local check per command.

Design: docs/internals/host.md#debuggerpy
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from typing import Any, Iterable

from tensorjob_jupyter.abi import JobFailure, codes, event_types
from tensorjob_jupyter.text import bounded, clip
from tensorjob_jupyter.record.recording import COMMANDS

log = logging.getLogger("tensorjob_jupyter")

#: The command kinds ``break_on`` (``--break-on``) and ``step(until=...)`` accept.
BREAKABLE = frozenset(COMMANDS)

# What the job does at its next stop point.
RUN, STOP, UNTIL, HOLD = range(4)  # HOLD: it is paused there now
#: How often a paused job looks at its cancel flag even if nobody wakes it.
WAKE_S = 0.25

#: Open handles a snapshot lists (the rest are counted).
MAX_HANDLES_SHOWN = 64
MAX_PATH_CHARS = 512
MAX_ERROR_CHARS = 2000


def parse_break_on(value: "str | Iterable[str] | None") -> tuple[str, ...]:
    """``"infer,open"`` or ``["infer", "open"]`` -> ``("infer", "open")``; ``ValueError`` names an unknown kind."""
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else list(value)
    out: list[str] = []
    for item in items:
        if not isinstance(item, str):
            raise ValueError(f"break_on takes command names, got {type(item).__name__}")
        for name in item.split(","):
            name = name.strip()
            if not name:
                continue
            if name not in BREAKABLE:
                shown = name if len(name) <= 40 else name[:40] + "…"
                raise ValueError(f"{shown!r} is not a command; break on any of {', '.join(sorted(BREAKABLE))}")
            if name not in out:
                out.append(name)
    return tuple(out)


class Debugger:
    """The pause machinery of one job (see the module doc). The reactor calls
    ``stop_point``, ``answered``, ``at_failure`` and ``end`` on the job's
    thread; anyone may call ``pause``, ``step``, ``resume``, ``wake``."""

    def __init__(self, *, start_paused: bool = True, break_on: Iterable[str] = (), max_paused_s: float = 600.0):
        self.start_paused = start_paused
        self.break_on = frozenset(parse_break_on(list(break_on)))
        self.max_paused_s = max_paused_s
        self._lock = threading.Condition()
        self._mode = STOP if start_paused else RUN
        self._reason = "start"  # why the pending stop (STOP) stops
        self._until: str | None = None
        self._how: str | None = None  # how the current pause was left
        self._paused = False
        self._pauses = 0
        self._ended = False
        self._state: dict | None = None  # the snapshot of the current pause
        self.current: Any = None  # the command at the latest stop point
        self.last_command: Any = None  # the command carried out last ...
        self.last_event: Any = None  # ... and the event that answered it
        self.paused_s = 0.0  # time spent paused, in all

    def to_json(self) -> dict:
        return {"start_paused": self.start_paused, "break_on": sorted(self.break_on),
                "max_paused_s": self.max_paused_s}

    # -- state, for anyone --------------------------------------------------------------

    def _holding(self) -> bool:
        """Paused now, and not yet told to go on (the job's thread may take a moment to notice)."""
        return self._paused and self._mode == HOLD

    @property
    def paused(self) -> bool:
        """True while the job waits at a stop point (False as soon as a control lets it go on)."""
        return self._holding()

    @property
    def state(self) -> dict | None:
        """The snapshot of the pause the job waits at now; None while it runs."""
        with self._lock:
            return self._state if self._holding() else None

    @property
    def ended(self) -> bool:
        return self._ended

    @property
    def pauses(self) -> int:
        """How many times the job has paused so far."""
        return self._pauses

    # -- the job's thread ---------------------------------------------------------------------

    def stop_point(self, reactor: Any, command: Any) -> None:
        """Before ``cf_init`` (``command`` None) or before carrying out ``command``: stop if asked to."""
        self.current = command
        mode = self._mode
        if mode == RUN:  # the common case: one comparison, no lock
            if command is None or command.cmd not in self.break_on:
                return
            reason = "break"
        elif mode == UNTIL:
            if command is not None and command.cmd == self._until:
                reason = "until"
            elif command is not None and command.cmd in self.break_on:
                reason = "break"
            else:
                return
        else:
            reason = self._reason
        self._pause(reactor, reason, command)

    def answered(self, command: Any, event: Any) -> None:
        """``command`` was carried out and ``event`` will step the guest (what the next pause shows as last)."""
        self.last_command = command
        self.last_event = event

    def at_failure(self, reactor: Any, error: Any) -> None:
        """The job is about to fail with ``error`` (not the guest's own ``fail``, which stops at its stop
        point): with ``fail`` in ``break_on``, pause so its last state can be seen. Never raises; the failure
        stands whatever happens here."""
        code = getattr(error, "code", None)
        if "fail" not in self.break_on or code in (codes.CANCELLED, codes.PAUSED_TOO_LONG) \
                or reactor.cancel.is_set() or self._ended:
            return
        command = self.current if reactor.pending_command is not None else None
        try:
            self._pause(reactor, "failure", command,
                        error={"code": clip(str(code), 128),
                               "message": clip(str(getattr(error, "message", error)), MAX_ERROR_CHARS)},
                        final=True)
        except Exception:  # noqa: BLE001 - the transcript broke, say: the job still ends with its failure
            log.warning("tensorjob: could not pause job %s at its failure", reactor.job_id, exc_info=True)

    def end(self) -> None:
        """The job has ended: wake every waiter, keep nothing bulky."""
        with self._lock:
            self._ended = True
            self._paused = False
            self._state = None
            self.current = self.last_command = self.last_event = None
            self._lock.notify_all()

    def _snapshot(self, reactor: Any, number: int, reason: str, command: Any, error: dict | None) -> dict:
        """What the pause shows, every guest-made value bounded (runs on the job's thread)."""
        guest = reactor.guest
        handles = [{"handle": f.handle, "path": clip(str(f.path), MAX_PATH_CHARS), "len": f.len,
                    "kind": f.kind.kind} for f in itertools.islice(reactor.handles, MAX_HANDLES_SHOWN)]
        last = self.last_command
        return {
            "pause": number,
            "step": reactor.stats.steps,
            "reason": reason,
            "until": self._until if reason == "until" else None,
            "command": bounded(command.to_json()) if command is not None else None,
            "last_command": bounded(last.to_json()) if last is not None else None,
            "last_event": bounded(self.last_event.to_json()) if self.last_event is not None else None,
            "error": error,
            "handles": handles,
            "open_handles": len(reactor.handles),
            "memory_bytes": guest.memory_bytes if guest is not None else 0,
            "peak_memory_bytes": guest.peak_memory_bytes if guest is not None else 0,
            "paused_s": round(self.paused_s, 3),
            "max_paused_s": self.max_paused_s,
        }

    def _pause(self, reactor: Any, reason: str, command: Any, *, error: dict | None = None,
               final: bool = False) -> None:
        if reactor.cancel.is_set():
            return  # the reactor ends the job at once
        number = self._pauses + 1  # only this thread counts pauses
        snapshot = self._snapshot(reactor, number, reason, command, error)
        # Hold first, then say so: a control that acts on the event always finds the job holding.
        with self._lock:
            self._pauses = number
            self._state = snapshot
            self._mode, self._how = HOLD, None
            self._paused = True
        try:
            reactor.stream.publish(event_types.JOB_PAUSED, **snapshot)
        except BaseException:
            with self._lock:
                self._paused, self._state, self._mode = False, None, RUN
                self._lock.notify_all()
            raise
        started = time.monotonic()
        expired = False
        with self._lock:
            self._lock.notify_all()
            while self._mode == HOLD:
                if reactor.cancel.is_set() or self._ended:
                    break
                remaining = started + self.max_paused_s - time.monotonic()
                if remaining <= 0:
                    expired = True
                    break
                self._lock.wait(min(remaining, WAKE_S))
            if self._mode == HOLD:
                self._mode = RUN
            how, until = self._how, self._until
            self._paused = False
            self._state = None
            self._lock.notify_all()
        seconds = time.monotonic() - started
        self.paused_s += seconds
        reactor.paused_for(seconds)
        if expired:
            if final:
                return

            raise JobFailure(codes.PAUSED_TOO_LONG,
                         f"the job stayed paused at step {snapshot['step']} for more than {self.max_paused_s:g} s "
                         f"(max_paused_s), so the host cancelled it")
        if reactor.cancel.is_set() or how is None:
            return
        reactor.stream.publish(event_types.JOB_RESUMED, pause=number, step=reactor.stats.steps, how=how,
                               until=until if how == "until" else None, paused_ms=int(seconds * 1000))

    # -- the controls (any thread) ------------------------------------------------------------

    def wake(self) -> None:
        """The job was cancelled: a paused job notices at once."""
        with self._lock:
            self._lock.notify_all()

    def _release(self, how: str, mode: int, until: str | None = None) -> None:
        self._mode, self._how, self._until = mode, how, until
        if mode == STOP:
            self._reason = how
        self._lock.notify_all()

    def _wait_for(self, predicate, deadline: float | None) -> None:
        while not predicate():
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise TimeoutError("the job did not pause in time")
            self._lock.wait(WAKE_S if remaining is None else min(remaining, WAKE_S))

    def next_pause(self, after: int, timeout: float | None = None) -> dict | None:
        """Block until pause number ``after + 1`` or later holds, or the job ends; its state, or None."""
        return self._next_pause(after, None if timeout is None else time.monotonic() + timeout)

    def _next_pause(self, after: int, deadline: float | None) -> dict | None:
        with self._lock:
            self._wait_for(lambda: self._ended or (self._holding() and self._pauses > after), deadline)
            return self._state if self._holding() else None

    def wait_paused(self, timeout: float | None = None) -> dict | None:
        """Block until the job is paused or has ended; the pause's state, or None."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            self._wait_for(lambda: self._holding() or self._ended, deadline)
            return self._state if self._holding() else None

    def pause(self, *, wait: bool = True, timeout: float | None = None) -> dict | None:
        """Stop at the next stop point (a guest call or an infer under way finishes first)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            if self._holding() or self._ended:
                return self._state if self._holding() else None
            before = self._pauses
            if self._mode != STOP:
                self._mode, self._reason = STOP, "pause"
        return self._next_pause(before, deadline) if wait else None

    def step(self, until: str | None = None, *, wait: bool = True, timeout: float | None = None) -> dict | None:
        """From a pause: carry out one command (``until``: run to the next command of that kind) and stop.

        On a job that is not paused: if a stop is pending (the start of a
        ``--debug`` job, a ``pause()``), wait for it first (``wait``), then
        step; if the job runs free, stop it at its next stop point.
        """
        if until is not None:
            (until,) = parse_break_on([until]) or (None,)
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            if wait and self._mode == STOP and not self._holding():
                self._wait_for(lambda: self._holding() or self._ended, deadline)
            if self._ended:
                return None
            before = self._pauses
            mode = UNTIL if until is not None else STOP
            how = "until" if until is not None else "step"
            if self._holding():
                self._release(how, mode, until)
            elif self._mode != STOP:
                self._mode, self._until = mode, until
                if mode == STOP:
                    self._reason = "step"
        return self._next_pause(before, deadline) if wait else None

    def resume(self) -> None:
        """Run on; stop only at breakpoints (a pending stop is called off)."""
        with self._lock:
            if not self._ended:
                self._release("continue", RUN)

    def detach(self) -> None:
        """Run on to the end without stopping again (no breakpoints either)."""
        with self._lock:
            self.break_on = frozenset()
            if not self._ended:
                self._release("continue", RUN)


__all__ = [
    "BREAKABLE", "WAKE_S", "MAX_HANDLES_SHOWN", "MAX_PATH_CHARS", "MAX_ERROR_CHARS", "parse_break_on", "Debugger"
]

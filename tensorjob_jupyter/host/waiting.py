"""Waiting for what runs on threads of its own -- a job, a map, a replay -- with Ctrl-C meaning cancel.

Every blocking call of the Python API (``tj.run``, ``tj.map``, ``tj.replay``,
``tj.replay_map``), every command (``tensorjob run``, ``map``, ``replay``) and
every magic waits the same way, through ``wait_or_cancel``: the wait wakes
every ``SIGNAL_CHECK_S`` -- a Ctrl-C that the kernel or the terminal hands
to another of the process's threads (a job's, the epoch clock's) runs its
handler only once the waiting thread is back in Python, and a wait without
a timeout would hold it until the work ended on its own -- and a Ctrl-C
cancels the work; the caller then waits for its end, which a cancel makes
quick.
"""

from __future__ import annotations

import time
from typing import Callable

#: How often a wait wakes to let a Ctrl-C handed to another thread run.
SIGNAL_CHECK_S = 0.1


def wait_or_cancel(wait_done: Callable[[float], bool], cancel: Callable[[], None], *, timeout: float | None = None,
                   what: str = "it") -> bool:
    """Wait until ``wait_done(seconds)`` says the work has ended: True. On Ctrl-C (``KeyboardInterrupt``), call
    ``cancel()`` and return False -- the work ends soon; the caller waits for its result. ``timeout``: raise
    ``TimeoutError`` (naming ``what``) if it has not ended by then; the work goes on."""
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                if wait_done(0):
                    return True
                raise TimeoutError(f"{what} still running after {timeout} s")
            if wait_done(SIGNAL_CHECK_S if left is None else min(SIGNAL_CHECK_S, left)):
                return True
    except KeyboardInterrupt:
        cancel()
        return False


__all__ = ["SIGNAL_CHECK_S", "wait_or_cancel"]

"""A job's folder: where the runs folder is, what each job's folder holds, whether its job is live.

Every job leaves a folder named by its id under the runs folder (``--runs``,
``runs_dir``, else ``$TENSORJOB_RUNS``, else ``~/.tensorjob/runs``):
``events.jsonl``, the transcript, written while the job runs, and
``envelope.json``, written once it has ended (through ``envelope.json.tmp``
and a rename, so it is whole or absent). These names are defined here and
nowhere else: the writer (``events.EventStream``), the reader
(``transcript``), the listing and the pruning (``history``) all take them
from this module.

A run is **live** while its transcript's writer holds an exclusive ``flock``
on ``events.jsonl``. The lock goes with the open file, so it is released when
the writer closes it -- after ``envelope.json`` is in place -- or when its
process dies, in this process or any other, with no registry to consult.
"""

from __future__ import annotations

import os
from typing import Any
import secrets
import threading
import time
from pathlib import Path

from tensorjob_jupyter.regular_file import open_fd

fcntl: Any
try:
    import fcntl
except ImportError:  # pragma: no cover - not on Windows
    fcntl = None

EVENTS_FILE = "events.jsonl"
ENVELOPE_FILE = "envelope.json"
ENVELOPE_TMP_FILE = ENVELOPE_FILE + ".tmp"
#: The files a job writes in its run folder (prune removes these and nothing else).
RUN_FILES = frozenset({EVENTS_FILE, EVENTS_FILE + ".new", ENVELOPE_FILE, ENVELOPE_TMP_FILE})


def default_runs_dir() -> Path:
    """``$TENSORJOB_RUNS``, else ``~/.tensorjob/runs``."""
    env = os.environ.get("TENSORJOB_RUNS")
    return Path(env) if env else Path.home() / ".tensorjob" / "runs"


def runs_folder(runs: str | os.PathLike | None = None) -> Path:
    """``runs`` if given, else the default runs folder."""
    return Path(runs).expanduser() if runs else default_runs_dir()


_ID_LOCK = threading.Lock()
#: The second the ids given last were stamped with, and their random digits: none is given twice in a second.
_ID_SECOND = ""
_ID_TAILS: set[str] = set()


def new_job_id() -> str:
    """A run's id: when it started (sortable), then six random hex digits -- never digits this process gave in
    the same second, since a map starts hundreds of jobs a second (drawn freely, two ids of a 100,000-item map
    would likely meet, and the second job could not make its folder)."""
    global _ID_SECOND
    with _ID_LOCK:
        second = time.strftime("%Y%m%dT%H%M%S")
        if second != _ID_SECOND:
            _ID_SECOND = second
            _ID_TAILS.clear()  # what is kept is at most one second's ids
        tail = secrets.token_hex(3)
        while tail in _ID_TAILS:
            tail = secrets.token_hex(3)
        _ID_TAILS.add(tail)
        return f"{second}-{tail}"


def lock_transcript(fileno: int) -> None:
    """Mark a transcript as being written (its writer calls this once, on the open file)."""
    if fcntl is None:  # pragma: no cover
        return
    # The writer locks the file before anyone can see it (see ``events._FileLog``), so this never waits.
    fcntl.flock(fileno, fcntl.LOCK_EX | fcntl.LOCK_NB)


def is_live(run_dir: str | os.PathLike) -> bool:
    """True while a job, in this process or another, still writes this run's transcript."""
    if fcntl is None:  # pragma: no cover
        return False
    try:
        fd = open_fd(Path(run_dir) / EVENTS_FILE, follow_symlinks=False)
    except OSError:  # missing, or not the folder's own regular file: no job writes it
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)  # closing releases the shared lock
    return False


__all__ = [
    "EVENTS_FILE", "ENVELOPE_FILE", "ENVELOPE_TMP_FILE", "RUN_FILES", "default_runs_dir", "runs_folder", "new_job_id",
    "lock_transcript", "is_live"
]

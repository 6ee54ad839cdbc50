"""The run folder: the map's ledger, its results files, and the lock that keeps it one map's.

The folder is what makes a map resumable, so ``RunFolder`` guards it: the
ledger pins the manifest's and the guest's SHA-256 (another of either is
``ResumeRefused``, since mixing them would make the results files lie), an
advisory lock keeps a second map out, each concluded item is appended,
flushed and fsynced as it finishes, and a torn last line left by a crash is
cut off on resume so that its item runs again. When a map ends (finished,
failed or cancelled) the results files are rewritten in item order, so a
finished folder reads in manifest order whatever order items finished in; each
record carries the item's ``key`` (``manifest.item_key``) beside its number. Only the map's own thread
writes here (see ``run.MapRun``). A refused folder can be started over
(``restart``: under the lock, the map's own files are removed first, and
nothing else in the folder is touched); the refusal says so.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import orjson

from tensorjob_jupyter.abi import JobStatus, dumps
from tensorjob_jupyter.fanout.errors import ResumeRefused
from tensorjob_jupyter.fanout.manifest import Manifest

LEDGER = "ledger.json"
RESULTS = "results.jsonl"
FAILURES = "failures.jsonl"
JOBS = "jobs"
LEDGER_FORMAT = "tensorjob-map/1"
#: What scoring (``scoring.py``) keeps here: expected answers, the scorer's name, the scores.
SCORING_FILES = ("expected.jsonl", "scoring.json", "scores.jsonl")
#: The largest ledger read back (one small entry per session: megabytes are not a ledger).
MAX_LEDGER_BYTES = 8 * 1024 * 1024
#: How to start a refused folder over, in the front ends' words.
RESTART_HINT = "start this one over with --restart (restart=True in Python), which keeps none of its results"


def _open_own(path: Path, flags: int, mode: str):
    """Open a file of the run folder itself, never through a symbolic link
    (which could make the map append to, or truncate, a file elsewhere)."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as e:
        if os.path.islink(path):
            raise ResumeRefused(f"{path} is a symbolic link; a run folder's files must be its own") from None
        raise ResumeRefused(f"cannot open {path}: {e.strerror}") from None
    return os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"}))


def _fsync_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)  # a leftover, or a link planted there: never written through
    with _open_own(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_records(path: Path, *, repair: bool = False) -> list[dict]:
    """The records of a results/failures file, without a torn last line
    (a crash mid-append); ``repair`` also cuts it off the file."""
    if not os.path.lexists(path):
        return []
    with _open_own(path, os.O_RDWR if repair else os.O_RDONLY, "r+b" if repair else "rb") as f:
        data = f.read()
        cut = data.rfind(b"\n") + 1
        if cut < len(data) and repair:  # its item runs again
            f.truncate(cut)
    data = data[:cut]
    records = []
    for number, line in enumerate(data.splitlines(), start=1):
        try:
            record = orjson.loads(line)  # a map's files may be large: about five times json's speed
            int(record["item"])
        except (ValueError, KeyError, TypeError):
            raise ResumeRefused(f"{path}: line {number} is not a record this map wrote; "
                                f"the run folder was edited or is corrupt") from None
        records.append(record)
    return records


#: What a ledger's last session may say of how it ended.
SESSION_STATUSES = ("running", "finished", "cancelled", "stopped", "error")


def read_ledger(run_dir: Path) -> dict:
    """What a run folder's ledger says, checked as input from anywhere: ``items`` (how many), the
    ``manifest_source`` and ``manifest_sha256`` it pins, and its last ``session``'s summary (counts, status,
    error, ``elapsed_s``), each value of the type it must have or left out. ``ResumeRefused`` if ``run_dir``
    holds no ledger of this format."""
    path = run_dir / LEDGER
    try:
        with _open_own(path, os.O_RDONLY, "rb") as f:
            data = f.read(MAX_LEDGER_BYTES + 1)
        if len(data) > MAX_LEDGER_BYTES:
            raise ValueError("too large")
        ledger = json.loads(data)
        items, manifest = ledger["manifest"]["items"], ledger["manifest"]
        if ledger.get("format") != LEDGER_FORMAT or not _count(items):
            raise ValueError("not this format")
    except ResumeRefused:
        raise ResumeRefused(f"{run_dir} is not a map's run folder: it has no {LEDGER}") from None
    except (ValueError, KeyError, TypeError, RecursionError):
        raise ResumeRefused(f"{path} is not a tensorjob map ledger") from None
    sessions = ledger.get("sessions") if isinstance(ledger.get("sessions"), list) else []
    last = sessions[-1] if sessions and isinstance(sessions[-1], dict) else {}
    session = {k: last[k] for k in ("completed", "failed", "skipped") if _count(last.get(k))}
    if last.get("status") in SESSION_STATUSES:
        session["status"] = last["status"]
    if isinstance(last.get("error"), str):
        session["error"] = last["error"][:2000]
    session["elapsed_s"] = _elapsed(last.get("started_at"), last.get("finished_at"))
    return {"items": items, "session": session,
            "manifest_source": manifest.get("source") if isinstance(manifest.get("source"), str) else None,
            "manifest_sha256": manifest.get("sha256") if isinstance(manifest.get("sha256"), str) else None}


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 2 ** 53


def _elapsed(started, finished) -> float:
    try:
        return max(0.0, time.mktime(time.strptime(finished, _TIME)) - time.mktime(time.strptime(started, _TIME)))
    except (TypeError, ValueError, OverflowError):
        return 0.0


class RunFolder:
    """The ledger, the results files and the lock of one map's run folder."""

    def __init__(self, path: str | os.PathLike, *, fsync: bool = True):
        self.path = Path(path).absolute()
        self.results_path = self.path / RESULTS
        self.failures_path = self.path / FAILURES
        self.jobs_path = self.path / JOBS
        self.fsync = fsync
        self.completed: set[int] = set()
        self.failed: set[int] = set()
        self._ledger: dict = {}
        self._lock_file = None
        self._results = None
        self._failures = None

    def open(self, manifest: Manifest, wasm_sha256: str, *, retry_failed: bool, where: str,
             restart: bool = False, concurrency: int | None = None) -> None:
        """Create or resume the folder; refuses a different manifest or guest. ``restart``: start the
        folder over first, keeping nothing of an earlier map (its ledger, results and item transcripts)."""
        self.path.mkdir(parents=True, exist_ok=True)
        self._lock()
        try:
            if restart:
                self._clear()
            self._ledger = self._check_ledger(manifest, wasm_sha256)
            self.completed = {r["item"] for r in read_records(self.results_path, repair=True)}
            failures = [r for r in read_records(self.failures_path, repair=True)
                        if r["item"] not in self.completed]
            if retry_failed and failures:
                _fsync_write(self.failures_path, "")
                failures = []
            self.failed = {r["item"] for r in failures}
            self._ledger["sessions"].append({"started_at": _now(), "finished_at": None, "where": where,
                                             **({"concurrency": concurrency} if concurrency else {})})
            _fsync_write(self.path / LEDGER, json.dumps(self._ledger, indent=2) + "\n")
            self.jobs_path.mkdir(exist_ok=True)
            append = os.O_WRONLY | os.O_CREAT | os.O_APPEND
            self._results = _open_own(self.results_path, append, "a")
            self._failures = _open_own(self.failures_path, append, "a")
        except BaseException:
            self.close()
            raise

    def _clear(self) -> None:
        """Remove what a map wrote here -- the ledger, the results files, ``jobs/`` -- and nothing else.

        Only under the lock, so a running map's folder is never cleared; a symbolic link in their place is
        removed as a link, never followed."""
        for name in (LEDGER, RESULTS, FAILURES, LEDGER + ".tmp", FAILURES + ".tmp", *SCORING_FILES):
            (self.path / name).unlink(missing_ok=True)
        if self.jobs_path.is_symlink():
            self.jobs_path.unlink()
        elif self.jobs_path.is_dir():
            shutil.rmtree(self.jobs_path)

    def _lock(self) -> None:
        try:
            import fcntl
        except ImportError:  # pragma: no cover - no advisory locks on this platform
            return
        self._lock_file = _open_own(self.path / ".lock", os.O_WRONLY | os.O_CREAT, "w")
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._lock_file.close()
            self._lock_file = None
            raise ResumeRefused(f"run folder {self.path} is in use by another map right now") from None

    def _check_ledger(self, manifest: Manifest, wasm_sha256: str) -> dict:
        path = self.path / LEDGER
        if not path.exists():
            if self.results_path.exists() or self.failures_path.exists():
                raise ResumeRefused(f"run folder {self.path} has results but no {LEDGER}; "
                                    f"it was not made by tensorjob map")
            return {"format": LEDGER_FORMAT, "created_at": _now(),
                    "manifest": {"source": manifest.source, "sha256": manifest.sha256, "items": len(manifest)},
                    "guest": {"sha256": wasm_sha256}, "sessions": []}
        try:
            ledger = json.loads(path.read_text(encoding="utf-8"))
            old_manifest, old_guest = ledger["manifest"]["sha256"], ledger["guest"]["sha256"]
        except (ValueError, KeyError, TypeError):
            raise ResumeRefused(f"{path} is not a tensorjob map ledger") from None
        if old_manifest != manifest.sha256:
            raise ResumeRefused(
                f"manifest changed: run folder {self.path} was started with a manifest whose SHA-256 is "
                f"{old_manifest[:16]}..., this one's is {manifest.sha256[:16]}...; "
                f"use a new run folder, restore the original manifest to resume, or {RESTART_HINT}")
        if old_guest != wasm_sha256:
            raise ResumeRefused(
                f"guest changed: run folder {self.path} was started with a guest whose SHA-256 is "
                f"{old_guest[:16]}..., this one's is {wasm_sha256[:16]}...; use a new run folder, "
                f"or {RESTART_HINT}")
        return ledger

    def record(self, outcome: dict, key: str) -> bool:
        """Append a concluded item, named ``key``; False (nothing written) if it already was."""
        index = outcome["item"]
        if index in self.completed or index in self.failed:
            return False
        if outcome["status"] == JobStatus.COMPLETED.value:
            f, line = self._results, {"item": index, "key": key, "result": outcome.get("result"),
                                      **{k: outcome[k] for k in ("sources", "confidence") if k in outcome}}
            self.completed.add(index)
        else:
            f, line = self._failures, {"item": index, "key": key, "error": outcome["error"]}
            self.failed.add(index)
        f.write(dumps(line) + "\n")
        f.flush()
        if self.fsync:
            os.fsync(f.fileno())
        return True

    def finish(self, summary: dict) -> None:
        """End this session: the results files in item order, then the ledger's summary."""
        self._put_in_item_order()
        if self._ledger.get("sessions"):
            self._ledger["sessions"][-1].update(finished_at=_now(), **summary)
            _fsync_write(self.path / LEDGER, json.dumps(self._ledger, indent=2) + "\n")

    def _put_in_item_order(self) -> None:
        """Rewrite both results files sorted by item (each atomically, fsynced), under the lock."""
        for name, path in (("_results", self.results_path), ("_failures", self.failures_path)):
            f = getattr(self, name)
            if f is None:
                continue
            f.close()
            setattr(self, name, None)
            records = read_records(path)
            if any(a["item"] > b["item"] for a, b in zip(records, records[1:])):
                records.sort(key=lambda r: r["item"])
                _fsync_write(path, "".join(dumps(r) + "\n" for r in records))

    def close(self) -> None:
        for f in (self._results, self._failures, self._lock_file):
            if f is not None:
                f.close()
        self._results = self._failures = self._lock_file = None


_TIME = "%Y-%m-%dT%H:%M:%S%z"


def _now() -> str:
    return time.strftime(_TIME)


__all__ = [
    "LEDGER", "RESULTS", "FAILURES", "JOBS", "LEDGER_FORMAT", "SCORING_FILES", "MAX_LEDGER_BYTES", "RESTART_HINT",
    "read_records", "SESSION_STATUSES", "read_ledger", "RunFolder"
]

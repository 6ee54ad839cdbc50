"""A map's folder (its ``--run-dir``): the ledger, the results files, and the lock that keeps it one map's.

The folder is what makes a map resumable, so ``MapFolder`` guards it: the ledger pins the manifest's and the
guest's SHA-256 (another of either is ``ResumeRefused``, since mixing them would make the results files lie),
an advisory lock keeps a second map out, each concluded item is appended and flushed as it finishes (fsynced,
a batch at a time, before it is reported: ``group_commit``), and a torn last line left by a crash is cut off
on resume so that its item runs again. When a map ends (finished, failed or cancelled) the results files are
rewritten in item order, so a finished folder reads in manifest order whatever order items finished in; each
record carries the item's ``key`` (``manifest.item_key``) beside its number. Only the map's own thread
writes here (see ``run.MapRun``); what is read back goes through ``map_folder_reader``, which checks every file
as one from anywhere. A refused folder can be started over (``restart``: under the lock, the map's own files
are removed first, and nothing else in the folder is touched); the refusal says so.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import time
from array import array
from pathlib import Path
from typing import IO

from tensorjob_jupyter.abi import JobStatus, dumps
from tensorjob_jupyter.fanout.errors import ResumeRefused
from tensorjob_jupyter.fanout.map_folder_reader import (  # the one reader of a run folder; its names, here too
    CASCADE, FAILURES, JOBS, LEDGER, LEDGER_FORMAT, MAX_LEDGER_BYTES, RESULTS, SCORING_FILES, SESSION_STATUSES,
    FolderError,
    RecordedItems, checked_records, jobs_folder, read_ledger, read_ledger_json, read_records, scan_records, shown,
)
from tensorjob_jupyter.fanout.item_set import ItemSet
from tensorjob_jupyter.fanout.manifest import Manifest
from tensorjob_jupyter.regular_file import NotARegularFile, open_regular

#: How to start a refused folder over, in the front ends' words.
RESTART_HINT = "start this one over with --restart (restart=True in Python), which keeps none of its results"


def _open_own(path: Path, flags: int, mode: str):
    """Open a file of the run folder itself, never through a symbolic link (which could make the map append
    to, or truncate, a file elsewhere), never blocking on a FIFO, and only a regular file."""
    try:
        return open_regular(path, flags=flags, mode=mode, follow_symlinks=False)
    except NotARegularFile as e:
        if e.errno == errno.ELOOP:
            raise ResumeRefused(f"{path} is a symbolic link; a run folder's files must be its own") from None
        raise ResumeRefused(f"cannot open {path}: it is {e.strerror}") from None
    except OSError as e:
        raise ResumeRefused(f"cannot open {path}: {e.strerror}") from None


def fsync_write(path: Path, text: str) -> None:
    """``text`` as the whole of ``path``, atomically: written to a new file of the folder's own beside it,
    fsynced, then renamed over it (the folder's one writer of whole files: ledger, results, scoring)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)  # a leftover, or a link planted there: never written through
    with _open_own(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _in_order_after(path: Path, start: int, last: int) -> bool:
    """Whether the records of ``path`` from offset ``start`` are in item order, none before item ``last``."""
    try:
        for record, _, _ in checked_records(path, start=start):
            if record["item"] < last:
                return False
            last = record["item"]
    except (FolderError, OSError):
        return False  # the whole file's read says what is wrong with it
    return True


def put_in_item_order(path: Path, *, in_order_until: int = 0, last: int = -1) -> None:
    """Rewrite a results file sorted by item (stably; atomically and fsynced), unless it already is: read a
    record at a time, keeping only each line's item and place, and written a line at a time from there, so a
    large map's results are never held whole. A torn last line is left out of the rewritten file.
    ``in_order_until``: its lines before this offset are known to be in item order, the last being item
    ``last`` (as the map found them when it began), so only what follows is read to see whether all are."""
    if in_order_until and _in_order_after(path, in_order_until, last):
        return
    items, starts, ends = array("q"), array("q"), array("q")
    in_order = True
    for record, start, end in checked_records(path):
        in_order = in_order and (not items or items[-1] <= record["item"])
        items.append(record["item"])
        starts.append(start)
        ends.append(end)
    if in_order:
        return
    order = sorted(range(len(items)), key=items.__getitem__)
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)  # a leftover, or a link planted there: never written through
    with _open_own(path, os.O_RDONLY, "rb") as source, _open_own(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL,
                                                                  "wb") as f:
        for k in order:
            line = os.pread(source.fileno(), ends[k] - starts[k], starts[k])
            if len(line) != ends[k] - starts[k] or not line.endswith(b"\n"):
                raise FolderError(f"{shown(path)} changed while it was put in item order")
            f.write(line)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


#: How a map names a backend factory that names no model (``model_name``): by its content key, which a factory
#: rebuilt in another process (a cluster's, a resume's) need not share -- so it pins nothing (``_check_model``).
ANONYMOUS_FACTORY = "backend factory "

class MapFolder:
    """The ledger, the results files and the lock of one map's run folder."""

    def __init__(self, path: str | os.PathLike, *, fsync: bool = True):
        self.path = Path(path).absolute()
        self.results_path = self.path / RESULTS
        self.failures_path = self.path / FAILURES
        self.jobs_path = self.path / JOBS
        self.fsync = fsync
        self.completed = ItemSet()  # as bits: a map's own progress costs the same per item at any size
        self.failed = ItemSet()
        self._ledger: dict = {}
        self._found: dict[Path, RecordedItems] = {}  # each results file as open() found it
        self._lock_file: IO[str] | None = None
        self._results: IO[str] | None = None
        self._failures: IO[str] | None = None

    def open(self, manifest: Manifest, wasm_sha256: str, *, retry_failed: bool, where: str,
             restart: bool = False, concurrency: int | None = None, deterministic: dict | None = None,
             withheld: list[str] | None = None, model: str | None = None, mixed_models: bool = False) -> None:
        """Create or resume the folder; refuses a different manifest or guest. ``restart``: start the
        folder over first, keeping nothing of an earlier map (its ledger, results and item transcripts).
        ``withheld``: the folders a read grant of this session covers that its guests may not read (the
        session records them: ``start.withheld_notes``). ``model``: the model this session's items run on
        (``start.model_label``); a folder another model mapped is refused unless ``mixed_models``, which the
        session records (each record names its model)."""
        self.path.mkdir(parents=True, exist_ok=True)
        self._lock()
        try:
            if restart:
                self._clear()
            self._ledger = self._check_ledger(manifest, wasm_sha256)
            self._check_model(model, mixed_models)
            jobs_folder(self.path)  # a jobs/ link out of the folder is refused before anything is written there
            total = len(manifest)  # a record of an item the manifest does not have is refused, never run
            results = scan_records(self.results_path, total=total, repair=True)
            failures = scan_records(self.failures_path, total=total, repair=True)
            self.completed = results.items
            self.failed = ItemSet(item for item in failures.items if item not in self.completed)
            if retry_failed and self.failed:
                fsync_write(self.failures_path, "")
                self.failed = ItemSet()
                failures = RecordedItems(ItemSet(), 0, True, -1)
            self._found = {self.results_path: results, self.failures_path: failures}
            self._ledger.setdefault("sessions", []).append({"started_at": _now(), "finished_at": None, "where": where,
                                             **({"concurrency": concurrency} if concurrency else {}),
                                             **({"deterministic": deterministic} if deterministic else {}),
                                             **({"withheld": list(withheld)} if withheld else {}),
                                             **({"model": model} if model is not None else {}),
                                             **({"mixed_models": True} if mixed_models else {})})
            fsync_write(self.path / LEDGER, json.dumps(self._ledger, indent=2) + "\n")
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
        for name in (LEDGER, RESULTS, FAILURES, LEDGER + ".tmp", FAILURES + ".tmp", *SCORING_FILES, CASCADE):
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
        lock_file = self._lock_file = _open_own(self.path / ".lock", os.O_WRONLY | os.O_CREAT, "w")
        try:
            fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            lock_file.close()
            self._lock_file = None
            raise ResumeRefused(f"run folder {self.path} is in use by another map right now") from None

    def _check_ledger(self, manifest: Manifest, wasm_sha256: str) -> dict:
        path = self.path / LEDGER
        if not os.path.lexists(path):
            if os.path.lexists(self.results_path) or os.path.lexists(self.failures_path):
                raise ResumeRefused(f"run folder {self.path} has results but no {LEDGER}; "
                                    f"it was not made by tensorjob map")
            return {"format": LEDGER_FORMAT, "created_at": _now(),
                    "manifest": {"source": manifest.source, "sha256": manifest.sha256, "items": len(manifest)},
                    "guest": {"sha256": wasm_sha256}, "sessions": []}
        ledger = read_ledger_json(self.path)  # FolderError: one line, never a hang on a FIFO
        old_manifest = ledger["manifest"].get("sha256")
        old_guest = (ledger.get("guest") or {}).get("sha256")
        if not isinstance(old_manifest, str) or not isinstance(old_guest, str):
            raise ResumeRefused(f"{path} is not a tensorjob map ledger (no manifest or guest SHA-256)")
        if old_manifest != manifest.sha256:
            old_items = ledger["manifest"].get("items")
            counts = (f" of {old_items} items" if isinstance(old_items, int) and not isinstance(old_items, bool)
                      else "")
            raise ResumeRefused(
                f"manifest changed: run folder {self.path} holds another map -- of a manifest{counts} whose SHA-256 "
                f"is {old_manifest[:16]}..., not this one of {len(manifest)} items ({manifest.sha256[:16]}...); "
                f"name a new run folder (--run-dir), restore the original manifest to resume, or {RESTART_HINT}")
        if old_guest != wasm_sha256:
            raise ResumeRefused(
                f"guest changed: run folder {self.path} was started with a guest whose SHA-256 is "
                f"{old_guest[:16]}..., this one's is {wasm_sha256[:16]}...; use a new run folder, "
                f"or {RESTART_HINT}")
        return ledger

    def _check_model(self, model: str | None, mixed_models: bool) -> None:
        """Pin the folder's model (the first one named); another is ``ResumeRefused`` unless ``mixed_models``. A
        backend factory that names no model (``backend factory KEY``) cannot be told from another and pins nothing:
        the first model named after it is pinned."""
        if model is None or model.startswith(ANONYMOUS_FACTORY):
            return
        old = self._ledger.get("model")
        if not isinstance(old, str) or old.startswith(ANONYMOUS_FACTORY):
            self._ledger["model"] = model
        elif old != model and not mixed_models:
            raise ResumeRefused(
                f"model changed: run folder {self.path} was mapped with the model {shown(old)}, this map names "
                f"{shown(model)}; mixing them would make the results lie (which model answered which item?) -- use "
                f"a new run folder, --mixed-models (mixed_models=True) to add this model's answers beside the old "
                f"ones, each row naming its model, or {RESTART_HINT}")

    def record(self, outcome: dict, key: str) -> int | None:
        """Append a concluded item, named ``key``, and flush it out of this process; the descriptor of the file
        it went to, for the caller to fsync (``group_commit``) before it says the item concluded; None (nothing
        written) if it already was."""
        index = outcome["item"]
        if index in self.completed or index in self.failed:
            return None
        if outcome["status"] == JobStatus.COMPLETED.value:
            f, line = self._results, {"item": index, "key": key, "result": outcome.get("result"),
                                      **{k: outcome[k] for k in ("sources", "confidence", "rejected", "model")
                                         if k in outcome}}
            self.completed.add(index)
        else:
            f, line = self._failures, {"item": index, "key": key, "error": outcome["error"],
                                       **({"model": outcome["model"]} if "model" in outcome else {})}
            self.failed.add(index)
        assert f is not None, "record() before open()"
        f.write(dumps(line) + "\n")
        f.flush()
        return f.fileno()

    def rewrite(self, results: list[dict], failures: list[dict]) -> None:
        """Replace both results files with these records (each list in item order), under the lock: a cascade's
        merge (``cascade.py``). Written in two steps, each file atomically and fsynced, so that at no point is an
        item in neither file (a completed record wins where it is in both): first each file with what it gains,
        then each without what it loses."""
        for name in ("_results", "_failures"):
            f = getattr(self, name)
            if f is not None:
                f.close()
                setattr(self, name, None)
        new_results = {r["item"] for r in results}
        new_failures = {r["item"] for r in failures}
        old_results = [r for r, _, _ in checked_records(self.results_path) if r["item"] not in new_results]
        old_failures = [r for r, _, _ in checked_records(self.failures_path) if r["item"] not in new_failures]

        def lines(records: list[dict]) -> str:
            return "".join(dumps(r) + "\n" for r in sorted(records, key=lambda r: r["item"]))
        fsync_write(self.results_path, lines(results + old_results))  # gains first: nothing is lost meanwhile
        fsync_write(self.failures_path, lines(failures + old_failures))
        fsync_write(self.failures_path, lines(failures))
        fsync_write(self.results_path, lines(results))
        self.completed = ItemSet(sorted(new_results))
        self.failed = ItemSet(sorted(new_failures - new_results))
        self._found = {}

    def finish(self, summary: dict) -> None:
        """End this session: the results files in item order, then the ledger's summary."""
        self._put_in_item_order()
        if self._ledger.get("sessions"):
            self._ledger["sessions"][-1].update(finished_at=_now(), **summary)
            fsync_write(self.path / LEDGER, json.dumps(self._ledger, indent=2) + "\n")

    def _put_in_item_order(self) -> None:
        """Rewrite both results files sorted by item (each atomically, fsynced), under the lock."""
        for name, path in (("_results", self.results_path), ("_failures", self.failures_path)):
            f = getattr(self, name)
            if f is None:
                continue
            f.close()
            setattr(self, name, None)
            found = self._found.get(path)
            if found is not None and found.in_order:  # only what this session appended is read
                put_in_item_order(path, in_order_until=found.end, last=found.last)
            else:
                put_in_item_order(path)

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
    "read_records", "SESSION_STATUSES", "read_ledger", "FolderError", "MapFolder", "fsync_write",
    "put_in_item_order"
]

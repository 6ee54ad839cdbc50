"""The one reader of a map's run folder, which may come from anywhere (copied, unzipped, shared).

Everything read back from a run folder comes through here: each file opened with ``regular_file``, read a
capped line at a time, and every value checked, anything else being one ``FolderError`` line naming the file
and the line. Counts come from what is read, never from what a ledger claims.

Design: docs/internals/fanout.md#folder_readerpy
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import time
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Callable, Iterator

import orjson

from tensorjob_jupyter.fanout.errors import ManifestError, ResumeRefused
from tensorjob_jupyter.fanout.item_set import ItemSet
from tensorjob_jupyter.fanout.manifest import Manifest, read_manifest
from tensorjob_jupyter.record.transcript import read_line
from tensorjob_jupyter.regular_file import NotARegularFile, open_fd, open_regular
from tensorjob_jupyter.text import for_terminal

LEDGER = "ledger.json"
RESULTS = "results.jsonl"
FAILURES = "failures.jsonl"
JOBS = "jobs"
LEDGER_FORMAT = "tensorjob-map/1"
#: What scoring (``scoring.py``) keeps here: expected answers, the scorer's name, the scores.
SCORING_FILES = ("expected.jsonl", "scoring.json", "scores.jsonl")
EXPECTED, SCORING, SCORES = SCORING_FILES
#: A person's decisions on the map's values, appended one a line (``reviews.py``), and what they certify
#: (``certify.py``): derived from the results, never part of them.
REVIEW_FILES = ("reviews.jsonl", "certificate.json", "review_plan.json")
#: A cascade's record of its sample, bound and threshold (``cascade.py``); its oracle's map folder is ``oracle/``.
CASCADE = "cascade.json"
REVIEWS, CERTIFICATE, REVIEW_PLAN = REVIEW_FILES
#: The decisions a review records (``reviews.py``).
DECISIONS = ("accept", "correct", "null", "skip")
#: The largest ledger read back (one small entry per session: megabytes are not a ledger).
MAX_LEDGER_BYTES = 8 * 1024 * 1024
#: The longest line of a results file read back: a record holds one result, at most what an envelope holds.
MAX_RECORD_BYTES = 64 * 1024 * 1024
#: The largest results file read back (every line is capped too, so junk costs one line's read).
MAX_RECORDS_FILE_BYTES = 16 * 1024 * 1024 * 1024
#: The largest item number, and item count, a run folder may name (what a JSON number holds exactly).
MAX_ITEMS = 2 ** 53
#: Items a ledger is believed to count when nothing read confirms it (its manifest is not at hand).
MAX_UNCONFIRMED_ITEMS = 100_000
#: What a ledger's last session may say of how it ended.
SESSION_STATUSES = ("running", "finished", "cancelled", "stopped", "error")
#: Characters of a path a refusal shows.
SHOWN_PATH_CHARS = 300


class FolderError(ResumeRefused):
    """A run folder's file that is not what a map writes there: one line, naming the file (and the line)."""


def shown(path: str | os.PathLike) -> str:
    """A path as one inert, bounded line."""
    text = for_terminal(os.fspath(path), one_line=True)
    return text if len(text) <= SHOWN_PATH_CHARS else text[:SHOWN_PATH_CHARS - 1] + "…"


def _refused(path: Path, e: OSError) -> FolderError:
    return FolderError(f"{shown(path)}: cannot be read: it is {e.strerror}" if isinstance(e, NotARegularFile)
                       else f"{shown(path)}: cannot be read: {e.strerror or e}")


def read_folder_bytes(path: str | os.PathLike, max_bytes: int) -> bytes | None:
    """The bytes of one of the folder's own small files (None when it is absent); ``FolderError`` for a FIFO, a
    device, a socket, a folder, a symbolic link or a file past ``max_bytes``."""
    path = Path(path)
    try:
        with open_regular(path, max_bytes, follow_symlinks=False) as f:
            return f.read(os.fstat(f.fileno()).st_size)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise _refused(path, e) from None


def read_folder_json(path: str | os.PathLike, max_bytes: int) -> Any:
    """The JSON value of one of the folder's own small files (None when it is absent); ``FolderError`` when it
    cannot be read or is not JSON."""
    data = read_folder_bytes(path, max_bytes)
    if data is None:
        return None
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        raise FolderError(f"{shown(path)}: not JSON; the run folder was edited or is damaged") from None


# --- JSONL records --------------------------------------------------------------------------------


def _is_item(value: Any, total: int | None) -> bool:
    return (isinstance(value, int) and not isinstance(value, bool) and 0 <= value
            and value < (MAX_ITEMS if total is None else total))


def _error_problem(record: dict) -> str | None:
    error = record.get("error")
    if not isinstance(error, dict):
        return "its error is not an object"
    for name in ("code", "message"):
        if name in error and not isinstance(error[name], str):
            return f"its error's {name} is not text"
    return None


def _expected_problem(record: dict) -> str | None:
    return None if "expected" in record else "it has no expected value"


def _review_problem(record: dict) -> str | None:
    if not isinstance(record.get("key"), str):
        return "it has no key"
    if not isinstance(record.get("field"), str):
        return "its field is not a path"
    if "value" not in record:
        return "it has no value"
    if record.get("decision") not in DECISIONS:
        return f"its decision is not {', '.join(DECISIONS[:-1])} or {DECISIONS[-1]}"
    if record["decision"] == "correct" and "corrected" not in record:
        return "a correction with no corrected value"
    if not isinstance(record.get("time", ""), str):
        return "its time is not text"
    return None


#: The checks of each file's records beyond the item number and the key (scores are checked by scoring).
RECORD_CHECKS: dict[str, Callable[[dict], str | None]] = {FAILURES: _error_problem, EXPECTED: _expected_problem,
                                                          REVIEWS: _review_problem}


def _item_words(value: Any, total: int | None) -> str:
    if not isinstance(value, int) or isinstance(value, bool):
        return f"its item {_short(value)} is not an item number (a whole number)"
    if total is not None:
        return f"its item {value} is not one of the map's {total} items (0 to {total - 1})"
    return f"its item {value} is out of range"


def _short(value: Any) -> str:
    try:
        text = orjson.dumps(value).decode()
    except TypeError:
        text = type(value).__name__
    text = for_terminal(text, one_line=True)
    return text if len(text) <= 40 else text[:39] + "…"


def _open_records(path: Path) -> IO[bytes]:
    try:
        return open_regular(path, MAX_RECORDS_FILE_BYTES, follow_symlinks=False)
    except OSError as e:
        raise _refused(path, e) from None


def _lines(path: Path, f: IO[bytes] | None = None, start: int = 0) -> Iterator[tuple[int, bytes, int]]:
    """(line number, the line without its newline, the offset after it) for each complete line of ``path``
    (or of ``f``, that file open) from offset ``start`` (a line's start; numbered from there), never past the
    size it had when opened; a torn last line (no newline: a crash mid-append) is not given."""
    if f is None:
        with _open_records(path) as f:
            yield from _lines(path, f, start)
        return
    f.seek(start)
    size = os.fstat(f.fileno()).st_size
    offset, number = start, 0
    while offset < size:
        try:
            line = read_line(f, min(MAX_RECORD_BYTES, size - offset))
        except OSError as e:
            raise _refused(path, e) from None
        number += 1
        if line is None:
            if size - offset > MAX_RECORD_BYTES:
                raise FolderError(f"{shown(path)}: line {number} is longer than {MAX_RECORD_BYTES} bytes; "
                                  f"the run folder is damaged")
            return  # the rest is one torn line
        if not line.endswith(b"\n"):
            return
        offset += len(line)
        yield number, line[:-1], offset


def _checked(path: Path, line: bytes, number: int | str, total: int | None) -> dict:
    """The record ``line`` of ``path`` holds, checked; ``FolderError`` naming line ``number`` otherwise."""
    try:
        record = orjson.loads(line)  # a map's files may be large: about five times json's speed
    except orjson.JSONDecodeError:
        raise FolderError(f"{shown(path)}: line {number} is not JSON; the run folder was edited or is "
                          f"damaged") from None
    problem = None
    check = RECORD_CHECKS.get(path.name)
    if not isinstance(record, dict):
        problem = "it is not an object"
    elif not _is_item(record.get("item"), total):
        problem = _item_words(record.get("item"), total) if "item" in record else "it has no item number"
    elif "key" in record and not isinstance(record["key"], str):
        problem = "its key is not text"
    elif check is not None:
        problem = check(record)
    if problem is not None:
        writer = "scoring" if path.name in SCORING_FILES else "a review" if path.name == REVIEWS else "a map"
        raise FolderError(f"{shown(path)}: line {number} is not a record {writer} wrote ({problem}); the run "
                          f"folder was edited or is damaged")
    return record


def checked_records(path: str | os.PathLike, *, total: int | None = None, file: IO[bytes] | None = None,
                    start: int = 0) -> Iterator[tuple[dict, int, int]]:
    """Each checked record of a results, failures or scoring file, one at a time (never the file's records at
    once), with the offsets where its line starts and ends (after its newline); a torn last line is not given,
    an absent file gives none. ``total``: item numbers must be below it. ``file``: that file, already open.
    ``start``: from this offset (where a line starts; lines are numbered from there). ``FolderError`` names a
    bad line."""
    path = Path(path)
    if file is None and not os.path.lexists(path):
        return
    for number, line, end in _lines(path, file, start):
        yield _checked(path, line, number, total), start, end
        start = end


class RecordIndex:
    """Where each item's record is in a results or failures file, so a large map's records are read back one
    at a time, as each is wanted (``get``), never held together: the file is read through once (every record
    checked, each given to ``on_record``), keeping two offsets an item, and stays open, so a file the map
    replaces meanwhile (it puts its files in item order as it ends) is still the one indexed. An item recorded
    more than once (``repeated``; a map never writes one twice) is its last record. A context manager."""

    def __init__(self, path: str | os.PathLike, total: int, on_record: Callable[[dict], None] | None = None):
        self.path = Path(path)
        self.total = total
        self.repeated = False
        self._starts = array("q", [-1]) * total
        self._ends = array("q", [0]) * total
        self._file: IO[bytes] | None = None
        if not os.path.lexists(self.path):
            return
        self._file = _open_records(self.path)
        try:
            for record, start, end in checked_records(self.path, total=total, file=self._file):
                item = record["item"]
                self.repeated = self.repeated or self._starts[item] >= 0
                self._starts[item], self._ends[item] = start, end
                if on_record is not None:
                    on_record(record)
        except BaseException:
            self.close()
            raise

    def __contains__(self, item: int) -> bool:
        return 0 <= item < self.total and self._starts[item] >= 0

    def get(self, item: int) -> dict | None:
        """Item ``item``'s record, read again and checked; None when it has none."""
        if item not in self or self._file is None:
            return None
        start, end = self._starts[item], self._ends[item]
        line = os.pread(self._file.fileno(), end - start, start)
        if len(line) != end - start or not line.endswith(b"\n"):
            raise FolderError(f"{shown(self.path)} changed while it was read; the run folder was edited")
        record = _checked(self.path, line[:-1], f"at byte {start}", self.total)
        if record["item"] != item:
            raise FolderError(f"{shown(self.path)} changed while it was read; the run folder was edited")
        return record

    def first_records(self) -> Iterator[dict]:
        """Each item's record (its last), in the order the items first appear in the file."""
        if self._file is None:
            return
        seen = ItemSet()
        for record, _, _ in checked_records(self.path, total=self.total, file=self._file):
            if record["item"] not in seen:
                seen.add(record["item"])
                yield self.get(record["item"]) or record

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> "RecordIndex":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def records_and_end(path: str | os.PathLike, *, total: int | None = None) -> tuple[list[dict], int]:
    """The checked records of a results, failures or scoring file, and the offset where its complete lines
    end (a torn last line after it); ``([], 0)`` when it is absent. ``total``: item numbers must be below it."""
    records: list[dict] = []
    end = 0
    for record, _, end in checked_records(path, total=total):
        records.append(record)
    return records, end


def _cut_after(path: Path, end: int) -> None:
    """Cut ``path`` at ``end`` when it is longer (a torn last line: its item runs again)."""
    if os.path.lexists(path) and os.lstat(path).st_size > end:
        try:
            fd = open_fd(path, flags=os.O_WRONLY, follow_symlinks=False)
        except OSError as e:
            raise _refused(path, e) from None
        try:
            os.ftruncate(fd, end)
        finally:
            os.close(fd)


def read_records(path: str | os.PathLike, *, total: int | None = None, repair: bool = False) -> list[dict]:
    """The checked records of a results, failures or scoring file, without a torn last line (a crash
    mid-append); ``repair`` also cuts that line off the file (the map's own thread, under its lock)."""
    path = Path(path)
    records, end = records_and_end(path, total=total)
    if repair:
        _cut_after(path, end)
    return records


@dataclass(frozen=True)
class RecordedItems:
    """What a results or failures file holds, as a resume needs it: its items (``ItemSet``), where its complete
    lines end, and whether they are in item order (the last being item ``last``, -1 for none)."""

    items: ItemSet
    end: int
    in_order: bool
    last: int


def scan_records(path: str | os.PathLike, *, total: int | None = None, repair: bool = False) -> RecordedItems:
    """A results or failures file's checked records read a record at a time, kept as ``RecordedItems``: what a
    resume needs of a large map's files, never its results held; ``repair`` as in ``read_records``."""
    path = Path(path)
    items = ItemSet()
    end, last, in_order = 0, -1, True
    for record, _, end in checked_records(path, total=total):
        item = record["item"]
        in_order = in_order and item >= last
        last = max(last, item)
        items.add(item)
    if repair:
        _cut_after(path, end)
    return RecordedItems(items, end, in_order, last)


def recorded_items(path: str | os.PathLike, *, total: int | None = None, repair: bool = False) -> ItemSet:
    """The item numbers of a results or failures file's checked records (``scan_records``)."""
    return scan_records(path, total=total, repair=repair).items


# --- the ledger -----------------------------------------------------------------------------------


def _count(value: Any, most: int = MAX_ITEMS) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= most


def read_ledger_json(run_dir: str | os.PathLike) -> dict:
    """The ledger as its JSON object, read safely; ``FolderError`` when ``run_dir`` holds none (of this
    format), or one that cannot be read."""
    run_dir = Path(run_dir)
    path = run_dir / LEDGER
    data = read_folder_bytes(path, MAX_LEDGER_BYTES)
    if data is None:
        raise FolderError(f"{shown(run_dir)} is not a map's run folder: it has no {LEDGER}")
    try:
        ledger = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise FolderError(f"{shown(path)} is not a tensorjob map ledger (not JSON)") from None
    if not isinstance(ledger, dict) or ledger.get("format") != LEDGER_FORMAT:
        raise FolderError(f"{shown(path)} is not a tensorjob map ledger (no \"format\": \"{LEDGER_FORMAT}\")")
    manifest = ledger.get("manifest")
    if not isinstance(manifest, dict) or not (_count(manifest.get("items")) and manifest["items"] >= 1):
        raise FolderError(f"{shown(path)}: its manifest's item count is not a whole number from 1 to {MAX_ITEMS}")
    for name in ("source", "sha256"):
        if manifest.get(name) is not None and not isinstance(manifest[name], str):
            raise FolderError(f"{shown(path)}: its manifest's {name} is not text")
    guest = ledger.get("guest")
    if guest is not None and not (isinstance(guest, dict) and isinstance(guest.get("sha256", ""), str)):
        raise FolderError(f"{shown(path)}: its guest's sha256 is not text")
    if not isinstance(ledger.get("sessions", []), list):
        raise FolderError(f"{shown(path)}: its sessions are not a list")
    return ledger


def read_ledger(run_dir: str | os.PathLike) -> dict:
    """What a run folder's ledger says, checked as input from anywhere: ``items`` (how many it claims: see
    ``confirmed_items``), the ``manifest_source`` and ``manifest_sha256`` it pins, the ``guest_sha256``, and
    its last ``session``'s summary (counts, status, error, ``elapsed_s``, ``where``), each value of the type
    and range it must have or left out. ``FolderError`` (a ``ResumeRefused``) if ``run_dir`` holds no ledger
    of this format."""
    ledger = read_ledger_json(run_dir)
    manifest, items = ledger["manifest"], ledger["manifest"]["items"]
    sessions = ledger.get("sessions") or []
    last = sessions[-1] if sessions and isinstance(sessions[-1], dict) else {}
    session: dict[str, Any] = {k: last[k] for k in ("completed", "failed", "skipped") if _count(last.get(k), items)}
    if last.get("status") in SESSION_STATUSES:
        session["status"] = last["status"]
    if isinstance(last.get("error"), str):
        session["error"] = last["error"][:2000]
    if isinstance(last.get("where"), str):
        session["where"] = last["where"][:2000]
    session["elapsed_s"] = _elapsed(last.get("started_at"), last.get("finished_at"))
    guest = ledger.get("guest") or {}
    return {"items": items, "session": session, "manifest_source": manifest.get("source"),
            "manifest_sha256": manifest.get("sha256"), "guest_sha256": guest.get("sha256") or None}


_TIME = "%Y-%m-%dT%H:%M:%S%z"


def _elapsed(started: Any, finished: Any) -> float:
    try:
        return max(0.0, time.mktime(time.strptime(finished, _TIME)) - time.mktime(time.strptime(started, _TIME)))
    except (TypeError, ValueError, OverflowError):
        return 0.0


def confirmed_items(run_dir: str | os.PathLike, ledger: dict, manifest_items: int | None, concluded: int) -> int:
    """How many items the map in ``run_dir`` has, as what was read confirms it: ``manifest_items`` when the
    manifest the ledger pins is at hand (a ledger that claims another count is refused), else the ledger's
    claim when every item it claims has concluded (``concluded``) or it is at most ``MAX_UNCONFIRMED_ITEMS``;
    ``FolderError`` otherwise (a ledger's word alone is not believed for more)."""
    claimed = ledger["items"]
    path = shown(Path(run_dir) / LEDGER)
    if manifest_items is not None:
        if manifest_items != claimed:
            raise FolderError(f"{path} says the map has {claimed} items, but the manifest it pins "
                              f"({shown(ledger['manifest_source'] or '?')}) has {manifest_items}; the ledger was "
                              f"edited or is damaged")
        return claimed
    if claimed <= MAX_UNCONFIRMED_ITEMS or concluded == claimed:
        return claimed
    where = ledger["manifest_source"]
    raise FolderError(f"{path} says the map has {claimed} items, and nothing here confirms it: its manifest "
                      f"{'(' + shown(where) + ') ' if where else ''}is not at hand (or changed) and only "
                      f"{concluded} items concluded; a ledger alone is believed up to {MAX_UNCONFIRMED_ITEMS} "
                      f"items -- put the manifest back where the ledger names it")


#: A manifest the ledger names is hashed before it is parsed when it is larger than this (a file that is not
#: the pinned one then costs a streamed read, never its items held).
MANIFEST_PREHASH_BYTES = 64 * 1024 * 1024


def pinned_manifest(ledger: dict) -> Manifest | None:
    """The manifest the ledger names, if it is at hand and is still the one the ledger pins (its SHA-256);
    None otherwise (moved, changed, not a regular file, not a manifest)."""
    source, sha256 = ledger["manifest_source"], ledger["manifest_sha256"]
    if not source or not sha256 or not os.path.isabs(source):
        return None
    try:
        with open_regular(source) as f:
            if os.fstat(f.fileno()).st_size > MANIFEST_PREHASH_BYTES:
                digest = hashlib.sha256()
                for block in iter(lambda: f.read(1 << 20), b""):
                    digest.update(block)
                if digest.hexdigest() != sha256:
                    return None
        manifest = read_manifest(source)
    except (OSError, ManifestError):
        return None
    return manifest if manifest.sha256 == sha256 else None


# --- jobs/ ----------------------------------------------------------------------------------------


def jobs_folder(run_dir: str | os.PathLike) -> Path | None:
    """``run_dir/jobs`` if it is a real folder (None when absent); ``FolderError`` when it is a symbolic link
    or not a folder: a run folder's transcripts must be its own."""
    path = Path(run_dir) / JOBS
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError as e:
        raise _refused(path, e) from None
    if stat.S_ISLNK(mode):
        raise FolderError(f"{shown(path)} is a symbolic link; a run folder's {JOBS}/ must be its own folder "
                          f"(never followed out of it)")
    if not stat.S_ISDIR(mode):
        raise FolderError(f"{shown(path)} is not a folder; a run folder's {JOBS}/ holds its items' transcripts")
    return path


def job_folders(run_dir: str | os.PathLike) -> list[Path]:
    """The real folders in ``jobs/`` (symbolic links are skipped, never followed), in no order; ``[]`` when there
    is no ``jobs/``; ``FolderError`` when ``jobs/`` itself is a link or not a folder."""
    jobs = jobs_folder(run_dir)
    if jobs is None:
        return []
    try:
        fd = os.open(jobs, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise FolderError(f"{shown(jobs)} is not the run folder's own folder") from None
        raise _refused(jobs, e) from None
    try:
        with os.scandir(fd) as entries:
            names = [entry.name for entry in entries if entry.is_dir(follow_symlinks=False)]
    finally:
        os.close(fd)
    return [jobs / name for name in names]


__all__ = [
    "LEDGER", "RESULTS", "FAILURES", "JOBS", "LEDGER_FORMAT", "SCORING_FILES", "EXPECTED", "SCORING", "SCORES",
    "REVIEW_FILES", "REVIEWS", "CERTIFICATE", "REVIEW_PLAN", "DECISIONS", "CASCADE",
    "MAX_LEDGER_BYTES", "MAX_RECORD_BYTES", "MAX_RECORDS_FILE_BYTES", "MAX_ITEMS", "MAX_UNCONFIRMED_ITEMS",
    "SESSION_STATUSES", "FolderError", "shown", "read_folder_bytes", "read_folder_json", "RECORD_CHECKS",
    "checked_records", "RecordIndex", "records_and_end", "read_records", "RecordedItems", "scan_records",
    "recorded_items", "read_ledger_json",
    "read_ledger", "MANIFEST_PREHASH_BYTES", "pinned_manifest",
    "confirmed_items", "jobs_folder",
    "job_folders",
]

"""The runs folder: list past runs, find one by id, prune old ones safely.

Every job leaves a folder under the runs folder named by its id. There is no index: runs are written by many
processes, copied and deleted by hand, so the folder itself is the truth, and a listing reads only the two small
files it shows, through the checked reader. ``prune`` keeps the newest runs by what the file system says and
deletes only what a job wrote, never following a symlink.

Design: docs/internals/history.md#runspy
"""

from __future__ import annotations

import html
import os
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from tensorjob_jupyter.abi import TensorjobError
from tensorjob_jupyter.text import for_html, for_terminal
from tensorjob_jupyter.record.job_folder import EVENTS_FILE, RUN_FILES, is_live, runs_folder
from tensorjob_jupyter.record.transcript import read_header
from tensorjob_jupyter.record.event_checks import TranscriptError
from tensorjob_jupyter.regular_file import open_fd

STATUSES = ("completed", "failed", "cancelled", "running", "interrupted", "unreadable")


class RunError(TensorjobError, ValueError):
    """A run that cannot be found or used (one line)."""


@dataclass
class RunInfo:
    """One past run, as a listing shows it."""

    id: str
    path: Path
    guest: str
    status: str
    tokens_in: int | None = None
    tokens_out: int | None = None
    duration_ms: int | None = None
    started: float | None = None  # seconds since the epoch
    replay_of: str | None = None
    error: str | None = None  # the error code, or why the run is unreadable

    def to_json(self) -> dict:
        return {"id": self.id, "path": str(self.path), "guest": self.guest, "status": self.status,
                "tokens_in": self.tokens_in, "tokens_out": self.tokens_out, "duration_ms": self.duration_ms,
                "started": self.started, "replay_of": self.replay_of, "error": self.error}


def run_info(run_dir: Path) -> RunInfo:
    """What a listing shows of one run folder (``TranscriptError`` if it is not a run at all)."""
    try:
        header = read_header(run_dir)
    except TranscriptError as e:
        if not (run_dir / EVENTS_FILE).is_file():
            raise
        return RunInfo(run_dir.name, run_dir, "?", "unreadable", started=_mtime(run_dir), error=str(e))
    envelope = header.envelope
    if envelope is not None:
        status = str(envelope.get("status"))
    else:
        status = "running" if is_live(run_dir) else "interrupted"
    usage = (envelope or {}).get("usage") or {}
    error = (envelope or {}).get("error") or {}
    started = header.created_at
    if started is None:
        started = _mtime(run_dir)
    replay = (header.replay_of or {}).get("run")
    return RunInfo(run_dir.name, run_dir, header.name, status, usage.get("tokens_in"), usage.get("tokens_out"),
                   usage.get("duration_ms"), started, replay if isinstance(replay, str) else None, error.get("code"))


def _mtime(run_dir: Path) -> float | None:
    """When the run's ``events.jsonl`` was last written, as the file system says (a symlink's own time)."""
    try:
        return os.lstat(run_dir / EVENTS_FILE).st_mtime
    except OSError:
        return None


def _unreadable(path: Path, e: BaseException) -> RunInfo:
    why = for_terminal(str(e) or type(e).__name__, one_line=True)[:200]
    return RunInfo(path.name, path, "?", "unreadable", started=_mtime(path),
                   error=f"{for_terminal(str(path), one_line=True)}: cannot be read ({type(e).__name__}: {why})")


def _run_folders(runs_dir: Path):
    """Real folders directly in the runs folder (symlinks are neither followed nor listed)."""
    try:
        entries = list(os.scandir(runs_dir))
    except FileNotFoundError:
        return
    except OSError as e:
        raise RunError(f"cannot read the runs folder {for_terminal(str(runs_dir), one_line=True)}: "
                       f"{e.strerror}") from None
    for entry in entries:
        if entry.is_dir(follow_symlinks=False):
            yield Path(entry.path)


def list_runs(runs: str | os.PathLike | None = None, *, status: str | None = None,
              limit: int | None = None) -> "RunList":
    """The runs in the runs folder, newest first; ``status`` keeps only those, ``limit`` the newest N."""
    if status is not None and status not in STATUSES:
        raise RunError(f"--status {status!r}: not a status; use one of {', '.join(STATUSES)}")
    if limit is not None and limit < 0:
        raise RunError("--limit must be 0 or more")
    runs_dir = runs_folder(runs)
    found = []
    for path in _run_folders(runs_dir):
        try:
            found.append(run_info(path))
        except TranscriptError:
            continue  # not a run folder
        except (OSError, ValueError, TypeError, AttributeError, KeyError, OverflowError, RecursionError,
                MemoryError) as e:  # a folder the checks missed is one line, never the end of the listing
            found.append(_unreadable(path, e))
    found.sort(key=lambda r: (r.started or 0.0, r.id), reverse=True)
    if status is not None:
        found = [r for r in found if r.status == status]
    if limit is not None:
        found = found[:limit]
    return RunList(found, runs_dir)


def resolve_run(run: Any, runs: str | os.PathLike | None = None) -> Path:
    """A run folder from an id, a unique prefix of one, or a path (a ``Job`` also works)."""
    if hasattr(run, "run_dir"):
        return Path(run.run_dir)
    text = os.fspath(run) if isinstance(run, os.PathLike) else str(run)
    if not text:
        raise RunError("no run given: name a run by its id (see `tensorjob runs`) or its folder")
    path = Path(text).expanduser()
    if path.is_dir() and (path / EVENTS_FILE).exists():
        return path
    runs_dir = runs_folder(runs)
    shown = for_terminal(text, one_line=True)
    if os.sep not in text and text not in (".", ".."):
        exact = runs_dir / text
        if exact.is_dir() and not exact.is_symlink():
            return exact
        matches = sorted(p.name for p in _run_folders(runs_dir) if p.name.startswith(text))
        if len(matches) == 1:
            return runs_dir / matches[0]
        if len(matches) > 1:
            listed = ", ".join(matches[:5]) + (", ..." if len(matches) > 5 else "")
            raise RunError(f"{shown} matches {len(matches)} runs ({listed}); give more of the id")
    if path.is_dir():
        raise RunError(f"{shown} is a folder but not a tensorjob run (no {EVENTS_FILE})")
    raise RunError(f"no run {shown} in {for_terminal(str(runs_dir), one_line=True)} (see `tensorjob runs`, "
                   f"or give the run folder's path)")


# --- pruning -------------------------------------------------------------------------------------


@dataclass
class PruneReport:
    removed: list[str] = field(default_factory=list)
    kept: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (folder, why)
    bytes_freed: int = 0

    def lines(self) -> list[str]:
        out = [f"removed {len(self.removed)} runs, kept {self.kept}"]
        for name, why in self.skipped:
            out.append(for_terminal(f"skipped {name}: {why}", one_line=True))
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())

    def to_json(self) -> dict:
        return {"removed": self.removed, "kept": self.kept, "bytes_freed": self.bytes_freed,
                "skipped": [{"run": n, "why": w} for n, w in self.skipped]}


def _is_own_transcript(run_dir: Path) -> bool:
    """``events.jsonl`` is a regular file that starts with this folder's own ``job.created``."""
    head = b'{"type":"job.created","sequence_number":0,"job_id":' + orjson.dumps(run_dir.name)
    try:
        fd = open_fd(run_dir / EVENTS_FILE, follow_symlinks=False)
    except OSError:  # missing, a symlink, or not a regular file
        return False
    try:
        return os.read(fd, len(head)) == head
    finally:
        os.close(fd)


def _remove_run(run_dir: Path) -> tuple[int, str | None]:
    """Delete one run folder; (bytes freed, None) or (0, why it was left)."""
    try:
        mode = os.lstat(run_dir).st_mode
    except OSError as e:
        return 0, f"cannot inspect it ({e.strerror})"
    if stat.S_ISLNK(mode) or not stat.S_ISDIR(mode):
        return 0, "not a folder (a symlink is never followed)"
    if not _is_own_transcript(run_dir):
        return 0, f"its {EVENTS_FILE} is not this folder's own transcript"
    if is_live(run_dir):
        return 0, "its job is still running"
    try:
        names = os.listdir(run_dir)
    except OSError as e:
        return 0, f"cannot list it ({e.strerror})"
    others = sorted(set(names) - RUN_FILES)
    if others:
        return 0, f"it holds files a job does not write ({', '.join(others[:3])})"
    size = 0
    for name in names:
        st = os.lstat(run_dir / name)
        if not stat.S_ISREG(st.st_mode):
            return 0, f"{name} is not a regular file"
        size += st.st_size
    for name in names:
        os.unlink(run_dir / name)  # unlink never follows a link
    try:
        os.rmdir(run_dir)
    except OSError as e:
        return size, f"emptied but not removed ({e.strerror})"
    return size, None


def prune(keep: int, runs: str | os.PathLike | None = None, *, status: str | None = None) -> PruneReport:
    """Delete all but the newest ``keep`` runs (of ``status``, if given), safely (see the module doc)."""
    if keep < 0:
        raise RunError("--prune KEEP must be 0 or more")
    listed = list_runs(runs, status=status)
    listed.sort(key=lambda r: (_mtime(r.path) or 0.0, r.id), reverse=True)  # the file system's word, not the run's
    report = PruneReport(kept=min(keep, len(listed)))
    for info in listed[keep:]:
        freed, why = _remove_run(info.path)
        report.bytes_freed += freed
        if why is None:
            report.removed.append(info.id)
        else:
            report.skipped.append((info.id, why))
            report.kept += 1
    return report


# --- showing a listing ---------------------------------------------------------------------------

COLUMNS = ("ID", "GUEST", "STATUS", "TOKENS IN/OUT", "DURATION", "STARTED")
GUEST_CHARS = 32


def duration_text(ms: int | None) -> str:
    if not isinstance(ms, int) or isinstance(ms, bool):
        return "-"
    return f"{ms} ms" if ms < 1000 else f"{ms / 1000:.1f} s"


def started_text(started: float | None) -> str:
    if started is None:
        return "-"
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started))
    except (OverflowError, OSError, ValueError, TypeError):  # a file time no calendar holds
        return "?"


def _row(r: RunInfo) -> tuple[str, ...]:
    guest = r.guest if len(r.guest) <= GUEST_CHARS else r.guest[:GUEST_CHARS - 1] + "…"
    if r.replay_of:
        guest += " (replay)"
    status = r.status + (f" ({r.error})" if r.error and r.status != "unreadable" else "")
    tokens = "-" if r.tokens_in is None else f"{r.tokens_in}/{r.tokens_out}"
    return (r.id, guest, status, tokens, duration_text(r.duration_ms), started_text(r.started))


class RunList(list):
    """A listing of runs: a list of ``RunInfo``, shown as a table (HTML in a notebook)."""

    def __init__(self, runs: list[RunInfo], runs_dir: Path):
        super().__init__(runs)
        self.runs_dir = runs_dir

    def table(self) -> str:
        if not self:
            return f"no runs in {for_terminal(str(self.runs_dir), one_line=True)}"
        rows = [COLUMNS] + [tuple(for_terminal(c, one_line=True) for c in _row(r)) for r in self]
        widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
        return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows)

    def __repr__(self) -> str:
        return self.table()

    __str__ = __repr__

    def _repr_html_(self) -> str:
        if not self:
            return f"<p>no runs in <code>{for_html(str(self.runs_dir))}</code></p>"
        head = "".join(f"<th style='text-align:left'>{html.escape(c)}</th>" for c in COLUMNS)
        body = "".join("<tr>" + "".join(f"<td>{for_html(c)}</td>" for c in _row(r)) + "</tr>" for r in self)
        return (f"<table class='tensorjob-runs' style='font-size:12px'><thead><tr>{head}</tr></thead>"
                f"<tbody>{body}</tbody></table>")


__all__ = [
    "STATUSES", "RunError", "RunInfo", "run_info", "list_runs", "resolve_run", "PruneReport", "prune", "COLUMNS",
    "GUEST_CHARS", "duration_text", "started_text", "RunList"
]

"""A past map read back: its result, and the job transcript each of its items concluded in.

A map's run folder (``fanout.map_folder``) records each concluded item's result or error, and keeps every
item's job transcript under ``jobs/`` -- one folder per job, named by the job's id, whose
``job.created`` names the job ``GUEST[i]`` for item ``i``. There is no index to keep in step (as for
the runs folder, ``runs.py``): the transcripts themselves say which item each one ran, and how it ended.
An item may have several (a map cancelled and resumed, a Dask worker that died mid-item); the one that
counts is the latest that ended as the folder says the item concluded -- completed or failed.

Everything here is read as files from anywhere (``fanout.map_folder_reader``): a ``jobs/`` that is a link out of
the folder is refused; a transcript that cannot be read, or that names an item the map does not have, is
skipped (that item then has no recording), never trusted.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from tensorjob_jupyter.fanout.map_folder_reader import MAX_ITEMS, job_folders, read_ledger
from tensorjob_jupyter.fanout.progress import MapResult
from tensorjob_jupyter.history.runs import RunInfo, run_info
from tensorjob_jupyter.record.event_checks import TranscriptError
from tensorjob_jupyter.record.transcript import read_header

_ITEM_NAME = re.compile(r"\[(\d{1,12})\]\Z")


@dataclass(frozen=True)
class ItemRun:
    """The job one item of a map concluded in: its transcript folder, how it ended, what it used."""

    item: int
    path: Path
    status: str
    tokens_in: int | None
    tokens_out: int | None
    duration_ms: int | None

    @property
    def job_id(self) -> str:
        return self.path.name

    @property
    def tokens(self) -> int | None:
        if self.tokens_in is None and self.tokens_out is None:
            return None
        return (self.tokens_in or 0) + (self.tokens_out or 0)


def item_of(name: str, total: int) -> int | None:
    """The item number a map's job name (``GUEST[i]``) gives, if it is one of ``total``."""
    m = _ITEM_NAME.search(name)
    if m is None:
        return None
    item = int(m.group(1))
    return item if item < total else None


class RecordedMap:
    """A map's run folder read back: ``result`` (a ``MapResult``) and ``item_run(i)``, the transcript item
    ``i`` concluded in (None where there is none: the item never ran, or failed before its job started)."""

    def __init__(self, run_dir: str | os.PathLike):
        self.result = MapResult.read(run_dir)  # ResumeRefused (a MapError) if it is not a map's folder
        self.path = self.result.run_dir
        self._runs: dict[int, ItemRun] | None = None
        self._inputs: list[Any] | None = None

    @property
    def total(self) -> int:
        return self.result.total

    @property
    def ledger(self) -> dict:
        """What the map's ledger says (``folder.read_ledger``: checked, as a file from anywhere)."""
        return read_ledger(self.path)

    def item_runs(self) -> dict[int, ItemRun]:
        """Every concluded item's job, by item (read once: two small reads a transcript)."""
        if self._runs is None:
            self._runs = _index(self.path, self.result)
        return self._runs

    def item_run(self, item: int) -> ItemRun | None:
        return self.item_runs().get(item)

    def inputs(self) -> Sequence[Any]:
        """Each item's input: the manifest's when it is still there unchanged, else each item's recorded
        input (None for an item with no transcript)."""
        if self.result.inputs:
            return self.result.inputs
        if self._inputs is None:
            runs = self.item_runs()
            self._inputs = [_recorded_input(runs.get(i)) for i in range(self.total)]
        return self._inputs


def _index(run_dir: Path, result: MapResult) -> dict[int, ItemRun]:
    completed, failed = set(result.results()), set(result.failures())
    concluded_as = {**{i: "failed" for i in failed}, **{i: "completed" for i in completed}}
    found: dict[int, tuple[float, ItemRun]] = {}
    for path in job_folders(run_dir):  # FolderError for a jobs/ that is a link out of the folder
        try:
            info: RunInfo = run_info(path)
        except (OSError, TranscriptError):
            continue
        item = item_of(info.guest, result.total)
        if item is None or concluded_as.get(item) != info.status:
            continue
        run = ItemRun(item, info.path, info.status, _count(info.tokens_in), _count(info.tokens_out),
                      _count(info.duration_ms))
        when = info.started if isinstance(info.started, (int, float)) else 0.0
        if item not in found or when >= found[item][0]:
            found[item] = (when, run)
    return {item: run for item, (_when, run) in found.items()}


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_ITEMS else None


def _recorded_input(run: ItemRun | None) -> Any:
    if run is None:
        return None
    try:
        created = read_header(run.path).created or {}
    except (OSError, TranscriptError):
        return None
    return created.get("input")


__all__ = ["ItemRun", "item_of", "RecordedMap"]

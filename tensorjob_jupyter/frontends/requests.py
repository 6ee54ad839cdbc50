"""What ``tensorjob`` and ``%tensorjob`` both ask for, as typed requests over the public Python API.

Each front end reads its own arguments once -- a guest, a ``JobSpec``, an ``Overrides``, a ``MapSpec`` or a
``MapReplaySpec`` (built here, checked once) -- and hands them here; what is here calls ``tensorjob_jupyter``'s
own names (``tj.start_map``, ``tj.start_map_replay``, ``tj.ReplayJob``, ``tj.list_runs``, ...) and turns whatever
keeps the work from starting into one ``OptionError`` line. Nothing here sees an argparse namespace or prints but what it is
told to: the command line and the magic share the checks, never each other's parsers.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterator, TextIO

import tensorjob_jupyter as tj
from tensorjob_jupyter.abi import OptionError
from tensorjob_jupyter.history.runs import RunList, resolve_run
from tensorjob_jupyter.history.show import Playback, check_speed
from tensorjob_jupyter.host import GuestSource, JobSpec, Overrides


def map_spec(over: Any, run_dir: Any, **keywords: Any) -> tj.MapSpec:
    """The map a front end's flags describe, as one checked ``MapSpec`` (``MapSpec.of``'s keywords): a bad number,
    a manifest, a cascade setting is one ``OptionError`` line."""
    with _one_line():
        return tj.MapSpec.of(over, run_dir, **keywords)


def start_map(spec: JobSpec, map_spec: tj.MapSpec) -> tj.MapRun:
    """Start the map of the job ``spec`` that ``map_spec`` describes; whatever keeps it from starting -- a refused
    run folder, a cluster that cannot be reached, expected answers that do not fit -- is one ``OptionError``
    line."""
    with _one_line(unexpected=True):
        return tj.start_map(spec, map_spec)


def estimate_map(spec: JobSpec, map_spec: tj.MapSpec) -> tj.MapEstimate:
    """``--estimate``: what the map would cost; a problem is one ``OptionError`` line."""
    with _one_line():
        return tj.estimate_map(spec, map_spec)


def replay_job(guest: GuestSource, run: Any, overrides: Overrides, *, live: bool, recorded_grants: bool,
               err: TextIO) -> tj.ReplayJob:
    """The replay of ``guest`` against the run ``run`` (an id, a folder or a ``Job``) with ``overrides`` in place
    of the recorded setup -- not started. What it takes from the recording that widens what the guest may do
    (``ReplayJob.adopted``) is said on ``err`` before anything runs."""
    _check_recorded_grants(recorded_grants, live)
    with _one_line():  # a refusal below (an input past the job's values, a file) is one line, never a traceback
        job = tj.ReplayJob(guest, run, live=live, overrides=overrides, recorded_grants=recorded_grants)
    for line in job.adopted:
        err.write(line + "\n")
    return job


def map_replay_spec(run_dir: Any, **keywords: Any) -> tj.MapReplaySpec:
    """The replay of a recorded map a front end's flags describe, as one checked ``MapReplaySpec``
    (``MapReplaySpec.of``'s keywords); a bad value is one ``OptionError`` line."""
    _check_recorded_grants(keywords.get("recorded_grants", False), keywords.get("live", False))
    with _one_line():
        return tj.MapReplaySpec.of(run_dir, **keywords)


def start_map_replay(guest: GuestSource, spec: tj.MapReplaySpec, overrides: Overrides) -> Any:
    """The replay of ``guest`` over the recorded map ``spec`` names, started, with ``overrides`` in place of each
    item's recorded setup (a ``MapReplayRun``); anything that keeps it from starting is one ``OptionError``
    line."""
    given = overrides.given
    if "input" in given:
        raise OptionError("replay --map takes each item's input from its recording, not --input")
    if given & {"debug", "break_on"}:
        raise OptionError("replay --map does not debug its items: replay one item's run with --from RUN --debug")
    with _one_line():
        return tj.start_map_replay(spec, guest, overrides=overrides)


def find_runs(runs: str | None, *, status: str | None, limit: int | None) -> tuple[RunList, int]:
    """The runs a listing shows -- newest first, only ``status`` if given, the newest ``limit`` (0 or None:
    all) -- and how many there are in all."""
    if limit is not None and limit < 0:
        raise OptionError("--limit must be 0 (all) or more")
    listing = tj.list_runs(runs, status=status)
    total = len(listing)
    if limit:
        del listing[limit:]
    return listing, total


def map_row_source(run_dir: str, *, review: bool = False, what: str = "--table") -> Callable[[], Iterator[dict]]:
    """What gives the rows of the map in ``run_dir`` afresh each time it is called, a row at a time
    (``MapResult.iter_rows()``; ``review``: ``map_rows``'s list), for a table of any size; a folder that is not a
    map's, or a file of it that cannot be read, is one ``OptionError`` naming ``what`` asked."""
    if review:
        reviewed = map_rows(run_dir, review=True, what=what)
        return lambda: iter(reviewed)
    try:
        result = tj.MapResult.read(run_dir)
    except (tj.MapError, OSError) as e:
        raise OptionError(f"{what} {run_dir}: {' '.join(str(e).split())}") from None

    def rows() -> Iterator[dict]:
        try:
            yield from result.iter_rows()
        except (tj.MapError, OSError) as e:
            raise OptionError(f"{what} {run_dir}: {' '.join(str(e).split())}") from None
    return rows


def map_rows(run_dir: str, *, review: bool = False, what: str = "--table") -> list[dict]:
    """The rows of the map in ``run_dir`` (``MapResult.rows()``; ``review``: its values doubtful first,
    ``MapResult.review()``); a folder that is not a map's is one ``OptionError`` naming ``what`` asked."""
    try:
        result = tj.MapResult.read(run_dir)
        return result.review() if review else result.rows()
    except (tj.MapError, OSError) as e:
        raise OptionError(f"{what} {run_dir}: {' '.join(str(e).split())}") from None


def open_playback(run: Any, runs: str | None, *, speed: float, watched: bool = True) -> Playback:
    """A recorded run ready to be shown again: ``speed`` checked, and the transcript read through once, so a
    damaged one is one error line before anything is shown. ``watched=False``: nobody watches the pauses
    (plain text), so it plays at once."""
    try:
        check_speed(speed)
    except ValueError as e:
        raise OptionError(str(e)) from None
    playback = Playback(resolve_run(run, runs), speed=speed if watched else 0.0)
    for _ in playback.reader:
        pass
    return playback


def _check_recorded_grants(recorded_grants: bool, live: bool) -> None:
    if recorded_grants and not live:
        raise OptionError("--recorded-grants is for a --live replay (a replay without --live reads only what "
                          "--read grants here, and stops where a file's answer differs)")


@contextmanager
def _one_line(*, unexpected: bool = False) -> Iterator[None]:
    """Refusals from below as one ``OptionError`` line (``unexpected``: any other error too, named by its type:
    a cluster that cannot be reached raises what its library raises)."""
    try:
        yield
    except OptionError:
        raise
    except (tj.MapError, tj.ReplayError, tj.ModelError, OSError, ValueError) as e:
        raise OptionError(" ".join(str(e).split())) from None
    except Exception as e:
        if not unexpected:
            raise
        raise OptionError(f"{type(e).__name__}: {' '.join(str(e).split())}") from None


__all__ = [
    "map_spec", "map_replay_spec", "start_map", "estimate_map", "replay_job", "start_map_replay", "find_runs",
    "map_rows", "map_row_source", "open_playback",
]

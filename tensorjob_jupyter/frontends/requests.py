"""What ``tensorjob`` and ``%tensorjob`` both ask for, as typed requests over the public Python API.

Each front end reads its own arguments once -- a guest, a ``JobSpec``, an ``Overrides``, a ``MapRequest`` --
and hands them here; what is here calls ``tensorjob_jupyter``'s own names (``tj.start_map``,
``tj.start_map_replay``, ``tj.ReplayJob``, ``tj.list_runs``, ...) and turns whatever keeps the work from
starting into one ``OptionError`` line. Nothing here sees an argparse namespace or prints but what it is
told to: the command line and the magic share the checks, never each other's parsers.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, TextIO

import tensorjob_jupyter as tj
from tensorjob_jupyter.abi import OptionError
from tensorjob_jupyter.history.runs import RunList, resolve_run
from tensorjob_jupyter.history.show import Playback, check_speed
from tensorjob_jupyter.host import GuestSource, JobSpec, Overrides


@dataclass(frozen=True)
class MapRequest:
    """A map to run (or estimate): its manifest, its folder, and how it runs (``tj.start_map``'s keywords)."""

    over: str
    run_dir: str
    concurrency: int | str | None = None
    cluster: str | None = None
    retry_failed: bool = False
    restart: bool = False
    expected: Any = None
    #: a built-in scorer's name, or (from a notebook) a Python function (result, expected) -> score
    scorer: Any = None
    max_total_tokens: int | None = None
    deterministic: bool = False
    #: a cascade's oracle model (``--cascade``) and its settings; None: no cascade (``tj.start_map``'s keywords)
    cascade: str | None = None
    target: float | None = None
    delta: float | None = None
    cascade_on: str | None = None
    cascade_score: str | None = None
    cascade_sample: int | None = None
    target_against: str | None = None
    mixed_models: bool = False


@dataclass(frozen=True)
class MapReplayRequest:
    """A replay over a recorded map: where it goes, whether it may ask the model, and how it is scored."""

    run_dir: Any
    out: str | None = None
    live: bool = False
    recorded_grants: bool = False
    concurrency: int | str | None = None
    expected: Any = None
    scorer: Any = None
    deterministic: bool = False
    #: with ``live``: every item run again on the model from its start (``--rerun``)
    rerun: bool = False


def start_map(spec: JobSpec, request: MapRequest) -> tj.MapRun:
    """Start the map ``request`` describes, of the job ``spec``; whatever keeps it from starting -- a bad number,
    a manifest, a refused run folder, a cluster that cannot be reached, expected answers that do not fit -- is
    one ``OptionError`` line."""
    if request.max_total_tokens is not None and request.max_total_tokens < 1:
        raise OptionError("--max-total-tokens must be at least 1")
    with _one_line(unexpected=True):
        return tj.start_map(spec, request.over, request.run_dir, concurrency=request.concurrency,
                            cluster=request.cluster, retry_failed=request.retry_failed, restart=request.restart,
                            expected=request.expected, scorer=request.scorer,
                            max_total_tokens=request.max_total_tokens, deterministic=request.deterministic,
                            mixed_models=request.mixed_models, **_cascade(request))


def _cascade(request: MapRequest) -> dict:
    """The cascade's keywords of ``tj.start_map`` that were given (none without ``--cascade``: the map refuses a
    setting given alone, naming it)."""
    given = {name: getattr(request, name) for name in ("cascade", "target", "delta", "cascade_on", "cascade_score",
                                                        "cascade_sample", "target_against")}
    return {name: value for name, value in given.items() if value is not None}


def estimate_map(spec: JobSpec, request: MapRequest) -> tj.MapEstimate:
    """``--estimate``: what the map ``request`` describes would cost; a problem is one ``OptionError`` line."""
    with _one_line():
        return tj.estimate_map(spec, request.over, run_dir=request.run_dir)


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


def start_map_replay(guest: GuestSource, request: MapReplayRequest, overrides: Overrides) -> Any:
    """The replay of ``guest`` over the recorded map ``request.run_dir``, started, with ``overrides`` in place of
    each item's recorded setup (a ``MapReplayRun``); anything that keeps it from starting is one
    ``OptionError`` line."""
    given = overrides.given
    if "input" in given:
        raise OptionError("replay --map takes each item's input from its recording, not --input")
    if given & {"debug", "break_on"}:
        raise OptionError("replay --map does not debug its items: replay one item's run with --from RUN --debug")
    _check_recorded_grants(request.recorded_grants, request.live)
    concurrency = None if request.concurrency in (None, "auto") else request.concurrency
    if concurrency is not None and int(concurrency) < 1:
        raise OptionError("--concurrency must be at least 1")
    with _one_line():
        return tj.start_map_replay(request.run_dir, guest, out=request.out, live=request.live,
                                   recorded_grants=request.recorded_grants, overrides=overrides,
                                   concurrency=int(concurrency) if concurrency is not None else None,
                                   expected=request.expected, scorer=request.scorer,
                                   deterministic=request.deterministic, rerun=request.rerun)


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
    "MapRequest", "MapReplayRequest", "start_map", "estimate_map", "replay_job", "start_map_replay", "find_runs",
    "map_rows", "map_row_source", "open_playback",
]

"""A changed guest re-run over a recorded map, with no model: every item replayed against its own recording.

    replay = tj.replay_map("runs/reports", "extract_v2.py")   # tensorjob replay --map runs/reports extract_v2.py
    replay.to_pandas()           # one row per item: old and new result, changed fields, old and new score, ...
    replay.needs_model           # the items whose prompts changed: the recording cannot answer them
    replay.passed(0.8)           # the regression gate (--fail-under 0.8)

Each item is a ``ReplayJob`` against the transcript it concluded in, with its recorded setup and the same
``Overrides`` merged over every item's (given once) -- but no recorded grant: items read and fetch only what was
given, as ``MapReplayRun.said`` says first; one that opens what it was not given *needs a grant*, named. The
first command an item's recording cannot answer is its divergence: it *needs the model*, unless ``live=True``
lets the model answer from there. The replay is itself a map (``fanout.MapRun`` with ``ReplayExecutor``) into
its own folder, scored as the recorded map was; ``MapReplay`` compares the two item by item; ``passed`` gates.
Design: docs/internals/history.md#map_replaypy
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from tensorjob_jupyter.abi import AbiError, JobStatus, codes
from tensorjob_jupyter.fanout.errors import MapError
from tensorjob_jupyter.fanout.map_folder import JOBS, LEDGER, MapFolder
from tensorjob_jupyter.fanout.map_folder_reader import REVIEWS, read_ledger_json
from tensorjob_jupyter.fanout.items import await_job, failed_outcome, job_outcome
from tensorjob_jupyter.fanout.local import LocalExecutor
from tensorjob_jupyter.fanout.manifest import Manifest, ManifestItems, read_manifest
from tensorjob_jupyter.fanout.progress import MapResult
from tensorjob_jupyter.fanout.run import MapRun
from tensorjob_jupyter.fanout.expected import Expected
from tensorjob_jupyter.fanout.scoring import BUILTINS, Scoring, scorer_name, scorer_of
from tensorjob_jupyter.fanout.start import decoded_alone, deterministic_threads
from tensorjob_jupyter.history.map_compare import MapComparison
from tensorjob_jupyter.history.maps import RecordedMap
from tensorjob_jupyter.history.replay import ReplayJob
from tensorjob_jupyter.history.replay_setup import ReplayError, given_here, grants_line, live_model, load_run
from tensorjob_jupyter.host.jobs import Job
from tensorjob_jupyter.host.spec import Overrides
from tensorjob_jupyter.sandbox.compile import GuestSource
from tensorjob_jupyter.host.waiting import wait_or_cancel
from tensorjob_jupyter.host.reactor import internal_error
from tensorjob_jupyter.inference.base import ModelError
from tensorjob_jupyter.inference.providers import ModelRef
from tensorjob_jupyter.inference.topology import available_cpus
from tensorjob_jupyter.text import clip, for_terminal

#: The folder a replay goes into under the recorded map's, unless told.
REPLAY_DIR = "replay"
#: What a replay folder's ledger says of where it ran (and how a replay folder is told from a map's).
WHERE = "replay of "
#: The new status of an item whose recording could not answer the changed guest.
NEEDS_MODEL = "needs the model"
#: The new status of an item that read (or fetched) what the replay was not granted.
NEEDS_GRANT = "needs a grant"


@dataclass(frozen=True)
class ItemReplay:
    """How one item's replay went."""

    item: int
    replay_job: str | None = None
    needs_model: bool = False
    diverged_at: int | None = None
    divergence: str | None = None
    live_from: int | None = None
    #: the grant it was denied and would need (``--read PATH``, ``--fetch PREFIX``)
    needs_grant: str | None = None


class ReplayExecutor(LocalExecutor):
    """A map's executor whose items are replays of a recorded map's jobs, ``concurrency`` at a time on threads
    (``LocalExecutor``'s loop, with each item a ``ReplayJob``); ``details`` says how each one went."""

    def __init__(self, recorded: RecordedMap, guest: Any, *, live: bool, backend: Any, jobs_dir: Path,
                 concurrency: int, overrides: Overrides | None = None, recorded_grants: bool = False,
                 deterministic_threads: int | None = None, model: ModelRef | None = None, rerun: bool = False):
        super().__init__(spec=None, backend=backend, concurrency=concurrency)
        self.rerun = rerun  # every item run afresh on the model, from its start, under its recorded setup
        self.recorded_grants = recorded_grants  # a replay takes the recorded grants only when told
        self.deterministic_threads = deterministic_threads
        self.recorded = recorded
        self.guest = GuestSource.of(guest)
        self.live = live
        self.jobs_dir = jobs_dir
        # what was given anew, for every item alike: each item's transcript and name are the replay's own
        self.overrides = (overrides or Overrides()).replace(debug=None, break_on=None, runs_dir=os.fspath(jobs_dir),
                                                            model=None, model_name=None, api_key_env=None, loras=None)
        self.model = model  # the live model, named once for every item (``start_map_replay``)
        self.where = WHERE + str(recorded.path)
        self.concluded = set(recorded.result.results()) | set(recorded.result.failures())
        self.details: dict[int, ItemReplay] = {}  # written by the pool's threads, one item each

    def run_item(self, index: int, item: Any, cancelled: Callable[[], bool]) -> dict:
        """One item's replay: its outcome for the map (never raises); how it went goes to ``details``."""
        started = time.perf_counter()
        found = self.recorded.item_run(index)
        if found is None:
            if index not in self.concluded:
                return {"item": index, "status": JobStatus.CANCELLED.value}  # never concluded: not run
            why = ("the recorded map has no readable transcript for this item (it failed before its job started, "
                   "or the transcript is gone or damaged)")
            self.details[index] = ItemReplay(index, needs_model=True, divergence=why)
            return failed_outcome(index, codes.REPLAY_DIVERGENCE, f"{why}: it needs the model")
        try:
            run = load_run(found.path)
            spec = run.spec(self.guest, recorded_grants=self.recorded_grants,
                            grants=self.overrides.read is None).merge(
                self.overrides.replace(name=f"{self.guest.name}[{index}]", input=item))
            if self.model is not None:
                spec = spec.replace(model=self.model)
            if self.deterministic_threads is not None:
                spec = spec.replace(infer=decoded_alone(spec.infer, self.deterministic_threads))
            if self.rerun:  # not a replay: the item's job again, on the model, with nothing from its recording
                return self._rerun(index, Job(spec, backend=self.backend), started, cancelled)
            job = ReplayJob(spec, run, live=self.live, backend=self.backend if self.live else None,
                            recorded_grants=self.recorded_grants)
        except AbiError as e:  # the item holds more values than the job's max_command_values, as in its map
            self.details[index] = ItemReplay(index)
            return failed_outcome(index, codes.LIMIT_EXCEEDED, str(e))
        except (ReplayError, MapError, ValueError, OSError) as e:
            why = " ".join(f"cannot replay its recording: {e}".split())[:300]
            self.details[index] = ItemReplay(index, needs_model=True, divergence=why)
            return failed_outcome(index, codes.REPLAY_DIVERGENCE, f"{why}; it needs the model")
        except Exception as e:  # noqa: BLE001 - a host error fails this item only
            error = internal_error(f"replay of item {index}", e)
            self.details[index] = ItemReplay(index)
            return failed_outcome(index, error.code, error.message)
        ready = time.perf_counter()
        envelope = await_job(job.start(), cancelled)
        report = job.report
        divergence = report.divergence if report is not None else None
        denied = job.world.denied if envelope.error is not None and envelope.error.code == codes.CAPABILITY_DENIED \
            else None
        self.details[index] = ItemReplay(
            index, job.id, needs_model=bool(report and report.stopped),
            diverged_at=divergence.step if divergence else None,
            divergence=for_terminal(divergence.message(), one_line=True)[:500] if divergence else None,
            live_from=report.live_from if report else None, needs_grant=denied)
        return job_outcome(index, job, envelope, started=started, ready=ready)  # with its sources, located again

    def _rerun(self, index: int, job: Job, started: float, cancelled: Callable[[], bool]) -> dict:
        """``rerun``: item ``index``'s job run afresh on the model (its answer live from the first step)."""
        ready = time.perf_counter()
        envelope = await_job(job.start(), cancelled)
        self.details[index] = ItemReplay(index, job.id, live_from=0)
        return job_outcome(index, job, envelope, started=started, ready=ready)


def _listed(items: list[int], show: int = 20) -> str:
    return ", ".join(map(str, items[:show])) + (f" ... ({len(items)} in all)" if len(items) > show else "")


class MapReplay(MapComparison):
    """A recorded map and its replay by a changed guest, item by item (see the module doc)."""

    columns_a = "old"
    columns_b = "new"

    def __init__(self, recorded: RecordedMap, replayed: RecordedMap, details: dict[int, ItemReplay], *,
                 live: bool, scorer: str | None = None, concurrency: int = 1, deterministic: bool = False):
        super().__init__(recorded, replayed)
        self.details = details
        self.live = live
        self.scorer = scorer
        self.concurrency = concurrency
        self.deterministic = deterministic
        new = self.sides[1]
        for item, detail in details.items():
            if detail.needs_model or detail.needs_grant:  # its new result is unknown, not wrong
                new[item] = dataclasses.replace(new[item], status=NEEDS_MODEL if detail.needs_model else NEEDS_GRANT,
                                                result=None, error_code=None, score=None)

    def changed(self, item: int) -> bool:
        return self.sides[1][item].status not in (NEEDS_MODEL, NEEDS_GRANT) and super().changed(item)

    @property
    def recorded(self) -> RecordedMap:
        return self.a

    @property
    def replayed(self) -> MapResult:
        return self.b.result

    @property
    def needs_model(self) -> list[int]:
        """The items the recording could not answer (their prompts changed): run them live, or map them."""
        return sorted(i for i, d in self.details.items() if d.needs_model)

    @property
    def needs_grants(self) -> list[int]:
        """The items that read (or fetched) what this replay was not granted: replay with the grants they name."""
        return sorted(i for i, d in self.details.items() if d.needs_grant)

    @property
    def ran_live(self) -> list[int]:
        return sorted(i for i, d in self.details.items() if d.live_from is not None)

    def row(self, item: int) -> dict[str, Any]:
        row = super().row(item)
        d = self.details.get(item)
        row.update(needs_model=bool(d and d.needs_model), diverged_at=d.diverged_at if d else None,
                   divergence=d.divergence if d else None, live=bool(d and d.live_from is not None),
                   needs_grant=d.needs_grant if d else None)
        return row

    def summary(self) -> dict[str, Any]:
        out = super().summary()
        needs = len(self.needs_model)
        grants = len(self.needs_grants)
        out.update(needs_model=needs, needs_grant=grants, ran_live=len(self.ran_live),
                   same=out["same"] - needs - grants,
                   diverged=sum(d.diverged_at is not None for d in self.details.values()))
        return out

    def answered_otherwise(self, limit: int = 0) -> list[int]:
        """None here: an item whose prompts are the recorded ones is answered from its recording, word for word."""
        return []

    def passed(self, fail_under: "float | str") -> bool:
        """The regression gate: no item needs the model, and the new mean score (over the items both maps
        scored) is at least ``fail_under`` -- a number, or ``"recorded"`` for the recorded map's own mean."""
        return self.gate(fail_under)[0]

    def gate(self, fail_under: "float | str") -> tuple[bool, str]:
        """``passed`` with the one line that says why."""
        s = self.summary()
        old, new = s["mean_score_old"], s["mean_score_new"]
        if fail_under == "recorded":
            threshold, named = old, "the recorded map's"
        else:
            threshold, named = float(fail_under), f"{float(fail_under):g}"
        if self.needs_model:
            return False, (f"gate: not passed -- {len(self.needs_model)} item(s) need the model, so their new "
                           f"scores are unknown (replay with --live, or map the changed guest)")
        if self.needs_grants:
            return False, (f"gate: not passed -- {len(self.needs_grants)} item(s) need a grant this replay was not "
                           f"given, so their new scores are unknown (give it: {self._grants_named()})")
        if new is None or threshold is None:
            return False, "gate: not passed -- no item has both a recorded and a new score (no expected answers?)"
        if new < threshold:
            return False, f"gate: not passed -- the new mean score {new:.3f} is under {named} ({threshold:.3f})"
        return True, f"gate: passed -- the new mean score {new:.3f} is at least {named} ({threshold:.3f})"

    @property
    def all_failed(self) -> bool:
        """Whether every item the replay concluded failed (and it concluded some): a replay that says nothing."""
        return self.replayed.failed > 0 and self.replayed.completed == 0

    def counts_line(self, s: dict) -> str:
        line = f"{s['items']} items: {s['changed']} changed, {s['same']} the same"
        if s["needs_model"]:
            line += f", {s['needs_model']} need the model (their new results are not known yet)"
        if s["needs_grant"]:
            line += f", {s['needs_grant']} need a grant (their new results are not known yet)"
        return line + f" (completed: {s['completed_old']} recorded, {s['completed_new']} replayed)"

    def summary_lines(self) -> list[str]:
        s = self.summary()
        answered = s["items"] - s["needs_model"] - s["needs_grant"] - s["ran_live"] - self._not_run()
        if self.live:
            head = (f"replay of {s['items']} items, live from each divergence: {answered} answered from their "
                    f"recordings, {s['ran_live']} ran on the model")
        else:
            head = (f"replay of {s['items']} items with no model: {answered} answered from their recordings, "
                    f"{s['needs_model']} need the model")
        out = [head + (f", {s['needs_model']} still need it" if self.live and s["needs_model"] else "")]
        if self.all_failed:
            out.append(f"every item of the replay failed ({self.replayed.failed} of {self.total}; "
                       f"{self.replayed.failures_path}): nothing was replayed to compare")
        out += super().summary_lines()
        if self.needs_model:
            reasons = sorted({self._reason(i) for i in self.needs_model})
            out.append(f"need the model ({'; '.join(reasons)}): items {_listed(self.needs_model)} -- replay with "
                       f"--live (live=True) to run only those on the model"
                       if not self.live else
                       f"still need the model ({'; '.join(reasons)}): items {_listed(self.needs_model)}")
        if self.needs_grants:
            out.append(f"need a grant this replay was not given (a replay takes none from its recordings): items "
                       f"{_listed(self.needs_grants)} -- give {self._grants_named()}")
        if self.ran_live and self.concurrency > 1 and not self.deterministic:
            out.append(f"the {len(self.ran_live)} items that ran on the model were decoded up to {self.concurrency} at "
                       f"once: greedy answers depend on batch composition and the thread count, so a map of this "
                       f"guest can answer some of them otherwise (docs/maps.md); --deterministic decodes them one "
                       f"at a time")
        if self.scorer is None and self.a.result.scores() is not None:
            out.append("the replay is not scored: the recorded map's scorer was a Python function; give it again "
                       "(scorer=)")
        return out

    def _grants_named(self, show: int = 5) -> str:
        """The grants the items were denied, each once (the first ``show``)."""
        named = list(dict.fromkeys(d.needs_grant for _, d in sorted(self.details.items()) if d.needs_grant))
        return ", ".join(named[:show]) + (f" ... ({len(named)} in all)" if len(named) > show else "")

    def _not_run(self) -> int:
        return sum(1 for i in range(self.total) if self.sides[1][i].status == "not run")

    def _reason(self, item: int) -> str:
        """Why an item needs the model, in a few words (its divergence's reason)."""
        d = self.details.get(item)
        text = (d.divergence or "") if d is not None else ""
        if "another prompt" in text:
            return "their prompts changed"
        if d is not None and d.diverged_at is None:
            return "no recording to answer from"
        return "they asked what their recordings do not hold"

    table_header = ("item", "status", "score", "changed", "diverged")
    nothing_listed = "no item changed, and every prompt was the recorded one"
    every_row_hint = ("the command line lists them all (tensorjob replay --map); to_pandas() or --json has every "
                      "row and column")

    def listed(self, row: dict) -> bool:
        return row["changed"] or row["needs_model"] or row["needs_grant"] or row["diverged_at"] is not None

    def table_rows(self, row: dict) -> list[list[str]]:
        where = "" if row["diverged_at"] is None else f"step {row['diverged_at']}"
        how = (" (needs the model)" if row["needs_model"] else f" (needs {row['needs_grant']})" if row["needs_grant"]
               else " (live)" if row["live"] else "")
        lines = super().table_rows(row)
        return [lines[0] + [(where + how).strip()]] + [line + [""] for line in lines[1:]]

    def to_json(self) -> dict:
        out = super().to_json()
        out.update(needs_model=self.needs_model, needs_grant=self.needs_grants, live=self.live)
        return out


class MapReplayRun:
    """A map replay in progress: ``run`` is its ``MapRun`` (for a live view), ``wait()`` gives the ``MapReplay``."""

    def __init__(self, recorded: RecordedMap, run: MapRun, executor: ReplayExecutor, scoring: Scoring | None,
                 said: list[str] | None = None):
        self.recorded = recorded
        self.run = run
        self.executor = executor
        self.scoring = scoring
        #: what a front end says before the replay's progress, one inert line each: the grants its items run under
        self.said: list[str] = list(said or [])

    def cancel(self) -> None:
        self.run.cancel()

    def wait(self, timeout: float | None = None) -> MapReplay:
        result = self.run.wait(timeout)
        return MapReplay(self.recorded, RecordedMap(result.run_dir), dict(self.executor.details),
                         live=self.executor.live, scorer=self.scoring.scorer.name if self.scoring else None,
                         concurrency=self.executor.concurrency,
                         deterministic=self.executor.deterministic_threads is not None)


@dataclass(frozen=True)
class MapReplaySpec:
    """A replay over a recorded map, checked (``MapReplaySpec.of``): the recorded map's folder, where the replay
    goes (None: ``RUN_DIR/replay``), whether it may ask the model (``live``; ``rerun``: every item from its
    start), under whose grants, how many items at once (None: the CPUs this process may use), how it is scored,
    and whether each live infer is decoded alone (``deterministic``: one item at a time)."""

    run_dir: str
    out: str | None = None
    live: bool = False
    recorded_grants: bool = False
    concurrency: int | None = None
    expected: Any = None
    scorer: Any = None
    deterministic: bool = False
    rerun: bool = False
    fsync: bool = True

    @classmethod
    def of(cls, run_dir: "str | os.PathLike | MapResult", *, out: str | os.PathLike | None = None,
           live: bool = False, recorded_grants: bool = False, concurrency: int | str | None = None,
           expected: Any = None, scorer: Any = None, deterministic: bool = False, rerun: bool = False,
           fsync: bool = True) -> "MapReplaySpec":
        """The spec the keywords describe (each is ``start_map_replay``'s); ``ValueError`` names what cannot go
        together, before anything runs."""
        if rerun and not live:
            raise ValueError("rerun goes with live: it runs every item on the model (--live --rerun)")
        concurrency = None if concurrency == "auto" else concurrency
        if concurrency is not None and (isinstance(concurrency, bool) or not isinstance(concurrency, int)
                                        or concurrency < 1):
            raise ValueError(f"concurrency must be at least 1, got {concurrency!r}")
        if deterministic:
            if not live:
                raise ValueError("deterministic goes with live: a replay with no model decodes nothing")
            if concurrency not in (None, 1):
                raise ValueError(f"a deterministic replay runs one item at a time; concurrency={concurrency!r} "
                                 f"cannot go with it")
            concurrency = 1
        folder = run_dir.run_dir if isinstance(run_dir, MapResult) else run_dir
        return cls(run_dir=os.fspath(folder), out=os.fspath(out) if out is not None else None, live=bool(live),
                   recorded_grants=bool(recorded_grants), concurrency=concurrency, expected=expected, scorer=scorer,
                   deterministic=bool(deterministic), rerun=bool(rerun), fsync=bool(fsync))


def start_map_replay(run_dir: "MapReplaySpec | str | os.PathLike | MapResult", guest: Any, *,
                     model: str | os.PathLike | None = None, backend: Any = None,
                     overrides: Overrides | None = None, **keywords: Any) -> MapReplayRun:
    """Start replaying ``guest`` over a recorded map (see the module doc): ``run_dir`` a ``MapReplaySpec``, or
    the recorded map's folder with ``MapReplaySpec.of``'s keywords (``out``, ``live``, ``recorded_grants``,
    ``concurrency``, ``expected``, ``scorer``, ``deterministic``, ``rerun``, ``fsync``). ``overrides``: what
    is given anew for every item (``Overrides``: ``read``, limits, sampling, the model's options...) over its
    recorded setup; ``model`` is a shorthand for ``Overrides(model=...)``. Each item reads and fetches only what
    ``overrides`` grants (none when not given), never what its recording says was granted -- unless
    ``recorded_grants`` asks for that; ``MapReplayRun.said`` is the line that says which, before it runs.
    A live replay runs on ``backend``, else on the model named (or the one the map recorded, checked on its
    first item: never a recorded server). ``deterministic`` (with ``live``): one item at a time, each live infer
    decoded alone with a fixed thread count and no prompt cache (``fanout.start.deterministic_job``).
    ``rerun`` (with ``live``): every item's job run again on the model from its start, those whose prompts did
    not change too (a replay otherwise answers them from their recordings, whatever the model).
    ``MapError``/``ReplayError``/``ValueError`` before anything runs."""
    if isinstance(run_dir, MapReplaySpec):
        if keywords:
            raise TypeError(f"start_map_replay() takes a MapReplaySpec, or a run folder and keywords, not both "
                            f"({', '.join(keywords)})")
        spec = run_dir
    else:
        spec = MapReplaySpec.of(run_dir, **keywords)
    overrides = given_here(overrides or Overrides())
    if model is not None:
        if overrides.model is not None:
            raise ValueError("name the model once: model= or overrides.model")
        try:
            overrides = overrides.replace(model=Overrides.of(model=model).model)  # the keyword form's, read once
        except ModelError as e:
            raise ReplayError(f"--model: {e}") from None
    live, concurrency = spec.live, spec.concurrency
    recorded = RecordedMap(spec.run_dir)
    target = Path(spec.out).absolute() if spec.out is not None else recorded.path / REPLAY_DIR
    _check_target(target, recorded.path)
    live_ref = None
    if live and backend is None:
        live_ref = _live_model(recorded, overrides)
        backend = live_ref.backend()
    scoring = _scoring(recorded, spec.expected, spec.scorer)
    executor = ReplayExecutor(recorded, guest, live=live, backend=backend, jobs_dir=target / JOBS,
                              recorded_grants=spec.recorded_grants, overrides=overrides, model=live_ref,
                              concurrency=concurrency or len(available_cpus()) or 1,
                              deterministic_threads=deterministic_threads(live_ref) if spec.deterministic else None,
                              rerun=spec.rerun)
    manifest = _manifest(recorded)
    folder = MapFolder(target, fsync=spec.fsync)
    folder.open(manifest, executor.guest.sha256, retry_failed=False, restart=True, where=executor.where)
    try:
        if scoring is not None:
            scoring.begin(folder.path)
    except BaseException:
        folder.close()
        raise
    said = [grants_line(overrides.read, overrides.fetch, recorded_grants=spec.recorded_grants)]
    if overrides.read is None and not spec.recorded_grants:
        said += _recorded_reads_line(recorded)
    if spec.rerun:
        model_ref = live_ref or overrides.model
        named = for_terminal(clip(model_ref.label if model_ref is not None else type(backend).__name__, 200),
                             one_line=True)
        said.append(f"replay --rerun: all {len(executor.concluded)} items will run on {named} from their start, "
                    f"0 come from their recordings")
    elif live and overrides.model is not None:
        said.append(_models_line(recorded, executor, overrides.model))
    run = MapRun(folder, manifest, executor, scoring=scoring).start()
    return MapReplayRun(recorded, run, executor, scoring, said)


def replay_map(run_dir: "str | os.PathLike | MapResult", guest: Any, **kwargs: Any) -> MapReplay:
    """Replay ``guest`` over the recorded map in ``run_dir`` to the end; see ``start_map_replay``."""
    replay = start_map_replay(run_dir, guest, **kwargs)
    wait_or_cancel(replay.run.wait_done, replay.cancel)
    return replay.wait()


def _check_target(target: Path, recorded: Path) -> None:
    """A replay starts its folder over: never the recorded map's, never another map's."""
    if target.resolve() == recorded.resolve():
        raise MapError(f"{target} is the recorded map's own run folder; a replay goes into a folder of its own")
    if os.path.lexists(target / LEDGER):
        try:
            sessions = read_ledger_json(target).get("sessions") or []
            last = sessions[-1] if sessions else {"where": WHERE}
            where = last.get("where") if isinstance(last, dict) else None
        except MapError:  # not a ledger at all (or not one that can be read): not a replay's
            where = None
        if not (isinstance(where, str) and where.startswith(WHERE)):
            raise MapError(f"{target} is a map's run folder, not a replay's; a replay starts its folder over, "
                           f"so name another (--run-dir)")


def _models_line(recorded: RecordedMap, executor: ReplayExecutor, model: ModelRef) -> str:
    """What a live replay on another model does, said before it runs: an item runs on the model only from where
    its prompts change, so an unchanged guest runs no item on it -- every item comes from its recording."""
    try:
        pinned = read_ledger_json(recorded.path)
    except MapError:
        pinned = {}
    was = str(pinned["model"]) if isinstance(pinned.get("model"), str) else "the recorded model"
    items = len(executor.concluded)
    named = for_terminal(clip(model.label, 200), one_line=True)
    if (pinned.get("guest") or {}).get("sha256") == executor.guest.sha256:
        return (f"replay: the guest is unchanged, so 0 items will run on {named} and all {items} come from their "
                f"recordings ({for_terminal(clip(was, 200), one_line=True)}'s answers): a replay asks the model only "
                f"where an item's prompts change -- to answer the items on {named}, map them into a new run folder "
                f"(tensorjob map ... --model {named}), cascade to it (--cascade), or re-run them here (--rerun)")
    return (f"replay: of {items} items, those whose prompts changed run on {named} from where they change (at most "
            f"{items}); the rest come from their recordings ({for_terminal(clip(was, 200), one_line=True)}'s "
            f"answers)")


def _recorded_reads_line(recorded: RecordedMap) -> list[str]:
    """What the recorded map's items read under (its first readable transcript's ``--read``), named -- never
    taken -- so a replay given no grant says at once what it would need."""
    for item in recorded.item_runs().values():
        try:
            read = load_run(item.path).read
        except (ReplayError, OSError, ValueError):
            return []
        if not read:
            return []
        named = " ".join(shlex.quote(str(r)) for r in read[:4]) + (" ..." if len(read) > 4 else "")
        return [for_terminal(clip(f"replay: the recorded map read under --read {named}; give it again (--read) "
                                  f"for its items to read here", 400), one_line=True)]
    return []


def _live_model(recorded: RecordedMap, overrides: Overrides) -> ModelRef:
    """The model a live replay runs every item on: the one ``overrides`` names, else the one the map recorded
    (read from its first item with a readable transcript; a map runs one model)."""
    for item in recorded.item_runs().values():
        return live_model(load_run(item.path), overrides)
    return overrides.model_ref(ModelRef())


def _scoring(recorded: RecordedMap, expected: Any, scorer: Any) -> Scoring | None:
    """The replay's scoring: ``expected`` and ``scorer`` if given, else the recorded map's own -- its expected
    answers, or where it had none its reviewed values (``MapResult.expected``), scored by ``json_fields``."""
    total = recorded.total
    found = (Expected.read(expected, total, recorded.result.item_keys) if expected is not None
             else recorded.result.expected())
    if found is None:
        if scorer is not None:
            raise ReplayError("the recorded map has no expected answers to score against: give them (expected=, "
                              "--expected FILE.jsonl)")
        return None
    if scorer is None:
        name = scorer_name(recorded.path) or ("json_fields" if found.source == REVIEWS else None)
        if name not in BUILTINS:
            return None  # a Python function: given again, or not scored (MapReplay says so)
        scorer = name
    return Scoring(scorer_of(scorer), found)


def _manifest(recorded: RecordedMap) -> Manifest:
    """The recorded map's manifest: the file itself when it is still the one its ledger pins (its items as they
    were checked, never dumped and read again), else its items' recorded inputs -- under the SHA-256 the ledger
    pins either way, so the replay's folder says it is a map of the same items."""
    ledger = recorded.ledger
    items = recorded.inputs()
    if isinstance(items, ManifestItems):
        return Manifest(items, ledger["manifest_sha256"], ledger["manifest_source"])
    manifest = read_manifest(list(items))
    return dataclasses.replace(manifest, sha256=ledger["manifest_sha256"] or manifest.sha256,
                               source=ledger["manifest_source"] or manifest.source)


__all__ = [
    "REPLAY_DIR", "WHERE", "NEEDS_MODEL", "NEEDS_GRANT", "ItemReplay", "ReplayExecutor", "MapReplay",
    "MapReplayRun", "MapReplaySpec", "start_map_replay", "replay_map"
]

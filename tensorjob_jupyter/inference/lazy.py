"""A backend that loads its model only when a job first needs it.

The command line and the notebook hand every job a backend, but most guests
that only read files never infer; they should not pay for loading a model,
and a model that cannot load should only fail the jobs that use it.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Callable, Sequence

from .base import Backend, GenerateRequest, GenerateResult, TokenCallback


class LazyBackend:
    def __init__(self, factory: Callable[[], Backend], model_name: str):
        self._factory = factory
        self._model_name = model_name
        self._backend: Backend | None = None
        self._lock = threading.Lock()

    @property
    def model_name(self) -> str:
        return self._model_name

    @property
    def loaded(self) -> bool:
        return self._backend is not None

    def _get(self) -> Backend:
        with self._lock:
            if self._backend is None:
                self._backend = self._factory()
            return self._backend

    def generate_stream(self, request: GenerateRequest, on_token: TokenCallback) -> "Future[GenerateResult]":
        return self._get().generate_stream(request, on_token)

    def embed(self, texts: Sequence[str]) -> "Future[list[list[float]]]":
        return self._get().embed(texts)

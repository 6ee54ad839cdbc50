"""One thread per model, fed by a bounded queue of requests.

A model object (``llama_cpp.Llama`` above all) is not thread-safe, so exactly one thread ever
touches it. Requests start in arrival order; generate requests join a running batch's decode steps
when the engine can batch, a long embed runs in pieces so it holds the others back by one piece,
and a full queue refuses at once (``QueueFull``). The engine is built on this thread on first use,
so a failed load, a raising callback or a cancelled request fails its own requests, never the
worker.

Design: docs/internals/inference.md#workerpy
"""

from __future__ import annotations

import collections
import queue
import threading
from concurrent.futures import Future
from typing import Any, Callable, Sequence, cast

from tensorjob_jupyter.inference.base import (
    DoneCallback, ModelEngine, GenerateRequest, GenerateResult, ModelError, Pending, QueueFull, TokenCallback,
)

_STOP = object()


class Request(Future):
    """A request's future. Cancelling it before it runs takes it off the queue, as any future; cancelling
    it once it runs cannot (``cancel()`` says False) but marks it ``abandoned``, and the engine ends it at
    once: a job that ends stops using the model then, not at its next token."""

    def __init__(self) -> None:
        super().__init__()
        self.abandoned = threading.Event()

    def cancel(self) -> bool:
        if super().cancel():
            return True
        if not self.done():
            self.abandoned.set()
        return False


class InferenceWorker:
    """A ``Backend`` that serves one engine from one thread."""

    def __init__(self, engine: ModelEngine | Callable[[], ModelEngine], *, model_name: str | None = None,
                 queue_size: int = 64, batching: bool = True, name: str = "tensorjob-inference"):
        self._factory: Callable[[], ModelEngine]
        if callable(engine) and not hasattr(engine, "generate"):
            self._factory = engine
        else:
            given = cast(ModelEngine, engine)  # not a factory: the engine itself
            self._factory = lambda: given
        self._engine: ModelEngine | None = None
        self._load_error: BaseException | None = None
        self._model_name = model_name or getattr(engine, "model_name", None)
        self._queue: queue.Queue = queue.Queue(maxsize=queue_size)
        self._deferred: collections.deque = collections.deque()  # taken off the queue, not yet admitted
        self.batching = batching
        self._closed = False
        self.requests_served = 0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def model_name(self) -> str:
        return self._model_name or "unknown"

    @property
    def engine(self) -> ModelEngine | None:
        return self._engine

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    # -- submitting ---------------------------------------------------------------

    def _submit(self, kind: str, payload: Any, on_token: TokenCallback | None = None) -> Future:
        if self._closed:
            raise ModelError("the inference worker is closed")
        fut: Future = Request()
        try:
            self._queue.put_nowait((kind, payload, on_token, fut))
        except queue.Full:
            raise QueueFull(f"the inference queue for {self.model_name} is full "
                            f"({self._queue.maxsize} requests waiting); try again later") from None
        return fut

    def generate_stream(self, request: GenerateRequest, on_token: TokenCallback) -> "Future[GenerateResult]":
        return self._submit("generate", request, on_token)

    def embed(self, texts: Sequence[str]) -> "Future[list[list[float]]]":
        return self._submit("embed", list(texts))

    def prompt_tokens(self, request: GenerateRequest) -> "Future[list[int]]":
        """The tokens ``request``'s prompt is for this model (its chat template applied), from the engine's
        tokenizer on the worker's thread: nothing is decoded (what a map's ``--estimate`` counts)."""
        return self._submit("tokens", request)

    def close(self, timeout: float | None = 5.0) -> None:
        """Stop the worker: waiting requests fail, the running one finishes."""
        if self._closed:
            return
        self._closed = True
        while True:  # never block behind a full queue
            try:
                _kind, _payload, _on_token, fut = self._queue.get_nowait()
            except queue.Empty:
                break
            if fut.set_running_or_notify_cancel():
                fut.set_exception(ModelError("the inference worker was closed"))
        try:
            self._queue.put_nowait(_STOP)
        except queue.Full:  # a submit raced the close; the daemon thread just idles
            return
        self._thread.join(timeout)

    # -- the worker thread -----------------------------------------------------------

    def _load(self) -> ModelEngine:
        if self._engine is None:
            if self._load_error is not None:
                raise ModelError(str(self._load_error))
            try:
                self._engine = self._factory()
            except BaseException as e:  # noqa: BLE001 - any load failure is reported
                self._load_error = e
                raise ModelError(str(e)) from e
            self._model_name = self._model_name or getattr(self._engine, "model_name", None)
        return self._engine

    def _take(self):
        return self._deferred.popleft() if self._deferred else self._queue.get()

    def _admit(self, wait: float = 0.0) -> Pending | None:
        """The next queued generate request, for a running batch, waiting up to ``wait`` seconds for one
        to arrive; None stops admission."""
        while not self._deferred:
            try:
                item = self._queue.get(timeout=wait) if wait > 0 else self._queue.get_nowait()
            except queue.Empty:
                return None
            if item is _STOP or item[0] != "generate":
                self._deferred.append(item)  # served after the batch drains, in order
                return None
            _kind, request, on_token, fut = item
            if fut.set_running_or_notify_cancel():
                return self._pending(request, on_token, self._resolver(fut), fut)
        return None

    @staticmethod
    def _pending(request: GenerateRequest, on_token: TokenCallback, done: DoneCallback, fut: Request) -> Pending:
        pending = Pending(request, _guarded(on_token), done, abandoned=fut.abandoned.is_set)
        ready = getattr(on_token, "ready", None)  # the listener's lookahead credit (``TokenCallback``)
        if ready is not None:
            pending.ready = _guarded_ready(ready)
        return pending

    def _resolver(self, fut: Future) -> DoneCallback:
        def done(result: Any, error: BaseException | None) -> None:
            if fut.done():
                return  # answered already (an engine must not answer twice; be safe if it does)
            self.requests_served += 1
            if error is not None:
                fut.set_exception(error if isinstance(error, (ModelError, QueueFull))
                                  else ModelError(f"{type(error).__name__}: {error}"))
            else:
                fut.set_result(result)
        return done

    def _run(self) -> None:
        while True:
            item = self._take()
            if item is _STOP:
                return
            self._serve_one(item, self._admit)

    def _serve_one(self, item: tuple, admit: Callable[..., Pending | None]) -> None:
        """Run one request (a generation with whatever ``admit`` lets join it) and answer its future."""
        kind, payload, on_token, fut = item
        if not fut.set_running_or_notify_cancel():
            return  # cancelled while it waited in the queue
        done = self._resolver(fut)
        result: Any  # the future's: a GenerateResult, the prompt's tokens or the vectors
        try:
            engine = self._load()
            if kind == "generate" and self.batching and hasattr(engine, "serve"):
                engine.serve(self._pending(payload, on_token, done, fut), admit)
                return
            if kind == "generate":
                result = engine.generate(payload, _guarded(on_token))
            elif kind == "tokens":
                result = engine.prompt_tokens(payload)
            elif hasattr(engine, "embedding"):
                result = self._embed_in_pieces(engine, payload, fut)
            else:
                result = engine.embed(payload)
        except BaseException as e:  # noqa: BLE001 - reported through the future
            if not fut.done():
                done(None, e)
        else:
            done(result, None)

    def _embed_in_pieces(self, engine: ModelEngine, texts: list[str], fut: Request) -> list[list[float]]:
        """An embed a piece at a time, serving the generation requests waiting after each piece; an
        abandoned one stops before its next piece."""
        embedding = engine.embedding(texts)  # type: ignore[attr-defined]
        while True:
            if fut.abandoned.is_set():
                raise ModelError("the embed was abandoned (its caller left) and stopped")
            if embedding.step():
                return embedding.vectors
            self._serve_waiting()

    def _serve_waiting(self) -> None:
        """Between an embed's pieces: run the generation requests waiting now -- not the ones that come
        while they run, so the embed goes on after them -- as one batch. A request of another kind
        waits, in its place, for the embed to finish."""
        left = self._queue.qsize()

        def admit(wait: float = 0.0) -> Pending | None:
            nonlocal left
            if left <= 0:
                return None
            left -= 1
            return self._admit()

        while left > 0 and not self._deferred:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            left -= 1
            if item is _STOP or item[0] != "generate":
                self._deferred.append(item)  # after the embed, in order
                return
            self._serve_one(item, admit)


def _guarded(on_token: TokenCallback) -> TokenCallback:
    def call(token: str) -> bool:
        try:
            return bool(on_token(token))
        except BaseException:  # noqa: BLE001 - a dead listener means stop
            return False
    return call


def _guarded_ready(ready: Callable[[float], bool]) -> Callable[[float], bool]:
    def call(timeout: float) -> bool:
        try:
            return bool(ready(timeout))
        except BaseException:  # noqa: BLE001 - a dead listener takes its token (and says stop)
            return True
    return call


__all__ = ["Request", "InferenceWorker"]

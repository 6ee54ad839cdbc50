"""The one token loop of an ``infer``: live from the model, or from a recording.

Tokens arrive from a source (``ModelTokens`` live, ``RecordedTokens`` in a replay) and each reaches the
subscribers and then the guest's ``cf_on_token``; a stop verdict goes back at once, and cancel and the deadline
are checked between tokens. The model runs at most one token ahead of the guest, but a guest slow to answer
never holds the shared model. Model failures close the response once, with the code the job ends with.

Design: docs/internals/host.md#tokenspy
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import CancelledError, Future
from dataclasses import dataclass, field
from enum import Enum
from typing import Callable, Final, Protocol, Sequence

from tensorjob_jupyter.abi import JobFailure, codes
from tensorjob_jupyter.inference.base import (
    FINISH_CANCELLED, Backend, ConstraintError, GenerateRequest, GenerateResult, ModelError,
)
from tensorjob_jupyter.record.responses import ResponseStream
from tensorjob_jupyter.sandbox.guest import GuestTrap

#: How often the loop looks at cancel and the deadline while no token comes.
POLL_S = 0.02
#: How long the decoder waits for the guest's verdict before it runs free.
LOOKAHEAD_WAIT_S = 0.05
#: How long an infer ended early waits for the decoder's own token count.
PARTIAL_USAGE_WAIT_S = 0.5


class _End(Enum):
    """What a token source gives once its pieces are over (one value, so ``is _END`` tells it from a piece)."""

    END = "end"


_END: Final = _End.END
#: The ``error`` event's type for a model failure, by its code (Open Responses' words).
_ERROR_TYPES = {codes.BUSY: "too_many_requests", codes.TIMEOUT: "server_error",
                codes.SCHEMA_VALIDATION_FAILED: "invalid_request"}


class TokenSource(Protocol):
    """Where an answer's pieces come from."""

    def get(self, timeout: float) -> str | _End | None:
        """The next piece, ``_END`` when there are no more, None when none came within ``timeout``."""

    def judged(self, piece_index: int) -> None:
        """The guest has judged piece ``piece_index`` (0-based): the producer may run on."""

    def stop(self, after: int) -> None:
        """No more pieces are wanted after the first ``after`` (a stop verdict, or the job ends)."""

    def partial_usage(self, delivered: int) -> tuple[int, int]:
        """(prompt tokens, completion tokens) of an answer ended early, ``delivered`` pieces in."""

    def end(self) -> None:
        """The loop is over, whatever happened: nothing more is produced."""


class ModelTokens:
    """Pieces from the model: ``generate_stream`` on the worker thread, one piece of lookahead.

    ``judged``: whether the guest judges each piece (``cf_on_token``, a streamed Python infer); where it does
    not, nothing it does can stop the answer, so the model runs free from the first piece instead of waiting for
    the guest's thread between pieces (cancel and the deadline still stop it). Raises ``JobFailure`` at once if
    the model does not accept the request. ``result()`` is the model's answer once the source is exhausted.
    """

    def __init__(self, backend: Backend, request: GenerateRequest, cancel: threading.Event,
                 response: ResponseStream, *, judged: bool = True):
        self._pieces: queue.SimpleQueue = queue.SimpleQueue()
        self._stop = threading.Event()
        self._cancel = cancel
        self._credit = threading.Lock()
        self._free_running = not judged
        self._reserved = False  # ready() took the credit for the next piece
        self._late_since: float | None = None  # when ready() first found the guest late for the next piece
        self._took: list[bool] = []
        try:
            self.future: Future = backend.generate_stream(request, self)
        except ModelError as e:  # a full queue (busy), a model that cannot load
            response.fail(e.message, code=e.code, error_type=_ERROR_TYPES.get(e.code, "model_error"))
            raise
        # An end marker follows the last piece, so the loop ends at once instead of on its next poll.
        self.future.add_done_callback(lambda _fut: self._pieces.put(_END))

    def __call__(self, piece: str) -> bool:  # the token callback, on the model's worker thread
        if self._reserved:
            took, self._reserved = True, False
        elif self._stop.is_set() or self._cancel.is_set():  # the answer is over: never wait for the guest
            took = self._credit.acquire(blocking=False)
        else:
            took = not self._free_running and self._credit.acquire(timeout=LOOKAHEAD_WAIT_S)
            self._free_running = not took
        self._late_since = None
        self._pieces.put((piece, took))
        return not self._stop.is_set() and not self._cancel.is_set()

    def ready(self, timeout: float) -> bool:  # the model's worker thread
        """Whether the next piece would be taken without waiting for the guest, waiting up to ``timeout``;
        if so the credit is kept for it. Past ``LOOKAHEAD_WAIT_S`` of lateness the generation runs free."""
        if self._reserved or self._free_running or self._stop.is_set() or self._cancel.is_set():
            return True
        now = time.monotonic()
        if self._late_since is None:
            self._late_since = now
        wait = min(timeout, self._late_since + LOOKAHEAD_WAIT_S - now)
        if self._credit.acquire(timeout=wait) if wait > 0 else self._credit.acquire(blocking=False):
            self._reserved = True
            return True
        if time.monotonic() - self._late_since >= LOOKAHEAD_WAIT_S:
            self._free_running = True
            return True
        return False

    def get(self, timeout: float) -> str | _End | None:
        try:
            item = self._pieces.get(timeout=timeout)
        except queue.Empty:
            return None
        if item is _END:
            return _END
        piece, took = item
        self._took.append(took)
        return piece

    def judged(self, piece_index: int) -> None:
        if self._took[piece_index]:
            self._credit.release()

    def stop(self, after: int) -> None:
        self._stop.set()

    def end(self) -> None:
        """The loop is over, whatever happened: the decoder stops if it has not."""
        if not self.future.done():
            self._stop.set()
            self.future.cancel()

    def partial_usage(self, delivered: int) -> tuple[int, int]:
        """The decoder stops within a token once told, so its own count usually arrives at
        once; if it does not, the pieces delivered so far stand in."""
        try:
            u = self.future.result(timeout=PARTIAL_USAGE_WAIT_S).usage
            return u.prompt_tokens, u.completion_tokens
        except Exception:  # noqa: BLE001 - still prefilling, cancelled in the queue, or failed
            return 0, delivered

    def result(self, response: ResponseStream, count: Callable[[int, int], None]) -> GenerateResult:
        """The model's answer; its failure closes ``response``, counts what the request spent (``count``: the
        engine's figures where it gives them, else the pieces delivered) and raises the job's ``JobFailure``."""
        try:
            return self.future.result()
        except CancelledError:  # cancelled while it waited in the queue: no token was made
            response.finish("".join(response.text_parts), usage=response.usage_json(0, 0), reason=FINISH_CANCELLED)
            raise JobFailure(codes.CANCELLED, "cancelled during inference") from None
        except ConstraintError as e:  # a grammar refused before any token, or past its bounds mid-answer
            self._count_failed(e, count)
            response.fail(e.message, code=e.code, error_type=_ERROR_TYPES[e.code])
            raise JobFailure(e.code, f"infer: {e.message}") from None
        except JobFailure as e:  # ModelError (model_load_failed), QueueFull (busy), ModelTimeout (timeout)
            self._count_failed(e, count)
            response.fail(e.message, code=e.code, error_type=_ERROR_TYPES.get(e.code, "model_error"))
            raise
        except Exception as e:  # noqa: BLE001 - anything else the engine raised
            response.fail(str(e), code=codes.MODEL_LOAD_FAILED)
            raise JobFailure(codes.MODEL_LOAD_FAILED, str(e)) from None


    def _count_failed(self, e: JobFailure, count: Callable[[int, int], None]) -> None:
        usage = getattr(e, "usage", None)
        if usage is not None:
            count(usage.prompt_tokens, max(usage.completion_tokens, len(self._took)))
        elif self._took:
            count(0, len(self._took))


class RecordedTokens:
    """The pieces of a recorded answer, on the job's own thread.

    A guest that stops where the recorded guest stopped gets the rest of
    the recording (the pieces the model had produced before the verdict
    reached it); one that stops elsewhere gets nothing more.
    """

    def __init__(self, pieces: Sequence[str], *, recorded_stop: int | None, tokens_in: int):
        self._pieces = pieces
        self._next = 0
        self._end = len(pieces)
        self._recorded_stop = recorded_stop
        self._tokens_in = tokens_in

    def get(self, timeout: float) -> str | _End | None:
        if self._next >= self._end:
            return _END
        piece = self._pieces[self._next]
        self._next += 1
        return piece

    def judged(self, piece_index: int) -> None:
        pass

    def stop(self, after: int) -> None:
        if after != self._recorded_stop:
            self._end = min(self._end, after)

    def partial_usage(self, delivered: int) -> tuple[int, int]:
        return self._tokens_in, delivered

    def end(self) -> None:
        self._end = self._next


class PrefixMismatch(Exception):
    """The model's answer does not begin with the pieces the guest already judged."""

    def __init__(self, index: int, expected: str, got: str | None):  # None: the answer ended there
        super().__init__(f"piece {index + 1}")
        self.index, self.expected, self.got = index, expected, got


@dataclass
class Delivery:
    """How an answer's pieces reached the guest."""

    delivered: int = 0  # pieces published (and, until a stop, judged)
    stopped_after: int | None = None  # pieces the guest had judged when it said stop
    pieces: list[str] = field(default_factory=list)  # the pieces published, in order


class TokenLoop:
    """Delivers one answer's pieces: to ``publish`` (the subscribers) first, then to the guest's ``judge``.

    ``check_running()`` raises the job's ``JobFailure`` on cancel or timeout;
    ``count(tokens_in, tokens_out)`` adds an answer ended early to the job's usage.
    """

    def __init__(self, response: ResponseStream, *, publish: Callable[[str], None], judge: Callable[[str], bool],
                 check_running: Callable[[], None], count: Callable[[int, int], None]):
        self.response = response
        self.publish = publish
        self.judge = judge
        self.check_running = check_running
        self.count = count

    def run(self, source: TokenSource, *, already: Sequence[str] = ()) -> Delivery:
        """Deliver ``source``'s pieces until it ends. ``already``: pieces the guest judged before
        (from a recording); the source must repeat them first (else ``PrefixMismatch``), unpublished."""
        out = Delivery()
        try:
            self._deliver(source, already, out)
        finally:
            source.end()
        return out

    def _deliver(self, source: TokenSource, already: Sequence[str], out: Delivery) -> None:
        seen = 0
        while True:
            try:
                self.check_running()
            except JobFailure as e:
                source.stop(out.delivered)
                raise self._end_early(source, out, e) from None
            piece = source.get(POLL_S)
            if piece is None:
                continue
            if piece is _END:
                if seen < len(already):  # the model ended before repeating what the guest judged
                    raise PrefixMismatch(seen, already[seen], None)
                return
            index = seen
            seen += 1
            if index < len(already):
                if piece != already[index]:
                    source.stop(0)
                    raise PrefixMismatch(index, already[index], piece)
                source.judged(index)
                continue
            try:
                self.publish(piece)
            except JobFailure as e:  # the transcript is full or broken: the answer ends, counted
                source.stop(out.delivered)
                raise self._end_early(source, out, e) from None
            out.pieces.append(piece)
            out.delivered += 1
            if out.stopped_after is None:
                try:
                    keep = self.judge(piece)
                except GuestTrap as e:
                    source.stop(out.delivered)
                    raise self._end_early(source, out, e) from None
                if not keep:
                    out.stopped_after = out.delivered
                    source.stop(out.delivered)
            source.judged(index)

    def _end_early(self, source: TokenSource, out: Delivery, e: JobFailure) -> JobFailure:
        """Count and close an answer ended by cancel, timeout or a trap in ``cf_on_token``; what the job ends with.

        A cancel closes the response ``cancelled`` (incomplete) and the job ends
        ``cancelled during inference``; anything else is ``error`` then
        ``response.failed``, and the job ends with it.
        """
        source.end()
        tokens_in, tokens_out = source.partial_usage(out.delivered)
        self.count(tokens_in, tokens_out)
        try:
            if e.code == codes.CANCELLED:
                self.response.finish("".join(self.response.text_parts),
                                     usage=self.response.usage_json(tokens_in, tokens_out), reason=FINISH_CANCELLED)
                return JobFailure(codes.CANCELLED, "cancelled during inference")
            self.response.fail(e.message, code=e.code, error_type=_ERROR_TYPES.get(e.code, "server_error"))
        except JobFailure:  # the transcript itself failed: the job's end says why, the response cannot
            pass
        return e


__all__ = [
    "POLL_S", "LOOKAHEAD_WAIT_S", "PARTIAL_USAGE_WAIT_S", "TokenSource", "ModelTokens", "RecordedTokens",
    "PrefixMismatch", "Delivery", "TokenLoop"
]

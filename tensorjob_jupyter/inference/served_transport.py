"""One request to a model server on the wire: its socket, its bounds in time and bytes, and its cancel.

A ``Call`` is a request in flight. ``Call.bounded`` sets what the answer being read may cost -- bytes, and
seconds in all, kept by a timer that shuts the socket down when they are spent, so a server that trickles a
byte now and then or goes silent ends on time, not at its next byte. The HTTP client's trace hook hands each
socket to the call as it connects, so that ``abort`` from any thread (``ServedFuture.cancel``) ends a read in
progress. ``GuardedBody`` is the response body as the SDK reads it, checked piece by piece: its bytes in all,
and each SSE event's bytes before the SDK's decoder holds them (``MAX_EVENT_BYTES``); a compressed body is
refused. Apart from the backend because it is the part that knows sockets and bytes, not requests.

Design: docs/internals/inference.md#why-it-is-shaped-so
"""

from __future__ import annotations

import contextlib
import functools
import math
import re
import socket
import threading
import time
from concurrent.futures import Future

from tensorjob_jupyter.inference.base import ModelError, ModelTimeout
from tensorjob_jupyter.inference.served_errors import Aborted, clip

#: Bytes of response body allowed per requested token (an SSE chunk of one token is a few hundred).
MAX_BODY_BYTES_PER_TOKEN = 16 * 1024
MAX_BODY_BYTES_FLOOR = 1 << 20
#: The most bytes of one SSE event of an answer, counted before it is parsed. A chunk of one token with
#: ``MAX_TOP_LOGPROBS`` alternatives, each of ``MAX_TOKEN_BYTES`` escaped as badly as JSON can, is about 60 KiB;
#: a usual one a few hundred bytes. Parsed, an event of this many bytes costs some tens of MiB at most.
MAX_EVENT_BYTES = 1 << 20
#: The names of this backend's threads begin so.
THREAD_PREFIX = "tensorjob-served"


class Call:
    """One request in flight: abort it from any thread, bound its bytes and its time.

    ``bounded(...)`` sets what the answer being read may cost -- bytes, and seconds in all, kept by
    a timer that shuts the socket down when they are spent, so a server that trickles a byte now and
    then or goes silent ends on time, not at its next byte or its next read timeout. The model
    listing nests its own, smaller bounds inside a request's."""

    def __init__(self, kind: str, max_bytes: int, max_tokens: int = 0):
        self.kind = kind
        self.deadline = math.inf
        self.max_bytes = max_bytes
        self.what = "answer"
        self.too_late = ""
        #: the tokens asked for: no answer has more (a usage that says otherwise is clipped to it)
        self.max_tokens = max_tokens
        self.bytes = 0
        self.aborted = False
        #: why the request ran out of time (set by the timer), for the error it ends with
        self.expired: str | None = None
        #: what reached the listener so far, and when: the answer of a request aborted mid-stream
        self.parts: list[str] = []
        self.pieces = 0
        self.started: float | None = None
        self.first_at: float | None = None
        self.last_at: float | None = None
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []

    def arrived(self) -> None:
        """One more piece of the answer arrived, now (for max_tokens and the usage's timings)."""
        self.pieces += 1
        self.last_at = time.perf_counter()
        self.first_at = self.first_at or self.last_at

    def abort(self) -> None:
        with self._lock:
            self.aborted = True
        self._shutdown_sockets()

    def _shutdown_sockets(self) -> None:
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:
            shutdown_socket(sock)

    def _expire(self, message: str) -> None:
        """The timer's: this answer's time is spent; end its read now."""
        self.expired = message
        self._shutdown_sockets()

    @contextlib.contextmanager
    def bounded(self, max_bytes: int, timeout_s: float, what: str, limit: str):
        """Bound the answer read inside: ``max_bytes`` of body, ``timeout_s`` seconds in all (never
        past an enclosing bound's deadline; ``limit`` names the setting); the enclosing bounds come
        back after it."""
        saved = self.max_bytes, self.bytes, self.deadline, self.what, self.too_late
        self.max_bytes, self.bytes, self.what = max_bytes, 0, what
        own = time.monotonic() + timeout_s
        if own < self.deadline:  # else the enclosing bound comes first, and says so
            self.deadline = own
            self.too_late = f"the model server's {what} took longer than {timeout_s:g} s ({limit})"
        message = self.too_late
        timer = threading.Timer(max(0.0, self.deadline - time.monotonic()), self._expire, (message,))
        timer.name, timer.daemon = f"{THREAD_PREFIX}-deadline", True
        timer.start()
        try:
            yield
            if self.expired == message:  # the timer fired as the answer ended: it ended in time
                self.expired = None
        finally:
            timer.cancel()
            self.max_bytes, self.bytes, self.deadline, self.what, self.too_late = saved

    def trace(self, name: str, info: dict) -> None:
        """The HTTP client's trace hook, on the request's thread: catch each socket as it connects."""
        if name == "connection.connect_tcp.started" and self.aborted:
            raise Aborted()
        if name == "connection.connect_tcp.complete":
            stream = info.get("return_value")
            sock = stream.get_extra_info("socket") if stream is not None else None
            if sock is None:
                return
            with self._lock:
                self._sockets.append(sock)
                aborted = self.aborted
            if aborted:
                shutdown_socket(sock)

    def check(self, n: int) -> None:
        """Before each piece of the body is used: aborted, too late, or too much?"""
        if self.aborted:
            raise Aborted()
        if self.expired or time.monotonic() > self.deadline:
            raise ModelTimeout(self.expired or self.too_late)
        self.bytes += n
        if self.bytes > self.max_bytes:
            if self.what == "answer":
                raise ModelError(f"the model server's stream is malformed: more than {self.max_bytes} bytes "
                                 "for the tokens asked")
            raise ModelError(f"the model server's {self.what} is more than {self.max_bytes} bytes")


def shutdown_socket(sock: socket.socket) -> None:
    """Shut ``sock`` down both ways, so that a read blocked on it returns now."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already closed or never connected


class ServedFuture(Future):
    """A future whose ``cancel()`` also ends a request that is already running."""

    def __init__(self, call: Call):
        super().__init__()
        self._call = call

    def cancel(self) -> bool:
        if super().cancel():
            return True  # still waiting: it never starts
        if not self.done():
            self._call.abort()
        return False


#: The blank lines of an event stream as the SDK's decoder splits it (CR, LF and CRLF end a line): a line end
#: right after one, except LF after CR, which is one CRLF.
_BLANK_LINES = (b"\n\n", b"\r\r", b"\n\r")
_BLANK_LINE = re.compile(b"\n\n|\r\r|\n\r")


class GuardedBody:
    """The response body as the SDK reads it, checked piece by piece against the request's bounds: its bytes
    in all, and, for an answer's event stream (``events``), the bytes of each SSE event (``MAX_EVENT_BYTES``)
    as they arrive, before the SDK's decoder holds them. ``encoding``: the body's ``Content-Encoding``; any
    but identity is refused at the first read (its bytes on the wire bound nothing decoded)."""

    def __init__(self, inner, call: Call, encoding: str = "identity", events: bool = False):
        self._inner = inner
        self._call = call
        self._encoding = encoding
        self._events = events
        self._event = 0  # bytes since the last blank line
        self._last = b""  # the byte before this chunk: a blank line can straddle two chunks

    def __iter__(self):
        if self._encoding not in ("", "identity"):
            raise ModelError(f"the model server's {self._call.what} is compressed "
                             f"(Content-Encoding: {clip(self._encoding, 40)}), though asked for identity")
        for chunk in self._inner:
            self._call.check(len(chunk))
            if self._events and chunk:
                self._count_event(chunk)
            yield chunk

    def _count_event(self, chunk: bytes) -> None:
        """Count ``chunk`` into the event it ends or continues; refuse an event past ``MAX_EVENT_BYTES``."""
        start = 0  # where this chunk's part of the event being counted begins
        if self._last + chunk[:1] in _BLANK_LINES:
            self._event, start = 0, 1
        self._last = chunk[-1:]
        if self._event + len(chunk) - start <= MAX_EVENT_BYTES:  # no event in it can pass: only its tail counts
            end = max(chunk.rfind(blank, start) for blank in _BLANK_LINES)
            self._event = len(chunk) - end - 2 if end >= 0 else self._event + len(chunk) - start
            return
        for blank in _BLANK_LINE.finditer(chunk, start):  # an event in it may pass: each, in turn
            self._passed(self._event + blank.start() - start)
            self._event, start = 0, blank.end()
        self._event += len(chunk) - start
        self._passed(self._event)

    @staticmethod
    def _passed(size: int) -> None:
        if size > MAX_EVENT_BYTES:
            raise ModelError(f"the model server's stream is malformed: an event of more than {MAX_EVENT_BYTES} "
                             "bytes")

    def close(self) -> None:
        self._inner.close()


def wrap_stream(inner, call: Call, encoding: str = "identity", events: bool = False):
    return guarded_body_class()(inner, call, encoding, events)


@functools.lru_cache(maxsize=1)
def guarded_body_class() -> type:
    """``GuardedBody`` as the HTTP client's sync byte stream (made on first use: httpx2 loads with openai)."""
    import httpx2

    return type("GuardedBody", (GuardedBody, httpx2.SyncByteStream), {})


__all__ = ["MAX_BODY_BYTES_PER_TOKEN", "MAX_BODY_BYTES_FLOOR", "MAX_EVENT_BYTES", "THREAD_PREFIX", "Call",
           "shutdown_socket", "ServedFuture", "GuardedBody", "wrap_stream", "guarded_body_class"]

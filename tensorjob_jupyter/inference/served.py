"""Models served elsewhere: any OpenAI-compatible server as a job's model.

``--model http://HOST:PORT/v1`` points a job at a server (vLLM, llama.cpp's server, Ollama, a
hosted endpoint) instead of loading a GGUF. ``ServedBackend`` speaks the OpenAI endpoints through
the ``openai`` SDK and keeps the local worker's ``Backend`` contract, so nothing changes for
guests: one connection per request, owned by a thread of ours; a stop or cancel that reaches the
server; every answer bounded in time, pieces and bytes; what the server sends checked where it
arrives; constraints sent where the server's ``Dialect`` enforces them and every answer validated
by the host either way; errors as one line that never holds the key. It is longer than most rooms
because it is a whole client, whose parts belong to one request's life and change together. An answer
costs what was asked: bytes a token, an SSE event's bytes before it is parsed (``MAX_EVENT_BYTES``), bodies
uncompressed -- past any is a malformed stream (``model_load_failed``) -- and at most ``max_tokens`` token
records with the alternatives asked (a chunk of more is dropped unread).

Design: docs/internals/inference.md#servedpy
"""

from __future__ import annotations

import collections
import contextlib
import functools
import json
import math
import os
import re
import socket
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Sequence
from urllib.parse import urlsplit, urlunsplit

from tensorjob_jupyter.abi import MAX_COUNT
from tensorjob_jupyter.inference.base import (FINISH_CANCELLED, FINISH_LENGTH, FINISH_STOP, Constraint,
                                              ConstraintError, GenerateRequest, GenerateResult, GenerateUsage,
                                              ModelError, ModelTimeout, QueueFull, TokenCallback)
from tensorjob_jupyter.inference.logprobs import TokenLogprob, TokenText, read_openai_logprobs
from tensorjob_jupyter.inference.text_stream import TextStream

DEFAULT_API_KEY_ENV = "OPENAI_API_KEY"
#: ``owned_by`` in this package's own server's ``/v1/models`` (``serve/server.py``), and its dialect's name.
TENSORJOB_OWNER = "tensorjob"
#: Bytes of response body allowed per requested token (an SSE chunk of one token is a few hundred).
MAX_BODY_BYTES_PER_TOKEN = 16 * 1024
MAX_BODY_BYTES_FLOOR = 1 << 20
#: The most bytes of one SSE event of an answer, counted before it is parsed. A chunk of one token with
#: ``MAX_TOP_LOGPROBS`` alternatives, each of ``MAX_TOKEN_BYTES`` escaped as badly as JSON can, is about 60 KiB;
#: a usual one a few hundred bytes. Parsed, an event of this many bytes costs some tens of MiB at most.
MAX_EVENT_BYTES = 1 << 20
#: How much of a server's own error text a message quotes.
MAX_SERVER_TEXT = 200
#: The whole of a ``/v1/models`` answer: at most this long in all, and this many bytes.
MODELS_TIMEOUT_S = 10.0
MAX_MODELS_BYTES = 1 << 20
#: The longest model id a transcript records (the server's own id is what requests carry).
MAX_MODEL_ID_CHARS = 256
#: A run of this many characters of the key (or the whole key, if shorter) is scrubbed from every message.
KEY_RUN_CHARS = 6
#: The OpenAI API takes at most four stop strings; the rest are cut here only.
MAX_SERVER_STOPS = 4
#: The alternatives asked of a server with each token's logprob, at least: the chosen token and the best
#: other, which a choice's confidence is measured against.
RUNNER_UP_TOP = 2
_THREAD_PREFIX = "tensorjob-served"


class ServerBusy(QueueFull):
    """The model server said it is overloaded (HTTP 429 or 503): ``busy``."""


class _Aborted(Exception):
    """This request was aborted from another thread (a cancel, a timeout of the job)."""


# --- naming a served model ----------------------------------------------------------------------


def is_served(model: Any) -> bool:
    """Whether ``model`` names a served model (an ``http://`` or ``https://`` URL) rather than a file."""
    return isinstance(model, str) and model[:8].lower().startswith(("http://", "https://"))


def normalise_url(text: str) -> str:
    """The base URL of an OpenAI-compatible API, as recorded: ``ValueError`` says what is wrong.

    ``http(s)://HOST[:PORT][/PATH]``; no path means ``/v1``. A user name or a
    password in the URL is refused (a transcript records the URL; the key
    belongs in an environment variable), and so are a query and a fragment.
    """
    try:
        parts = urlsplit(text.strip())
        port = parts.port
    except ValueError as e:
        raise ValueError(f"{text!r} is not a URL: {e}") from None
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{text!r} is not an http(s) URL of a model server (http://HOST:PORT/v1)")
    if parts.username is not None or parts.password is not None:
        raise ValueError("a model server URL must not carry a user name or password: put the key in an "
                         "environment variable (OPENAI_API_KEY, or the one --api-key-env names)")
    if parts.query or parts.fragment:
        raise ValueError("a model server URL takes no query or fragment (http://HOST:PORT/v1)")
    host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
    netloc = host + (f":{port}" if port is not None else "")
    path = parts.path.rstrip("/") or "/v1"
    return urlunsplit((parts.scheme.lower(), netloc, path, "", ""))


def is_variable_name(name: Any) -> bool:
    """Whether ``name`` can name an environment variable (``--api-key-env``)."""
    return isinstance(name, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) is not None


# --- what each kind of server understands -----------------------------------------------------


@dataclass(frozen=True)
class Dialect:
    """What one kind of OpenAI-compatible server accepts beyond the OpenAI API."""

    name: str
    #: the extra body field for llama.cpp's multiplicative repeat penalty; None: not sent
    repeat_penalty: str | None = None
    #: top_k and min_p as extra body fields, and the top_k that means "off"
    top_k_min_p: bool = False
    top_k_off: int = 0
    #: "json_schema" (the OpenAI shape) or "json_object" (llama-cpp-python: a json_object with a schema)
    schema_format: str = "json_schema"
    #: one text per /embeddings request: llama-cpp-python answers every text of a batch after the first
    #: with the wrong vectors when it returns one vector per token
    embed_one_at_a_time: bool = False
    #: the ``tool_choice`` kinds sent as native ``tools``/``tool_choice`` (``auto``, ``required``,
    #: ``function``); any other choice is held to the host's call JSON with ``response_format``
    native_tools: frozenset[str] = frozenset(("auto", "required", "function"))
    #: whether the server's chat template shows the model its tools; if not, they travel in a system turn too
    renders_tools: bool = True
    #: ``parallel_tool_calls: false`` is understood (a response holds one call)
    one_call_field: bool = False
    #: the ``Constraint`` kinds the server holds its decoding to (``json``, ``regex``, ``choices``, ``lark``);
    #: a constraint of another kind is sent unconstrained, and the host checks the answer
    enforces: frozenset[str] = frozenset(("json",))
    #: where a regex, choices or a Lark grammar goes: ``structured_outputs`` (vLLM's fields) or
    #: ``response_format`` (this package's own server's extension of it)
    text_fields: str = "response_format"

    def response_format(self, schema: Any) -> dict:
        if self.schema_format == "json_object":
            return {"type": "json_object", "schema": schema}
        return {"type": "json_schema", "json_schema": {"name": "output", "schema": schema, "strict": True}}

    def constraint_fields(self, c: Constraint) -> dict[str, Any]:
        """The request fields that hold the server to ``c`` (of a kind in ``enforces``)."""
        if c.schema is not None:  # c.kind == "json"
            return {"response_format": self.response_format(json.loads(c.schema))}
        value = c.regex if c.regex is not None else list(c.choices) if c.choices is not None else c.lark
        if self.text_fields == "structured_outputs":
            # vLLM: ``structured_outputs`` (read since v0.10.2, the only form since v0.12) and the same value
            # in the ``guided_*`` field older servers read (and newer ones ignore)
            key = {"regex": "regex", "choices": "choice", "lark": "grammar"}[c.kind]
            return {"structured_outputs": {key: value}, f"guided_{key}": value}
        kind = "grammar" if c.kind == "lark" else c.kind
        return {"response_format": {"type": kind, kind: value}}


ALL_KINDS = frozenset(("json", "regex", "choices", "lark"))

DIALECTS = {
    "openai": Dialect("openai", one_call_field=True),
    "llama.cpp": Dialect("llama.cpp", "repeat_penalty", True, 0),
    # llama-cpp-python enforces a named function only (a grammar on its parameters), and its generic
    # chat handler leaves the tools out of the prompt
    "llama-cpp-python": Dialect("llama-cpp-python", "repeat_penalty", True, 0, "json_object", True,
                                native_tools=frozenset(("function",)), renders_tools=False),
    # vLLM's "auto" needs server flags (--enable-auto-tool-choice); "required" and a named function do not
    # vLLM's structured outputs take a regex, choices and a grammar besides a schema
    "vllm": Dialect("vllm", "repetition_penalty", True, -1, native_tools=frozenset(("required", "function")),
                    enforces=ALL_KINDS, text_fields="structured_outputs"),
    # this package's own server (serve/server.py): the local engine's sampling and grammars; calls held to a
    # schema
    TENSORJOB_OWNER: Dialect(TENSORJOB_OWNER, "repeat_penalty", True, 0, native_tools=frozenset(),
                             enforces=ALL_KINDS),
    # Ollama ignores tool_choice, and a model without a tool template refuses tools: calls held to a schema
    "ollama": Dialect("ollama", native_tools=frozenset()),
}
#: ``owned_by`` in ``/v1/models`` -> the dialect; anything else speaks plain OpenAI.
OWNERS = {"me": "llama-cpp-python", "llamacpp": "llama.cpp", "vllm": "vllm", TENSORJOB_OWNER: TENSORJOB_OWNER,
          "library": "ollama", "ollama": "ollama"}


@dataclass(frozen=True)
class ServerInfo:
    model: str
    dialect: Dialect


@dataclass
class ServedStats:
    """What this backend did, for benchmarks: requests, text pieces delivered, and the CPU time
    its request threads spent (SDK, SSE parsing, this module and the token callbacks)."""

    requests: int = 0
    pieces: int = 0
    host_cpu_s: float = 0.0


# --- one request: its future, its socket, its limits -------------------------------------------


class _Call:
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
            _shutdown(sock)

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
        timer.name, timer.daemon = f"{_THREAD_PREFIX}-deadline", True
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
            raise _Aborted()
        if name == "connection.connect_tcp.complete":
            stream = info.get("return_value")
            sock = stream.get_extra_info("socket") if stream is not None else None
            if sock is None:
                return
            with self._lock:
                self._sockets.append(sock)
                aborted = self.aborted
            if aborted:
                _shutdown(sock)

    def check(self, n: int) -> None:
        """Before each piece of the body is used: aborted, too late, or too much?"""
        if self.aborted:
            raise _Aborted()
        if self.expired or time.monotonic() > self.deadline:
            raise ModelTimeout(self.expired or self.too_late)
        self.bytes += n
        if self.bytes > self.max_bytes:
            if self.what == "answer":
                raise ModelError(f"the model server's stream is malformed: more than {self.max_bytes} bytes "
                                 "for the tokens asked")
            raise ModelError(f"the model server's {self.what} is more than {self.max_bytes} bytes")


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already closed or never connected


class _ServedFuture(Future):
    """A future whose ``cancel()`` also ends a request that is already running."""

    def __init__(self, call: _Call):
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


class _GuardedBody:
    """The response body as the SDK reads it, checked piece by piece against the request's bounds: its bytes
    in all, and, for an answer's event stream (``events``), the bytes of each SSE event (``MAX_EVENT_BYTES``)
    as they arrive, before the SDK's decoder holds them. ``encoding``: the body's ``Content-Encoding``; any
    but identity is refused at the first read (its bytes on the wire bound nothing decoded)."""

    def __init__(self, inner, call: _Call, encoding: str = "identity", events: bool = False):
        self._inner = inner
        self._call = call
        self._encoding = encoding
        self._events = events
        self._event = 0  # bytes since the last blank line
        self._last = b""  # the byte before this chunk: a blank line can straddle two chunks

    def __iter__(self):
        if self._encoding not in ("", "identity"):
            raise ModelError(f"the model server's {self._call.what} is compressed "
                             f"(Content-Encoding: {_clip(self._encoding, 40)}), though asked for identity")
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


# --- the backend --------------------------------------------------------------------------------


class ServedBackend:
    """A ``Backend`` for a model on an OpenAI-compatible server.

    ``url``: the API base (``http://127.0.0.1:8000/v1``); ``model``: the served
    model's id (None: the server's only model, asked of ``/v1/models`` on first
    use); ``api_key_env``: the environment variable holding the key (unset or
    empty: no key is sent). ``dialect``: a key of ``DIALECTS`` (None: from
    ``/v1/models``). Nothing touches the network until a job needs it.
    """

    def __init__(self, url: str, model: str | None = None, *, api_key_env: str = DEFAULT_API_KEY_ENV,
                 concurrency: int = 4, queue_size: int = 64, connect_timeout_s: float = 5.0,
                 read_timeout_s: float = 120.0, request_timeout_s: float = 600.0, dialect: str | None = None):
        try:
            self.url = normalise_url(url)
        except ValueError as e:
            raise ModelError(str(e)) from None
        if dialect is not None and dialect not in DIALECTS:
            raise ModelError(f"unknown server dialect {dialect!r}: one of {', '.join(sorted(DIALECTS))}")
        if not is_variable_name(api_key_env):
            raise ModelError(f"--api-key-env {api_key_env!r} is not an environment variable name")
        self.api_key_env = api_key_env
        self._key = os.environ.get(api_key_env) or ""
        self._requested_model = model or None
        self._dialect_name = dialect
        self._info: ServerInfo | None = None
        self._info_lock = threading.Lock()
        self._logprobs_refused = False  # the server said no to logprobs once: not asked again
        self.concurrency = max(1, int(concurrency))
        self.queue_size = max(0, int(queue_size))
        self.connect_timeout_s = float(connect_timeout_s)
        self.read_timeout_s = float(read_timeout_s)
        self.request_timeout_s = float(request_timeout_s)
        self.stats = ServedStats()
        self._lock = threading.Lock()
        self._waiting: collections.deque = collections.deque()
        self._running: set[_Call] = set()
        self._threads = 0
        self._accepted = 0  # requests waiting or running
        self._idle = threading.Condition(self._lock)
        self._closed = False
        self._local = threading.local()
        self._client = None  # the openai client, built on first use
        self._headers: dict = {}

    # -- what a job records ----------------------------------------------------------------------

    @property
    def model_name(self) -> str:
        """The served model's id as a transcript records it (clipped, never the key): as given, else the
        server's only model once ``resolve_model`` has asked for it; ``?`` stands in until then. Never
        touches the network: a job is created on its caller's thread, which no server may hold."""
        if self._requested_model:
            return self._recorded(self._requested_model)
        info = self._info
        return self._recorded(info.model) if info is not None else "?"

    def resolve_model(self) -> "Future[str]":
        """``model_name``, once the server has been asked which model it serves (``/v1/models``, on a request
        thread, under its own bounds: ``MAX_MODELS_BYTES``, ``MODELS_TIMEOUT_S`` in all); a job waits for it
        under its deadline and its cancel before its first infer or embed. ``ModelError`` if it cannot say."""
        if self._requested_model or self._info is not None:
            known: Future = Future()
            known.set_result(self.model_name)
            return known
        return self._submit("models", None, None, 0)

    def _recorded(self, model: str) -> str:
        return _clip(model, MAX_MODEL_ID_CHARS, self._scrub)

    @property
    def server(self) -> dict:
        """What a transcript records about the server: its URL and the key's variable, never the key."""
        return {"url": self.url, "api_key_env": self.api_key_env}

    def __repr__(self) -> str:
        return f"ServedBackend({self.url!r}, model={self._requested_model!r}, api_key_env={self.api_key_env!r})"

    def __reduce__(self):
        raise TypeError("a ServedBackend holds threads and connections and cannot be pickled; "
                        "send the URL, the model name and the key's variable name instead")

    # -- submitting ---------------------------------------------------------------------------------

    def generate_stream(self, request: GenerateRequest, on_token: TokenCallback) -> "Future[GenerateResult]":
        if request.lora:
            raise ModelError("a served model takes no LoRA adapters from the job: the server chooses them")
        return self._submit("generate", request, on_token, request.max_tokens)

    def embed(self, texts: Sequence[str]) -> "Future[list[list[float]]]":
        return self._submit("embed", list(texts), None, 1 + sum(len(t) for t in texts) // 64)

    def _submit(self, kind: str, payload: Any, on_token: TokenCallback | None, tokens: int) -> Future:
        max_bytes = max(MAX_BODY_BYTES_FLOOR, MAX_BODY_BYTES_PER_TOKEN * max(1, int(tokens)))
        call = _Call(kind, max_bytes, int(tokens))
        work = {"generate": self._generate, "embed": self._embed, "models": self._list}[kind]
        future = _ServedFuture(call)
        with self._lock:
            if self._closed:
                raise ModelError(f"the backend for {self.url} is closed")
            if self._accepted >= self.concurrency + self.queue_size:
                raise QueueFull(f"the requests to the model server {self.url} are full ({self.concurrency} "
                                f"running, {self.queue_size} waiting); try again later")
            self._waiting.append((work, payload, on_token, call, future))
            self._accepted += 1
            if self._threads < self.concurrency:
                self._threads += 1
                threading.Thread(target=self._serve, name=f"{_THREAD_PREFIX}-{self._threads}", daemon=True).start()
        return future

    def _serve(self) -> None:
        """A request thread: run waiting requests until none waits, then end."""
        while True:
            with self._lock:
                if not self._waiting:
                    self._threads -= 1
                    self._idle.notify_all()
                    return
                work, payload, on_token, call, future = self._waiting.popleft()
                if not future.set_running_or_notify_cancel():
                    self._accepted -= 1
                    continue  # cancelled while it waited
                self._running.add(call)
            call.started = time.perf_counter()
            cpu = time.thread_time()
            self._local.call = call
            try:
                with call.bounded(call.max_bytes, self.request_timeout_s, "answer", "request_timeout_s"):
                    outcome = work(call, payload, on_token)
            except BaseException as e:  # noqa: BLE001 - every failure answers the future
                outcome = self._error(e, call)
            finally:
                self._local.call = None
                with self._lock:  # counted out before the caller hears: it may submit again at once
                    self._running.discard(call)
                    self._accepted -= 1
                    self.stats.requests += 1
                    self.stats.host_cpu_s += time.thread_time() - cpu
            if isinstance(outcome, BaseException):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)

    def close(self, timeout: float | None = 10.0) -> None:
        """Refuse new requests, fail the waiting ones, abort the running ones, and wait for the threads."""
        with self._lock:
            self._closed = True
            waiting = list(self._waiting)
            self._waiting.clear()
            self._accepted -= len(waiting)
            running = list(self._running)
        for _work, _payload, _on_token, _call, future in waiting:
            if future.set_running_or_notify_cancel():
                future.set_exception(ModelError(f"the backend for {self.url} was closed"))
        for call in running:
            call.abort()
        with self._idle:
            self._idle.wait_for(lambda: self._threads == 0, timeout)
        client, self._client = self._client, None
        if client is not None:
            client.close()

    @property
    def threads(self) -> int:
        """Request threads alive now (0 when no request runs or waits)."""
        with self._lock:
            return self._threads

    # -- the HTTP client ------------------------------------------------------------------------------

    def _openai(self):
        with self._info_lock:
            if self._client is None:
                self._client = self._make_client()
            return self._client

    def _make_client(self):
        try:
            import httpx2
            import openai
        except ImportError as e:  # pragma: no cover - both are dependencies
            raise ModelError(f"a served model needs the openai package: {e}") from None
        timeout = httpx2.Timeout(connect=self.connect_timeout_s, read=self.read_timeout_s,
                                 write=self.read_timeout_s, pool=self.read_timeout_s)
        # bodies uncompressed: the byte bounds hold what is parsed (``_GuardedBody`` refuses any other)
        http = httpx2.Client(timeout=timeout, headers={"Accept-Encoding": "identity"},
                             limits=httpx2.Limits(max_connections=2 * self.concurrency + 4,
                                                  max_keepalive_connections=0),
                             event_hooks={"request": [self._on_request], "response": [self._on_response]})
        # no key: no Authorization header at all (the SDK wants that said per request: ``_headers``)
        self._headers = {} if self._key else {"Authorization": openai.Omit()}
        # admin_api_key="" and api_key="" (not None): the SDK must not fall back to OPENAI_API_KEY or
        # OPENAI_ADMIN_KEY when --api-key-env names another variable
        return openai.OpenAI(base_url=self.url, api_key=self._key, admin_api_key="", max_retries=0,
                             timeout=timeout, http_client=http)

    def _on_request(self, request) -> None:
        call = getattr(self._local, "call", None)
        if call is not None:
            call.check(0)
            request.extensions = {**request.extensions, "trace": call.trace}

    def _on_response(self, response) -> None:
        call = getattr(self._local, "call", None)
        if call is not None:
            encoding = response.headers.get("content-encoding", "identity").strip().lower()
            # the answer's own event stream (not the listing a generate call may nest, nor embeddings' JSON)
            events = call.kind == "generate" and call.what == "answer"
            response.stream = _wrap_stream(response.stream, call, encoding, events)

    # -- which model, which dialect ------------------------------------------------------------------

    def _list(self, call: _Call, _payload: None, _on_token: None) -> str:
        self._server_info()
        return self.model_name

    def _server_info(self) -> ServerInfo:
        """The model id and the dialect, asked of ``/v1/models`` once (a failure is asked again next time).

        Only on a request thread, inside its request's bounds and abort, with bounds of its own
        (``MAX_MODELS_BYTES``, ``MODELS_TIMEOUT_S`` in all). No lock is held while asking: two first
        requests may both ask, and a request aborted meanwhile ends at once."""
        info = self._info
        if info is not None:
            return info
        client = self._openai()
        call: _Call = self._local.call
        owners: dict[str, str] = {}
        listed: list[str] | None = None
        try:
            with call.bounded(MAX_MODELS_BYTES, MODELS_TIMEOUT_S, "list of models (/models)", "MODELS_TIMEOUT_S"):
                page = client.get("/models", cast_to=object, options={
                    "headers": self._headers, "timeout": min(self.read_timeout_s, MODELS_TIMEOUT_S)})
            listed = []
            for m in _field(page, "data", list) or ():
                model_id = _field(m, "id", str)
                if model_id:
                    listed.append(model_id)
                    owners[model_id] = _field(m, "owned_by", str) or ""
        except Exception as e:  # noqa: BLE001 - classified below
            if call.aborted or call.expired:
                raise  # the request's own error path answers
            error = self._error(e, None)
            if not (self._requested_model and isinstance(error, ModelError)
                    and getattr(error, "status", None) == 404):
                raise error from None
        model = self._requested_model
        if model is None:
            if not listed:
                raise ModelError(f"the model server at {self.url} lists no models; name one with --model-name")
            if len(listed) > 1:
                names = ", ".join(_clip(n, 80, self._scrub) for n in listed[:20])
                names += ", ..." if len(listed) > 20 else ""
                raise ModelError(f"the model server at {self.url} serves {len(listed)} models ({names}); "
                                 "name one with --model-name")
            model = listed[0]
        elif listed is not None and model not in listed:
            names = ", ".join(_clip(n, 80, self._scrub) for n in listed[:20]) or "none"
            raise ModelError(f"the model server at {self.url} does not serve {_clip(model, 80, self._scrub)!r} "
                             f"(it serves: {names})")
        dialect = DIALECTS[self._dialect_name or OWNERS.get(owners.get(model, ""), "openai")]
        with self._info_lock:
            self._info = self._info or ServerInfo(model, dialect)
            return self._info

    # -- generation -------------------------------------------------------------------------------

    def _body(self, request: GenerateRequest, info: ServerInfo, chat: bool) -> tuple[dict, dict]:
        """The request's OpenAI fields, and the extra fields only some servers understand."""
        s = request.sampler
        body: dict[str, Any] = {"model": info.model, "stream": True, "max_tokens": int(request.max_tokens),
                                "temperature": float(s.temperature), "top_p": float(s.top_p), "seed": int(s.seed),
                                "stream_options": {"include_usage": True}}
        if s.stop:
            body["stop"] = list(s.stop)[:MAX_SERVER_STOPS]
        extra: dict[str, Any] = {}
        d = info.dialect
        if d.repeat_penalty is not None:
            extra[d.repeat_penalty] = float(s.repeat_penalty)
        if d.top_k_min_p:
            extra["top_k"] = int(s.top_k) if s.top_k and s.top_k > 0 else d.top_k_off
            extra["min_p"] = float(s.min_p)
        if request.logprobs and not self._logprobs_refused:
            top = max(int(request.top_logprobs), RUNNER_UP_TOP)
            body.update({"logprobs": True, "top_logprobs": top} if chat else {"logprobs": top})
        c = request.constraint
        if self._native_tools(request, info, chat):
            tools = request.tools
            assert tools is not None, "_native_tools checked it"
            body["tools"] = [{"type": "function", "function": f} for f in json.loads(tools.functions)]
            body["tool_choice"] = (tools.choice if tools.choice != "function"
                                   else {"type": "function", "function": {"name": tools.name}})
            if d.one_call_field:
                body["parallel_tool_calls"] = False
        elif c is not None and not c.free_text and c.kind in d.enforces:
            for name, value in d.constraint_fields(c).items():
                # response_format is not part of the completions API, and the rest of no OpenAI API: servers
                # that know them use them
                (body if chat and name == "response_format" else extra)[name] = value
        return body, extra

    @staticmethod
    def _native_tools(request: GenerateRequest, info: ServerInfo, chat: bool) -> bool:
        """Whether this request's tools go to the server as ``tools``/``tool_choice``."""
        return chat and request.tools is not None and request.tools.choice in info.dialect.native_tools

    def _generate(self, call: _Call, request: GenerateRequest, on_token: TokenCallback) -> GenerateResult:
        info = self._server_info()
        chat = request.chat is None or bool(request.chat)
        body, extra = self._body(request, info, chat)
        client = self._openai()
        native = self._native_tools(request, info, chat)
        if chat:
            # the tools' instructions ask for the host's call JSON: not for a server that renders its tools
            system = None if native and info.dialect.renders_tools else request.system
            messages = ([{"role": "system", "content": system}] if system is not None else [])
            messages.append({"role": "user", "content": request.prompt})
            body = {**body, **extra, "messages": messages}
        else:
            prompt = request.prompt if request.system is None else f"{request.system}\n\n{request.prompt}"
            body = {**body, **extra, "prompt": prompt}
        # the SDK's request, errors and SSE parser, with each chunk left as parsed JSON (``cast_to=object``):
        # building its typed models costs ~200 us a chunk, most of the served path's cost per token
        import openai

        def post(body: dict):
            return client.post("/chat/completions" if chat else "/completions", cast_to=object, body=body,
                               options={"headers": self._headers}, stream=True, stream_cls=openai.Stream[object])

        try:
            stream = post(body)
        except openai.APIStatusError as e:  # before any token: a server that refuses logprobs is asked without
            if "logprobs" not in body or e.status_code not in (400, 422) or "logprob" not in _server_text(e).lower():
                raise
            self._logprobs_refused = True
            stream = post({k: v for k, v in body.items() if k not in ("logprobs", "top_logprobs")})
        records = (_Records(request.max_tokens, request.top_logprobs, max(int(request.top_logprobs), RUNNER_UP_TOP))
                   if "logprobs" in body else None)
        return self._read(call, stream, request, on_token, chat, native, records)

    def _read(self, call: _Call, stream, request: GenerateRequest, on_token: TokenCallback,
              chat: bool, native_tools: bool = False, records: "_Records | None" = None) -> GenerateResult:
        """The answer ``stream`` carries, its text delivered to ``on_token`` as it comes (with the token
        records ``records`` reads off it, when logprobs were asked)."""
        result = self._read_answer(call, stream, request, on_token, chat, native_tools, records)
        if records is not None:
            result.logprobs = records.delivered
        return result

    def _read_answer(self, call: _Call, stream, request: GenerateRequest, on_token: TokenCallback,
                     chat: bool, native_tools: bool, records: "_Records | None") -> GenerateResult:
        text_stream = TextStream(request.sampler.stop)
        tool_call = CallText() if native_tools else None
        events = 0
        max_events = 4 * request.max_tokens + 64
        finish: str | None = None
        usage = None

        def deliver(text: str) -> bool:
            call.parts.append(text)
            if records is not None:
                text = records.carried_by(text)
            try:
                return bool(on_token(text))
            except BaseException:  # noqa: BLE001 - a dead listener means stop
                return False

        with stream:
            for chunk in stream:
                events += 1
                if events > max_events:
                    raise ModelError(f"the model server's stream is malformed: more than {max_events} events "
                                     f"for {request.max_tokens} tokens")
                if not isinstance(chunk, dict):
                    raise ModelError("the model server's stream is malformed: an event is not a JSON object")
                got = chunk.get("usage")
                if isinstance(got, dict):
                    usage = got
                for choice in _field(chunk, "choices", list) or ():
                    if not isinstance(choice, dict) or choice.get("index", 0) not in (0, None):
                        continue
                    if records is not None and choice.get("logprobs") is not None:
                        records.take(choice["logprobs"])
                    delta = choice.get("delta") if chat else None
                    delta = delta if isinstance(delta, dict) else {}
                    piece = delta.get("content") if chat else choice.get("text")
                    if tool_call is not None:
                        piece = tool_call.text_piece(piece)
                        if delta.get("tool_calls"):
                            if call.pieces >= request.max_tokens:
                                return self._result(call, FINISH_LENGTH, usage, None, deliver, tool_call)
                            text = tool_call.feed(delta["tool_calls"])
                            if text:
                                call.arrived()
                                if not deliver(text):
                                    return self._result(call, FINISH_CANCELLED, None, None, deliver)
                            if tool_call.another:  # one call a response: the answer is the first
                                return self._result(call, FINISH_STOP, usage, None, deliver, tool_call)
                    if piece:
                        if not isinstance(piece, str):
                            raise ModelError("the model server's stream is malformed: a text piece is not a string")
                        if call.pieces >= request.max_tokens:  # the server ignores max_tokens: cut it here
                            return self._result(call, FINISH_LENGTH, usage, text_stream, deliver)
                        call.arrived()
                        text, stopped = text_stream.push(piece.encode("utf-8", "replace"))
                        if text and not deliver(text):
                            return self._result(call, FINISH_CANCELLED, None, None, deliver)
                        if stopped:
                            return self._result(call, FINISH_STOP, usage, None, deliver)
                    reason = choice.get("finish_reason")
                    if reason:
                        finish = FINISH_LENGTH if reason == "length" else FINISH_STOP
        if finish is None:
            raise ModelError("the model server's stream ended before the answer did (no finish_reason)")
        return self._result(call, finish, usage, text_stream, deliver, tool_call)

    def _result(self, call: _Call, finish: str, usage, text_stream: TextStream | None, deliver,
                tool_call: "CallText | None" = None) -> GenerateResult:
        if tool_call is not None and tool_call.started:
            if finish != FINISH_LENGTH:  # a call cut at max_tokens stays open: it fails as the JSON it is
                deliver(tool_call.close())
            return GenerateResult("".join(call.parts), finish, self._usage(usage, call))
        if tool_call is not None and tool_call.held and text_stream is not None:  # an answer of blanks only
            text, _ = text_stream.push(tool_call.held.encode("utf-8"))
            if text:
                deliver(text)
        if text_stream is not None:
            tail = text_stream.flush()
            if tail:
                deliver(tail)
        return GenerateResult("".join(call.parts), finish, self._usage(usage, call))

    def _usage(self, usage, call: _Call) -> GenerateUsage:
        with self._lock:
            self.stats.pieces += call.pieces
        pieces, started, first_at, last_at = call.pieces, call.started, call.first_at, call.last_at
        # the server's counts, each a whole number from 0 to 2^53 or not taken; no answer has more tokens
        # than were asked for, and no prompt more cached tokens than it has
        prompt = _count(_field(usage, "prompt_tokens", int))
        completion = _count(_field(usage, "completion_tokens", int))
        if completion is not None and call.max_tokens:
            completion = min(completion, call.max_tokens)
        cached = _count(_field(_field(usage, "prompt_tokens_details", dict), "cached_tokens", int))
        if cached is not None:
            cached = min(cached, prompt or 0)
        tps = ((pieces - 1) / (last_at - first_at)
               if pieces > 1 and last_at and first_at is not None and last_at > first_at else None)
        return GenerateUsage(prompt_tokens=prompt or 0, completion_tokens=completion if usage is not None
                             and completion is not None else pieces, cached_tokens=cached or 0,
                             time_to_first_token_s=(first_at - started) if first_at and started is not None else None,
                             tokens_per_second=tps)

    # -- embeddings -------------------------------------------------------------------------------

    def _embed(self, call: _Call, texts: list[str], _on_token: None) -> list[list[float]]:
        if not texts:
            return []
        info = self._server_info()
        batches = [[t] for t in texts] if info.dialect.embed_one_at_a_time else [texts]
        rows = []
        for batch in batches:
            answer = self._openai().post("/embeddings", cast_to=object, options={"headers": self._headers},
                                         body={"model": info.model, "input": batch, "encoding_format": "float"})
            got = [row for row in _field(answer, "data", list) or () if isinstance(row, dict)]
            rows += sorted(got, key=lambda row: _field(row, "index", int) or 0)
        if len(rows) != len(texts):
            raise ModelError(f"the model server's embeddings are malformed: {len(rows)} vectors for {len(texts)} texts")
        vectors = []
        for row in rows:
            vector = row.get("embedding")
            if isinstance(vector, list) and vector and all(isinstance(v, list) and v for v in vector):
                vector = _mean_pooled(vector)  # one vector per token (llama-cpp-python, a model without pooling)
            if not isinstance(vector, list) or not vector or not all(isinstance(x, (int, float)) for x in vector):
                raise ModelError("the model server's embeddings are malformed: a vector is not a list of numbers")
            norm = math.sqrt(sum(float(x) * float(x) for x in vector)) or 1.0
            vectors.append([float(x) / norm for x in vector])
        return vectors

    # -- errors -----------------------------------------------------------------------------------

    def _error(self, e: BaseException, call: _Call | None):
        """What a failed request answers: a partial result when it was aborted, else one exception
        of the kinds the reactor knows, with a one-line message that holds no key."""
        if call is not None and call.aborted:
            if call.kind == "generate":
                return GenerateResult("".join(call.parts), FINISH_CANCELLED, self._usage(None, call))
            return ModelError("the request to the model server was cancelled")
        if call is not None and call.expired:
            return ModelTimeout(call.expired)
        error = _classify(e, self.url, self.api_key_env, self._scrub)
        message = self._scrub(str(error))
        if message != str(error):
            status = getattr(error, "status", None)
            error = type(error)(message)
            if status is not None:
                error.status = status  # type: ignore[attr-defined]
        return error

    def _scrub(self, text: str) -> str:
        """``text`` without the key: the whole key, and any run of ``KEY_RUN_CHARS`` of its characters
        (a server that quotes part of it), each becomes ``***``."""
        return scrub_key(text, self._key)


class CallText:
    """The host's tool-call text, ``{"name": NAME, "arguments": ARGUMENTS}``, from a server's streamed
    ``tool_calls`` deltas: the name once it is known, then each piece of the arguments as it arrives.

    The host reads, checks and reports that text as it does the local model's (``host/structured.py``),
    so a call's arguments that are not the JSON its schema asks for fail the same way. One call a
    response: a delta for another call (another index, or the same index with another id) sets
    ``another`` and the answer ends with the first. Text and a call in one answer is the model's
    output breaking its shape: ``ConstraintError`` (``schema_validation_failed``), like a bad call.
    """

    def __init__(self) -> None:
        self.name: str | None = None
        self.index: Any = None
        self.id: Any = None
        self.another = False
        #: blank text before anything else: it waits until the answer is known to be text, not a call
        self.held = ""
        self.text_seen = False

    @property
    def started(self) -> bool:
        return self.name is not None

    def text_piece(self, piece: Any) -> Any:
        """What of a content piece reaches the answer: leading blanks wait (a call may follow them);
        text once a call has begun is refused."""
        if not piece or not isinstance(piece, str):
            return piece
        if self.started:
            if piece.strip():
                raise ConstraintError("the model answered with a tool call and then text; "
                                      "a response holds one or the other")
            return None
        if not self.text_seen:
            if not piece.strip():
                self.held += piece
                return None
            self.text_seen = True
            piece, self.held = self.held + piece, ""
        return piece

    def feed(self, deltas: Any) -> str:
        """The text these deltas add (may be empty)."""
        if self.text_seen:
            raise ConstraintError("the model answered with text and then a tool call; "
                                  "a response holds one or the other")
        if not isinstance(deltas, list):
            raise ModelError("the model server's stream is malformed: tool_calls is not a list")
        out = []
        for delta in deltas:
            if not isinstance(delta, dict):
                raise ModelError("the model server's stream is malformed: a tool call is not an object")
            index = delta.get("index")
            index = 0 if index is None else index  # a server that sends no index streams one call
            call_id = delta.get("id")
            if self.name is None:
                self.index, self.id = index, call_id
            elif index != self.index or (call_id and self.id and call_id != self.id):
                self.another = True  # another call: a new index, or the same index with a new id
                break
            function = delta.get("function")
            function = function if isinstance(function, dict) else {}
            name, arguments = function.get("name"), function.get("arguments")
            if self.name is None:
                if not isinstance(name, str) or not name:
                    raise ModelError("the model server's stream is malformed: a tool call begins without a name")
                self.name = name
                out.append('{"name": ' + json.dumps(name, ensure_ascii=False) + ', "arguments": ')
            elif name not in (None, "", self.name):
                raise ModelError("the model server's stream is malformed: a tool call changes its name")
            if arguments:
                if not isinstance(arguments, str):
                    raise ModelError("the model server's stream is malformed: a tool call's arguments are not text")
                out.append(arguments)
        return "".join(out)

    def close(self) -> str:
        return "}"


class _Records:
    """The token records a served answer carries (``choices[0].logprobs``), handed on with its text.

    Records wait (``take``) until text is delivered, and go with it (``carried_by``): a stop string's
    lookahead can hold text back past the chunk its tokens came in. At most ``max_tokens`` records are
    taken, each with at most the ``asked`` alternatives (and the chosen token: OpenAI's legacy answer may
    add it) read and ``top`` kept. A record that is not one, or a chunk whose records would pass
    ``max_tokens`` (counted before any is read), ends the records of this answer (``delivered`` keeps those
    handed on), and the text goes on without them."""

    def __init__(self, max_tokens: int, top: int, asked: int = RUNNER_UP_TOP):
        self.max_tokens = max(0, int(max_tokens))
        self.top = top
        self.asked = max(int(asked), int(top))
        self.waiting: list[TokenLogprob] = []
        self.delivered: list[TokenLogprob] | None = None  # None: the server gave none
        self.broken = False

    def take(self, value: Any) -> None:
        if self.broken:
            return
        taken = len(self.waiting) + len(self.delivered or ())
        try:
            got = read_openai_logprobs(value, self.top, most=self.max_tokens - taken, read=self.asked + 1)
        except ValueError:
            self.broken, self.waiting = True, []
            return
        self.waiting += got

    def carried_by(self, text: str) -> str:
        if not self.waiting:
            return text
        records, self.waiting = self.waiting, []
        if self.delivered is None:
            self.delivered = []
        self.delivered.extend(records)
        return TokenText(text, records)


def _wrap_stream(inner, call: _Call, encoding: str = "identity", events: bool = False):
    return _guarded_body_class()(inner, call, encoding, events)


@functools.lru_cache(maxsize=1)
def _guarded_body_class() -> type:
    """``_GuardedBody`` as the HTTP client's sync byte stream (made on first use: httpx2 loads with openai)."""
    import httpx2

    return type("GuardedBody", (_GuardedBody, httpx2.SyncByteStream), {})


def _mean_pooled(rows: list[list]) -> list[float] | None:
    """The mean of per-token vectors, as the local engine pools; None when they are not all numbers of one width."""
    width = len(rows[0])
    if any(len(r) != width or not all(isinstance(x, (int, float)) for x in r) for r in rows):
        return None
    return [sum(float(r[i]) for r in rows) / len(rows) for i in range(width)]


def _field(obj: Any, key: str, kind: type) -> Any:
    """``obj[key]`` when ``obj`` is a JSON object and the value is of ``kind``, else None: the server's JSON
    is untrusted input (a bool is not an int here)."""
    value = obj.get(key) if isinstance(obj, dict) else None
    if isinstance(value, bool) and kind is not bool:
        return None
    return value if isinstance(value, kind) else None


def _count(value: Any) -> int | None:
    """A count from the server as a transcript may record it (a whole number from 0 to 2^53), else None."""
    return value if type(value) is int and 0 <= value <= MAX_COUNT else None


def scrub_key(text: str, key: str, run: int = KEY_RUN_CHARS) -> str:
    """``text`` with the whole of ``key``, and every run of ``run`` or more of its consecutive characters,
    replaced by ``***`` (a key shorter than 4 characters is not looked for)."""
    if not key or len(key) < 4 or not text:
        return text
    text = text.replace(key, "***")
    run = min(run, len(key))
    pieces = {key[i:i + run] for i in range(len(key) - run + 1)}
    spans: list[list[int]] = []  # the runs found, overlapping and touching ones merged
    for i in range(len(text) - run + 1):
        if text[i:i + run] in pieces:
            if spans and i <= spans[-1][1]:
                spans[-1][1] = i + run
            else:
                spans.append([i, i + run])
    out, at = [], 0
    for start, end in spans:
        out += [text[at:start], "***"]
        at = end
    return "".join(out) + text[at:]


def _clip(text: Any, n: int = MAX_SERVER_TEXT, scrub=None) -> str:
    """``text`` as one printable line of at most ``n`` characters; ``scrub`` (the key's) runs before it is
    cut, so no cut leaves part of a key behind. Bounded work for any length of text."""
    text = " ".join(str(text)[:8 * n + 256].split())
    text = "".join(c for c in text if c.isprintable())
    if scrub is not None:
        text = scrub(text)
    return text if len(text) <= n else text[:n] + "…"


def _server_text(e: Any, scrub=None) -> str:
    body = getattr(e, "body", None)
    message = None
    if isinstance(body, dict):
        inner = body.get("error", body)
        message = inner.get("message") if isinstance(inner, dict) else inner
        if message is None and isinstance(body.get("detail"), (str, list)):
            message = body["detail"]
    return _clip(message if message is not None else getattr(e, "message", "") or "", scrub=scrub)


def _classify(e: BaseException, url: str, key_env: str, scrub=None) -> BaseException:
    """A request's exception as one the reactor maps to a code (see the module docstring); ``scrub``
    takes the key out of the server's text before it is clipped."""
    if isinstance(e, (ModelError, QueueFull)):
        return e
    try:
        import httpx2
        import openai
    except ImportError:  # pragma: no cover
        return ModelError(f"{type(e).__name__}: {_clip(str(e), scrub=scrub)}")
    cause = e.__cause__ if isinstance(e, openai.APIConnectionError) else e
    if isinstance(cause, (httpx2.ConnectError, httpx2.ConnectTimeout)) or isinstance(e, _Aborted):
        why = "it did not answer in time" if isinstance(cause, httpx2.ConnectTimeout) else "connection refused"
        if isinstance(cause, httpx2.ConnectError) and "refused" not in str(cause).lower():
            why = _clip(str(cause), 120, scrub) or "cannot connect"
        return ModelError(f"cannot reach the model server at {url}: {why}")
    if isinstance(e, openai.APITimeoutError) or isinstance(cause, httpx2.TimeoutException):
        return ModelTimeout(f"the model server at {url} sent nothing for too long (read_timeout_s)")
    if isinstance(e, openai.APIStatusError):
        status = e.status_code
        said = _server_text(e, scrub)
        said = f": {said}" if said else ""
        if status in (429, 503):
            return ServerBusy(f"the model server at {url} is busy (HTTP {status}){said}; try again later")
        if status in (408, 504):
            return ModelTimeout(f"the model server at {url} timed out (HTTP {status}){said}")
        if status in (401, 403):
            return ModelError(f"the model server at {url} refused the key in ${key_env} (HTTP {status}){said}")
        if status in (400, 422) and re.search(r"response_format|json_schema|schema|grammar|regex|structured_output"
                                              r"|guided_|\bchoices?\b", said, re.I):
            return ConstraintError(f"the model server at {url} refused the constraint on the output "
                                   f"(HTTP {status}){said}")
        error = ModelError(f"the model server at {url} answered HTTP {status}{said}")
        error.status = status  # type: ignore[attr-defined]
        return error
    if isinstance(e, openai.APIConnectionError):
        return ModelError(f"the model server at {url} dropped the connection mid-answer"
                          + (f" ({type(cause).__name__})" if cause is not None else ""))
    if isinstance(e, openai.APIError):
        return ModelError(f"the model server at {url} reported an error in its stream: {_clip(str(e), scrub=scrub)}")
    if isinstance(e, (ValueError, TypeError, AttributeError, KeyError)):  # bad JSON, a chunk of the wrong shape
        return ModelError(f"the model server's stream is malformed ({type(e).__name__}: {_clip(str(e), 120, scrub)})")
    return ModelError(f"the request to the model server at {url} failed: {type(e).__name__}: "
                      f"{_clip(str(e), scrub=scrub)}")


# --- one backend per server, model and key variable in a process ---------------------------------

_registry_lock = threading.Lock()
_backends: dict[tuple, ServedBackend] = {}


def served_backend(url: str, model_name: str | None = None, api_key_env: str | None = None,
                   **options: Any) -> ServedBackend:
    """The process's shared backend for this server, model id and key variable (built once)."""
    try:
        base = normalise_url(url)
    except ValueError as e:
        raise ModelError(str(e)) from None
    env = api_key_env or DEFAULT_API_KEY_ENV
    key = (base, model_name or None, env, tuple(sorted(options.items())))
    with _registry_lock:
        backend = _backends.get(key)
        if backend is None or backend._closed:
            backend = _backends[key] = ServedBackend(base, model_name, api_key_env=env, **options)
        return backend


def shutdown(timeout: float | None = 10.0) -> None:
    """Close every shared served backend (their threads end, their connections close)."""
    with _registry_lock:
        backends = list(_backends.values())
        _backends.clear()
    for backend in backends:
        backend.close(timeout)


__all__ = [
    "DEFAULT_API_KEY_ENV", "TENSORJOB_OWNER", "MAX_BODY_BYTES_PER_TOKEN", "MAX_BODY_BYTES_FLOOR", "MAX_EVENT_BYTES",
    "MAX_SERVER_TEXT", "MODELS_TIMEOUT_S", "MAX_MODELS_BYTES", "MAX_MODEL_ID_CHARS", "KEY_RUN_CHARS",
    "MAX_SERVER_STOPS", "ServerBusy", "is_served", "normalise_url", "is_variable_name", "Dialect", "ALL_KINDS",
    "DIALECTS", "OWNERS", "ServerInfo", "ServedStats", "ServedBackend", "CallText", "scrub_key", "served_backend",
    "shutdown"
]

"""Models served elsewhere: any OpenAI-compatible server as a job's model.

``--model http://HOST:PORT/v1`` points a job at a server (vLLM, llama.cpp's server, Ollama, a hosted
endpoint) instead of loading a GGUF. ``ServedBackend`` speaks the OpenAI endpoints through the ``openai`` SDK
and keeps the local worker's ``Backend`` contract, so nothing changes for guests: one connection per request,
owned by a thread of ours; a stop or cancel that reaches the server; every answer bounded in time, pieces and
bytes; constraints sent where the server enforces them and every answer validated by the host either way.
This module names a served model (``is_served``, ``normalise_url``), holds the backend -- its request
threads, the request it builds, which model and dialect a server has -- and one backend per server in a
process; its rooms: ``served_dialects`` (what each kind of server understands), ``served_transport``
(sockets, bounds in time and bytes, cancel), ``served_stream`` (reading an answer) and ``served_errors``
(one line, never the key). Their public names stay importable from here.

Design: docs/internals/inference.md#servedpy
"""

from __future__ import annotations

import collections
import json
import math
import os
import re
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Sequence
from urllib.parse import urlsplit, urlunsplit

from tensorjob_jupyter.inference.base import (FINISH_CANCELLED, GenerateRequest, GenerateResult, GenerateUsage,
                                              ModelError, ModelTimeout, QueueFull, TokenCallback)
from tensorjob_jupyter.inference.served_dialects import (ALL_KINDS, DIALECTS, OWNERS, TENSORJOB_OWNER, Dialect,
                                                         ServerInfo)
from tensorjob_jupyter.inference.served_errors import (KEY_RUN_CHARS, MAX_SERVER_TEXT, ServerBusy, classify, clip,
                                                       scrub_key, server_text)
from tensorjob_jupyter.inference.served_stream import (RUNNER_UP_TOP, CallText, Records, field, mean_pooled,
                                                       read_answer, usage_of)
from tensorjob_jupyter.inference.served_transport import (MAX_BODY_BYTES_FLOOR, MAX_BODY_BYTES_PER_TOKEN,
                                                          MAX_EVENT_BYTES, THREAD_PREFIX, Call, ServedFuture,
                                                          wrap_stream)

DEFAULT_API_KEY_ENV = "OPENAI_API_KEY"
#: The whole of a ``/v1/models`` answer: at most this long in all, and this many bytes.
MODELS_TIMEOUT_S = 10.0
MAX_MODELS_BYTES = 1 << 20
#: The longest model id a transcript records (the server's own id is what requests carry).
MAX_MODEL_ID_CHARS = 256
#: The OpenAI API takes at most four stop strings; the rest are cut here only.
MAX_SERVER_STOPS = 4


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


@dataclass
class ServedStats:
    """What this backend did, for benchmarks: requests, text pieces delivered, and the CPU time
    its request threads spent (SDK, SSE parsing, this module and the token callbacks)."""

    requests: int = 0
    pieces: int = 0
    host_cpu_s: float = 0.0


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
        self._running: set[Call] = set()
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
        return clip(model, MAX_MODEL_ID_CHARS, self._scrub)

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
        call = Call(kind, max_bytes, int(tokens))
        work = {"generate": self._generate, "embed": self._embed, "models": self._list}[kind]
        future = ServedFuture(call)
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
                threading.Thread(target=self._serve, name=f"{THREAD_PREFIX}-{self._threads}", daemon=True).start()
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
        # bodies uncompressed: the byte bounds hold what is parsed (``served_transport.GuardedBody`` refuses any other)
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
            response.stream = wrap_stream(response.stream, call, encoding, events)

    # -- which model, which dialect ------------------------------------------------------------------

    def _list(self, call: Call, _payload: None, _on_token: None) -> str:
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
        call: Call = self._local.call
        owners: dict[str, str] = {}
        listed: list[str] | None = None
        try:
            with call.bounded(MAX_MODELS_BYTES, MODELS_TIMEOUT_S, "list of models (/models)", "MODELS_TIMEOUT_S"):
                page = client.get("/models", cast_to=object, options={
                    "headers": self._headers, "timeout": min(self.read_timeout_s, MODELS_TIMEOUT_S)})
            listed = []
            for m in field(page, "data", list) or ():
                model_id = field(m, "id", str)
                if model_id:
                    listed.append(model_id)
                    owners[model_id] = field(m, "owned_by", str) or ""
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
                names = ", ".join(clip(n, 80, self._scrub) for n in listed[:20])
                names += ", ..." if len(listed) > 20 else ""
                raise ModelError(f"the model server at {self.url} serves {len(listed)} models ({names}); "
                                 "name one with --model-name")
            model = listed[0]
        elif listed is not None and model not in listed:
            names = ", ".join(clip(n, 80, self._scrub) for n in listed[:20]) or "none"
            raise ModelError(f"the model server at {self.url} does not serve {clip(model, 80, self._scrub)!r} "
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

    def _generate(self, call: Call, request: GenerateRequest, on_token: TokenCallback) -> GenerateResult:
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
            if "logprobs" not in body or e.status_code not in (400, 422) or "logprob" not in server_text(e).lower():
                raise
            self._logprobs_refused = True
            stream = post({k: v for k, v in body.items() if k not in ("logprobs", "top_logprobs")})
        records = (Records(request.max_tokens, request.top_logprobs, max(int(request.top_logprobs), RUNNER_UP_TOP))
                   if "logprobs" in body else None)
        return self._read(call, stream, request, on_token, chat, native, records)

    def _read(self, call: Call, stream, request: GenerateRequest, on_token: TokenCallback,
              chat: bool, native_tools: bool = False, records: Records | None = None) -> GenerateResult:
        """The answer ``stream`` carries, its text delivered to ``on_token`` as it comes (with the token
        records ``records`` reads off it, when logprobs were asked: ``served_stream.read_answer``)."""
        finish, usage = read_answer(call, stream, request, on_token, chat, native_tools, records)
        result = GenerateResult("".join(call.parts), finish, self._usage(usage, call))
        if records is not None:
            result.logprobs = records.delivered
        return result

    def _usage(self, usage, call: Call) -> GenerateUsage:
        """The usage of ``call``'s answer (``served_stream.usage_of``), its pieces counted into ``stats``."""
        with self._lock:
            self.stats.pieces += call.pieces
        return usage_of(usage, call)

    # -- embeddings -------------------------------------------------------------------------------

    def _embed(self, call: Call, texts: list[str], _on_token: None) -> list[list[float]]:
        if not texts:
            return []
        info = self._server_info()
        batches = [[t] for t in texts] if info.dialect.embed_one_at_a_time else [texts]
        rows = []
        for batch in batches:
            answer = self._openai().post("/embeddings", cast_to=object, options={"headers": self._headers},
                                         body={"model": info.model, "input": batch, "encoding_format": "float"})
            got = [row for row in field(answer, "data", list) or () if isinstance(row, dict)]
            rows += sorted(got, key=lambda row: field(row, "index", int) or 0)
        if len(rows) != len(texts):
            raise ModelError(f"the model server's embeddings are malformed: {len(rows)} vectors for {len(texts)} texts")
        vectors = []
        for row in rows:
            vector = row.get("embedding")
            if isinstance(vector, list) and vector and all(isinstance(v, list) and v for v in vector):
                vector = mean_pooled(vector)  # one vector per token (llama-cpp-python, a model without pooling)
            if not isinstance(vector, list) or not vector or not all(isinstance(x, (int, float)) for x in vector):
                raise ModelError("the model server's embeddings are malformed: a vector is not a list of numbers")
            norm = math.sqrt(sum(float(x) * float(x) for x in vector)) or 1.0
            vectors.append([float(x) / norm for x in vector])
        return vectors

    # -- errors -----------------------------------------------------------------------------------

    def _error(self, e: BaseException, call: Call | None):
        """What a failed request answers: a partial result when it was aborted, else one exception
        of the kinds the reactor knows, with a one-line message that holds no key."""
        if call is not None and call.aborted:
            if call.kind == "generate":
                return GenerateResult("".join(call.parts), FINISH_CANCELLED, self._usage(None, call))
            return ModelError("the request to the model server was cancelled")
        if call is not None and call.expired:
            return ModelTimeout(call.expired)
        error = classify(e, self.url, self.api_key_env, self._scrub)
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

"""The model behind an OpenAI-compatible API (``tensorjob serve``): one copy of it, batched, for many kernels.

An OpenAI request is checked as a guest's ``infer`` is (``abi.command_from_json``, then ``host/structured.py``
for the constraint) and refused with HTTP 400 where that refuses it; every field that would change the answer
and is not honoured is refused too, never ignored. Tokens go from the worker's thread to the request's asyncio
queue, so there is no thread per request, and a client that leaves stops its sequence at the next token.
Bodies, connections and the time to send a request are bounded; it answers only loopback names unless told,
and with ``--api-key-env`` every request must carry the key. ``listen`` serves until Ctrl-C.
Design: docs/internals/serve.md
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import re
import secrets
import socket
import time
from dataclasses import dataclass
from typing import Any, TextIO

from tensorjob_jupyter import abi
from tensorjob_jupyter.host.schemas import SchemaError
from tensorjob_jupyter.host.structured import OutputSpec
from tensorjob_jupyter.inference import served
from tensorjob_jupyter.inference.base import (
    FINISH_LENGTH, Backend, ConstraintError, GenerateRequest, GenerateResult, ModelError, QueueFull,
    RequestTooLarge, Sampler,
)
from tensorjob_jupyter.inference.logprobs import logprobs_of, openai_logprobs
from tensorjob_jupyter.text import for_terminal

#: The largest request body read (a prompt and a schema fit many times over).
MAX_BODY_BYTES = 4 << 20
#: ``max_tokens`` when a request gives none.
DEFAULT_MAX_TOKENS = 256
#: How often a non-streaming request looks whether its client is still there.
DISCONNECT_POLL_S = 0.25
#: The most texts one ``/embeddings`` request embeds (and the engine's token budget bounds them together).
MAX_EMBED_TEXTS = 256
#: Connections held at once; past it a new one is closed as it comes (and uvicorn answers 503 from
#: ``limit_concurrency`` on): so many half-sent requests cannot take every file descriptor.
MAX_CONNECTIONS = 256
#: Seconds a client may take to send a request's headers, and then its body, each in all (``--header-timeout``,
#: ``--body-timeout``); a connection past them is closed. An idle kept-alive connection closes after
#: ``KEEP_ALIVE_S``; a request's header block is at most ``MAX_HEADER_BYTES``.
HEADER_TIMEOUT_S = 10.0
BODY_TIMEOUT_S = 60.0
KEEP_ALIVE_S = 5
MAX_HEADER_BYTES = 16 * 1024
#: Bytes of request bodies being received that all requests together may hold; past it a request is
#: 503 (busy), so stalled uploads cannot pile up ``MAX_CONNECTIONS`` x ``MAX_BODY_BYTES``.
MAX_PENDING_BODY_BYTES = 64 << 20
#: Fields that change an answer and that this server does not honour: refused, never silently ignored
#: (the value each may have and still be served).
UNSERVED_FIELDS: dict[str, tuple[Any, ...]] = {
    "logit_bias": (None, {}), "presence_penalty": (None, 0, 0.0), "frequency_penalty": (None, 0, 0.0),
    "echo": (None, False), "suffix": (None, ""), "best_of": (None, 1)}


class ClientLeft(Exception):
    """The client hung up before its answer was ready."""


class RequestError(Exception):
    """A request this server answers with an HTTP error: ``status`` and a one-line message."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind


@dataclass(frozen=True)
class Planned:
    """One checked generation request, and what its answer reports."""

    request: GenerateRequest
    stream: bool
    include_usage: bool
    chat: bool
    #: Each token's logprob is answered (``logprobs`` asked).
    logprobs: bool = False


# --- an OpenAI request as an infer -------------------------------------------------------------


#: ``response_format`` types beyond OpenAI's (this server's extension), each the infer field of the same name.
TEXT_FORMATS = ("regex", "choices", "grammar")
#: vLLM's body fields for structured output (``guided_*`` before its v0.12; ``structured_outputs`` since v0.10.2,
#: whose keys are below), and the infer field each becomes.
VLLM_FIELDS = {"guided_json": "format", "guided_regex": "regex", "guided_choice": "choices",
               "guided_grammar": "grammar"}
VLLM_STRUCTURED_OUTPUTS = {"json": "format", "regex": "regex", "choice": "choices", "grammar": "grammar"}


def _response_format(value: Any) -> dict:
    """OpenAI's ``response_format`` (and llama-cpp-python's json_object with a schema, and this server's regex,
    choices and grammar) as an infer's fields: ``format``, ``regex``, ``choices`` or ``grammar``."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise RequestError(400, "response_format must be an object")
    kind = value.get("type")
    if kind == "text":
        return {}
    if kind == "json_object":
        if isinstance(value.get("schema"), dict):
            return {"format": {"type": "json_schema", "name": "output", "schema": value["schema"]}}
        return {"format": {"type": "json_object"}}
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
            raise RequestError(400, "response_format json_schema needs json_schema.schema, an object")
        return {"format": {"type": "json_schema", "name": str(spec.get("name") or "output")[:64],
                           "schema": spec["schema"]}}
    if kind in TEXT_FORMATS:
        if value.get(kind) is None:
            raise RequestError(400, f"response_format {kind} needs {kind}, "
                                    f"{'an array of strings' if kind == 'choices' else 'a string'}")
        return {kind: value[kind]}
    raise RequestError(400, "response_format.type must be text, json_object, json_schema, regex, choices or grammar, "
                            f"not {str(kind)[:40]!r}")


def _json_format(schema: Any, where: str) -> dict:
    """vLLM's JSON Schema (an object, or its JSON text) as an infer's format."""
    if isinstance(schema, str):
        try:
            schema = abi.loads_strict(schema.encode("utf-8", "surrogatepass"), what=f"`{where}`")
        except abi.AbiError as e:
            raise RequestError(400, str(e)) from None
    if not isinstance(schema, dict):
        raise RequestError(400, f"`{where}` must be a JSON Schema object")
    return {"type": "json_schema", "name": "output", "schema": schema}


def _constraints(body: dict) -> dict:
    """The infer's ``format``, ``regex``, ``choices`` or ``grammar`` from ``response_format`` and vLLM's fields; a
    field given twice is refused here, two different ones by the infer's own checks."""
    given: list[tuple[str, str, Any]] = [("response_format", k, v)
                                         for k, v in _response_format(body.get("response_format")).items()]
    for name, field in VLLM_FIELDS.items():
        if body.get(name) is not None:
            value = _json_format(body[name], name) if field == "format" else body[name]
            given.append((name, field, value))
    outputs = body.get("structured_outputs")
    if outputs is not None:
        if not isinstance(outputs, dict):
            raise RequestError(400, "structured_outputs must be an object")
        # a client that sends vLLM's whole StructuredOutputsParams sends its other fields as null or false
        unknown = sorted(k for k, v in outputs.items() if v not in (None, False) and k not in VLLM_STRUCTURED_OUTPUTS)
        if unknown:
            raise RequestError(400, f"tensorjob serve takes structured_outputs with json, regex, choice or grammar, "
                                    f"not {', '.join(str(k)[:40] for k in unknown[:4])}")
        for key, field in VLLM_STRUCTURED_OUTPUTS.items():
            if outputs.get(key) is not None:
                name = f"structured_outputs.{key}"
                given.append((name, field, _json_format(outputs[key], name) if field == "format" else outputs[key]))
    fields: dict[str, Any] = {}
    source: dict[str, str] = {}
    for name, field, value in given:
        if field in source:
            raise RequestError(400, f"{source[field]} and {name} both constrain the answer: give one")
        fields[field], source[field] = value, name
    return fields


def _chat_prompt(messages: Any) -> tuple[str, str | None]:
    """(the user's text, the system text) of a chat request: one user message after an optional system one."""
    if not isinstance(messages, list) or not messages:
        raise RequestError(400, "messages must be a non-empty array")
    system = None
    if isinstance(messages[0], dict) and messages[0].get("role") in ("system", "developer") and len(messages) == 2:
        system = _content(messages[0])
        messages = messages[1:]
    if len(messages) != 1 or not isinstance(messages[0], dict) or messages[0].get("role") != "user":
        raise RequestError(400, "tensorjob serve takes one user message, after an optional system message "
                                "(a conversation's turns are the client's to fold into them)")
    return _content(messages[0]), system


def _content(message: dict) -> str:
    content = message.get("content")
    if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                   for p in content):
            raise RequestError(400, "only text content is served (no images or audio)")
        content = "".join(p["text"] for p in content)
    if not isinstance(content, str):
        raise RequestError(400, "a message's content must be a string")
    return content


def plan(body: Any, *, chat: bool) -> Planned:
    """Check one ``/chat/completions`` or ``/completions`` body; ``RequestError`` says what is wrong."""
    if not isinstance(body, dict):
        raise RequestError(400, "the request body must be a JSON object")
    if body.get("tools") or body.get("functions"):
        raise RequestError(400, "tensorjob serve does not take tools: hold the call to a response_format "
                                "(tensorjob's own client does)")
    if body.get("n", 1) != 1:
        raise RequestError(400, "n must be 1")
    for name, served_values in UNSERVED_FIELDS.items():
        value = body.get(name)
        if not any(value == v and type(value) is type(v) for v in served_values):
            raise RequestError(400, f"tensorjob serve does not take {name} (it would be ignored, and the answer "
                                    f"would not be what was asked)")
    if chat:
        prompt, system = _chat_prompt(body.get("messages"))
    else:
        given = body.get("prompt")
        if isinstance(given, list) and len(given) == 1:
            given = given[0]
        if not isinstance(given, str):
            raise RequestError(400, "prompt must be a string (one prompt a request)")
        prompt, system = given, None
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    infer = {"cmd": "infer", "prompt": prompt, "max_tokens": DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens,
             **_constraints(body)}
    for name in abi.INFER_SAMPLING:
        if body.get(name) is not None:
            infer[name] = body[name]
    try:
        command = abi.command_from_json(infer)
        if not isinstance(command, abi.Infer):  # "cmd" is "infer" above: nothing else parses from it
            raise TypeError(f"an infer parsed as {type(command).__name__}")
        spec = OutputSpec.of(command)
    except (abi.AbiError, SchemaError) as e:
        raise RequestError(400, str(e).replace("`infer.", "`").replace("infer: ", "")) from None
    options = body.get("stream_options")
    logprobs, top = _logprobs(body, chat)
    request = GenerateRequest(command.prompt, command.max_tokens, Sampler(**command.sampling()), chat=chat,
                              constraint=spec.constraint, system=system, logprobs=logprobs, top_logprobs=top)
    return Planned(request, bool(body.get("stream")),
                   isinstance(options, dict) and bool(options.get("include_usage")), chat, logprobs)


def _logprobs(body: dict, chat: bool) -> tuple[bool, int]:
    """(whether each token's logprob is answered, how many alternatives beside it), as OpenAI reads them:
    chat's ``logprobs`` (true or false) and ``top_logprobs`` (which needs it), completions' ``logprobs: N``."""
    most = abi.MAX_TOP_LOGPROBS
    asked, top = body.get("logprobs"), body.get("top_logprobs")

    def count(value: Any, name: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= most:
            raise RequestError(400, f"{name} must be a whole number from 0 to {most}")
        return value

    if chat:
        if asked is not None and not isinstance(asked, bool):
            raise RequestError(400, "logprobs must be true or false")
        n = 0 if top is None else count(top, "top_logprobs")
        if n and not asked:
            raise RequestError(400, "top_logprobs needs logprobs: true")
        return bool(asked), n
    if top not in (None, 0) or isinstance(top, bool):
        raise RequestError(400, "/completions takes logprobs: N (the alternatives beside each token), "
                                "not top_logprobs")
    if asked is None or asked is False:
        return False, 0
    return True, count(asked, "logprobs")


# --- answers ----------------------------------------------------------------------------------


class Answer:
    """The OpenAI objects of one answer: chunks while it streams, the whole at its end."""

    def __init__(self, planned: Planned, model: str):
        self.chat = planned.chat
        self.logprobs = planned.logprobs
        self.model = model
        self._chars = 0  # of the answer streamed so far: the legacy shape's text_offset
        self.id = ("chatcmpl-" if self.chat else "cmpl-") + secrets.token_hex(12)
        self.created = int(time.time())

    def _envelope(self, choices: list, *, whole: bool) -> dict:
        kind = ("chat.completion" if whole else "chat.completion.chunk") if self.chat else "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model, "choices": choices}

    def piece(self, text: str) -> bytes:
        choice = ({"index": 0, "delta": {"content": text}, "finish_reason": None} if self.chat
                  else {"index": 0, "text": text, "finish_reason": None})
        choice["logprobs"] = self._logprobs(logprobs_of(text))
        self._chars += len(text)
        return _event(self._envelope([choice], whole=False))

    def _logprobs(self, records) -> dict | None:
        return openai_logprobs(records, chat=self.chat, offset=self._chars) if self.logprobs else None

    def end(self, result: GenerateResult, include_usage: bool) -> bytes:
        finish = _finish(result)
        choice = ({"index": 0, "delta": {}, "finish_reason": finish, "logprobs": None} if self.chat
                  else {"index": 0, "text": "", "finish_reason": finish, "logprobs": None})
        out = _event(self._envelope([choice], whole=False))
        if include_usage:
            out += _event({**self._envelope([], whole=False), "usage": _usage(result)})
        return out + b"data: [DONE]\n\n"

    def whole(self, result: GenerateResult) -> dict:
        finish = _finish(result)
        choice = ({"index": 0, "message": {"role": "assistant", "content": result.text}, "finish_reason": finish}
                  if self.chat else {"index": 0, "text": result.text, "finish_reason": finish})
        choice["logprobs"] = self._logprobs(result.logprobs or ())
        return {**self._envelope([choice], whole=True), "usage": _usage(result)}


def _finish(result: GenerateResult) -> str:
    return "length" if result.finish_reason == FINISH_LENGTH else "stop"


def _usage(result: GenerateResult) -> dict:
    u = result.usage
    return {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
            "total_tokens": u.prompt_tokens + u.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": u.cached_tokens}}


def _event(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n\n"


#: A ``Host`` header: a name, an IPv4 address or a bracketed IPv6 address, then an optional port of digits.
_HOST = re.compile(r"(?P<name>\[[0-9A-Fa-f:.]+\]|[^\[\]:]+)(?::(?P<port>[0-9]{1,5}))?")


def host_name(header: str) -> str | None:
    """The name in a ``Host`` header, without its port (``[::1]:8000`` -> ``[::1]``); None when the header is
    not a host and an optional port (``localhost:evil``, ``a:b:c``)."""
    match = _HOST.fullmatch(header)
    if match is None or (match["port"] is not None and int(match["port"]) > 65535):
        return None
    return match["name"].lower()


def _parse_body(data: bytes) -> Any:
    """A request body, bounded as a guest's command is: depth, values, no NaN, no duplicate keys, UTF-8."""
    try:
        return abi.loads_strict(data, what="the request body")
    except abi.AbiError as e:
        raise RequestError(400, str(e)) from None


def _error_body(status: int, message: str, kind: str) -> dict:
    return {"error": {"message": message, "type": kind, "code": status}}


def _model_failure(e: BaseException) -> RequestError:
    if isinstance(e, QueueFull):
        return RequestError(429, str(e), "rate_limit_error")
    if isinstance(e, (ConstraintError, RequestTooLarge)):
        return RequestError(400, str(e))
    if isinstance(e, ModelError) and "n_ctx" in str(e):  # the prompt does not fit the context
        return RequestError(400, str(e))
    return RequestError(500, f"{type(e).__name__}: {e}" if not isinstance(e, ModelError) else str(e), "server_error")


# --- the app ----------------------------------------------------------------------------------


LOOPBACK_NAMES = frozenset(("127.0.0.1", "localhost", "::1", "[::1]"))


class RequestLog:
    """Writes one line per answered request: ``POST /v1/chat/completions 200 161+21 tokens 812 ms``.

    A handler notes what the request used (``request.state.tokens``: prompt and completion tokens, or
    texts embedded); the line is written once the response is sent, a stream's when it ends (a client
    that left is said so)."""

    def __init__(self, out: TextIO):
        self.out = out

    def route(self, handler):
        """``handler`` wrapped so that each request it answers writes its line."""
        from starlette.responses import StreamingResponse  # deferred: starlette is the serve extra's

        async def logged(request):
            started = time.perf_counter()
            request.state.tokens = None
            request.state.left = False
            response = await handler(request)
            if not isinstance(response, StreamingResponse):
                self.write(request, response.status_code, started)
                return response
            body = response.body_iterator

            async def logged_body():
                try:
                    async for chunk in body:
                        yield chunk
                finally:
                    self.write(request, response.status_code, started)
            response.body_iterator = logged_body()
            return response
        return logged

    def write(self, request, status: int, started: float) -> None:
        tokens = request.state.tokens
        used = f" {tokens[0]}+{tokens[1]} tokens" if isinstance(tokens, tuple) else (
            f" {tokens} texts" if isinstance(tokens, int) else "")
        left = " (the client left)" if request.state.left else ""
        ms = 1000 * (time.perf_counter() - started)
        path = for_terminal(request.url.path[:200], one_line=True)
        try:
            self.out.write(f"{time.strftime('%H:%M:%S')} {request.method} {path} {status}{used} {ms:.0f} ms{left}\n")
            self.out.flush()
        except (OSError, ValueError):  # stdout closed or gone: serving goes on
            pass


def build_app(backend: Backend, model: str, *, api_key: str | None = None, loopback_only: bool = False,
              log: RequestLog | None = None):
    """The Starlette app serving ``backend`` under the id ``model``; ``loopback_only``: answer only
    requests whose ``Host`` is a loopback name; ``log``: a line per request there."""
    from starlette.applications import Starlette  # deferred: starlette is the serve extra's
    from starlette.requests import ClientDisconnect
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    def error(e: RequestError) -> Response:
        return JSONResponse(_error_body(e.status, e.message, e.kind), status_code=e.status)

    async def answered(request, future) -> Any:
        """The model's answer to a request that is not streamed; ``ClientLeft`` (the request cancelled, so
        the model stops it) if its client hangs up first."""
        waiter = asyncio.wrap_future(future)
        while not (await asyncio.wait({waiter}, timeout=DISCONNECT_POLL_S))[0]:
            if await request.is_disconnected():
                future.cancel()
                raise ClientLeft()
        return waiter.result()

    def admit(request) -> None:
        """Who may ask: the Host (when loopback only) and the key; ``RequestError`` if not."""
        if loopback_only:
            if host_name(request.headers.get("host", "")) not in LOOPBACK_NAMES:
                raise RequestError(403, "this server answers requests to a loopback address only",
                                   "permission_error")
        if api_key is not None:
            given = request.headers.get("authorization", "").encode("latin-1", "replace")  # as Starlette decoded it
            if not hmac.compare_digest(given, f"Bearer {api_key}".encode("ascii")):
                raise RequestError(401, "a valid Authorization: Bearer key is needed", "authentication_error")

    pending = 0  # bytes of request bodies received and not yet parsed, all requests together

    async def read_json(request) -> Any:
        nonlocal pending
        admit(request)
        if request.headers.get("content-type", "").split(";")[0].strip().lower() != "application/json":
            raise RequestError(415, "the request body must be sent as Content-Type: application/json")
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
            raise RequestError(413, f"the request body is over {MAX_BODY_BYTES} bytes")
        data = bytearray()
        try:
            async for part in request.stream():
                data += part
                pending += len(part)
                if len(data) > MAX_BODY_BYTES:
                    raise RequestError(413, f"the request body is over {MAX_BODY_BYTES} bytes")
                if pending > MAX_PENDING_BODY_BYTES:
                    raise RequestError(503, "the server is receiving too many request bodies at once; "
                                            "try again later", "server_busy")
            return await asyncio.to_thread(_parse_body, bytes(data))
        except ClientDisconnect:
            raise RequestError(499, "the client left before its request was read") from None
        finally:
            pending -= len(data)

    async def models(request) -> Response:
        try:
            admit(request)
        except RequestError as e:
            return error(e)
        return JSONResponse({"object": "list", "data": [
            {"id": model, "object": "model", "created": 0, "owned_by": served.TENSORJOB_OWNER}]})

    async def generate(request, chat: bool) -> Response:
        try:
            planned = await asyncio.to_thread(plan, await read_json(request), chat=chat)  # schema checks: off the loop
        except RequestError as e:
            return error(e)
        loop = asyncio.get_running_loop()
        pieces: asyncio.Queue = asyncio.Queue()
        gone = False

        def on_token(text: str) -> bool:  # the worker's thread
            if gone:
                return False
            loop.call_soon_threadsafe(pieces.put_nowait, text)
            return True

        try:
            future = backend.generate_stream(planned.request, on_token)
        except Exception as e:  # noqa: BLE001 - QueueFull and a model that fails to load, answered
            return error(_model_failure(e))
        future.add_done_callback(lambda _f: loop.call_soon_threadsafe(pieces.put_nowait, None))
        answer = Answer(planned, model)

        if not planned.stream:
            try:
                result = await answered(request, future)
            except ClientLeft:  # nobody to answer: the sequence was stopped
                gone = True
                request.state.left = True
                return Response(status_code=499)
            except Exception as e:  # noqa: BLE001
                return error(_model_failure(e))
            request.state.tokens = (result.usage.prompt_tokens, result.usage.completion_tokens)
            return JSONResponse(answer.whole(result))

        async def events():
            nonlocal gone
            ended = False
            try:
                while True:
                    text = await pieces.get()
                    if text is None:
                        break
                    yield answer.piece(text)
                try:
                    result = future.result()
                except Exception as e:  # noqa: BLE001 - the stream has begun: an error event ends it
                    failure = _model_failure(e)
                    yield _event(_error_body(failure.status, failure.message, failure.kind))
                    ended = True
                    return
                request.state.tokens = (result.usage.prompt_tokens, result.usage.completion_tokens)
                yield answer.end(result, planned.include_usage)
                ended = True
            finally:
                request.state.left = not ended
                gone = True  # a client that left (this generator closed early) stops the sequence
                future.cancel()

        return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    async def chat_completions(request) -> Response:
        return await generate(request, True)

    async def completions(request) -> Response:
        return await generate(request, False)

    async def embeddings(request) -> Response:
        try:
            body = await read_json(request)
            texts = body.get("input") if isinstance(body, dict) else None
            texts = [texts] if isinstance(texts, str) else texts
            if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
                raise RequestError(400, "input must be a string or a non-empty array of strings")
            if len(texts) > MAX_EMBED_TEXTS:
                raise RequestError(400, f"input takes at most {MAX_EMBED_TEXTS} texts")
            try:
                vectors = await answered(request, backend.embed(texts))
            except ClientLeft:  # the worker stops the embed at its next piece
                request.state.left = True
                return Response(status_code=499)
            except Exception as e:  # noqa: BLE001
                raise _model_failure(e) from None
            request.state.tokens = len(texts)
        except RequestError as e:
            return error(e)
        return JSONResponse({"object": "list", "model": model, "data": [
            {"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)],
            "usage": {"prompt_tokens": 0, "total_tokens": 0}})

    logged = log.route if log is not None else (lambda handler: handler)
    return Starlette(routes=[
        Route("/v1/models", logged(models), methods=["GET"]),
        Route("/v1/chat/completions", logged(chat_completions), methods=["POST"]),
        Route("/v1/completions", logged(completions), methods=["POST"]),
        Route("/v1/embeddings", logged(embeddings), methods=["POST"]),
    ])


def _bounded_h11(header_timeout_s: float, body_timeout_s: float) -> type:
    """uvicorn's h11 protocol with what uvicorn's settings do not bound: at most ``MAX_CONNECTIONS`` at once
    (a connection past it is closed as it comes), and a deadline on sending a request's headers and then its
    body, each in all (uvicorn times out only an idle kept-alive connection; a client that sends half its
    headers, a byte now and then, would be held for ever)."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class BoundedH11(H11Protocol):
        def connection_made(self, transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._reading: str | None = None
            self._read_timer: asyncio.TimerHandle | None = None
            if len(self.connections) > MAX_CONNECTIONS:
                transport.close()
                return
            self._deadline("headers", header_timeout_s)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            state = self.conn.their_state
            if state is h11.IDLE:  # (part of) the next request's headers
                self._deadline("headers", header_timeout_s)
            elif state is h11.SEND_BODY:
                self._deadline("body", body_timeout_s)
            else:  # the request is in: the answer is the app's
                self._deadline(None, 0)

        def connection_lost(self, exc: Exception | None) -> None:
            self._deadline(None, 0)
            super().connection_lost(exc)

        def _deadline(self, reading: str | None, seconds: float) -> None:
            """Keep (or start, or stop) the deadline for what the client is sending now."""
            if reading == self._reading:
                return
            if self._read_timer is not None:
                self._read_timer.cancel()
                self._read_timer = None
            self._reading = reading
            if reading is not None:
                self._read_timer = self.loop.call_later(seconds, self._too_slow)

        def _too_slow(self) -> None:
            self._read_timer = None
            if not self.transport.is_closing():
                self.transport.close()

    return BoundedH11


def bind(host: str, port: int) -> socket.socket:
    """A socket bound to ``host``:``port`` (0: a free port), for ``listen``; ``OSError`` if it cannot be bound."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def listen(backend: Backend, sock: socket.socket, *, api_key: str | None = None, quiet: bool = False,
           header_timeout_s: float = HEADER_TIMEOUT_S, body_timeout_s: float = BODY_TIMEOUT_S,
           out: TextIO, err: TextIO) -> None:
    """Serve ``backend`` on the bound ``sock`` (``bind``) until Ctrl-C; "serving at URL" on ``out`` once it
    listens, a warning on ``err`` when it listens beyond loopback with no key."""
    import uvicorn  # deferred: the serve extra's

    sock.listen(2048)  # before "serving at": a client that connects at once is queued, not refused
    bound, port = sock.getsockname()[:2]
    loopback = ipaddress.ip_address(bound).is_loopback
    app = build_app(backend, backend.model_name, api_key=api_key, loopback_only=loopback,
                    log=None if quiet else RequestLog(out))
    if api_key is None and not loopback:
        err.write(f"tensorjob: warning: serving on {bound} without --api-key-env: anyone who can reach this port "
                  "can use the model\n")
    shown = f"[{bound}]" if ":" in bound else bound
    out.write(f"serving at http://{shown}:{port}/v1 (jobs: --model http://{shown}:{port}/v1)\n")
    out.flush()
    server = uvicorn.Server(uvicorn.Config(
        app, log_level="warning", access_log=False, lifespan="off", timeout_graceful_shutdown=5,
        http=_bounded_h11(header_timeout_s, body_timeout_s), limit_concurrency=MAX_CONNECTIONS,
        timeout_keep_alive=KEEP_ALIVE_S, h11_max_incomplete_event_size=MAX_HEADER_BYTES))
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        pass


__all__ = [
    "MAX_BODY_BYTES", "DEFAULT_MAX_TOKENS", "DISCONNECT_POLL_S", "MAX_EMBED_TEXTS", "MAX_CONNECTIONS",
    "HEADER_TIMEOUT_S", "BODY_TIMEOUT_S", "KEEP_ALIVE_S", "MAX_HEADER_BYTES", "MAX_PENDING_BODY_BYTES",
    "UNSERVED_FIELDS", "ClientLeft", "RequestError", "Planned", "TEXT_FORMATS", "VLLM_FIELDS",
    "VLLM_STRUCTURED_OUTPUTS", "plan", "Answer", "host_name", "LOOPBACK_NAMES", "RequestLog", "build_app",
    "bind", "listen"
]

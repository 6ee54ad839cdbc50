"""The model behind an OpenAI-compatible API (``tensorjob serve``): one copy of it, batched, for many kernels.

The HTTP app and its bounds: each request is read by ``openai_wire.plan`` (checked as a guest's ``infer`` is,
refused with its HTTP status where that refuses it) and answered by ``openai_wire.Answer``. Tokens go from the worker's thread to the request's asyncio
queue, so there is no thread per request, and a client that leaves stops its sequence at the next token.
Bodies, connections and the time to send a request are bounded; it answers only loopback names unless told,
and with ``--api-key-env`` every request must carry the key. ``listen`` serves until Ctrl-C.
Design: docs/internals/serve.md
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import re
import socket
import time
from typing import Any, TextIO

from tensorjob_jupyter.inference import served
from tensorjob_jupyter.inference.base import Backend
from tensorjob_jupyter.serve.openai_wire import (
    Answer, ClientLeft, RequestError, error_body, event_bytes, model_failure, parse_body, plan,
)
from tensorjob_jupyter.text import for_terminal

#: The largest request body read (a prompt and a schema fit many times over).
MAX_BODY_BYTES = 4 << 20
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
#: A ``Host`` header: a name, an IPv4 address or a bracketed IPv6 address, then an optional port of digits.
_HOST = re.compile(r"(?P<name>\[[0-9A-Fa-f:.]+\]|[^\[\]:]+)(?::(?P<port>[0-9]{1,5}))?")


def host_name(header: str) -> str | None:
    """The name in a ``Host`` header, without its port (``[::1]:8000`` -> ``[::1]``); None when the header is
    not a host and an optional port (``localhost:evil``, ``a:b:c``)."""
    match = _HOST.fullmatch(header)
    if match is None or (match["port"] is not None and int(match["port"]) > 65535):
        return None
    return match["name"].lower()


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
        return JSONResponse(error_body(e.status, e.message, e.kind), status_code=e.status)

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
            return await asyncio.to_thread(parse_body, bytes(data))
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
            return error(model_failure(e))
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
                return error(model_failure(e))
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
                    failure = model_failure(e)
                    yield event_bytes(error_body(failure.status, failure.message, failure.kind))
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
                raise model_failure(e) from None
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
    "MAX_BODY_BYTES", "DISCONNECT_POLL_S", "MAX_EMBED_TEXTS", "MAX_CONNECTIONS",
    "HEADER_TIMEOUT_S", "BODY_TIMEOUT_S", "KEEP_ALIVE_S", "MAX_HEADER_BYTES", "MAX_PENDING_BODY_BYTES",
    "host_name", "LOOPBACK_NAMES", "RequestLog", "build_app",
    "bind", "listen"
]

"""Model servers for the served-model tests: a real one, a scripted fake, and what to watch.

``LlamaServer`` starts llama-cpp-python's own OpenAI-compatible server
(``python -m llama_cpp.server``) on a GGUF as a separate process, on a free
loopback port, the way a user starts one; it dies with the test process
(parent-death signal) and is killed when closed. Its output goes to a log
file that tests read ("disconnected" is what it prints when a client leaves
mid-stream).

``FakeServer`` is a tiny OpenAI-compatible server on a thread of this
process that does what a test tells it (``mode``): answer a stream, say 429
or 500, send malformed SSE, never end, stall before or after the headers.
It records every request (path, headers, JSON body) and when each client
connection closed, so a test sees from the server's side that a stop or a
cancel really closed the connection.

``TensorjobServe`` is ``tensorjob serve`` as a user starts it, in a subprocess on a
free port (test_serve.py, test_hostile_serve.py).

``served_threads`` and ``connections_to`` are what "no thread or socket
outlives the job" is checked with; ``infer_guest``, ``run`` and ``answer``
are the one-infer jobs the real-server tests send (test_served_llama.py,
test_serve.py).
"""

from __future__ import annotations

import ctypes
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

KEY = "sk-test-4242-do-not-print-me"


# --- one-infer jobs ------------------------------------------------------------------------------------


def infer_guest(prompt, max_tokens=24, stop_after_tokens=None, **fields) -> bytes:
    """A guest that infers ``prompt`` once (``fields``: the infer's other fields) and is done."""
    from wat import script_guest

    return script_guest([{"cmd": "infer", "prompt": prompt, "max_tokens": max_tokens, **fields},
                         {"cmd": "done", "result": "ok"}], stop_after_tokens=stop_after_tokens)


def run(guest, timeout=300, **kwargs):
    """(the job, its envelope) of ``guest`` run to its end with ``tj.Job(guest, **kwargs)``."""
    import tensorjob_jupyter as tj

    job = tj.Job(guest, **kwargs).start()
    return job, job.wait(timeout)


def answer(job) -> str:
    """The text the job's model streamed."""
    return "".join(e["delta"] for e in job.events if e["type"] == "response.output_text.delta")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def served_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("tensorjob-served")]


def connections_to(port: int) -> list:
    """This process's TCP connections to ``port`` (the client side), in any state but closed."""
    import psutil

    return [c for c in psutil.Process().net_connections(kind="tcp")
            if c.raddr and c.raddr.port == port and c.status not in ("CLOSE", "TIME_WAIT")]


def wait_until(predicate, timeout: float = 5.0, step: float = 0.02):
    end = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > end:
            return value
        time.sleep(step)


def _die_with_parent() -> None:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class TensorjobServe:
    """``tensorjob serve ARGS`` in a subprocess on a free port (``--port 0``), at ``url`` (``port``);
    ``close()`` ends it. What it prints after its first line (the request log) is read as it comes, into
    ``lines``: a full pipe would stall it."""

    def __init__(self, *args: str, threads: int = 1, env: dict | None = None):
        self.process = subprocess.Popen([sys.executable, "-m", "tensorjob_jupyter.frontends.cli", "serve", "--port",
                                         "0", "--threads", str(threads), *args], stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})})
        line = self.process.stdout.readline()
        if not line.startswith("serving at "):
            self.close()
            raise RuntimeError(f"tensorjob serve did not start: {line!r} {self.process.stderr.read()[-2000:]}")
        self.url = line.split()[2]
        self.port = int(self.url.rsplit(":", 1)[1].split("/")[0])
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    def output(self) -> str:
        """Everything it printed after the first line, once it has ended."""
        self._reader.join(15)
        return "\n".join(self.lines)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


class LlamaServer:
    """``python -m llama_cpp.server`` on ``model`` at ``url``; ``close()`` kills it."""

    def __init__(self, model: str | os.PathLike, log_path: str | os.PathLike, *, threads: int = 2,
                 n_ctx: int = 2048, embedding: bool = False, timeout: float = 120.0, extra: tuple = ()):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.log_path = Path(log_path)
        self._log = open(self.log_path, "wb")
        cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(model), "--host", "127.0.0.1",
               "--port", str(self.port), "--n_threads", str(threads), "--n_threads_batch", str(threads),
               "--n_ctx", str(n_ctx), "--interrupt_requests", "False", "--embedding", str(embedding), *extra]
        self.process = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent,
                                        env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            self._wait_ready(timeout)
        except BaseException:
            self.close()
            raise

    def _wait_ready(self, timeout: float) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.process.poll() is not None:
                raise RuntimeError(f"the llama_cpp server exited ({self.process.returncode}): {self.log()[-2000:]}")
            try:
                with urllib.request.urlopen(self.url + "/models", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError(f"the llama_cpp server did not answer within {timeout} s: {self.log()[-2000:]}")

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self._log.close()

    def __enter__(self) -> "LlamaServer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# --- the fake ----------------------------------------------------------------------------------------


def sse(obj) -> bytes:
    return b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"


def chunk(content=None, finish=None, usage=None, chat=True, model="fake-model", logprobs=None) -> dict:
    choices = [] if content is None and finish is None else [
        {"index": 0, "delta": ({"content": content} if content is not None else {}), "finish_reason": finish}
        if chat else {"index": 0, "text": content or "", "finish_reason": finish}]
    if logprobs is not None:
        choices[0]["logprobs"] = logprobs
    out = {"id": "chatcmpl-1", "object": "chat.completion.chunk" if chat else "text_completion", "created": 1,
           "model": model, "choices": choices}
    if usage is not None:
        out["usage"] = usage
    return out


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: "FakeServer._Server"

    def log_message(self, *args) -> None:
        pass

    def _json(self, status: int, obj) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        fake = self.server.fake
        if self.path.rstrip("/").endswith("/models"):
            if fake.models is None:
                return self._json(404, {"error": {"message": "no such route"}})
            return self._json(200, {"object": "list", "data": [
                {"id": m, "object": "model", "owned_by": fake.owned_by, "created": 1} for m in fake.models]})
        self._json(404, {"error": {"message": "no such route"}})

    def do_POST(self) -> None:
        fake = self.server.fake
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        fake.requests.append({"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()},
                              "body": body})
        try:
            fake.handle(self, body)
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            fake.closed.append(time.monotonic())
            self.close_connection = True

    # -- building blocks the modes use ---------------------------------------------------------------

    def start_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()  # no length: the body ends when the connection closes

    def write(self, data: bytes) -> None:
        self.wfile.write(data)
        self.wfile.flush()

    def wait_for_close(self, timeout: float = 30.0) -> bool:
        """Wait until the client closes its end (or ``timeout``); True when it did."""
        end = time.monotonic() + timeout
        conn = self.connection
        while time.monotonic() < end and not self.server.stopping.is_set():
            readable, _, _ = select.select([conn], [], [], 0.05)
            if readable:
                try:
                    if conn.recv(1, socket.MSG_PEEK) == b"":
                        return True
                except OSError:
                    return True
        return False


class FakeServer:
    """An OpenAI-compatible server on a thread, doing what ``mode`` says. See the module docstring.

    Modes: ``ok`` (``pieces``, then finish ``stop`` and a usage chunk), ``slow`` (the same, one
    piece every ``delay_s``), ``endless`` (pieces forever), ``pings`` (SSE comments forever),
    ``stall`` (headers, then nothing), ``no_headers`` (nothing at all), ``truncated`` (two pieces,
    then the connection ends), ``malformed`` (a data line that is not JSON), ``status`` (HTTP
    ``status`` with an error body ``error_message``), ``embed`` (answers /embeddings), ``deltas``
    (each of ``deltas`` as a chat delta, as given: tool calls; then finish ``tool_calls``).

    ``logprobs``: None, or a function of (piece's index, piece, chat) giving the ``logprobs`` field that
    piece's chunk carries, sent when the request asked for them; ``refuse_logprobs``: a request that asks
    for them is answered HTTP 400 naming them, as a server without them says.
    """

    class _Server(ThreadingHTTPServer):
        daemon_threads = True
        allow_reuse_address = True

    def __init__(self, *, models=("fake-model",), owned_by: str = "openai"):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.models = list(models) if models is not None else None
        self.owned_by = owned_by
        self.mode = "ok"
        self.pieces = ["Hello", " there", ",", " friend", "."]
        self.usage = {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12,
                      "prompt_tokens_details": {"cached_tokens": 3}}
        self.delay_s = 0.05
        self.deltas: list[dict] = []
        self.logprobs = None
        self.refuse_logprobs = False
        self.status = 500
        self.error_message = "boom"
        self.requests: list[dict] = []
        self.closed: list[float] = []
        self._server = self._Server(("127.0.0.1", self.port), _Handler)
        self._server.fake = self
        self._server.stopping = threading.Event()
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="fake-openai-server", daemon=True)
        self._thread.start()

    def handle(self, h: _Handler, body: dict) -> None:
        chat = h.path.rstrip("/").endswith("/chat/completions")
        mode = self.mode
        if h.path.rstrip("/").endswith("/embeddings"):
            texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
            data = [{"object": "embedding", "index": i, "embedding": [float(len(t)), 3.0, 4.0]}
                    for i, t in reversed(list(enumerate(texts)))]
            return h._json(200, {"object": "list", "data": data, "model": body.get("model"),
                                 "usage": {"prompt_tokens": 1, "total_tokens": 1}})
        if self.refuse_logprobs and body.get("logprobs"):
            return h._json(400, {"error": {"message": "logprobs are not supported by this model", "type": "x"}})
        if mode == "status":
            return h._json(self.status, {"error": {"message": self.error_message, "type": "x", "code": None}})
        if mode == "no_headers":
            h.wait_for_close()
            return
        h.start_stream()
        if mode == "stall":
            h.wait_for_close()
            return
        if mode == "malformed":
            h.write(b"data: {\"choices\": [{\"delta\": {\"content\": \"hi\"\n\n")
            h.write(sse(b"[DONE]"))
            return
        if mode == "pings":
            while not self._server.stopping.is_set():
                h.write(b": ping\n\n")
                time.sleep(0.02)
            return
        if mode == "endless":
            i = 0
            while not self._server.stopping.is_set():
                h.write(sse(chunk(f" w{i}", chat=chat)))
                i += 1
                time.sleep(0.002)
            return
        if mode == "deltas":  # each of ``deltas`` as a chat delta as it stands (tool calls)
            for delta in self.deltas:
                h.write(sse({**chunk(finish=None), "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}))
            h.write(sse(chunk(finish="tool_calls")))
            h.write(sse(b"[DONE]"))
            return
        pieces = self.pieces[:2] if mode == "truncated" else self.pieces
        for i, piece in enumerate(pieces):
            logprobs = self.logprobs(i, piece, chat) if self.logprobs and body.get("logprobs") else None
            h.write(sse(chunk(piece, chat=chat, logprobs=logprobs)))
            if mode == "slow":
                time.sleep(self.delay_s)
        if mode == "truncated":
            return
        h.write(sse(chunk(finish="stop", chat=chat)))
        if self.usage is not None:
            h.write(sse(chunk(usage=self.usage, chat=chat)))
        h.write(sse(b"[DONE]"))

    def close(self) -> None:
        self._server.stopping.set()
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> "FakeServer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

"""A hostile HTTP server for fetch and model-server tests and benchmarks: it breaks HTTP as no
server library would.

Run in its own process (``serve()`` starts it and yields its port), so the
test process holds only the client's threads and sockets and can count them.
It speaks raw sockets on 127.0.0.1, one thread per connection, by path:

* ``/continue``: ``HTTP/1.1 100 Continue`` forever, every 2 ms;
* ``/trickle``: a status line and headers, one byte every 50 ms (well inside any per-read timeout, so only a
  limit on the whole fetch ends it);
* ``/silent``: headers announcing 1000 bytes, then nothing;
* ``/body/N``: a 200 with N bytes of body;
* ``/stats``: ``{"open": K, "requests": {path: n}}``, the connections (other than this one) still open
  and the requests read for each path.

And, under a first path segment that names the mode, a hostile OpenAI-compatible model server
(``model_url(port, mode)`` is its base URL, ``.../MODE/v1``):

* ``models-endless``: ``/models`` answers 200 and then ``{"data": [{"id": "aaaa...`` without end, as fast
  as the client reads;
* ``models-trickle``: ``/models`` answers 200 and then one byte of a listing every ``MODELS_TRICKLE_S``
  (each well inside any per-read timeout), never finishing;
* ``usage-huge``, ``usage-big``: ``/models`` lists ``m``; a chat answer is one piece, then a usage chunk
  whose ``prompt_tokens`` is 10**4000 (past any 64-bit integer) or whose ``completion_tokens`` is 2**63
  (past 2**53, the largest count every JSON reader holds exactly);
* ``long-id``: ``/models`` lists one model whose id is ``LONG_ID_CHARS`` characters; chat answers as above,
  with honest usage;
* ``key-echo``: every POST is HTTP 401 whose message is ``KEY_ECHO_PAD`` characters and then the bearer key
  the request carried (a server that quotes the key back, after enough text that a message clipped first
  and scrubbed after keeps most of it); ``key-echo-part``: the same with the key's first 20 characters only.
* ``logprobs-flood``: a chat answer whose first chunk carries ``LOGPROBS_FLOOD`` token records (one SSE event of
  68 MB, inside the body's bound for 8192 tokens); ``logprobs-gzip``: the same answer gzipped
  (``Content-Encoding: gzip``, 0.2 MB on the wire) whatever the request accepts; ``logprobs-many``: each of
  its pieces carries ``LOGPROBS_MANY`` records, one event well under 1 MiB each.
* any other mode: an honest server (``m`` listed, one piece, honest usage), for baselines.

Every hostile answer stops as soon as the client closes or shuts down its
side, and ``/stats`` then no longer counts it: the server's view of whether
the client let go of the connection.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
from typing import Iterator

MODELS_TRICKLE_S = 0.5
LONG_ID_CHARS = 500_000
KEY_ECHO_PAD = 180
LOGPROBS_FLOOD = 10 ** 6
LOGPROBS_MANY = 5_000

SOURCE = r'''
import functools, gzip, json, select, socket, sys, threading, time
TRICKLE_S = 0.05
MODELS_TRICKLE_S, LONG_ID_CHARS, KEY_ECHO_PAD = float(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
LOGPROBS_FLOOD, LOGPROBS_MANY = int(sys.argv[4]), int(sys.argv[5])

open_connections = 0
requests = {}  # path -> requests read for it
lock = threading.Lock()


def closed(conn, wait):
    """Wait up to ``wait`` s; True once the client has closed (or shut down) its side."""
    ready, _, _ = select.select([conn], [], [], wait)
    if not ready:
        return False
    try:
        return conn.recv(4096) == b""
    except OSError:
        return True


def answer_json(conn, status, obj):
    body = json.dumps(obj).encode()
    conn.sendall(b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                 b"Connection: close\r\n\r\n" % (status, len(body)) + body)


def sse_answer(conn, usage):
    """One streamed chat answer: a piece, the finish, the usage chunk, [DONE]."""
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
    base = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    for chunk in ({**base, "choices": [{"index": 0, "delta": {"content": "hello"}, "finish_reason": None}]},
                  {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
                  {**base, "choices": [], "usage": usage}):
        conn.sendall(b"data: " + json.dumps(chunk).encode() + b"\n\n")
    conn.sendall(b"data: [DONE]\n\n")


RECORD = b'{"token": "a", "logprob": -0.5, "bytes": [97], "top_logprobs": []}'
CHUNK = b'{"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [{"index": 0, '


def records_event(piece, n):
    """One SSE event: a chat chunk of ``piece`` whose logprobs carry ``n`` records."""
    return (b"data: " + CHUNK + b'"delta": {"content": "' + piece + b'"}, "finish_reason": null, "logprobs": '
            b'{"content": [' + b", ".join([RECORD] * n) + b"]}}]}\n\n")


@functools.lru_cache(maxsize=2)
def flood_body(gzipped):
    """The ``logprobs-flood`` answer's body (made once): one piece carrying ``LOGPROBS_FLOOD`` records, the
    finish, the usage, [DONE]."""
    body = (records_event(b"hello", LOGPROBS_FLOOD)
            + b'data: ' + CHUNK + b'"delta": {}, "finish_reason": "stop"}]}\n\n'
            + b'data: {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [], '
              b'"usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}\n\n'
            + b"data: [DONE]\n\n")
    return gzip.compress(body, 6) if gzipped else body


def model_server(conn, mode, rest, headers):
    """The hostile OpenAI-compatible modes (see the module docstring)."""
    if rest == "/v1/models":
        if mode == "models-endless":
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n"
                         b'{"object": "list", "data": [{"id": "')
            block = b"a" * 65536
            while True:
                conn.sendall(block)
        if mode == "models-trickle":
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n")
            for byte in b'{"object": "list", "data": [' + b" " * 10**6:
                if closed(conn, MODELS_TRICKLE_S):
                    return
                conn.sendall(bytes([byte]))
            return
        model = "m" * LONG_ID_CHARS if mode == "long-id" else "m"
        return answer_json(conn, 200, {"object": "list", "data": [{"id": model, "object": "model",
                                                                    "owned_by": "someone", "created": 1}]})
    if mode.startswith("key-echo"):
        key = headers.get("authorization", "").removeprefix("Bearer ")
        key = key[:20] if mode == "key-echo-part" else key
        return answer_json(conn, 401, {"error": {"message": "x" * KEY_ECHO_PAD + " " + key}})
    if mode in ("logprobs-flood", "logprobs-gzip"):
        gzipped = mode == "logprobs-gzip"
        body = flood_body(gzipped)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n"
                     + (b"Content-Encoding: gzip\r\n" if gzipped else b"") + b"\r\n")
        for at in range(0, len(body), 1 << 16):
            conn.sendall(body[at:at + (1 << 16)])
        return
    if mode == "logprobs-many":
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
        for piece in (b"hel", b"lo"):
            conn.sendall(records_event(piece, LOGPROBS_MANY))
        conn.sendall(b'data: ' + CHUNK + b'"delta": {}, "finish_reason": "stop"}]}\n\n' + b"data: [DONE]\n\n")
        return
    usage = {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
    if mode == "usage-huge":
        usage["prompt_tokens"] = 10 ** 4000
    elif mode == "usage-big":
        usage["completion_tokens"] = 2 ** 63
    sse_answer(conn, usage)


def serve(conn):
    global open_connections
    try:
        request = b""
        while b"\r\n\r\n" not in request:
            data = conn.recv(4096)
            if not data:
                return
            request += data
        head, body = request.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        path = lines[0].split(" ", 2)[1]
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        length = int(headers.get("content-length") or 0)
        while len(body) < length:  # read the whole request, so closing never resets the answer away
            data = conn.recv(65536)
            if not data:
                return
            body += data
        with lock:
            requests[path] = requests.get(path, 0) + 1
        mode, _, rest = path[1:].partition("/")
        if "/" + rest in ("/v1/models", "/v1/chat/completions", "/v1/completions", "/v1/embeddings"):
            model_server(conn, mode, "/" + rest, headers)
            closed(conn, 30)
        elif path == "/stats":
            with lock:
                body = json.dumps({"open": open_connections - 1, "requests": requests}).encode()
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body)
                         + body)
        elif path.startswith("/body/"):
            size = int(path.rsplit("/", 1)[1])
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
                         b"Content-Length: %d\r\n\r\n" % size)
            block = b"z" * 65536
            left = size
            while left:
                n = min(left, len(block))
                conn.sendall(block[:n])
                left -= n
            closed(conn, 30)
        elif path == "/continue":
            while not closed(conn, 0.002):
                conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        elif path == "/trickle":
            for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello" * 100:
                if closed(conn, TRICKLE_S):
                    break
                conn.sendall(bytes([byte]))
        elif path == "/silent":
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
            closed(conn, 600)
    except OSError:
        pass
    finally:
        conn.close()
        with lock:
            open_connections -= 1


listener = socket.socket()
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind(("127.0.0.1", 0))
listener.listen(256)
print(listener.getsockname()[1], flush=True)
while True:
    conn, _ = listener.accept()
    with lock:
        open_connections += 1
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
'''


@contextlib.contextmanager
def serve() -> Iterator[int]:
    """Start the server in a child process; yield its port; kill it on exit."""
    proc = subprocess.Popen([sys.executable, "-c", SOURCE, str(MODELS_TRICKLE_S), str(LONG_ID_CHARS),
                             str(KEY_ECHO_PAD), str(LOGPROBS_FLOOD), str(LOGPROBS_MANY)], stdout=subprocess.PIPE,
                            text=True)
    try:
        yield int(proc.stdout.readline())
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()


def url(port: int, path: str) -> str:
    return f"http://127.0.0.1:{port}{path}"


def model_url(port: int, mode: str) -> str:
    """The base URL of the hostile model server ``mode`` (see the module docstring)."""
    return f"http://127.0.0.1:{port}/{mode}/v1"


def stats(port: int) -> dict:
    """The server's ``/stats``: the connections it still holds open (not counting the one asking) and
    the requests it has read, by path."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"GET /stats HTTP/1.1\r\nHost: x\r\n\r\n")
        data = b""
        while chunk := s.recv(4096):
            data += chunk
    return json.loads(data.split(b"\r\n\r\n", 1)[1])


def open_connections(port: int) -> int:
    """How many connections the server still holds open (not counting the one asking)."""
    return stats(port)["open"]


def requests_for(port: int, path: str) -> int:
    """How many requests for ``path`` the server has read."""
    return stats(port)["requests"].get(path, 0)

"""A hostile HTTP server for fetch tests and benchmarks: it breaks HTTP as no server library would.

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

SOURCE = r'''
import json, select, socket, sys, threading, time
TRICKLE_S = 0.05

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


def serve(conn):
    global open_connections
    try:
        request = b""
        while b"\r\n\r\n" not in request:
            data = conn.recv(4096)
            if not data:
                return
            request += data
        path = request.split(b" ", 2)[1].decode()
        with lock:
            requests[path] = requests.get(path, 0) + 1
        if path == "/stats":
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
listener.listen(64)
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
    proc = subprocess.Popen([sys.executable, "-c", SOURCE], stdout=subprocess.PIPE, text=True)
    try:
        yield int(proc.stdout.readline())
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()


def url(port: int, path: str) -> str:
    return f"http://127.0.0.1:{port}{path}"


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

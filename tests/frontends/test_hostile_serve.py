"""``tensorjob serve`` against hostile clients (issue 31), the command in its own process.

Clients that never finish their headers, uploads that stall just short of their end, a ``Host`` that
starts like a loopback name, fields the server would otherwise ignore, and an ``/embeddings`` request
whose client hangs up while its texts take the model for a minute. Whatever they do:

* at most ``MAX_CONNECTIONS`` connections are held at once, and none past ``--header-timeout`` /
  ``--body-timeout``; stalled uploads hold at most ``MAX_PENDING_BODY_BYTES`` of the server's memory;
* ``Host: localhost:evil`` is not a loopback name; ``logprobs`` are answered within bounds and ``logit_bias`` is refused;
* an abandoned embed stops (the server goes idle), an innocent chat behind it is served between its
  pieces, and an embed past the engine's token budget is refused at once.

The connection cases run on a tiny random-weight model (it loads in milliseconds); the embedding case
on the embedded SmolLM2, where texts of 1,500 words cost the model real time.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request

import psutil
import pytest

from served_support import TensorjobServe, wait_until

pytestmark = pytest.mark.slow
pytest.importorskip("uvicorn")

from tensorjob_jupyter.serve.server import MAX_BODY_BYTES, MAX_CONNECTIONS, MAX_PENDING_BODY_BYTES  # noqa: E402


class Serve(TensorjobServe):
    """``tensorjob serve`` in a subprocess, with what it holds: descriptors, resident memory, CPU time."""

    def __init__(self, *args: str):
        super().__init__(*args)
        self.ps = psutil.Process(self.process.pid)

    def fds(self) -> int:
        return self.ps.num_fds()

    def rss(self) -> int:
        return self.ps.memory_info().rss

    def cpu_s(self) -> float:
        t = self.ps.cpu_times()
        return t.user + t.system


@pytest.fixture(scope="module")
def tiny_serve(tmp_path_factory):
    from llama_support import write_tiny_gguf

    model = write_tiny_gguf(tmp_path_factory.mktemp("tiny") / "tiny.gguf")
    s = Serve("--model", str(model), "--header-timeout", "3", "--body-timeout", "3")
    yield s
    s.close()


def connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    return sock


def request(url: str, path: str, body: dict | None = None, headers: dict | None = None, timeout: float = 120):
    """(status, parsed body) of one request."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url + path, data=data, method="POST" if data is not None else "GET",
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def closed_by_server(sock: socket.socket, timeout: float) -> bool:
    sock.settimeout(timeout)
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False


def settles(measure, limit: float, timeout: float) -> bool:
    return bool(wait_until(lambda: measure() <= limit, timeout, 0.1))


# --- connections ----------------------------------------------------------------------------------------


def test_half_sent_headers_are_capped_and_dropped_at_the_header_deadline(tiny_serve):
    baseline = tiny_serve.fds()
    socks = []
    for _ in range(400):
        sock = connect(tiny_serve.port)
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-")
        socks.append(sock)
    try:
        # past the cap, the server closes a connection as soon as it accepts it: within a moment, well before
        # the 3 s header deadline closes the rest (the accept loop may still be catching up as the last connect
        # returns)
        held = lambda: tiny_serve.fds() - baseline  # noqa: E731
        assert settles(held, MAX_CONNECTIONS + 8, 2.0), f"{held()} connections held"
        # every one is closed by the server: past the cap at once, the others at the header deadline (3 s)
        end = time.monotonic() + 15
        still_open = [s for s in socks if not closed_by_server(s, max(0.01, end - time.monotonic()))]
        assert not still_open, f"{len(still_open)} of 400 half-sent requests still held after 15 s"
        assert settles(lambda: tiny_serve.fds() - baseline, 8, 5), f"{tiny_serve.fds() - baseline} still held"
        # and it still serves
        assert request(tiny_serve.url, "/models")[0] == 200
    finally:
        for s in socks:
            s.close()


def test_stalled_uploads_hold_a_bounded_amount_of_memory_and_are_dropped_at_the_body_deadline(tiny_serve):
    assert settles(lambda: tiny_serve.fds(), tiny_serve.fds(), 1)
    rss_before = tiny_serve.rss()
    size = MAX_BODY_BYTES  # a whole 4 MiB body, all but its last byte
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {size}\r\n\r\n").encode()
    body = b" " * (size - 1)
    socks: list[socket.socket] = []
    lock = threading.Lock()

    def stall() -> None:
        sock = connect(tiny_serve.port)
        with lock:
            socks.append(sock)
        try:
            sock.settimeout(10)
            sock.sendall(head + body)
        except OSError:
            pass  # the server stopped reading it (refused, or its buffers are full): as meant

    senders = [threading.Thread(target=stall) for _ in range(100)]
    for t in senders:
        t.start()
    for t in senders:
        t.join(30)
    peak = tiny_serve.rss() - rss_before
    try:
        assert peak < MAX_PENDING_BODY_BYTES + (64 << 20), f"the server grew {peak >> 20} MiB"
        assert all(closed_by_server(s, 6) for s in socks), "an upload outlived --body-timeout"
        assert request(tiny_serve.url, "/models")[0] == 200
    finally:
        for s in socks:
            s.close()


def test_the_host_check_and_unhonoured_fields(tiny_serve):
    for host, status in (("127.0.0.1", 200), ("localhost:8000", 200), ("localhost:evil", 403), ("[::1]:1x", 403)):
        assert request(tiny_serve.url, "/models", headers={"Host": host})[0] == status, host
    chat = {"messages": [{"role": "user", "content": "the cat"}], "max_tokens": 2}
    assert request(tiny_serve.url, "/chat/completions", chat)[0] == 200
    status, answer = request(tiny_serve.url, "/chat/completions", {**chat, "logprobs": True, "top_logprobs": 2})
    assert status == 200 and answer["choices"][0]["logprobs"]["content"], answer
    for extra in ({"top_logprobs": 2}, {"logprobs": True, "top_logprobs": 21}, {"logprobs": "yes"},
                  {"logit_bias": {"3": 100}}):
        status, answer = request(tiny_serve.url, "/chat/completions", {**chat, **extra})
        named = "logprobs" if "logprobs" in str(extra) else "logit_bias"
        assert status == 400 and named in answer["error"]["message"], answer


# --- an abandoned embed -----------------------------------------------------------------------------------


WORDS_1500 = " ".join(f"lighthouse{i % 97} keeper watched the sea" for i in range(300))


@pytest.fixture(scope="module")
def smollm_serve():
    s = Serve("--threads", "1")
    yield s
    s.close()


def abandoned_embed(port: int, texts: list[str], after_s: float) -> None:
    body = json.dumps({"input": texts}).encode()
    sock = connect(port)
    sock.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(body) + body)
    time.sleep(after_s)
    sock.close()


def test_an_abandoned_embed_stops_and_an_innocent_chat_is_served_between_its_pieces(smollm_serve):
    chat = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4}
    assert request(smollm_serve.url, "/chat/completions", chat)[0] == 200  # warm
    started = time.monotonic()
    request(smollm_serve.url, "/chat/completions", chat)
    alone = time.monotonic() - started
    abandoned_embed(smollm_serve.port, [WORDS_1500] * 8, 0.3)  # about 16,000 tokens: a minute of the model
    started = time.monotonic()
    status, _ = request(smollm_serve.url, "/chat/completions", chat)
    waited = time.monotonic() - started
    assert status == 200
    assert waited < 20 + 2 * alone, f"the chat waited {waited:.1f} s (alone: {alone:.1f} s)"
    # the embed stopped: the server goes idle (its worker is not still decoding the texts of nobody)

    def busy() -> float:
        cpu = smollm_serve.cpu_s()
        time.sleep(1.0)
        return smollm_serve.cpu_s() - cpu

    assert wait_until(lambda: busy() < 0.3, 20), "the server is still working for a client that left"


def test_an_embed_past_the_token_budget_is_refused_at_once(smollm_serve):
    started = time.monotonic()
    status, answer = request(smollm_serve.url, "/embeddings", {"input": [WORDS_1500] * 32})
    assert status == 400 and "EMBED_MAX_TOKENS" in answer["error"]["message"], answer
    assert time.monotonic() - started < 10
    status, answer = request(smollm_serve.url, "/embeddings", {"input": ["a lighthouse"]})
    assert status == 200 and len(answer["data"]) == 1

"""The sources of a job that fetched (issue 53, item 8), end to end against a local server.

A URL that answers a different body each time it is fetched must not let the two bodies be spliced by offset
into a value served in neither; and a body that repeats the URL the guest asked for (``Place.url_texts``) grounds
nothing the guest wrote there.
"""

from __future__ import annotations

import http.server
import threading
import urllib.parse

import pytest

import tensorjob_jupyter as tj
import wat

FIRST, SECOND = b"ACME Co", b"Total: rp 99"  # byte 7 of SECOND is where FIRST ends


class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):  # quiet
        pass

    def do_GET(self):
        path, _, query = self.path.partition("?")
        if path == "/data/flip":  # another body on every request
            with self.server.lock:
                body = (FIRST, SECOND)[self.server.flips % 2]
                self.server.flips += 1
        elif path == "/data/echo":  # repeats its query, as a search page does
            q = urllib.parse.parse_qs(query).get("q", [""])[0]
            body = f"results for {q}: none".encode()
        else:
            body = b""
        self.send_response(200 if body else 404)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, *args):
        super().__init__(*args)
        self.lock = threading.Lock()
        self.flips = 0


@pytest.fixture
def server():
    srv = Server(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def run(base: str, commands: list, result) -> tj.Job:
    job = tj.Job(wat.script_guest(commands + [{"cmd": "done", "result": result}]), backend=None,
                 fetch=[base + "/data"]).start()
    job.wait(60)
    assert job.envelope.ok, job.envelope
    return job


def test_two_fetches_of_one_url_are_not_spliced_into_a_value_neither_served(server):
    url = server + "/data/flip"
    job = run(server, [{"cmd": "fetch", "url": url}, {"cmd": "slice", "handle": 0, "offset": 0, "len": 100},
                       {"cmd": "fetch", "url": url}, {"cmd": "slice", "handle": 1, "offset": 7, "len": 100}],
              {"name": "ACME Corp", "a": "ACME Co", "b": "rp 99"})
    sources = job.envelope.sources
    assert sources["name"] == []  # "ACME Co" + "rp 99" at byte 7 was never one body
    assert [(s["url"], s["start"], s["end"]) for s in sources["a"]] == [(url, 0, 7)]
    assert [(s["url"], s["start"], s["end"]) for s in sources["b"]] == [(url, 7, 12)]


def test_an_echoing_endpoint_does_not_ground_what_the_guest_put_in_its_url(server):
    url = server + "/data/echo?q=ACME%20Corp"
    job = run(server, [{"cmd": "fetch", "url": url}, {"cmd": "slice", "handle": 0, "offset": 0, "len": 100}],
              {"name": "ACME Corp", "said": "results for"})
    sources = job.envelope.sources
    assert [(s["url"], s["start"]) for s in sources["said"]] == [(url, 0)]  # the page's own words are found
    assert sources["name"] == []  # ... but not the guest's, repeated back

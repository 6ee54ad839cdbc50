"""``fetch``: URL grants compared by component, and downloads from a local server the test starts.

Nothing here reaches the internet: every download is from an ``http.server``
on 127.0.0.1 run by the test module, and hosts that cannot be served
(``example.org.evil``) are tested against the grant matcher directly -- a
denied URL is refused before any connection is made. Hypothesis checks the
matcher against an independent parser (``urllib.parse``): whatever the URL,
an allowed one has the grant's scheme, host and port and lies under its path.
"""

from __future__ import annotations

import gzip
import http.server
import threading
import time
import urllib.parse

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pdfgen
import tensorjob_jupyter as tj
import wat
from tensorjob_jupyter.abi import codes
from tensorjob_jupyter.world.fetch import DEFAULT_PORTS, FetchGrants, parse_url

DONE = {"cmd": "done", "result": "finished"}

# --- the matcher -------------------------------------------------------------------------------------

GRANT = "https://example.org/docs"

ALLOWED = ["https://example.org/docs", "https://example.org/docs/", "https://example.org/docs/a/b.pdf?x=1#top",
           "https://EXAMPLE.ORG/docs/a", "HTTPS://example.org/docs", "https://example.org:443/docs/a",
           "https://example.org/docs/%61", "https://example.org/%64ocs/a"]

DENIED = {
    "https://example.org.evil/docs": "a longer host",
    "https://evil-example.org/docs": "a host with the same ending",
    "https://example.org@evil.com/docs": "credentials naming the granted host",
    "https://user:pw@example.org/docs": "credentials",
    "https://evil.com/example.org/docs": "the granted host in the path",
    "https://evil.com/?https://example.org/docs": "the grant in the query",
    "https://example.org/docs-secret": "a sibling path with the same prefix",
    "https://example.org/docsx/a": "a longer first segment",
    "https://example.org/Docs/a": "a segment in another case",
    "https://example.org/": "the parent path",
    "https://example.org/doc": "a shorter path",
    "http://example.org/docs": "another scheme",
    "https://example.org:8443/docs": "another port",
    "https://example.org:80/docs": "the other scheme's port",
    "https://example.org./docs": "a trailing dot",
    "https://example.org/docs/../secret": "a dot-dot segment",
    "https://example.org/docs/./a": "a dot segment",
    "https://example.org/docs/%2e%2e/secret": "an encoded dot-dot segment",
    "https://example.org/docs/%2E%2e%2Fsecret": "an encoded slash",
    "https://example.org/docs%2f..%2fsecret": "encoded slashes",
    "https://example.org/docs/%5c../secret": "an encoded backslash",
    "https://example.org/docs\\..\\secret": "backslashes",
    "https://example.org/docs/a b": "a space",
    "https://example.org/docs/\ta": "a tab",
    "https://example.org/docs/\x00": "a NUL",
    "file:///etc/passwd": "a file URL",
    "ftp://example.org/docs": "ftp",
    "javascript:alert(1)": "javascript",
    "data:text/plain,hi": "a data URL",
    "//example.org/docs": "a scheme-relative URL",
    "https:example.org/docs": "no slashes",
    "https:/example.org/docs": "one slash",
    "": "nothing",
    "https://": "no host",
    "https://[::1]/docs": "an IPv6 host",
    "https://xn--exmple-cua.org/docs": "a punycode lookalike",
    "https://exämple.org/docs": "a Unicode lookalike",
}


@pytest.mark.parametrize("url", ALLOWED)
def test_urls_under_the_grant_are_allowed(url):
    assert FetchGrants.parse([GRANT]).allows(url)


@pytest.mark.parametrize("url,why", DENIED.items(), ids=list(DENIED.values()))
def test_urls_outside_the_grant_are_denied(url, why):
    grants = FetchGrants.parse([GRANT])
    assert not grants.allows(url)
    with pytest.raises(Exception) as info:
        grants.check(url)
    assert info.value.code == codes.CAPABILITY_DENIED and "fetch not permitted" in info.value.message


def test_prefix_confusion_host_against_a_host_grant():
    grants = FetchGrants.parse(["https://example.org/"])
    assert grants.allows("https://example.org/anything/at/all")
    for url in ["https://example.org.evil/", "https://example.org.evil/x", "https://example.orgx/",
                "https://sub.example.org/", "https://example.org:444/"]:
        assert not grants.allows(url), url


def test_no_grants_deny_everything_and_several_grants_each_count():
    assert not FetchGrants.parse([]).allows("https://example.org/")
    grants = FetchGrants.parse(["https://a.example/x", "http://127.0.0.1:8000/"])
    assert grants.allows("https://a.example/x/1") and grants.allows("http://127.0.0.1:8000/y")
    assert not grants.allows("https://a.example/y") and not grants.allows("http://127.0.0.1:8001/y")


def test_a_unicode_host_grant_is_compared_as_the_client_sends_it():
    grants = FetchGrants.parse(["https://bücher.de/"])
    assert grants.allows("https://xn--bcher-kva.de/a") and grants.allows("https://BÜCHER.de/a")


@pytest.mark.parametrize("prefix", ["example.org", "ftp://example.org/", "https://example.org/?q=1",
                                    "https://example.org/#frag", "https://u@example.org/", "https://example.org/../x",
                                    "https://", ""])
def test_a_bad_grant_is_a_clear_error(prefix):
    with pytest.raises(ValueError, match="fetch grant"):
        FetchGrants.parse([prefix])


# --- the matcher, by property --------------------------------------------------------------------------

labels = st.sampled_from(["example", "org", "evil", "a", "EXAMPLE", "com", "127", "0", "1", "xn--bcher-kva", "e-x"])
hosts = st.lists(labels, min_size=1, max_size=4).map(".".join)
segments = st.sampled_from(["docs", "a", "docs-secret", "Docs", "%64ocs", "%2e", "..", ".", "x%20y", "é", ";p", "@",
                            ":", "", "%", "%zz", "?", "#", "data", "~u", "a=b"])
ports = st.sampled_from([None, 80, 443, 8080, 0, 65535])
schemes = st.sampled_from(["http", "https", "HTTP", "ftp", "file", ""])
url_chars = st.sampled_from(list("abcdehlmorstwxyz0123456789.:/@?#%[]\\-_~!$&'()*+,;=Eé ") + ["%2e", "%2f", "//"])


def build(scheme, userinfo, host, port, path):
    netloc = (userinfo + "@" if userinfo else "") + host + (f":{port}" if port is not None else "")
    return f"{scheme}://{netloc}/" + "/".join(path)


grants_st = st.builds(lambda s, h, p, path: build(s, "", h, p, path), st.sampled_from(["http", "https"]), hosts,
                      ports.filter(lambda p: p not in (0,)), st.lists(st.sampled_from(["docs", "a", "data", "x"]),
                                                                      max_size=3))
urls_st = st.one_of(
    st.builds(build, schemes, st.sampled_from(["", "u", "example.org", "u:p"]), hosts, ports,
              st.lists(segments, max_size=5)),
    st.lists(url_chars, max_size=40).map("".join),
    st.builds(lambda s, t: s + t, st.sampled_from(["http://", "https://", "https://example.org", "http://a/"]),
              st.lists(url_chars, max_size=30).map("".join)),
)


def oracle_admits(grant: str, url: str) -> bool:
    """An independent reading (urllib.parse) of 'url lies under grant'."""
    g, u = urllib.parse.urlsplit(grant), urllib.parse.urlsplit(url)
    if u.scheme.lower() != g.scheme.lower() or u.username is not None or u.password is not None:
        return False
    try:
        g_port = g.port or DEFAULT_PORTS[g.scheme.lower()]
        u_port = u.port or DEFAULT_PORTS[u.scheme.lower()]
    except (ValueError, KeyError):
        return False
    if (u.hostname or "") != (g.hostname or "") or u_port != g_port:
        return False
    g_segments = [urllib.parse.unquote(s) for s in g.path.split("/")[1:]]
    u_segments = [urllib.parse.unquote(s) for s in u.path.split("/")[1:]]
    if g_segments and g_segments[-1] == "":
        g_segments.pop()
    if any(s in (".", "..") or "/" in s or "\\" in s for s in u_segments):
        return False
    return u_segments[:len(g_segments)] == g_segments


@pytest.mark.slow
@given(grant=grants_st, url=urls_st)
@settings(max_examples=3000)
def test_an_allowed_url_always_lies_under_its_grant(grant, url):
    grants = FetchGrants.parse([grant])
    if grants.allows(url):
        assert oracle_admits(grant, url), (grant, url)
        target = parse_url(url)
        sent = target.url  # exactly what the client requests
        assert sent.scheme in ("http", "https") and not sent.userinfo
        assert sent.raw_host.decode().lower() == urllib.parse.urlsplit(grant).hostname


@given(grant=grants_st, extra=st.lists(st.sampled_from(["a", "b.pdf", "x%20y", "é", "docs"]), max_size=4),
       query=st.sampled_from(["", "?q=1", "#f", "?a=b#c"]))
@settings(max_examples=500)
def test_every_url_under_a_grant_is_allowed(grant, extra, query):
    url = grant.rstrip("/") + "".join("/" + e for e in extra) + query
    assert FetchGrants.parse([grant]).allows(url), url


@given(grant=grants_st, suffix=st.sampled_from([".evil", "x", "-1", ".", ":1", "@evil", "%2e"]))
@settings(max_examples=500)
def test_a_host_with_something_appended_is_never_allowed(grant, suffix):
    parts = urllib.parse.urlsplit(grant)
    url = urllib.parse.urlunsplit((parts.scheme, parts.hostname + suffix + (f":{parts.port}" if parts.port else ""),
                                   parts.path, "", ""))
    assert not FetchGrants.parse([grant]).allows(url), url


# --- downloads from a local server ------------------------------------------------------------------------

STOP = threading.Event()
HELLO = b"hello from the test server\n"
SAMPLE = pdfgen.text_pdf()
BOMB = gzip.compress(b"\0" * (40 * 1024 * 1024), 9)


class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):  # quiet
        pass

    def _send(self, status, body=b"", headers=()):
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        if not any(k.lower() == "content-length" for k, _ in headers):
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):  # noqa: C901 - one route table
        port = self.server.server_address[1]
        other = self.server.other_port
        path = self.path
        try:
            if path == "/data/hello.txt":
                self._send(200, HELLO, [("Content-Type", "text/plain")])
            elif path == "/data/sample.pdf":
                self._send(200, SAMPLE, [("Content-Type", "application/pdf")])
            elif path == "/data/to-hello":
                self._send(302, headers=[("Location", "/data/hello.txt")])
            elif path == "/data/to-secret":
                self._send(302, headers=[("Location", "/secret/x")])
            elif path == "/data/to-dotdot":
                self._send(302, headers=[("Location", "/data/../secret/x")])
            elif path == "/data/to-other-port":
                self._send(302, headers=[("Location", f"http://127.0.0.1:{other}/data/hello.txt")])
            elif path == "/data/to-evil":
                self._send(301, headers=[("Location", "http://example.org.evil/data/hello.txt")])
            elif path == "/data/to-file":
                self._send(307, headers=[("Location", "file:///etc/passwd")])
            elif path == "/data/loop":
                self._send(302, headers=[("Location", f"http://127.0.0.1:{port}/data/loop")])
            elif path == "/data/missing":
                self._send(404, b"nope")
            elif path == "/data/slow":
                self.send_response(200)
                self.send_header("Content-Length", "10")
                self.end_headers()
                self.wfile.flush()
                STOP.wait(30)
            elif path == "/data/trickle":
                self.send_response(200)
                self.end_headers()
                while not STOP.is_set():
                    self.wfile.write(b"x")
                    self.wfile.flush()
                    time.sleep(0.05)
            elif path == "/data/endless":
                self.send_response(200)
                self.end_headers()
                block = b"y" * 65536
                while not STOP.is_set():
                    self.wfile.write(block)
            elif path == "/data/huge-length":
                self._send(200, b"tiny", [("Content-Length", str(10**12))])
            elif path == "/data/gzip-bomb":
                self._send(200, BOMB, [("Content-Encoding", "gzip"), ("Content-Type", "text/plain")])
            elif path == "/data/gzip-hello":
                self._send(200, gzip.compress(HELLO), [("Content-Encoding", "gzip")])
            elif path == "/data/brotli":
                self._send(200, b"????", [("Content-Encoding", "br")])
            elif path == "/secret/x":
                self.server.secret_hits += 1
                self._send(200, b"the secret")
            else:
                self._send(404, b"no route")
        except (BrokenPipeError, ConnectionResetError):
            pass


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    secret_hits = 0
    other_port = 0


@pytest.fixture(scope="module")
def server():
    STOP.clear()
    srv = Server(("127.0.0.1", 0), Handler)
    other = Server(("127.0.0.1", 0), Handler)
    srv.other_port = other.server_address[1]
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in (srv, other)]
    for t in threads:
        t.start()
    yield srv
    STOP.set()
    for s in (srv, other):
        s.shutdown()
        s.server_close()


def base(server) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}"


def fetch_job(server, paths, *, grant="/data", extra=(), **kwargs):
    commands = [{"cmd": "fetch", "url": p if p.startswith(("http", "ftp", "file")) else base(server) + p}
                for p in paths] + list(extra) + [DONE]
    kwargs.setdefault("backend", None)
    kwargs.setdefault("fetch", [base(server) + grant] if grant is not None else [])
    job = tj.Job(wat.script_guest(commands), **kwargs).start()
    job.wait(60)
    return job


def fetches(job):
    return [e for e in job.events if e["type"] == "job.fetch"]


def test_fetch_answers_opened_like_open_and_the_handle_slices(server):
    job = fetch_job(server, ["/data/hello.txt"], extra=[{"cmd": "slice", "handle": 0, "offset": 0, "len": 100}])
    assert job.envelope.ok, job.envelope
    [ev] = fetches(job)
    assert (ev["handle"], ev["len"], ev["kind"], ev["status"], ev["redirects"]) == (0, len(HELLO), {"kind": "text"},
                                                                                   200, 0)
    assert ev["url"] == ev["final_url"] == base(server) + "/data/hello.txt" and ev["content_type"] == "text/plain"
    sliced = next(e for e in job.events if e["type"] == "job.file.sliced")
    assert sliced["preview"] == HELLO.decode()
    assert job.stats.files_opened == 1


def test_a_fetched_pdf_is_a_document(server):
    job = fetch_job(server, ["/data/sample.pdf"], extra=[{"cmd": "page_text", "handle": 0, "page": 1}])
    assert job.envelope.ok, job.envelope
    assert fetches(job)[0]["kind"] == {"kind": "document", "pages": 3, "has_text_layer": True}
    page = next(e for e in job.events if e["type"] == "job.document.page")
    assert page["preview"].startswith("Beta page one")


def test_fetch_without_a_grant_is_denied_before_connecting(server):
    before = server.secret_hits
    job = fetch_job(server, ["/secret/x"], grant=None)
    err = job.envelope.error
    assert err.code == codes.CAPABILITY_DENIED and "the job grants no URLs" in err.message and "--fetch" in err.message
    job = fetch_job(server, ["/secret/x"])
    assert job.envelope.error.code == codes.CAPABILITY_DENIED and "no grant covers it" in job.envelope.error.message
    assert server.secret_hits == before


def test_a_sibling_path_and_another_port_are_denied(server):
    job = fetch_job(server, ["/data-secret/x"])
    assert job.envelope.error.code == codes.CAPABILITY_DENIED
    job = fetch_job(server, [f"http://127.0.0.1:{server.other_port}/data/hello.txt"])
    assert job.envelope.error.code == codes.CAPABILITY_DENIED


def test_a_redirect_inside_the_grant_is_followed(server):
    job = fetch_job(server, ["/data/to-hello"])
    assert job.envelope.ok
    [ev] = fetches(job)
    assert ev["redirects"] == 1 and ev["final_url"].endswith("/data/hello.txt") and ev["len"] == len(HELLO)


@pytest.mark.parametrize("path", ["/data/to-secret", "/data/to-other-port", "/data/to-evil", "/data/to-file",
                                  "/data/to-dotdot"])
def test_a_redirect_out_of_the_grant_is_denied(server, path):
    before = server.secret_hits
    job = fetch_job(server, [path])
    err = job.envelope.error
    assert err.code == codes.CAPABILITY_DENIED and "outside the fetch grants" in err.message
    assert server.secret_hits == before


def test_a_redirect_loop_stops_at_max_fetch_redirects(server):
    job = fetch_job(server, ["/data/loop"], limits=tj.Limits(max_fetch_redirects=3))
    err = job.envelope.error
    assert err.code == codes.LIMIT_EXCEEDED and "max_fetch_redirects" in err.message


def test_an_error_status_is_named(server):
    job = fetch_job(server, ["/data/missing"])
    assert job.envelope.error.code == codes.UNSUPPORTED and "answered 404 Not Found" in job.envelope.error.message


def test_a_slow_server_times_out(server, healthy):
    t0 = time.monotonic()
    job = fetch_job(server, ["/data/slow"], limits=tj.Limits(fetch_timeout_s=1.0))
    assert time.monotonic() - t0 < 5
    err = job.envelope.error
    assert err.code == codes.TIMEOUT and "fetch_timeout_s" in err.message


@pytest.mark.slow
def test_a_trickling_server_cannot_stretch_the_time_limit(server):
    t0 = time.monotonic()
    job = fetch_job(server, ["/data/trickle"], limits=tj.Limits(fetch_timeout_s=1.0))
    assert time.monotonic() - t0 < 5
    assert job.envelope.error.code == codes.TIMEOUT


def test_an_endless_body_stops_at_max_fetch_bytes(server, healthy):
    t0 = time.monotonic()
    job = fetch_job(server, ["/data/endless"], limits=tj.Limits(max_fetch_bytes=2 * 1024 * 1024))
    assert time.monotonic() - t0 < 10
    err = job.envelope.error
    assert err.code == codes.LIMIT_EXCEEDED and "max_fetch_bytes" in err.message


def test_an_announced_huge_body_is_refused_at_once(server):
    job = fetch_job(server, ["/data/huge-length"])
    assert job.envelope.error.code == codes.LIMIT_EXCEEDED and "announced" in job.envelope.error.message


def test_a_gzip_bomb_stops_at_the_cap_and_gzip_is_decoded(server):
    job = fetch_job(server, ["/data/gzip-bomb"], limits=tj.Limits(max_fetch_bytes=1024 * 1024))
    assert job.envelope.error.code == codes.LIMIT_EXCEEDED
    job = fetch_job(server, ["/data/gzip-hello"])
    assert job.envelope.ok and fetches(job)[0]["len"] == len(HELLO)
    job = fetch_job(server, ["/data/brotli"])
    assert job.envelope.error.code == codes.UNSUPPORTED and "'br'" in job.envelope.error.message


def test_cancel_during_a_slow_fetch_is_prompt(server):
    job = tj.Job(wat.script_guest([{"cmd": "fetch", "url": base(server) + "/data/slow"}, DONE]), backend=None,
                 fetch=[base(server) + "/data"]).start()
    time.sleep(0.5)
    t0 = time.monotonic()
    job.cancel()
    env = job.wait(10)
    assert time.monotonic() - t0 < 2 and env.status is tj.JobStatus.CANCELLED


def test_fetched_handles_count_against_max_handles(server):
    job = fetch_job(server, ["/data/hello.txt"] * 3, limits=tj.Limits(max_handles=2))
    assert job.envelope.error.code == codes.LIMIT_EXCEEDED and len(fetches(job)) == 2


def test_the_grants_are_in_job_created(server):
    job = fetch_job(server, ["/data/hello.txt"])
    created = job.events[0]
    assert created["type"] == "job.created" and created["fetch"] == [base(server) + "/data"]


def test_a_bad_grant_fails_the_job_constructor():
    with pytest.raises(ValueError, match="only http and https"):
        tj.Job(wat.script_guest([DONE]), backend=None, fetch=["file:///etc"])

"""``fetch``: download a URL the job was granted, as a handle like any opened file.

A guest's ``fetch`` is answered by ``opened``, exactly as ``open`` is, so every command that works
on a handle works on a download unchanged. A grant admits a URL component by component (scheme,
host, port, path segments), never by string prefix, with URLs parsed once by httpx, the client
that sends them. Redirects are checked again, the body is capped (``max_fetch_bytes``, the
handles' ``max_handle_bytes``), the whole fetch is bounded in time, and nothing of the user's
environment is sent. The download runs on a helper thread whose socket the job's thread can shut
down at any moment, so nothing outlives the fetch.

Design: docs/internals/world.md#fetchpy
"""

from __future__ import annotations

import os
import re
import socket
import threading
import time
import urllib.parse
import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable, Iterator

if TYPE_CHECKING:
    import httpx

from tensorjob_jupyter.abi import JobFailure, codes
from tensorjob_jupyter.world.files import anonymous_file
from tensorjob_jupyter.limits import Limits
from tensorjob_jupyter.version import __version__

POLL_S = 0.02
#: How long the job's thread waits for a stopped helper thread to end.
JOIN_S = 2.0
#: The longest one TCP connect attempt may take (under ``JOIN_S``): see ``_Download._send``.
CONNECT_ATTEMPT_S = 1.0
MAX_URL_BYTES = 8192
DEFAULT_PORTS = {"http": 80, "https": 443}
_FORBIDDEN = re.compile(r"[\x00-\x20\x7f\\]")
_DOT_SEGMENT = re.compile(r"^(?:\.|%2e){1,2}$", re.IGNORECASE)
_ENCODED_SEPARATOR = re.compile(r"%(?:2f|5c|00)", re.IGNORECASE)


class FetchError(JobFailure):
    """A fetch the job may not or cannot make; ``code`` is the envelope code."""


def _denied(url: str, why: str) -> FetchError:
    return FetchError(codes.CAPABILITY_DENIED,
                      f"fetch not permitted: {url[:300]} ({why}); grant a prefix with --fetch PREFIX "
                      f"(fetch=[...] in Python)")


@dataclass(frozen=True)
class Target:
    """A URL reduced to what a grant compares: scheme, host, port, path segments."""

    scheme: str
    host: str
    port: int
    segments: tuple[str, ...]
    url: httpx.URL


def parse_url(text: str) -> Target:
    """Parse and vet a URL; ``ValueError`` names what is wrong with it."""
    if not isinstance(text, str) or not text:
        raise ValueError("not a URL")
    if len(text.encode("utf-8", "surrogatepass")) > MAX_URL_BYTES:
        raise ValueError(f"longer than {MAX_URL_BYTES} bytes")
    if _FORBIDDEN.search(text):
        raise ValueError("it contains whitespace, a control character or a backslash")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("it is not valid Unicode") from None
    import httpx  # deferred: httpx and the CLI it brings (rich) are a quarter of a cold start; most jobs never fetch

    try:
        url = httpx.URL(text)
    except Exception as e:  # httpx.InvalidURL, or an IDNA error
        raise ValueError(f"not a valid URL: {e}") from None
    scheme = url.scheme.lower()
    if scheme not in DEFAULT_PORTS:
        raise ValueError(f"only http and https can be fetched, not {scheme or 'a URL without a scheme'}")
    if url.userinfo:
        raise ValueError("URLs with credentials (user@host) are refused")
    try:
        host = url.raw_host.decode("ascii").lower()
    except UnicodeDecodeError:
        raise ValueError("the host is not ASCII after IDNA encoding") from None
    if not host:
        raise ValueError("it has no host")
    port = url.port if url.port is not None else DEFAULT_PORTS[scheme]
    raw_path = url.raw_path.decode("ascii", "replace").split("?", 1)[0]
    # The path as written, too: httpx removes dot segments, and we refuse them.
    written = urllib.parse.urlsplit(text).path
    segments = []
    for piece in (written.split("/"), raw_path.split("/")):
        for segment in piece:
            if _DOT_SEGMENT.match(segment):
                raise ValueError("dot segments (. and ..) are refused")
            if _ENCODED_SEPARATOR.search(segment):
                raise ValueError("encoded slashes, backslashes and NULs are refused")
    for segment in raw_path.split("/")[1:]:
        segments.append(urllib.parse.unquote(segment))
    if segments and segments[-1] == "":
        segments.pop()  # "/docs/" is "/docs"
    return Target(scheme, host, port, tuple(segments), url)


@dataclass(frozen=True)
class FetchGrant:
    prefix: str
    target: Target

    def admits(self, t: Target) -> bool:
        g = self.target
        return (t.scheme == g.scheme and t.host == g.host and t.port == g.port
                and t.segments[:len(g.segments)] == g.segments)


@dataclass(frozen=True)
class FetchGrants:
    """The URL prefixes a job may fetch (empty grants nothing)."""

    grants: tuple[FetchGrant, ...] = ()

    @classmethod
    def parse(cls, prefixes: Iterable[str]) -> "FetchGrants":
        """Grants from prefixes; ``ValueError`` names a prefix that is not a plain http(s) URL."""
        if isinstance(prefixes, str):
            prefixes = [prefixes]
        grants = []
        for prefix in prefixes:
            try:
                target = parse_url(prefix)
            except ValueError as e:
                raise ValueError(f"fetch grant {prefix!r}: {e}") from None
            if target.url.query or target.url.fragment or "?" in prefix or "#" in prefix:
                raise ValueError(f"fetch grant {prefix!r}: a grant is a scheme, host, port and path; "
                                 f"it takes no query or fragment")
            grants.append(FetchGrant(prefix, target))
        return cls(tuple(grants))

    @property
    def prefixes(self) -> list[str]:
        return [g.prefix for g in self.grants]

    def __iter__(self) -> Iterator[str]:
        """The prefixes granted, as given."""
        return (g.prefix for g in self.grants)

    def __len__(self) -> int:
        return len(self.grants)

    def check(self, url: str) -> Target:
        """The parsed URL if a grant admits it, else ``FetchError(capability_denied)``."""
        try:
            target = parse_url(url)
        except ValueError as e:
            raise _denied(url, str(e)) from None
        if not any(g.admits(target) for g in self.grants):
            raise _denied(url, "no grant covers it" if self.grants else "the job grants no URLs")
        return target

    def allows(self, url: str) -> bool:
        try:
            self.check(url)
            return True
        except FetchError:
            return False


# --- the download ------------------------------------------------------------------------


@dataclass
class Fetched:
    fd: int
    final_url: str
    status: int
    content_type: str | None
    redirects: int


class _Download:
    """One fetch, run on a helper thread; the job's thread may stop it at any time."""

    def __init__(self, target: Target, grants: FetchGrants, limits: Limits, deadline: float, room: int | None):
        self.target = target
        self.grants = grants
        self.limits = limits
        self.deadline = deadline
        # The body's cap: max_fetch_bytes, or the room left under max_handle_bytes if smaller.
        self.cap = limits.max_fetch_bytes if room is None else min(limits.max_fetch_bytes, room)
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.conn: socket.socket | None = None  # a duplicate of the live connection's socket
        self.fd = anonymous_file()
        self.size = 0
        self.result: Fetched | None = None
        self.error: BaseException | None = None
        self.done = threading.Event()
        self.abandoned = False

    def run(self) -> None:
        try:
            self.result = self._fetch()
        except BaseException as e:  # noqa: BLE001 - handed to the job's thread
            self.error = e
        finally:
            # The file is the caller's only if the fetch succeeded and the
            # caller still waits; otherwise it is closed here, on the thread
            # that writes it, so its number is never reused under a write.
            with self.lock:
                self._forget_connection()
                if self.error is not None or self.abandoned:
                    os.close(self.fd)
                self.done.set()

    def abandon(self) -> None:
        """The job stopped waiting: stop the helper and wake it; the file is closed either way."""
        with self.lock:
            self.abandoned = True
            self.stop.set()
            if self.done.is_set() and self.error is None:
                os.close(self.fd)
            if self.conn is not None:
                _shutdown(self.conn)  # wakes a read or a handshake blocked on the helper thread

    # -- the connection, as httpcore reports it (on the helper thread) --------------------

    def _trace(self, event: str, info: dict) -> None:
        """httpcore's trace hook: keep a duplicate of each new TCP connection's socket.

        Only the TCP connection is taken: it is the same connection once TLS
        wraps it (an ``ssl.SSLSocket`` cannot be duplicated), and a handshake
        that trickles is woken by the same ``shutdown``.
        """
        if not event.endswith(".connect_tcp.complete"):
            return
        stream = info.get("return_value")
        get = getattr(stream, "get_extra_info", None)
        sock = get("socket") if get is not None else None
        if stream is None or not isinstance(sock, socket.socket):  # (no stream has no socket)
            return
        with self.lock:
            self._forget_connection()
            try:
                self.conn = sock.dup()
            except OSError:  # out of descriptors: fail the fetch rather than lose the way to stop it
                stream.close()
                raise
            if self.stop.is_set():
                _shutdown(self.conn)  # stopped while connecting: the first read fails at once

    def _forget_connection(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def _remaining(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0 or self.stop.is_set():
            raise _Stopped
        return left

    def _send(self, client: httpx.Client, url: httpx.URL) -> httpx.Response:
        """The response's head. A TCP connect cannot be shut down before it completes, so it is tried in
        attempts of at most ``CONNECT_ATTEMPT_S``: a stop or the deadline reaches the helper between them
        (a host that drops SYNs never holds it past ``JOIN_S``)."""
        import httpx  # deferred: see parse_url

        while True:
            left = self._remaining()
            timeout = httpx.Timeout(left, connect=min(left, CONNECT_ATTEMPT_S))
            request = client.build_request("GET", url, timeout=timeout, extensions={"trace": self._trace})
            try:
                return client.send(request, stream=True)
            except httpx.ConnectTimeout:
                continue

    def _fetch(self) -> Fetched:
        import httpx  # deferred: see parse_url
        headers = {"User-Agent": f"tensorjob/{__version__}", "Accept-Encoding": "gzip, deflate;q=0.5, identity"}
        current = self.target
        with httpx.Client(follow_redirects=False, trust_env=False, headers=headers) as client:
            for redirects in range(self.limits.max_fetch_redirects + 1):
                response = self._send(client, current.url)
                try:
                    if self.stop.is_set():
                        raise _Stopped
                    if response.is_redirect:
                        location = response.headers.get("location", "")
                        try:
                            nxt = str(current.url.join(location))
                        except Exception:
                            raise FetchError(codes.UNSUPPORTED, f"{current.url} redirected to an invalid "
                                                                f"location {location[:200]!r}") from None
                        try:
                            current = self.grants.check(nxt)
                        except FetchError as e:
                            raise FetchError(codes.CAPABILITY_DENIED, f"{current.url} redirected to {nxt[:300]}, "
                                                                      f"outside the fetch grants: "
                                                                      f"{e.message}") from None
                        continue
                    if not response.is_success:
                        raise FetchError(codes.UNSUPPORTED, f"GET {current.url} answered {response.status_code} "
                                                            f"{response.reason_phrase}")
                    self._body(response)
                    return Fetched(self.fd, str(current.url), response.status_code,
                                   response.headers.get("content-type"), redirects)
                finally:
                    response.close()
        raise FetchError(codes.LIMIT_EXCEEDED, f"{self.target.url} redirected more than "
                                               f"{self.limits.max_fetch_redirects} times (max_fetch_redirects)")

    def _too_big(self, what: str) -> FetchError:
        if self.cap < self.limits.max_fetch_bytes:
            return FetchError(codes.LIMIT_EXCEEDED, f"{self.target.url} {what}, more than the {self.cap} bytes the "
                                                    f"job's handles may still hold together (max_handle_bytes is "
                                                    f"{self.limits.max_handle_bytes})")
        return FetchError(codes.LIMIT_EXCEEDED, f"{self.target.url} {what}, over the {self.limits.max_fetch_bytes}-byte "
                                                f"limit (max_fetch_bytes)")

    def _write(self, data: bytes) -> None:
        if self.size + len(data) > self.cap:
            raise self._too_big("sent a longer body")
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view):]
        self.size += len(data)

    def _body(self, response: httpx.Response) -> None:
        limit = self.cap
        length = response.headers.get("content-length")
        if length is not None and length.strip().isdigit() and int(length) > limit:
            raise self._too_big(f"announced a body of {int(length)} bytes")
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        if encoding in ("gzip", "x-gzip", "deflate"):
            decoder = zlib.decompressobj(47)  # zlib or gzip, by header
        elif encoding in ("", "identity"):
            decoder = None
        else:
            raise FetchError(codes.UNSUPPORTED, f"{self.target.url} sent a body encoded as {encoding[:40]!r}, "
                                                f"which fetch does not decode")
        for chunk in response.iter_raw(65536):
            self._remaining()
            if decoder is None:
                self._write(chunk)
                continue
            data = chunk
            while data:
                try:
                    out = decoder.decompress(data, limit - self.size + 1)
                except zlib.error as e:
                    raise FetchError(codes.UNSUPPORTED, f"{self.target.url} sent a damaged {encoding} body: {e}") \
                        from None
                self._write(out)
                data = decoder.unconsumed_tail
        if decoder is not None:
            self._write(decoder.flush(limit - self.size + 1))
        self._remaining()


class _Stopped(Exception):
    """The fetch was stopped: its deadline passed, or the job stopped waiting."""


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:  # already closed by the peer, or never connected
        pass


def fetch_url(url: str, grants: FetchGrants, limits: Limits, check: Callable[[], None] = lambda: None, *,
              room: int | None = None) -> Fetched:
    """Check ``url`` against ``grants`` and download it into an anonymous file.

    Runs the download on a helper thread and waits on the calling thread,
    calling ``check()`` (which raises to cancel) every few milliseconds.
    ``room``: the bytes the job's handles may still hold (``Handles.room()``);
    the body is capped at it too. Returns the open descriptor (the caller owns
    it) and what happened. However it ends, the helper thread and its
    connection have ended too (unless a DNS lookup holds the helper past
    ``JOIN_S``).
    """
    target = grants.check(url)
    if room is not None and room <= 0:
        raise FetchError(codes.LIMIT_EXCEEDED, f"fetching {target.url}: the job's handles already hold the "
                                               f"{limits.max_handle_bytes} bytes they may hold together "
                                               f"(max_handle_bytes)")
    deadline = time.monotonic() + limits.fetch_timeout_s
    download = _Download(target, grants, limits, deadline, room)
    thread = threading.Thread(target=download.run, name="tensorjob-fetch", daemon=True)
    thread.start()
    try:
        while not download.done.wait(POLL_S):
            check()
            if time.monotonic() > deadline:  # httpx's timeouts are per read: a trickle never trips them
                raise _timeout(target, limits)
    except BaseException:
        download.abandon()
        thread.join(JOIN_S)
        raise
    thread.join(JOIN_S)
    error = download.error
    if error is None:
        assert download.result is not None
        return download.result
    if isinstance(error, FetchError):
        raise error
    import httpx  # deferred: see parse_url

    if isinstance(error, (_Stopped, httpx.TimeoutException)):
        raise _timeout(target, limits) from None
    raise FetchError(codes.UNSUPPORTED, f"fetching {target.url} failed: {type(error).__name__}: "
                                        f"{str(error)[:300] or 'no detail'}") from None


def _timeout(target: Target, limits: Limits) -> FetchError:
    return FetchError(codes.TIMEOUT, f"fetching {target.url} took longer than {limits.fetch_timeout_s:g} s "
                                     f"(fetch_timeout_s)")


__all__ = [
    "POLL_S", "JOIN_S", "CONNECT_ATTEMPT_S", "MAX_URL_BYTES", "DEFAULT_PORTS", "FetchError", "Target", "parse_url",
    "FetchGrant", "FetchGrants", "Fetched", "fetch_url"
]

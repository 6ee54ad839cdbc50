"""Documents and images for a job: PDF pages and their text, page images, image operations.

The reactor calls this module for cuttlefish's document commands (``page_text``,
``page_text_opt``, ``document_text``, ``page_image``, ``image_op``) and to refine a file sniffed as
a PDF into ``{"kind":"document",...}``; a rendered page or an image operation is a new handle
holding a PNG. pdfium and Pillow's decoders are large native code fed hostile bytes, and pdfium is
not thread-safe, so each job that needs them gets its own engine process (``docworker.py``),
started on first use and killed when the job ends: a crash or a hang there ends one job with a
clear code, never the kernel. Every call has a deadline, the engine's memory and CPU time are
capped, it never sees a path, its replies are checked like guest output, and every size is
bounded before the work it bounds.

Design: docs/internals/world.md#documentspy
"""

from __future__ import annotations

import base64
import json
import math
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Callable, TypeGuard

from tensorjob_jupyter.world import docworker
from tensorjob_jupyter.abi import JobFailure, MediaKind, codes, event_types
from tensorjob_jupyter.world.files import Handles, OpenFile
from tensorjob_jupyter.limits import Limits

#: Pages are rendered this many pixels wide (cuttlefish's RENDER_WIDTH).
RENDER_WIDTH = 1024
PREVIEW_CHARS = 512
POLL_S = 0.02
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
WORKER = Path(docworker.__file__).resolve()
#: Error codes the engine may answer with; anything else reads as ``unsupported``.
ENGINE_CODES = frozenset({codes.UNSUPPORTED, codes.LIMIT_EXCEEDED})


class DocumentError(JobFailure):
    """A document or image command the job cannot complete; ``code`` is the envelope code."""


# --- the engine process -----------------------------------------------------------------


class DocumentEngine:
    """One document engine process, started on first use; one request at a time."""

    def __init__(self, memory_bytes: int, cpu_s: float):
        self.memory_bytes = memory_bytes
        self.cpu_s = cpu_s
        self.proc: subprocess.Popen | None = None
        self.sock: socket.socket | None = None
        self.stderr: IO[bytes] | None = None
        self.dead: str | None = None  # why the engine is gone, once it is
        self.started_s: float | None = None  # how long the start took

    def start(self) -> None:
        t0 = time.monotonic()
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.stderr = tempfile.TemporaryFile()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, str(WORKER), str(child.fileno()), str(self.memory_bytes),
                 str(math.ceil(self.cpu_s)), str(os.getpid())],
                pass_fds=[child.fileno()], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=self.stderr, start_new_session=True)
        finally:
            child.close()
        self.sock = parent
        self.started_s = time.monotonic() - t0

    def request(self, header: dict, *, fds: tuple[int, ...] = (), deadline: float, check: Callable[[], None],
                what: str, timeout_s: float, max_blob: int, max_header: int) -> tuple[dict, bytes]:
        """Send one request and wait for its reply, the deadline and ``check`` permitting."""
        if self.dead is not None:
            raise DocumentError(codes.UNSUPPORTED, f"the document engine stopped earlier in this job ({self.dead})")
        if self.proc is None:
            self.start()
        assert self.sock is not None, "a started engine has its socket until it is dead"
        try:
            docworker.send_message(self.sock, header, fds=fds)
            prefix = self._recv(docworker.PREFIX.size, deadline, check, what, timeout_s)
            header_len, blob_len = docworker.PREFIX.unpack(prefix)
            if header_len > max_header or blob_len > max_blob:
                self.kill(f"it sent a reply of {header_len} + {blob_len} bytes")
                raise DocumentError(codes.UNSUPPORTED, f"the document engine sent an oversized reply {what}")
            reply = json.loads(self._recv(header_len, deadline, check, what, timeout_s))
            blob = self._recv(blob_len, deadline, check, what, timeout_s) if blob_len else b""
        except (BrokenPipeError, ConnectionError, EOFError):
            raise DocumentError(*self._died(what)) from None
        except ValueError:  # the reply is not JSON
            self.kill("it sent a malformed reply")
            raise DocumentError(codes.UNSUPPORTED, f"the document engine sent a malformed reply {what}") from None
        except BaseException:
            # A cancel or the job's deadline (from ``check``), or our own timeout:
            # the engine is mid-request and cannot be trusted to stop; kill it.
            if self.dead is None:
                self.kill("the job stopped waiting for it")
            raise
        if not isinstance(reply, dict):
            self.kill("it sent a malformed reply")
            raise DocumentError(codes.UNSUPPORTED, f"the document engine sent a malformed reply {what}")
        return reply, blob

    def _recv(self, n: int, deadline: float, check: Callable[[], None], what: str, timeout_s: float) -> bytes:
        sock = self.sock
        assert sock is not None, "request starts the engine first"
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            check()
            now = time.monotonic()
            if now >= deadline:
                self.kill("it ran past its deadline")
                raise DocumentError(codes.TIMEOUT, f"the document engine took longer than {timeout_s:g} s {what} "
                                                   f"(document_timeout_s); it was stopped")
            ready, _, _ = select.select([sock], [], [], min(POLL_S, deadline - now))
            if not ready:
                continue
            k = sock.recv_into(view[got:], n - got)
            if k == 0:
                raise EOFError
            got += k
        return bytes(buf)

    def _died(self, what: str) -> tuple[str, str]:
        """The code and message for an engine that went away ``what``-ing (it is reaped, then killed for sure)."""
        status = None
        if self.proc is not None:
            try:
                status = self.proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                pass
        if status is not None and status < 0:
            try:
                name = signal.Signals(-status).name
            except ValueError:
                name = f"signal {-status}"
            how = f"crashed ({name})"
        elif status is not None:
            how = f"exited with status {status}"
        else:
            how = "stopped answering"
        tail = self._stderr_tail()
        self.kill(how)
        if status == -signal.SIGXCPU:
            return codes.LIMIT_EXCEEDED, (f"the document engine used up its {math.ceil(self.cpu_s)} s of CPU time "
                                          f"{what} (document_cpu_s); it was stopped")
        message = (f"the document engine {how} {what}; the file cannot be read safely (a damaged or hostile "
                   f"file, or it ran out of memory: document_memory_bytes)")
        return codes.UNSUPPORTED, message + (f": {tail}" if tail else "")

    def _stderr_tail(self) -> str:
        if self.stderr is None:
            return ""
        try:
            self.stderr.seek(0, os.SEEK_END)
            size = self.stderr.tell()
            self.stderr.seek(max(0, size - 400))
            lines = self.stderr.read().decode("utf-8", "replace").strip().splitlines()
            return lines[-1][:200] if lines else ""
        except OSError:
            return ""

    def kill(self, reason: str = "the job ended") -> None:
        if self.dead is None:
            self.dead = reason
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                self.proc.kill()
        if self.proc is not None:
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        if self.sock is not None:
            self.sock.close()
        if self.stderr is not None:
            self.stderr.close()
            self.stderr = None

    def close(self) -> None:
        """End the engine: close its socket (it exits on EOF), then make sure."""
        if self.proc is not None and self.dead is None and self.sock is not None:
            self.sock.close()
            try:
                self.proc.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                pass
        self.kill()


# --- one job's documents ---------------------------------------------------------------


@dataclass
class Document:
    handle: int
    pages: int
    has_text_layer: bool
    pages_read: set[int] = field(default_factory=set)


@dataclass(frozen=True)
class Image:
    """A PNG the engine produced, and its new handle."""

    png: bytes
    width: int
    height: int
    thumbnail: bytes


class JobDocuments:
    """The documents and images of one job, and its engine (started on first use)."""

    def __init__(self, handles: Handles, limits: Limits, *, check: Callable[[], None] = lambda: None,
                 publish: Callable[..., object] = lambda *a, **k: None):
        self.handles = handles
        self.limits = limits
        self.check = check
        self.publish = publish
        self.engine: DocumentEngine | None = None
        self.docs: dict[int, Document] = {}
        self.unreadable: dict[int, str] = {}  # handle -> why the engine could not read the PDF

    # -- the engine ----------------------------------------------------------------------

    def _call(self, header: dict, *, what: str, fds: tuple[int, ...] = (),
              max_png: int | None = None) -> tuple[dict, bytes]:
        if self.engine is None:
            self.engine = DocumentEngine(self.limits.document_memory_bytes, self.limits.document_cpu_s)
        deadline = time.monotonic() + self.limits.document_timeout_s
        max_pixels = max(self.limits.max_render_pixels, self.limits.max_image_pixels)
        max_blob = 5 * max_pixels if max_png is None else min(5 * max_pixels, max_png)
        reply, blob = self.engine.request(
            header, fds=fds, deadline=deadline, check=self.check, what=what,
            timeout_s=self.limits.document_timeout_s, max_header=6 * self.limits.max_text_bytes + 65536,
            max_blob=max_blob + docworker.THUMB_MAX_BYTES + (1 << 20))
        if reply.get("ok") is True:
            return reply, blob
        code = reply.get("code")
        message = reply.get("message")
        if not isinstance(message, str):
            message = "the document engine gave no reason"
        raise DocumentError(code if code in ENGINE_CODES else codes.UNSUPPORTED, message[:2000])

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()

    # -- open -----------------------------------------------------------------------------

    def inspect(self, f: OpenFile, label: str) -> MediaKind:
        """The kind of a file sniffed as a PDF: a document, or binary if pdfium cannot read it."""
        try:
            reply, _ = self._call({"op_name": "open", "doc": f.handle, "max_pages": self.limits.max_document_pages},
                                  fds=(f.fd,), what=f"opening {label}")
        except DocumentError as e:
            if e.code != codes.UNSUPPORTED or self.engine is None or self.engine.dead is not None:
                raise
            self.unreadable[f.handle] = e.message
            return MediaKind("binary")
        pages, has_text = reply.get("pages"), reply.get("has_text_layer")
        if not _count(pages) or not isinstance(has_text, bool):
            raise DocumentError(codes.UNSUPPORTED, "the document engine sent a malformed reply opening " + label)
        if pages > self.limits.max_document_pages:
            raise DocumentError(codes.LIMIT_EXCEEDED, f"{label} has {pages} pages, over the limit of "
                                                      f"{self.limits.max_document_pages} (max_document_pages)")
        self.docs[f.handle] = Document(f.handle, pages, has_text)
        return MediaKind("document", pages=pages, has_text_layer=has_text)

    # -- text -----------------------------------------------------------------------------

    def _document(self, handle: int, command: str) -> Document:
        f = self.handles.get(handle)  # AccessError(capability_denied) for a bad handle
        doc = self.docs.get(handle)
        if doc is not None:
            return doc
        if handle in self.unreadable:
            raise DocumentError(codes.UNSUPPORTED, f"{command}: handle {handle} is a PDF the engine cannot read: "
                                                   f"{self.unreadable[handle]}")
        raise DocumentError(codes.UNSUPPORTED, f"{command}: handle {handle} holds {_kind_words(f.kind)}, not a "
                                               f"document; {command} reads PDFs")

    @staticmethod
    def _page_in_range(doc: Document, page: int) -> None:
        if page >= doc.pages:
            raise DocumentError(codes.UNSUPPORTED, f"page {page} is out of range; the document has {doc.pages} "
                                                   f"page{'s' if doc.pages != 1 else ''} (pages count from 0)")

    def _text(self, doc: Document, page: int) -> str:
        self._page_in_range(doc, page)
        reply, _ = self._call({"op_name": "page_text", "doc": doc.handle, "page": page,
                               "max_bytes": self.limits.max_text_bytes},
                              what=f"reading the text of page {page} of handle {doc.handle}")
        return self._checked_text(reply)

    def _checked_text(self, reply: dict) -> str:
        text = reply.get("text")
        if not isinstance(text, str) or len(text) > self.limits.max_text_bytes:
            raise DocumentError(codes.UNSUPPORTED, "the document engine sent a malformed text reply")
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError:
            raise DocumentError(codes.UNSUPPORTED, "the document engine sent text that is not Unicode") from None
        if size > self.limits.max_text_bytes:
            raise DocumentError(codes.UNSUPPORTED, "the document engine sent more text than allowed")
        return text

    def _read(self, doc: Document, page: int | None, command: str, text: str | None, error: str | None) -> None:
        if page is None:
            doc.pages_read.update(range(doc.pages))
        elif error is None:
            doc.pages_read.add(page)
        self.publish(event_types.JOB_DOCUMENT_PAGE, handle=doc.handle, command=command, page=page, pages=doc.pages,
                     pages_read=len(doc.pages_read), chars=len(text) if text is not None else 0,
                     error=error, preview=(text or "")[:PREVIEW_CHARS])

    def page_text(self, handle: int, page: int) -> str:
        doc = self._document(handle, "page_text")
        text = self._text(doc, page)
        self._read(doc, page, "page_text", text, None)
        return text

    def page_text_opt(self, handle: int, page: int) -> tuple[str | None, str | None]:
        """(text, None) or (None, why): a page that cannot be read is an answer, not a failure.

        A bad handle is still ``capability_denied``, and an engine that hangs or
        crashes still ends the job: those are not about the page.
        """
        try:
            doc = self._document(handle, "page_text_opt")
        except DocumentError as e:
            self.publish(event_types.JOB_DOCUMENT_PAGE, handle=handle, command="page_text_opt", page=page, pages=None,
                         pages_read=0, chars=0, error=e.message, preview="")
            return None, e.message
        try:
            text = self._text(doc, page)
        except DocumentError as e:
            if self.engine is not None and self.engine.dead is not None:
                raise
            self._read(doc, page, "page_text_opt", None, e.message)
            return None, e.message
        self._read(doc, page, "page_text_opt", text, None)
        return text, None

    def document_text(self, handle: int) -> str:
        doc = self._document(handle, "document_text")
        reply, _ = self._call({"op_name": "document_text", "doc": doc.handle, "max_bytes": self.limits.max_text_bytes},
                              what=f"reading the text of handle {handle}")
        text = self._checked_text(reply)
        self._read(doc, None, "document_text", text, None)
        return text

    # -- images ----------------------------------------------------------------------------

    def _image_reply(self, reply: dict, blob: bytes) -> Image:
        width, height = reply.get("width"), reply.get("height")
        png_len, thumb_len = reply.get("png_len"), reply.get("thumb_len")
        if not (_count(width) and _count(height) and _count(png_len) and _count(thumb_len)
                and width > 0 and height > 0 and png_len + thumb_len == len(blob)
                and blob[:8] == PNG_MAGIC):
            raise DocumentError(codes.UNSUPPORTED, "the document engine sent a malformed image reply")
        thumb = blob[png_len:]
        if thumb and (thumb[:8] != PNG_MAGIC or len(thumb) > docworker.THUMB_MAX_BYTES):
            thumb = b""
        return Image(blob[:png_len], width, height, thumb)

    def _register(self, image: Image, label: str, source: int, **what) -> OpenFile:
        f = self.handles.add_bytes(image.png, label)  # limit_exceeded past max_handle_bytes
        self.publish(event_types.JOB_IMAGE_CREATED, handle=f.handle, source=source, len=f.len, width=image.width,
                     height=image.height, label=label, thumbnail_base64=_b64(image.thumbnail), **what)
        return f

    def page_image(self, handle: int, page: int) -> OpenFile:
        doc = self._document(handle, "page_image")
        self._page_in_range(doc, page)
        room = self._room_for_a_handle(f"page {page} of #{handle}")
        reply, blob = self._call({"op_name": "render", "doc": doc.handle, "page": page, "width": RENDER_WIDTH,
                                  "max_pixels": self.limits.max_render_pixels, "max_png_bytes": room},
                                 what=f"rendering page {page} of handle {handle}", max_png=room)
        image = self._image_reply(reply, blob)
        if image.width * image.height > self.limits.max_render_pixels:
            raise DocumentError(codes.UNSUPPORTED, "the document engine rendered more pixels than allowed")
        doc.pages_read.add(page)
        self.publish(event_types.JOB_DOCUMENT_PAGE, handle=handle, command="page_image", page=page, pages=doc.pages,
                     pages_read=len(doc.pages_read), chars=0, error=None, preview="")
        return self._register(image, f"page {page} of #{handle}", handle, page=page)

    def image_op(self, handle: int, op: dict) -> OpenFile:
        f = self.handles.get(handle)
        if f.kind.kind != "image":
            hint = "; render a page with page_image first" if f.kind.kind == "document" else ""
            raise DocumentError(codes.UNSUPPORTED, f"image_op: handle {handle} holds {_kind_words(f.kind)}, not an "
                                                   f"image{hint}")
        room = self._room_for_a_handle(f"{op['op']} of #{handle}")
        reply, blob = self._call({"op_name": "image", "op": op, "max_pixels": self.limits.max_image_pixels,
                                  "max_png_bytes": room},
                                 fds=(f.fd,), what=f"applying {op['op']} to handle {handle}", max_png=room)
        image = self._image_reply(reply, blob)
        if image.width * image.height > self.limits.max_image_pixels:
            raise DocumentError(codes.UNSUPPORTED, "the document engine made more pixels than allowed")
        return self._register(image, f"{op['op']} of #{handle}", handle, op=dict(op))

    def _room_for_a_handle(self, label: str) -> int:
        """The bytes a new image handle may hold; ``limit_exceeded`` if there is no handle or no byte left."""
        if len(self.handles) >= self.limits.max_handles:
            raise DocumentError(codes.LIMIT_EXCEEDED,
                                f"the job already holds {self.limits.max_handles} open handles (max_handles); "
                                f"page images and image results are handles too")
        room = self.handles.room()
        if room <= 0:
            raise DocumentError(codes.LIMIT_EXCEEDED,
                                f"{label}: the job's handles already hold the {self.handles.max_handle_bytes} bytes "
                                f"they may hold together (max_handle_bytes); page images and image results count")
        return room


def _count(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _kind_words(kind: MediaKind) -> str:
    if kind.kind == "image":
        return f"a {kind.format} image"
    if kind.kind == "document":
        return "a document"
    return "text" if kind.kind == "text" else "binary data"


__all__ = [
    "RENDER_WIDTH", "PREVIEW_CHARS", "POLL_S", "PNG_MAGIC", "WORKER", "ENGINE_CODES", "DocumentError",
    "DocumentEngine", "Document", "Image", "JobDocuments"
]

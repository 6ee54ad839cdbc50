"""The document engine process: every PDF and image decode a job asks for runs here.

A crash, a hang or a memory blow-up in pdfium or Pillow costs only this process: the host
(``documents.py``) kills it on a deadline, notices when it dies, and ends the one job that used
it. Before its first request it makes sure it dies with its host (``PR_SET_PDEATHSIG``, or a
watchdog where that does not exist) and limits its own address space and CPU time. It is run by
path, not imported as part of the package, so at module level it uses the standard library only.
Messages are a length prefix, a JSON header and a blob; a file arrives as a descriptor
(``SCM_RIGHTS``), so the engine never resolves a path. Requests come one at a time: pdfium
requires a single thread.

Design: docs/internals/world.md#docworkerpy
"""

from __future__ import annotations

import io
import json
import math
import os
import re
import signal
import socket
import struct
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:  # the engine imports them only when a request needs them
    import pypdfium2
    from PIL import Image as PILImage

PREFIX = struct.Struct("<II")
#: Largest JSON header either side accepts (requests are tiny; replies carry text).
MAX_HEADER_BYTES = 64 * 1024 * 1024
#: Decoders the engine lets Pillow use: the formats ``open`` recognises.
IMAGE_FORMATS = ("PNG", "JPEG", "GIF", "WEBP")
#: Thumbnails for the live view: at most this many pixels a side and bytes.
THUMB_SIDE = 160
THUMB_MAX_BYTES = 48 * 1024
#: Set (by tests) to ``crash:OP``, ``hang:OP`` or ``garbage:OP`` to make the
#: engine fail that way on request ``OP``; the host's recovery is tested with it.
FAULT_ENV = "TENSORJOB_DOCWORKER_FAULT"


#: prctl(2) option: the signal the kernel sends this process when its parent dies.
PR_SET_PDEATHSIG = 1
WATCHDOG_S = 0.25


class ProtocolError(Exception):
    """The other side broke the framing (or went away mid-message)."""


# --- framing (both sides) ---------------------------------------------------------


def encode_message(header: dict, blob: bytes = b"") -> tuple[bytes, bytes]:
    data = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    return PREFIX.pack(len(data), len(blob)), data


def send_message(sock: socket.socket, header: dict, blob: bytes = b"", fds: tuple[int, ...] = ()) -> None:
    prefix, data = encode_message(header, blob)
    if fds:
        socket.send_fds(sock, [prefix], list(fds))
        sock.sendall(data)
    else:
        sock.sendall(prefix + data)
    if blob:
        sock.sendall(blob)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise EOFError("the other side closed the connection")
        got += k
    return bytes(buf)


def recv_request(sock: socket.socket) -> tuple[dict, list[int]]:
    """One request (the engine's side): its header and any descriptors sent with it."""
    data, fds, flags, _ = socket.recv_fds(sock, PREFIX.size, 4)
    if not data:
        for fd in fds:
            os.close(fd)
        raise EOFError("the host closed the connection")
    if flags & getattr(socket, "MSG_CTRUNC", 0):
        raise ProtocolError("descriptors were truncated")
    if len(data) < PREFIX.size:
        data += _recv_exact(sock, PREFIX.size - len(data))
    header_len, blob_len = PREFIX.unpack(data)
    if header_len > MAX_HEADER_BYTES or blob_len:
        raise ProtocolError("request too large")
    return json.loads(_recv_exact(sock, header_len)), list(fds)


# --- image geometry (shared with the host, pure) ----------------------------------


class Refusal(Exception):
    """A request the engine turns down; ``code`` is the job's error code."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


def plan_image_op(op: dict | None, width: int, height: int) -> tuple[str, tuple[int, ...]]:
    """What an ``image_op`` does to a ``width`` x ``height`` image, checked.

    Returns ``("resize", (w, h))``, ``("crop", (x, y, w, h))`` or
    ``("none", (width, height))``. Cuttlefish's rules: ``resize`` scales to fit
    within the bounds, keeping the aspect ratio and never enlarging; ``crop``
    outside the image is refused, not clamped; zero-sized bounds or regions
    are errors (``unsupported``).
    """
    if op is None:
        return "none", (width, height)
    kind = op.get("op")
    if kind == "resize":
        mw, mh = op["max_width"], op["max_height"]
        if mw == 0 or mh == 0:
            raise Refusal("unsupported", f"resize bounds of {mw} x {mh} are empty; both must be at least 1")
        scale = min(mw / width, mh / height, 1.0)
        w = min(mw, width, max(1, math.floor(width * scale + 1e-9)))
        h = min(mh, height, max(1, math.floor(height * scale + 1e-9)))
        return "resize", (w, h)
    if kind == "crop":
        x, y, w, h = op["x"], op["y"], op["width"], op["height"]
        if w == 0 or h == 0:
            raise Refusal("unsupported", f"a crop of {w} x {h} is empty; width and height must be at least 1")
        if x + w > width or y + h > height:
            raise Refusal("unsupported", f"crop {w} x {h} at ({x}, {y}) lies outside the {width} x {height} image; "
                                         f"crops are refused, not clamped")
        return "crop", (x, y, w, h)
    raise Refusal("unsupported", f"unknown image operation {kind!r}")


# --- the engine -----------------------------------------------------------------------

_SURROGATE = re.compile("[\ud800-\udfff]")


def _clean(text: str) -> str:
    """pdfium's text, safe to encode: a lone UTF-16 surrogate becomes U+FFFD."""
    return _SURROGATE.sub("\ufffd", text)


def _pt(value: float) -> str:
    return f"{value:.0f}" if value >= 10 else f"{value:.3g}"


def _has_text(text: str) -> bool:
    return not text.isspace() and text != ""


class _PreadFile(io.RawIOBase):
    """A read-only file over a descriptor with ``pread``: no shared offset, no path."""

    def __init__(self, fd: int):
        self.fd = fd
        self.pos = 0
        self.size = os.fstat(fd).st_size

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = offset if whence == 0 else self.pos + offset if whence == 1 else self.size + offset
        return self.pos

    def tell(self) -> int:
        return self.pos

    def readinto(self, b) -> int:
        data = os.pread(self.fd, len(b), self.pos)
        b[:len(data)] = data
        self.pos += len(data)
        return len(data)


class PageRenderer:
    def __init__(self) -> None:
        self.docs: dict[int, pypdfium2.PdfDocument] = {}

    # pdfium ---------------------------------------------------------------------

    def _pdfium(self):
        import pypdfium2

        return pypdfium2

    def open(self, req: dict, fds: list[int]) -> dict:
        pdfium = self._pdfium()
        import pypdfium2.raw as raw

        fd = fds[0]
        # pdfium opens the descriptor's file itself (the /proc magic link names
        # the open file, not a path that could be swapped), reading natively.
        handle = raw.FPDF_LoadDocument(f"/proc/self/fd/{fd}".encode(), None)
        if not handle:
            reason = {1: "unknown error", 2: "not a PDF, or damaged beyond repair", 3: "not a PDF, or damaged "
                      "beyond repair", 4: "encrypted (it needs a password)", 5: "uses an unsupported security "
                      "scheme", 6: "a page is damaged"}.get(raw.FPDF_GetLastError(), "unreadable")
            raise Refusal("unsupported", f"the PDF engine cannot read it: {reason}")
        doc = pdfium.PdfDocument(handle)
        self.docs[req["doc"]] = doc
        pages = len(doc)
        has_text = False
        if pages <= req["max_pages"]:
            for i in range(pages):
                page = doc[i]
                textpage = page.get_textpage()
                n = textpage.count_chars()
                has_text = n > 0 and _has_text(textpage.get_text_range(0, min(n, 4096)))
                textpage.close()
                page.close()
                if has_text:
                    break
        return {"pages": pages, "has_text_layer": has_text}

    def _doc(self, req: dict):
        doc = self.docs.get(req["doc"])
        if doc is None:
            raise Refusal("unsupported", "the document is not open in the engine")
        return doc

    def _page_text(self, doc, index: int, max_bytes: int) -> str:
        page = doc[index]
        textpage = page.get_textpage()
        try:
            n = textpage.count_chars()
            # Each UTF-16 unit is at least half a UTF-8 byte: refuse before extracting.
            if n > 2 * max_bytes:
                raise Refusal("limit_exceeded", f"page {index} holds {n} characters of text, over the "
                                                f"{max_bytes}-byte limit (max_text_bytes)")
            text = _clean(textpage.get_text_range(0, n)) if n else ""
        finally:
            textpage.close()
            page.close()
        size = len(text.encode("utf-8"))
        if size > max_bytes:
            raise Refusal("limit_exceeded", f"page {index} has {size} bytes of text, over the {max_bytes}-byte "
                                            f"limit (max_text_bytes)")
        return text

    def page_text(self, req: dict, fds: list[int]) -> dict:
        doc = self._doc(req)
        index = req["page"]
        text = self._page_text(doc, index, req["max_bytes"])
        if not _has_text(text):
            raise Refusal("unsupported", f"page {index} has no text layer (a scanned page?): render it with "
                                         f"page_image for a vision model, or use page_text_opt to go on without it")
        return {"text": text}

    def document_text(self, req: dict, fds: list[int]) -> dict:
        doc = self._doc(req)
        max_bytes = req["max_bytes"]
        parts, size = [], 0
        for index in range(len(doc)):
            try:
                text = self._page_text(doc, index, max_bytes - size)
                size += len(text.encode("utf-8")) + (1 if index else 0)
                if size > max_bytes:
                    raise Refusal("limit_exceeded", "")
            except Refusal as e:
                if e.code != "limit_exceeded":
                    raise
                raise Refusal("limit_exceeded", f"the document's text passes the {max_bytes}-byte limit "
                                                f"(max_text_bytes) at page {index}; read it page by page with "
                                                f"page_text") from None
            parts.append(text)
        text = "\f".join(parts)
        if not _has_text(text):
            raise Refusal("unsupported", "the document has no text layer (a scanned document?): render its pages "
                                         "with page_image for a vision model")
        return {"text": text}

    def render(self, req: dict, fds: list[int]) -> tuple[dict, bytes]:
        doc = self._doc(req)
        index, width, max_pixels = req["page"], req["width"], req["max_pixels"]
        page = doc[index]
        try:
            w_pt, h_pt = page.get_size()
            if not (w_pt > 0 and h_pt > 0 and math.isfinite(w_pt) and math.isfinite(h_pt)):
                raise Refusal("unsupported", f"page {index} has no area ({w_pt} x {h_pt} pt)")
            scale = width / w_pt
            pw, ph = math.ceil(w_pt * scale), math.ceil(h_pt * scale)
            if pw * ph > max_pixels:
                raise Refusal("limit_exceeded", f"page {index} is {_pt(w_pt)} x {_pt(h_pt)} pt: rendered {width} pixels "
                                                f"wide it would be {pw} x {ph} = {pw * ph} pixels, over the limit "
                                                f"of {max_pixels} (max_render_pixels)")
            image = page.render(scale=scale).to_pil()
        finally:
            page.close()
        return self._png_reply(image, req.get("thumb", True), req.get("max_png_bytes"))

    # Pillow -----------------------------------------------------------------------

    def image(self, req: dict, fds: list[int]) -> tuple[dict, bytes]:
        from PIL import Image

        max_pixels = req["max_pixels"]
        # Pillow's own bomb check is process-wide and warns below twice its
        # limit; this process is ours alone, and the check below is exact.
        Image.MAX_IMAGE_PIXELS = None
        source = io.BufferedReader(_PreadFile(fds[0]), 1 << 16)
        try:
            image: PILImage.Image = Image.open(source, formats=IMAGE_FORMATS)  # reads the header only
        except MemoryError:
            raise
        except Exception as e:
            raise Refusal("unsupported", f"the image cannot be decoded: {e}") from None
        width, height = image.size
        if width * height > max_pixels:
            raise Refusal("limit_exceeded", f"the image is {width} x {height} = {width * height} pixels, over the "
                                            f"limit of {max_pixels} (max_image_pixels); it was not decoded")
        kind, args = plan_image_op(req.get("op"), width, height)
        try:
            image.seek(0)
            image.load()
        except MemoryError:
            raise
        except Exception as e:
            raise Refusal("unsupported", f"the image cannot be decoded: {type(e).__name__}: {e}") from None
        if image.mode not in ("1", "L", "LA", "RGB", "RGBA", "P"):
            image = image.convert("RGBA" if "A" in image.getbands() else "RGB")
        if kind == "resize" and args != (width, height):
            if image.mode in ("1", "P"):
                image = image.convert("RGBA" if "transparency" in image.info else "RGB")
            new_width, new_height = args
            image = image.resize((new_width, new_height), Image.Resampling.LANCZOS)
        elif kind == "crop":
            x, y, w, h = args
            image = image.crop((x, y, x + w, y + h))
        return self._png_reply(image, req.get("thumb", True), req.get("max_png_bytes"))

    def _png_reply(self, image, thumb: bool, max_png: int | None = None) -> tuple[dict, bytes]:
        out = _CappedBuffer(max_png) if isinstance(max_png, int) else io.BytesIO()
        image.save(out, format="PNG", compress_level=1)
        png = out.getvalue()
        small = b""
        if thumb:
            from PIL import Image

            w, h = image.size
            scale = min(THUMB_SIDE / w, THUMB_SIDE / h, 1.0)
            size = (max(1, round(w * scale)), max(1, round(h * scale)))
            # resize (not copy + thumbnail): no full-size copy, and reducing_gap makes it fast.
            small_image = image if size == image.size else image.resize(size, Image.Resampling.BICUBIC,
                                                                        reducing_gap=2.0)
            buf = io.BytesIO()
            small_image.save(buf, format="PNG")
            small = buf.getvalue() if buf.tell() <= THUMB_MAX_BYTES else b""
        return ({"width": image.size[0], "height": image.size[1], "png_len": len(png), "thumb_len": len(small)},
                png + small)

    def close(self, req: dict, fds: list[int]) -> dict:
        doc = self.docs.pop(req["doc"], None)
        if doc is not None:
            doc.close()
        return {}

    def handle(self, req: dict, fds: list[int]) -> tuple[dict, bytes]:
        op = req.get("op_name")
        fault = os.environ.get(FAULT_ENV, "")
        if fault == f"crash:{op}":
            import ctypes

            ctypes.string_at(0)  # a segfault, as a native bug would make
        if fault == f"hang:{op}":
            while True:
                pass
        methods: dict[Any, Callable[[dict, list[int]], dict | tuple[dict, bytes]]] = {
            "open": self.open, "page_text": self.page_text, "document_text": self.document_text,
            "render": self.render, "image": self.image, "close": self.close}
        method = methods.get(op)  # keyed by Any: the request's op_name is whatever JSON it holds
        if method is None:
            raise Refusal("unsupported", f"unknown engine request {op!r}")
        out = method(req, fds)
        reply, blob = out if isinstance(out, tuple) else (out, b"")
        if fault == f"garbage:{op}":
            reply = {"ok": True, "text": 42, "width": -1, "png_len": 10**12}
        return reply, blob


class _CappedBuffer(io.BytesIO):
    """An in-memory file that refuses to hold more than ``cap`` bytes (the PNG being encoded)."""

    def __init__(self, cap: int):
        super().__init__()
        self.cap = cap

    def write(self, data) -> int:
        if self.tell() + len(data) > self.cap:
            raise Refusal("limit_exceeded", f"the PNG passes the {self.cap} bytes the job's handles may still hold "
                                            f"(max_handle_bytes); it was not kept")
        return super().write(data)


def _die_with_parent(host_pid: int) -> None:
    """Make sure this process ends when the host does, even mid-render in native code."""
    armed = False
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            libc = ctypes.CDLL(None, use_errno=True)
            armed = libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
        except (OSError, AttributeError):
            armed = False
    # The host may have died before the request above: then the parent is init (or a subreaper) already.
    if host_pid > 0 and os.getppid() != host_pid:
        os._exit(0)
    if not armed and host_pid > 0:
        threading.Thread(target=_watch_parent, args=(host_pid,), name="parent-watchdog", daemon=True).start()


def _watch_parent(host_pid: int) -> None:
    while os.getppid() == host_pid:
        time.sleep(WATCHDOG_S)
    os._exit(0)


def _limit_self(memory_bytes: int, cpu_s: int = 0) -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if memory_bytes > 0:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    if cpu_s > 0:
        # The soft limit sends SIGXCPU (which ends the process: no handler is installed); the hard one SIGKILL.
        _, hard = resource.getrlimit(resource.RLIMIT_CPU)
        new_hard = cpu_s + 2 if hard == resource.RLIM_INFINITY else min(hard, cpu_s + 2)
        resource.setrlimit(resource.RLIMIT_CPU, (min(cpu_s, new_hard), new_hard))


def main(argv: list[str]) -> int:
    host_pid = int(argv[4]) if len(argv) > 4 else 0
    _die_with_parent(host_pid)
    sock = socket.socket(fileno=int(argv[1]))
    _limit_self(int(argv[2]), int(argv[3]) if len(argv) > 3 else 0)
    engine = PageRenderer()
    while True:
        try:
            req, fds = recv_request(sock)
        except (EOFError, ConnectionError):
            return 0
        blob = b""
        try:
            reply, blob = engine.handle(req, fds)
            reply = {"ok": True, **reply}
        except Refusal as e:
            reply = {"ok": False, "code": e.code, "message": e.message}
        except MemoryError:
            reply = {"ok": False, "code": "limit_exceeded",
                     "message": "the document engine ran out of memory (document_memory_bytes)"}
        except Exception as e:  # noqa: BLE001 - a library's error is the document's problem, reported
            reply = {"ok": False, "code": "unsupported", "message": f"{type(e).__name__}: {e}"}
        finally:
            for fd in fds:
                try:
                    os.close(fd)
                except OSError:
                    pass
        try:
            send_message(sock, reply, blob)
        except (BrokenPipeError, ConnectionError):
            return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))


__all__ = [
    "PREFIX", "MAX_HEADER_BYTES", "IMAGE_FORMATS", "THUMB_SIDE", "THUMB_MAX_BYTES", "FAULT_ENV", "PR_SET_PDEATHSIG",
    "WATCHDOG_S", "ProtocolError", "encode_message", "send_message", "recv_request", "Refusal", "plan_image_op",
    "PageRenderer", "main"
]

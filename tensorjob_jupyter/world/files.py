"""A job's open files: handles, content sniffing and bounded windows.

Bulk data never crosses the guest boundary whole: ``open`` yields a handle, the length and the
kind (sniffed from content, never from the name) without reading the file, and ``slice`` and
``slice_bytes`` serve one bounded window at a time with ``pread`` (``slice`` cut to a UTF-8
boundary). Handles count from 0 in each job, are never reused, and are the capability: a bad one
is ``capability_denied``. The bytes the host makes for handles (fetched bodies, rendered pages)
share one budget, ``max_handle_bytes``, which a producer asks about before it works (``room()``).

Design: docs/internals/world.md#filespy
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from tensorjob_jupyter.abi import MediaKind, codes
from tensorjob_jupyter.limits import Limits
from tensorjob_jupyter.world.grants import AccessError

SNIFF_BYTES = 4096
DEFAULT_MAX_HANDLE_BYTES: int = Limits.max_handle_bytes  # the field's default (a dataclass keeps it on the class)


def sniff(head: bytes, length: int) -> MediaKind:
    """The media kind of a file from its first bytes (cuttlefish's order).

    A PDF is a ``document`` with ``pages=0, has_text_layer=False`` here; the
    reactor has ``documents.JobDocuments.inspect`` fill in the real values
    (or make it ``binary`` when the PDF engine cannot read it).
    """
    if head.startswith(b"%PDF-"):
        return MediaKind("document", pages=0, has_text_layer=False)
    if head.startswith(b"\x89PNG"):
        return MediaKind("image", format="png")
    if head.startswith(b"\xff\xd8\xff"):
        return MediaKind("image", format="jpeg")
    if head.startswith(b"GIF8"):
        return MediaKind("image", format="gif")
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return MediaKind("image", format="webp")
    if length == 0:
        return MediaKind("text")
    try:
        head.decode("utf-8")
        return MediaKind("text")
    except UnicodeDecodeError as e:
        # Only a character cut off by the sniff window is still text.
        if e.reason == "unexpected end of data" and e.start > 0:
            return MediaKind("text")
        return MediaKind("binary")


def utf8_prefix(buf: bytes) -> tuple[int, str]:
    """The longest prefix of ``buf`` that is complete, valid UTF-8: (length, text)."""
    try:
        return len(buf), buf.decode("utf-8")
    except UnicodeDecodeError as e:
        return e.start, buf[:e.start].decode("utf-8")


@dataclass
class OpenFile:
    handle: int
    path: Path | str  # a granted file's path; a fetched URL or a label for host-made bytes
    fd: int
    len: int
    kind: MediaKind
    bytes_read: int = 0
    held: bool = False  # host-made bytes in memory, counted against max_handle_bytes


@dataclass(frozen=True)
class Window:
    data: bytes
    offset: int
    next_offset: int
    text: str | None = None  # the decoded window, for ``slice``


class Handles:
    """The table of files one job has open."""

    def __init__(self, max_handles: int = 64, max_window_bytes: int = 4 * 1024 * 1024,
                 max_handle_bytes: int = DEFAULT_MAX_HANDLE_BYTES):
        self.max_handles = max_handles
        self.max_window_bytes = max_window_bytes
        self.max_handle_bytes = max_handle_bytes
        self.held_bytes = 0  # bytes of the handles that hold host-made data
        self._files: dict[int, OpenFile] = {}
        self._next = 0

    def __len__(self) -> int:
        return len(self._files)

    def __iter__(self):
        return iter(self._files.values())

    def room(self) -> int:
        """Bytes a new host-made handle may still hold (``max_handle_bytes`` less what is held)."""
        return max(0, self.max_handle_bytes - self.held_bytes)

    def over_budget(self, size: int, what: str) -> AccessError:
        """The ``limit_exceeded`` error for ``what`` (``size`` bytes) not fitting in ``room()``."""
        return AccessError(codes.LIMIT_EXCEEDED,
                           f"{what} would hold {size} bytes, but the job's handles already hold {self.held_bytes} "
                           f"of the {self.max_handle_bytes} bytes they may hold together (max_handle_bytes)")

    def add(self, fd: int, path: Path | str, *, held: bool = False) -> OpenFile:
        """Take ownership of an open descriptor; sniff its kind from the head.

        ``held``: the descriptor is host-made data in memory (a fetched body),
        counted against ``max_handle_bytes``; if it does not fit it is closed
        and refused.
        """
        if len(self._files) >= self.max_handles:
            os.close(fd)
            raise AccessError(codes.LIMIT_EXCEEDED,
                              f"the job already holds {self.max_handles} open files (max_handles)")
        try:
            length = os.fstat(fd).st_size
            if held and length > self.room():
                raise self.over_budget(length, str(path)[:300])
            head = os.pread(fd, min(SNIFF_BYTES, length), 0) if length else b""
        except OSError as e:
            os.close(fd)
            raise AccessError(codes.CAPABILITY_DENIED, f"cannot read {path}: {e.strerror}") from None
        except AccessError:
            os.close(fd)
            raise
        f = OpenFile(self._next, path, fd, length, sniff(head, length), held=held)
        self._files[f.handle] = f
        self._next += 1
        if held:
            self.held_bytes += length
        return f

    def add_bytes(self, data: bytes, label: str) -> OpenFile:
        """A new handle holding host-made bytes (a rendered page, an image-op result).

        The bytes live in an anonymous in-memory file, so they are read with
        ``slice_bytes`` exactly like a file on disk; ``label`` names the
        handle in messages and events. They count against ``max_handle_bytes``.
        """
        if len(self._files) >= self.max_handles:
            raise AccessError(codes.LIMIT_EXCEEDED,
                              f"the job already holds {self.max_handles} open files (max_handles)")
        if len(data) > self.room():
            raise self.over_budget(len(data), label)
        fd = anonymous_file(data)
        return self.add(fd, label, held=True)

    def get(self, handle: int) -> OpenFile:
        f = self._files.get(handle)
        if f is None:
            raise AccessError(codes.CAPABILITY_DENIED, f"no such handle: {handle}")
        return f

    def _read(self, handle: int, offset: int, length: int) -> tuple[OpenFile, bytes]:
        f = self.get(handle)
        if offset > f.len:
            raise AccessError(codes.CAPABILITY_DENIED, f"offset {offset} is past end of file ({f.len} bytes)")
        want = min(length, self.max_window_bytes, f.len - offset)
        try:
            data = os.pread(f.fd, want, offset) if want > 0 else b""
        except OSError as e:
            raise AccessError(codes.CAPABILITY_DENIED, f"cannot read {f.path}: {e.strerror}") from None
        f.bytes_read += len(data)
        return f, data

    def slice_bytes(self, handle: int, offset: int, length: int) -> Window:
        _, data = self._read(handle, offset, length)
        return Window(data, offset, offset + len(data))

    def slice(self, handle: int, offset: int, length: int) -> Window:
        f, data = self._read(handle, offset, length)
        valid, text = utf8_prefix(data)
        if valid == 0 and data:
            if _incomplete_lead(data):
                if offset + len(data) < f.len:
                    raise AccessError(codes.CAPABILITY_DENIED,
                                      f"window of {len(data)} bytes is too small to hold one character")
                raise AccessError(codes.CAPABILITY_DENIED,
                                  f"the file ends inside a UTF-8 character at offset {offset}")
            raise AccessError(codes.CAPABILITY_DENIED,
                              f"the bytes at offset {offset} of handle {handle} are not valid UTF-8 text; "
                              f"read them with slice_bytes")
        return Window(data[:valid] if valid < len(data) else data, offset, offset + valid, text)

    def close(self) -> None:
        for f in self._files.values():
            try:
                os.close(f.fd)
            except OSError:
                pass
        self._files.clear()
        self.held_bytes = 0


def anonymous_file(data: bytes = b"") -> int:
    """A read-write descriptor of a file with no name holding ``data`` (memfd, else an unlinked temp file)."""
    try:
        fd = os.memfd_create("tensorjob", os.MFD_CLOEXEC)
    except (AttributeError, OSError):
        import tempfile

        fd, name = tempfile.mkstemp(prefix="tensorjob-")
        os.unlink(name)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    except BaseException:
        os.close(fd)
        raise
    return fd


def _incomplete_lead(data: bytes) -> bool:
    """True when ``data`` starts a valid multi-byte character that was cut short."""
    lead = data[0]
    need = 2 if lead >> 5 == 0b110 else 3 if lead >> 4 == 0b1110 else 4 if lead >> 3 == 0b11110 else 0
    return need > len(data) and all(b >> 6 == 0b10 for b in data[1:])


__all__ = [
    "SNIFF_BYTES", "DEFAULT_MAX_HANDLE_BYTES", "sniff", "utf8_prefix", "OpenFile", "Window", "Handles",
    "anonymous_file"
]

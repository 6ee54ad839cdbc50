"""What one job read: the text windows the host served it, kept so that its result can be located in them.

Every answer that serves text -- ``slice``/``slice_bytes`` of a file or a fetched body, a page's text, a whole
document's text -- passes the reactor's loop as a (command, event) pair, live and in a replay alike.
``ReadWindows.note`` keeps its bytes under the ``Place`` they came from (a file, one fetch of a URL, a page of
either) and their byte offset; ``segments()`` merges one place's overlapping or touching windows, so a value cut
by consecutive windows is found whole. Each fetch is a place of its own (``Place.fetch``): two downloads of one
URL may differ and are never spliced by offset. ``document_text`` is split back into pages at the engine's form
feeds, so every offset is into one page's text.

Bounded: at most ``MAX_KEPT_BYTES`` of windows are kept per job (the first read; the rest are counted in
``dropped`` and not searched); the windows themselves are bounded by the job's limits.
"""

from __future__ import annotations

import base64
import binascii
import codecs
import urllib.parse
from dataclasses import dataclass
from typing import Any, Iterator

from tensorjob_jupyter import abi

#: Bytes of windows one job keeps for locating its result (the first read; the rest are not searched).
MAX_KEPT_BYTES = 16 * 1024 * 1024
#: Pieces of valid UTF-8 one run of bytes (from ``slice_bytes``) is cut into at most, and the shortest kept.
MAX_PIECES = 256
MIN_PIECE_BYTES = 2
#: What ``document_text`` puts between two pages' texts (``world/docworker.py``).
PAGE_BREAK = "\f"


#: Rounds of percent-decoding ``url_texts`` applies at most (a value encoded twice, or three times, still shows).
MAX_URL_DECODINGS = 4


@dataclass(frozen=True, order=True)
class Place:
    """Where a window's bytes came from: a file (its resolved path) or a fetched URL, and a page of it
    (zero-based; None: the bytes of the file or body itself).

    ``url`` is the URL exactly as the guest asked for it in ``fetch`` (what a person reads in a source; a
    redirect's target is in the ``job.fetch`` event). ``fetch`` is the handle that fetch was opened as: one
    download, as a job's handles are never reused -- the ``job.fetch`` event with this handle tells its final
    URL, status and type. Two fetches of one URL are two places (None for a file: a file opened twice is one).
    """

    file: str | None = None
    url: str | None = None
    page: int | None = None
    fetch: int | None = None

    @property
    def url_texts(self) -> tuple[str, ...]:
        """The text the guest chose for this place (``url_texts(url)``); ``()`` for a file."""
        return url_texts(self.url) if self.url is not None else ()


def url_texts(url: str) -> tuple[str, ...]:
    """``url`` as a server may read it back: as written, percent-decoded (UTF-8, undecodable bytes replaced)
    and again while that changes (``MAX_URL_DECODINGS`` rounds), each once with ``+`` kept and once read as a
    space (a form's query), distinct forms in that order. Not folded: compare them as the match compared.

    The guest chose the URL, so a body that repeats part of it (a search page's "results for ...", an error
    page naming the path) says only what the guest said: text found in one of these forms is no evidence."""
    out = [url]
    for unquote in (urllib.parse.unquote, urllib.parse.unquote_plus):
        text = url
        for _ in range(MAX_URL_DECODINGS):
            decoded = unquote(text)
            if decoded == text:
                break
            text = decoded
            if text not in out:
                out.append(text)
    return tuple(out)


@dataclass(frozen=True)
class Segment:
    """Bytes read from one place, contiguous, starting at byte ``start`` of it."""

    place: Place
    start: int
    data: bytes

    @property
    def end(self) -> int:
        return self.start + len(self.data)

    def pieces(self) -> Iterator[tuple[int, str]]:
        """``(byte offset in the place, text)`` for each run of valid UTF-8 in the segment, in order: the whole
        segment when it is text; for bytes read with ``slice_bytes`` (which may cut a character, or not be text
        at all), the valid runs between the bytes that are not, at most ``MAX_PIECES`` of them."""
        view, pos, given = memoryview(self.data), 0, 0
        while pos < len(view) and given < MAX_PIECES:
            try:
                text, _ = codecs.utf_8_decode(view[pos:], "strict", True)
            except UnicodeDecodeError as e:
                if e.start >= MIN_PIECE_BYTES:
                    text, _ = codecs.utf_8_decode(view[pos:pos + e.start], "strict", True)
                    given += 1
                    yield self.start + pos, text
                pos += e.start + max(1, e.end - e.start)
                continue
            yield self.start + pos, text
            return


class ReadWindows:
    """The windows one job read, by place (see the module doc). ``note`` is called with every command the host
    answered and the event that answered it; it never raises."""

    def __init__(self, max_kept_bytes: int = MAX_KEPT_BYTES):
        self.max_kept_bytes = max_kept_bytes
        self.kept = 0
        self.dropped = 0
        self._windows: list[tuple[Place, int, bytes]] = []
        self._urls: dict[int, str] = {}  # handle -> the URL it was fetched from

    def note(self, command: abi.Command, event: abi.Event, handles: Any) -> None:
        """Keep what ``event`` served in answer to ``command`` (``handles``: the job's ``world.files.Handles``)."""
        try:
            self._note(command, event, handles)
        except Exception:  # noqa: BLE001 - locating is a service on top of the job: never its failure
            pass

    def _note(self, command: abi.Command, event: abi.Event, handles: Any) -> None:
        if isinstance(command, abi.Fetch) and isinstance(event, abi.Opened):
            self._urls[event.handle] = command.url
        elif isinstance(command, abi.Slice) and isinstance(event, abi.Sliced):
            self._keep(self._place(command.handle, handles), command.offset, event.text.encode("utf-8"))
        elif isinstance(command, abi.SliceBytes) and isinstance(event, abi.SlicedBytes):
            place = self._place(command.handle, handles)
            if place is not None:
                size = len(event.bytes_base64) * 3 // 4
                if self.kept + size > self.max_kept_bytes:
                    self.dropped += size
                    return
                try:
                    data = base64.b64decode(event.bytes_base64)
                except (binascii.Error, ValueError):
                    return
                self._keep(place, command.offset, data)
        elif isinstance(command, (abi.PageText, abi.PageTextOpt)) and isinstance(
                event, (abi.PageTexted, abi.PageTextAttempted)) and event.text is not None:
            place = self._place(command.handle, handles, page=command.page)
            self._keep(place, 0, event.text.encode("utf-8"))
        elif isinstance(command, abi.DocumentText) and isinstance(event, abi.PageTexted):
            pages = getattr(handles.get(command.handle).kind, "pages", None)
            parts = event.text.split(PAGE_BREAK)
            if pages is None or len(parts) != pages:
                self.dropped += len(event.text)
                return
            for page, text in enumerate(parts):
                self._keep(self._place(command.handle, handles, page=page), 0, text.encode("utf-8"))

    def _place(self, handle: int, handles: Any, *, page: int | None = None) -> Place | None:
        """Where ``handle``'s bytes come from: the fetch that opened it (its URL, and the handle, which names
        that one download), else its file; None for bytes the host made (a rendered page, an image-op result),
        which no answer is copied from."""
        url = self._urls.get(handle)
        if url is not None:
            return Place(url=url, page=page, fetch=handle)
        f = handles.get(handle)
        if f.held:
            return None
        return Place(file=str(f.path), page=page)

    def _keep(self, place: Place | None, start: int, data: bytes) -> None:
        if place is None or not data:
            return
        if self.kept + len(data) > self.max_kept_bytes:
            self.dropped += len(data)
            return
        self.kept += len(data)
        self._windows.append((place, start, data))

    def __len__(self) -> int:
        return len(self._windows)

    def clear(self) -> None:
        """Let the windows go (the job has ended: a finished job keeps nothing bulky)."""
        self._windows = []
        self._urls = {}

    def texts(self) -> Iterator[str]:
        """The text of what was read, segment by segment (``segments()``' order), each valid UTF-8 run apart."""
        for segment in self.segments():
            for _, text in segment.pieces():
                yield text

    def segments(self) -> list[Segment]:
        """The windows merged: per place, each run of overlapping or touching windows as one ``Segment``, the
        places in the order they were first read and each place's segments in byte order. Windows of two
        places never merge: not a page with another, nor one fetch's body with another fetch's of one URL."""
        by_place: dict[Place, list[tuple[int, bytes]]] = {}
        for place, start, data in self._windows:
            by_place.setdefault(place, []).append((start, data))
        out: list[Segment] = []
        for place, windows in by_place.items():
            windows.sort(key=lambda w: w[0])
            start, run = windows[0][0], bytearray(windows[0][1])
            for w_start, data in windows[1:]:
                end = start + len(run)
                if w_start <= end:
                    if w_start + len(data) > end:
                        run += data[end - w_start:]
                else:
                    out.append(Segment(place, start, bytes(run)))
                    start, run = w_start, bytearray(data)
            out.append(Segment(place, start, bytes(run)))
        return out


__all__ = ["MAX_KEPT_BYTES", "MAX_PIECES", "MIN_PIECE_BYTES", "PAGE_BREAK", "MAX_URL_DECODINGS", "Place", "Segment",
           "ReadWindows", "url_texts"]

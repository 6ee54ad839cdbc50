"""A source's place read again: the text around a field's span, from the file its source names.

A source names a file and byte offsets (``host/grounding.py``). A transcript or a run folder can come from
elsewhere: its offsets and paths are untrusted, so the read is bounded (``CONTEXT_BYTES`` a side, at most
``SPAN_BYTES`` of the span), from a regular file only, and decoded with replacement; a page's text or a fetched
body (which the host does not keep) gives no excerpt. The text is not yet made safe for any display: the terminal
(``history/sources.py``), the map view and the review (``fanout/review_rows.py``) escape it for their own.
"""

from __future__ import annotations

import os

from tensorjob_jupyter.regular_file import open_fd

#: Bytes of context read on each side of a span, and the most of the span itself shown.
CONTEXT_BYTES = 40
SPAN_BYTES = 200


def excerpt_parts(source: dict, context: int = CONTEXT_BYTES) -> tuple[str, str, str, bool] | None:
    """(the text before the span, the span -- at most ``SPAN_BYTES`` of it, ``…`` where cut -- the text after
    it, whether the file goes on before) read again from ``source``'s file, each decoded with replacement and
    at most ``context`` bytes of it a side; None where there is no file to read. Not yet made safe for
    any display: the caller escapes for its own."""
    path, page = source.get("file"), source.get("page")
    start, end = source.get("start"), source.get("end")
    if not isinstance(path, str) or page is not None or not isinstance(start, int) or not isinstance(end, int):
        return None
    if start < 0 or end < start:
        return None
    try:
        fd = open_fd(path)  # a regular file only: a FIFO or a device named by a transcript is never read
    except (OSError, ValueError):
        return None
    try:
        lo = max(0, start - context)
        span_end = min(end, start + SPAN_BYTES)
        data = os.pread(fd, (span_end - lo) + context, lo)
    except OSError:
        return None
    finally:
        os.close(fd)
    before = data[:start - lo].decode("utf-8", "replace")
    span = data[start - lo:span_end - lo].decode("utf-8", "replace") + ("…" if span_end < end else "")
    after = data[span_end - lo:].decode("utf-8", "replace") if span_end == end else ""
    return before, span, after, lo > 0


__all__ = ["CONTEXT_BYTES", "SPAN_BYTES", "excerpt_parts"]

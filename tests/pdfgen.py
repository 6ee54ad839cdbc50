"""Test fixtures for documents and images, written into each test's tmp dir.

PDFs come from ``examples/make_sample_pdf.build_pdf`` (the writer of the
notebook's sample); the hostile ones are built here: lies in the page tree,
truncations, pages of absurd size, content streams that take the renderer
minutes. Images are written with Pillow, or by hand where Pillow would
refuse to write them (a PNG header claiming 100000 x 100000 pixels).
"""

from __future__ import annotations

import io
import struct
import sys
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))

from make_sample_pdf import build_pdf, sample_pdf, scanned_text_image  # noqa: E402

__all__ = ["build_pdf", "sample_pdf", "text_pdf", "scanned_pdf", "malformed_pdf", "truncated_pdf", "png",
           "png_claiming", "jpeg_claiming", "render_bomb_pdf"]

PAGES = [["Alpha page zero: apples and anchors."], ["Beta page one: boats, bells and bridges."],
         ["Gamma page two: gulls over the grey harbour."]]


def text_pdf(pages: list[list[str]] = PAGES, **kwargs) -> bytes:
    return build_pdf([{"text": lines} for lines in pages], **kwargs)


def scanned_pdf(pages: int = 2) -> bytes:
    return build_pdf([{"image": scanned_text_image([f"scanned page {i}"], 200, 260)} for i in range(pages)])


def malformed_pdf() -> bytes:
    return b"%PDF-1.7\n1 0 obj << /Type /Catalog /Pages 2 0 R >> endobj\nthis is not a pdf at all\n"


def truncated_pdf() -> bytes:
    data = text_pdf()
    return data[: data.index(b"xref") + 10]  # the cross-reference table cut off


def render_bomb_pdf(ops: int = 3_000_000) -> bytes:
    """One page whose (80 KB, compressed) content stream draws millions of lines."""
    return build_pdf([{"content": b"0 0 m 1 1 l S\n" * ops, "compress": True}])


def _chunk(tag: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))


def png_claiming(width: int, height: int) -> bytes:
    """A PNG whose header claims ``width`` x ``height`` grey pixels, with almost no data."""
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
            + _chunk(b"IDAT", zlib.compress(b"\0" * 64)) + _chunk(b"IEND", b""))


def jpeg_claiming(width: int, height: int) -> bytes:
    """A JPEG whose frame header claims ``width`` x ``height``, with no scan data."""
    sof = struct.pack(">BHHB", 8, height, width, 1) + b"\x01\x11\x00"
    return b"\xff\xd8" + b"\xff\xc0" + struct.pack(">H", len(sof) + 2) + sof + b"\xff\xd9"


def png(width: int, height: int, mode: str = "RGB", fmt: str = "PNG") -> bytes:
    """A real image: a diagonal gradient, so crops and resizes are visible."""
    from PIL import Image

    image = Image.new(mode, (width, height))
    if mode in ("RGB", "RGBA", "L"):
        image.putdata([((x * 255) // max(1, width - 1),) * len(mode) if mode != "L" else (x * 255) // max(1, width - 1)
                       for y in range(height) for x in range(width)])
    out = io.BytesIO()
    image.save(out, format=fmt)
    return out.getvalue()

"""Write examples/data/sample.pdf: a small PDF with a text layer and one scanned page.

    python examples/make_sample_pdf.py            # rewrites examples/data/sample.pdf

The notebook ``notebooks/07-documents.ipynb`` reads the file this writes. The
PDF is written by hand (``build_pdf``), object by object, so the script needs
nothing beyond Pillow (to draw the "scanned" page) and every byte is
explained here: three pages carry real text in the standard Helvetica font
(a text layer, what ``page_text`` reads), and page 2 is only a grey-scale
picture of text, as a scanner would make it -- it has no text layer, so
``page_text`` refuses it and ``page_text_opt`` answers with an error.

``build_pdf`` is also what the tests use to write their PDFs, hostile ones
included (see tests/pdfgen.py).
"""

from __future__ import annotations

import io
import sys
import zlib
from pathlib import Path

#: US Letter, in points (1/72 inch).
LETTER = (612, 792)


def _num(value: float) -> bytes:
    """A PDF number: plain decimal notation (PDF has no exponents)."""
    text = f"{value:.4f}".rstrip("0").rstrip(".")
    return text.encode("ascii")


def _pdf_string(text: str) -> bytes:
    """A PDF literal string for WinAnsi text: parentheses and backslashes escaped."""
    raw = text.encode("cp1252", errors="replace")
    return b"(" + raw.replace(b"\\", b"\\\\").replace(b"(", b"\\(").replace(b")", b"\\)") + b")"


def text_content(lines: list[str], *, size: int = 12, top: float = 720, left: float = 72) -> bytes:
    """A content stream that writes ``lines`` top to bottom in Helvetica."""
    ops = [b"BT", b"/F1 %d Tf" % size, b"%d TL" % int(size * 1.3), _num(left) + b" " + _num(top) + b" Td"]
    for i, line in enumerate(lines):
        ops.append(_pdf_string(line) + (b" Tj" if i == 0 else b" '"))
    ops.append(b"ET")
    return b"\n".join(ops) + b"\n"


def build_pdf(pages: list[dict], *, page_count: int | None = None, trailer_extra: bytes = b"") -> bytes:
    """A PDF whose pages are described by dicts; returns its bytes.

    Each page: ``{"text": [lines]}`` (a text layer), ``{"image": (width,
    height, grey_bytes)}`` (a picture filling the page, no text), or
    ``{"content": bytes, "compress": bool}`` (a raw content stream), with an
    optional ``"size": (w, h)`` in points (default US Letter).
    ``page_count`` overrides the page tree's ``/Count`` (hostile files lie).
    """
    objects: list[bytes] = []

    def add(body: bytes) -> int:
        objects.append(body)
        return len(objects)

    catalog = add(b"")  # filled in below
    tree = add(b"")
    font = add(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>")
    kids = []
    for page in pages:
        width, height = page.get("size", LETTER)
        resources = b"/Font << /F1 %d 0 R >>" % font
        if "image" in page:
            iw, ih, grey = page["image"]
            data = zlib.compress(grey, 9)
            image = add(b"<< /Type /XObject /Subtype /Image /Width %d /Height %d /ColorSpace /DeviceGray "
                        b"/BitsPerComponent 8 /Filter /FlateDecode /Length %d >>\nstream\n" % (iw, ih, len(data))
                        + data + b"\nendstream")
            resources += b" /XObject << /Im1 %d 0 R >>" % image
            content = b"q " + _num(width) + b" 0 0 " + _num(height) + b" 0 0 cm /Im1 Do Q\n"
        elif "content" in page:
            content = page["content"]
        else:
            content = text_content(page.get("text", []))
        if page.get("compress", "image" not in page and "content" in page):
            content = zlib.compress(content, 9)
            stream = add(b"<< /Length %d /Filter /FlateDecode >>\nstream\n" % len(content) + content + b"\nendstream")
        else:
            stream = add(b"<< /Length %d >>\nstream\n" % len(content) + content + b"\nendstream")
        kids.append(add(b"<< /Type /Page /Parent %d 0 R /MediaBox [0 0 %s %s] /Resources << %s >> /Contents %d 0 R >>"
                        % (tree, _num(width), _num(height), resources, stream)))
    objects[catalog - 1] = b"<< /Type /Catalog /Pages %d 0 R >>" % tree
    count = len(kids) if page_count is None else page_count
    objects[tree - 1] = (b"<< /Type /Pages /Kids [" + b" ".join(b"%d 0 R" % k for k in kids)
                         + b"] /Count %d >>" % count)

    out = io.BytesIO()
    out.write(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(out.tell())
        out.write(b"%d 0 obj\n" % number + body + b"\nendobj\n")
    xref = out.tell()
    out.write(b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1))
    for offset in offsets:
        out.write(b"%010d 00000 n \n" % offset)
    out.write(b"trailer\n<< /Size %d /Root %d 0 R %s>>\nstartxref\n%d\n%%%%EOF\n"
              % (len(objects) + 1, catalog, trailer_extra, xref))
    return out.getvalue()


def scanned_text_image(lines: list[str], width: int = 612, height: int = 792) -> tuple[int, int, bytes]:
    """A grey-scale picture of ``lines`` (what a scanner makes of a printed page)."""
    from PIL import Image, ImageDraw

    image = Image.new("L", (width, height), 255)
    draw = ImageDraw.Draw(image)
    y = 72
    for line in lines:
        draw.text((72, y), line, fill=0)
        y += 16
    return width, height, image.tobytes()


SAMPLE_PAGES = [
    ["The Lighthouse Keeper's Log", "",
     "Page one. The lamp was lit at dusk and the fog came in before the tide.",
     "Three ships passed to the north; none answered the horn."],
    ["Page two. At midnight the lens cracked along its lower prism.",
     "The keeper fitted the spare and wrote to the harbour master for another.",
     "By dawn the light turned again, a little dimmer on its western side."],
    None,  # the scanned page
    ["Page four. The supply boat came on the third day with oil, bread and a new lens.",
     "The keeper's log ends: all lights burning, sea calm, nothing to report."],
]


def sample_pdf() -> bytes:
    pages = []
    for lines in SAMPLE_PAGES:
        if lines is None:
            pages.append({"image": scanned_text_image(
                ["Page three (scanned). A letter from the harbour master,",
                 "pasted into the log: the new lens is on its way."], 306, 396)})
        else:
            pages.append({"text": lines})
    return build_pdf(pages)


def main(argv: list[str]) -> None:
    target = Path(argv[0]) if argv else Path(__file__).resolve().parent / "data" / "sample.pdf"
    data = sample_pdf()
    target.write_bytes(data)
    print(f"{target} ({len(data)} bytes, {len(SAMPLE_PAGES)} pages)")


if __name__ == "__main__":
    main(sys.argv[1:])

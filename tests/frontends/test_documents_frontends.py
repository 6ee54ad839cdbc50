"""Documents, images and fetch in the front ends: the view's Files panel and the CLI (the magic's --fetch: test_magic.py)."""

from __future__ import annotations

import base64
import io
import json

import pytest
from PIL import Image

import pdfgen
import tensorjob_jupyter as tj
import wat
from tensorjob_jupyter.frontends.cli import main
from tensorjob_jupyter.frontends.terminal import LivePrinter
from tensorjob_jupyter.frontends.view import render
from tensorjob_jupyter.frontends.view.state import ViewState

DONE = {"cmd": "done", "result": "ok"}


def ev(type, **fields):
    return {"type": type, "sequence_number": 0, "job_id": "j", **fields}


def tiny_png(colour=(255, 0, 0)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (4, 3), colour).save(out, format="PNG")
    return out.getvalue()


def opened_doc(s, handle=0, pages=5, path="doc.pdf"):
    s.apply(ev("job.file.opened", handle=handle, path=path, len=1000,
               kind={"kind": "document", "pages": pages, "has_text_layer": True}))


def page(handle=0, page=0, pages=5, command="page_text", error=None, preview="text", chars=4):
    return ev("job.document.page", handle=handle, command=command, page=page, pages=pages, pages_read=1,
              chars=chars, error=error, preview=preview)


# --- view state and HTML -----------------------------------------------------------------------------


def test_pages_read_and_the_latest_page_text_show_in_the_files_panel():
    s = ViewState()
    opened_doc(s)
    s.apply(page(page=1, preview="page one text"))
    s.apply(page(page=3, preview="<b>page three</b>"))
    s.apply(page(page=4, command="page_text_opt", error="page 4 has no text layer", preview=""))
    f = s.files[0]
    assert f.pages == 5 and f.pages_read == {1, 3} and f.page_no == 4 and f.page_error
    html = render.files(s)
    assert 'data-pages-read="2"' in html and "2 of 5 pages read" in html
    assert "page 4 has no text layer" in html
    s.apply(page(page=3, preview="<b>page three</b>"))
    html = render.files(s)
    assert "&lt;b&gt;page three&lt;/b&gt;" in html and "<b>page three" not in html


def test_document_text_marks_every_page_and_page_images_count_as_read():
    s = ViewState()
    opened_doc(s, pages=3)
    s.apply(page(page=2, pages=3, command="page_image", preview=""))
    assert s.files[0].pages_read == {2} and s.files[0].page_text is None
    s.apply(page(page=None, pages=3, command="document_text", preview="all of it"))
    assert "3 of 3 pages read" in render.files(s) and "all pages" in render.files(s)


def test_hostile_page_events_do_not_break_the_view():
    s = ViewState()
    opened_doc(s, pages=3)
    for bad in [page(page=10**9, pages=3), page(page=-1, pages=3), page(page="2", pages=3), page(page=7, pages=-5),
                page(handle=99, pages=3), page(page=True, pages=3), ev("job.document.page", handle=0)]:
        s.apply(bad)
    assert s.files[0].pages_read == set() and "0 of 3 pages read" in render.files(s)


def test_image_thumbnails_are_png_data_uris_built_from_the_bytes():
    s = ViewState()
    png = tiny_png()
    s.apply(ev("job.image.created", handle=1, source=0, len=500, width=1024, height=1326, label="page 0 of #0",
               page=0, thumbnail_base64=base64.b64encode(png).decode()))
    html = render.files(s)
    assert f'src="data:image/png;base64,{base64.b64encode(png).decode()}"' in html
    assert "1024×1326 px" in html and "page 0 of #0" in html


@pytest.mark.parametrize("thumb", [
    base64.b64encode(b"<svg onload=alert(1)>").decode(),             # not a PNG
    '" onerror="alert(1)',                                          # not base64 at all
    base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 70_000).decode(),  # too large
    "iVBORw0KGgo=\"><script>alert(1)</script>",                     # base64 followed by markup
])
def test_a_hostile_thumbnail_is_not_shown(thumb):
    s = ViewState()
    s.apply(ev("job.image.created", handle=1, source=0, len=5, width=1, height=1, label="<script>x</script>",
               thumbnail_base64=thumb))
    html = render.files(s)
    assert "<img" not in html and "<script>" not in html and "onerror" not in html.replace("&quot;", "")


def test_only_the_latest_thumbnails_are_sent():
    s = ViewState()
    png = base64.b64encode(tiny_png()).decode()
    for h in range(10):
        s.apply(ev("job.image.created", handle=h, source=0, len=5, width=4, height=3, label=f"img {h}",
                   thumbnail_base64=png))
    assert render.files(s).count("<img") == render.MAX_THUMBNAILS


def test_a_fetched_handle_appears_in_the_files_panel():
    s = ViewState()
    s.apply(ev("job.fetch", handle=0, url="http://h/<x>", final_url="http://h/<x>", status=200, content_type=None,
               redirects=0, len=12, kind={"kind": "text"}))
    s.apply(ev("job.file.sliced", handle=0, offset=0, requested=12, length=12, next_offset=12, binary=False,
               preview="hello"))
    html = render.files(s)
    assert "http://h/&lt;x&gt;" in html and 'data-covered="100.0"' in html


def test_a_real_document_job_fills_the_view(tmp_path):
    from tensorjob_jupyter.frontends.view.widget import JobView

    (tmp_path / "doc.pdf").write_bytes(pdfgen.text_pdf())
    job = tj.Job(wat.script_guest([{"cmd": "open", "path": str(tmp_path / "doc.pdf")},
                                   {"cmd": "page_text", "handle": 0, "page": 1},
                                   {"cmd": "page_image", "handle": 0, "page": 0},
                                   {"cmd": "image_op", "handle": 1, "op": {"op": "resize", "max_width": 64,
                                                                          "max_height": 64}}, DONE]),
                 read=[tmp_path], backend=None)
    view = JobView(job, refresh_hz=20).start()
    assert job.start().wait(60).ok
    view.join(10)
    html = view.files.value
    assert "2 of 3 pages read" in html and "Beta page one" in html
    assert html.count('src="data:image/png;base64,') == 2 and "49×64 px" in html


# --- the CLI -------------------------------------------------------------------------------------------


def printed(events):
    out, err = io.StringIO(), io.StringIO()
    printer = LivePrinter.__new__(LivePrinter)
    printer.out, printer.err, printer.quiet, printer._in_text, printer.chunks_to_stdout = out, err, False, False, True
    for e in events:
        printer.show(e)
    return err.getvalue()


def test_the_cli_prints_one_line_per_page_image_and_fetch():
    text = printed([page(page=2, chars=120), page(page=3, command="page_text_opt", error="no \x1b[31mtext"),
                    page(page=None, command="document_text", chars=900),
                    ev("job.image.created", handle=1, source=0, len=2048, width=1024, height=1326,
                       label="page 2 of #0", page=2, thumbnail_base64=""),
                    ev("job.fetch", handle=2, url="https://example.org/a\x1b]0;t\x07", final_url="x", status=200,
                       content_type=None, redirects=1, len=10, kind={"kind": "document", "pages": 1,
                                                                     "has_text_layer": True})])
    assert text.splitlines() == [
        "· page_text #0 page 2 of 5 (120 chars)",
        "· page_text_opt #0 page 3 of 5: no text",
        "· document_text #0 every page (900 chars)",
        "· image #1 = page 2 of #0: 1024x1326 PNG, 2048 bytes",
        "· fetch https://example.org/a -> #2 (200, 10 bytes, document, 1 redirects)",
    ]


def test_cli_run_with_a_document(tmp_path):
    (tmp_path / "doc.pdf").write_bytes(pdfgen.text_pdf())
    guest = tmp_path / "g.wasm"
    guest.write_bytes(wat.script_guest([{"cmd": "open", "path": str(tmp_path / "doc.pdf")},
                                        {"cmd": "page_text", "handle": 0, "page": 0}, DONE]))
    out, err = io.StringIO(), io.StringIO()
    code = main(["run", str(guest), "--read", str(tmp_path)], out=out, err=err)
    assert code == 0 and json.loads(out.getvalue()) == "ok"
    assert "· page_text #0 page 0 of 3 (" in err.getvalue()


@pytest.mark.parametrize("prefix,fragment", [("example.org", "only http and https"),
                                             ("https://x.example/?q", "no query or fragment")])
def test_cli_fetch_grants_are_checked_before_the_job(tmp_path, prefix, fragment):
    guest = tmp_path / "g.wasm"
    guest.write_bytes(wat.script_guest([DONE]))
    out, err = io.StringIO(), io.StringIO()
    assert main(["run", str(guest), "--fetch", prefix], out=out, err=err) == 2
    assert err.getvalue().startswith("tensorjob: error: --fetch: fetch grant") and fragment in err.getvalue()


def test_cli_fetch_grants_reach_the_job(tmp_path):
    guest = tmp_path / "g.wasm"
    guest.write_bytes(wat.script_guest([{"cmd": "fetch", "url": "https://example.org.evil/x"}, DONE]))
    events = tmp_path / "ev.jsonl"
    out, err = io.StringIO(), io.StringIO()
    code = main(["run", str(guest), "--fetch", "https://example.org/", "--fetch", "http://127.0.0.1:1/",
                 "--events", str(events), "--json"], out=out, err=err)
    assert code == 1 and json.loads(out.getvalue())["error"]["code"] == "capability_denied"
    created = json.loads(events.read_text().splitlines()[0])
    assert created["fetch"] == ["https://example.org/", "http://127.0.0.1:1/"]


def test_an_opened_document_shows_its_pages_before_any_is_read():
    s = ViewState()
    opened_doc(s, pages=7)
    assert s.files[0].pages == 7 and "0 of 7 pages read" in render.files(s)
    s.apply(ev("job.fetch", handle=1, url="http://h/a.pdf", final_url="http://h/a.pdf", status=200,
               content_type="application/pdf", redirects=0, len=10,
               kind={"kind": "document", "pages": 2, "has_text_layer": False}))
    assert s.files[1].pages == 2 and "0 of 2 pages read" in render.files(s)

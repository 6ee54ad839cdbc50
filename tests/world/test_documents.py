"""Documents and images through real jobs: PDFs with and without text, hostile files, every limit.

Each test drives the reactor with a scripted WAT guest (tests/wat.py), so the
exact command sequence is chosen by the test; fixtures are written into the
test's tmp dir by tests/pdfgen.py. The document engine is a real process
(tensorjob_jupyter/docworker.py) running the real pdfium and Pillow; faults
it cannot be made to have on demand (a segfault, a hang, a lying reply) are
injected with its ``TENSORJOB_DOCWORKER_FAULT`` test switch.
"""

from __future__ import annotations

import base64
import io
import threading
import time

import pytest
from PIL import Image

import pdfgen
import tensorjob_jupyter as tj
import wat
from tensorjob_jupyter import abi
from tensorjob_jupyter.abi import codes
from tensorjob_jupyter.world.docworker import FAULT_ENV

DONE = {"cmd": "done", "result": "finished"}


def run_job(commands, tmp_path, **kwargs):
    kwargs.setdefault("read", [tmp_path])
    kwargs.setdefault("backend", None)
    job = tj.Job(wat.script_guest(commands), **kwargs).start()
    job.wait(60)
    return job


def events(job, kind):
    return [e for e in job.events if e["type"] == kind]


def write(tmp_path, name, data):
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


def opened_kind(job, handle=0):
    return next(e for e in job.events if e["type"] in ("job.file.opened", "job.fetch") and e["handle"] == handle)["kind"]


# --- open: sniffing ------------------------------------------------------------------------------


def test_a_text_pdf_opens_as_a_document_with_pages_and_a_text_layer(tmp_path):
    path = write(tmp_path, "doc.pdf", pdfgen.text_pdf())
    job = run_job([{"cmd": "open", "path": path}, DONE], tmp_path)
    assert job.envelope.ok, job.envelope
    assert opened_kind(job) == {"kind": "document", "pages": 3, "has_text_layer": True}


def test_a_scanned_pdf_has_no_text_layer(tmp_path):
    path = write(tmp_path, "scan.pdf", pdfgen.scanned_pdf(2))
    job = run_job([{"cmd": "open", "path": path}, DONE], tmp_path)
    assert opened_kind(job) == {"kind": "document", "pages": 2, "has_text_layer": False}


def test_the_kind_comes_from_the_content_not_the_name(tmp_path):
    pdf = write(tmp_path, "notes.txt", pdfgen.text_pdf())
    image = write(tmp_path, "photo.pdf", pdfgen.png(4, 3))
    jpeg = write(tmp_path, "x.bin", pdfgen.png(4, 3, fmt="JPEG"))
    job = run_job([{"cmd": "open", "path": pdf}, {"cmd": "open", "path": image}, {"cmd": "open", "path": jpeg}, DONE],
                  tmp_path)
    assert opened_kind(job, 0)["kind"] == "document"
    assert opened_kind(job, 1) == {"kind": "image", "format": "png"}
    assert opened_kind(job, 2) == {"kind": "image", "format": "jpeg"}


@pytest.mark.parametrize("make", [pdfgen.malformed_pdf, pdfgen.truncated_pdf], ids=["malformed", "truncated"])
def test_a_pdf_the_engine_cannot_read_opens_as_binary_and_page_commands_say_why(make, tmp_path, healthy):
    path = write(tmp_path, "bad.pdf", make())
    job = run_job([{"cmd": "open", "path": path}, {"cmd": "slice_bytes", "handle": 0, "offset": 0, "len": 5},
                   {"cmd": "page_text", "handle": 0, "page": 0}, DONE], tmp_path)
    assert opened_kind(job) == {"kind": "binary"}
    assert events(job, "job.file.sliced")[0]["preview_base64"] == base64.b64encode(b"%PDF-").decode()
    err = job.envelope.error
    assert err.code == codes.UNSUPPORTED and "cannot read" in err.message and "damaged" in err.message


def test_a_page_tree_that_lies_about_its_count_is_counted_by_the_engine(tmp_path):
    path = write(tmp_path, "liar.pdf", pdfgen.text_pdf(page_count=2_000_000_000))
    job = run_job([{"cmd": "open", "path": path}, DONE], tmp_path)
    assert opened_kind(job) == {"kind": "document", "pages": 3, "has_text_layer": True}


def test_more_pages_than_max_document_pages_fails_at_open(tmp_path, healthy):
    path = write(tmp_path, "long.pdf", pdfgen.text_pdf([[f"page {i}"] for i in range(60)]))
    job = run_job([{"cmd": "open", "path": path}, DONE], tmp_path, limits=tj.Limits(max_document_pages=50))
    err = job.envelope.error
    assert err.code == codes.LIMIT_EXCEEDED and "60 pages" in err.message and "max_document_pages" in err.message
    ok = run_job([{"cmd": "open", "path": path}, DONE], tmp_path, limits=tj.Limits(max_document_pages=60))
    assert ok.envelope.ok


# --- text ----------------------------------------------------------------------------------------


def test_page_text_reads_one_zero_based_page(tmp_path):
    path = write(tmp_path, "doc.pdf", pdfgen.text_pdf())
    job = run_job([{"cmd": "open", "path": path}, {"cmd": "page_text", "handle": 0, "page": 1},
                   {"cmd": "page_text", "handle": 0, "page": 0}, DONE], tmp_path)
    assert job.envelope.ok, job.envelope
    reads = events(job, "job.document.page")
    assert [(r["command"], r["page"], r["pages"], r["pages_read"]) for r in reads] == [
        ("page_text", 1, 3, 1), ("page_text", 0, 3, 2)]
    assert reads[0]["preview"].startswith("Beta page one")
    assert reads[1]["preview"].startswith("Alpha page zero")


def test_the_guest_receives_page_texted(tmp_path):
    """The exact event the guest gets: page_texted with the page's text (checked through the reactor)."""
    from tensorjob_jupyter.host.reactor import Reactor
    from tensorjob_jupyter.world.grants import Grants
    from tensorjob_jupyter.record.events import EventStream

    path = write(tmp_path, "doc.pdf", pdfgen.text_pdf())
    reactor = Reactor(job_id="t", wasm=wat.script_guest([DONE]), input_json=b"{}", grants=Grants.for_paths([tmp_path]),
                      backend=None, limits=tj.Limits(), stream=EventStream("t"), cancel=threading.Event())
    try:
        opened = reactor.carry_out(abi.Open(path))
        assert opened.to_json() == {"event": "opened", "handle": 0, "len": opened.len,
                                    "kind": {"kind": "document", "pages": 3, "has_text_layer": True}}
        texted = reactor.carry_out(abi.PageText(0, 2))
        assert list(texted.to_json()) == ["event", "text"]
        assert texted.text.startswith("Gamma page two: gulls over the grey harbour.")
        everything = reactor.carry_out(abi.DocumentText(0))
        assert everything.to_json()["event"] == "page_texted"
        assert everything.text.split("\f")[1].startswith("Beta page one")
        assert everything.text.count("\f") == 2
        attempt = reactor.carry_out(abi.PageTextOpt(0, 7))
        assert attempt.to_json() == {"event": "page_text_attempted", "text": None,
                                     "error": "page 7 is out of range; the document has 3 pages (pages count from 0)"}
        attempt = reactor.carry_out(abi.PageTextOpt(0, 0))
        assert attempt.error is None and attempt.text.startswith("Alpha")
        imaged = reactor.carry_out(abi.PageImage(0, 0))
        assert imaged.to_json() == {"event": "page_imaged", "handle": 1, "len": imaged.len} and imaged.len > 1000
        first = reactor.carry_out(abi.SliceBytes(1, 0, 8))
        assert base64.b64decode(first.bytes_base64) == b"\x89PNG\r\n\x1a\n"
    finally:
        reactor.documents.close()
        reactor.handles.close()


def test_page_text_on_a_page_without_text_fails(tmp_path, healthy):
    path = write(tmp_path, "scan.pdf", pdfgen.scanned_pdf(1))
    job = run_job([{"cmd": "open", "path": path}, {"cmd": "page_text", "handle": 0, "page": 0}, DONE], tmp_path)
    err = job.envelope.error
    assert err.code == codes.UNSUPPORTED and "page 0 has no text layer" in err.message
    assert "page_image" in err.message and "page_text_opt" in err.message


def test_page_text_out_of_range_fails(tmp_path):
    path = write(tmp_path, "doc.pdf", pdfgen.text_pdf())
    job = run_job([{"cmd": "open", "path": path}, {"cmd": "page_text", "handle": 0, "page": 3}, DONE], tmp_path)
    assert job.envelope.error.to_json() == {
        "code": "unsupported", "message": "page 3 is out of range; the document has 3 pages (pages count from 0)"}


def test_page_text_opt_answers_with_an_error_and_the_job_goes_on(tmp_path):
    path = write(tmp_path, "mixed.pdf", pdfgen.build_pdf([{"text": ["words here"]},
                                                          {"image": pdfgen.scanned_text_image(["x"], 50, 60)}]))
    job = run_job([{"cmd": "open", "path": path}, {"cmd": "page_text_opt", "handle": 0, "page": 0},
                   {"cmd": "page_text_opt", "handle": 0, "page": 1}, {"cmd": "page_text_opt", "handle": 0, "page": 9},
                   DONE], tmp_path)
    assert job.envelope.ok, job.envelope
    reads = events(job, "job.document.page")
    assert [(r["page"], r["error"] is None, r["pages_read"]) for r in reads] == [(0, True, 1), (1, False, 1),
                                                                                (9, False, 1)]
    assert "no text layer" in reads[1]["error"] and "out of range" in reads[2]["error"]


def test_page_text_opt_on_something_that_is_not_a_document_is_an_error_answer(tmp_path):
    path = write(tmp_path, "a.txt", b"plain text")
    job = run_job([{"cmd": "open", "path": path}, {"cmd": "page_text_opt", "handle": 0, "page": 0}, DONE], tmp_path)
    assert job.envelope.ok
    assert "handle 0 holds text, not a document" in events(job, "job.document.page")[0]["error"]


@pytest.mark.parametrize("command", [{"cmd": "page_text", "handle": 5, "page": 0},
                                     {"cmd": "page_text_opt", "handle": 5, "page": 0},
                                     {"cmd": "document_text", "handle": 5},
                                     {"cmd": "page_image", "handle": 5, "page": 0},
                                     {"cmd": "image_op", "handle": 5, "op": {"op": "crop", "x": 0, "y": 0,
                                                                             "width": 1, "height": 1}}],
                         ids=lambda c: c["cmd"])
def test_a_handle_the_job_does_not_hold_is_capability_denied(command, tmp_path):
    job = run_job([command, DONE], tmp_path)
    assert job.envelope.error.to_json() == {"code": "capability_denied", "message": "no such handle: 5"}


def test_page_commands_on_a_text_file_fail_clearly(tmp_path):
    path = write(tmp_path, "a.txt", b"plain text")
    job = run_job([{"cmd": "open", "path": path}, {"cmd": "page_text", "handle": 0, "page": 0}, DONE], tmp_path)
    assert job.envelope.error.to_json() == {
        "code": "unsupported", "message": "page_text: handle 0 holds text, not a document; page_text reads PDFs"}


def test_document_text_joins_pages_with_form_feeds_and_refuses_a_scan(tmp_path):
    path = write(tmp_path, "doc.pdf", pdfgen.text_pdf())
    job = run_job([{"cmd": "open", "path": path}, {"cmd": "document_text", "handle": 0}, DONE], tmp_path)
    assert job.envelope.ok
    [read] = events(job, "job.document.page")
    assert (read["command"], read["page"], read["pages_read"]) == ("document_text", None, 3)
    scan = write(tmp_path, "scan.pdf", pdfgen.scanned_pdf(2))
    job = run_job([{"cmd": "open", "path": scan}, {"cmd": "document_text", "handle": 0}, DONE], tmp_path)
    assert job.envelope.error.code == codes.UNSUPPORTED and "no text layer" in job.envelope.error.message


def test_text_per_call_is_limited(tmp_path, healthy):
    long_page = ["word " * 30] * 40  # about 6000 bytes of text on one page
    path = write(tmp_path, "long.pdf", pdfgen.text_pdf([long_page, ["short page"]]))
    limits = tj.Limits(max_text_bytes=1000)
    job = run_job([{"cmd": "open", "path": path}, {"cmd": "page_text", "handle": 0, "page": 0}, DONE], tmp_path,
                  limits=limits)
    err = job.envelope.error
    assert err.code == codes.LIMIT_EXCEEDED and "max_text_bytes" in err.message
    job = run_job([{"cmd": "open", "path": path}, {"cmd": "page_text_opt", "handle": 0, "page": 0},
                   {"cmd": "page_text", "handle": 0, "page": 1}, DONE], tmp_path, limits=limits)
    assert job.envelope.ok
    assert "max_text_bytes" in events(job, "job.document.page")[0]["error"]
    job = run_job([{"cmd": "open", "path": path}, {"cmd": "document_text", "handle": 0}, DONE], tmp_path,
                  limits=limits)
    assert job.envelope.error.code == codes.LIMIT_EXCEEDED and "page by page" in job.envelope.error.message


# --- page images and image operations -----------------------------------------------------------------


def test_page_image_renders_a_new_png_handle_readable_with_slice_bytes(tmp_path):
    path = write(tmp_path, "doc.pdf", pdfgen.text_pdf())
    job = run_job([{"cmd": "open", "path": path}, {"cmd": "page_image", "handle": 0, "page": 2},
                   {"cmd": "slice_bytes", "handle": 1, "offset": 0, "len": 24}, DONE], tmp_path)
    assert job.envelope.ok, job.envelope
    [image] = events(job, "job.image.created")
    assert (image["handle"], image["source"], image["page"], image["width"], image["height"]) == (1, 0, 2, 1024, 1326)
    head = base64.b64decode(events(job, "job.file.sliced")[0]["preview_base64"])
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[16:24] == (1024).to_bytes(4, "big") + (1326).to_bytes(4, "big")
    thumb = Image.open(io.BytesIO(base64.b64decode(image["thumbnail_base64"])))
    assert thumb.format == "PNG" and max(thumb.size) <= 160


def test_a_scanned_page_renders_even_though_it_has_no_text(tmp_path):
    path = write(tmp_path, "scan.pdf", pdfgen.scanned_pdf(1))
    job = run_job([{"cmd": "open", "path": path}, {"cmd": "page_image", "handle": 0, "page": 0}, DONE], tmp_path)
    assert job.envelope.ok and events(job, "job.image.created")[0]["width"] == 1024


def test_page_image_out_of_range_and_on_an_image_fail(tmp_path):
    path = write(tmp_path, "doc.pdf", pdfgen.text_pdf())
    job = run_job([{"cmd": "open", "path": path}, {"cmd": "page_image", "handle": 0, "page": 4}, DONE], tmp_path)
    assert job.envelope.error.code == codes.UNSUPPORTED and "out of range" in job.envelope.error.message
    img = write(tmp_path, "a.png", pdfgen.png(8, 8))
    job = run_job([{"cmd": "open", "path": img}, {"cmd": "page_image", "handle": 0, "page": 0}, DONE], tmp_path)
    assert job.envelope.error.message == "page_image: handle 0 holds a png image, not a document; page_image reads PDFs"


def test_a_page_too_large_to_render_is_refused_before_drawing(tmp_path, healthy):
    path = write(tmp_path, "tall.pdf", pdfgen.build_pdf([{"text": ["x"], "size": (1, 1_000_000)}]))
    t0 = time.monotonic()
    job = run_job([{"cmd": "open", "path": path}, {"cmd": "page_image", "handle": 0, "page": 0}, DONE], tmp_path)
    err = job.envelope.error
    assert err.code == codes.LIMIT_EXCEEDED and "max_render_pixels" in err.message and "1024 x 1024000000" in err.message
    assert time.monotonic() - t0 < 10
    # The limit is the setting: the default US Letter page (1024 x 1326) fits 1.4 Mpx, not 1 Mpx.
    ok_path = write(tmp_path, "doc.pdf", pdfgen.text_pdf())
    job = run_job([{"cmd": "open", "path": ok_path}, {"cmd": "page_image", "handle": 0, "page": 0}, DONE], tmp_path,
                  limits=tj.Limits(max_render_pixels=1024 * 1326))
    assert job.envelope.ok
    job = run_job([{"cmd": "open", "path": ok_path}, {"cmd": "page_image", "handle": 0, "page": 0}, DONE], tmp_path,
                  limits=tj.Limits(max_render_pixels=1024 * 1326 - 1))
    assert job.envelope.error.code == codes.LIMIT_EXCEEDED


def _op(handle, **op):
    return {"cmd": "image_op", "handle": handle, "op": op}


def test_resize_fits_within_the_bounds_keeping_the_aspect_and_never_enlarging(tmp_path):
    path = write(tmp_path, "a.png", pdfgen.png(200, 100))
    job = run_job([{"cmd": "open", "path": path}, _op(0, op="resize", max_width=50, max_height=50),
                   _op(0, op="resize", max_width=1000, max_height=1000), _op(1, op="resize", max_width=7, max_height=99),
                   DONE], tmp_path)
    assert job.envelope.ok, job.envelope
    sizes = [(e["handle"], e["source"], e["width"], e["height"]) for e in events(job, "job.image.created")]
    assert sizes == [(1, 0, 50, 25), (2, 0, 200, 100), (3, 1, 7, 3)]


def test_crop_takes_the_region_and_refuses_one_outside_the_image(tmp_path, healthy):
    path = write(tmp_path, "a.png", pdfgen.png(40, 30))
    job = run_job([{"cmd": "open", "path": path}, _op(0, op="crop", x=10, y=5, width=30, height=25),
                   {"cmd": "slice_bytes", "handle": 1, "offset": 0, "len": 1 << 20}, DONE], tmp_path)
    assert job.envelope.ok
    assert [(e["width"], e["height"]) for e in events(job, "job.image.created")] == [(30, 25)]
    job = run_job([{"cmd": "open", "path": path}, _op(0, op="crop", x=10, y=5, width=31, height=25), DONE], tmp_path)
    assert job.envelope.error.to_json() == {
        "code": "unsupported",
        "message": "crop 31 x 25 at (10, 5) lies outside the 40 x 30 image; crops are refused, not clamped"}


@pytest.mark.parametrize("op", [{"op": "crop", "x": 0, "y": 0, "width": 0, "height": 5},
                                {"op": "resize", "max_width": 0, "max_height": 10}], ids=["crop", "resize"])
def test_empty_regions_and_bounds_are_errors(op, tmp_path):
    path = write(tmp_path, "a.png", pdfgen.png(10, 10))
    job = run_job([{"cmd": "open", "path": path}, {"cmd": "image_op", "handle": 0, "op": op}, DONE], tmp_path)
    assert job.envelope.error.code == codes.UNSUPPORTED and "empty" in job.envelope.error.message


def test_image_op_on_a_document_points_to_page_image(tmp_path):
    path = write(tmp_path, "doc.pdf", pdfgen.text_pdf())
    job = run_job([{"cmd": "open", "path": path}, _op(0, op="resize", max_width=5, max_height=5), DONE], tmp_path)
    assert job.envelope.error.message == ("image_op: handle 0 holds a document, not an image; "
                                          "render a page with page_image first")


def test_an_unknown_image_operation_is_a_malformed_command(tmp_path):
    path = write(tmp_path, "a.png", pdfgen.png(4, 4))
    job = run_job([{"cmd": "open", "path": path}, _op(0, op="rotate", degrees=90), DONE], tmp_path)
    assert job.envelope.error.code == codes.WASM_TRAP and "unknown image operation `rotate`" in job.envelope.error.message


@pytest.mark.parametrize("fmt,mode", [("JPEG", "RGB"), ("GIF", "P"), ("WEBP", "RGB"), ("PNG", "RGBA"), ("PNG", "L")])
def test_every_sniffed_image_format_is_transformed_to_png(fmt, mode, tmp_path):
    from PIL import Image as PILImage

    out = io.BytesIO()
    PILImage.new(mode, (30, 20)).save(out, format=fmt)
    path = write(tmp_path, f"img.{fmt.lower()}", out.getvalue())
    job = run_job([{"cmd": "open", "path": path}, _op(0, op="resize", max_width=15, max_height=15),
                   {"cmd": "slice_bytes", "handle": 1, "offset": 0, "len": 8}, DONE], tmp_path)
    assert job.envelope.ok, job.envelope
    assert [(e["width"], e["height"]) for e in events(job, "job.image.created")] == [(15, 10)]
    assert base64.b64decode(events(job, "job.file.sliced")[0]["preview_base64"]) == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("make", [lambda: pdfgen.png_claiming(100_000, 100_000),
                                  lambda: pdfgen.jpeg_claiming(65_000, 65_000)], ids=["png", "jpeg"])
def test_a_decompression_bomb_is_refused_from_its_header(make, tmp_path, healthy):
    path = write(tmp_path, "bomb.img", make())
    t0 = time.monotonic()
    job = run_job([{"cmd": "open", "path": path}, _op(0, op="resize", max_width=10, max_height=10), DONE], tmp_path)
    err = job.envelope.error
    assert err.code == codes.LIMIT_EXCEEDED and "max_image_pixels" in err.message and "not decoded" in err.message
    assert time.monotonic() - t0 < 10


def test_decoded_image_pixels_limit_is_exact(tmp_path):
    path = write(tmp_path, "a.png", pdfgen.png(100, 50))
    ok = run_job([{"cmd": "open", "path": path}, _op(0, op="crop", x=0, y=0, width=1, height=1), DONE], tmp_path,
                 limits=tj.Limits(max_image_pixels=5000))
    assert ok.envelope.ok
    job = run_job([{"cmd": "open", "path": path}, _op(0, op="crop", x=0, y=0, width=1, height=1), DONE], tmp_path,
                  limits=tj.Limits(max_image_pixels=4999))
    assert job.envelope.error.code == codes.LIMIT_EXCEEDED and "100 x 50 = 5000 pixels" in job.envelope.error.message


def test_a_damaged_image_fails_clearly(tmp_path):
    data = pdfgen.png(50, 50)
    path = write(tmp_path, "cut.png", data[: len(data) // 2])
    job = run_job([{"cmd": "open", "path": path}, _op(0, op="resize", max_width=10, max_height=10), DONE], tmp_path)
    assert job.envelope.error.code == codes.UNSUPPORTED and "cannot be decoded" in job.envelope.error.message


def test_image_results_count_against_max_handles(tmp_path, healthy):
    path = write(tmp_path, "a.png", pdfgen.png(10, 10))
    job = run_job([{"cmd": "open", "path": path}, _op(0, op="crop", x=0, y=0, width=2, height=2)], tmp_path,
                  limits=tj.Limits(max_handles=4))
    err = job.envelope.error
    assert err.code == codes.LIMIT_EXCEEDED and "max_handles" in err.message
    assert len(events(job, "job.image.created")) == 3


def test_infer_with_a_page_image_is_unsupported_on_a_text_model(tmp_path):
    from tensorjob_jupyter.inference import ScriptedBackend

    path = write(tmp_path, "doc.pdf", pdfgen.text_pdf())
    job = run_job([{"cmd": "open", "path": path}, {"cmd": "page_image", "handle": 0, "page": 0},
                   {"cmd": "infer", "prompt": "what is this?", "max_tokens": 5, "images": [1]}, DONE], tmp_path,
                  backend=ScriptedBackend("x"))
    err = job.envelope.error
    assert err.code == codes.UNSUPPORTED and "vision-capable" in err.message and "not yet supported" in err.message


# --- the engine: isolation, time, memory, crashes -------------------------------------------------------


def _engine(job):
    return job._reactor.documents.engine


@pytest.mark.slow
def test_a_content_stream_that_takes_minutes_times_out_within_the_limit(tmp_path, healthy):
    path = write(tmp_path, "bomb.pdf", pdfgen.render_bomb_pdf())
    assert (tmp_path / "bomb.pdf").stat().st_size < 200_000
    t0 = time.monotonic()
    job = run_job([{"cmd": "open", "path": path}, {"cmd": "page_image", "handle": 0, "page": 0}, DONE], tmp_path,
                  limits=tj.Limits(document_timeout_s=1.0))
    assert time.monotonic() - t0 < 8
    err = job.envelope.error
    assert err.code == codes.TIMEOUT and "document_timeout_s" in err.message
    assert _engine(job).proc.poll() is not None  # killed, not left running


def test_an_engine_crash_ends_only_its_own_job(tmp_path, monkeypatch, healthy):
    path = write(tmp_path, "doc.pdf", pdfgen.text_pdf())
    monkeypatch.setenv(FAULT_ENV, "crash:page_text")
    job = run_job([{"cmd": "open", "path": path}, {"cmd": "page_text", "handle": 0, "page": 1}, DONE], tmp_path)
    err = job.envelope.error
    assert err.code == codes.UNSUPPORTED and "crashed (SIGSEGV)" in err.message
    assert "page 1 of handle 0" in err.message
    monkeypatch.delenv(FAULT_ENV)
    again = run_job([{"cmd": "open", "path": path}, {"cmd": "page_text", "handle": 0, "page": 1}, DONE], tmp_path)
    assert again.envelope.ok


def test_an_engine_crash_fails_page_text_opt_too(tmp_path, monkeypatch):
    path = write(tmp_path, "doc.pdf", pdfgen.text_pdf())
    monkeypatch.setenv(FAULT_ENV, "crash:page_text")
    job = run_job([{"cmd": "open", "path": path}, {"cmd": "page_text_opt", "handle": 0, "page": 1}, DONE], tmp_path)
    assert job.envelope.error.code == codes.UNSUPPORTED and "crashed" in job.envelope.error.message


def test_a_hung_engine_is_killed_at_its_deadline(tmp_path, monkeypatch, healthy):
    path = write(tmp_path, "doc.pdf", pdfgen.text_pdf())
    monkeypatch.setenv(FAULT_ENV, "hang:render")
    t0 = time.monotonic()
    job = run_job([{"cmd": "open", "path": path}, {"cmd": "page_image", "handle": 0, "page": 0}, DONE], tmp_path,
                  limits=tj.Limits(document_timeout_s=0.5))
    assert time.monotonic() - t0 < 6
    assert job.envelope.error.code == codes.TIMEOUT
    assert _engine(job).proc.poll() is not None


def test_the_job_deadline_bounds_a_document_call(tmp_path, monkeypatch):
    path = write(tmp_path, "doc.pdf", pdfgen.text_pdf())
    monkeypatch.setenv(FAULT_ENV, "hang:page_text")
    t0 = time.monotonic()
    job = run_job([{"cmd": "open", "path": path}, {"cmd": "page_text", "handle": 0, "page": 0}, DONE], tmp_path,
                  limits=tj.Limits(job_timeout_s=1.0))
    assert time.monotonic() - t0 < 6
    err = job.envelope.error
    assert err.code == codes.TIMEOUT and "time limit of 1.0 s" in err.message


def test_cancel_during_a_hung_engine_call_is_prompt(tmp_path, monkeypatch):
    path = write(tmp_path, "doc.pdf", pdfgen.text_pdf())
    monkeypatch.setenv(FAULT_ENV, "hang:page_text")
    job = tj.Job(wat.script_guest([{"cmd": "open", "path": path}, {"cmd": "page_text", "handle": 0, "page": 0},
                                   DONE]), read=[tmp_path], backend=None).start()
    deadline = time.monotonic() + 20
    while not events(job, "job.file.opened") and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.3)
    t0 = time.monotonic()
    job.cancel()
    env = job.wait(10)
    assert time.monotonic() - t0 < 2
    assert env.status is tj.JobStatus.CANCELLED and env.error.code == codes.CANCELLED
    assert _engine(job).proc.poll() is not None


def test_a_lying_engine_reply_is_refused(tmp_path, monkeypatch):
    path = write(tmp_path, "doc.pdf", pdfgen.text_pdf())
    for op, command in [("page_text", {"cmd": "page_text", "handle": 0, "page": 0}),
                        ("render", {"cmd": "page_image", "handle": 0, "page": 0}),
                        ("open", None)]:
        monkeypatch.setenv(FAULT_ENV, f"garbage:{op}")
        script = [{"cmd": "open", "path": path}] + ([command] if command else []) + [DONE]
        job = run_job(script, tmp_path)
        assert job.envelope.error.code == codes.UNSUPPORTED and "malformed" in job.envelope.error.message, op


def test_the_engine_memory_limit_ends_the_job_not_the_host(tmp_path, healthy):
    import struct
    import zlib

    w = h = 8000  # 64 MB of grey pixels, 64 KB on disk
    raw = (b"\0" + bytes(w)) * h
    chunk = lambda t, d: struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d))  # noqa: E731
    path = write(tmp_path, "big.png", b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0))
                 + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))
    job = run_job([{"cmd": "open", "path": path}, _op(0, op="resize", max_width=10, max_height=10), DONE], tmp_path,
                  limits=tj.Limits(document_memory_bytes=80 * 1024 * 1024))
    err = job.envelope.error
    assert err is not None and err.code in (codes.LIMIT_EXCEEDED, codes.UNSUPPORTED), err
    assert "document_memory_bytes" in err.message
    ok = run_job([{"cmd": "open", "path": path}, _op(0, op="resize", max_width=10, max_height=10), DONE], tmp_path)
    assert ok.envelope.ok, ok.envelope


def test_each_job_has_its_own_engine_and_it_ends_with_the_job(tmp_path):
    path = write(tmp_path, "doc.pdf", pdfgen.text_pdf())
    script = [{"cmd": "open", "path": path}] + [{"cmd": "page_text", "handle": 0, "page": i % 3} for i in range(30)]
    jobs = [tj.Job(wat.script_guest(script + [DONE]), read=[tmp_path], backend=None) for _ in range(3)]
    for job in jobs:
        job.start()
    for job in jobs:
        assert job.wait(60).ok
    pids = {_engine(job).proc.pid for job in jobs}
    assert len(pids) == 3
    assert all(_engine(job).proc.poll() is not None for job in jobs)


def test_a_job_without_documents_starts_no_engine(tmp_path):
    path = write(tmp_path, "a.txt", b"hello")
    job = run_job([{"cmd": "open", "path": path}, {"cmd": "slice", "handle": 0, "offset": 0, "len": 5}, DONE], tmp_path)
    assert job.envelope.ok and job._reactor.documents is None

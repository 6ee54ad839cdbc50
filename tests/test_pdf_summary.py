"""guests/examples/pdf_summary.c through the real host: a PDF summarised page by page.

A ``ScriptedBackend`` stands in for the model (its reply quotes the page it
was shown), and one test runs the example on the real embedded model, as
the notebook does, checking only what does not depend on the model's words.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import pdfgen
import tensorjob_jupyter as tj
from tensorjob_jupyter.inference.scripted import ScriptedBackend

ROOT = Path(__file__).resolve().parent.parent
GUEST = ROOT / "guests" / "examples" / "pdf_summary.c"
SAMPLE = ROOT / "examples" / "data" / "sample.pdf"


def page_of(prompt: str) -> str:
    return prompt.split("<page>\n", 1)[1].split("\n</page>", 1)[0]


def run(tmp_path, input, backend, **kwargs):
    kwargs.setdefault("read", [str(tmp_path)])
    job = tj.Job(GUEST, input=input, backend=backend, **kwargs).start()
    return job, job.wait(120)


def test_each_page_with_text_is_summarised_and_a_scan_is_skipped(tmp_path):
    pdf = tmp_path / "mixed.pdf"
    pdf.write_bytes(pdfgen.build_pdf([{"text": ["Alpha page zero."]},
                                      {"image": pdfgen.scanned_text_image(["scan"], 80, 100)},
                                      {"text": ["Gamma page two, the last."]}]))
    backend = ScriptedBackend(reply=lambda prompt: "about " + page_of(prompt).split()[0])
    job, env = run(tmp_path, {"path": str(pdf), "max_tokens": 8}, backend)
    assert env.ok, env
    r = env.result
    assert (r["source"], r["pages"], r["summarised"], r["skipped"]) == (str(pdf), 3, 2, 1)
    assert r["summaries"][0] == {"page": 0, "summary": "about Alpha"}
    assert r["summaries"][1]["page"] == 1 and "no text layer" in r["summaries"][1]["skipped"]
    assert r["summaries"][2] == {"page": 2, "summary": "about Gamma"}
    assert [page_of(p) for p in backend.scripted.prompts] == ["Alpha page zero.", "Gamma page two, the last."]
    progress = [e["progress"] for e in job.events if e["type"] == "job.progress"]
    assert progress == [{"done": i, "total": 3} for i in (1, 2, 3)]
    reads = [(e["command"], e["page"]) for e in job.events if e["type"] == "job.document.page"]
    assert reads == [("page_text_opt", 0), ("page_text_opt", 1), ("page_text_opt", 2)]


def test_long_pages_are_cut_on_a_character_boundary(tmp_path):
    pdf = tmp_path / "long.pdf"
    pdf.write_bytes(pdfgen.text_pdf([["é" * 60 + " the end"]]))
    backend = ScriptedBackend(reply="ok")
    _, env = run(tmp_path, {"path": str(pdf), "max_chars": 7}, backend)
    assert env.ok, env
    assert page_of(backend.scripted.prompts[0]) == "ééé"  # 6 bytes: a 7th would split a character


def test_a_file_that_is_not_a_pdf_fails_clearly(tmp_path):
    (tmp_path / "a.txt").write_text("not a pdf")
    _, env = run(tmp_path, {"path": str(tmp_path / "a.txt")}, ScriptedBackend())
    assert env.error.code == "unsupported" and "is not a PDF" in env.error.message and "text" in env.error.message


def test_missing_input_is_a_schema_error(tmp_path):
    _, env = run(tmp_path, {}, ScriptedBackend())
    assert env.error.code == "schema_validation_failed"


def test_the_committed_sample_is_what_its_script_writes():
    """examples/data/sample.pdf: small, three pages of text and a scan (the scan's pixels may differ by Pillow)."""
    import pypdfium2
    from make_sample_pdf import SAMPLE_PAGES

    assert SAMPLE.stat().st_size < 16 * 1024
    doc = pypdfium2.PdfDocument(str(SAMPLE))
    try:
        texts = [doc[i].get_textpage().get_text_range() for i in range(len(doc))]
    finally:
        doc.close()
    assert len(texts) == len(SAMPLE_PAGES) == 4
    for text, lines in zip(texts, SAMPLE_PAGES):
        if lines is None:
            assert text == ""
        else:
            assert text.replace("\r\n", "\n").split("\n") == [line for line in lines if line]


@pytest.mark.slow
def test_the_sample_on_the_real_model(tmp_path):
    job = tj.Job(GUEST, input={"path": str(SAMPLE), "max_tokens": 16}, read=[str(SAMPLE)]).start()
    env = job.wait(300)
    assert env.ok, env
    r = env.result
    assert (r["pages"], r["summarised"], r["skipped"]) == (4, 3, 1)
    assert [s["page"] for s in r["summaries"]] == [0, 1, 2, 3] and "skipped" in r["summaries"][2]
    assert all(s["summary"] for s in r["summaries"] if "summary" in s)
    assert 0 < env.usage.tokens_out <= 3 * 16

"""Document benchmarks: what reading PDFs through a job costs over calling pypdfium2 directly.

Run from the repository root::

    python bench/bench_documents.py           # 200 text pages, 40 renders, 5 interleaved runs
    python bench/bench_documents.py --quick   # 50 text pages, 10 renders, 3 runs

Every figure is a ratio of medians against a baseline measured in the same
process, with baseline and host runs interleaved (the machines are shared;
absolute numbers swing with load, ratios much less). The PDF is written to a
temporary folder with ``examples/make_sample_pdf.build_pdf``: pages of
Helvetica text, about 2.6 KB of text each.

1. **page_text pages per second**: a C guest opens the PDF and asks for
   ``page_text`` of every page in turn, run as a real ``tj.Job`` (grant check,
   the document engine process, one ``job.document.page`` event per page,
   the transcript), against pypdfium2 called directly on the same file in this
   process (``PdfDocument``, then per page ``get_textpage().get_text_range()``).
2. **page_image renders per second**: the same guest asks for ``page_image``
   of every page (1024 pixels wide, PNG, plus the view's thumbnail), against
   pypdfium2 rendering at the same scale and Pillow encoding the same PNG.
3. **The engine's fixed cost**: a job that only opens the PDF (starting the
   engine process, which imports pypdfium2, and inspecting the document)
   against a job that only opens a text file (the same job, no engine) and
   against opening the PDF directly. This is paid once per job that reads a
   document; the steady rates above are also shown with the PDF-opening job's
   time taken out.

The last line of output is a one-line JSON summary of every number.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

import pypdfium2  # noqa: E402

import tensorjob_jupyter as tj
from make_sample_pdf import build_pdf  # noqa: E402
from tensorjob_jupyter.sandbox.compile import compile_source
from tensorjob_jupyter.world.documents import RENDER_WIDTH

GUEST = r"""
#include "tensorjob.h"
static uint32_t handle, pages, page, image, only_open;
static tj_cmd next(void) {
    if (only_open || page >= pages) return tj_done(tj_jsonf("%u", page));
    return image ? tj_page_image(handle, page++) : tj_page_text(handle, page++);
}
tj_cmd guest_init(tj_json in) {
    pages = (uint32_t)tj_get_u64(in, "pages", 0);
    image = tj_get_bool(in, "image", 0);
    only_open = tj_get_bool(in, "only_open", 0);
    return tj_open(tj_get_str(in, "path"));
}
tj_cmd guest_step(tj_event ev) {
    if (ev.type == TJ_EV_OPENED) handle = ev.handle;
    else if (ev.type != TJ_EV_PAGE_TEXTED && ev.type != TJ_EV_PAGE_IMAGED)
        return tj_failf("unsupported", "unexpected event %S", ev.name);
    return next();
}
"""

LINE = "The keeper climbed the ninety-one steps of the tower, trimmed the wick and wound the clock."


def med(xs: list[float]) -> float:
    return statistics.median(xs)


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    return "\n".join([line(headers), line(["-" * w for w in widths])] + [line(r) for r in rows])


def make_pdf(path: Path, pages: int) -> None:
    path.write_bytes(build_pdf([{"text": [f"Page {p}."] + [f"{LINE} ({p}.{i})" for i in range(28)]}
                                for p in range(pages)]))


# --- baselines: pypdfium2 in this process --------------------------------------------------------


def direct_text(path: Path, pages: int) -> float:
    t0 = time.perf_counter()
    doc = pypdfium2.PdfDocument(str(path))
    chars = 0
    for i in range(pages):
        page = doc[i]
        textpage = page.get_textpage()
        chars += len(textpage.get_text_range())
        textpage.close()
        page.close()
    doc.close()
    assert chars > 0
    return time.perf_counter() - t0


def direct_render(path: Path, pages: int) -> float:
    t0 = time.perf_counter()
    doc = pypdfium2.PdfDocument(str(path))
    for i in range(pages):
        page = doc[i]
        image = page.render(scale=RENDER_WIDTH / page.get_width()).to_pil()
        out = io.BytesIO()
        image.save(out, format="PNG", compress_level=1)
        page.close()
    doc.close()
    return time.perf_counter() - t0


def direct_open(path: Path) -> float:
    t0 = time.perf_counter()
    doc = pypdfium2.PdfDocument(str(path))
    page = doc[0]
    textpage = page.get_textpage()
    textpage.get_text_range(0, min(textpage.count_chars(), 4096))
    textpage.close()
    page.close()
    doc.close()
    return time.perf_counter() - t0


# --- the host ------------------------------------------------------------------------------------------


def host(wasm: bytes, path: Path, runs: Path, **input) -> float:
    t0 = time.perf_counter()
    job = tj.Job(wasm, input={"path": str(path), **input}, read=[str(path)], backend=None, runs_dir=runs,
                 limits=tj.Limits(max_handles=100_000, max_event_bytes=1 << 30))
    env = job.start().wait(600)
    elapsed = time.perf_counter() - t0
    if not env.ok:
        raise SystemExit(f"benchmark job failed: {env.to_json()}")
    return elapsed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer pages and runs (< 30 s)")
    args = ap.parse_args(argv)
    text_pages, render_pages, reps = (50, 10, 3) if args.quick else (200, 40, 5)
    wall0 = time.perf_counter()
    wasm = compile_source(GUEST, "c", filename="bench_documents")
    with tempfile.TemporaryDirectory(prefix="tj-bench-docs-") as tmp:
        tmp = Path(tmp)
        pdf, runs = tmp / "bench.pdf", tmp / "runs"
        make_pdf(pdf, text_pages)
        print(f"PDF: {text_pages} pages, {pdf.stat().st_size / 1024:.0f} KiB; load {_load()}")
        host(wasm, pdf, runs, pages=2)  # warm: the guest is compiled, the OS caches the engine's libraries
        direct_text(pdf, 2)

        txt = tmp / "bench.txt"
        txt.write_text(LINE)
        opens_h, opens_t, opens_d, text_h, text_d, img_h, img_d = [], [], [], [], [], [], []
        for _ in range(reps):
            opens_d.append(direct_open(pdf))
            opens_h.append(host(wasm, pdf, runs, only_open=True))
            opens_t.append(host(wasm, txt, runs, only_open=True))
            text_d.append(direct_text(pdf, text_pages))
            text_h.append(host(wasm, pdf, runs, pages=text_pages))
            img_d.append(direct_render(pdf, render_pages))
            img_h.append(host(wasm, pdf, runs, pages=render_pages, image=True))

    fixed = med(opens_h) - med(opens_t)
    t_rate_d, t_rate_h = text_pages / med(text_d), text_pages / med(text_h)
    t_rate_steady = text_pages / max(1e-9, med(text_h) - med(opens_h))
    i_rate_d, i_rate_h = render_pages / med(img_d), render_pages / med(img_h)
    i_rate_steady = render_pages / max(1e-9, med(img_h) - med(opens_h))
    print(f"\n{reps} interleaved runs each (medians)")
    print(table(["", "direct pypdfium2", "through a job", "job, engine start taken out", "ratio (steady)"], [
        [f"[1] page_text, pages/s ({text_pages} pages)", f"{t_rate_d:,.0f}", f"{t_rate_h:,.0f}",
         f"{t_rate_steady:,.0f}", f"{t_rate_h / t_rate_d:.2f} ({t_rate_steady / t_rate_d:.2f})"],
        [f"[2] page_image, renders/s ({render_pages} pages)", f"{i_rate_d:,.1f}", f"{i_rate_h:,.1f}",
         f"{i_rate_steady:,.1f}", f"{i_rate_h / i_rate_d:.2f} ({i_rate_steady / i_rate_d:.2f})"],
        ["[3] open the PDF, ms", f"{1000 * med(opens_d):.1f}", f"{1000 * med(opens_h):.1f}", "", ""],
        ["    (a job that opens a text file, ms)", "", f"{1000 * med(opens_t):.1f}", "", ""],
    ]))
    print(f"the engine's fixed cost per job (start the process, import pypdfium2, inspect): {1000 * fixed:.0f} ms; "
          f"per page_text call through the job: {1e6 / t_rate_steady:.0f} us vs {1e6 / t_rate_d:.0f} us direct")
    summary = {"bench": "bench_documents", "mode": "quick" if args.quick else "full",
               "wall_s": round(time.perf_counter() - wall0, 1), "load": _load(),
               "page_text": {"direct_pages_s": round(t_rate_d, 1), "job_pages_s": round(t_rate_h, 1),
                             "job_steady_pages_s": round(t_rate_steady, 1), "ratio": round(t_rate_h / t_rate_d, 3),
                             "ratio_steady": round(t_rate_steady / t_rate_d, 3)},
               "page_image": {"direct_renders_s": round(i_rate_d, 2), "job_renders_s": round(i_rate_h, 2),
                              "job_steady_renders_s": round(i_rate_steady, 2),
                              "ratio": round(i_rate_h / i_rate_d, 3), "ratio_steady": round(i_rate_steady / i_rate_d, 3)},
               "open_ms": {"direct": round(1000 * med(opens_d), 1), "job": round(1000 * med(opens_h), 1),
                           "job_text_file": round(1000 * med(opens_t), 1),
                           "engine_fixed_cost": round(1000 * fixed, 1)}}
    print(json.dumps(summary))
    return 0


def _load() -> str:
    try:
        return Path("/proc/loadavg").read_text().split()[0]
    except OSError:
        return "?"


if __name__ == "__main__":
    sys.exit(main())

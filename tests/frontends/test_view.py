"""The live view: state folding, escaping in every panel, throttling, the Cancel button."""

import base64
import time

import pytest

import tensorjob_jupyter as tj
from tensorjob_jupyter.inference import ScriptedBackend
from tensorjob_jupyter.frontends.view import render
from tensorjob_jupyter.frontends.view.state import ViewState, progress_fraction
from tensorjob_jupyter.frontends.view.summary import summary
from tensorjob_jupyter.frontends.view.widget import JobView

import wat

DONE = {"cmd": "done", "result": {"ok": True}}


def ev(type, **fields):
    return {"type": type, "sequence_number": 0, "job_id": "j", **fields}


def test_progress_comes_from_done_total_or_fraction_and_anything_else_is_a_log_line():
    assert progress_fraction({"done": 3, "total": 4}) == 0.75
    assert progress_fraction({"fraction": 0.5}) == 0.5
    assert progress_fraction({"fraction": 7}) == 1.0
    assert progress_fraction({"done": True, "total": 2}) is None
    assert progress_fraction("50%") is None and progress_fraction({"done": 1, "total": 0}) is None
    s = ViewState()
    s.apply(ev("job.progress", progress={"done": 1, "total": 4}))
    s.apply(ev("job.progress", progress={"stage": "reading"}))
    assert s.fraction == 0.25 and s.progress_text == "1 / 4"
    assert list(s.log) == ['{"stage":"reading"}']


def test_coverage_merges_the_ranges_read():
    s = ViewState()
    s.apply(ev("job.file.opened", handle=0, path="a.txt", len=100, kind={"kind": "text"}))
    for offset, length in [(0, 10), (50, 10), (10, 5), (55, 20)]:
        s.apply(ev("job.file.sliced", handle=0, offset=offset, requested=length, length=length,
                   next_offset=offset + length, binary=False, preview="x"))
    f = s.files[0]
    assert f.ranges == [[0, 15], [50, 75]] and f.bytes_covered == 40
    assert 'data-covered="40.0"' in render.files(s)


def test_binary_windows_preview_as_a_hex_dump():
    s = ViewState()
    s.apply(ev("job.file.opened", handle=0, path="b.bin", len=4, kind={"kind": "binary"}))
    s.apply(ev("job.file.sliced", handle=0, offset=0, requested=4, length=4, next_offset=4, binary=True,
               preview_base64=base64.b64encode(b"\x00AB\xff").decode()))
    assert "00000000  00 41 42 ff" in render.files(s) and ".AB." in render.files(s)


HOSTILE = ["<script>alert(1)</script>", "<img src=x onerror=alert(2)>", "\x1b[31mred\x1b[0m"]


@pytest.fixture
def hostile_job(tmp_path):
    name = tmp_path / "<img src=x onerror=alert(3)>.txt"
    name.write_text("<script>alert(4)</script> file text")
    chunk = "<img src=x onerror=alert(5)>\x1b]0;title\x07".encode()
    imports = '(import "wasi:tensor/host@0.1.0" "emit-chunk" (func $emit (param i32 i32) (result i32)))'
    data = "".join(f"\\{b:02x}" for b in chunk)
    guest = wat.script_guest(
        [{"cmd": "emit", "progress": HOSTILE[0]}, {"cmd": "emit", "progress": {"done": 1, "total": 2}},
         {"cmd": "open", "path": str(name)}, {"cmd": "slice", "handle": 0, "offset": 0, "len": 100},
         {"cmd": "infer", "prompt": "p", "max_tokens": 8},
         {"cmd": "done", "result": {"<b>key</b>": HOSTILE, "html": "<svg onload=alert(6)>"}}],
        imports=imports + f'(data (i32.const 0x8000) "{data}")',
        step_prelude=f"(drop (call $emit (i32.const 0x8000) (i32.const {len(chunk)})))")
    return tj.Job(guest, read=[tmp_path], backend=ScriptedBackend(" ".join(HOSTILE)))


def test_every_panel_escapes_guest_and_model_text(hostile_job):
    view = JobView(hostile_job, refresh_hz=20).start()
    env = hostile_job.start().wait(30)
    view.join(10)
    assert env.ok, env
    panels = {name: widget.value for name, widget in view._sections.items()}
    panels["progress_label"] = view.progress_label.value
    html = "".join(panels.values())
    for needle in ("<script", "<img", "<svg onload", "<b>key", "\x1b", "\x07"):
        assert needle not in html, needle
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in panels["log"]
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in panels["tokens"]
    assert "&lt;img src=x onerror=alert(3)&gt;.txt" in panels["files"]
    assert "&lt;script&gt;alert(4)&lt;/script&gt;" in panels["files"]
    assert "&lt;img src=x onerror=alert(5)&gt;" in panels["output"]
    assert "&lt;b&gt;key&lt;/b&gt;" in panels["result"] and "&lt;svg onload=alert(6)&gt;" in panels["result"]


def test_the_view_after_a_job_shows_everything(tmp_path):
    doc = tmp_path / "doc.txt"
    doc.write_text("hello world")
    job = tj.Job(wat.script_guest([{"cmd": "open", "path": str(doc)}, {"cmd": "slice", "handle": 0, "offset": 0,
                                                                      "len": 5},
                                   {"cmd": "emit", "progress": {"done": 1, "total": 2}},
                                   {"cmd": "infer", "prompt": "p", "max_tokens": 8}, DONE]),
                 read=[tmp_path], backend=ScriptedBackend("summary words here"))
    view = JobView(job).start()
    job.start().wait(30)
    view.join(10)
    assert 'class="tj-status">completed<' in view.header.value
    assert view.progress.value == 1.0 and view.progress.bar_style == "success"
    assert "summary words here" in view.tokens.value
    assert "doc.txt" in view.files.value and 'data-covered="45.5"' in view.files.value
    assert "hello" in view.files.value
    assert "<details" in view.result.value and "ok" in view.result.value
    assert "3 out" in view.usage.value
    assert view.cancel_button.disabled and view.cancel_button.description == "Completed"


def test_the_text_form_of_the_view_is_fixed():
    job = tj.Job(wat.script_guest([DONE]))
    view = JobView(job)
    assert view._repr_mimebundle_()["text/plain"] == "tensorjob live view (shown by the Jupyter widget front end)"
    assert "application/vnd.jupyter.widget-view+json" in view._repr_mimebundle_()


def test_updates_are_throttled_whatever_the_token_rate():
    backend = ScriptedBackend(" ".join(["tok"] * 3000), token_delay_s=0.0005)
    job = tj.Job(wat.script_guest([{"cmd": "infer", "prompt": "p", "max_tokens": 3000}, DONE]), backend=backend)
    view = JobView(job, refresh_hz=10).start()
    started = time.monotonic()
    job.start().wait(60)
    view.join(10)
    elapsed = time.monotonic() - started
    assert view.state.tokens == 3000
    assert view.pushes <= 10 * elapsed + 5, (view.pushes, elapsed)  # + first, last and the drain
    assert view.messages <= 20 * elapsed + 8, (view.messages, elapsed)


def test_the_cancel_button_cancels_a_running_job():
    job = tj.Job(wat.spin_in_step(), limits=tj.Limits(call_timeout_s=30))
    view = JobView(job).start()
    job.start()
    time.sleep(0.2)
    view.cancel_button.click()
    env = job.wait(5)
    view.join(5)
    assert env.status is tj.JobStatus.CANCELLED
    assert 'class="tj-status">cancelled<' in view.header.value
    assert view.cancel_button.disabled and view.cancel_button.description == "Cancelled"


def test_refresh_rate_is_bounded():
    with pytest.raises(ValueError):
        JobView(tj.Job(wat.script_guest([DONE])), refresh_hz=100)


def test_the_summary_is_deterministic_and_has_no_timings():
    env = tj.run(wat.script_guest([{"cmd": "infer", "prompt": "a b", "max_tokens": 4}, DONE]),
                 backend=ScriptedBackend("x y"))
    text = summary("g.wat", env)
    assert text == 'tensorjob g.wat: completed\nresult: {\n  "ok": true\n}\ntokens: 2 in, 2 out'
    failed = tj.run(wat.script_guest([{"cmd": "fail", "code": "x", "message": "\x1b[2Jbad"}]))
    assert summary("g", failed) == "tensorjob g: failed\nerror: x: bad"  # no model used: no token counts


def test_the_map_view_shows_counts_the_latest_items_and_the_rate(tmp_path):
    from tensorjob_jupyter.fanout import start_map
    from tensorjob_jupyter.frontends.view.map_widget import MapView

    guest = wat.script_guest([{"cmd": "fail", "code": "bad_item", "message": "<script>alert(1)</script>"}])
    run = start_map(guest, [{"i": i} for i in range(6)], tmp_path / "run", concurrency=2)
    view = MapView(run, "g.wasm", refresh_hz=20).start()
    result = run.wait(30)
    view.join(10)
    assert result.failed == 6
    assert 'class="tj-status"' in view.header.value and ">finished<" in view.header.value
    assert "items/s" in view.header.value or "s/item" in view.header.value
    assert "<b>6</b> / 6" in view.counts.value and "6 failed" in view.counts.value
    assert "white-space:nowrap" in view.counts.value  # the counts never wrap under the bar
    items = view.items.value
    assert items.count("<tr>") == 6 and "bad_item: &lt;script&gt;alert(1)&lt;/script&gt;" in items
    assert "<script" not in items and "{&quot;i&quot;:5}" in items  # an input with no key: its JSON, escaped
    assert view.bar.value == 1.0 and view.cancel_button.disabled
    assert view._repr_mimebundle_()["text/plain"].startswith("tensorjob map view")


def test_the_map_view_shows_each_running_item_from_its_first_step_escaped(tmp_path):
    """Before any item ends, the view lists the items in flight: key, phase, tokens and the end of their text,
    each escaped (a key from a manifest, text from a model); once the map has ended, nothing runs."""
    from tensorjob_jupyter.fanout import start_map
    from tensorjob_jupyter.frontends.view.map_widget import MapView

    guest = wat.script_guest([{"cmd": "infer", "prompt": "p", "max_tokens": 60}, DONE])
    backend = ScriptedBackend(" ".join(["<i>x</i>"] * 60), token_delay_s=0.02)
    run = start_map(guest, [{"key": f"<b>doc-{i}</b>"} for i in range(2)], tmp_path / "run", backend=backend,
                    concurrency=2)
    view = MapView(run, "g.wasm", refresh_hz=20).start()
    shown = ""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and run.progress().concluded == 0:
        if "generating" in view.in_flight.value:
            shown = view.in_flight.value
            break
        time.sleep(0.01)
    run.wait(60)
    view.join(10)
    assert "running now" in shown and "&lt;b&gt;doc-0&lt;/b&gt;" in shown and " tok<" in shown, shown
    assert "&lt;i&gt;x&lt;/i&gt;" in shown and "<b>doc" not in shown and "<i>" not in shown
    assert view.in_flight.value == ""


def test_a_map_view_shown_once_the_map_has_ended_still_lists_its_items(tmp_path):
    """The map starts before its view subscribes; quick items may end first. The view gets them anyway."""
    from tensorjob_jupyter.fanout import start_map
    from tensorjob_jupyter.frontends.view.map_widget import MapView

    run = start_map(wat.script_guest([{"cmd": "done", "result": {"v": 1}}]), [{"doc": d} for d in "ab"],
                    tmp_path / "run")
    assert run.wait(30).completed == 2
    view = MapView(run, "late.wasm", refresh_hz=20).start()
    view.join(10)
    static = view.static_html()
    assert static.count("<tr>") == 2 and "{&quot;doc&quot;:&quot;b&quot;}" in static, static


def test_a_finished_40_item_maps_view_lists_every_item_whole_numbers_and_scores_and_keys(tmp_path):
    """Item numbers of two digits and two-decimal scores are sized to their digits (never clipped to "1", "0"),
    an input reads as its key, and a finished view lists all 40 items in order (the running one the latest)."""
    import re

    from tensorjob_jupyter.fanout import start_map
    from tensorjob_jupyter.frontends.view.map_widget import SHOW_ITEMS, MapView

    items = [{"path": f"emails/{i:03d}_<b>.txt", "text": "x" * 50} for i in range(40)]
    expected = [{"a": 1, "b": 2, "c": 3}] * 40
    guest = wat.script_guest([{"cmd": "done", "result": {"a": 1, "b": 0, "c": 0}}])
    run = start_map(guest, items, tmp_path / "run", concurrency=2, expected=expected, scorer="json_fields")
    view = MapView(run, "g.wasm", refresh_hz=20).start()
    assert run.wait(60).completed == 40
    view.join(10)
    for html in (view.items.value, view.static_html()):
        numbers = re.findall(r'class="tj-map-item-number" style="([^"]*)">(\d+)</td>', html)
        assert [int(n) for _, n in numbers] == list(range(40)), html[:500]
        assert all("width:2ch" in style and "overflow:visible" in style and "max-width:0" not in style
                   for style, _ in numbers)
        scores = re.findall(r'class="tj-map-item-score" style="([^"]*)">([^<]*)</td>', html)
        assert {v for _, v in scores} == {"0.33"} and all("overflow:visible" in st for st, _ in scores)
        assert "emails/018_&lt;b&gt;.txt</td>" in html and "<b>.txt" not in html  # the key, escaped
        assert "overflow-y:auto" in html and "tj-map-items-more" not in html
    late = MapView(run, "late.wasm", refresh_hz=20).start()  # came after the end: the folder gives every row
    late.join(10)
    assert re.findall(r'class="tj-map-item-number"[^>]*>(\d+)<', late.static_html()) == [str(i) for i in range(40)]
    running = run_rows = [{"item": i, "ok": True, "input": "k", "outcome": "r"} for i in range(12)]
    from tensorjob_jupyter.frontends.view.map_widget import render_items

    assert render_items(run_rows).count("<tr>") == SHOW_ITEMS == 8  # while running: the latest
    kept = render_items(running[2:], finished=True, concluded=12)
    assert kept.count("<tr>") == 10 and "2 earlier items are not listed here" in kept


def test_the_map_view_cancel_button_stops_the_map(tmp_path):
    from tensorjob_jupyter.fanout import start_map
    from tensorjob_jupyter.frontends.view.map_widget import MapView

    slow = wat.script_guest([{"cmd": "infer", "prompt": "p", "max_tokens": 50}, DONE])
    backend = ScriptedBackend(" ".join(["w"] * 50), token_delay_s=0.02)
    run = start_map(slow, [{"i": i} for i in range(20)], tmp_path / "run", backend=backend, concurrency=1)
    view = MapView(run, "slow", refresh_hz=20).start()
    time.sleep(0.3)
    view.cancel_button.click()
    result = run.wait(30)
    view.join(10)
    assert result.status == "cancelled" and result.completed < 20
    assert ">cancelled<" in view.header.value and view.cancel_button.description == "Cancelled"


def test_hostile_progress_numbers_do_not_stop_the_view():
    huge = {"done": 2**64 - 1, "total": 1e-300, "fraction": 1.7e308}
    job = tj.Job(wat.script_guest([{"cmd": "emit", "progress": huge}, {"cmd": "emit", "progress": {"fraction": 0.5}},
                                   DONE]))
    view = JobView(job, refresh_hz=20).start()
    job.start().wait(10)
    view.join(10)
    assert 'class="tj-status">completed<' in view.header.value
    assert view.progress.value == 1.0


def test_coverage_merging_matches_a_naive_merge_and_the_bar_stays_small():
    import random

    from tensorjob_jupyter.frontends.view.state import FileState

    rng = random.Random(7)
    f = FileState(0, "f", 10_000, "text")
    covered = set()
    for _ in range(3000):
        a = rng.randrange(10_000)
        b = min(10_000, a + rng.randrange(1, 40))
        f.add_range(a, b)
        covered.update(range(a, b))
    assert f.bytes_covered == len(covered)
    assert all(f.ranges[i][1] < f.ranges[i + 1][0] for i in range(len(f.ranges) - 1))  # sorted, disjoint
    assert render.coverage_bar(f).count("<rect") <= 241


def test_every_job_and_map_status_has_its_one_colour():
    from tensorjob_jupyter.abi import JobStatus
    from tensorjob_jupyter.frontends.view import render

    job_statuses = {s.value for s in JobStatus if s.is_terminal} | {"running", "paused"}  # paused: a debugger holds it
    map_statuses = {"running", "finished", "cancelled", "error"}  # fanout.progress.MapProgress.status
    assert job_statuses | map_statuses == set(render.STATUS_COLOURS)
    for status in job_statuses | map_statuses:
        assert f'background:{render.STATUS_COLOURS[status]};' in render.status_badge(status)
    assert render.STATUS_COLOURS["completed"] == render.STATUS_COLOURS["finished"]  # success looks the same
    assert render.STATUS_COLOURS["failed"] == render.STATUS_COLOURS["error"]


def test_a_map_view_marks_each_field_grounded_or_not_and_opens_to_its_span_highlighted(tmp_path):
    """``tests/guests/quote.c`` copies a document's first line (``quote``) and returns a ``claim`` it was told:
    found in the file, or planted. Each result cell marks both, and opens (a ``<details>``, no script) to an
    excerpt of the file with the span in ``<mark>`` -- document text escaped -- in the live view, the static
    export and a view that subscribed after the end."""
    import re
    from pathlib import Path

    from tensorjob_jupyter.fanout import start_map
    from tensorjob_jupyter.frontends.view.map_widget import MapView

    guest = Path(__file__).resolve().parents[1] / "guests" / "quote.c"
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "d0.txt").write_text("Invoice <script>alert(1)</script> from ACME\nnext line\n")
    (docs / "d1.txt").write_text("Ticket 3: kettle broken\n")
    items = [{"path": str(docs / "d0.txt"), "claim": "ACME"}, {"path": str(docs / "d1.txt"), "claim": "Widget Pro"}]
    run = start_map(guest, items, tmp_path / "run", read=[docs])
    view = MapView(run, "quote.c", refresh_hz=20).start()
    assert run.wait(120).completed == 2
    view.join(10)
    late = MapView(run, "late", refresh_hz=20).start()
    late.join(10)
    for html in (view.items.value, view.static_html(), late.static_html()):
        assert html.count('<details class="tj-map-item-sources">') == 2, html
        assert html.count('class="tj-grounded"') == 3 and html.count('class="tj-ungrounded"') == 1
        spans = re.findall(r'<mark class="tj-span">(.*?)</mark>', html)
        assert "Invoice &lt;script&gt;alert(1)&lt;/script&gt; from ACME" in spans and "ACME" in spans
        assert "Ticket 3: kettle broken" in spans
        assert "<script" not in html and "not found in what the item read" in html
        assert "d1.txt:0-23 exact 1" in html


def test_found_elsewhere_doubtful_and_right_or_wrong_are_marks_of_their_own_with_a_legend():
    from tensorjob_jupyter.frontends.static_views import inert_view_html
    from tensorjob_jupyter.frontends.view.map_widget import item_row, render_items

    place = {"file": "/nonexistent", "url": None, "page": None, "start": 0, "end": 3, "score": 1.0}
    sources = {"vendor": [{**place, "match": "exact", "label": "Bill to:", "under": "customer", "elsewhere": True}],
               "total": [{**place, "match": "fuzzy", "score": 0.93}], "number": [{**place, "match": "exact"}],
               "due": []}
    event = {"type": "item.completed", "item": 0, "input": "x", "sources": sources,
             "result": {"vendor": "Oakley", "total": 10, "number": "A-1", "due": "2024-05-02"},
             "score": {"score": 0.5, "fields": {"vendor": False, "number": True}}}
    html = render_items([item_row(event)])
    summary = html.split("</summary>")[0]
    for cls in ("tj-elsewhere", "tj-doubtful", "tj-grounded", "tj-ungrounded"):
        assert summary.count(f'class="{cls}"') == 1, cls
    assert summary.count('class="tj-wrong"') == 1 and summary.count('class="tj-right"') == 1  # found, and wrong
    assert "vendor" in summary.split('class="tj-wrong"')[0].rsplit("tj-field-mark", 1)[1]
    assert 'class="tj-evidence-legend"' in html and "against the expected answer" in html
    assert "under «Bill to:», which names customer" in html
    kept = inert_view_html(f'<div class="tensorjob-map-view tj-static">{html}</div>')
    assert 'class="tj-elsewhere"' in kept and 'class="tj-evidence-legend"' in kept  # the export keeps them
    unscored = render_items([item_row({**event, "score": None})])
    assert "tj-wrong" not in unscored and "against the expected answer" not in unscored


def test_a_cell_shows_each_field_s_confidence_and_bounds_its_fields():
    from tensorjob_jupyter.frontends.view.map_widget import VIEW_FIELDS, item_row, render_items

    result = {f"f{i}": f"<v{i}>" for i in range(VIEW_FIELDS + 3)}
    event = {"type": "item.completed", "item": 0, "input": "x", "result": result,
             "confidence": {"f0": 0.934, "f1": None, "f2": 7, "f3": "high"},
             "sources": {"f0": [], "f1": [{"file": "/nonexistent", "start": 0, "end": 3, "match": "exact",
                                            "score": 1.0}], "f2": "not a list"}}
    row = item_row(event)
    html = render_items([row], finished=True)
    import re

    # the one confidence in 0..1, in the marks and in the opened sources; 7 and "high" are not taken
    assert re.findall(r'class="tj-confidence"[^>]*>([^<]*)<', html) == ["0.93"] and "confidence 0.93" in html
    assert html.count('class="tj-confidence"') == 1 and f"+3 fields" in html
    assert html.count('class="tj-field-source') == VIEW_FIELDS and "&lt;v0&gt;" in html and "<v0>" not in html
    assert "nonexistent:0-3 exact 1.0" in html and "<mark" not in html  # a file that is gone: no excerpt
    assert item_row({**event, "sources": None, "confidence": None})["fields"] is None


def test_an_answer_decoded_on_a_busy_machine_marks_the_header_until_one_is_decoded_with_every_thread():
    s = ViewState()
    busy = {"threads": 1, "own_threads": 2, "tokens_per_second": 30.0}
    s.apply(ev("response.completed", finish_reason="stop", timing=busy, response={"output_text": "x"}))
    header = render.header(s)
    assert 'class="tj-busy"' in header and "machine busy" in header
    assert "decoded with 1 of the model&#x27;s 2 threads" in header  # the whole line, escaped, in its title
    s.apply(ev("response.completed", finish_reason="stop", timing={"threads": 2}, response={"output_text": "y"}))
    assert "tj-busy" not in render.header(s)


def test_the_terminal_says_when_an_answer_was_decoded_on_a_busy_machine():
    import io

    from tensorjob_jupyter.frontends.terminal import EventPrinter

    out, err = io.StringIO(), io.StringIO()
    printer = EventPrinter(out=out, err=err, quiet=False, chunks_to_stdout=True)
    for timing in ({"threads": 1, "own_threads": 2}, {"threads": 2}):
        printer.show(ev("response.completed", finish_reason="stop", timing=timing, response={}))
    said = out.getvalue() + err.getvalue()
    assert said.count("the machine is busy: decoded with 1 of the model's 2 threads") == 1

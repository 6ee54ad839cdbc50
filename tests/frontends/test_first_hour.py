"""A data scientist's first hour (issue 23), as a user meets each item outside a kernel.

The magic's side of it runs in a real kernel in test_kernel.py (a failed job
stops the notebook, ``--input`` as Python writes it, ``%%tensorjob map``,
the static view in a finished cell's output); here: a map's result as a
table, the refusal of a changed run folder and ``--restart`` through the
command, errors that say what to do, the view as a person reads it, and a
notebook exported to HTML keeping the view.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import tensorjob_jupyter as tj
from tensorjob_jupyter.fanout.progress import rate_text
from tensorjob_jupyter.frontends.view import render
from tensorjob_jupyter.frontends.view.state import ViewState

import wat

ROOT = Path(__file__).resolve().parents[2]


def tensorjob(*args, cwd, env=None, timeout=120):
    return subprocess.run([sys.executable, "-m", "tensorjob_jupyter.frontends.cli", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout, env=env)


# --- 1. map results where a notebook user wants them -------------------------------------------------------


@pytest.fixture
def finished_map(tmp_path):
    guest = wat.script_guest([{"cmd": "done", "result": {"label": "<b>x</b>", "nested": {"deep": [1, 2]}}}])
    bad = wat.script_guest([{"cmd": "fail", "code": "not_found", "message": "no such document"}])
    good = tj.map(guest, [{"path": "a.txt", "n": 1}, {"path": "b.txt"}], tmp_path / "run")
    return good, bad, tmp_path


def test_a_map_result_is_rows_a_dataframe_and_a_short_repr(finished_map):
    result, bad, tmp_path = finished_map
    rows = result.rows()
    assert [r["item"] for r in rows] == [0, 1]
    assert list(rows[0]) == ["item", "key", "input.path", "input.n", "status", "error_code", "error_message",
                             "result.label", "result.nested", "source.label", "source.nested.deep.0",
                             "source.nested.deep.1", "grounded.label", "grounded.nested.deep.0",
                             "grounded.nested.deep.1"]  # each leaf: where it was found (the guest read nothing)
    assert (rows[0]["source.label"], rows[0]["grounded.nested.deep.1"]) == ("", False)
    assert [r["key"] for r in rows] == ["a.txt", "b.txt"]
    assert rows[1]["input.n"] is None and rows[1]["status"] == "completed"
    assert rows[0]["result.nested"] == {"deep": [1, 2]}  # flattened one level only
    frame = result.to_pandas()
    assert frame.index.name == "item" and list(frame.index) == [0, 1]
    assert frame.loc[1, "input.path"] == "b.txt" and (frame["status"] == "completed").all()
    text = repr(result)
    assert text.startswith("<MapResult finished: 2 items, 2 completed, 0 failed; ") and text.endswith(">")
    assert "elapsed_s" not in text and len(text) < 120
    failed = tj.map(bad, [{"path": "gone.txt"}, 7], tmp_path / "bad")
    [first, second] = failed.rows()
    assert (first["status"], first["error_code"], first["error_message"]) == ("failed", "not_found",
                                                                              "no such document")
    assert second["input"] == 7 and first["input.path"] == "gone.txt"  # an input that is no object: "input"
    assert (first["key"], second["key"]) == ("gone.txt", "7")


def test_to_pandas_without_pandas_names_the_extra(finished_map, monkeypatch):
    result, _, _ = finished_map
    monkeypatch.setitem(sys.modules, "pandas", None)  # as if it were not installed
    with pytest.raises(ImportError, match=r"pip install 'tensorjob-jupyter\[pandas\]'"):
        result.to_pandas()
    assert result.rows()  # rows() needs nothing


def test_the_rate_reads_right_from_the_first_item():
    assert rate_text(0, 12.0) == ""  # nothing concluded yet: no "0.0 items/s"
    assert rate_text(1, 32.0) == "32.0 s/item"
    assert rate_text(3, 1.5) == "2.0 items/s"


@pytest.mark.slow
def test_a_changed_guest_is_refused_naming_restart_and_restart_starts_over(tmp_path):
    manifest = tmp_path / "m.jsonl"
    manifest.write_text('{"i": 1}\n{"i": 2}\n')
    first, second = tmp_path / "first.wat", tmp_path / "second.wat"
    first.write_text(wat.script_wat([{"cmd": "done", "result": "first"}]))
    second.write_text(wat.script_wat([{"cmd": "done", "result": "second"}]))
    common = ["--over", manifest, "--run-dir", tmp_path / "run", "--quiet"]
    assert tensorjob("map", first, *common, cwd=tmp_path).returncode == 0
    refused = tensorjob("map", second, *common, cwd=tmp_path)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert "guest changed" in refused.stderr and "--restart" in refused.stderr
    restarted = tensorjob("map", second, *common, "--restart", cwd=tmp_path)
    assert restarted.returncode == 0, restarted.stderr
    lines = [json.loads(line) for line in (tmp_path / "run" / "results.jsonl").read_text().splitlines()]
    assert sorted(r["result"] for r in lines) == ["second", "second"]  # nothing of the first guest kept
    ledger = json.loads((tmp_path / "run" / "ledger.json").read_text())
    assert len(ledger["sessions"]) == 1 and len(list((tmp_path / "run" / "jobs").iterdir())) == 2


# --- 4. errors that say what to do -------------------------------------------------------------------------


def test_a_denied_read_and_a_denied_fetch_name_the_grant_that_would_allow_them(tmp_path):
    (tmp_path / "data").mkdir()
    read = tj.run(wat.script_guest([{"cmd": "open", "path": str(ROOT / "README.md")}]), read=[tmp_path / "data"])
    assert read.error.code == "capability_denied"
    assert "--read DIR" in read.error.message and "read=[...]" in read.error.message
    fetch = tj.run(wat.script_guest([{"cmd": "fetch", "url": "https://example.org/a.pdf"}]))
    assert fetch.error.code == "capability_denied"
    assert "--fetch PREFIX" in fetch.error.message and "fetch=[...]" in fetch.error.message


def test_an_hf_model_on_an_offline_machine_is_one_line_within_seconds(tmp_path):
    guest = tmp_path / "g.wat"
    guest.write_text(wat.script_wat([{"cmd": "done", "result": 1}]))
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower() and not k.startswith("HF_")}
    env.update(HF_HUB_CACHE=str(tmp_path / "empty-cache"), HF_ENDPOINT="http://no-such-host.invalid")
    started = time.monotonic()
    done = tensorjob("run", guest, "--model", "hf:bartowski/Qwen2.5-1.5B-Instruct-GGUF:Q4_K_M", cwd=tmp_path,
                     env=env, timeout=60)
    assert time.monotonic() - started < 15
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "is not in the Hugging Face cache" in done.stderr and "offline" in done.stderr
    assert "Retrying" not in done.stderr


# --- 5. the view, read by a person -------------------------------------------------------------------------


def ev(type, **fields):
    return {"type": type, "sequence_number": 0, "job_id": "j", **fields}


def test_a_job_that_never_used_the_model_shows_no_token_counts_and_no_empty_bar():
    from tensorjob_jupyter.frontends.view.widget import JobView

    job = tj.Job(wat.script_guest([{"cmd": "done", "result": 1}]))
    view = JobView(job, refresh_hz=20).start()
    job.start().wait(10)
    view.join(10)
    assert "no model used" in view.usage.value and "tokens" not in view.usage.value
    assert view.progress.layout.display == "none" and view.progress_label.layout.display == "none"
    static = view.static_html()
    assert "tj-progress" not in static and "no model used" in static
    job = tj.Job(wat.script_guest([{"cmd": "emit", "progress": {"done": 1, "total": 2}}, {"cmd": "done", "result": 1}]))
    view = JobView(job, refresh_hz=20).start()
    job.start().wait(10)
    view.join(10)
    assert view.progress.layout.display == "" and view.progress.value == 1.0 and "tj-progress" in view.static_html()


def test_a_cancellation_reads_once():
    state = ViewState()
    state.apply(ev("job.cancelled", envelope={"status": "cancelled", "usage": {"tokens_in": 0, "tokens_out": 0,
                                                                            "duration_ms": 5, "model": ""},
                                              "error": {"code": "cancelled", "message": "cancelled during inference"}}))
    html = render.result(state)
    assert "cancelled during inference" in html and "cancelled</b>: " not in html
    state = ViewState()
    state.apply(ev("job.failed", envelope={"status": "failed", "usage": {}, "error": {"code": "timeout",
                                                                                      "message": "too slow"}}))
    assert "<b>timeout</b>: too slow" in render.result(state)


def test_a_preview_the_host_cut_short_ends_at_a_line_or_a_word_marked():
    text = "The keeper climbed the ninety-one steps\nof the tower and trimmed the wick, wound the clockwo"
    state = ViewState()
    state.apply(ev("job.file.opened", handle=0, path="a.txt", len=10_000, kind={"kind": "text"}))
    state.apply(ev("job.file.sliced", handle=0, offset=0, requested=4096, length=4096, next_offset=4096,
                   binary=False, preview=text))
    assert state.files[0].preview == "The keeper climbed the ninety-one steps\nof the tower and trimmed the wick, wound the …"
    whole = "a short file\n"
    state.apply(ev("job.file.sliced", handle=0, offset=0, requested=4096, length=len(whole), next_offset=13,
                   binary=False, preview=whole))
    assert state.files[0].preview == whole  # the whole window: nothing cut, nothing marked


@pytest.mark.slow  # a kernel, a notebook run and an export: several seconds
def test_an_exported_notebook_keeps_the_view_as_escaped_static_html(tmp_path):
    """Run a notebook as nbconvert --execute does, save it as JupyterLab saves by default (no widget state),
    export it to HTML: the finished view is there, escaped, with no script a guest wrote."""
    import nbformat
    from nbclient import NotebookClient
    from nbconvert import HTMLExporter

    cell = "%%tensorjob --no-raise\n" + wat.script_wat([
        {"cmd": "emit", "progress": {"done": 1, "total": 2}},
        {"cmd": "emit", "progress": "<script>alert('log')</script>"},
        {"cmd": "done", "result": {"answer": "<img src=x onerror=alert(1)>"}}])
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("%load_ext tensorjob_jupyter"),
                                               nbformat.v4.new_code_cell(cell)])
    env_path = os.pathsep.join([str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])
    os.environ["PYTHONPATH"], before = env_path, os.environ.get("PYTHONPATH")
    try:
        NotebookClient(notebook, timeout=120, kernel_name="python3", store_widget_state=False,
                       resources={"metadata": {"path": str(tmp_path)}}).execute()
    finally:
        os.environ.pop("PYTHONPATH") if before is None else os.environ.__setitem__("PYTHONPATH", before)
    [output] = notebook.cells[1].outputs  # the view, once: no summary, no Out[]
    assert output.output_type == "display_data" and "text/html" in output.data
    html, _ = HTMLExporter().from_notebook_node(notebook)
    assert 'class="tensorjob-view tj-static"' in html and "1 / 2" in html
    static = html[html.index('class="tensorjob-view tj-static"'):]
    assert "&lt;script&gt;alert(" in static and "&lt;/script&gt;" in static
    assert "<script>alert" not in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html and "<img src=x" not in html

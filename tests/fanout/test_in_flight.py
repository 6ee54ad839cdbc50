"""The items a map runs now: each one's phase, tokens and text from its first step (``MapRun.in_flight``).

A job keeps a ``Glimpse`` of what it does as its events are published (``record/glimpse.py``); the map's
executor lists its running jobs, and the map view and the terminal read them at their own rate. Tested on the
glimpse's own rules (Hypothesis: any stream of deltas keeps a bounded tail that is the end of the text), a map
whose model streams slowly (the first items seen in flight, one generating, before any ends), the terminal's
lines, and the real model.
"""

from __future__ import annotations

import re
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import wat
from llama_support import smollm  # noqa: F401  (a fixture)
from tensorjob_jupyter.abi import event_types
from tensorjob_jupyter.fanout import start_map
from tensorjob_jupyter.inference import ScriptedBackend
from tensorjob_jupyter.record.glimpse import GENERATING, GUEST, READING, STARTING, TAIL_CHARS, GlimpseTracker

DONE = {"cmd": "done", "result": {"ok": True}}


def infer_guest(max_tokens: int = 40) -> bytes:
    return wat.script_guest([{"cmd": "infer", "prompt": "say many words", "max_tokens": max_tokens}, DONE])


def test_a_glimpse_follows_an_infer_from_its_prompt_to_its_end():
    tracker = GlimpseTracker()
    assert tracker.glimpse().phase == STARTING and tracker.glimpse().infers == 0
    tracker.see(event_types.RESPONSE_CREATED, {})
    assert (tracker.glimpse().phase, tracker.glimpse().infers) == (READING, 1)
    tracker.see(event_types.RESPONSE_IN_PROGRESS, {})  # not a phase of its own
    assert tracker.glimpse().phase == READING
    for piece in ("Hello", " world"):
        tracker.see(event_types.RESPONSE_OUTPUT_TEXT_DELTA, {"delta": piece})
    assert tracker.glimpse().to_json() == {"phase": GENERATING, "infers": 1, "tokens": 2, "tail": "Hello world"}
    tracker.see(event_types.RESPONSE_COMPLETED, {})
    assert tracker.glimpse().phase == GUEST and tracker.glimpse().tokens == 2  # the last infer's, kept
    tracker.see(event_types.RESPONSE_CREATED, {})  # the next infer starts afresh
    assert tracker.glimpse().to_json() == {"phase": READING, "infers": 2, "tokens": 0, "tail": ""}
    tracker.see(event_types.RESPONSE_OUTPUT_TEXT_DELTA, {"delta": "abc", "logprobs": [{}, {}, {}]})  # three tokens
    tracker.see(event_types.RESPONSE_FUNCTION_CALL_ARGUMENTS_DELTA, {"delta": '{"q"'})  # a call's arguments
    assert tracker.glimpse().to_json() == {"phase": GENERATING, "infers": 2, "tokens": 4, "tail": 'abc{"q"'}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.text(max_size=300), st.none(), st.integers()), max_size=60))
def test_any_deltas_leave_a_bounded_tail_that_ends_the_text(deltas):
    """A model's (or a hostile guest's) text of any size: the glimpse keeps its last ``TAIL_CHARS`` characters
    and counts every delta; a delta that is not text is counted, never kept."""
    tracker = GlimpseTracker()
    tracker.see(event_types.RESPONSE_CREATED, {})
    for delta in deltas:
        tracker.see(event_types.RESPONSE_OUTPUT_TEXT_DELTA, {"delta": delta})
    glimpse = tracker.glimpse()
    text = "".join(d for d in deltas if isinstance(d, str))
    assert glimpse.tokens == len(deltas) and len(glimpse.tail) <= TAIL_CHARS
    assert glimpse.tail == text[-TAIL_CHARS:]


def watch(run, until, timeout: float = 60.0) -> dict[int, set[str]]:
    """Each item's phases seen in ``run.in_flight()`` (polled) before ``until(progress)`` or the map's end."""
    seen: dict[int, set[str]] = {}
    deadline = time.monotonic() + timeout
    while not run.done and time.monotonic() < deadline:
        if until(run.progress()):
            break
        for flight in run.in_flight():
            seen.setdefault(flight.item, set()).add(flight.glimpse.phase)
            if flight.glimpse.phase == GENERATING:
                assert flight.glimpse.tokens > 0 and flight.glimpse.infers == 1
        time.sleep(0.005)
    return seen


def test_a_maps_running_items_are_seen_from_their_first_step_before_any_ends(tmp_path):
    backend = ScriptedBackend(" ".join(f"w{i}" for i in range(40)), token_delay_s=0.05)  # 2 s an item
    items = [{"key": f"doc-{i}"} for i in range(4)]
    run = start_map(infer_guest(), items, tmp_path / "run", backend=backend, concurrency=2)
    try:
        seen = watch(run, lambda p: p.concluded > 0)
        flights = run.in_flight()
        assert {f.key for f in flights} <= {"doc-0", "doc-1", "doc-2", "doc-3"}
        assert all(f.to_json()["key"] == f.key for f in flights)
    finally:
        result = run.wait(60)
    assert result.completed == 4
    # the two items in flight first, both seen before any item was concluded (the next may start while an ended
    # one's record is being made durable); the scripted model answers one request at a time, so the second may
    # still be waiting to be read while the first streams
    assert {0, 1} <= set(seen) and seen[1] & {READING, GENERATING}, seen
    assert any(GENERATING in phases for phases in seen.values()), seen
    assert run.in_flight() == []  # an ended map runs nothing


@pytest.mark.slow
def test_the_real_models_items_show_their_tokens_as_they_stream(tmp_path, smollm):  # noqa: F811
    items = [{"key": f"note-{i}"} for i in range(2)]
    run = start_map(infer_guest(48), items, tmp_path / "run", backend=smollm, concurrency=2)
    try:
        seen = watch(run, lambda p: p.concluded > 0, timeout=300)
    finally:
        result = run.wait(300)
    assert result.completed == 2
    assert any(GENERATING in phases for phases in seen.values()), seen


def test_the_terminal_says_the_items_in_flight_as_they_start_and_generate(tmp_path):
    """``ProgressPrinter.watch`` (what ``tensorjob map`` calls between its waits): a line as items start or change
    phase, naming their keys and tokens, made safe for a terminal (a key from a manifest, text from a model)."""
    import io

    from tensorjob_jupyter.frontends.map_cli import ProgressPrinter

    backend = ScriptedBackend(" ".join(["\x1b[2Jw"] * 40), token_delay_s=0.02)
    items = [{"key": f"doc-{i}\x1b[31m"} for i in range(2)]
    run = start_map(infer_guest(), items, tmp_path / "run", backend=backend, concurrency=2)
    err = io.StringIO()
    printer = ProgressPrinter(err, quiet=False, every_s=0.05)
    try:
        while not run.done and run.progress().concluded == 0:
            printer.watch(run.in_flight())
            time.sleep(0.01)
    finally:
        run.wait(60)
    lines = [line for line in err.getvalue().splitlines() if line.startswith("· running: ")]
    assert lines and any(re.search(r" generating \(\d+ tokens?\)", line) for line in lines), lines
    assert any("0 doc-0" in line for line in lines) and "\x1b" not in err.getvalue()
    quiet = io.StringIO()
    ProgressPrinter(quiet, quiet=True).watch(run.in_flight())
    assert quiet.getvalue() == ""


@pytest.mark.slow
def test_tensorjob_map_prints_its_running_items_on_the_real_model(tmp_path):
    """The console script in a subprocess, on the embedded model: its progress names an item generating before
    the map ends."""
    import json
    import subprocess
    import sys

    guest = tmp_path / "g.wasm"
    guest.write_bytes(infer_guest(64))
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps({"key": f"note-{i}"}) + "\n" for i in range(2)), encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "tensorjob_jupyter.frontends.cli", "map", str(guest), "--over",
                           str(manifest), "--run-dir", str(tmp_path / "run"), "--concurrency", "2"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    running = [line for line in proc.stderr.splitlines() if line.startswith("· running: ")]
    assert any("note-" in line for line in running), proc.stderr

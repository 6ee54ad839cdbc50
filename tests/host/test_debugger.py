"""Stepping through a guest: pause and step, breakpoints, time, the controls from any thread, scrubbing,
the terminal prompt, and hostile guests that must not reach the debugger's controls.

Kernel-level clicks (comm messages while the cell waits) are in tests/frontends/test_kernel.py, a real click in
JupyterLab in tests/frontends/test_browser.py.
"""

from __future__ import annotations

import io
import threading
import time

import orjson
import pytest

import tensorjob_jupyter as tj
from tensorjob_jupyter.host import debugger as debug
from tensorjob_jupyter.abi import codes
from tensorjob_jupyter.frontends.cli import main
from tensorjob_jupyter.inference import ScriptedBackend
from tensorjob_jupyter.frontends.view import render
from tensorjob_jupyter.frontends.view.scrub import Timeline
from tensorjob_jupyter.frontends.view.state import SECTIONS, ViewState
from tensorjob_jupyter.frontends.view.widget import JobView

import wat

EMIT1 = {"cmd": "emit", "progress": {"done": 1, "total": 3}}
EMIT2 = {"cmd": "emit", "progress": "two"}
INFER = {"cmd": "infer", "prompt": "hi", "max_tokens": 4}
EMIT3 = {"cmd": "emit", "progress": {"done": 3, "total": 3}}
DONE = {"cmd": "done", "result": "ok"}
SCRIPT = [EMIT1, EMIT2, INFER, EMIT3, DONE]


def guest(commands=SCRIPT, **kwargs) -> bytes:
    return wat.script_guest(commands, **kwargs)


def job_of(commands=SCRIPT, **kwargs) -> tj.Job:
    kwargs.setdefault("backend", ScriptedBackend("a b c d"))
    return tj.Job(guest(commands), **kwargs)


def types(job) -> list[str]:
    return [e["type"] for e in job.events]


# --- 1. pause and step -------------------------------------------------------------------------------


def test_a_debug_job_starts_paused_before_cf_init_and_steps_one_command_at_a_time():
    job = job_of(debug=True).start()
    state = job.wait_paused(10)
    assert job.paused and state["step"] == 0 and state["reason"] == "start" and state["command"] is None
    assert types(job) == ["job.created", "job.paused"]  # nothing ran: cf_init not yet called
    state = job.step(timeout=10)
    assert state["step"] == 1 and state["reason"] == "step" and state["command"] == EMIT1
    assert "job.progress" not in types(job)  # returned, not yet carried out
    state = job.step(timeout=10)
    assert state["step"] == 2 and state["command"] == EMIT2
    assert state["last_command"] == EMIT1 and state["last_event"] == {"event": "emitted"}
    assert types(job).count("job.progress") == 1
    state = job.step("infer", timeout=10)
    assert state["step"] == 3 and state["reason"] == "until" and state["until"] == "infer"
    assert state["command"] == {**INFER, "images": []} and "response.created" not in types(job)
    state = job.step(timeout=10)
    assert state["last_event"] == {"event": "infer_done", "text": "a b c d", "tokens_out": 4}
    assert state["memory_bytes"] > 0 and state["peak_memory_bytes"] >= state["memory_bytes"]
    job.resume()
    env = job.wait(10)
    assert env.ok and env.result == "ok" and not job.paused and job.debug_state is None
    assert types(job).count("job.paused") == 5 and types(job).count("job.resumed") == 5
    resumed = [e for e in job.events if e["type"] == "job.resumed"]
    assert [e["how"] for e in resumed] == ["step", "step", "until", "step", "continue"]
    created = job.events[0]
    assert created["debug"] == {"start_paused": True, "break_on": [], "max_paused_s": 600.0}


def test_step_from_a_running_job_pauses_it_and_pause_waits_for_the_next_stop():
    job = job_of([EMIT1] * 3 + [DONE], debug=True).start()
    job.wait_paused(10)
    job.resume()  # runs free; then ask it to stop (it may already have finished)
    state = job.pause(timeout=10)
    assert state is None or state["reason"] == "pause"
    if state is not None:
        job.resume()
    assert job.wait(10).ok


def test_resume_before_the_first_pause_calls_it_off_and_a_second_step_waits_its_turn():
    job = job_of(debug=True)
    job.resume()  # before start: the pending stop before cf_init is called off
    assert job.start().wait(10).ok and "job.paused" not in types(job)
    job = job_of(debug=True).start()
    assert job.step(timeout=10)["step"] == 1  # waits for the pause before cf_init, then steps: never racy
    job.cancel()
    assert job.wait(10).status.value == "cancelled"


def test_a_job_not_being_debugged_says_so_and_pays_nothing():
    job = job_of()
    assert not job.debugging and not job.paused and job.debug_state is None and job.debugger is None
    for call in (job.pause, job.step, job.resume):
        with pytest.raises(RuntimeError, match="not being debugged"):
            call()
    assert job.start().wait(10).ok
    assert "debug" not in job.events[0] and "job.paused" not in types(job)


def test_break_on_names_commands_and_refuses_anything_else():
    assert debug.parse_break_on("infer, open,infer") == ("infer", "open")
    assert debug.parse_break_on(["emit", "fail,done"]) == ("emit", "fail", "done")
    with pytest.raises(ValueError, match="'inferr' is not a command"):
        tj.Job(guest(), break_on="inferr", backend=None)
    with pytest.raises(ValueError, match="not a command"):
        debug.Debugger().step("nope", wait=False)


# --- 2. breakpoints ------------------------------------------------------------------------------------


def test_break_on_pauses_before_the_host_carries_the_command_out(tmp_path):
    doc = tmp_path / "doc.txt"
    doc.write_text("hello")
    job = job_of([EMIT1, {"cmd": "open", "path": str(doc)}, INFER, DONE], read=[tmp_path],
                 break_on="open,infer").start()
    state = job.wait_paused(10)
    assert state["reason"] == "break" and state["command"]["cmd"] == "open" and state["step"] == 2
    assert state["handles"] == [] and "job.file.opened" not in types(job)  # not opened yet
    job.resume()
    state = job.debugger.next_pause(state["pause"], timeout=10)
    assert state["command"]["cmd"] == "infer" and state["open_handles"] == 1
    assert state["handles"] == [{"handle": 0, "path": str(doc.resolve()), "len": 5, "kind": "text"}]
    assert "response.created" not in types(job)
    job.resume()
    assert job.wait(10).ok


def test_break_on_fail_pauses_before_the_guests_failure_is_final():
    job = job_of([EMIT1, {"cmd": "fail", "code": "bad_input", "message": "no"}], break_on="fail").start()
    state = job.wait_paused(10)
    assert state["reason"] == "break" and state["command"] == {"cmd": "fail", "code": "bad_input", "message": "no"}
    assert job.envelope is None and not job.done
    job.resume()
    env = job.wait(10)
    assert env.status.value == "failed" and env.error.code == "bad_input"


def test_break_on_fail_also_holds_any_other_failure_before_it_is_final(tmp_path):
    job = job_of([{"cmd": "open", "path": "/etc/passwd"}, DONE], read=[tmp_path], break_on="fail").start()
    state = job.wait_paused(10)
    assert state["reason"] == "failure" and state["error"]["code"] == codes.CAPABILITY_DENIED
    assert state["command"] == {"cmd": "open", "path": "/etc/passwd"} and not job.done
    job.step()  # stepping on from a failure: the failure stands
    env = job.wait(10)
    assert env.error.code == codes.CAPABILITY_DENIED and job.events[-1]["ended_during"] == "open"
    # A trap inside the guest, too (its memory can still be read).
    job = tj.Job(wat.script_guest([DONE], init_body="(unreachable)"), break_on="fail", backend=None).start()
    state = job.wait_paused(10)
    assert state["reason"] == "failure" and state["error"]["code"] == codes.WASM_TRAP and state["memory_bytes"] > 0
    job.resume()
    assert job.wait(10).error.code == codes.WASM_TRAP


# --- 3. time ---------------------------------------------------------------------------------------------


def test_paused_time_does_not_count_against_the_jobs_time_limit():
    job = job_of([EMIT1, EMIT2, DONE], debug=True, job_timeout_s=0.6).start()
    job.step(timeout=10)
    time.sleep(0.8)  # paused past the whole job's limit
    job.step(timeout=10)
    time.sleep(0.5)
    job.resume()
    env = job.wait(10)
    assert env.ok, env.error
    assert job.stats.paused_ms >= 1200 and job.events[-1]["stats"]["paused_ms"] >= 1200


def test_a_job_paused_longer_than_max_paused_s_is_cancelled_with_its_own_code():
    started = time.monotonic()
    job = job_of(debug=True, max_paused_s=0.3).start()
    env = job.wait(10)
    assert env.status.value == "cancelled" and env.error.code == codes.PAUSED_TOO_LONG
    assert "max_paused_s" in env.error.message and time.monotonic() - started < 5
    assert codes.PAUSED_TOO_LONG in tj.abi.HOST_ONLY_CODES  # a guest cannot claim it


def test_cancel_ends_a_paused_job_at_once():
    job = job_of(debug=True).start()
    job.wait_paused(10)
    started = time.monotonic()
    job.cancel()
    env = job.wait(5)
    assert env.status.value == "cancelled" and env.error.code == codes.CANCELLED
    assert time.monotonic() - started < 0.5


# --- 4. the controls, from any thread --------------------------------------------------------------------


def test_controls_from_other_threads_never_wait_for_the_guest():
    spinner = wat.script_guest([EMIT1, DONE], step_prelude="(loop $l (br $l))")
    job = tj.Job(spinner, debug=True, backend=None, call_timeout_s=1.5).start()
    job.step(timeout=10)  # paused before emit; the next cf_step spins
    job.resume()
    time.sleep(0.2)
    timings = []
    for call in (lambda: job.pause(wait=False), lambda: job.step(wait=False), job.resume,
                 lambda: job.step("infer", wait=False), lambda: job.paused, lambda: job.debug_state):
        t = time.monotonic()
        threading.Thread(target=call).start()
        call()
        timings.append(time.monotonic() - t)
    assert max(timings) < 0.1, timings
    assert job.wait(10).error.code == codes.TIMEOUT


# --- 5. scrubbing --------------------------------------------------------------------------------------


def live_fold(events, upto):
    clock = [0.0]
    state = ViewState(events[0].get("name", "guest"), clock=lambda: clock[0])
    for e in events[:upto + 1]:
        clock[0] = e["t_ms"] / 1000
        state.apply(e)
    return state


def test_scrubbing_refolds_to_any_event_exactly_as_the_live_fold(tmp_path):
    doc = tmp_path / "doc.txt"
    doc.write_text("x" * 4000)
    commands = [EMIT1, {"cmd": "open", "path": str(doc)}]
    commands += [{"cmd": "slice", "handle": 0, "offset": i * 500, "len": 500} for i in range(8)]
    commands += [INFER, {"cmd": "emit", "progress": {"fraction": 0.5}}, EMIT3, DONE]
    job = job_of(commands, read=[tmp_path], break_on="slice")
    job.start()
    while not job.done:
        if job.wait_paused(10) is not None:
            job.resume()
    events = job.events
    timeline = Timeline(job.transcript_path, job.name, every=4, max_checkpoints=4)
    assert len(timeline) == len(events) and timeline.checkpoints <= 4 and timeline.every >= 4
    for k in range(len(events)):
        scrubbed, live = timeline.state_at(k), live_fold(events, k)
        for section, renderer in render.RENDERERS.items():
            assert renderer(scrubbed) == renderer(live), (k, section)
        assert scrubbed.fraction == live.fraction and scrubbed.tokens == live.tokens
    middle = timeline.state_at(len(events) // 2)
    assert middle.status == "running" and 0 < middle.files[0].bytes_covered < 4000
    assert timeline.state_at(10**9).status == "completed"  # clamped


def test_a_view_state_copy_is_independent():
    state = ViewState()
    state.apply({"type": "job.file.opened", "handle": 0, "path": "a", "len": 100, "kind": {"kind": "text"}})
    state.apply({"type": "job.file.sliced", "handle": 0, "offset": 0, "length": 10, "requested": 10,
                 "next_offset": 10, "preview": "x"})
    state.apply({"type": "response.created"})
    state.apply({"type": "response.output_text.delta", "delta": "a"})
    state.apply({"type": "job.chunk", "bytes_base64": "4oI="})  # half of a 3-byte character
    copy = state.copy()
    copy.apply({"type": "job.file.sliced", "handle": 0, "offset": 10, "length": 10, "requested": 10,
                "next_offset": 20, "preview": "y"})
    copy.apply({"type": "response.output_text.delta", "delta": "b"})
    copy.apply({"type": "job.chunk", "bytes_base64": "rA=="})  # its last byte: a whole euro sign
    assert state.files[0].bytes_covered == 10 and copy.files[0].bytes_covered == 20
    assert state.infers[0].text == "a" and copy.infers[0].text == "ab"
    assert copy.output_text == "€" and state.output_text == ""


def test_the_finished_view_scrubs_through_its_events():
    job = job_of()
    view = JobView(job, refresh_hz=20).start()
    job.start().wait(10)
    view.join(10)
    assert view.scrub_row.layout.display == "flex" and view.scrub.max == len(job.events) - 1
    early = view.scrub_to(3)
    assert early.status == "running" and view.progress.value == pytest.approx(1 / 3)
    assert "event 3 of" in view.scrub_label.value and 'class="tj-status">running<' in view.header.value
    assert view.scrub.value == 3
    view.scrub.value = view.scrub.max  # as the front end would: the scrub thread follows
    wait_for(lambda: view.scrubbed_to == view.scrub.max)
    assert 'class="tj-status">completed<' in view.header.value and view.progress.value == 1.0
    view.scrub.value = 1
    wait_for(lambda: view.scrubbed_to == 1)
    assert view.progress.value == pytest.approx(1 / 3) and view.result.value == ""


# --- 6. the view's debug bar ------------------------------------------------------------------------


def wait_for(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_the_debug_bar_steps_the_job_and_its_buttons_follow_the_pauses():
    job = job_of(debug=True)
    view = JobView(job, refresh_hz=20).start()
    buttons = view.debug_buttons
    assert [b.description for b in buttons.values()] == ["Continue", "Step", "Step to next infer", "Pause"]
    job.start()
    wait_for(lambda: not buttons["step"].disabled)
    assert buttons["pause"].disabled and "before cf_init" in view.debug_panel.value
    buttons["step"].click()
    wait_for(lambda: "tj-debug-command" in view.debug_panel.value)
    assert "before step 1" in view.debug_panel.value and "done" in view.debug_panel.value
    buttons["until"].click()
    wait_for(lambda: "before step 3" in view.debug_panel.value)
    assert "infer" in view.debug_panel.value and 'class="tj-status">paused<' in view.header.value
    buttons["continue"].click()
    job.wait(10)
    view.join(10)
    assert all(b.disabled for b in buttons.values()) and "ended" in view.debug_panel.value


# --- 7. the terminal prompt ------------------------------------------------------------------------------


def test_tensorjob_run_debug_prompts_at_each_pause(tmp_path, monkeypatch):
    from tensorjob_jupyter.frontends import terminal

    path = tmp_path / "g.wasm"
    path.write_bytes(guest([EMIT1, EMIT2, {"cmd": "emit", "progress": "\x1b[2Jwiped"}, DONE]))
    answers = iter(["s\n", "\n", "?\n", "u emit\n", "c\n"])
    monkeypatch.setattr(terminal, "_stdin_line", lambda: next(answers, None))
    out, err = io.StringIO(), io.StringIO()
    assert main(["run", str(path), "--debug"], out=out, err=err) == 0
    text = err.getvalue()
    assert "⏸ paused before cf_init: started paused (--debug)" in text
    assert 'next command: {"cmd":"emit","progress":{"done":1,"total":3}}' in text
    assert "answered by:  {\"event\":\"emitted\"}" in text and "stepped to the next emit" in text
    assert "c continue" in text and "\x1b" not in text and out.getvalue().strip() == '"ok"'


def test_with_nothing_to_read_the_prompt_lets_the_job_run_on(tmp_path, monkeypatch):
    from tensorjob_jupyter.frontends import terminal

    path = tmp_path / "g.wasm"
    path.write_bytes(guest([EMIT1, DONE]))
    monkeypatch.setattr(terminal, "_stdin_line", lambda: None)
    out, err = io.StringIO(), io.StringIO()
    assert main(["run", str(path), "--debug", "--break-on", "emit,done"], out=out, err=err) == 0
    assert "runs on without pausing again" in err.getvalue() and err.getvalue().count("⏸") == 1


def test_a_shown_debug_run_prints_its_pauses_and_a_replay_ignores_them():
    job = job_of(break_on="emit")
    job.start()
    while not job.done:
        if job.wait_paused(10) is not None:
            job.resume()
    out, err = io.StringIO(), io.StringIO()
    assert main(["show", str(job.run_dir)], out=out, err=err) == 0
    assert err.getvalue().count("breakpoint on emit") == 3
    report = tj.replay(guest(), job.run_dir)
    assert report.same_result and report.divergence is None
    # ... and a replay can be stepped too: no model needed.
    replay = tj.ReplayJob(guest(), job.run_dir, debug=True).start()
    assert replay.step(timeout=10)["command"] == EMIT1
    replay.resume()
    assert replay.wait(10).ok


# --- 8. hostile guests ----------------------------------------------------------------------------------


def test_a_huge_command_makes_a_small_pause(healthy):
    prompt = "<script>" + "p" * (4 << 20)
    deep: object = "bottom"
    for _ in range(120):
        deep = [deep]
    wide = {f"<k{i}>": "v" * 5000 for i in range(2000)}
    commands = [{"cmd": "infer", "prompt": prompt, "max_tokens": 1}, {"cmd": "emit", "progress": deep},
                {"cmd": "emit", "progress": wide}, DONE]
    job = tj.Job(wat.input_script_guest(), input_bytes=wat.pack_commands(commands), break_on="infer,emit",
                 backend=ScriptedBackend("x"), max_emit_bytes=32 << 20)
    job.start()
    sizes = []
    while not job.done:
        state = job.wait_paused(30)
        if state is None:
            break
        t = time.monotonic()
        sizes.append(len(orjson.dumps(state)))
        html = render.debug(_folded(state))
        assert time.monotonic() - t < 0.5 and len(html) < 600_000
        assert "<script" not in html and "<k" not in html
        if state["command"]["cmd"] == "infer":
            assert "&lt;script&gt;ppp" in html and "more characters" in html
        job.resume()
    assert job.wait(30).ok and len(sizes) == 3 and max(sizes) < 100_000, sizes
    paused = [e for e in job.events if e["type"] == "job.paused"]
    assert all(len(orjson.dumps(e)) < 100_000 for e in paused)


def _folded(state: dict) -> ViewState:
    view = ViewState()
    view.apply({"type": "job.paused", **state})
    return view


def test_nothing_a_guest_sends_reaches_the_debug_controls():
    forged = {"type": "job.paused", "reason": "start", "step": 0, "html": "<button>Continue</button>"}
    commands = [{"cmd": "emit", "progress": forged}, {"cmd": "emit", "progress": {"type": "job.resumed"}},
                {"cmd": "fail", "code": "<b>Step</b>", "message": "<img src=x onerror=alert(1)>"}]
    job = tj.Job(guest(commands), break_on="fail", backend=None)
    view = JobView(job, refresh_hz=20).start()
    labels = {k: (b.description, b.tooltip, b.icon) for k, b in view.debug_buttons.items()}
    job.start()
    state = job.wait_paused(10)
    assert state["reason"] == "break" and view.state.debugging
    wait_for(lambda: view.state.paused and not view.debug_buttons["continue"].disabled)
    assert labels == {k: (b.description, b.tooltip, b.icon) for k, b in view.debug_buttons.items()}
    html = view.debug_panel.value + view.log.value
    for needle in ("<img", "<button", "<b>Step"):
        assert needle not in html, needle
    assert "&lt;img src=x onerror=alert(1)&gt;" in view.debug_panel.value
    job.resume()
    job.wait(10)
    view.join(10)
    assert view.state.debug["pause"] == 1  # the forged payloads were log lines, not pauses
    assert all(b.disabled for b in view.debug_buttons.values())


def test_a_hand_written_pause_event_cannot_break_the_view():
    state = ViewState()
    for event in [{"type": "job.paused"}, {"type": "job.paused", "step": "<b>", "handles": "x", "error": 5},
                  {"type": "job.paused", "step": -1, "handles": [{"handle": "x"}, 5, {"handle": 1, "len": 2}],
                   "command": {"cmd": ["<script>"] * 10_000}, "reason": "<script>" * 100, "memory_bytes": 1.5}]:
        state.apply(event)
        html = render.debug(state)
        assert "<script" not in html and "<b><" not in html
    assert len(render.debug(state)) < 200_000


def test_a_guest_spinning_while_a_pause_is_asked_for_is_stopped_by_its_own_deadline(healthy):
    job = tj.Job(wat.spin_in_step(), break_on="done", backend=None, call_timeout_s=1.0).start()
    started = time.monotonic()
    time.sleep(0.3)  # inside cf_step by now, spinning
    assert job.pause(timeout=10) is None  # the pause never came: the guest timed out inside cf_step
    assert job.envelope.error.code == codes.TIMEOUT and time.monotonic() - started < 5


def test_every_section_is_rendered_for_a_debug_state():
    assert "debug" in SECTIONS and "debug" in render.RENDERERS


def test_a_debug_run_shown_again_has_the_panel_and_scrubs_through_its_pauses():
    from tensorjob_jupyter.history.show import Playback

    job = job_of(break_on="infer", backend=ScriptedBackend("a b c d"))
    job.start()
    job.wait_paused(10)
    job.resume()
    job.wait(10)
    playback = Playback(job.run_dir)
    view = JobView(playback, refresh_hz=20).start()
    view.join(10)
    assert playback.debugging and view.debug_panel is not None and not view.debug_buttons
    assert "ended" in view.debug_panel.value and "breakpoint" in view.debug_panel.value
    paused_at = next(e["sequence_number"] for e in job.events if e["type"] == "job.paused")
    view.scrub_to(paused_at)
    assert 'class="tj-status">paused<' in view.header.value and "<b>paused</b> before step 3" in view.debug_panel.value


def test_dragging_the_slider_shows_the_latest_position_without_flooding_the_front_end():
    job = job_of([EMIT1] * 40 + [DONE])
    view = JobView(job, refresh_hz=10).start()
    job.start().wait(10)
    view.join(10)
    import ipywidgets

    sends = []
    original = ipywidgets.Widget._send

    def counting(widget, msg, buffers=None):
        if widget is not view.scrub:  # the slider's own moves are the front end's
            sends.append(time.monotonic())
        return original(widget, msg, buffers)

    ipywidgets.Widget._send = counting
    try:
        started = time.monotonic()
        for k in range(1, view.scrub.max + 1):  # a fast drag: one move a millisecond
            view.scrub.value = k
            time.sleep(0.001)
        wait_for(lambda: view.scrubbed_to == view.scrub.max)
        elapsed = time.monotonic() - started
    finally:
        ipywidgets.Widget._send = original
    assert 'class="tj-status">completed<' in view.header.value
    assert 0 < len(sends) <= 20 * (elapsed + 1), (len(sends), elapsed)  # not one show per move

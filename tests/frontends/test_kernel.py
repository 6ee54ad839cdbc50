"""The magics in a real Jupyter kernel, driven over its wire protocol with jupyter_client.

This is what a notebook front end does: execute cells, watch IOPub for the
widget messages (comm_open / comm_msg), streams and results, send comm
messages back (a click on the Cancel button) and interrupt the kernel.
"""

import json
import os
import queue
import time
from pathlib import Path

import pytest
from jupyter_client.manager import start_new_kernel

import wat

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tests"), env.get("PYTHONPATH", "")])
    env["TENSORJOB_RUNS"] = str(tmp_path_factory.mktemp("kernel-runs"))
    # A real ipython_config.py: the TensorJob defaults come from the profile.
    ipython_dir = tmp_path_factory.mktemp("ipython")
    (ipython_dir / "profile_default").mkdir()
    (ipython_dir / "profile_default" / "ipython_config.py").write_text(
        "c.TensorJob.refresh_hz = 7.0\nc.TensorJob.max_steps = 4321\n")
    env["IPYTHONDIR"] = str(ipython_dir)
    km, kc = start_new_kernel(kernel_name="python3", env=env)
    try:
        run(kc, "%load_ext tensorjob_jupyter")
        yield km, kc
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def run(kc, code, *, timeout=60, during=None):
    """Execute ``code``; return (reply, IOPub messages of this execution)."""
    msg_id = kc.execute(code)
    messages = []
    deadline = time.monotonic() + timeout
    started = False
    while True:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"timed out running {code[:60]!r}"
        if during is not None and started:
            during(messages)
            during = None
        try:
            msg = kc.get_iopub_msg(timeout=min(remaining, 0.2))
        except queue.Empty:
            continue
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        messages.append(msg)
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "busy":
            started = True
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
    reply = kc.get_shell_msg(timeout=timeout)
    while reply["parent_header"].get("msg_id") != msg_id:
        reply = kc.get_shell_msg(timeout=timeout)
    return reply, messages


def stdout(messages):
    return "".join(m["content"]["text"] for m in messages if m["msg_type"] == "stream" and m["content"]["name"] == "stdout")


def widget_states(messages):
    """The last known state of every widget model, from comm_open and comm_msg updates."""
    states = {}
    for m in messages:
        if m["msg_type"] == "comm_open":
            states[m["content"]["comm_id"]] = dict(m["content"]["data"].get("state", {}))
        elif m["msg_type"] == "comm_msg" and m["content"]["data"].get("method") == "update":
            states.setdefault(m["content"]["comm_id"], {}).update(m["content"]["data"]["state"])
    return states


def html_values(messages):
    return [s["value"] for s in widget_states(messages).values() if s.get("_model_name") == "HTMLModel" or
            isinstance(s.get("value"), str)]


def result_text(messages):
    for m in messages:
        if m["msg_type"] == "execute_result":
            return m["content"]["data"]["text/plain"]
    return None


def error_of(reply, messages):
    """The cell's error: (ename, evalue, the traceback lines shown), or None if it raised nothing."""
    errors = [m["content"] for m in messages if m["msg_type"] == "error"]
    if reply["content"]["status"] != "error":
        assert not errors
        return None
    assert len(errors) == 1
    return errors[0]["ename"], errors[0]["evalue"], errors[0]["traceback"]


def static_views(messages):
    """The static HTML each finished view left in its output (display updates carrying text/html)."""
    return [m["content"]["data"]["text/html"] for m in messages
            if m["msg_type"] == "update_display_data" and "text/html" in m["content"]["data"]]


def test_a_cell_shows_the_live_view_and_returns_the_result(kernel):
    _, kc = kernel
    cell = "%%tensorjob\n" + wat.script_wat([{"cmd": "emit", "progress": {"done": 1, "total": 2}},
                                              {"cmd": "done", "result": {"answer": 42}}])
    reply, messages = run(kc, cell)
    assert reply["content"]["status"] == "ok"
    # Shown once: by the view -- no plain summary, no Out[]; the value is the envelope, in _ for the next cell.
    assert result_text(messages) is None and stdout(messages) == ""
    _, later = run(kc, "_.status.value, _.result")
    assert result_text(later) == "('completed', {'answer': 42})"
    displays = [m for m in messages if m["msg_type"] == "display_data"]
    assert displays and "application/vnd.jupyter.widget-view+json" in displays[0]["content"]["data"]
    assert displays[0]["content"]["data"]["text/plain"].startswith("tensorjob live view")
    values = "".join(html_values(messages))
    assert 'class="tj-status">completed<' in values and "answer" in values
    progress = [s for s in widget_states(messages).values() if s.get("_model_name") == "FloatProgressModel"]
    assert progress and progress[0]["value"] == 1.0
    # Once finished, the output also carries the final view as static HTML (for nbconvert, GitHub, nbviewer).
    [static] = static_views(messages)
    assert 'class="tensorjob-view tj-static"' in static and "answer" in static and "1 / 2" in static


def test_a_kernel_interrupt_cancels_the_job_cleanly(kernel):
    km, kc = kernel
    run(kc, "%config TensorJob.call_timeout_s = 60")
    spin = "%%tensorjob\n" + wat.script_wat([{"cmd": "done", "result": 1}], init_body=wat.SPIN)

    def interrupt(_messages):
        time.sleep(0.5)
        km.interrupt_kernel()

    reply, messages = run(kc, spin, during=interrupt)
    # The cancelled job stops the notebook: a one-line error, no traceback of the host.
    ename, evalue, traceback = error_of(reply, messages)
    assert ename == "JobFailed" and evalue == "cell.wat: job cancelled"
    assert traceback == ["JobFailed: cell.wat: job cancelled"]
    run(kc, "%config TensorJob.call_timeout_s = 10")
    # The kernel and the host still work; --quiet showed nothing, so the envelope is the cell's Out[].
    reply, messages = run(kc, "%%tensorjob --quiet\n" + wat.script_wat([{"cmd": "done", "result": "after"}]))
    assert result_text(messages) == "Envelope(completed, result='after')"


def test_the_cancel_button_works_while_the_cell_waits(kernel):
    _, kc = kernel
    spin = "%%tensorjob\n" + wat.script_wat([{"cmd": "emit", "progress": 1}, {"cmd": "done", "result": 1}],
                                            step_prelude="(loop $l (br $l))")

    def click(messages):
        time.sleep(0.5)
        while True:  # collect what arrived so far
            try:
                msg = kc.get_iopub_msg(timeout=0.2)
            except queue.Empty:
                break
            messages.append(msg)
            if any(m["msg_type"] == "comm_open" and m["content"]["data"].get("state", {}).get("_model_name") ==
                   "ButtonModel" for m in messages):
                break
        buttons = [cid for cid, s in widget_states(messages).items() if s.get("_model_name") == "ButtonModel"]
        assert buttons, "no Cancel button was displayed"
        kc.session.send(kc.shell_channel.socket, "comm_msg",
                        {"comm_id": buttons[0], "data": {"method": "custom", "content": {"event": "click"}}})

    reply, messages = run(kc, spin, during=click, timeout=30)
    assert error_of(reply, messages)[1] == "cell.wat: job cancelled"
    button = [s for s in widget_states(messages).values() if s.get("_model_name") == "ButtonModel"][0]
    assert button["disabled"] and button["description"] == "Cancelled"


def test_two_jobs_at_once_each_with_its_own_view(kernel, tmp_path):
    _, kc = kernel
    guest = tmp_path / "bg.wat"
    guest.write_text(wat.script_wat([{"cmd": "emit", "progress": {"fraction": 0.5}}, {"cmd": "done", "result": "bg"}]))
    reply, messages = run(kc, f"a = %tensorjob run {guest} --bg\n"
                              f"b = %tensorjob run {guest} --bg\n"
                              "print(a.wait(30).result, b.wait(30).result, a.id != b.id)")
    assert reply["content"]["status"] == "ok", reply["content"]
    assert "bg bg True" in stdout(messages)
    assert len([m for m in messages if m["msg_type"] == "display_data"]) == 2


def test_defaults_come_from_ipython_config_and_config_changes_them(kernel):
    _, kc = kernel
    _, messages = run(kc, "m = get_ipython().magics_manager.registry['TensorJob']\n"
                          "print(m.refresh_hz, m.max_steps)\n"
                          "%config TensorJob.max_steps = 99\n"
                          "print(m.max_steps)")
    assert stdout(messages) == "7.0 4321\n99\n"
    reply, messages = run(kc, "%%tensorjob --quiet\n" + wat.script_wat([{"cmd": "emit", "progress": 1}]))
    assert "max_steps" not in stdout(messages)  # quiet: nothing printed; the failure is raised
    assert "max_steps" in error_of(reply, messages)[1]
    _, messages = run(kc, "print(tensorjob_jupyter_last := __import__('tensorjob_jupyter').jobs()[-1].envelope.error.message)")
    assert "99 commands" in stdout(messages) and "max_steps" in stdout(messages)
    run(kc, "%config TensorJob.max_steps = 1000000")


# --- debugging: the debug bar's clicks while the cell waits, and --bg jobs stepped from later cells -------------

EMIT = {"cmd": "emit", "progress": {"done": 1, "total": 3}}
#: A cf_step that takes a fraction of a millisecond, so an endless guest does not flood the kernel.
SLOW_STEP = dict(step_prelude="(global.set $n (i32.const 0)) (block $b (loop $l (global.set $n (i32.add "
                              "(global.get $n) (i32.const 1))) (br_if $b (i32.ge_u (global.get $n) "
                              "(i32.const 300000))) (br $l)))",
                 extra="(global $n (mut i32) (i32.const 0))")


def read_until(kc, messages, predicate, what, timeout=20):
    """Read IOPub into ``messages`` until ``predicate(widget states)`` holds."""
    deadline = time.monotonic() + timeout
    while not predicate(widget_states(messages)):
        assert time.monotonic() < deadline, f"timed out waiting for {what}; debug panel: {debug_panel(messages)!r}"
        try:
            messages.append(kc.get_iopub_msg(timeout=0.2))
        except queue.Empty:
            pass


def button(states, label):
    ids = [cid for cid, s in states.items() if s.get("_model_name") == "ButtonModel" and s.get("description") == label]
    return ids[0] if ids else None


def enabled(states, label):
    cid = button(states, label)
    return cid is not None and not states[cid].get("disabled", False)


def panel_of(states) -> str:
    return next((s["value"] for s in states.values() if 'class="tj-debug"' in str(s.get("value", ""))), "")


def debug_panel(messages) -> str:
    return panel_of(widget_states(messages))


def click(kc, states, label):
    cid = button(states, label)
    assert cid is not None, f"no {label} button"
    kc.session.send(kc.shell_channel.socket, "comm_msg",
                    {"comm_id": cid, "data": {"method": "custom", "content": {"event": "click"}}})


def cancel_on_failure(kc, drive):
    """If driving the view fails, click Cancel before failing, so the next test finds the kernel idle."""
    def driven(messages):
        try:
            drive(messages)
        except BaseException:
            try:
                click(kc, widget_states(messages), "Cancel")
            except Exception:  # noqa: BLE001
                pass
            raise
    return driven


def progress_value(states) -> float:
    return next((s.get("value", 0) for s in states.values() if s.get("_model_name") == "FloatProgressModel"), 0)


def test_the_debug_bar_steps_a_waiting_cell_through_comm_messages(kernel):
    _, kc = kernel
    cell = "%%tensorjob --debug\n" + wat.script_wat([EMIT, {"cmd": "emit", "progress": "two"},
                                                     {"cmd": "infer", "prompt": "never run", "max_tokens": 4},
                                                     {"cmd": "done", "result": 1}])
    seen = []

    def drive(messages):
        read_until(kc, messages, lambda s: "before cf_init" in panel_of(s) and enabled(s, "Step")
                   and not enabled(s, "Pause"), "the first pause")
        states = widget_states(messages)
        assert not enabled(states, "Pause") and enabled(states, "Continue") and enabled(states, "Step to next infer")
        seen.append(panel_of(states))
        click(kc, states, "Step")
        read_until(kc, messages, lambda s: "before step 1" in panel_of(s) and enabled(s, "Step"), "step 1")
        seen.append(panel_of(widget_states(messages)))
        click(kc, widget_states(messages), "Step")
        read_until(kc, messages, lambda s: "before step 2" in panel_of(s) and enabled(s, "Step"), "step 2")
        seen.append(panel_of(widget_states(messages)))
        click(kc, widget_states(messages), "Step to next infer")
        read_until(kc, messages, lambda s: "before step 3" in panel_of(s) and enabled(s, "Step"), "step 3")
        seen.append(panel_of(widget_states(messages)))
        click(kc, widget_states(messages), "Cancel")

    reply, messages = run(kc, cell, during=cancel_on_failure(kc, drive), timeout=60)
    assert error_of(reply, messages)[1] == "cell.wat: job cancelled"
    start, step1, step2, step3 = seen
    assert "tj-debug-command" not in start and "started paused" in start
    assert "next command" in step1 and "&quot;emit&quot;" in step1 and "answered by" not in step1
    assert "last command" in step2 and "emitted" in step2 and "&quot;two&quot;" in step2
    assert "<code>infer</code>" in step3 and "never run" in step3 and "step to" in step3
    states = widget_states(messages)
    assert all(states[button(states, b)]["disabled"] for b in ("Continue", "Step", "Step to next infer", "Pause"))
    assert "tokens" not in stdout(messages) or "0 out" in stdout(messages)  # the infer never ran: no model


def test_breakpoints_and_pause_through_comm_messages(kernel):
    _, kc = kernel
    endless = "%%tensorjob --break-on done --max-steps 1000000\n" + wat.script_wat([EMIT], **SLOW_STEP)

    def drive(messages):
        read_until(kc, messages, lambda s: enabled(s, "Pause") and progress_value(s) > 0, "the job running")
        click(kc, widget_states(messages), "Pause")
        read_until(kc, messages, lambda s: "paused</b> before step" in panel_of(s) and enabled(s, "Continue"),
                   "the pause")
        assert "· Pause" in debug_panel(messages)
        click(kc, widget_states(messages), "Continue")
        read_until(kc, messages, lambda s: enabled(s, "Pause"), "running again")
        click(kc, widget_states(messages), "Cancel")

    reply, messages = run(kc, endless, during=cancel_on_failure(kc, drive), timeout=60)
    assert error_of(reply, messages)[1] == "cell.wat: job cancelled"

    breaks = "%%tensorjob --break-on emit\n" + wat.script_wat([EMIT, {"cmd": "emit", "progress": "b"},
                                                               {"cmd": "done", "result": "through"}])

    def go_on(messages):
        for step in (1, 2):
            read_until(kc, messages, lambda s: f"before step {step}" in panel_of(s) and enabled(s, "Continue"),
                       f"the breakpoint at step {step}")
            assert "breakpoint on <code>emit</code>" in debug_panel(messages)
            click(kc, widget_states(messages), "Continue")

    reply, messages = run(kc, breaks, during=cancel_on_failure(kc, go_on), timeout=60)
    assert reply["content"]["status"] == "ok" and "&quot;through&quot;" in static_views(messages)[0]


def test_a_bg_job_is_stepped_from_later_cells_and_an_interrupt_ends_a_paused_cell(kernel, tmp_path):
    km, kc = kernel
    guest = tmp_path / "debugged.wat"
    guest.write_text(wat.script_wat([EMIT, {"cmd": "done", "result": "stepped"}]))
    reply, _ = run(kc, f"j = %tensorjob run {guest} --debug --bg")
    assert reply["content"]["status"] == "ok"
    _, messages = run(kc, "s = j.step(timeout=10)\nprint(s['step'], s['command']['cmd'], j.paused)")
    assert stdout(messages) == "1 emit True\n"
    _, messages = run(kc, "%tensorjob jobs")
    assert "paused" in stdout(messages)
    _, messages = run(kc, "j.resume()\nprint(j.wait(10).result, j.paused)")
    assert stdout(messages) == "stepped False\n"

    def interrupt(messages):
        read_until(kc, messages, lambda s: "before cf_init" in panel_of(s), "the first pause")
        km.interrupt_kernel()

    reply, messages = run(kc, f"%tensorjob run {guest} --debug", during=interrupt, timeout=30)
    assert error_of(reply, messages)[1] == "debugged.wat: job cancelled"


# --- a data scientist's first hour (issue 23): failures stop the notebook, inputs as Python writes them, maps ------


def stderr(messages):
    return "".join(m["content"]["text"] for m in messages if m["msg_type"] == "stream" and m["content"]["name"] == "stderr")


def echo_guest(tmp_path):
    """A guest whose result is its input (test_magic.echo_wat), as a file."""
    from test_magic import echo_wat

    path = tmp_path / "echo.wat"
    path.write_text(echo_wat())
    return path


def test_a_failed_run_raises_after_its_view_and_the_value_is_always_the_envelope(kernel, tmp_path):
    _, kc = kernel
    failing = tmp_path / "fail.wat"
    failing.write_text(wat.script_wat([{"cmd": "fail", "code": "not_found", "message": "gone <b>"}]))
    reply, messages = run(kc, f"%tensorjob run {failing} --out kept")
    ename, evalue, traceback = error_of(reply, messages)
    assert (ename, evalue) == ("JobFailed", "fail.wat failed: not_found: gone <b>")
    assert traceback == ["JobFailed: fail.wat failed: not_found: gone <b>"]  # no host traceback
    kinds = [m["msg_type"] for m in messages]
    assert kinds.index("display_data") < kinds.index("error")  # the view showed the failure first
    assert "gone &lt;b&gt;" in static_views(messages)[0]
    good = tmp_path / "good.wat"
    good.write_text(wat.script_wat([{"cmd": "done", "result": "fine"}]))
    reply, messages = run(kc, f"r = %tensorjob run {failing} --no-raise\n"
                              f"s = %tensorjob run {good}\n"
                              "print(kept.error.code, r.status.value, r.error.code, s.result)")
    assert reply["content"]["status"] == "ok", reply["content"]
    assert stdout(messages) == "not_found failed not_found fine\n"


def test_input_as_json_a_variable_or_a_python_literal(kernel, tmp_path):
    _, kc = kernel
    echo = echo_guest(tmp_path)
    reply, messages = run(kc, "params = {'path': 'a.txt', 'n': 3}\n"
                              f"""a = %tensorjob run {echo} --quiet --input '{{"path": "a.txt", "n": 3}}'\n"""
                              f"b = %tensorjob run {echo} --quiet --input $params\n"
                              f"""c = %tensorjob run {echo} --quiet --input "{{'path': 'a.txt', 'n': 3}}"\n"""
                              f"""d = %tensorjob run {echo} --quiet --input "{{\\"path\\": \\"a.txt\\", \\"n\\": 3}}"\n"""
                              f"e = %tensorjob run {echo} --quiet --input True\n"
                              f"f = %tensorjob run {echo} --quiet --input '[None, False, (1, 2)]'\n"
                              f"""g = %tensorjob run {echo} --quiet --input '"text"'\n"""
                              "print(a.result == b.result == c.result == d.result == params, e.result, f.result, "
                              "g.result)")
    assert reply["content"]["status"] == "ok", reply["content"]
    assert stdout(messages) == "True True [None, False, [1, 2]] text\n"
    for line, says in [("--input {nope", "--input is not valid JSON"),
                       ("""--input '"{\\"a\\": 1}"'""", "quoted once too often"),  # a dict inside a string
                       ("""--input {"a": 1}""", "quote a value once"),  # unquoted: split at the space
                       ("""--input '{"a": 1}""", "No closing quotation")]:
        reply, messages = run(kc, f"%tensorjob run {echo} {line}")
        assert reply["content"]["status"] == "error"
        error = stderr(messages)
        assert error.startswith("UsageError: ") and error.count("\n") == 1 and says in error, error
        assert "--input '{\"path\": \"a.txt\"}'" in error  # says how to write it


def test_a_map_takes_its_guest_from_the_cell_and_restart_starts_a_changed_one_over(kernel, tmp_path):
    _, kc = kernel
    manifest = tmp_path / "m.jsonl"
    manifest.write_text('{"doc": "a"}\n{"doc": "b"}\n')
    cell = f"%%tensorjob map --over {manifest} --run-dir {tmp_path / 'run'}\n"
    reply, messages = run(kc, cell + wat.script_wat([{"cmd": "done", "result": {"v": 1}}]))
    assert reply["content"]["status"] == "ok", reply["content"]
    assert result_text(messages).startswith("<MapResult finished: 2 items, 2 completed, 0 failed; ")
    [static] = static_views(messages)
    assert 'class="tj-map-items"' in static and "{&quot;doc&quot;:&quot;b&quot;}" in static
    changed = wat.script_wat([{"cmd": "done", "result": {"v": 2}}])
    reply, messages = run(kc, cell + changed)
    assert "guest changed" in stderr(messages) and "--restart" in stderr(messages)
    reply, messages = run(kc, cell.rstrip("\n") + " --restart --quiet\n" + changed)
    assert reply["content"]["status"] == "ok", reply["content"]
    reply, messages = run(kc, "[(row['input.doc'], row['status'], row['result.v']) for row in _.rows()]")
    assert result_text(messages) == "[('a', 'completed', 2), ('b', 'completed', 2)]"


# --- maps as experiments (issue 29): expected answers, a replay over a map, the gate, the estimate ---------------


def test_a_scored_map_its_replay_by_a_changed_guest_and_the_gate_in_a_kernel(kernel, tmp_path):
    from llama_support import write_tiny_gguf

    _, kc = kernel
    tiny = write_tiny_gguf(tmp_path / "tiny.gguf")
    guest = ('import tensorjob as tj\n\ndef main(input):\n'
             '    reply = tj.infer(PROMPT + input["doc"], max_tokens=3)\n'
             '    return {"words": len(reply.text.split()) * SCALE, "n": input["n"]}\n')
    for name, head in [("v1.py", 'PROMPT = "Say: "\nSCALE = 1\n'), ("v2.py", 'PROMPT = "Say: "\nSCALE = 0\n'),
                       ("v3.py", 'PROMPT = "Say: "\nSCALE = 1\n')]:
        body = guest if name != "v3.py" else guest.replace('PROMPT + input["doc"]',
                                                            '("Tell: " if input["n"] % 2 else PROMPT) + input["doc"]')
        (tmp_path / name).write_text(head + body, encoding="utf-8")
    manifest, expected, run_dir = tmp_path / "m.jsonl", tmp_path / "e.jsonl", tmp_path / "run"
    manifest.write_text("".join(f'{{"doc": "the cat {i}", "n": {i}}}\n' for i in range(4)), encoding="utf-8")
    expected.write_text("".join(f'{{"n": {i}}}\n' for i in range(4)), encoding="utf-8")
    reply, messages = run(kc, "def same_n(result, expected):\n    return result['n'] == expected['n']\n"
                              f"m = %tensorjob map {tmp_path / 'v1.py'} --over {manifest} --run-dir {run_dir} "
                              f"--model {tiny} --expected {expected} --scorer $same_n\n"
                              "print(m.score_summary().mean, m.to_pandas()['score'].tolist())", timeout=180)
    assert reply["content"]["status"] == "ok", reply["content"]
    assert stdout(messages) == "1.0 [1.0, 1.0, 1.0, 1.0]\n"
    [static] = static_views(messages)
    assert 'class="tj-map-score"' in static and "score <b>1.00</b> (4/4 passed)" in static
    reply, messages = run(kc, f"r = %tensorjob replay {tmp_path / 'v2.py'} --map {run_dir} --quiet --scorer $same_n\n"
                              "print(r.needs_model, r.summary()['scored_both'], r.passed('recorded'), "
                              "list(r.to_pandas()['changed_fields'].map(tuple)))", timeout=120)
    assert reply["content"]["status"] == "ok", reply["content"]
    changed = stdout(messages)
    assert changed.startswith("[] 4 True [") and "('words',)" in changed  # the parser changed, the score did not
    reply, messages = run(kc, f"%tensorjob replay {tmp_path / 'v3.py'} --map {run_dir} --run-dir {tmp_path / 'v3'} "
                              f"--quiet --scorer $same_n --fail-under recorded", timeout=120)
    ename, evalue, traceback = error_of(reply, messages)
    assert ename == "GateFailed" and evalue.startswith("gate: not passed -- 2 item(s) need the model")
    assert len(traceback) == 1
    reply, messages = run(kc, f"e = %tensorjob map {tmp_path / 'v1.py'} --over {manifest} --run-dir {run_dir} "
                              f"--model {tiny} --estimate\nprint(e.prompt_tokens > 0, e.speed is not None, "
                              f"e.items)", timeout=120)
    assert reply["content"]["status"] == "ok", reply["content"]
    assert stdout(messages) == "True True 4\n"
    reply, messages = run(kc, f"%tensorjob map {tmp_path / 'v1.py'} --over {manifest} --run-dir {run_dir} "
                              "--scorer $nothing_here")
    assert reply["content"]["status"] == "error" and "no variable named 'nothing_here'" in stderr(messages)


def test_sources_review_and_require_grounded_in_a_fresh_kernel(kernel, tmp_path):
    """What test_sources.py does in-process, in a real kernel: a map's sources, ``%tensorjob review`` doubtful
    first, and ``--require-grounded --fail-item`` failing the planted item with ``ungrounded``."""
    from test_sources import GUEST, LINES
    _, kc = kernel
    docs = tmp_path / "docs"
    docs.mkdir()
    for i, line in enumerate(LINES):
        (docs / f"d{i}.txt").write_text(f"{line}\nsecond line of {i}\n", encoding="utf-8")
    claims = ["ACME Corp", "zoë  ångström", "The product named, or null,"]  # exact, normalised, planted
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps({"path": str(docs / f"d{i}.txt"), "claim": c}) + "\n"
                                for i, c in enumerate(claims)), encoding="utf-8")
    reply, messages = run(kc, f"m = %tensorjob map {GUEST} --over {manifest} --run-dir {tmp_path / 'run'} "
                              f"--read {docs} --quiet\n"
                              f"r = %tensorjob review {tmp_path / 'run'} --table\n"
                              f"w = %tensorjob review {tmp_path / 'run'}\n"
                              "import json\n"
                              "print(json.dumps([[x['item'], x['field'], x['reason']] for x in r]))\n"
                              "print(type(w).__name__, 'tensorjob-review' in w._dom_classes)\n"
                              "print(json.dumps(m.to_pandas()['grounded.claim'].tolist()))", timeout=180)
    assert reply["content"]["status"] == "ok", reply["content"]
    order, widget, grounded = stdout(messages).splitlines()
    assert widget == "VBox True"  # without --table: the review widget, one value at a time
    assert json.loads(order)[0] == [2, "claim", "not_found"] and len(json.loads(order)) == 6
    assert json.loads(grounded) == [True, True, False]
    reply, messages = run(kc, f"s = %tensorjob map {GUEST} --over {manifest} --run-dir {tmp_path / 'strict'} "
                              f"--read {docs} --quiet --require-grounded claim --fail-item\n"
                              "print(json.dumps([(i, e['code']) for i, e in s.failures().items()]))", timeout=180)
    assert reply["content"]["status"] == "ok", reply["content"]
    assert json.loads(stdout(messages)) == [[2, "ungrounded"]]

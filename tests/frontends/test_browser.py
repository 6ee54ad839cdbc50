"""The live view in a real browser: JupyterLab, driven by Playwright in Chromium.

This starts JupyterLab on a free localhost port (no token, its own config,
data and runtime folders, and a root folder holding a copy of the tutorial
notebooks and the files they refer to), opens the quick-start notebook in
Debian's Chromium, runs its cells through JupyterLab's own keyboard commands
and reads the rendered widgets from the page: the view of the summariser (a
Python guest, ``summarise.py``) appears, the streamed tokens grow, the
progress bar and the file coverage move and end full, the status reads
``completed`` and the result is shown. Then it adds a cell with a longer job
(the C summariser), clicks that view's Cancel button while the cell is still
waiting, and checks the view ends ``cancelled``. Last, a cell runs a small
guest with ``--debug``: the view's debug bar appears, clicking Step changes
the command panel (while the cell waits), Continue runs it to the end, and
the slider over the finished job's events appears.

A second test types a ``%%tensorjob --lang python`` cell (the guest's source
in the cell) into a new notebook and checks its view the same way: it
appears, streams tokens, its progress and file panels move, the guest's
``print`` lines show in its log, and it ends ``completed`` with the result.

Screenshots of the running and the finished view are kept as test artifacts
in ``test-artifacts/browser/``; with ``TENSORJOB_UPDATE_SCREENSHOTS=1`` a
passing run also copies them to ``docs/``, the pictures README.md and
notebook 01 show (and README's debug bar).

The test is marked ``browser``. It skips only when ``/usr/bin/chromium`` or
the ``playwright`` package is absent -- and not even then when
``TENSORJOB_REQUIRE_BROWSER=1`` is set (CI), so a skip never hides a failure.
It never downloads a browser.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tensorjob_jupyter.sandbox.python import interpreter

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
ARTIFACTS = ROOT / "test-artifacts" / "browser"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
NOTEBOOK = "notebooks/01-quick-start.ipynb"
# The quick-start's code cells: 1 loads the extension, 3 reads the text, 5 runs the summariser (summarise.py).
LOAD_CELL, TEXT_CELL, JOB_CELL = 1, 3, 5
JOB_GUEST = "summarise.py"
LONG_JOB = ("%tensorjob run ../guests/examples/summarise.c --read ../examples/data "
            "--input '{\"path\": \"../examples/data/lighthouse.txt\", \"window\": 256, \"max_tokens\": 64}'")

pytestmark = pytest.mark.browser


def _require_or_skip(reason: str):
    if os.environ.get("TENSORJOB_REQUIRE_BROWSER", "") not in ("", "0"):
        pytest.fail(f"TENSORJOB_REQUIRE_BROWSER is set but {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


if not os.access(CHROMIUM, os.X_OK):
    _require_or_skip(f"{CHROMIUM} is not installed (apt-get install chromium)")
try:
    from playwright.sync_api import sync_playwright
except ModuleNotFoundError as e:  # only a missing package skips; a broken one fails
    if e.name is None or e.name.split(".")[0] != "playwright":
        raise
    _require_or_skip("the playwright package is not installed (pip install playwright; no browser download needed)")


# -- JupyterLab ---------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _fresh_notebooks(root: Path) -> None:
    """Copy notebooks/, examples/, guests/ (and docs/) under ``root``; the notebooks lose their saved outputs.

    The saved outputs include the widget state of a finished view, which
    JupyterLab would render before anything runs; without them every view on
    the page comes from this test's kernel.
    """
    for name in ("notebooks", "examples", "guests", "docs"):  # docs/: the pictures notebook 01 shows
        if name == "docs" and not (ROOT / name).is_dir():
            continue
        shutil.copytree(ROOT / name, root / name, ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
    import wat  # tests/wat.py: the guest the debugging part steps through

    (root / "notebooks" / DEBUG_GUEST).write_text(wat.script_wat(
        [{"cmd": "emit", "progress": "first step"}, {"cmd": "emit", "progress": "second step"},
         {"cmd": "done", "result": "debugged"}]))
    for path in (root / "notebooks").glob("*.ipynb"):
        nb = json.loads(path.read_text())
        for cell in nb["cells"]:
            if cell["cell_type"] == "code":
                cell["outputs"], cell["execution_count"] = [], None
        nb["metadata"].pop("widgets", None)
        path.write_text(json.dumps(nb, indent=1))


@pytest.fixture(scope="module")
def jupyterlab(tmp_path_factory):
    """A JupyterLab server of our own; yields (base URL, tmp dir, server log path).

    The Python guests' interpreter is built first (a minute, once per machine;
    a no-op when it is cached), so the jobs' deadlines below measure the jobs.
    """
    interpreter.ensure(False)
    tmp = tmp_path_factory.mktemp("browser")
    root = tmp / "root"
    root.mkdir()
    _fresh_notebooks(root)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("JUPYTER") and k not in ("IPYTHONDIR", "TENSORJOB_RUNS")}
    env.update(JUPYTER_CONFIG_DIR=str(tmp / "jupyter-config"), JUPYTER_DATA_DIR=str(tmp / "jupyter-data"),
               JUPYTER_RUNTIME_DIR=str(tmp / "jupyter-runtime"), IPYTHONDIR=str(tmp / "ipython"),
               TENSORJOB_RUNS=str(tmp / "runs"), PYTHONUNBUFFERED="1")
    # No news or update checks (there is no network, and their notices would cover the page).
    settings = tmp / "jupyter-config" / "lab" / "user-settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    log_path = tmp / "jupyterlab.log"
    log = open(log_path, "w")
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={port}", "--ip=127.0.0.1",
         "--ServerApp.port_retries=0", "--IdentityProvider.token=", "--allow-root",
         f"--ServerApp.root_dir={root}", "--LabApp.news_url=None", "--LabApp.extension_manager=readonly",
         "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"],
        cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            if server.poll() is not None:
                pytest.fail(f"JupyterLab exited with {server.returncode}:\n{log_path.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{base}/api/status", timeout=2) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"JupyterLab did not answer on {base} within 60 s:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.25)
        yield base, tmp, log_path
    finally:
        server.terminate()  # the server shuts its kernels down on SIGTERM
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, 9)
            server.wait(10)
        log.close()


# -- reading the page ------------------------------------------------------------------------------

# One snapshot of every live view on the page, in document order.
SNAPSHOT_JS = """() => [...document.querySelectorAll('.tensorjob-view')].map(v => {
  const bar = v.querySelector('.progress .progress-bar');
  const button = v.querySelector('button');
  return {
    status: (v.querySelector('.tj-status') || {}).textContent || null,
    tokens: [...v.querySelectorAll('.tj-tokens')].map(e => e.textContent).join(''),
    progress: bar ? parseFloat(bar.style.width) : null,
    files: [...v.querySelectorAll('.tj-file code')].map(e => e.textContent),
    coverage: [...v.querySelectorAll('.tj-coverage')].map(e => parseFloat(e.dataset.covered)),
    result: (v.querySelector('.tj-result') || {}).textContent || null,
    log: (v.querySelector('.tj-log') || {}).textContent || null,
    error: (v.querySelector('.tj-error') || {}).textContent || null,
    button: button ? {text: button.textContent.trim(), disabled: button.disabled} : null,
    where: (v.querySelector('.tj-debug-where') || {}).textContent || null,
    command: (v.querySelector('.tj-debug-command') || {}).textContent || null,
    scrub: !!v.querySelector('.tj-scrub input, .tj-scrub .slider') && v.querySelector('.tj-scrub').offsetParent !== null,
  };
})"""
#: The Python cell the second test types into a new notebook: the guest's source under ``%%tensorjob``.
PY_NOTEBOOK = "notebooks/python-cell.ipynb"
PY_CELL = """%%tensorjob --lang python --read ../examples/data --input '{"path": "../examples/data/lighthouse.txt"}'
import tensorjob as tj

def main(input):
    with tj.open(input["path"]) as f:
        first = f.read(600)
        print("read", f.tell(), "of", f.size, "bytes")
    tj.emit(done=1, total=2)
    tokens = []
    for token in tj.infer("What is this text about? One sentence.\\n" + first + "\\nAnswer:", max_tokens=32):
        tokens.append(token)
    tj.emit(done=2, total=2)
    return {"tokens": len(tokens), "answer": "".join(tokens).strip()}
"""
#: A guest for the debugging part: two commands, then done.
DEBUG_GUEST = "debug-guest.wat"
DEBUG_JOB = f"%tensorjob run {DEBUG_GUEST} --debug"


# The notebook's kernel is connected and idle: the toolbar names it and the status bar says "| Idle".
KERNEL_READY_JS = """() => {
  const name = document.querySelector('.jp-NotebookPanel .jp-KernelName');
  const bar = document.querySelector('.jp-StatusBar-Widget');
  return !!(name && /Python/.test(name.innerText) && bar && /[|] Idle/.test(bar.innerText));
}"""


def write_notebook(path, cells: list[str]) -> None:
    """A notebook of ``cells`` (code, not yet run) on the Python 3 kernel, at ``path``."""
    path.write_text(json.dumps({
        "cells": [{"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": c}
                  for c in cells],
        "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}},
        "nbformat": 4, "nbformat_minor": 5}, indent=1))


def _cell(page, index):
    return page.locator(".jp-NotebookPanel .jp-Notebook .jp-Cell").nth(index)


def _prompt(page, index) -> str:
    return _cell(page, index).locator(".jp-InputPrompt").inner_text().strip()


def _run_cell(page, index) -> None:
    """Select cell ``index`` in command mode and run it with Shift+Enter, as a user would."""
    page.keyboard.press("Escape")
    _cell(page, index).locator(".jp-InputPrompt").click()
    page.keyboard.press("Shift+Enter")


def _wait_executed(page, index, timeout_s, what) -> str:
    """Wait until cell ``index`` shows an execution count ``[n]:``; return the cell's output text."""
    deadline = time.monotonic() + timeout_s
    prompt = ""
    while time.monotonic() < deadline:
        prompt = _prompt(page, index)
        if re.fullmatch(r"\[\d+\]:", prompt):
            return _cell(page, index).locator(".jp-OutputArea").inner_text()
        time.sleep(0.2)
    pytest.fail(f"{what} did not finish within {timeout_s} s (its prompt still reads {prompt!r}); cell text:\n"
                f"{_cell(page, index).inner_text()[-2000:]}", pytrace=False)


def _views(page) -> list[dict]:
    return page.evaluate(SNAPSHOT_JS)


def _settle(page, index, timeout_s=10.0) -> list[dict]:
    """Snapshots of view ``index`` once its status is final, until its last update lands.

    The header (with the status) can arrive before the progress bar, the
    panels and the button; the button is disabled last, so that is the signal.
    """
    out = []
    deadline = time.monotonic() + timeout_s
    while True:
        v = _views(page)[index]
        out.append(v)
        if (v["button"] or {}).get("disabled") or time.monotonic() > deadline:
            return out
        time.sleep(0.05)


def _distinct(values) -> list:
    out = []
    for v in values:
        if not out or out[-1] != v:
            out.append(v)
    return out


# -- the test --------------------------------------------------------------------------------------

def test_the_live_view_in_jupyterlab(jupyterlab):
    base, tmp, server_log = jupyterlab
    shots = tmp / "screenshots"
    shots.mkdir()
    print(f"JupyterLab log: {server_log}\nscreenshots: {shots}")  # shown by pytest when the test fails
    console: list[str] = []  # the page's errors, quoted in failure messages

    def screenshot(element, name):
        element.screenshot(path=str(shots / name))

    def on_console(message):
        if message.type == "error":
            console.append(f"console error: {message.text}")

    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp / "chromium-profile"), executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
            viewport={"width": 1280, "height": 900})
        page = context.pages[0] if context.pages else context.new_page()
        try:
            page.set_default_timeout(60_000)
            page.on("console", on_console)
            page.on("pageerror", lambda e: console.append(f"pageerror: {e}"))
            page.goto(f"{base}/lab/tree/{NOTEBOOK}")
            page.wait_for_selector(".jp-NotebookPanel .jp-Notebook .jp-Cell")
            page.wait_for_function(KERNEL_READY_JS, timeout=90_000)
            assert _views(page) == [], "a tensorjob view was on the page before any cell ran"

            # Load the extension, read the text, then run the summariser.
            _run_cell(page, LOAD_CELL)
            _wait_executed(page, LOAD_CELL, 60, "the %load_ext cell")
            _run_cell(page, TEXT_CELL)
            _wait_executed(page, TEXT_CELL, 60, "the cell that reads lighthouse.txt")
            job_source = _cell(page, JOB_CELL).locator(".jp-InputArea-editor").inner_text()
            assert JOB_GUEST in job_source, f"the quick start's job cell does not run {JOB_GUEST}: {job_source!r}"
            started = time.monotonic()
            _run_cell(page, JOB_CELL)
            job_view = _cell(page, JOB_CELL).locator(".tensorjob-view")

            # Poll the rendered view while the job runs.
            seen: list[dict] = []
            running_shot = False  # taken once part-way, retaken once the second infer streams
            tokens_at_part = None
            deadline = started + 180
            while time.monotonic() < deadline:
                views = _views(page)
                if views:
                    seen.append(views[0])
                    v = views[0]
                    if v["status"] in ("completed", "failed", "cancelled"):
                        seen.extend(_settle(page, 0))
                        break
                    if v["status"] == "running" and v["progress"] and 0 < v["progress"] < 100:
                        if tokens_at_part is None:
                            tokens_at_part = len(v["tokens"])
                            screenshot(job_view, "live-view-running.png")
                            running_shot = True
                        elif running_shot is True and len(v["tokens"]) > tokens_at_part:
                            screenshot(job_view, "live-view-running.png")
                            running_shot = "streaming"
                time.sleep(0.05)
            job_s = time.monotonic() - started
            assert seen, (f"no .tensorjob-view appeared within 180 s of running the job cell; cell text:\n"
                          f"{_cell(page, JOB_CELL).inner_text()[-2000:]}\nbrowser errors: {console[-10:]}")
            final = seen[-1]
            statuses = _distinct(v["status"] for v in seen)
            assert final["status"] == "completed", (
                f"the view's status ended {final['status']!r} (statuses seen {statuses}); error panel: "
                f"{final['error']!r}; cell text:\n{_cell(page, JOB_CELL).inner_text()[-2000:]}")
            assert "running" in statuses, f"the view never showed 'running' while the job ran: statuses {statuses}"

            lengths = _distinct(len(v["tokens"]) for v in seen)
            running_lengths = _distinct(len(v["tokens"]) for v in seen if v["status"] == "running")
            assert len(set(running_lengths)) >= 3, (
                f"the token text never grew while the job ran: lengths of .tj-tokens seen while running "
                f"{running_lengths} (all: {lengths}) in {len(seen)} polls over {job_s:.1f} s")

            progress = _distinct(v["progress"] for v in seen)
            assert all(x is not None for x in progress), f"no progress bar in the view: widths seen {progress}"
            assert any(0 < x < 100 for x in progress), (
                f"the progress bar showed no intermediate value: widths seen {progress}")
            assert progress[-1] == 100, f"the progress bar did not end full: widths seen {progress}"
            assert progress == sorted(progress), f"the progress bar went backwards: widths seen {progress}"

            assert any("lighthouse.txt" in f for f in final["files"]), (
                f"the Files panel does not show lighthouse.txt: files {final['files']}")
            coverage = _distinct(tuple(v["coverage"]) for v in seen)
            assert any(c and 0 < c[0] < 100 for c in coverage), (
                f"the file's coverage never showed a part read: .tj-coverage data-covered seen {coverage}")
            assert final["coverage"] == [100.0], (
                f"the file's coverage did not end at 100: .tj-coverage data-covered seen {coverage}")

            assert final["result"] and "summary" in final["result"] and "windows" in final["result"], (
                f"the result panel (.tj-result) does not show the summary: {final['result']!r}")
            assert final["button"] == {"text": "Completed", "disabled": True}, (
                f"the Cancel button did not end disabled as 'Completed': {final['button']}")
            output = _wait_executed(page, JOB_CELL, 30, "the job cell")
            # Shown once, by the view: no plain summary line under it (issue 23).
            assert f"tensorjob {JOB_GUEST}: completed" not in output, f"a summary line repeats the view:\n{output}"
            assert running_shot, (f"no moment with status 'running' and a part-full progress bar for the running "
                                  f"screenshot: progress {progress}, statuses {statuses}")
            page.wait_for_timeout(300)  # let the last paint land
            screenshot(job_view, "live-view.png")

            # A second, longer job in a new cell below, stopped with its Cancel button while the cell waits.
            page.keyboard.press("Escape")
            _cell(page, JOB_CELL).locator(".jp-InputPrompt").click()
            page.keyboard.press("b")
            new = JOB_CELL + 1
            page.wait_for_function(
                "n => document.querySelectorAll('.jp-NotebookPanel .jp-Notebook .jp-Cell').length > n", arg=new + 1)
            page.keyboard.press("Enter")
            page.keyboard.insert_text(LONG_JOB)
            editor = _cell(page, new).locator(".jp-InputArea-editor").inner_text()
            assert LONG_JOB in editor.replace("\u00a0", " "), f"the new cell does not hold the job: {editor!r}"
            page.keyboard.press("Shift+Enter")
            long_view = _cell(page, new).locator(".tensorjob-view")
            seen2: list[dict] = []
            deadline = time.monotonic() + 120
            clicked_at = ended_at = None
            while time.monotonic() < deadline:
                views = _views(page)
                if len(views) >= 2:
                    v = views[1]
                    seen2.append(v)
                    if v["status"] in ("completed", "failed", "cancelled"):
                        ended_at = time.monotonic()
                        seen2.extend(_settle(page, 1))
                        break
                    if clicked_at is None and v["status"] == "running" and len(v["tokens"]) > 0:
                        prompt = _prompt(page, new)
                        assert prompt == "[*]:", f"the long job's cell is not waiting when Cancel is clicked: {prompt}"
                        long_view.locator("button").click()
                        clicked_at = time.monotonic()
                    if clicked_at is not None and time.monotonic() - clicked_at > 30:
                        break
                time.sleep(0.05)
            statuses2 = _distinct(v["status"] for v in seen2)
            assert seen2, (f"no second .tensorjob-view appeared for the long job; cell text:\n"
                           f"{_cell(page, new).inner_text()[-2000:]}")
            assert clicked_at is not None, (
                f"the long job's view never showed 'running' with tokens to click Cancel: statuses {statuses2}")
            last = seen2[-1]
            assert last["status"] == "cancelled", (
                f"clicking Cancel did not stop the long job: its view's status went {statuses2} and reads "
                f"{last['status']!r} {time.monotonic() - clicked_at:.1f} s after the click (button: {last['button']}, "
                f"tokens so far {len(last['tokens'])} chars); browser errors: {console[-10:]}")
            cancel_s = ended_at - clicked_at
            assert last["button"] == {"text": "Cancelled", "disabled": True}, (
                f"the Cancel button did not end disabled as 'Cancelled': {last['button']}")
            output2 = _wait_executed(page, new, 30, "the cancelled job's cell")
            # A cancelled job stops the notebook: the cell ends with a one-line JobFailed (issue 23).
            assert "JobFailed: summarise.c" in output2 and "cancelled" in output2, (
                f"the cell's one-line error is missing:\n{output2}")
            page.wait_for_timeout(300)
            long_view.screenshot(path=str(shots / "live-view-cancelled.png"))

            # A guest stepped with the debug bar while its cell waits.
            page.keyboard.press("Escape")
            _cell(page, new).locator(".jp-InputPrompt").click()
            page.keyboard.press("b")
            dbg = new + 1
            page.wait_for_function(
                "n => document.querySelectorAll('.jp-NotebookPanel .jp-Notebook .jp-Cell').length > n", arg=dbg + 1)
            page.keyboard.press("Enter")
            page.keyboard.insert_text(DEBUG_JOB)
            page.keyboard.press("Shift+Enter")
            debug_view = _cell(page, dbg).locator(".tensorjob-view")

            def debug_snapshot(predicate, what, timeout_s=30):
                deadline = time.monotonic() + timeout_s
                while time.monotonic() < deadline:
                    views = _views(page)
                    if len(views) >= 3 and predicate(views[2]):
                        return views[2]
                    time.sleep(0.05)
                views = _views(page)
                pytest.fail(f"the debug view never showed {what}: {views[2] if len(views) >= 3 else views}; "
                            f"cell text:\n{_cell(page, dbg).inner_text()[-2000:]}", pytrace=False)

            def step_button():  # by its text ("Step to next infer" also starts with Step)
                return debug_view.locator("button", has_text=re.compile(r"^\s*Step\s*$"))

            # the view's parts update one after another: wait for the pause's place and status together
            first = debug_snapshot(lambda v: v["where"] and "before cf_init" in v["where"] and v["status"] == "paused",
                                   "its first pause")
            assert first["command"] is None, first
            page.wait_for_function("b => !b.disabled", arg=step_button().element_handle())
            step_button().click()
            one = debug_snapshot(lambda v: v["command"] and "first step" in v["command"], "step 1's command")
            assert _prompt(page, dbg) == "[*]:", "the debug cell is not waiting while it is stepped"
            page.wait_for_function("b => !b.disabled", arg=step_button().element_handle())
            step_button().click()
            two = debug_snapshot(lambda v: v["command"] and "second step" in v["command"], "step 2's command")
            assert one["command"] != two["command"] and "before step 2" in two["where"], (one, two)
            debug_view.screenshot(path=str(shots / "debug-view.png"))
            debug_view.locator("button", has_text=re.compile(r"^\s*Continue\s*$")).click()
            done = debug_snapshot(lambda v: v["status"] == "completed" and v["scrub"], "the end and its slider")
            assert "debugged" in (done["result"] or ""), done
            output3 = _wait_executed(page, dbg, 30, "the debug cell")
            assert "JobFailed" not in output3 and "Traceback" not in output3, output3
        except BaseException:
            with contextlib.suppress(Exception):  # the whole page, for whoever reads the failure
                page.screenshot(path=str(shots / "failure.png"))
            raise
        finally:
            context.close()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for name in ("live-view-running.png", "live-view.png", "live-view-cancelled.png", "debug-view.png"):
        shutil.copyfile(shots / name, ARTIFACTS / name)
    if os.environ.get("TENSORJOB_UPDATE_SCREENSHOTS", "") not in ("", "0"):
        # Only a passing run updates the pictures README.md and notebook 01 show.
        DOCS.mkdir(exist_ok=True)
        for name in ("live-view-running.png", "live-view.png", "debug-view.png"):
            shutil.copyfile(shots / name, DOCS / name)
    print(f"\njob view: {len(seen)} polls, {job_s:.1f} s, token lengths {len(lengths)} distinct, progress {progress}, "
          f"coverage {coverage}; cancel took effect {cancel_s:.2f} s after the click; screenshots in {shots}")


def test_a_python_cell_in_jupyterlab(jupyterlab):
    """A ``%%tensorjob --lang python`` cell, typed and run as a user would: its live view appears and finishes."""
    base, tmp, server_log = jupyterlab
    root = tmp / "root"
    write_notebook(root / PY_NOTEBOOK, ["%load_ext tensorjob_jupyter"])
    shots = tmp / "screenshots-python"
    shots.mkdir()
    print(f"JupyterLab log: {server_log}\nscreenshots: {shots}")
    console: list[str] = []
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp / "chromium-profile-python"), executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
            viewport={"width": 1280, "height": 900})
        page = context.pages[0] if context.pages else context.new_page()
        try:
            page.set_default_timeout(60_000)
            page.on("console", lambda m: m.type == "error" and console.append(f"console error: {m.text}"))
            page.on("pageerror", lambda e: console.append(f"pageerror: {e}"))
            # A workspace of its own: the default one would reopen notebook 01 beside it.
            page.goto(f"{base}/lab/workspaces/python-cell/tree/{PY_NOTEBOOK}")
            page.wait_for_selector(".jp-NotebookPanel .jp-Notebook .jp-Cell")
            page.wait_for_function(KERNEL_READY_JS, timeout=90_000)
            _run_cell(page, 0)
            _wait_executed(page, 0, 60, "the %load_ext cell")

            # Shift+Enter on the last cell left a new empty cell below it: type the guest there and run it.
            page.wait_for_function("() => document.querySelectorAll('.jp-NotebookPanel .jp-Notebook .jp-Cell')"
                                   ".length > 1")
            page.keyboard.press("Escape")
            _cell(page, 1).locator(".jp-InputPrompt").click()
            page.keyboard.press("Enter")
            page.keyboard.insert_text(PY_CELL)
            typed = _cell(page, 1).locator(".jp-InputArea-editor").inner_text().replace("\u00a0", " ")
            lines = lambda text: [ln.rstrip() for ln in text.splitlines() if ln.strip()]  # noqa: E731
            assert lines(typed) == lines(PY_CELL), (  # innerText doubles an empty line: compare the others
                f"the new cell does not hold the Python guest as typed:\n{typed}")
            started = time.monotonic()
            page.keyboard.press("Shift+Enter")
            view = _cell(page, 1).locator(".tensorjob-view")

            seen: list[dict] = []
            deadline = started + 180
            while time.monotonic() < deadline:
                views = _views(page)
                if views:
                    v = views[0]
                    seen.append(v)
                    if v["status"] in ("completed", "failed", "cancelled"):
                        seen.extend(_settle(page, 0))
                        break
                time.sleep(0.05)
            job_s = time.monotonic() - started
            assert seen, (f"no .tensorjob-view appeared within 180 s of running the Python cell; cell text:\n"
                          f"{_cell(page, 1).inner_text()[-2000:]}\nbrowser errors: {console[-10:]}")
            final = seen[-1]
            statuses = _distinct(v["status"] for v in seen)
            assert final["status"] == "completed", (
                f"the Python cell's view ended {final['status']!r} (statuses seen {statuses}); error panel: "
                f"{final['error']!r}; cell text:\n{_cell(page, 1).inner_text()[-2000:]}")
            assert "running" in statuses, f"the view never showed 'running' while the job ran: statuses {statuses}"
            running_lengths = _distinct(len(v["tokens"]) for v in seen if v["status"] == "running")
            assert len(set(running_lengths)) >= 2, (
                f"the token text never grew while the Python guest's infer ran: lengths seen while running "
                f"{running_lengths} in {len(seen)} polls over {job_s:.1f} s")
            progress = _distinct(v["progress"] for v in seen if v["progress"] is not None)
            assert 50 in progress and progress[-1] == 100 and progress == sorted(progress), (
                f"the progress bar did not go 1/2 then 2/2: widths seen {progress}")
            assert any("lighthouse.txt" in f for f in final["files"]), f"no lighthouse.txt in {final['files']}"
            assert final["coverage"] and 0 < final["coverage"][0] < 100, (
                f"the guest read 600 of 1488 bytes, but the coverage reads {final['coverage']}")
            assert final["log"] and re.search(r"read \d+ of 1488 bytes", final["log"]), (
                f"the guest's print() line is not in the view's log: {final['log']!r}")
            assert final["result"] and "answer" in final["result"] and "tokens" in final["result"], (
                f"the result panel (.tj-result) does not show the guest's result: {final['result']!r}")
            assert final["button"] == {"text": "Completed", "disabled": True}, final["button"]
            output = _wait_executed(page, 1, 30, "the Python cell")
            assert "JobFailed" not in output and "Traceback" not in output, output
            page.wait_for_timeout(300)
            view.screenshot(path=str(shots / "live-view-python.png"))
        except BaseException:
            with contextlib.suppress(Exception):
                page.screenshot(path=str(shots / "failure.png"))
            raise
        finally:
            context.close()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(shots / "live-view-python.png", ARTIFACTS / "live-view-python.png")
    print(f"\nPython cell view: {len(seen)} polls, {job_s:.1f} s, statuses {statuses}, progress {progress}")


#: What the map test reads off each row of the map view's item table: its number, its score, whether the
#: browser had to clip them (scrollWidth past clientWidth), and the input cell's text.
MAP_ROWS_JS = """() => [...document.querySelectorAll('.tensorjob-map-view .tj-map-items tr')].map(tr => {
  const n = tr.querySelector('.tj-map-item-number'), s = tr.querySelector('.tj-map-item-score');
  return {item: n.textContent, item_clipped: n.scrollWidth > n.clientWidth,
          score: s ? s.textContent : null, score_clipped: s ? s.scrollWidth > s.clientWidth : null,
          input: tr.querySelector('.tj-map-item-input').textContent};
})"""


def test_a_40_item_maps_view_shows_two_digit_items_and_two_decimal_scores_whole(jupyterlab):
    """A 40-item map with expected answers, run from a notebook cell in JupyterLab: once it has ended its view
    lists every item, the numbers 10-39 and the scores 0.33 as they are, and each input by its key."""
    import wat  # tests/wat.py

    base, tmp, server_log = jupyterlab
    root = tmp / "root"
    folder = root / "map40"
    folder.mkdir()
    (folder / "g.wasm").write_bytes(wat.script_guest([{"cmd": "done", "result": {"a": 1, "b": 0, "c": 0}}]))
    (folder / "m.jsonl").write_text("".join(json.dumps({"path": f"emails/{i:03d}_api.txt"}) + "\n"
                                            for i in range(40)))
    (folder / "e.jsonl").write_text("".join(json.dumps({"a": 1, "b": 2, "c": 3}) + "\n" for _ in range(40)))
    cells = ["%load_ext tensorjob_jupyter",
             "%tensorjob map g.wasm --over m.jsonl --run-dir run --expected e.jsonl --scorer json_fields"]
    write_notebook(folder / "map40.ipynb", cells)
    shots = tmp / "screenshots-map40"
    shots.mkdir()
    print(f"JupyterLab log: {server_log}\nscreenshots: {shots}")
    console: list[str] = []
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp / "chromium-profile-map40"), executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
            viewport={"width": 1280, "height": 900})
        page = context.pages[0] if context.pages else context.new_page()
        try:
            page.set_default_timeout(60_000)
            page.on("pageerror", lambda e: console.append(f"pageerror: {e}"))
            page.goto(f"{base}/lab/workspaces/map40/tree/map40/map40.ipynb")
            page.wait_for_selector(".jp-NotebookPanel .jp-Notebook .jp-Cell")
            page.wait_for_function(KERNEL_READY_JS, timeout=90_000)
            _run_cell(page, 0)
            _wait_executed(page, 0, 60, "the %load_ext cell")
            _run_cell(page, 1)
            output = _wait_executed(page, 1, 180, "the map cell")
            deadline = time.monotonic() + 60
            rows: list[dict] = []
            while time.monotonic() < deadline:
                rows = page.evaluate(MAP_ROWS_JS)
                if len(rows) >= 40:
                    break
                time.sleep(0.2)
            assert len(rows) == 40, (f"the finished map's view lists {len(rows)} items, not 40; cell output:\n"
                                     f"{output[-2000:]}\nbrowser errors: {console[-10:]}")
            assert [r["item"] for r in rows] == [str(i) for i in range(40)], [r["item"] for r in rows]
            assert not any(r["item_clipped"] for r in rows), [r for r in rows if r["item_clipped"]][:3]
            assert {r["score"] for r in rows} == {"0.33"} and not any(r["score_clipped"] for r in rows), rows[:3]
            assert rows[18]["input"] == "emails/018_api.txt", rows[18]
            page.locator(".tensorjob-map-view").first.screenshot(path=str(shots / "map-view-40.png"))
        except BaseException:
            with contextlib.suppress(Exception):
                page.screenshot(path=str(shots / "failure.png"))
            raise
        finally:
            context.close()


#: The first result cell of the map view: its marks, whether its sources are open, and what they show.
MAP_SOURCES_JS = """() => {
  const d = document.querySelector('.tensorjob-map-view details.tj-map-item-sources');
  if (!d) return null;
  const mark = d.querySelector('mark.tj-span');
  const box = mark ? mark.getBoundingClientRect() : null;
  return {open: d.open, grounded: d.querySelectorAll('summary .tj-grounded').length,
          ungrounded: d.querySelectorAll('summary .tj-ungrounded').length,
          span: mark ? mark.textContent : null, span_visible: !!box && box.width > 0 && box.height > 0,
          scripts: document.querySelectorAll('.tensorjob-map-view script').length};
}"""


def test_a_maps_result_cell_opens_to_each_field_s_source_with_the_span_highlighted(jupyterlab):
    """A map of ``tests/guests/quote.c`` over two documents (one line holds markup) from a notebook cell: the
    first item's cell marks its fields found; a click opens the excerpt with the span in a visible ``<mark>``,
    the document's markup shown as text."""
    base, tmp, server_log = jupyterlab
    root = tmp / "root"
    folder = root / "mapsrc"
    folder.mkdir()
    guest = Path(__file__).resolve().parents[1] / "guests" / "quote.c"
    (folder / "quote.c").write_bytes(guest.read_bytes())
    (folder / "docs").mkdir()
    (folder / "docs" / "d0.txt").write_text("Invoice <b>42</b> from ACME\nnext\n")
    (folder / "docs" / "d1.txt").write_text("Ticket 3: kettle broken\n")
    (folder / "m.jsonl").write_text(json.dumps({"path": "docs/d0.txt", "claim": "ACME"}) + "\n"
                                    + json.dumps({"path": "docs/d1.txt", "claim": "Widget Pro"}) + "\n")
    cells = ["%load_ext tensorjob_jupyter",
             "%tensorjob map quote.c --over m.jsonl --run-dir run --read docs"]
    write_notebook(folder / "mapsrc.ipynb", cells)
    shots = tmp / "screenshots-mapsrc"
    shots.mkdir()
    print(f"JupyterLab log: {server_log}\nscreenshots: {shots}")
    console: list[str] = []
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp / "chromium-profile-mapsrc"), executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
            viewport={"width": 1280, "height": 900})
        page = context.pages[0] if context.pages else context.new_page()
        try:
            page.set_default_timeout(60_000)
            page.on("pageerror", lambda e: console.append(f"pageerror: {e}"))
            page.goto(f"{base}/lab/workspaces/mapsrc/tree/mapsrc/mapsrc.ipynb")
            page.wait_for_selector(".jp-NotebookPanel .jp-Notebook .jp-Cell")
            page.wait_for_function(KERNEL_READY_JS, timeout=90_000)
            _run_cell(page, 0)
            _wait_executed(page, 0, 60, "the %load_ext cell")
            _run_cell(page, 1)
            output = _wait_executed(page, 1, 240, "the map cell")
            page.wait_for_function(MAP_SOURCES_JS, timeout=60_000)
            before = page.evaluate(MAP_SOURCES_JS)
            assert before["open"] is False and before["grounded"] == 2 and before["ungrounded"] == 0, (
                before, output[-2000:], console[-10:])
            page.locator(".tensorjob-map-view details.tj-map-item-sources summary").first.click()
            page.wait_for_function(f"() => ({MAP_SOURCES_JS})().span_visible", timeout=10_000)
            after = page.evaluate(MAP_SOURCES_JS)
            assert after["open"] is True and after["span"] == "Invoice <b>42</b> from ACME", after
            assert after["scripts"] == 0
            page.locator(".tensorjob-map-view").first.screenshot(path=str(shots / "map-view-sources.png"))
        except BaseException:
            with contextlib.suppress(Exception):
                page.screenshot(path=str(shots / "failure.png"))
            raise
        finally:
            context.close()


#: The review widget: its value, the highlighted span, whether any script came with it.
REVIEW_JS = """() => {
  const v = document.querySelector('.tensorjob-review');
  if (!v) return null;
  const mark = v.querySelector('mark');
  return {text: v.innerText, span: mark ? mark.textContent : null,
          scripts: v.querySelectorAll('script').length, images: v.querySelectorAll('img').length};
}"""


def test_the_review_widget_is_driven_from_the_keyboard(jupyterlab):
    """The review widget in JupyterLab: the invented vendor comes first; with the pointer over the card the
    keys decide (c, typing, Enter corrects; a accepts; n nulls; b goes back) and the decisions reach reviews.jsonl;
    the hostile vendor is text, never markup."""
    from test_review_widget import make_run

    base, tmp, server_log = jupyterlab
    folder = tmp / "root" / "review"
    folder.mkdir(parents=True)
    run_dir = make_run(folder)
    # the doubt order alone (no sample turns), so the first value is known; %tensorjob review gives the same widget
    # with the default share (tests/frontends/test_kernel.py)
    cells = ["import tensorjob_jupyter as tj", f"tj.MapResult.read({str(run_dir)!r}).review_widget(sample_share=0)"]
    write_notebook(folder / "review.ipynb", cells)
    shots = tmp / "screenshots-review"
    shots.mkdir()
    print(f"JupyterLab log: {server_log}\nscreenshots: {shots}")
    console: list[str] = []

    def decisions() -> list[tuple[str, str, object]]:
        path = run_dir / "reviews.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        return [(r["field"], r["decision"], r.get("corrected")) for r in map(json.loads, lines)]

    def wait_for(count: int, what: str) -> list:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(decisions()) < count:
            time.sleep(0.2)
        assert len(decisions()) >= count, f"{what}: reviews.jsonl holds {decisions()}; browser: {console[-5:]}"
        return decisions()

    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp / "chromium-profile-review"), executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
            viewport={"width": 1280, "height": 900})
        page = context.pages[0] if context.pages else context.new_page()
        try:
            page.set_default_timeout(60_000)
            page.on("pageerror", lambda e: console.append(f"pageerror: {e}"))
            page.goto(f"{base}/lab/workspaces/review/tree/review/review.ipynb")
            page.wait_for_selector(".jp-NotebookPanel .jp-Notebook .jp-Cell")
            page.wait_for_function(KERNEL_READY_JS, timeout=90_000)
            _run_cell(page, 0)
            _wait_executed(page, 0, 60, "the import cell")
            _run_cell(page, 1)
            _wait_executed(page, 1, 120, "the review cell")
            page.wait_for_selector(".tensorjob-review-card", timeout=60_000)
            shown = page.evaluate(REVIEW_JS)
            assert "Globex Corporation" in shown["text"] and shown["scripts"] == 0, shown
            page.locator(".tensorjob-review-card").hover()
            page.keyboard.press("c")
            box = page.locator(".tensorjob-review input[type=text]")
            box.click()
            page.keyboard.insert_text("Firm 1 Ltd")
            page.keyboard.press("Enter")
            assert wait_for(1, "c, typing, Enter") == [("vendor", "correct", "Firm 1 Ltd")]
            page.locator(".tensorjob-review-card").hover()
            page.keyboard.press("a")
            wait_for(2, "a")
            page.keyboard.press("n")
            got = wait_for(3, "n")
            assert [d for _, d, _ in got] == ["correct", "accept", "null"], got
            page.keyboard.press("b")
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and "decided: null" not in page.evaluate(REVIEW_JS)["text"]:
                time.sleep(0.2)
            assert "decided: null" in page.evaluate(REVIEW_JS)["text"], "b shows the value just decided"
            for _ in range(8):  # on to the hostile vendor, accepting as it goes
                shown = page.evaluate(REVIEW_JS)
                if "onerror" in shown["text"] or "Nothing more" in shown["text"]:
                    break
                page.keyboard.press("a")
                time.sleep(0.5)
            shown = page.evaluate(REVIEW_JS)
            assert shown["images"] == 0 and shown["scripts"] == 0, shown  # the hostile text stayed text
            page.locator(".tensorjob-review").first.screenshot(path=str(shots / "review.png"))
        except BaseException:
            with contextlib.suppress(Exception):
                page.screenshot(path=str(shots / "failure.png"))
            raise
        finally:
            context.close()

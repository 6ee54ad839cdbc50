"""The terminal debug prompt: drive a job being debugged from a line prompt.

Where no widget shows the debug bar, ``prompt`` shows each pause and reads a word (step, continue, quit...),
calling only the debugger's controls: it owns nothing of the job. A pause can end without an answer (its time
runs out, the job is cancelled, a button resumes it), so the prompt reads its line in a way the end of the pause
can interrupt, and never outlives its pause.

Design: docs/internals/frontends.md#promptpy
"""

from __future__ import annotations

import os
import select
import signal
import sys
import threading
import time
from concurrent.futures import Future
from typing import Any, Callable

from tensorjob_jupyter.abi import dumps
from tensorjob_jupyter.host.debugger import BREAKABLE, MAX_PATH_CHARS, Debugger
from tensorjob_jupyter.text import bounded, clip, for_terminal

PROMPT_HELP = ("s (or Enter) step one command · i step to the next infer · u KIND step to the next KIND "
               "command · c continue · q quit (cancel the job) · ? this help")
#: Characters of one value a terminal line shows.
MAX_LINE_CHARS = 1000
#: Characters of one pause line in all (eight handles, each with its path, fit).
MAX_PAUSE_LINE_CHARS = 8000
#: How often a prompt waiting for a line looks whether its pause still holds.
POLL_S = 0.1
#: Bytes of one typed line a prompt keeps; the rest of a longer line is dropped.
MAX_INPUT_BYTES = 4096


def _one_line(value: Any) -> str:
    try:
        text = dumps(bounded(value))
    except Exception:  # noqa: BLE001 - bounded values always encode; be safe anyway
        text = repr(value)
    return clip(for_terminal(text, one_line=True), MAX_LINE_CHARS)


def pause_lines(state: dict) -> list[str]:
    """A pause (``debug_state``, or a ``job.paused`` event) as terminal lines; guest-made text made inert."""
    step, reason = state.get("step"), state.get("reason")
    command = state.get("command") if isinstance(state.get("command"), dict) else None
    cmd = command.get("cmd") if command is not None else None
    where = "before cf_init" if step == 0 and reason != "failure" else f"before step {step}"
    if isinstance(cmd, str):
        where += f" ({for_terminal(cmd, one_line=True)[:40]})"
    whys: dict[Any, str] = {  # keyed by Any: the reason is whatever the pause (or its transcript) holds
        "start": "started paused (--debug)", "pause": "paused on request", "step": "stepped",
        "until": f"stepped to the next {for_terminal(str(state.get('until')), one_line=True)[:40]}",
        "break": f"breakpoint on {for_terminal(str(cmd), one_line=True)[:40]}",
        "failure": "before the failure is final (--break-on fail)"}
    why = whys.get(reason, for_terminal(str(reason))[:40])
    lines = [f"⏸ paused {where}: {why}"]
    error = state.get("error")
    if isinstance(error, dict):
        lines.append(f"  error:        {for_terminal(str(error.get('code')), one_line=True)[:200]}: "
                     f"{clip(for_terminal(str(error.get('message')), one_line=True), MAX_LINE_CHARS)}")
    if command is not None:
        lines.append(f"  next command: {_one_line(command)}")
    if state.get("last_command") is not None:
        lines.append(f"  last command: {_one_line(state['last_command'])}")
    if state.get("last_event") is not None:
        lines.append(f"  answered by:  {_one_line(state['last_event'])}")
    handles = state.get("handles")
    handles = handles if isinstance(handles, list) else []
    shown = ", ".join(f"#{h.get('handle')} {for_terminal(str(h.get('path')), one_line=True)[:MAX_PATH_CHARS]} "
                      f"({h.get('len')} bytes, {for_terminal(str(h.get('kind')), one_line=True)[:40]})"
                      for h in handles[:8] if isinstance(h, dict))
    count = state.get("open_handles")
    count = count if isinstance(count, int) else len(handles)
    more = f", … {count - min(len(handles), 8)} more" if count > min(len(handles), 8) else ""
    lines.append(f"  step {step} · {count} open handles{': ' + shown + more if shown else ''} · guest memory "
                 f"{state.get('memory_bytes')} bytes (peak {state.get('peak_memory_bytes')})")
    # A pause read back from a transcript is a file's word: every line inert and bounded, whatever its fields hold.
    return [clip(for_terminal(line, one_line=True), MAX_PAUSE_LINE_CHARS) for line in lines]


# --- reading a line that the end of the pause can interrupt -------------------------------------------

#: What a timed read returns when no line came in time.
NOTHING_YET: Any = type("NothingYet", (), {"__repr__": lambda self: "NOTHING_YET"})()
#: What a read returns when the pause ended before a line came.
PAUSE_OVER: Any = type("PauseOver", (), {"__repr__": lambda self: "PAUSE_OVER"})()


class StdinLines:
    """Lines typed on a file descriptor (stdin by default), each read with a timeout.

    ``read(timeout)`` returns a line, None at the end of the input (or when
    there is no descriptor to read), or ``NOTHING_YET``. It reads with
    ``select`` and ``os.read`` -- never a blocking ``readline`` -- so a silent
    stdin holds nothing once the prompt stops asking. A stream without a
    descriptor (a test's ``StringIO``) is read with its own ``readline``.
    """

    def __init__(self, stream: Any = None):
        self._stream = stream
        self._buffer = b""
        self._ended = False

    @property
    def stream(self) -> Any:
        return self._stream if self._stream is not None else sys.stdin

    def read(self, timeout: float) -> Any:
        line = self._take_line()
        if line is not None:
            return line
        if self._ended:
            return None
        stream = self.stream
        try:
            fd = stream.fileno()
        except (AttributeError, OSError, ValueError):  # no descriptor: a stream that never blocks, or none
            try:
                text = stream.readline() if stream is not None else ""
            except (OSError, ValueError):
                text = ""
            return text if text else None
        try:
            ready, _, _ = select.select([fd], [], [], timeout)
            if not ready:
                return NOTHING_YET
            data = os.read(fd, MAX_INPUT_BYTES)
        except (OSError, ValueError):
            data = b""
        if not data:
            self._ended = True
            rest, self._buffer = self._buffer, b""
            return rest.decode("utf-8", "replace") if rest else None
        self._buffer += data
        line = self._take_line()
        return line if line is not None else NOTHING_YET

    def _take_line(self) -> str | None:
        at = self._buffer.find(b"\n")
        if at < 0:
            if len(self._buffer) < MAX_INPUT_BYTES:
                return None
            at = len(self._buffer) - 1  # an endless line: what was kept of it, the rest dropped as it comes
        line, self._buffer = self._buffer[:at + 1], self._buffer[at + 1:]
        return line[:MAX_INPUT_BYTES].decode("utf-8", "replace")


def _read_timed(lines: StdinLines, holding: Callable[[], bool]) -> Any:
    while True:
        line = lines.read(POLL_S)
        if line is not NOTHING_YET:
            return line
        if not holding():
            return PAUSE_OVER


def _read_interrupting(read_line: Callable[[], str | None], holding: Callable[[], bool]) -> Any:
    """``read_line()`` on the main thread; a watcher interrupts it (SIGINT) if the pause ends first."""
    lock = threading.Lock()
    reading, fired = [True], [False]
    finished = threading.Event()
    main = threading.main_thread().ident
    assert main is not None, "the main thread has started"

    def watch() -> None:
        while not finished.wait(POLL_S):
            if not holding():
                with lock:
                    if reading[0]:
                        fired[0] = True
                        signal.pthread_kill(main, signal.SIGINT)
                return

    watcher = threading.Thread(target=watch, name="tensorjob-prompt-watch", daemon=True)
    watcher.start()
    try:
        try:
            line = read_line()
        finally:
            with lock:
                reading[0] = False
            finished.set()
    except KeyboardInterrupt:
        if fired[0]:
            return PAUSE_OVER
        raise  # the user's own Ctrl-C: the caller cancels the job
    if fired[0]:  # the interrupt crossed the line on its way: let it arrive here, and drop it
        try:
            deadline = time.monotonic() + 1.0
            while time.monotonic() < deadline:
                time.sleep(0.001)
        except KeyboardInterrupt:
            pass
        return PAUSE_OVER
    return line


_helper_lock = threading.Lock()
#: The one read under way on a helper thread, per read_line (see the module doc).
_helper_reads: dict[Any, Future] = {}


def _read_on_helper(read_line: Callable[[], str | None], holding: Callable[[], bool]) -> Any:
    """``read_line()`` on a helper thread (one read at a time per ``read_line``); PAUSE_OVER if the pause
    ends first, the read then going to the next prompt."""
    with _helper_lock:
        future = _helper_reads.get(read_line)
        if future is None:
            future = Future()
            _helper_reads[read_line] = future

            def run(future: Future = future) -> None:
                try:
                    future.set_result(read_line())
                except BaseException as e:  # noqa: BLE001 - handed to the prompt that asked
                    future.set_exception(e)

            threading.Thread(target=run, name="tensorjob-prompt-read", daemon=True).start()
    while True:
        try:
            line = future.result(POLL_S)
        except TimeoutError:
            if not holding():
                return PAUSE_OVER
            continue
        with _helper_lock:
            if _helper_reads.get(read_line) is future:
                del _helper_reads[read_line]
        return line


def read_answer(read_line: Any, holding: Callable[[], bool]) -> Any:
    """One line from ``read_line`` -- a ``StdinLines`` or a blocking ``read_line()`` -- or ``PAUSE_OVER``
    as soon as ``holding()`` turns false (see the module doc); None when there is no input to read."""
    if isinstance(read_line, StdinLines):
        return _read_timed(read_line, holding)
    on_main = threading.current_thread() is threading.main_thread()
    if on_main and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        return _read_interrupting(read_line, holding)
    return _read_on_helper(read_line, holding)


def prompt(job: Any, *, read_line, write, before=None) -> None:
    """Drive a job being debugged from a line prompt until it ends (see the module doc).

    ``read_line`` is a ``StdinLines``, or a blocking ``read_line()`` that
    returns a line, or None when there is no input to read; either way the
    prompt stops reading when the pause ends without an answer (its
    ``max_paused_s`` ran out, the job was cancelled or resumed elsewhere), and
    returns when the job ends. ``write(text)`` shows text; ``before(state)``, if
    given, runs before a pause is shown (to let a printer catch up). The
    user's ``KeyboardInterrupt`` goes to the caller, which cancels the job.
    """
    debugger: Debugger = job.debugger
    seen = 0
    while True:
        state = debugger.next_pause(seen)
        if state is None:
            return
        seen = state["pause"]
        if before is not None:
            before(state)
        write("\n".join(pause_lines(state)) + "\n")

        def holding(pause: int = seen) -> bool:
            return debugger.paused and debugger.pauses == pause

        while True:
            write("debug> ")
            line = read_answer(read_line, holding)
            if line is PAUSE_OVER:
                write("\n")
                break  # the job ended (the next pause is None) or goes on without this prompt
            if line is None:
                write("\n(no input to read: the job runs on without pausing again)\n")
                debugger.detach()
                return
            words = line.strip().lower().split()
            word = words[0] if words else "s"
            if word in ("s", "step", "n", "next"):
                debugger.step(wait=False)
            elif word in ("i", "infer"):
                debugger.step("infer", wait=False)
            elif word in ("u", "until") and len(words) == 2 and words[1] in BREAKABLE:
                debugger.step(words[1], wait=False)
            elif word in ("c", "continue", "cont"):
                debugger.resume()
            elif word in ("q", "quit", "cancel"):
                job.cancel()
                return
            else:
                write(PROMPT_HELP + "\n")
                continue
            break


__all__ = [
    "PROMPT_HELP", "MAX_LINE_CHARS", "MAX_PAUSE_LINE_CHARS", "POLL_S", "MAX_INPUT_BYTES", "pause_lines",
    "NOTHING_YET", "PAUSE_OVER", "StdinLines", "read_answer", "prompt"
]

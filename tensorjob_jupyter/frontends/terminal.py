"""Jobs in a terminal: events printed as they happen, a guest loaded from a file, a job run live.

One way of printing serves every command that shows a job -- ``tensorjob
run``, ``replay`` and ``show`` -- so a live job and a transcript shown again
read the same. ``EventPrinter`` turns events into lines: the host's own lines
(progress, file reads, documents, the end) on ``err``, prefixed ``·``, ``✓`` or
``✗``; model text indented under them; the guest's streamed output
(``emit-chunk``) on ``out``. Every string a guest, a model or a transcript
produced is made inert first (``text.for_terminal``). ``LivePrinter`` follows
a live job from its own thread; ``run_live`` runs a job with one, and with the
debug prompt (``prompt``) when the job is being debugged. ``load_guest`` is
the one way every front end -- the commands and the magic -- loads a guest.
"""

from __future__ import annotations

import base64
import codecs
import json
import os
import signal
import threading
import time
from typing import Any, TextIO

from tensorjob_jupyter.abi import JobStatus, dumps, event_types
from tensorjob_jupyter.frontends.options import EXIT_CANCELLED, EXIT_FAILED, EXIT_OK, JobOptions, OptionError
from tensorjob_jupyter.frontends.prompt import StdinLines, pause_lines, prompt
from tensorjob_jupyter.frontends.view.state import progress_fraction
from tensorjob_jupyter.frontends.view.summary import error_text
from tensorjob_jupyter.host import CompileError, GuestSource, Job, busy_machine_line, detect_language
from tensorjob_jupyter.host.waiting import wait_or_cancel
from tensorjob_jupyter.frontends import interpreter_progress
from tensorjob_jupyter.text import for_terminal, json_text
from tensorjob_jupyter.history.report import divergence_line

#: Model text is indented under the host's own lines (which start with ·, ✓ or ✗).
INDENT = "  "


class EventPrinter:
    """Prints a job's events in a terminal: host lines on ``err``, streamed output on ``out``.

    The one way events are printed, whether they arrive live (``LivePrinter``)
    or from a transcript (``tensorjob show``, ``show.Playback``).
    """

    _json_format = False  # the current infer asked for a JSON format: its answer is shown as a tree too

    def __init__(self, *, out: TextIO, err: TextIO, quiet: bool, chunks_to_stdout: bool):
        self.out, self.err, self.quiet = out, err, quiet
        self.chunks_to_stdout = chunks_to_stdout
        self._chunk_decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._in_text = False
        #: A debug prompt shows the pauses itself (``frontends.prompt``); the printer then only counts them.
        self.prompting = False
        self.last_pause = 0

    def _line(self, text: str, *, lines: bool = False) -> None:
        """One host line, inert whatever an event's fields held (a shown transcript is a file's word);
        ``lines``: text made inert already that spans lines (a JSON tree)."""
        if self._in_text:
            self.err.write("\n")
            self._in_text = False
        self.err.write((text if lines else for_terminal(text, one_line=True)) + "\n")
        self.err.flush()

    def _json_tree(self, text: str) -> None:
        """A finished structured answer, pretty-printed (made inert) under the streamed text."""
        try:
            value = json.loads(text) if len(text) <= MAX_TREE_CHARS else None
        except ValueError:
            return
        if isinstance(value, (dict, list)):
            self._line(f"{INDENT}= " + json_text(value).replace("\n", "\n" + INDENT + "  "), lines=True)

    def _model_text(self, text: str) -> None:
        """Model text, indented under the host's lines so it can never pass for one."""
        text = for_terminal(text)
        if not self._in_text:
            self.err.write(INDENT)
            self._in_text = True
        self.err.write(text.replace("\n", "\n" + INDENT))
        self.err.flush()

    def show_safely(self, event: dict) -> None:
        try:
            self.show(event)
        except Exception:  # noqa: BLE001 - one odd event must not silence the rest
            pass

    def show(self, event: dict) -> None:
        kind = event["type"]
        if kind == event_types.JOB_PAUSED:
            pause = event.get("pause")
            self.last_pause = pause if isinstance(pause, int) else self.last_pause + 1
            if not self.quiet and not self.prompting:
                for line in pause_lines(event):
                    self._line(line)
            return
        if kind == event_types.JOB_CHUNK:
            text = self._chunk_decoder.decode(base64.b64decode(event["bytes_base64"]))
            stream = self.out if self.chunks_to_stdout else self.err
            stream.write(for_terminal(text))
            stream.flush()
            return
        if self.quiet:
            return
        if kind == event_types.JOB_PROGRESS:
            self._line(f"· {progress_text(event['progress'])}")
        elif kind == event_types.JOB_LOG:  # a Python guest's print(): its own lines, marked, made inert
            mark = "!" if event.get("stream") == "stderr" else "›"
            for line in event.get("lines") or ():
                self._line(f"{mark} {line}")
            if event.get("dropped"):
                self._line(f"! … {event['dropped']} more printed lines were not kept")
        elif kind == event_types.JOB_FILE_OPENED:
            self._line(f"· open {for_terminal(event['path'], one_line=True)} ({event['len']} bytes, "
                       f"{event['kind']['kind']})")
        elif kind in (event_types.JOB_DOCUMENT_PAGE, event_types.JOB_IMAGE_CREATED, event_types.JOB_FETCH):
            self._line(document_line(event))
        elif kind == event_types.RESPONSE_CREATED:
            self._line("· infer:")
            self._json_format = structured_format(event)
        elif kind == event_types.RESPONSE_OUTPUT_TEXT_DELTA:
            self._model_text(event["delta"])
        elif kind == event_types.RESPONSE_OUTPUT_ITEM_ADDED and event["item"].get("type") == "function_call":
            self._model_text(f"call {event['item']['name']} ")  # then the arguments, as they grow
        elif kind == event_types.RESPONSE_FUNCTION_CALL_ARGUMENTS_DELTA:
            self._model_text(event["delta"])
        elif kind in (event_types.RESPONSE_COMPLETED, event_types.RESPONSE_INCOMPLETE):
            reason = event.get("finish_reason")
            self._line(f"{INDENT}[{reason}]" if reason not in (None, "stop") else "")
            if self._json_format and kind == event_types.RESPONSE_COMPLETED and reason == "stop":
                self._json_tree(event["response"].get("output_text") or "")
            busy = busy_machine_line(event)
            if busy:
                self._line(f"· {busy}")
        elif kind == event_types.JOB_REPLAY_DIVERGED and event.get("then") != "stopped":  # a stop is the job's error

            self._line(f"· {divergence_line(event)}")
        elif kind == event_types.JOB_INTERRUPTED:  # made by show.Playback: the transcript has no end (yet)
            env = event["envelope"]
            mark = "…" if env["status"] == "running" else "✗"
            self._line(f"{mark} {env['status']}: {for_terminal(env['error']['message'], one_line=True)}")
        elif kind in (event_types.JOB_COMPLETED, event_types.JOB_FAILED, event_types.JOB_CANCELLED):
            env = event["envelope"]
            usage = env["usage"]
            tail = f"{usage['tokens_in']} tokens in, {usage['tokens_out']} out, {usage['duration_ms']} ms"
            if env.get("error"):
                error = for_terminal(error_text(str(env["error"]["code"]), str(env["error"]["message"])),
                                     one_line=True)
                status = "" if env["status"] in error.split() else f"{env['status']}: "
                self._line(f"✗ {status}{error} ({tail})")
            else:
                self._line(f"✓ completed ({tail})")


class LivePrinter(EventPrinter):
    """Prints a job's events as they arrive; runs on its own thread."""

    def __init__(self, job: Job, *, out: TextIO, err: TextIO, quiet: bool, chunks_to_stdout: bool):
        super().__init__(out=out, err=err, quiet=quiet, chunks_to_stdout=chunks_to_stdout)
        self.job = job
        # Unbounded: streamed output must all reach stdout, in order, however slowly
        # stdout is read; the queue holds references to events the job keeps anyway.
        self._sub = job.subscribe(maxsize=0)
        self.thread = threading.Thread(target=self._run, name="tensorjob-printer", daemon=True)

    def _run(self) -> None:
        for event in self._sub:
            self.show_safely(event)

    def caught_up(self, state: dict, timeout: float = 2.0) -> None:
        """Wait (briefly) until this printer has handled the pause ``state`` and everything before it."""
        deadline = time.monotonic() + timeout
        while self.last_pause < state.get("pause", 0) and time.monotonic() < deadline:
            time.sleep(0.005)


#: The debug prompt's input: lines typed on stdin, each read with a timeout (``prompt.StdinLines``: select
#: and os.read, never a blocking readline), so a silent stdin never holds the process past its job's end.
_stdin_line = StdinLines()


class CtrlCCancels:
    """While the CLI makes and runs a job, Ctrl-C cancels the job instead of interrupting Python.

    The handler is installed before the job exists, so there is no moment -- making
    the job (its transcript is written then), starting the printer, starting the job
    -- at which a Ctrl-C escapes as a traceback: one that comes before the job
    exists cancels it as soon as it does, and it ends at once, ``cancelled``. After
    the first, Python's handler is back: a second Ctrl-C is a ``KeyboardInterrupt``
    (``start_and_wait`` cancels and waits again; a third leaves at once, should a job
    not end). Only Python's own handler is replaced: where
    SIGINT is ignored (``nohup``, a background job of a script) or handled by someone
    else, and off the main thread, nothing changes (a ``KeyboardInterrupt`` there is
    caught by ``start_and_wait``).
    """

    def __init__(self) -> None:
        self.job: Job | None = None
        self.pressed = False
        self._previous: Any = None

    def __enter__(self) -> "CtrlCCancels":
        if (threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGINT) is signal.default_int_handler):
            self._previous = signal.signal(signal.SIGINT, self._handler)
        return self

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None

    def attach(self, job: Job) -> Job:
        self.job = job
        if self.pressed:
            job.cancel()
        return job

    def _handler(self, signum, frame) -> None:
        signal.signal(signal.SIGINT, self._previous)  # a second Ctrl-C: a KeyboardInterrupt again
        self._previous = None
        self.pressed = True
        if self.job is not None:
            self.job.cancel()


def start_and_wait(job: Job, printer: LivePrinter, err: TextIO):
    """Start the job and wait for it (a debug job: through the prompt on stdin/stderr); Ctrl-C cancels it,
    from the moment the job starts: its thread may write the transcript before ``start()`` returns."""
    try:
        job.start()
        if job.debugging:
            printer.prompting = True

            def write(text: str) -> None:
                err.write(text)
                err.flush()

            prompt(job, read_line=_stdin_line, write=write, before=printer.caught_up)
    except KeyboardInterrupt:
        job.cancel()
        return job.wait()
    wait_or_cancel(job.wait_done, job.cancel)
    return job.wait()


#: A structured answer longer than this is not pretty-printed again at its end.
MAX_TREE_CHARS = 64 * 1024


def structured_format(event: dict) -> bool:
    """Whether a ``response.created`` event's infer asked for a JSON format."""
    fmt = ((event.get("response") or {}).get("text") or {}).get("format") or {}
    return isinstance(fmt, dict) and fmt.get("type") in ("json_schema", "json_object")


def document_line(event: dict) -> str:
    """One line for a page read, an image made or a URL fetched (guest text stripped of controls)."""
    kind = event["type"]
    if kind == event_types.JOB_DOCUMENT_PAGE:
        where = "every page" if event["page"] is None else f"page {event['page']}"
        total = f" of {event['pages']}" if event.get("pages") is not None and event["page"] is not None else ""
        if event.get("error"):
            return f"· {event['command']} #{event['handle']} {where}{total}: {for_terminal(event['error'], one_line=True)}"
        size = f" ({event['chars']} chars)" if event["command"] != "page_image" else ""
        return f"· {event['command']} #{event['handle']} {where}{total}{size}"
    if kind == event_types.JOB_IMAGE_CREATED:
        return (f"· image #{event['handle']} = {for_terminal(event['label'], one_line=True)}: "
                f"{event['width']}x{event['height']} PNG, {event['len']} bytes")
    return (f"· fetch {for_terminal(event['url'], one_line=True)} -> #{event['handle']} ({event['status']}, {event['len']} bytes, "
            f"{event['kind']['kind']}" + (f", {event['redirects']} redirects" if event["redirects"] else "") + ")")


def progress_text(payload: Any) -> str:
    """How an ``emit`` payload reads in one line."""
    if isinstance(payload, dict):
        share = progress_fraction(payload)
        if share is not None and "done" in payload and "total" in payload:  # as the view's label reads it
            return f"{payload['done']}/{payload['total']} ({100 * share:.0f}%)"
        if share is not None:
            return f"{100 * share:.0f}%"
    return for_terminal(dumps(payload), one_line=True)


#: What ``tensorjob run``, ``map`` and ``replay`` write above a compiler's message.
DOES_NOT_COMPILE = "tensorjob: the guest does not compile:\n"


def load_guest(options: JobOptions, path: str | os.PathLike | None, err: TextIO, *, source: str | None = None,
               lang: str | None = None, heading: str = DOES_NOT_COMPILE, notebook: bool = False) -> GuestSource | None:
    """The one way a front end loads a guest: the file at ``path`` (or ``source``, a cell's text, named
    ``cell``) compiled or loaded with ``options``' flags, its compiler warnings written to ``err``.

    A guest that does not compile: the compiler's message (under ``heading``) on ``err``, and None -- the
    command then exits 1, the magic raises its short error. Anything else that keeps the guest from loading
    (no such file, not a module, an unknown language) is one ``OptionError`` line. A Python guest's
    interpreter is built first if this machine has none yet, with its progress shown (a widget line when
    ``notebook``).
    """
    if _is_python(path, source, lang):
        interpreter_progress.prepare(err, notebook=notebook)
    try:
        if source is not None:
            guest = GuestSource.from_text(source, lang=lang, name="cell", cflags=options.cflags,
                                          zigflags=options.zigflags, force=options.force)
        else:
            assert path is not None, "a guest is a file, or a cell's source"
            guest = options.guest(path)
    except CompileError as e:
        err.write(f"{heading}{e}\n")
        return None
    except (FileNotFoundError, ValueError) as e:
        raise OptionError(str(e)) from None
    if guest.warnings:
        err.write(f"{guest.warnings}\n")
    return guest


def _is_python(path: str | os.PathLike | None, source: str | None, lang: str | None) -> bool:
    if lang is not None:
        return lang.lower() in ("python", "py")
    if source is None:
        return path is not None and str(path).lower().endswith(".py")
    try:
        return detect_language(source) == "python"
    except ValueError:
        return False


def run_live(job, args, out: TextIO, err: TextIO):
    """Run ``job`` with its events printed live (and written to ``--events``); its envelope.

    Ctrl-C cancels the job; everything streamed is written before this returns.
    """
    try:
        events_file = open(args.events, "wb") if args.events else None
    except OSError as e:
        raise OptionError(f"--events {args.events}: {e.strerror}") from None
    printer = LivePrinter(job, out=out, err=err, quiet=args.quiet, chunks_to_stdout=not args.json)
    printer.thread.start()
    envelope = start_and_wait(job, printer, err)
    printer.thread.join()  # everything streamed is written before the result
    if events_file is not None:
        with events_file:
            for line in job.stream.history_lines():  # the complete, ordered transcript
                events_file.write(line)
    return envelope


def exit_status(envelope) -> int:
    if envelope.status is JobStatus.COMPLETED:
        return EXIT_OK
    return EXIT_CANCELLED if envelope.status is JobStatus.CANCELLED else EXIT_FAILED


__all__ = [
    "INDENT", "EventPrinter", "LivePrinter", "CtrlCCancels", "start_and_wait", "MAX_TREE_CHARS", "structured_format",
    "document_line", "progress_text", "DOES_NOT_COMPILE", "load_guest", "run_live", "exit_status"
]

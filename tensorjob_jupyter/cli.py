"""The ``tensorjob`` command: run, map and compile guests from a terminal.

    tensorjob run GUEST [job options] [--events FILE] [--json] [--quiet]
    tensorjob map GUEST --over manifest.jsonl --run-dir DIR [job options] [--concurrency N] [--cluster ADDRESS]
    tensorjob compile FILE [-o OUT] [--cflags FLAGS] [--zigflags FLAGS] [--force]
    tensorjob cache [--clear]
    tensorjob runs | show RUN | replay GUEST --from RUN | diff RUN_A RUN_B   (history_cli.py)

The job options (``--read``, ``--input``, ``--model``, every limit, ...) are
the table in ``options.py``, shared with the magics and the Python API.
``run`` prints the job's progress, file reads and streamed tokens live on
stderr as they happen (text from the guest or the model made inert first,
model text indented under the host's lines), the guest's streamed output
(``emit-chunk``) on stdout, and at the end the result as JSON on stdout -- or,
with ``--json``, the whole envelope instead and nothing else on stdout. The
exit status is 0 only when the job completed (1 failed or did not compile,
130 cancelled by Ctrl-C, 2 usage error). A usage error is one line naming
the problem, never a traceback. Events are printed by ``EventPrinter``, the
same for a live job and for a transcript shown again (``tensorjob show``).

``run --debug`` (and ``--break-on``) drives the job from a line prompt on
stdin/stderr at each pause (``debug.prompt``: step, step to the next infer,
continue, quit); with stdin closed the job runs on without pausing again.
"""

from __future__ import annotations

import argparse
import base64
import codecs
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any, Sequence, TextIO

from . import __version__
from .abi import JobStatus, dumps
from .fanout import add_map_parser, cmd_map
from .history import RunError
from .history_cli import COMMANDS as HISTORY_COMMANDS
from .history_cli import add_history_parsers
from .inference.base import ModelError
from .jobs import Job
from .options import (BY_NAME, EXIT_CANCELLED, EXIT_FAILED, EXIT_OK, EXIT_USAGE, JobOptions, OptionError,
                      add_job_arguments)
from .replay import ReplayError
from .text import for_terminal, json_text
from .transcript import TranscriptError

#: Model text is indented under the host's own lines (which start with ·, ✓ or ✗).
INDENT = "  "


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, no usage dump
        raise OptionError(f"{message} (see `{self.prog} --help`)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tensorjob", description="Run sandboxed WebAssembly tensor jobs against a local model.")
    parser.add_argument("--version", action="version", version=f"tensorjob {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    run = sub.add_parser("run", help="run a guest (.wasm, .c, .zig or .wat)",
                         description="Run a guest to the end, showing its progress live.")
    run.add_argument("guest", help="the guest: a .wasm module, or .c / .zig / .wat source to compile")
    add_job_arguments(run)
    run.add_argument("--events", default=None, metavar="FILE", help="write every event as one JSON line to FILE")
    run.add_argument("--json", action="store_true", help="print the envelope as JSON on stdout, nothing else")
    run.add_argument("--quiet", "-q", action="store_true", help="no live progress on stderr")

    add_map_parser(sub)

    comp = sub.add_parser("compile", help="compile a .c, .zig or .wat guest to .wasm",
                          description="Compile a guest source file to a .wasm module (cached by content).")
    comp.add_argument("file")
    comp.add_argument("-o", "--output", default=None, help="output path (default: FILE with .wasm)")
    for name in ("cflags", "zigflags", "force"):
        opt = BY_NAME[name]
        if opt.kind == "switch":
            comp.add_argument(opt.flag, dest=name, action="store_true", default=None, help=opt.help)
        else:
            comp.add_argument(opt.flag, dest=name, default=None, metavar=opt.metavar, help=opt.help)

    cache = sub.add_parser("cache", help="show or clear the compile cache",
                           description="Where compiled guests are cached, and how much; --clear empties it "
                                       "(always safe: guests compile again on next use).")
    cache.add_argument("--clear", action="store_true", help="delete every cached module")

    add_history_parsers(sub)
    return parser


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
        #: A debug prompt shows the pauses itself (``debug.prompt``); the printer then only counts them.
        self.prompting = False
        self.last_pause = 0

    def _line(self, text: str) -> None:
        if self._in_text:
            self.err.write("\n")
            self._in_text = False
        self.err.write(text + "\n")
        self.err.flush()

    def _json_tree(self, text: str) -> None:
        """A finished structured answer, pretty-printed (made inert) under the streamed text."""
        try:
            value = json.loads(text) if len(text) <= MAX_TREE_CHARS else None
        except ValueError:
            return
        if isinstance(value, (dict, list)):
            self._line(f"{INDENT}= " + json_text(value).replace("\n", "\n" + INDENT + "  "))

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
        if kind == "job.paused":
            pause = event.get("pause")
            self.last_pause = pause if isinstance(pause, int) else self.last_pause + 1
            if not self.quiet and not self.prompting:
                from .debug import pause_lines

                for line in pause_lines(event):
                    self._line(line)
            return
        if kind == "job.chunk":
            text = self._chunk_decoder.decode(base64.b64decode(event["bytes_base64"]))
            stream = self.out if self.chunks_to_stdout else self.err
            stream.write(for_terminal(text))
            stream.flush()
            return
        if self.quiet:
            return
        if kind == "job.progress":
            self._line(f"· {progress_text(event['progress'])}")
        elif kind == "job.file.opened":
            self._line(f"· open {for_terminal(event['path'], one_line=True)} ({event['len']} bytes, "
                       f"{event['kind']['kind']})")
        elif kind in ("job.document.page", "job.image.created", "job.fetch"):
            self._line(document_line(event))
        elif kind == "response.created":
            self._line("· infer:")
            self._json_format = structured_format(event)
        elif kind == "response.output_text.delta":
            self._model_text(event["delta"])
        elif kind == "response.output_item.added" and event["item"].get("type") == "function_call":
            self._model_text(f"call {event['item']['name']} ")  # then the arguments, as they grow
        elif kind == "response.function_call_arguments.delta":
            self._model_text(event["delta"])
        elif kind in ("response.completed", "response.incomplete"):
            reason = event.get("finish_reason")
            self._line(f"{INDENT}[{reason}]" if reason not in (None, "stop") else "")
            if self._json_format and kind == "response.completed" and reason == "stop":
                self._json_tree(event["response"].get("output_text") or "")
        elif kind == "job.replay.diverged" and event.get("then") != "stopped":  # a stop is the job's error
            from .replay import divergence_line

            self._line(f"· {divergence_line(event)}")
        elif kind == "job.interrupted":  # made by show.Playback: the transcript has no end (yet)
            env = event["envelope"]
            mark = "…" if env["status"] == "running" else "✗"
            self._line(f"{mark} {env['status']}: {for_terminal(env['error']['message'], one_line=True)}")
        elif kind in ("job.completed", "job.failed", "job.cancelled"):
            env = event["envelope"]
            usage = env["usage"]
            tail = f"{usage['tokens_in']} tokens in, {usage['tokens_out']} out, {usage['duration_ms']} ms"
            if env.get("error"):
                error = env["error"]
                self._line(f"✗ {env['status']}: {for_terminal(error['code'], one_line=True)}: "
                           f"{for_terminal(error['message'], one_line=True)} ({tail})")
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


def _stdin_line() -> str | None:
    """One line from stdin; None at its end or when it cannot be read."""
    try:
        line = sys.stdin.readline()
    except (OSError, ValueError):
        return None
    return line if line else None


def wait_for_job(job: Job, printer: LivePrinter, err: TextIO):
    """Wait for the job (a debug job: through the prompt on stdin/stderr); Ctrl-C cancels it."""
    try:
        if job.debugging:
            from .debug import prompt

            printer.prompting = True

            def write(text: str) -> None:
                err.write(text)
                err.flush()

            prompt(job, read_line=_stdin_line, write=write, before=printer.caught_up)
        return job.wait()
    except KeyboardInterrupt:
        job.cancel()
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
    if kind == "job.document.page":
        where = "every page" if event["page"] is None else f"page {event['page']}"
        total = f" of {event['pages']}" if event.get("pages") is not None and event["page"] is not None else ""
        if event.get("error"):
            return f"· {event['command']} #{event['handle']} {where}{total}: {for_terminal(event['error'], one_line=True)}"
        size = f" ({event['chars']} chars)" if event["command"] != "page_image" else ""
        return f"· {event['command']} #{event['handle']} {where}{total}{size}"
    if kind == "job.image.created":
        return (f"· image #{event['handle']} = {for_terminal(event['label'], one_line=True)}: "
                f"{event['width']}x{event['height']} PNG, {event['len']} bytes")
    return (f"· fetch {for_terminal(event['url'], one_line=True)} -> #{event['handle']} ({event['status']}, {event['len']} bytes, "
            f"{event['kind']['kind']}" + (f", {event['redirects']} redirects" if event["redirects"] else "") + ")")


def progress_text(payload: Any) -> str:
    """How an ``emit`` payload reads in one line."""
    if isinstance(payload, dict):
        from .view.state import progress_fraction

        share = progress_fraction(payload)
        if share is not None and "done" in payload and "total" in payload:  # as the view's label reads it
            return f"{payload['done']}/{payload['total']} ({100 * share:.0f}%)"
        if share is not None:
            return f"{100 * share:.0f}%"
    return for_terminal(dumps(payload), one_line=True)


def load_guest(options: JobOptions, path: str, err: TextIO):
    """The guest file compiled or loaded with ``options``' flags; None (reported) if it does not compile."""
    from .compile import CompileError

    try:
        guest = options.guest(path)
    except CompileError as e:
        err.write(f"tensorjob: the guest does not compile:\n{e}\n")
        return None
    except (FileNotFoundError, ValueError) as e:
        raise OptionError(str(e)) from None
    if guest.warnings:
        err.write(f"{guest.warnings}\n")
    return guest


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
    job.start()
    envelope = wait_for_job(job, printer, err)
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


def cmd_run(args, out: TextIO, err: TextIO) -> int:
    options = JobOptions.from_args(args)
    guest = load_guest(options, args.guest, err)
    if guest is None:
        return EXIT_FAILED
    kwargs = options.job_kwargs()
    try:
        job = Job(guest, backend=_backend(kwargs.pop("model"), kwargs.pop("model_options")), **kwargs)
    except ModelError as e:  # a hf: model that cannot be found or fetched
        raise OptionError(f"--model {options.model}: {e}") from None
    envelope = run_live(job, args, out, err)
    if args.json:
        out.write(json_text(envelope.to_json()) + "\n")
    elif envelope.ok:
        out.write(json_text(envelope.result) + "\n")
    out.flush()
    return exit_status(envelope)


def _backend(model: str | None, model_options: dict | None = None):
    """The shared backend for ``model`` (default: the embedded one), loaded on first use."""
    from .inference.lazy import model_backend

    return model_backend(model, **(model_options or {}))


# --- compile and cache -------------------------------------------------------------------


def cmd_compile(args, out: TextIO, err: TextIO) -> int:
    from .compile import CompileError

    options = JobOptions.from_args(args)
    try:
        guest = options.guest(args.file)
    except FileNotFoundError:
        raise OptionError(f"source file not found: {args.file}") from None
    except CompileError as e:
        err.write(f"{e}\n")
        return EXIT_FAILED
    except ValueError as e:
        raise OptionError(str(e)) from None
    if guest.warnings:
        err.write(f"{guest.warnings}\n")
    target = Path(args.output) if args.output else Path(args.file).with_suffix(".wasm")
    target.write_bytes(guest.wasm)
    out.write(f"{target} ({len(guest.wasm)} bytes)\n")
    return EXIT_OK


def cmd_cache(args, out: TextIO, err: TextIO) -> int:
    from .compile import cache_dir, cache_usage, clear_cache

    if args.clear:
        files, size = clear_cache()
        out.write(f"removed {files} cached modules ({size} bytes) from {cache_dir()}\n")
    else:
        files, size = cache_usage()
        out.write(f"{cache_dir()}: {files} cached modules, {size} bytes (tensorjob cache --clear empties it)\n")
    return EXIT_OK


COMMANDS = {"run": cmd_run, "map": cmd_map, "compile": cmd_compile, "cache": cmd_cache, **HISTORY_COMMANDS}


def main(argv: Sequence[str] | None = None, *, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        args = build_parser().parse_args(argv)
        return COMMANDS[args.command](args, out, err)
    except (OptionError, RunError, TranscriptError, ReplayError) as e:
        err.write(f"tensorjob: error: {for_terminal(str(e), one_line=True)}\n")
        return EXIT_USAGE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

"""The ``tensorjob`` command: run, compile and map guests from a terminal.

    tensorjob run GUEST [--read PATH]... [--fetch PREFIX]... [--input JSON] [--input-file F]
                  [--max-tokens N] [--timeout S] [--events FILE] [--json]
    tensorjob compile FILE [-o OUT]
    tensorjob map GUEST --over manifest.jsonl --run-dir DIR [--concurrency N] [--cluster ADDRESS]

``run`` prints the job's progress, file reads and streamed tokens live on
stderr as they happen (terminal control sequences from the guest or the
model are stripped first), the guest's streamed output (``emit-chunk``) on
stdout, and at the end the result as JSON on stdout -- or, with ``--json``,
the whole envelope instead and nothing else on stdout. The exit status is 0
only when the job completed (1 failed or did not compile, 130 cancelled by
Ctrl-C, 2 usage error). A usage error is one line naming the problem, never
a traceback.
"""

from __future__ import annotations

import argparse
import base64
import codecs
import json
import sys
import threading
from pathlib import Path
from typing import Any, Sequence, TextIO

from . import __version__
from .abi import JobStatus, dumps
from .fanout import add_map_parser, cmd_map
from .jobs import Job
from .limits import Limits
from .runner import InferOptions
from .text import for_terminal

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_CANCELLED = 0, 1, 2, 130


class UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, no usage dump
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tensorjob", description="Run sandboxed WebAssembly tensor jobs against a local model.")
    parser.add_argument("--version", action="version", version=f"tensorjob {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    run = sub.add_parser("run", help="run a guest (.wasm, .c, .zig or .wat)",
                         description="Run a guest to the end, showing its progress live.")
    run.add_argument("guest", help="the guest: a .wasm module, or .c / .zig / .wat source to compile")
    run.add_argument("--read", action="append", default=[], metavar="PATH",
                     help="grant read access to a file or directory (repeatable)")
    run.add_argument("--fetch", action="append", default=[], metavar="PREFIX",
                     help="let the guest fetch URLs under this http(s) prefix (repeatable)")
    run.add_argument("--input", default=None, metavar="JSON", help="the job input, a JSON value (default {})")
    run.add_argument("--input-file", default=None, metavar="F",
                     help="stage F's bytes for the guest's wasi:tensor read-input")
    run.add_argument("--max-tokens", type=int, default=None, metavar="N", help="token budget for the whole job")
    run.add_argument("--timeout", type=float, default=None, metavar="S", help="time limit for the whole job, seconds")
    run.add_argument("--events", default=None, metavar="FILE", help="write every event as one JSON line to FILE")
    run.add_argument("--json", action="store_true", help="print the envelope as JSON on stdout, nothing else")
    run.add_argument("--model", default=None, metavar="PATH",
                     help="a GGUF model file (default: the embedded SmolLM2-135M-Instruct)")
    run.add_argument("--chat", action="store_true", help="apply the model's chat template to each prompt")
    run.add_argument("--quiet", "-q", action="store_true", help="no live progress on stderr")
    run.add_argument("--runs", default=None, metavar="DIR", help="where transcripts go (default ~/.tensorjob/runs)")

    add_map_parser(sub)

    comp = sub.add_parser("compile", help="compile a .c, .zig or .wat guest to .wasm",
                          description="Compile a guest source file to a .wasm module.")
    comp.add_argument("file")
    comp.add_argument("-o", "--output", default=None, help="output path (default: FILE with .wasm)")
    return parser


# --- run -----------------------------------------------------------------------------


def _backend(model: str | None):
    """The shared backend for ``model`` (default: the embedded one), loaded on first use."""
    from .inference.lazy import model_backend

    if model is not None and not Path(model).is_file():
        raise UsageError(f"model file not found: {model}")
    return model_backend(model)


def _parse_input(text: str | None) -> Any:
    if text is None:
        return {}
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise UsageError(f"--input is not valid JSON: {e.msg} at column {e.colno}") from None


def _check_fetch(prefixes: list[str]) -> None:
    from .web import FetchGrants

    try:
        FetchGrants.parse(prefixes)
    except ValueError as e:
        raise UsageError(f"--fetch: {e}") from None


def _limits(args) -> Limits:
    changes = {}
    if args.max_tokens is not None:
        if args.max_tokens <= 0:
            raise UsageError("--max-tokens must be a positive number")
        changes["max_tokens"] = args.max_tokens
    if args.timeout is not None:
        if args.timeout <= 0:
            raise UsageError("--timeout must be a positive number of seconds")
        changes["job_timeout_s"] = args.timeout
    return Limits().replace(**changes)


class LivePrinter:
    """Prints a job's events as they arrive; runs on its own thread."""

    def __init__(self, job: Job, *, out: TextIO, err: TextIO, quiet: bool, chunks_to_stdout: bool):
        self.job, self.out, self.err, self.quiet = job, out, err, quiet
        self.chunks_to_stdout = chunks_to_stdout
        # Unbounded: streamed output must all reach stdout, in order, however slowly
        # stdout is read; the queue holds references to events the job keeps anyway.
        self._sub = job.subscribe(maxsize=0)
        self._chunk_decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._in_text = False
        self.thread = threading.Thread(target=self._run, name="tensorjob-printer", daemon=True)

    def _line(self, text: str) -> None:
        if self._in_text:
            self.err.write("\n")
            self._in_text = False
        self.err.write(text + "\n")
        self.err.flush()

    def _run(self) -> None:
        for event in self._sub:
            try:
                self.show(event)
            except Exception:  # noqa: BLE001 - one odd event must not silence the rest
                pass

    def show(self, event: dict) -> None:
        kind = event["type"]
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
            self._line(f"· open {for_terminal(event['path'])} ({event['len']} bytes, {event['kind']['kind']})")
        elif kind in ("job.document.page", "job.image.created", "job.fetch"):
            self._line(document_line(event))
        elif kind == "response.created":
            self._line("· infer:")
        elif kind == "response.output_text.delta":
            self.err.write(for_terminal(event["delta"]))
            self.err.flush()
            self._in_text = True
        elif kind in ("response.completed", "response.incomplete"):
            reason = (event["response"].get("incomplete_details") or {}).get("reason")
            self._line(f"  [{reason}]" if reason else "")
        elif kind in ("job.completed", "job.failed", "job.cancelled"):
            env = event["envelope"]
            usage = env["usage"]
            tail = f"{usage['tokens_in']} tokens in, {usage['tokens_out']} out, {usage['duration_ms']} ms"
            if env.get("error"):
                error = env["error"]
                self._line(f"✗ {env['status']}: {for_terminal(error['code'])}: {for_terminal(error['message'])} ({tail})")
            else:
                self._line(f"✓ completed ({tail})")


def document_line(event: dict) -> str:
    """One line for a page read, an image made or a URL fetched (guest text stripped of controls)."""
    kind = event["type"]
    if kind == "job.document.page":
        where = "every page" if event["page"] is None else f"page {event['page']}"
        total = f" of {event['pages']}" if event.get("pages") is not None and event["page"] is not None else ""
        if event.get("error"):
            return f"· {event['command']} #{event['handle']} {where}{total}: {for_terminal(event['error'])}"
        size = f" ({event['chars']} chars)" if event["command"] != "page_image" else ""
        return f"· {event['command']} #{event['handle']} {where}{total}{size}"
    if kind == "job.image.created":
        return (f"· image #{event['handle']} = {for_terminal(event['label'])}: "
                f"{event['width']}x{event['height']} PNG, {event['len']} bytes")
    return (f"· fetch {for_terminal(event['url'])} -> #{event['handle']} ({event['status']}, {event['len']} bytes, "
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
    return for_terminal(dumps(payload))


def cmd_run(args, out: TextIO, err: TextIO) -> int:
    guest_path = Path(args.guest)
    if not guest_path.is_file():
        raise UsageError(f"guest file not found: {args.guest}")
    for path in args.read:
        if not Path(path).exists():
            raise UsageError(f"--read {path}: no such file or directory")
    job_input = _parse_input(args.input)
    input_bytes = b""
    if args.input_file is not None:
        try:
            input_bytes = Path(args.input_file).read_bytes()
        except OSError as e:
            raise UsageError(f"--input-file {args.input_file}: {e.strerror}") from None
    limits = _limits(args)
    _check_fetch(args.fetch)
    backend = _backend(args.model)
    try:
        events_file = open(args.events, "w", encoding="utf-8") if args.events else None
    except OSError as e:
        raise UsageError(f"--events {args.events}: {e.strerror}") from None
    from .compile import CompileError

    try:
        job = Job(guest_path, input=job_input, read=args.read, backend=backend, limits=limits,
                  input_bytes=input_bytes, infer=InferOptions(chat=args.chat), runs_dir=args.runs,
                  fetch=args.fetch)
    except CompileError as e:
        if events_file is not None:
            events_file.close()
        err.write(f"tensorjob: the guest does not compile:\n{e}\n")
        return EXIT_FAILED
    printer = LivePrinter(job, out=out, err=err, quiet=args.quiet, chunks_to_stdout=not args.json)
    printer.thread.start()
    job.start()
    try:
        envelope = job.wait()
    except KeyboardInterrupt:
        job.cancel()
        envelope = job.wait()
    printer.thread.join()  # everything streamed is written before the result
    if events_file is not None:
        with events_file:
            for event in job.events:  # the complete, ordered history
                events_file.write(dumps(event) + "\n")
    if args.json:
        out.write(json.dumps(envelope.to_json(), indent=2, ensure_ascii=False) + "\n")
    elif envelope.ok:
        out.write(for_terminal(json.dumps(envelope.result, indent=2, ensure_ascii=False)) + "\n")
    out.flush()
    if envelope.status is JobStatus.COMPLETED:
        return EXIT_OK
    return EXIT_CANCELLED if envelope.status is JobStatus.CANCELLED else EXIT_FAILED


# --- compile ---------------------------------------------------------------------------


def cmd_compile(args, out: TextIO, err: TextIO) -> int:
    from .compile import CompileError, compile_file

    src = Path(args.file)
    if not src.is_file():
        raise UsageError(f"source file not found: {args.file}")
    try:
        wasm = compile_file(src)
    except CompileError as e:
        err.write(f"{e}\n")
        return EXIT_FAILED
    except ValueError as e:
        raise UsageError(str(e)) from None
    target = Path(args.output) if args.output else src.with_suffix(".wasm")
    target.write_bytes(wasm)
    out.write(f"{target} ({len(wasm)} bytes)\n")
    return EXIT_OK


def main(argv: Sequence[str] | None = None, *, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if args.command == "run":
            return cmd_run(args, out, err)
        if args.command == "map":
            return cmd_map(args, out, err)
        return cmd_compile(args, out, err)
    except UsageError as e:
        err.write(f"tensorjob: error: {e}\n")
        return EXIT_USAGE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

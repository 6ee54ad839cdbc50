"""The ``tensorjob`` command: run, map and compile guests from a terminal -- a leaf over the public API.

    tensorjob run GUEST [job options] [--events FILE] [--json] [--quiet]
    tensorjob map GUEST --over manifest.jsonl --run-dir DIR [job options] [--concurrency N] [--cluster ADDRESS]
    tensorjob compile FILE [-o OUT] [--cflags FLAGS] [--zigflags FLAGS] [--force]
    tensorjob cache [--clear]
    tensorjob serve [--model PATH] [--host H] [--port P] [--slots N]   (serve_cli.py, over serve/)
    tensorjob runs | show RUN | replay GUEST --from RUN | diff RUN_A RUN_B   (history_cli.py)
    tensorjob export NOTEBOOK [-o OUT] [--to html|ipynb] [--execute]   (export.py: views as static HTML)
    tensorjob review RUN_DIR [--confidence C] [--target T]   (review_cli.py: a map's values, one at a time)

The job options are ``frontends/options.py``'s table, shared with the magics. ``run`` prints the job's events
live on stderr (``EventPrinter``), the guest's streamed output on stdout and the result (or with ``--json``
the envelope) at the end; exit 0 only when the job completed (1 failed, 130 Ctrl-C, 2 a usage error: one line,
never a traceback). Design: docs/internals/frontends.md#clipy
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NoReturn, Sequence, TextIO

from tensorjob_jupyter.version import __version__
from tensorjob_jupyter.frontends.map_cli import add_map_parser, cmd_map
from tensorjob_jupyter.frontends.serve_cli import add_serve_parser, cmd_serve
from tensorjob_jupyter.frontends.export import add_export_parser, cmd_export
from tensorjob_jupyter.frontends.review_cli import add_review_parser, cmd_review
from tensorjob_jupyter.frontends.history_cli import COMMANDS as HISTORY_COMMANDS
from tensorjob_jupyter.frontends.history_cli import add_history_parsers
from tensorjob_jupyter.frontends.terminal import CtrlCCancels, exit_status, load_guest, run_live
from tensorjob_jupyter.host import Job, ModelError, cache_dir, cache_usage, clear_cache
from tensorjob_jupyter.frontends.options import (
    BY_NAME, EXIT_FAILED, EXIT_OK, EXIT_USAGE, JobOptions, OptionError, add_job_arguments,
)
from tensorjob_jupyter.abi import TensorjobError
from tensorjob_jupyter.text import clip, for_terminal, json_text

class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, no usage dump
        raise OptionError(f"{message} (see `{self.prog} --help`)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tensorjob", description="Run sandboxed WebAssembly tensor jobs against a local model.")
    parser.add_argument("--version", action="version", version=f"tensorjob {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    run = sub.add_parser("run", help="run a guest (.py, .wasm, .c, .zig or .wat)",
                         description="Run a guest to the end, showing its progress live.")
    run.add_argument("guest", help="the guest: a .py script, a .wasm module, or .c / .zig / .wat source to compile")
    add_job_arguments(run)
    run.add_argument("--events", default=None, metavar="FILE", help="write every event as one JSON line to FILE")
    run.add_argument("--json", action="store_true", help="print the envelope as JSON on stdout, nothing else")
    run.add_argument("--quiet", "-q", action="store_true", help="no live progress on stderr")

    add_map_parser(sub)
    add_serve_parser(sub)
    add_export_parser(sub)

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
    add_review_parser(sub)
    return parser


def cmd_run(args, out: TextIO, err: TextIO) -> int:
    options = JobOptions.from_args(args)
    guest = load_guest(options, args.guest, err)
    if guest is None:
        return EXIT_FAILED
    spec = options.spec(guest)
    try:  # a hf: model is fetched here, before Ctrl-C means "cancel the job"
        backend = spec.model.backend()
    except ModelError as e:  # a hf: model that cannot be found or fetched
        raise OptionError(f"--model {options.model}: {e}") from None
    with CtrlCCancels() as ctrl_c:
        envelope = run_live(ctrl_c.attach(Job(spec, backend=backend)), args, out, err)
    if args.json:
        out.write(json_text(envelope.to_json()) + "\n")
    elif envelope.ok:
        out.write(json_text(envelope.result) + "\n")
    out.flush()
    return exit_status(envelope)


# --- compile and cache -------------------------------------------------------------------


def cmd_compile(args, out: TextIO, err: TextIO) -> int:
    guest = load_guest(JobOptions.from_args(args), args.file, err, heading="")
    if guest is None:
        return EXIT_FAILED
    target = Path(args.output) if args.output else Path(args.file).with_suffix(".wasm")
    target.write_bytes(guest.wasm)
    out.write(f"{target} ({len(guest.wasm)} bytes)\n")
    return EXIT_OK


def cmd_cache(args, out: TextIO, err: TextIO) -> int:
    if args.clear:
        files, size = clear_cache()
        out.write(f"removed {files} cached modules ({size} bytes) from {cache_dir()}\n")
    else:
        files, size = cache_usage()
        out.write(f"{cache_dir()}: {files} cached modules, {size} bytes (tensorjob cache --clear empties it)\n")
    return EXIT_OK


COMMANDS = {"run": cmd_run, "map": cmd_map, "serve": cmd_serve, "compile": cmd_compile, "cache": cmd_cache,
            "export": cmd_export, "review": cmd_review, **HISTORY_COMMANDS}


def main(argv: Sequence[str] | None = None, *, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        args = build_parser().parse_args(argv)
        return COMMANDS[args.command](args, out, err)
    except TensorjobError as e:  # every refusal of this package, caught once: one line, exit 2
        err.write(f"tensorjob: error: {clip(for_terminal(str(e), one_line=True), MAX_ERROR_CHARS)}\n")
        return EXIT_USAGE


#: Characters of a usage error's line (its text may come from a file from anywhere).
MAX_ERROR_CHARS = 2000


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())


__all__ = ["build_parser", "cmd_run", "cmd_compile", "cmd_cache", "COMMANDS", "main", "MAX_ERROR_CHARS"]

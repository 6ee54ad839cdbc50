"""``tensorjob map``: the subcommand's parser, its run, and its progress lines.

A thin shell over ``start_map``, so the command and ``tj.map`` cannot drift
apart (``start_map_run`` is shared with ``%tensorjob map``). Anything that keeps a map from starting (a missing file, a bad
number, a changed manifest, an unreachable cluster) is one line on stderr
and exit 2; live progress goes to stderr, throttled, with the first few
failures; a table of the items (``frontends/table.py``) and the summary (or
``--json``) go to stdout, with the score when the map has expected answers
(``--expected FILE.jsonl``, ``--scorer NAME``). ``--estimate`` prints what the
map would cost and runs nothing (``fanout.estimate``); ``--max-total-tokens N``
stops it, resumably, once its items have used N tokens. Exit codes: 0 every
item completed, 1 some failed (or the token budget stopped the map), 2 usage
error, 130 Ctrl-C.
"""

from __future__ import annotations

import argparse
import shutil
import time
from typing import TextIO

from tensorjob_jupyter.frontends.options import (
    EXIT_CANCELLED, EXIT_FAILED, EXIT_OK, JobOptions, OptionError, add_job_arguments,
)
from tensorjob_jupyter.abi import codes
from tensorjob_jupyter.fanout.errors import MapError
from tensorjob_jupyter.fanout.estimate import MapEstimate, estimate_map
from tensorjob_jupyter.fanout.progress import MapResult, rate_text
from tensorjob_jupyter.fanout.run import STOPPED, MapRun
from tensorjob_jupyter.fanout.concurrency import AUTO
from tensorjob_jupyter.fanout.scoring import BUILTINS, DEFAULT_SCORER
from tensorjob_jupyter.fanout.start import start_map
from tensorjob_jupyter.frontends.table import map_table
from tensorjob_jupyter.frontends.terminal import load_guest
from tensorjob_jupyter.host.waiting import wait_or_cancel
from tensorjob_jupyter.host import GuestSource
from tensorjob_jupyter.text import for_terminal, json_text

SHOW_FAILURES = 20


def add_map_parser(subparsers) -> argparse.ArgumentParser:
    """Add ``tensorjob map`` to the ``tensorjob`` command's subparsers."""
    p = subparsers.add_parser("map", help="run a guest once per line of a JSONL manifest",
                              description="Run a guest once per manifest line (each line's JSON value is "
                                          "that item's input), resumably, here or on a Dask cluster.")
    p.add_argument("guest", help="the guest: a .py script, a .wasm module, or .c / .zig / .wat source to compile")
    p.add_argument("--over", required=True, metavar="MANIFEST", help="the items: a JSONL file, one input a line")
    p.add_argument("--run-dir", required=True, metavar="DIR",
                   help="where results.jsonl, failures.jsonl and the ledger go; rerun to resume")
    p.add_argument("--concurrency", type=concurrency_value, default=None, metavar="N|auto",
                   help=CONCURRENCY_HELP)
    p.add_argument("--cluster", default=None, metavar="ADDRESS", help="run items on this Dask scheduler")
    p.add_argument("--retry-failed", action="store_true", help="on resume, run the failed items again")
    p.add_argument("--restart", action="store_true",
                   help="start the run folder over, keeping nothing it holds (e.g. after changing the guest)")
    add_experiment_arguments(p)
    p.add_argument("--json", action="store_true", help="print the summary as JSON on stdout, nothing else")
    p.add_argument("--quiet", "-q", action="store_true", help="no live progress on stderr")
    add_job_arguments(p, one_job=False)
    return p


def add_experiment_arguments(p) -> None:
    """``--expected``, ``--scorer``, ``--max-total-tokens`` and ``--estimate``: on ``tensorjob map`` and
    ``%tensorjob map`` alike."""
    p.add_argument("--expected", default=None, metavar="FILE.jsonl",
                   help="expected answers, one JSON value a line in the manifest's order: score every item")
    p.add_argument("--scorer", default=None, metavar="NAME",
                   help=f"how an answer is scored against its expected one: {', '.join(BUILTINS)} (default "
                        f"{DEFAULT_SCORER}; in a notebook also $name, a Python function (result, expected) -> score)")
    p.add_argument("--max-total-tokens", type=int, default=None, metavar="N",
                   help="stop the map, resumably, once its items have used N tokens (in and out)")
    p.add_argument("--estimate", action="store_true",
                   help="print what the map would cost (prompt tokens per item, the expected time) and run nothing")
    p.add_argument("--deterministic", action="store_true",
                   help="answers that do not depend on what else runs: one item at a time, each infer decoded alone "
                        "with a fixed thread count and no prompt cache (slower; a local model only)")


def cmd_map(args, out: TextIO, err: TextIO) -> int:
    """``tensorjob map``: 0 every item completed, 1 some failed or the guest did not compile,
    2 usage error (anything that keeps the map from starting, one line), 130 Ctrl-C."""
    options = JobOptions.from_args(args, local_model=args.cluster is None)  # on a cluster: each worker checks
    guest = load_guest(options, args.guest, err)
    if guest is None:
        return EXIT_FAILED
    if args.estimate:
        estimate = estimate_map_run(guest, args, options)
        out.write((json_text(estimate.to_json()) if args.json else for_terminal(str(estimate))) + "\n")
        return EXIT_OK
    run = start_map_run(guest, args, options)
    printer = ProgressPrinter(err, quiet=args.quiet)
    run.subscribe(printer)
    wait_or_cancel(run.wait_done, run.cancel)
    result = run.wait()
    if args.json:
        out.write(json_text(result.to_json()) + "\n")
    else:
        out.write(map_table(result.rows(), width=shutil.get_terminal_size().columns,
                            more=f"tensorjob runs --table {result.run_dir} (--csv for a spreadsheet)") + "\n\n")
        out.write(for_terminal(_summary_text(result)) + "\n")
    out.flush()
    if result.status == "cancelled":
        return EXIT_CANCELLED
    return EXIT_OK if result.ok else EXIT_FAILED


def start_map_run(guest: GuestSource, args, options: JobOptions, *, scorer=None) -> MapRun:
    """Start the map ``args`` describe (``--over``, ``--run-dir``, ``--concurrency``, ``--cluster``,
    ``--retry-failed``, ``--restart``, ``--expected``, ``--scorer``, ``--max-total-tokens``) with ``options``;
    ``scorer`` (a Python function, from a notebook) replaces ``--scorer``. Whatever keeps it from starting -- a
    bad number, a manifest, a refused run folder, a cluster that cannot be reached, expected answers that do
    not fit -- is one ``OptionError`` line. ``tensorjob map`` and ``%tensorjob map`` both start here."""
    if args.max_total_tokens is not None and args.max_total_tokens < 1:
        raise OptionError("--max-total-tokens must be at least 1")
    try:
        return start_map(options.map_spec(guest), args.over, args.run_dir, concurrency=args.concurrency,
                         cluster=args.cluster, retry_failed=args.retry_failed, restart=args.restart,
                         expected=args.expected, scorer=scorer if scorer is not None else args.scorer,
                         max_total_tokens=args.max_total_tokens, deterministic=args.deterministic)
    except (MapError, OSError, ValueError) as e:
        raise OptionError(_one_line(e)) from None
    except Exception as e:  # noqa: BLE001 - e.g. the cluster cannot be reached
        raise OptionError(f"{type(e).__name__}: {_one_line(e)}") from None


def estimate_map_run(guest: GuestSource, args, options: JobOptions) -> MapEstimate:
    """``--estimate``: what the map ``args`` describe would cost; a problem is one ``OptionError`` line."""
    try:
        return estimate_map(options.map_spec(guest), args.over, run_dir=args.run_dir)
    except (MapError, OSError, ValueError) as e:
        raise OptionError(_one_line(e)) from None


#: ``--concurrency``'s help, the same in the terminal and the magic.
CONCURRENCY_HELP = ("items at once: a number, or auto (the default: as many as the model decodes together -- "
                    "its slots, 4 unless set -- at most twice the physical cores); on a cluster, items in flight "
                    "(default twice its threads)")


def concurrency_value(text: str) -> int | str:
    """``--concurrency``: ``auto`` or a whole number at least 1; anything else is one usage line."""
    text = text.strip()
    if text == AUTO:
        return AUTO
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is neither auto nor a whole number at least 1")
    return value


def _one_line(e: object) -> str:
    return " ".join(str(e).split())


def _summary_text(result: MapResult) -> str:
    rate = rate_text(result.ran, result.elapsed_s)
    lines = [f"{result.total} items: {result.completed} completed, {result.failed} failed "
             f"({result.ran} ran, {result.skipped} skipped) in {result.elapsed_s:.1f} s"
             + (f" ({rate})" if rate else "") + f" -- {result.status}",
             f"results:  {result.results_path}", f"failures: {result.failures_path}"]
    if result.status == STOPPED:
        lines.append(f"stopped: the token budget is spent ({result.tokens} tokens used); run the same map again "
                     f"to go on where it stopped")
    if result.error:
        lines.append(f"error: {result.error}")
    summary = result.score_summary()
    if summary is not None:
        lines += summary.lines()
    return "\n".join(lines)


def progress_line(p: dict) -> str:
    """A map's progress (``MapProgress.to_json()``) as one line: items that need the model (a replay's) are
    counted as such, never as failed."""
    rate = rate_text(p["completed"] + p["failed"], p["elapsed_s"])
    needs = p.get("needs_model") or 0
    return (f"· {p['skipped'] + p['completed'] + p['failed']}/{p['total']} "
            f"({p['completed']} completed, {p['failed'] - needs} failed, "
            + (f"{needs} need the model, " if needs else "")
            + f"{p['skipped']} skipped, {p['running']} running" + (f", {rate}" if rate else "") + ")")


class ProgressPrinter:
    """Throttled progress lines on stderr, plus the first few failures."""

    def __init__(self, err: TextIO, *, quiet: bool, every_s: float = 1.0):
        self.err, self.quiet, self.every_s = err, quiet, every_s
        self._last = 0.0
        self._failures = self._unanswered = 0

    def __call__(self, event: dict) -> None:
        if self.quiet:
            return

        if event["type"] == "item.failed":
            e = event["error"]
            if e.get("code") == codes.REPLAY_DIVERGENCE:  # a replay's item its recording cannot answer
                self._unanswered += 1
                if self._unanswered <= SHOW_FAILURES:
                    self.err.write(for_terminal(f"◦ item {event['item']} needs the model: {e['message']}",
                                                one_line=True) + "\n")
                elif self._unanswered == SHOW_FAILURES + 1:
                    self.err.write("◦ ... more items need the model (the summary lists them)\n")
            else:
                self._failures += 1
                if self._failures <= SHOW_FAILURES:
                    self.err.write(for_terminal(f"✗ item {event['item']}: {e['code']}: {e['message']}",
                                                one_line=True) + "\n")
                elif self._failures == SHOW_FAILURES + 1:
                    self.err.write("✗ ... more failures in failures.jsonl\n")
        now = time.monotonic()
        if event["type"] == "map.finished" or now - self._last >= self.every_s:
            self._last = now
            self.err.write(progress_line(event["progress"]) + "\n")
        self.err.flush()


__all__ = [
    "SHOW_FAILURES", "add_map_parser", "add_experiment_arguments", "cmd_map", "start_map_run", "estimate_map_run",
    "CONCURRENCY_HELP", "concurrency_value", "progress_line", "ProgressPrinter"
]

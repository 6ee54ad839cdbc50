"""``tensorjob map``: the subcommand's parser, its run, and its progress lines.

A thin shell over the public API (``tj.start_map`` through ``frontends/requests.py``, as ``%tensorjob map``
does): the job options become the map's ``JobSpec`` and the map's own flags a ``MapRequest``, read once.
Anything that keeps a map from starting is one line on stderr and exit 2; live progress goes to stderr,
throttled, with the first few failures; the table and the summary (or ``--json``) go to stdout, with the score
when there are expected answers. ``--estimate`` prints what the map would cost and runs nothing. Exit codes:
0 every item completed, 1 some failed (or the token budget stopped the map), 2 usage error, 130 Ctrl-C.
"""

from __future__ import annotations

import argparse
import shutil
import time
from typing import TextIO

from tensorjob_jupyter.frontends.options import (
    CONCURRENCY_HELP, EXIT_CANCELLED, EXIT_FAILED, EXIT_OK, JobOptions, add_cascade_arguments, add_job_arguments,
    cascade_request, concurrency_value,
)
from tensorjob_jupyter.frontends.requests import MapRequest, estimate_map, start_map
from tensorjob_jupyter.abi import codes
from tensorjob_jupyter.fanout.progress import MapResult, rate_text
from tensorjob_jupyter.fanout.run import STOPPED
from tensorjob_jupyter.fanout.cascade import PHASES, summary_lines
from tensorjob_jupyter.fanout.scoring import BUILTINS, DEFAULT_SCORER
from tensorjob_jupyter.frontends.table import map_table_lines
from tensorjob_jupyter.frontends.terminal import load_guest
from tensorjob_jupyter.host.waiting import wait_or_cancel
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
    add_cascade_arguments(p)  # options.CASCADE_FLAGS
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
    request = map_request(args)
    if args.estimate:
        estimate = estimate_map(options.map_spec(guest), request)
        out.write((json_text(estimate.to_json()) if args.json else for_terminal(str(estimate))) + "\n")
        return EXIT_OK
    run = start_map(options.map_spec(guest), request)
    for note in run.notes:  # even --quiet: it says why a guest's open there is refused
        err.write(for_terminal(note, one_line=True) + "\n")
    printer = ProgressPrinter(err, quiet=args.quiet)
    run.subscribe(printer)
    wait_or_cancel(run.wait_done, run.cancel)
    result = run.wait()
    if args.json:
        out.write(json_text(result.to_json()) + "\n")
    else:
        for line in map_table_lines(result.iter_rows, width=shutil.get_terminal_size().columns, count=result.total,
                                    more=f"tensorjob runs --table {result.run_dir} (--csv for a spreadsheet)"):
            out.write(line + "\n")  # the first rows: never every row of a large map made
        out.write("\n")
        out.write(for_terminal(_summary_text(result)) + "\n")
    out.flush()
    if result.status == "cancelled":
        return EXIT_CANCELLED
    return EXIT_OK if result.ok else EXIT_FAILED


def map_request(args) -> MapRequest:
    """The map this command's own flags describe (``--over``, ``--run-dir``, ``--concurrency``, ...)."""
    return MapRequest(args.over, args.run_dir, concurrency=args.concurrency, cluster=args.cluster,
                      retry_failed=args.retry_failed, restart=args.restart, expected=args.expected,
                      scorer=args.scorer, max_total_tokens=args.max_total_tokens, deterministic=args.deterministic,
                      **cascade_request(args))


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
    lines += summary_lines(result.run_dir)  # a cascade's sample, bound and threshold
    summary = result.score_summary()
    if summary is not None:
        lines += summary.lines()
    return "\n".join(lines)


def progress_line(p: dict, phase: str | None = None) -> str:
    """A map's progress (``MapProgress.to_json()``) as one line: items that need the model (a replay's) are
    counted as such, never as failed; ``phase``: a cascade's (``cascade.PHASES``), named first."""
    rate = rate_text(p["completed"] + p["failed"], p["elapsed_s"])
    needs = p.get("needs_model") or 0
    named = f"{PHASES.get(phase, str(phase))}: " if phase is not None else ""
    return (f"· {named}{p['skipped'] + p['completed'] + p['failed']}/{p['total']} "
            f"({p['completed']} completed, {p['failed'] - needs} failed, "
            + (f"{needs} need the model, " if needs else "")
            + f"{p['skipped']} skipped, {p['running']} running" + (f", {rate}" if rate else "") + ")")


class ProgressPrinter:
    """Throttled progress lines on stderr, plus the first few failures."""

    def __init__(self, err: TextIO, *, quiet: bool, every_s: float = 1.0):
        self.err, self.quiet, self.every_s = err, quiet, every_s
        self._last = 0.0
        self._failures = self._unanswered = 0
        self._phase: str | None = None  # a cascade's phase now (its items' events say it)
        self._shown: tuple | None = None  # the counts the last progress line said

    def __call__(self, event: dict) -> None:
        if self.quiet:
            return

        if event["type"] == "cascade.phase":  # a cascade's next phase, said once, after the last one's end
            if self._phase is not None and isinstance(event.get("progress"), dict):
                self._progress(event["progress"], self._phase, again=False)
            self.err.write(for_terminal(event["message"], one_line=True) + "\n")
            self._phase = event.get("phase") if isinstance(event.get("phase"), str) else None
            self.err.flush()
            return
        if isinstance(event.get("phase"), str):
            self._phase = event["phase"]
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
            self._progress(event["progress"], None if event["type"] == "map.finished" else self._phase)
        self.err.flush()

    def _progress(self, p: dict, phase: str | None, *, again: bool = True) -> None:
        """A progress line; ``again=False``: not when the last one said the same counts (a phase's end)."""
        counts = (phase, p.get("total"), p.get("completed"), p.get("failed"), p.get("skipped"), p.get("running"))
        if again or counts != self._shown:
            self.err.write(progress_line(p, phase) + "\n")
        self._shown = counts


__all__ = [
    "SHOW_FAILURES", "add_map_parser", "add_experiment_arguments", "cmd_map", "map_request", "progress_line",
    "ProgressPrinter"
]

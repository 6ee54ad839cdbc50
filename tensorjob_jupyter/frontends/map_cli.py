"""``tensorjob map``: the subcommand's parser, its run, and its progress lines.

A thin shell over the public API (``tj.start_map`` through ``frontends/requests.py``, as ``%tensorjob map``
does): the job options become the map's ``JobSpec`` and the map's own flags a ``MapSpec``, read once.
Anything that keeps a map from starting is one line on stderr and exit 2; live progress goes to stderr,
throttled, with the first few failures; the table and the summary (or ``--json``) go to stdout, with the score
when there are expected answers. ``--estimate`` prints what the map would cost and runs nothing. Exit codes:
0 every item completed, 1 some failed (or the token budget stopped the map), 2 usage error, 130 Ctrl-C.
"""

from __future__ import annotations

import argparse
import shutil
import threading
import time
from typing import Sequence, TextIO

from tensorjob_jupyter.frontends.flags import MAP, add_arguments, map_spec
from tensorjob_jupyter.frontends.options import EXIT_CANCELLED, EXIT_FAILED, EXIT_OK, JobOptions, add_job_arguments
from tensorjob_jupyter.frontends.requests import estimate_map, start_map
from tensorjob_jupyter.abi import codes
from tensorjob_jupyter.fanout.progress import MapResult, rate_text
from tensorjob_jupyter.fanout.run import STOPPED, InFlight
from tensorjob_jupyter.fanout.cascade import PHASES, summary_lines
from tensorjob_jupyter.frontends.table import map_table_lines
from tensorjob_jupyter.frontends.terminal import load_guest
from tensorjob_jupyter.host import GENERATING
from tensorjob_jupyter.host.waiting import wait_or_cancel
from tensorjob_jupyter.text import for_terminal, json_text

SHOW_FAILURES = 20
#: Items in flight a running line names (the rest are counted), characters of each one's key and of the end of
#: its text.
SHOW_RUNNING = 4
RUNNING_KEY_CHARS = 32
RUNNING_TAIL_CHARS = 40
#: Seconds between running lines that say only that the items' tokens grew.
TOKENS_EVERY_S = 5.0


def add_map_parser(subparsers) -> argparse.ArgumentParser:
    """Add ``tensorjob map`` to the ``tensorjob`` command's subparsers."""
    p = subparsers.add_parser("map", help="run a guest once per line of a JSONL manifest",
                              description="Run a guest once per manifest line (each line's JSON value is "
                                          "that item's input), resumably, here or on a Dask cluster.")
    p.add_argument("guest", help="the guest: a .py script, a .wasm module, or .c / .zig / .wat source to compile")
    add_arguments(p, MAP)  # flags.py: the table the magic reads too
    p.add_argument("--json", action="store_true", help="print the summary as JSON on stdout, nothing else")
    p.add_argument("--quiet", "-q", action="store_true", help="no live progress on stderr")
    add_job_arguments(p, one_job=False)
    return p


def cmd_map(args, out: TextIO, err: TextIO) -> int:
    """``tensorjob map``: 0 every item completed, 1 some failed or the guest did not compile,
    2 usage error (anything that keeps the map from starting, one line), 130 Ctrl-C."""
    options = JobOptions.from_args(args, local_model=args.cluster is None)  # on a cluster: each worker checks
    guest = load_guest(options, args.guest, err)
    if guest is None:
        return EXIT_FAILED
    request = map_spec(args)
    if args.estimate:
        estimate = estimate_map(options.map_spec(guest), request)
        out.write((json_text(estimate.to_json()) if args.json else for_terminal(str(estimate))) + "\n")
        return EXIT_OK
    run = start_map(options.map_spec(guest), request)
    for note in run.notes:  # even --quiet: it says why a guest's open there is refused
        err.write(for_terminal(note, one_line=True) + "\n")
    printer = ProgressPrinter(err, quiet=args.quiet)
    run.subscribe(printer)

    def wait_done(seconds: float) -> bool:  # between waits, the items in flight (at the printer's own rate)
        done = run.wait_done(seconds)
        if not done:
            printer.watch(run.in_flight())
        return done

    wait_or_cancel(wait_done, run.cancel)
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


def running_line(flights: Sequence[InFlight]) -> str:
    """The items in flight as one line: ``· running: 3 doc-3 generating (12 tokens) "…the end", 4 doc-4 reading
    its prompt`` (the first ``SHOW_RUNNING``; keys and text made safe for a terminal by the caller)."""
    parts = []
    for f in flights[:SHOW_RUNNING]:
        g = f.glimpse
        text = " ".join(g.tail.split())
        text = text if len(text) <= RUNNING_TAIL_CHARS else "…" + text[-(RUNNING_TAIL_CHARS - 1):]
        said = f" ({g.tokens} token{'' if g.tokens == 1 else 's'})" if g.phase == GENERATING else ""
        key = f.key if len(f.key) <= RUNNING_KEY_CHARS else f.key[:RUNNING_KEY_CHARS - 1] + "…"
        parts.append(f"{f.item} {key} {g.phase}{said}" + (f' "{text}"' if said and text else ""))
    more = len(flights) - SHOW_RUNNING
    return "· running: " + ", ".join(parts) + (f", and {more} more" if more > 0 else "")


class ProgressPrinter:
    """Throttled progress lines on stderr, plus the first few failures and the items in flight (``watch``)."""

    def __init__(self, err: TextIO, *, quiet: bool, every_s: float = 1.0):
        self.err, self.quiet, self.every_s = err, quiet, every_s
        self._last = 0.0
        self._failures = self._unanswered = 0
        self._phase: str | None = None  # a cascade's phase now (its items' events say it)
        self._shown: tuple | None = None  # the counts the last progress line said
        self._lock = threading.Lock()  # events come on the map's thread, ``watch`` on the waiting one
        self._running: tuple = ()  # the (item, phase) pairs the last running line said
        self._running_tokens = 0
        self._running_at = 0.0

    def watch(self, flights: Sequence[InFlight]) -> None:
        """Say the items in flight: a line when one starts or changes phase (at most one each ``every_s``), and
        at most one each ``TOKENS_EVERY_S`` when only their tokens have grown."""
        if self.quiet or not flights:
            return
        now = time.monotonic()
        said = tuple((f.item, f.glimpse.phase) for f in flights)
        tokens = sum(f.glimpse.tokens for f in flights)
        wait = self.every_s if said != self._running else TOKENS_EVERY_S if tokens != self._running_tokens else None
        if wait is None or now - self._running_at < wait:
            return
        self._running, self._running_tokens, self._running_at = said, tokens, now
        with self._lock:
            self.err.write(for_terminal(running_line(flights), one_line=True) + "\n")
            self.err.flush()

    def __call__(self, event: dict) -> None:
        if self.quiet:
            return
        with self._lock:
            self._on_event(event)

    def _on_event(self, event: dict) -> None:

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
    "SHOW_FAILURES", "SHOW_RUNNING", "RUNNING_KEY_CHARS", "RUNNING_TAIL_CHARS", "TOKENS_EVERY_S", "add_map_parser", "cmd_map",
    "progress_line", "running_line", "ProgressPrinter"
]

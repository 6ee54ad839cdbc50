"""``tensorjob runs | show | replay | diff``: past runs from a terminal.

    tensorjob runs [--runs DIR] [--limit N] [--status S] [--prune KEEP] [--json]
    tensorjob runs --table MAP_RUN_DIR [--review] [--csv | --json]
    tensorjob show RUN [--runs DIR] [--speed S] [--sources] [--json] [--quiet]
    tensorjob replay GUEST --from RUN [job options] [--live] [--events FILE] [--json] [--quiet]
    tensorjob replay --map RUN_DIR GUEST [--run-dir OUT] [--live] [--fail-under X] [job options] [--json]
    tensorjob diff RUN_A RUN_B [--runs DIR] [--json]
    tensorjob diff --map RUN_DIR_A RUN_DIR_B [--json]

A thin shell: each command reads its arguments once into typed values (job options become ``Overrides`` for a
replay) and calls the public API through ``frontends/requests.py``, as ``%tensorjob`` does. Exit statuses are
``run``'s; ``replay --map`` is 0 when every item was answered from its recording (and, with ``--fail-under``,
the new mean score passes), ``diff`` 0 when the two are the same; a problem is one line and exit 2.
"""

from __future__ import annotations

import shutil
from typing import TextIO

from tensorjob_jupyter.fanout.errors import MapError
from tensorjob_jupyter.fanout.cascade import cascade_lines, read_cascade
from tensorjob_jupyter.frontends.table import MAP_LAYOUT, REVIEW_LAYOUT, map_table_lines, write_csv

from tensorjob_jupyter.frontends.flags import REPLAY, add_arguments, check_placed, map_replay_spec
from tensorjob_jupyter.frontends.options import (
    BY_NAME, EXIT_CANCELLED, EXIT_FAILED, EXIT_OK, JobOptions, OptionError, add_job_arguments, fail_under,
)
from tensorjob_jupyter.frontends.requests import (
    find_runs, map_row_source, open_playback, replay_job, start_map_replay,
)
from tensorjob_jupyter.text import for_terminal, json_text
from tensorjob_jupyter.frontends.terminal import EventPrinter, exit_status, load_guest, run_live
from tensorjob_jupyter.history.runs import prune
from tensorjob_jupyter.history.diff import diff_runs
from tensorjob_jupyter.history.map_compare import compare
from tensorjob_jupyter.history.sources import sources_text
from tensorjob_jupyter.frontends.map_cli import ProgressPrinter
from tensorjob_jupyter.host.waiting import wait_or_cancel

#: Runs a listing shows unless told otherwise.
DEFAULT_LIMIT = 20


def _runs_flag(parser) -> None:
    opt = BY_NAME["runs"]
    parser.add_argument(opt.flag, dest=opt.name, default=None, metavar=opt.metavar, help=opt.help)


def add_history_parsers(sub) -> None:
    runs = sub.add_parser("runs", help="list past runs, newest first; --prune KEEP deletes old ones",
                          description="List the runs in the runs folder, newest first (id, guest, status, tokens, "
                                      "duration, started). --prune KEEP deletes all but the newest KEEP (of --status, "
                                      "if given), never a running job's folder, a symlink or a folder that is not "
                                      "a run.")
    _runs_flag(runs)
    runs.add_argument("--limit", type=int, default=DEFAULT_LIMIT, metavar="N",
                      help=f"show the newest N runs (default {DEFAULT_LIMIT}; 0: all)")
    runs.add_argument("--status", default=None, metavar="S",
                      help="only runs that ended so: completed, failed, cancelled, running, interrupted, unreadable")
    runs.add_argument("--prune", type=int, default=None, metavar="KEEP",
                      help="delete all but the newest KEEP runs (safely: only run folders, never a running one)")
    runs.add_argument("--json", action="store_true", help="one JSON object a run (with --table: an item) "
                                                          "instead of a table")
    runs.add_argument("--table", default=None, metavar="MAP_RUN_DIR",
                      help="a map's run folder as a table of its items (item, key, status, result fields), "
                           "in manifest order")
    runs.add_argument("--csv", action="store_true", help="with --table: every column of every item as CSV")
    runs.add_argument("--review", action="store_true", help="with --table: one row per value of the completed "
                      "items, doubtful first -- a value found in no window its item read, then the lowest confidence "
                      "-- with its reason, confidence, source and the text around it (MapResult.review())")

    show = sub.add_parser("show", help="show a past run again, as `run` showed it",
                          description="Print a recorded run's progress, file reads, tokens and result again, at "
                                      "once or at its recorded speed.")
    show.add_argument("run", metavar="RUN", help="a run id (or a unique prefix), or a run folder")
    _runs_flag(show)
    show.add_argument("--speed", type=float, default=0.0, metavar="S",
                      help="0: at once (default); 1: at the recorded speed; 2: twice as fast")
    show.add_argument("--json", action="store_true", help="print the envelope as JSON on stdout, nothing else")
    show.add_argument("--sources", action="store_true", help="after the result, each field with where it was "
                      "found in what the job read and an excerpt around it, or `not found`")
    show.add_argument("--quiet", "-q", action="store_true", help="no progress lines on stderr")

    replay = sub.add_parser("replay", help="run a guest against a recorded run, with no model",
                            description="Run GUEST (the recorded one or a changed one) against the run RUN: each "
                                        "infer is answered from the recording, files are read live -- only what "
                                        "--read grants here, never the grants the recording names (an open it does "
                                        "not cover fails capability_denied, naming the --read it needs). The first "
                                        "command the recording lacks stops the replay (or, with --live, the model "
                                        "answers from there). Job options replace the recorded ones; the bytes of "
                                        "--input-file must be given again.")
    replay.add_argument("guest", help="the guest: a .py script, a .wasm module, or .c / .zig / .wat source to compile")
    add_arguments(replay, REPLAY)  # flags.py: the table the magic reads too
    add_job_arguments(replay)
    replay.add_argument("--events", default=None, metavar="FILE", help="write every event as one JSON line to FILE")
    replay.add_argument("--json", action="store_true",
                        help="print the replay report (with the envelope) as JSON on stdout, nothing else")
    replay.add_argument("--quiet", "-q", action="store_true", help="no live progress on stderr")

    diff = sub.add_parser("diff", help="compare two runs: where their commands part, result and usage",
                          description="The first step where two runs' command sequences differ, the first answer "
                                      "that differs, and their results and usage. Exit 0 when they are the same, "
                                      "1 when they differ.")
    diff.add_argument("run_a", metavar="RUN_A")
    diff.add_argument("run_b", metavar="RUN_B")
    _runs_flag(diff)
    diff.add_argument("--map", action="store_true",
                      help="RUN_A and RUN_B are maps' run folders (of one manifest): compare them item by item -- "
                           "results, scores, tokens, time")
    diff.add_argument("--json", action="store_true", help="the comparison as JSON")


# --- runs ------------------------------------------------------------------------------------------


def _cascade_lines(run_dir: str) -> list[str]:
    """A cascade's summary (``fanout.cascade.cascade_lines``) when ``run_dir`` holds one; a ``cascade.json`` that
    cannot be read is one ``OptionError`` line."""
    try:
        return cascade_lines(read_cascade(run_dir))
    except (MapError, OSError) as e:
        raise OptionError(f"--table {run_dir}: {' '.join(str(e).split())}") from None


def cmd_runs(args, out: TextIO, err: TextIO) -> int:
    if args.csv and args.table is None:
        raise OptionError("--csv goes with --table MAP_RUN_DIR")
    if args.review and args.table is None:
        raise OptionError("--review goes with --table MAP_RUN_DIR")
    if args.table is not None:
        rows = map_row_source(args.table, review=args.review)  # a row at a time: a map of any size
        if args.csv:
            write_csv(rows(), out)
        elif args.json:
            for row in rows():
                out.write(json_text(row, pretty=False) + "\n")
        else:
            layout, what = (REVIEW_LAYOUT, "values") if args.review else (MAP_LAYOUT, "items")
            for line in map_table_lines(rows, width=shutil.get_terminal_size().columns, max_rows=None, layout=layout,
                                        what=what):
                out.write(line + "\n")
            for line in _cascade_lines(args.table):  # a cascade's sample, bound and threshold
                out.write(for_terminal(line, one_line=True) + "\n")
        return EXIT_OK
    if args.prune is not None:
        report = prune(args.prune, args.runs, status=args.status)
        if args.json:
            out.write(json_text(report.to_json(), pretty=False) + "\n")
        else:
            out.write(str(report) + "\n")
        return EXIT_OK
    listing, total = find_runs(args.runs, status=args.status, limit=args.limit)
    if args.json:
        for info in listing:
            out.write(json_text(info.to_json(), pretty=False) + "\n")
        return EXIT_OK
    out.write(listing.table() + "\n")
    if total > len(listing):
        out.write(f"({len(listing)} of {total} runs; --limit 0 shows all)\n")
    return EXIT_OK


# --- show ------------------------------------------------------------------------------------------


def _write_end(envelope: dict | None, *, as_json: bool, out: TextIO) -> None:
    if envelope is None:
        return
    if as_json:
        out.write(json_text(envelope) + "\n")
    elif envelope.get("status") == "completed":
        out.write(json_text(envelope.get("result")) + "\n")
    out.flush()


def cmd_show(args, out: TextIO, err: TextIO) -> int:
    playback = open_playback(args.run, args.runs, speed=args.speed)
    printer = EventPrinter(out=out, err=err, quiet=args.quiet, chunks_to_stdout=not args.json)
    last = None
    try:
        for event in playback.events():
            printer.show_safely(event)
            last = event
    except KeyboardInterrupt:
        return EXIT_CANCELLED
    envelope = last.get("envelope") if last else None
    _write_end(envelope, as_json=args.json, out=out)
    if args.sources and not args.json:
        out.write(sources_text(envelope, width=shutil.get_terminal_size().columns) + "\n")
    return EXIT_OK


# --- replay ----------------------------------------------------------------------------------------


def cmd_replay(args, out: TextIO, err: TextIO) -> int:
    if (args.from_run is None) == (args.map_run is None):
        raise OptionError("replay needs the recorded run: --from RUN, or --map RUN_DIR for a map (one of them)")
    if args.recorded_grants and not args.live:
        raise OptionError("--recorded-grants is for a --live replay (a replay reads only what --read grants now, "
                          "never the recorded grants; name each path it needs with --read)")
    check_placed(args, REPLAY)  # --run-dir, --concurrency, ... only with --map: the magic's check too
    if args.map_run is not None:
        return cmd_replay_map(args, out, err)
    options = JobOptions.from_args(args)
    guest = load_guest(options, args.guest, err)
    if guest is None:
        return EXIT_FAILED
    job = replay_job(guest, args.from_run, options.overrides(), live=args.live,
                     recorded_grants=bool(args.recorded_grants), err=err)
    envelope = run_live(job, args, out, err)
    report = job.report
    assert report is not None
    if args.json:
        out.write(json_text(report.to_json()) + "\n")
    else:
        for line in report.lines():
            err.write(for_terminal(line, one_line=True) + "\n")
        if envelope.ok:
            out.write(json_text(envelope.result) + "\n")
    out.flush()
    return exit_status(envelope)


# --- replay --map ----------------------------------------------------------------------------------


def cmd_replay_map(args, out: TextIO, err: TextIO) -> int:
    gate = fail_under(args.fail_under)
    options = JobOptions.from_args(args)
    guest = load_guest(options, args.guest, err)
    if guest is None:
        return EXIT_FAILED
    replay_run = start_map_replay(guest, map_replay_spec(args), options.overrides())
    for line in replay_run.said:  # the grants its items run under, before anything runs
        err.write(for_terminal(line, one_line=True) + "\n")
    err.flush()
    run = replay_run.run
    run.subscribe(ProgressPrinter(err, quiet=args.quiet))
    wait_or_cancel(run.wait_done, replay_run.cancel)
    replay = replay_run.wait()
    if run.cancelled:
        out.write(for_terminal(f"replay cancelled: {replay.replayed.completed + replay.replayed.failed} of "
                               f"{replay.total} items replayed") + "\n")
        return EXIT_CANCELLED
    passed, line = replay.gate(gate) if gate is not None else (not replay.needs_model and not replay.needs_grants,
                                                               None)
    passed = passed and not replay.all_failed  # a replay whose every item failed passes no gate
    if args.json:
        out.write(json_text({**replay.to_json(), "passed": passed}, pretty=False) + "\n")
    else:
        out.write("\n".join(replay.lines(max_rows=None) + ([line] if line else [])) + "\n")
    out.flush()
    return EXIT_OK if passed else EXIT_FAILED


# --- diff ------------------------------------------------------------------------------------------


def cmd_diff(args, out: TextIO, err: TextIO) -> int:
    if args.map:
        try:
            comparison = compare(args.run_a, args.run_b)
        except MapError as e:
            raise OptionError(" ".join(str(e).split())) from None
        out.write((json_text(comparison.to_json(), pretty=False) if args.json
                   else "\n".join(comparison.lines(max_rows=None))) + "\n")
        return EXIT_OK if comparison.same else EXIT_FAILED
    result = diff_runs(args.run_a, args.run_b, runs=args.runs)
    if args.json:
        out.write(json_text(result.to_json()) + "\n")
    else:
        out.write("\n".join(result.lines()) + "\n")
    return EXIT_OK if result.same else EXIT_FAILED


COMMANDS = {"runs": cmd_runs, "show": cmd_show, "replay": cmd_replay, "diff": cmd_diff}


__all__ = [
    "DEFAULT_LIMIT", "add_history_parsers", "cmd_runs", "cmd_show", "cmd_replay",
    "cmd_replay_map", "cmd_diff", "COMMANDS"
]

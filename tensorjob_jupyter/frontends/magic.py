"""``%%tensorjob`` and ``%tensorjob``: tensor jobs from a notebook cell -- a thin shell over the public API.

``%%tensorjob`` compiles and runs the cell as a guest (cached, as ``%%cython`` does), ``%tensorjob run | map |
replay | show | runs | review | jobs | cancel | cache`` do the rest, each showing the live view and waiting for
the work (a kernel interrupt cancels it), or returning it at once with ``--bg``. Each reads its line once into
typed values -- the job options (``frontends/options.py``, whose defaults are the ``TensorJob`` traitlets)
become a ``JobSpec`` or ``Overrides`` -- and hands them to the public API through ``frontends/requests.py``,
as the ``tensorjob`` command does; the magic never imports the command line's modules. A cell's value is its
envelope (``outcome.py``): a failure raises one line, ``JobFailed``, with no host traceback.
Design: docs/internals/frontends.md#magicpy
"""

from __future__ import annotations

import contextlib
import shlex
import sys
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class, no_var_expand
from IPython.core.magic_arguments import argument, magic_arguments
from traitlets import CaselessStrEnum, Float
from traitlets.config import Configurable

from tensorjob_jupyter.abi import Envelope, TensorjobError
from tensorjob_jupyter.fanout import MapError, MapResult, ReviewError
from tensorjob_jupyter.fanout.cascade import summary_lines
from tensorjob_jupyter.frontends import options as job_options
from tensorjob_jupyter.frontends.requests import (
    estimate_map, find_runs, map_rows, open_playback, replay_job, start_map,
    start_map_replay,
)
from tensorjob_jupyter.frontends.table import ReviewRows
from tensorjob_jupyter.frontends.flags import (
    MAP, check_placed, check_required, magic_flags, map_replay_spec, map_spec,
)
from tensorjob_jupyter.frontends.options import JobOptions, OptionError, fail_under, job_arguments
from tensorjob_jupyter.frontends.outcome import CellEnvelope, CellError, GateFailed, GuestDoesNotCompile, JobFailed
from tensorjob_jupyter.frontends.prompt import prompt as debug_prompt
from tensorjob_jupyter.frontends.terminal import load_guest
from tensorjob_jupyter.host.waiting import wait_or_cancel
from tensorjob_jupyter.frontends.view.review_widget import review_widget
from tensorjob_jupyter.frontends.view.summary import map_summary, summary
from tensorjob_jupyter import MapReplay, MapReplayRun, ReplayReport, get_job, jobs
from tensorjob_jupyter.history.runs import prune
from tensorjob_jupyter.host import GuestSource, Job, ModelError, cache_dir, cache_usage, clear_cache
from tensorjob_jupyter.text import clip, for_terminal

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell

    from tensorjob_jupyter import MapEstimate, MapRun

    class JobSettings(Configurable):
        """Defaults of the job options (their traitlets are made at run time, from ``options.OPTIONS``)."""
else:
    #: The job options' defaults, one traitlet per row of ``options.OPTIONS`` that has one.
    JobSettings = type("JobSettings", (Configurable,), {"__doc__": "Defaults of the job options.",
                                                        **job_options.traitlets()})

#: How a value with spaces or quotes is written on a magic's line.
QUOTING = ("quote a value once, as in a shell: --input '{\"path\": \"a.txt\"}' or --input \"{'path': 'a.txt'}\"")
#: Characters of a refusal the cell shows (the text may come from a file from anywhere).
MAX_REFUSAL_CHARS = 1000


def refusal_line(e: Exception) -> str:
    """Why a job could not start, as one short, inert line."""
    return clip(for_terminal(" ".join(str(e).split()), one_line=True), MAX_REFUSAL_CHARS)


def shared_arguments(*, line: bool):
    """The arguments ``%%tensorjob`` and ``%tensorjob`` share -- the cell's language, where the value goes, how
    the job is shown -- and every job option (``options.job_arguments``), as one decorator; ``line``: the
    line magic's wording (its value may be a map's or a replay's)."""
    decorators = [
        argument("--lang", choices=["python", "c", "zig", "wat"], default=None,
                 help=("%%%%tensorjob map: " if line else "") + "the cell's language (default: recognised from "
                      "the text)"),
        argument("--out", default=None, metavar="NAME",
                 help="store the value (run: the envelope; map: the MapResult; replay: the report) as NAME" if line
                 else "store the envelope (status, result, error, usage) in the notebook as NAME"),
        argument("--bg", action="store_true", help=f"return the {'Job (or map)' if line else 'Job'} at once; it "
                                                    f"runs on in the background"),
        argument("--quiet", action="store_true", help="no live view and no summary; just the value"),
        argument("--no-raise", action="store_true",
                 help=("run: " if line else "") + "a job that fails or is cancelled returns its envelope instead of "
                      "raising JobFailed"),
        job_arguments(),
    ]

    def apply(func):
        for decorate in reversed(decorators):  # as if stacked, the first on top
            func = decorate(func)
        return func
    return apply


@contextlib.contextmanager
def refusals_as_usage_errors():
    """Around a magic's whole action: every refusal of this package (a ``TensorjobError`` other than the
    cell's own outcome, ``CellError``) is one ``UsageError`` line -- the one place the magics catch it."""
    try:
        yield
    except CellError:
        raise
    except TensorjobError as e:
        raise UsageError(refusal_line(e)) from None


@magics_class
class TensorJob(Magics, JobSettings):
    """Run sandboxed WebAssembly tensor jobs from cells (configure as ``c.TensorJob.*``)."""

    refresh_hz = Float(10.0, help="live view updates per second (at most 20)").tag(config=True)
    view = CaselessStrEnum(["auto", "widget", "text"], default_value="auto",
                           help="auto: widgets in a kernel, plain text elsewhere").tag(config=True)

    @property
    def _ipython(self) -> InteractiveShell:
        """The shell the magics are registered with (``register_magics`` gives them one)."""
        if self.shell is None:
            raise RuntimeError("TensorJob magics need an IPython shell: load them with %load_ext tensorjob_jupyter")
        return self.shell

    # -- reading the line and loading the guest --------------------------------------------------

    def _parse(self, func, line: str):
        """The magic's line, split as a shell splits it, parsed; any mistake is one UsageError line."""
        try:
            argv = shlex.split(line)
        except ValueError as e:  # an unclosed quote
            raise UsageError(f"{e}: {QUOTING}") from None
        try:
            return func.parser.parse_args(argv)
        except UsageError as e:
            if "unrecognized arguments" in str(e) and "--input" in argv:
                raise UsageError(f"{e}: {QUOTING}") from None
            raise
        except SystemExit:  # argparse on --help and the like
            raise UsageError(f"see {'%%' if func.__name__ == 'tensorjob_cell' else '%'}tensorjob? for help") from None

    def _options(self, args, *, local_model: bool = True) -> JobOptions:
        """The options given, over the traitlets' defaults; any mistake is one UsageError line."""
        try:
            return JobOptions.from_args(args, defaults=JobOptions.from_settings(self), variables=self._ipython.user_ns,
                                        local_model=local_model)
        except OptionError as e:
            raise UsageError(str(e)) from None

    def _guest(self, options: JobOptions, path: str | None = None, *, cell: str | None = None,
               lang: str | None = None) -> GuestSource:
        """The guest file at ``path``, or the cell's source, through the commands' one loader."""
        # A cell gets one blank line first, so the compiler's line numbers are the cell's.
        source = None if cell is None else "\n" + cell
        try:
            guest = load_guest(options, path, sys.stderr, source=source, lang=lang, heading="",
                               notebook=self._in_kernel())
        except OptionError as e:
            raise UsageError(str(e)) from None
        if guest is None:
            raise GuestDoesNotCompile("the guest does not compile (the compiler's message is above)")
        return guest

    def start_job(self, guest: GuestSource, options: JobOptions) -> Job:
        spec = options.spec(guest)
        try:
            backend = spec.model.backend()
        except ModelError as e:  # a hf: model that cannot be found or fetched
            raise UsageError(f"--model {options.model}: {e}") from None
        return Job(spec, backend=backend)

    # -- running and showing --------------------------------------------------------------

    def _in_kernel(self) -> bool:
        return getattr(self.shell, "kernel", None) is not None

    def _use_widgets(self) -> bool:
        return self.view == "widget" or (self.view == "auto" and self._in_kernel())

    def _job_view(self, job, args):
        """The live view of ``job`` (a Job or a Playback), shown and started; None where no widget is shown."""
        if args.quiet or not self._use_widgets():
            return None
        from tensorjob_jupyter.frontends.view.widget import JobView  # deferred: ipywidgets, only for a view

        view = JobView(job, refresh_hz=min(20.0, self.refresh_hz)).show()
        view.start()
        return view

    def run_and_show(self, job: Job, args) -> "Envelope | Job":
        """Start ``job`` with its view (or, without widgets, its summary at the end); its envelope once it has
        ended -- or, with ``--bg``, the running job at once."""
        view = self._job_view(job, args)
        job.start()
        if args.bg:
            if not args.quiet and view is None:
                job.add_done_callback(lambda j: print(summary(j.name, j.envelope)))
            return job
        # A job being debugged with no view to click -- or whose clicks cannot act while the cell waits
        # (ipykernel without comm routing: side_channel) -- is driven from a line prompt instead.
        envelope = self._wait(job, prompt=job.debugging and (view is None or not view.clicks_off_main_thread))
        if view is not None:
            view.join(10)
        elif not args.quiet:
            print(summary(job.name, envelope))
        return envelope

    def _wait(self, job: Job, *, prompt: bool = False) -> Envelope:
        """Wait for the job; a kernel interrupt (KeyboardInterrupt) cancels it.

        The view's Cancel and debug buttons keep working meanwhile: their
        clicks are handled on a side thread (see ``view.side_channel``).
        ``prompt``: a job being debugged with no view to click is driven from
        a line prompt (``prompt.prompt``; no input: it runs on).
        """
        try:
            if prompt:
                debug_prompt(job, read_line=_input_line, write=lambda text: print(text, end="", flush=True))
        except KeyboardInterrupt:
            job.cancel()
        wait_or_cancel(job.wait_done, job.cancel)
        return job.wait()

    def _run(self, job: Job, args) -> "CellEnvelope | Job":
        """A cell's (or ``run``'s) job run to its end: the envelope as the value and in ``--out``; a failure
        raised after the view has shown it, unless ``--no-raise``."""
        if args.out and args.bg:
            job.add_done_callback(lambda j: self._ipython.user_ns.__setitem__(args.out, j.envelope))
        outcome = self.run_and_show(job, args)
        if isinstance(outcome, Job):  # --bg: the running job
            return outcome
        value = self._value(outcome, args)
        if not value.ok and not args.no_raise:
            raise JobFailed(job.name, value)
        return value

    def _value(self, envelope: Envelope, args) -> CellEnvelope:
        """The envelope as a cell's value, stored in ``--out``; not shown again where the view showed it."""
        value = CellEnvelope.of(envelope, shown_in=None if args.quiet else self._ipython.execution_count)
        if args.out:
            self._ipython.user_ns[args.out] = value
        return value

    # -- the magics -------------------------------------------------------------------------

    @magic_arguments(name="%tensorjob")
    @shared_arguments(line=False)
    @no_var_expand
    @cell_magic("tensorjob")  # type: ignore[arg-type]  # IPython types cell_magic(name) as "_F | decorator"
    def tensorjob_cell(self, line: str, cell: str):
        """Compile this cell (C, Zig or WAT) to a guest and run it as a tensor job.

        The cell waits for the job -- interrupt the kernel to cancel -- and its
        value is the job's envelope (.status, .result, .error, .usage), which
        --out NAME also stores. A job that fails or is cancelled raises a
        one-line JobFailed once the view has shown it, so Run All stops
        there; --no-raise returns the envelope instead. With --bg the value is
        the running Job. Compiles are cached by content in the compile cache
        (see %tensorjob cache); --force compiles again. %%tensorjob map --over
        MANIFEST --run-dir DIR [options] maps the cell's guest over a manifest
        (see %tensorjob?).

        The line is read as a shell reads it: quote a value once. --input takes
        JSON, $name (a notebook variable) or a Python literal:
        --input '{"path": "a.txt"}' or --input "{'path': 'a.txt', 'n': 3}".

        --debug starts the job paused before cf_init, and --break-on infer,open,...
        pauses it before the guest's commands of those kinds: the live view's
        debug bar (Continue, Step, Step to next infer, Pause) steps it while the cell
        waits, its panel shows the command about to be carried out, the last
        one and the event that answered it, open handles and guest memory.
        With --bg, step from later cells: job.step(), job.step("infer"),
        job.resume(), job.pause(), job.paused, job.debug_state.
        """
        if line.split(None, 1)[:1] == ["map"]:
            return self._map_cell(line, cell)
        args = self._parse(self.tensorjob_cell, line)
        if not cell.strip():
            raise UsageError("the cell is empty: write the guest's C, Zig or WAT source below %%tensorjob")
        with refusals_as_usage_errors():
            options = self._options(args)
            guest = self._guest(options, cell=cell, lang=args.lang)
            return self._run(self.start_job(guest, options), args)

    @magic_arguments(name="tensorjob")
    @argument("action", choices=["run", "map", "jobs", "cancel", "cache", "runs", "show", "replay", "review"],
              help="run PATH | map PATH | jobs | cancel ID | cache [clear] | runs | show RUN | replay PATH --from RUN"
                   " | review RUN_DIR")
    @argument("target", nargs="?", default=None,
              help="the guest file for run, map and replay, the job id for cancel, clear for cache, the run for "
                   "show, the map's run folder (or $name, a MapResult) for review")
    @argument("--speed", type=float, default=0.0, metavar="S",
              help="show: 0 at once (default), 1 at the recorded speed, 2 twice as fast")
    @argument("--limit", type=int, default=None, metavar="N", help="runs: the newest N runs (0: all)")
    @argument("--table", action="store_true",
              help="review: the values as a table, doubtful first (default: the review widget, one value at a time)")
    @argument("--status", default=None, metavar="S", help="runs: only runs with this status")
    @argument("--prune", type=int, default=None, metavar="KEEP", help="runs: delete all but the newest KEEP runs")
    @magic_flags()  # map and replay: flags.py, the table tensorjob map and tensorjob replay read too
    @shared_arguments(line=True)
    @no_var_expand
    @line_magic("tensorjob")  # type: ignore[arg-type]  # IPython types line_magic(name) as "_F | decorator"
    def tensorjob_line(self, line: str):
        """Run a guest file, map one over a manifest, list or cancel jobs, see the compile cache.

        %tensorjob run PATH [options]   run a .py, .wasm, .c, .zig or .wat file as a job; the value is
                                        its envelope, and a failed or cancelled job raises JobFailed
                                        (--no-raise: return the envelope)
        %tensorjob map PATH --over MANIFEST --run-dir DIR [options]
                                        run the guest once per manifest line (resumable;
                                        --concurrency N|auto locally, --cluster ADDRESS on Dask;
                                        --restart starts the run folder over); the value is the
                                        MapResult (.rows(), .to_pandas()). In a cell,
                                        %%tensorjob map --over MANIFEST --run-dir DIR maps the cell
        %tensorjob jobs                 list this kernel's jobs
        %tensorjob cancel ID            cancel a running job
        %tensorjob cache [clear]        where compiled guests are cached ($TENSORJOB_CACHE, else
                                        ~/.cache/tensorjob/wasm), and how much; clear empties it
        %tensorjob runs [--limit N] [--status S] [--prune KEEP]
                                        past runs in the runs folder, newest first
        %tensorjob show RUN [--speed S] show a past run again in the live view
        %tensorjob review RUN_DIR [--table]
                                        a map's values doubtful first (found in no window its item
                                        read, then the lowest confidence), one at a time in the review
                                        widget: a accept, c correct, n null, s skip, b back (RUN_DIR
                                        may be $name, a MapResult); --table: the rows, as a table
        %tensorjob replay PATH --from RUN [--live] [options]
                                        run a guest against a recorded run, with no model; the
                                        value is the ReplayReport (same_result, divergence, ...)
        %tensorjob replay PATH --map RUN_DIR [--live] [--run-dir OUT] [--fail-under X]
                                        a changed guest over a recorded map, each item against its
                                        own recording; the value is the MapReplay (.to_pandas(),
                                        .needs_model, .passed(X))
        Maps with expected answers: --expected FILE.jsonl --scorer json_fields (or $name, a
        function (result, expected) -> score); --max-total-tokens N; --estimate (runs nothing);
        --deterministic (answers that do not depend on what else runs).

        Debugging: run (or a cell) with --debug starts paused before cf_init, --break-on
        infer,open,... pauses before those commands (fail: also before any failure is final);
        the view's debug bar steps it (Continue, Step, Step to next infer, Pause) even while the cell
        waits, and with --bg later cells call job.step(), job.step("infer"), job.resume(),
        job.pause(), job.paused, job.debug_state. --max-paused-s S bounds one pause (paused time
        does not count against --timeout). A finished view has a slider over its events:
        drag it to see the job as it was at any event.
        """
        args = self._parse(self.tensorjob_line, line)
        if args.lang is not None:
            raise UsageError("--lang names a cell's language: %%tensorjob --lang c, or %%tensorjob map --lang c")
        with refusals_as_usage_errors():
            return self._line_action(args)

    def _line_action(self, args):
        check_placed(args, args.action)  # a map's flag on a run, --run-dir on a replay without --map: refused
        if args.action == "review":
            return self._review(args.target, table=args.table)
        if args.action == "runs":
            return self._runs(args)
        if args.action == "show":
            return self._show(args)
        if args.action == "replay":
            return self._replay(args)
        if args.action == "jobs":
            return self._list_jobs()
        if args.action == "cache":
            return self._cache(args.target)
        if args.action == "cancel":
            return self._cancel(args.target)
        if not args.target:
            raise UsageError(f"{args.action} needs a guest file: %tensorjob {args.action} PATH")
        if args.action == MAP:
            check_required(args, MAP)  # --over and --run-dir, before the guest, as tensorjob map's parser asks
        options = self._options(args, local_model=not (args.action == "map" and args.cluster))
        guest = self._guest(options, args.target)
        if args.action == "map":
            return self._map(guest, options, args)
        return self._run(self.start_job(guest, options), args)

    # -- maps -------------------------------------------------------------------------------------

    def _map_cell(self, line: str, cell: str) -> "MapResult | MapEstimate | MapRun":
        """``%%tensorjob map --over M --run-dir D [options]``: the cell's guest mapped over a manifest."""
        args = self._parse(self.tensorjob_line, line)
        if args.target:
            raise UsageError("%%tensorjob map takes its guest from the cell: %%tensorjob map --over MANIFEST "
                             "--run-dir DIR")
        if not cell.strip():
            raise UsageError("the cell is empty: write the guest's C, Zig or WAT source below %%tensorjob map")
        with refusals_as_usage_errors():
            check_placed(args, MAP)
            check_required(args, MAP)
            options = self._options(args, local_model=not args.cluster)
            return self._map(self._guest(options, cell=cell, lang=args.lang), options, args)

    def _map(self, guest: GuestSource, options: JobOptions, args) -> "MapResult | MapEstimate | MapRun":
        if getattr(args, "input", None) is not None:
            raise UsageError("map takes each item's input from its manifest, not --input")
        if getattr(args, "debug", None) or getattr(args, "break_on", None):
            raise UsageError("map does not debug its items: debug one item's input with "
                             "%tensorjob run PATH --debug --input '...'")
        if args.estimate:
            estimate = estimate_map(options.map_spec(guest), map_spec(args))
            if args.out:
                self._ipython.user_ns[args.out] = estimate
            return estimate
        run = start_map(options.map_spec(guest), map_spec(args, scorer=self._scorer(args)))
        for note in run.notes:  # even --quiet: it says why a guest's open there is refused
            print(note, file=sys.stderr)
        view = None
        if not args.quiet and self._use_widgets():
            from tensorjob_jupyter.frontends.view.map_widget import MapView  # deferred: ipywidgets, only for a view

            view = MapView(run, guest.name, refresh_hz=min(20.0, self.refresh_hz)).show()
            view.start()
        if args.bg:
            return run
        wait_or_cancel(run.wait_done, run.cancel)
        result = run.wait()
        if view is not None:
            view.join(10)
        elif not args.quiet:
            print(map_summary(guest.name, result))
            for cascaded in summary_lines(result.run_dir):  # a cascade's sample, bound and threshold
                print(for_terminal(cascaded, one_line=True))
        if args.out:
            self._ipython.user_ns[args.out] = result
        return result

    # -- past runs ---------------------------------------------------------------------------

    def _runs_dir(self, args) -> str | None:
        return self._options(args).runs

    def _run_arg(self, text: str | None, what: str):
        """A RUN argument: an id, a path, or ``$name`` (a variable holding one, or a Job)."""
        if not text:
            raise UsageError(f"{what} needs a run: an id (see %tensorjob runs), a run folder, or $name")
        text = text.strip().strip("'\"")
        if text.startswith("$") and text[1:].isidentifier():
            if text[1:] not in self._ipython.user_ns:
                raise UsageError(f"no variable named {text[1:]!r} in the notebook")
            value = self._ipython.user_ns[text[1:]]
            job = getattr(value, "job", None)  # a ReplayReport
            return job if job is not None and hasattr(job, "run_dir") else value
        return text

    def _review(self, target: str | None, *, table: bool = False) -> Any:
        """``%tensorjob review``: the review widget of a run folder or of a ``$name`` MapResult (``ReviewQueue``),
        or with ``--table`` its ``MapResult.review()``."""
        if not target:
            raise UsageError("review needs a map's run folder: %tensorjob review RUN_DIR (or $name, a MapResult)")
        text = target.strip().strip("'\"")
        if text.startswith("$") and text[1:].isidentifier():
            value = self._ipython.user_ns.get(text[1:])
            if not isinstance(value, MapResult):
                raise UsageError(f"{text} is not a MapResult (the value of %tensorjob map)")
            return ReviewRows(value.review()) if table else review_widget(value)
        if table:
            return ReviewRows(map_rows(text, review=True, what="review"))
        try:
            return review_widget(MapResult.read(text))
        except (MapError, ReviewError, OSError) as e:
            raise UsageError(f"review {text}: {e}") from None

    def _runs(self, args):
        runs = self._runs_dir(args)
        if args.prune is not None:
            print(prune(args.prune, runs, status=args.status))
            return None
        listing, _total = find_runs(runs, status=args.status, limit=args.limit)
        return listing

    def _show(self, args) -> CellEnvelope:
        """A past run shown again: its view (or summary); the value is its envelope (a past failure raises
        nothing: it is history)."""
        widgets = not args.quiet and self._use_widgets()
        playback = open_playback(self._run_arg(args.target, "show"), self._runs_dir(args), speed=args.speed,
                                 watched=widgets)
        view = self._job_view(playback, args)
        if view is None:
            last: dict = {}
            for last in playback.events():
                pass
            envelope = last.get("envelope") or {"status": "interrupted"}
        else:
            if not wait_or_cancel(lambda seconds: view.join(seconds) or not view.alive, playback.cancel):
                view.join(10)
            state = view.state
            envelope = {"status": state.status, "usage": state.usage}
            if state.error:
                envelope["error"] = state.error
            if state.has_result:
                envelope["result"] = state.result
        env = Envelope.from_json({**envelope, "usage": envelope.get("usage") or {}})
        if view is None and not args.quiet:
            print(summary(playback.name, env))
        return self._value(env, args)

    def _scorer(self, args):
        """``--scorer $name``: the notebook's function; a name stays a name (checked by the map)."""
        text = (args.scorer or "").strip().strip("'\"")
        if not (text.startswith("$") and text[1:].isidentifier()):
            return None
        if text[1:] not in self._ipython.user_ns:
            raise UsageError(f"no variable named {text[1:]!r} in the notebook")
        scorer = self._ipython.user_ns[text[1:]]
        if not callable(scorer):
            raise UsageError(f"--scorer {text}: {text[1:]} is not a function (result, expected) -> score")
        return scorer

    def _replay_map(self, args) -> "MapReplay | MapReplayRun":
        """``%tensorjob replay PATH --map RUN_DIR``: the replay of a changed guest over a recorded map."""
        if args.from_run:
            raise UsageError("replay takes --from RUN (one run) or --map RUN_DIR (a map), not both")
        gate = fail_under(args.fail_under)
        options = self._options(args)
        scorer = self._scorer(args)
        overrides = options.overrides()
        replay_spec = map_replay_spec(args, run=self._run_arg(args.map_run, "replay --map"), scorer=scorer)
        replay_run = start_map_replay(self._guest(options, args.target), replay_spec, overrides)
        if overrides.read is None and not args.recorded_grants:  # nothing granted: say so before its items find out
            for line in replay_run.said:
                print(line, file=sys.stderr)
        view = None
        if not args.quiet and self._use_widgets():
            from tensorjob_jupyter.frontends.view.map_widget import MapView  # deferred: ipywidgets, only for a view

            view = MapView(replay_run.run, f"replay of {args.target}", refresh_hz=min(20.0, self.refresh_hz)).show()
            view.start()
        if args.bg:
            return replay_run
        wait_or_cancel(replay_run.run.wait_done, replay_run.cancel)
        replay = replay_run.wait()
        if view is not None:
            view.join(10)
        elif not args.quiet:
            print("\n".join(replay.lines()))
        if args.out:
            self._ipython.user_ns[args.out] = replay
        if gate is not None:
            passed, line = replay.gate(gate)
            if not passed:
                raise GateFailed(line, replay)
        return replay

    def _replay(self, args) -> "ReplayReport | MapReplay | MapReplayRun | Job":
        if not args.target:
            raise UsageError("replay needs a guest file: %tensorjob replay PATH --from RUN (or --map RUN_DIR)")
        if args.map_run:
            return self._replay_map(args)
        options = self._options(args)
        job = replay_job(self._guest(options, args.target), self._run_arg(args.from_run, "replay --from"),
                         options.overrides(), live=args.live, recorded_grants=bool(args.recorded_grants),
                         err=sys.stderr)
        if args.out and args.bg:
            job.add_done_callback(lambda j: self._ipython.user_ns.__setitem__(args.out, j.report))
        self.run_and_show(job, args)
        if args.bg:
            return job
        report = job.report
        assert report is not None, "a replay that has ended has its report"  # run_and_show waited for the end
        if not args.quiet:
            for line in report.lines():
                print(for_terminal(line, one_line=True))
        if args.out:
            self._ipython.user_ns[args.out] = report
        return report

    # -- jobs and the compile cache -----------------------------------------------------------------

    def _cancel(self, job_id: str | None) -> None:
        if not job_id:
            raise UsageError("cancel needs a job id (see %tensorjob jobs)")
        try:
            job = get_job(job_id)
        except KeyError as e:
            raise UsageError(str(e.args[0])) from None
        job.cancel()
        print(f"cancelling {job.id} ({job.name})")
        return None

    def _cache(self, what: str | None) -> None:
        if what not in (None, "clear"):
            raise UsageError("cache takes nothing, or clear: %tensorjob cache clear")
        if what == "clear":
            files, size = clear_cache()
            print(f"removed {files} cached modules ({size} bytes) from {cache_dir()}")
        else:
            files, size = cache_usage()
            print(f"{cache_dir()}: {files} cached modules, {size} bytes (%tensorjob cache clear empties it)")

    def _list_jobs(self) -> None:
        rows = jobs()
        if not rows:
            print("no jobs yet")
            return None
        for job in rows:
            envelope = job.envelope
            extra = f"  {envelope.error.code}" if envelope is not None and envelope.error is not None else ""
            status = "paused" if job.paused else job.status.value
            print(for_terminal(f"{job.id}  {status:<9}  {job.name}{extra}", one_line=True))
        return None


def _input_line() -> str | None:
    """A line typed in answer to the debug prompt; None when the front end cannot ask (nbval, no stdin)."""
    try:
        return input()
    except KeyboardInterrupt:
        raise
    except Exception:  # noqa: BLE001 - EOFError, StdinNotImplementedError, pytest's captured stdin
        return None


def load_ipython_extension(ipython) -> None:
    ipython.register_magics(TensorJob)


def unload_ipython_extension(ipython) -> None:
    manager = ipython.magics_manager
    for kind in ("line", "cell"):
        manager.magics[kind].pop("tensorjob", None)
    manager.registry.pop("TensorJob", None)


__all__ = [
    "JobSettings", "QUOTING", "MAX_REFUSAL_CHARS", "refusal_line", "shared_arguments", "refusals_as_usage_errors",
    "TensorJob", "load_ipython_extension", "unload_ipython_extension"
]

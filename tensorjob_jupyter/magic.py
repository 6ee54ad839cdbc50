"""``%%tensorjob`` and ``%tensorjob``: tensor jobs from a notebook cell.

``%%tensorjob [options]`` compiles the cell (C, Zig or WAT, by ``--lang`` or
recognised from the text) like ``%%cython`` does: cached by a hash of the
source and flags (``--force`` compiles again; ``--cflags``/``--zigflags`` pass
flags; warnings are shown even when the compile succeeds). It starts the job
on a background thread against the kernel's shared model and shows the live
view. By default the cell waits for the job -- its value is the result, and a
kernel interrupt cancels the job cleanly -- so a notebook reads top to bottom
and nbval sees finished output; ``--bg`` returns the ``Job`` at once instead.
``%tensorjob run PATH`` does the same for a ``.wasm`` or source file,
``%tensorjob map`` runs a guest over a manifest, ``%tensorjob jobs`` lists
jobs, ``%tensorjob cancel ID`` stops one and ``%tensorjob cache [clear]``
shows or empties the compile cache. Past runs: ``%tensorjob runs`` lists the
runs folder (an HTML table in a notebook; ``--prune KEEP``), ``%tensorjob show
RUN`` plays a transcript through the live view (``--speed 1``: as fast as it
happened), and ``%tensorjob replay PATH --from RUN`` runs a guest against a
recorded run with no model (``replay.py``); its value is the ``ReplayReport``.
A RUN may be ``$name``: a notebook variable holding an id, a path or a Job.

``--debug`` starts the job paused before ``cf_init`` and ``--break-on
infer,open,...`` pauses it before such commands (``debug.py``): the live view
gains a debug bar (Continue, Step, Step to next infer, Pause) whose clicks act
while the cell waits, and a panel with the pause; with ``--bg`` the ``Job``
is stepped from later cells (``job.step()``, ``job.resume()``). Where no
widget view is shown (``--quiet``, ``TensorJob.view = "text"``, terminal
IPython) the cell asks at each pause on a line prompt instead. A finished
job's view has a slider that re-folds it to any of its events (scrubbing),
and so has a run shown again with ``%tensorjob show``.

The job options are ``options.py``'s table, shared with the command line and
the Python API; their defaults are traitlets on the ``TensorJob``
configurable, so they can be set in ``ipython_config.py``
(``c.TensorJob.model_path = ...``) or with ``%config TensorJob.max_tokens =
512``. Mistakes in options or JSON are one ``UsageError`` line; compile
errors show the compiler's message with the cell's own line numbers (line 1
is the ``%%tensorjob`` line).
"""

from __future__ import annotations

import sys
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class, no_var_expand
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from IPython.display import display
from traitlets import CaselessStrEnum, Float
from traitlets.config import Configurable

from . import options as job_options
from .compile import CompileError, GuestSource, cache_dir, cache_usage, clear_cache
from .inference.base import ModelError
from .inference.lazy import model_backend
from .abi import Envelope
from .history import RunError
from .jobs import Job, get_job, jobs
from .replay import ReplayError
from .transcript import TranscriptError
from .options import JobOptions, OptionError, job_arguments
from .text import for_terminal
from .view.summary import map_summary, summary

#: The job options' defaults, one traitlet per row of ``options.OPTIONS`` that has one.
JobSettings = type("JobSettings", (Configurable,), {"__doc__": "Defaults of the job options.",
                                                    **job_options.traitlets()})


@magics_class
class TensorJob(Magics, JobSettings):
    """Run sandboxed WebAssembly tensor jobs from cells (configure as ``c.TensorJob.*``)."""

    refresh_hz = Float(10.0, help="live view updates per second (at most 20)").tag(config=True)
    view = CaselessStrEnum(["auto", "widget", "text"], default_value="auto",
                           help="auto: widgets in a kernel, plain text elsewhere").tag(config=True)

    # -- building a job ---------------------------------------------------------------

    def _options(self, args, *, local_model: bool = True) -> JobOptions:
        """The options given, over the traitlets' defaults; any mistake is one UsageError line."""
        try:
            return JobOptions.from_args(args, defaults=JobOptions.from_settings(self), variables=self.shell.user_ns,
                                        local_model=local_model)
        except OptionError as e:
            raise UsageError(str(e)) from None

    def start_job(self, guest: GuestSource, options: JobOptions) -> Job:
        if guest.warnings:
            print(guest.warnings, file=sys.stderr)
        kwargs = options.job_kwargs()
        try:
            return Job(guest, backend=model_backend(kwargs.pop("model"), **kwargs.pop("model_options")), **kwargs)
        except ModelError as e:  # a hf: model that cannot be found or fetched
            raise UsageError(f"--model {options.model}: {e}") from None

    # -- running and showing --------------------------------------------------------------

    def _in_kernel(self) -> bool:
        return getattr(self.shell, "kernel", None) is not None

    def _use_widgets(self) -> bool:
        return self.view == "widget" or (self.view == "auto" and self._in_kernel())

    def run_and_show(self, job: Job, args) -> Any:
        view = None
        if not args.quiet and self._use_widgets():
            from .view.widget import JobView

            view = JobView(job, refresh_hz=min(20.0, self.refresh_hz))
            display(view)
            view.start()
        if args.out and args.bg:
            job.add_done_callback(lambda j: self.shell.user_ns.__setitem__(args.out, j.result))
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
        if not args.quiet:
            print(summary(job.name, envelope, with_result=view is None))
        if args.out and envelope.ok:
            self.shell.user_ns[args.out] = envelope.result
        return envelope.result if envelope.ok else None

    def _wait(self, job: Job, *, prompt: bool = False):
        """Wait for the job; a kernel interrupt (KeyboardInterrupt) cancels it.

        The view's Cancel and debug buttons keep working meanwhile: their
        clicks are handled on a side thread (see ``view.side_channel``).
        ``prompt``: a job being debugged with no view to click is driven from
        a line prompt (``debug.prompt``; no input: it runs on).
        """
        try:
            if prompt:
                from .debug import prompt as debug_prompt

                debug_prompt(job, read_line=_input_line, write=lambda text: print(text, end="", flush=True))
            while not job.done:
                job.wait_done(0.1)
        except KeyboardInterrupt:
            job.cancel()
        return job.wait()

    # -- the magics -------------------------------------------------------------------------

    @magic_arguments()
    @argument("--lang", choices=["c", "zig", "wat"], default=None,
              help="the cell's language (default: recognised from the text)")
    @argument("--out", default=None, metavar="NAME", help="store the result in the notebook as NAME")
    @argument("--bg", action="store_true", help="return the Job at once; the job runs on in the background")
    @argument("--quiet", action="store_true", help="no live view and no summary; just the value")
    @job_arguments()
    @no_var_expand
    @cell_magic("tensorjob")
    def tensorjob_cell(self, line: str, cell: str):
        """Compile this cell (C, Zig or WAT) to a guest and run it as a tensor job.

        The cell waits for the job and its value is the result; interrupt the
        kernel to cancel. With --bg the value is the running Job. Compiles are
        cached by content in the compile cache (see %tensorjob cache); --force
        compiles again.

        --debug starts the job paused before cf_init, and --break-on infer,open,...
        pauses it before the guest's commands of those kinds: the live view's
        debug bar (Continue, Step, Step to next infer, Pause) steps it while the cell
        waits, its panel shows the command about to be carried out, the last
        one and the event that answered it, open handles and guest memory.
        With --bg, step from later cells: job.step(), job.step("infer"),
        job.resume(), job.pause(), job.paused, job.debug_state.
        """
        args = self._parse(self.tensorjob_cell, line)
        if not cell.strip():
            raise UsageError("the cell is empty: write the guest's C, Zig or WAT source below %%tensorjob")
        options = self._options(args)
        try:
            # One blank line first, so the compiler's line numbers are the cell's.
            guest = GuestSource.from_text("\n" + cell, lang=args.lang, name="cell", cflags=options.cflags,
                                          zigflags=options.zigflags, force=options.force)
        except CompileError as e:
            print(str(e), file=sys.stderr)
            return None
        except ValueError as e:
            raise UsageError(str(e)) from None
        return self.run_and_show(self.start_job(guest, options), args)

    @magic_arguments()
    @argument("action", choices=["run", "map", "jobs", "cancel", "cache", "runs", "show", "replay"],
              help="run PATH | map PATH | jobs | cancel ID | cache [clear] | runs | show RUN | replay PATH --from RUN")
    @argument("target", nargs="?", default=None,
              help="the guest file for run, map and replay, the job id for cancel, clear for cache, the run for show")
    @argument("--from", dest="from_run", default=None, metavar="RUN",
              help="replay: the recorded run (an id, a run folder, or $name)")
    @argument("--live", action="store_true", help="replay: from the first divergence on, run the model")
    @argument("--speed", type=float, default=0.0, metavar="S",
              help="show: 0 at once (default), 1 at the recorded speed, 2 twice as fast")
    @argument("--limit", type=int, default=None, metavar="N", help="runs: the newest N runs")
    @argument("--status", default=None, metavar="S", help="runs: only runs with this status")
    @argument("--prune", type=int, default=None, metavar="KEEP", help="runs: delete all but the newest KEEP runs")
    @argument("--over", default=None, metavar="MANIFEST", help="map: the JSONL manifest, one input per line")
    @argument("--run-dir", default=None, metavar="DIR", help="map: the run folder (results.jsonl, failures.jsonl)")
    @argument("--concurrency", type=int, default=None, metavar="N", help="map: items at once (default 4)")
    @argument("--cluster", default=None, metavar="ADDRESS", help="map: a Dask scheduler to run the items on")
    @argument("--retry-failed", action="store_true", help="map: run items that failed before again")
    @argument("--out", default=None, metavar="NAME", help="store the result in the notebook as NAME")
    @argument("--bg", action="store_true", help="return the Job (or map) at once; it runs on in the background")
    @argument("--quiet", action="store_true", help="no live view and no summary; just the value")
    @job_arguments()
    @no_var_expand
    @line_magic("tensorjob")
    def tensorjob_line(self, line: str):
        """Run a guest file, map one over a manifest, list or cancel jobs, see the compile cache.

        %tensorjob run PATH [options]   run a .wasm, .c, .zig or .wat file as a job
        %tensorjob map PATH --over MANIFEST --run-dir DIR [options]
                                        run the guest once per manifest line (resumable;
                                        --concurrency N locally, --cluster ADDRESS on Dask)
        %tensorjob jobs                 list this kernel's jobs
        %tensorjob cancel ID            cancel a running job
        %tensorjob cache [clear]        where compiled guests are cached ($TENSORJOB_CACHE, else
                                        ~/.cache/tensorjob/wasm), and how much; clear empties it
        %tensorjob runs [--limit N] [--status S] [--prune KEEP]
                                        past runs in the runs folder, newest first
        %tensorjob show RUN [--speed S] show a past run again in the live view
        %tensorjob replay PATH --from RUN [--live] [options]
                                        run a guest against a recorded run, with no model; the
                                        value is the ReplayReport (same_result, divergence, ...)

        Debugging: run (or a cell) with --debug starts paused before cf_init, --break-on
        infer,open,... pauses before those commands (fail: also before any failure is final);
        the view's debug bar steps it (Continue, Step, Step to next infer, Pause) even while the cell
        waits, and with --bg later cells call job.step(), job.step("infer"), job.resume(),
        job.pause(), job.paused, job.debug_state. --max-paused-s S bounds one pause (paused time
        does not count against --timeout). A finished view has a slider over its events:
        drag it to see the job as it was at any event.
        """
        args = self._parse(self.tensorjob_line, line)
        if args.action in ("runs", "show", "replay"):
            try:
                return getattr(self, "_" + args.action)(args)
            except (RunError, TranscriptError, ReplayError) as e:
                raise UsageError(" ".join(str(e).split())) from None
        if args.action == "jobs":
            return self._list_jobs()
        if args.action == "cache":
            return self._cache(args.target)
        if args.action == "cancel":
            if not args.target:
                raise UsageError("cancel needs a job id (see %tensorjob jobs)")
            try:
                job = get_job(args.target)
            except KeyError as e:
                raise UsageError(str(e.args[0])) from None
            job.cancel()
            print(f"cancelling {job.id} ({job.name})")
            return None
        if not args.target:
            raise UsageError(f"{args.action} needs a guest file: %tensorjob {args.action} PATH")
        options = self._options(args, local_model=not (args.action == "map" and args.cluster))
        try:
            guest = options.guest(args.target)
        except CompileError as e:
            print(str(e), file=sys.stderr)
            return None
        except (FileNotFoundError, ValueError) as e:
            raise UsageError(str(e)) from None
        if args.action == "map":
            return self._map(guest, options, args)
        return self.run_and_show(self.start_job(guest, options), args)

    # -- past runs ---------------------------------------------------------------------------

    def _runs_dir(self, args) -> str | None:
        return self._options(args).runs

    def _run_arg(self, text: str | None, what: str):
        """A RUN argument: an id, a path, or ``$name`` (a variable holding one, or a Job)."""
        if not text:
            raise UsageError(f"{what} needs a run: an id (see %tensorjob runs), a run folder, or $name")
        text = text.strip().strip("'\"")
        if text.startswith("$") and text[1:].isidentifier():
            if text[1:] not in self.shell.user_ns:
                raise UsageError(f"no variable named {text[1:]!r} in the notebook")
            value = self.shell.user_ns[text[1:]]
            job = getattr(value, "job", None)  # a ReplayReport
            return job if job is not None and hasattr(job, "run_dir") else value
        return text

    def _runs(self, args):
        from .history import list_runs, prune

        runs = self._runs_dir(args)
        if args.prune is not None:
            print(prune(args.prune, runs, status=args.status))
            return None
        return list_runs(runs, status=args.status, limit=args.limit)

    def _show(self, args):
        from .history import resolve_run
        from .show import Playback

        if not args.speed >= 0:
            raise UsageError("--speed must be 0 (at once) or more")
        path = resolve_run(self._run_arg(args.target, "show"), self._runs_dir(args))
        widgets = not args.quiet and self._use_widgets()
        playback = Playback(path, speed=args.speed if widgets else 0.0)  # no one watches a pause in text
        if not widgets:
            last: dict = {}
            for last in playback.events():
                pass
            envelope = last.get("envelope") or {"status": "interrupted"}
        else:
            from .view.widget import JobView

            for _ in playback.reader:  # a damaged transcript is one UsageError, before anything is shown
                pass
            view = JobView(playback, refresh_hz=min(20.0, self.refresh_hz))
            display(view)
            view.start()
            try:
                view.join()
            except KeyboardInterrupt:
                playback.cancel()
                view.join(10)
            state = view.state
            envelope = {"status": state.status, "usage": state.usage}
            if state.error:
                envelope["error"] = state.error
            if state.has_result:
                envelope["result"] = state.result
        env = Envelope.from_json({**envelope, "usage": envelope.get("usage") or {}})
        if not args.quiet:
            print(summary(playback.name, env, with_result=not widgets))
        if args.out and env.ok:
            self.shell.user_ns[args.out] = env.result
        return env.result if env.ok else None

    def _replay(self, args):
        from .replay import ReplayJob, load_recording, options_for

        if not args.target:
            raise UsageError("replay needs a guest file: %tensorjob replay PATH --from RUN")
        defaults = JobOptions.from_settings(self)
        recording = load_recording(self._run_arg(args.from_run, "replay --from"), self._runs_dir(args))
        try:
            kwargs, options = options_for(recording, args, defaults=defaults, variables=self.shell.user_ns)
        except OptionError as e:
            raise UsageError(str(e)) from None
        try:
            guest = options.guest(args.target)
        except CompileError as e:
            print(str(e), file=sys.stderr)
            return None
        except (FileNotFoundError, ValueError) as e:
            raise UsageError(str(e)) from None
        if guest.warnings:
            print(guest.warnings, file=sys.stderr)
        job = ReplayJob(guest, recording, live=args.live, **kwargs)
        value_args = type(args)(**{**vars(args), "out": None})  # --out stores the result, below
        self.run_and_show(job, value_args)
        if args.bg:
            if args.out:
                job.add_done_callback(lambda j: self.shell.user_ns.__setitem__(args.out, j.result))
            return job
        report = job.report
        if not args.quiet:
            for line in report.lines():
                print(for_terminal(line, one_line=True))
        if args.out and report.envelope.ok:
            self.shell.user_ns[args.out] = report.result
        return report

    def _cache(self, what: str | None) -> None:
        if what not in (None, "clear"):
            raise UsageError("cache takes nothing, or clear: %tensorjob cache clear")
        if what == "clear":
            files, size = clear_cache()
            print(f"removed {files} cached modules ({size} bytes) from {cache_dir()}")
        else:
            files, size = cache_usage()
            print(f"{cache_dir()}: {files} cached modules, {size} bytes (%tensorjob cache clear empties it)")

    def _map(self, guest: GuestSource, options: JobOptions, args):
        from .fanout import MapError, start_map

        if "input" in vars(args) and args.input is not None:
            raise UsageError("map takes each item's input from its manifest, not --input")
        if getattr(args, "debug", None) or getattr(args, "break_on", None):
            raise UsageError("map does not debug its items: debug one item's input with "
                             "%tensorjob run PATH --debug --input '...'")
        if not args.over or not args.run_dir:
            raise UsageError("map needs --over MANIFEST and --run-dir DIR")
        if guest.warnings:
            print(guest.warnings, file=sys.stderr)
        name = guest.name
        try:
            run = start_map(guest, args.over, args.run_dir, concurrency=args.concurrency, cluster=args.cluster,
                            retry_failed=args.retry_failed, **options.map_kwargs())
        except (MapError, ValueError, OSError) as e:
            raise UsageError(" ".join(str(e).split())) from None
        view = None
        if not args.quiet and self._use_widgets():
            from .view.map_widget import MapView

            view = MapView(run, name, refresh_hz=min(20.0, self.refresh_hz))
            display(view)
            view.start()
        if args.bg:
            return run
        try:
            while not run.done:
                run.wait_for_update(timeout=0.1)
        except KeyboardInterrupt:
            run.cancel()
        result = run.wait()
        if view is not None:
            view.join(10)
        if not args.quiet:
            print(map_summary(name, result))
        if args.out:
            self.shell.user_ns[args.out] = result
        return result

    def _parse(self, func, line: str):
        try:
            return parse_argstring(func, line)
        except UsageError:
            raise
        except SystemExit:  # argparse on --help and the like
            raise UsageError(f"see {func.__name__.replace('_cell', '').replace('_line', '')}? for help") from None

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

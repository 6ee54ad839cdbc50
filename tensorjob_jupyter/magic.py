"""``%%tensorjob`` and ``%tensorjob``: tensor jobs from a notebook cell.

``%%tensorjob [options]`` compiles the cell (C, Zig or WAT, by ``--lang`` or
recognised from the text; cached by content hash, so re-running an unchanged
cell does not compile again), starts the job on a background thread against
the kernel's shared model, and shows the live view. By default the cell waits
for the job -- its value is the result, and a kernel interrupt cancels the job
cleanly -- so a notebook reads top to bottom and nbval sees finished output;
``--bg`` returns the ``Job`` at once instead. ``%tensorjob run PATH`` does the
same for a ``.wasm`` or source file; ``%tensorjob jobs`` lists jobs and
``%tensorjob cancel ID`` stops one.

Defaults live in traitlets on the ``TensorJob`` configurable, so they can be
set in ``ipython_config.py`` (``c.TensorJob.model_path = ...``) or with
``%config TensorJob.refresh_hz = 5``. Mistakes in options or JSON are one
``UsageError`` line; compile errors show the compiler's message with the
cell's own line numbers (line 1 is the ``%%tensorjob`` line).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class, no_var_expand
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from IPython.display import display
from traitlets import Bool, CaselessStrEnum, Float, Int, Unicode

from .compile import CompileError, compile_source, detect_language, load_guest
from .inference.base import Sampler
from .inference.lazy import model_backend
from .jobs import Job, get_job, jobs
from .limits import Limits
from .runner import InferOptions
from .view.summary import map_summary, summary

def _job_options(func):
    """The options shared by ``%%tensorjob`` and ``%tensorjob run``."""
    for arg in reversed([
        argument("--read", action="append", default=[], metavar="PATH",
                 help="grant read access to a file or directory (repeatable)"),
        argument("--fetch", action="append", default=[], metavar="PREFIX",
                 help="let the guest fetch URLs under this http(s) prefix (repeatable)"),
        argument("--input", default=None, metavar="JSON",
                 help="the job input: a JSON value, or $name for a variable of the notebook"),
        argument("--input-file", default=None, metavar="F", help="stage F's bytes for the guest's read-input"),
        argument("--max-tokens", type=int, default=None, metavar="N", help="token budget for the whole job"),
        argument("--timeout", type=float, default=None, metavar="S", help="time limit for the whole job, seconds"),
        argument("--model", default=None, metavar="PATH", help="a GGUF model file (default: TensorJob.model_path, "
                                                                 "else the embedded SmolLM2-135M-Instruct)"),
        argument("--chat", action="store_true", help="apply the model's chat template to each prompt"),
        argument("--out", default=None, metavar="NAME", help="store the result in the notebook as NAME"),
        argument("--bg", action="store_true", help="return the Job at once; the job runs on in the background"),
        argument("--quiet", action="store_true", help="no live view and no summary; just the value"),
    ]):
        func = arg(func)
    return func


@magics_class
class TensorJob(Magics):
    """Run sandboxed WebAssembly tensor jobs from cells (configure as ``c.TensorJob.*``)."""

    model_path = Unicode("", help="GGUF model for jobs; empty means the embedded SmolLM2-135M-Instruct").tag(config=True)
    runs_dir = Unicode("", help="where job transcripts go; empty means $TENSORJOB_RUNS or ~/.tensorjob/runs").tag(
        config=True)
    refresh_hz = Float(10.0, help="live view updates per second (at most 20)").tag(config=True)
    view = CaselessStrEnum(["auto", "widget", "text"], default_value="auto",
                           help="auto: widgets in a kernel, plain text elsewhere").tag(config=True)
    call_timeout_s = Float(Limits.call_timeout_s, help="deadline for each call into the guest").tag(config=True)
    job_timeout_s = Float(Limits.job_timeout_s, help="time limit for a whole job").tag(config=True)
    memory_bytes = Int(Limits.memory_bytes, help="guest linear memory limit").tag(config=True)
    max_tokens = Int(Limits.max_tokens, help="token budget of a job").tag(config=True)
    max_steps = Int(Limits.max_steps, help="commands a guest may return").tag(config=True)
    max_window_bytes = Int(Limits.max_window_bytes, help="largest slice window").tag(config=True)
    fuel = Int(0, help="instruction budget per job (0: no fuel metering)").tag(config=True)
    temperature = Float(0.0, help="sampling temperature (0: greedy)").tag(config=True)
    seed = Int(0, help="sampling seed").tag(config=True)
    chat = Bool(False, help="apply the chat template to prompts by default").tag(config=True)

    # -- building a job ---------------------------------------------------------------

    def _limits(self, args) -> Limits:
        try:
            limits = Limits(call_timeout_s=self.call_timeout_s, job_timeout_s=self.job_timeout_s,
                            memory_bytes=self.memory_bytes, max_tokens=self.max_tokens, max_steps=self.max_steps,
                            max_window_bytes=self.max_window_bytes, fuel=self.fuel or None)
            if args.max_tokens is not None:
                limits = limits.replace(max_tokens=args.max_tokens)
            if args.timeout is not None:
                limits = limits.replace(job_timeout_s=args.timeout)
        except ValueError as e:
            raise UsageError(str(e).replace("limit max_tokens", "--max-tokens").replace(
                "limit job_timeout_s", "--timeout")) from None
        return limits

    def _backend(self, model: str | None):
        path = model or self.model_path or None
        if path is not None and not os.path.isfile(path):
            raise UsageError(f"model file not found: {path}")
        return model_backend(path)

    def _input(self, text: str | None) -> Any:
        if text is None:
            return {}
        text = text.strip()
        if text.startswith("$"):
            name = text[1:]
            if name not in self.shell.user_ns:
                raise UsageError(f"--input ${name}: no variable named {name!r} in the notebook")
            value = self.shell.user_ns[name]
            try:
                json.dumps(value)
            except (TypeError, ValueError) as e:
                raise UsageError(f"--input ${name}: the value is not JSON-serialisable ({e})") from None
            return value
        if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
            text = text[1:-1]
        try:
            return json.loads(text)
        except json.JSONDecodeError as e:
            raise UsageError(f"--input is not valid JSON: {e.msg} at column {e.colno}") from None

    def _reads(self, paths: list[str]) -> list[str]:
        for p in paths:
            if not os.path.exists(p):
                raise UsageError(f"--read {p}: no such file or directory")
        return paths

    def start_job(self, guest: bytes | str, args, name: str) -> Job:
        sampler = Sampler(temperature=self.temperature, seed=self.seed)
        runs_dir = self.runs_dir or None
        fetch = self._fetch_grants(args.fetch)
        return Job(guest, input=self._input(args.input), read=self._reads(args.read), backend=self._backend(args.model),
                   limits=self._limits(args), infer=InferOptions(sampler=sampler, chat=args.chat or self.chat),
                   input_bytes=self._input_bytes(args.input_file), runs_dir=runs_dir, name=name, fetch=fetch)

    def _fetch_grants(self, prefixes: list[str]) -> list[str]:
        from .web import FetchGrants

        try:
            FetchGrants.parse(prefixes)
        except ValueError as e:
            raise UsageError(f"--fetch: {e}") from None
        return prefixes

    def _input_bytes(self, path: str | None) -> bytes:
        if path is None:
            return b""
        try:
            with open(path, "rb") as f:
                return f.read()
        except OSError as e:
            raise UsageError(f"--input-file {path}: {e.strerror}") from None

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
        envelope = self._wait(job)
        if view is not None:
            view.join(10)
        if not args.quiet:
            print(summary(job.name, envelope, with_result=view is None))
        if args.out and envelope.ok:
            self.shell.user_ns[args.out] = envelope.result
        return envelope.result if envelope.ok else None

    def _wait(self, job: Job):
        """Wait for the job; a kernel interrupt (KeyboardInterrupt) cancels it.

        The view's Cancel button keeps working meanwhile: its clicks are
        handled on a side thread (see ``view.side_channel``).
        """
        try:
            while not job.done:
                job.wait_done(0.1)
        except KeyboardInterrupt:
            job.cancel()
        return job.wait()

    # -- the magics -------------------------------------------------------------------------

    @magic_arguments()
    @argument("--lang", choices=["c", "zig", "wat"], default=None,
              help="the cell's language (default: recognised from the text)")
    @_job_options
    @no_var_expand
    @cell_magic("tensorjob")
    def tensorjob_cell(self, line: str, cell: str):
        """Compile this cell (C, Zig or WAT) to a guest and run it as a tensor job.

        The cell waits for the job and its value is the result; interrupt the
        kernel to cancel. With --bg the value is the running Job.
        """
        args = self._parse(self.tensorjob_cell, line)
        if not cell.strip():
            raise UsageError("the cell is empty: write the guest's C, Zig or WAT source below %%tensorjob")
        try:
            # One blank line first, so the compiler's line numbers are the cell's.
            wasm = compile_source("\n" + cell, args.lang, filename="cell")
        except CompileError as e:
            print(str(e), file=sys.stderr)
            return None
        except ValueError as e:
            raise UsageError(str(e)) from None
        lang = args.lang or detect_language(cell)
        return self.run_and_show(self.start_job(wasm, args, name=f"cell.{lang}"), args)

    @magic_arguments()
    @argument("action", choices=["run", "map", "jobs", "cancel"], help="run PATH | map PATH | jobs | cancel ID")
    @argument("target", nargs="?", default=None, help="the guest file for run and map, the job id for cancel")
    @argument("--over", default=None, metavar="MANIFEST", help="map: the JSONL manifest, one input per line")
    @argument("--run-dir", default=None, metavar="DIR", help="map: the run folder (results.jsonl, failures.jsonl)")
    @argument("--concurrency", type=int, default=None, metavar="N", help="map: items at once (default 4)")
    @argument("--cluster", default=None, metavar="ADDRESS", help="map: a Dask scheduler to run the items on")
    @argument("--retry-failed", action="store_true", help="map: run items that failed before again")
    @_job_options
    @no_var_expand
    @line_magic("tensorjob")
    def tensorjob_line(self, line: str):
        """Run a guest file, list jobs, or cancel one.

        %tensorjob run PATH [options]   run a .wasm, .c, .zig or .wat file as a job
        %tensorjob map PATH --over MANIFEST --run-dir DIR [options]
                                        run the guest once per manifest line (resumable;
                                        --concurrency N locally, --cluster ADDRESS on Dask)
        %tensorjob jobs                 list this kernel's jobs
        %tensorjob cancel ID            cancel a running job
        """
        args = self._parse(self.tensorjob_line, line)
        if args.action == "jobs":
            return self._list_jobs()
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
        if args.action == "map":
            return self._map(args)
        if not os.path.isfile(args.target):
            raise UsageError(f"guest file not found: {args.target}")
        try:
            wasm = load_guest(args.target)
        except CompileError as e:
            print(str(e), file=sys.stderr)
            return None
        except ValueError as e:
            raise UsageError(str(e)) from None
        return self.run_and_show(self.start_job(wasm, args, name=os.path.basename(args.target)), args)

    def _map(self, args):
        from .fanout import MapError, start_map

        if not args.over or not args.run_dir:
            raise UsageError("map needs --over MANIFEST and --run-dir DIR")
        if args.fetch:
            raise UsageError("--fetch is not available for map yet; run the guest with %tensorjob run")
        if not os.path.isfile(args.target):
            raise UsageError(f"guest file not found: {args.target}")
        name = os.path.basename(args.target)
        try:
            run = start_map(args.target, args.over, args.run_dir, read=self._reads(args.read),
                            limits=self._limits(args), model=args.model or self.model_path or None,
                            infer=InferOptions(sampler=Sampler(temperature=self.temperature, seed=self.seed),
                                               chat=args.chat or self.chat),
                            concurrency=args.concurrency, cluster=args.cluster, retry_failed=args.retry_failed)
        except CompileError as e:
            print(str(e), file=sys.stderr)
            return None
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
            extra = ""
            if job.envelope is not None and job.envelope.error is not None:
                extra = f"  {job.envelope.error.code}"
            print(f"{job.id}  {job.status.value:<9}  {job.name}{extra}")
        return None


def load_ipython_extension(ipython) -> None:
    ipython.register_magics(TensorJob)


def unload_ipython_extension(ipython) -> None:
    manager = ipython.magics_manager
    for kind in ("line", "cell"):
        manager.magics[kind].pop("tensorjob", None)
    manager.registry.pop("TensorJob", None)

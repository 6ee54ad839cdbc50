"""host: one job from ``cf_init`` to its envelope -- and the front ends' one door to everything below.

Owns: ``spec`` (``JobSpec`` and ``Overrides``: a job's setup, and what was given anew, as typed values),
``jobs`` (``Job``: a reactor on its own thread, the transcript, the registry), ``reactor`` (the step loop),
``answerer`` (the live world, or a recording), ``tokens`` (the one token loop of an ``infer``), ``debugger``,
``schemas`` and ``structured`` (an infer's output, constrained and validated; ``quoting``: fields copied from
what was read), ``windows``, ``fields``, ``grounding`` (with ``spellings``: how a value may be written,
``labels``: what it stands under, ``excerpts``: the text around a source, read again), ``requirements`` and
``confidence`` (what a result's fields rest on), ``waiting`` (Ctrl-C as cancel).
May import: ``sandbox``, ``world``, ``record``, ``inference``, and the wire modules (``abi``, ``limits``,
``text``, ``version``, ``regular_file``). Never ``history``, ``fanout``, ``serve`` or ``frontends``.
The names below are all a front end uses of the host and the layers under it (a contract in pyproject.toml
says a front end imports nothing of ``sandbox``, ``world``, ``record`` or ``inference`` itself).
"""

from tensorjob_jupyter.host.jobs import DEFAULT_MODEL, Job  # jobs(), get_job(), run(): from host.jobs (its name)
from tensorjob_jupyter.host.reactor import JobStats
from tensorjob_jupyter.host.schemas import SchemaError
from tensorjob_jupyter.host.spec import InferOptions, JobSpec, Overrides, parse_fields
from tensorjob_jupyter.world.fetch import FetchGrants
from tensorjob_jupyter.host.structured import OutputSpec
from tensorjob_jupyter.host.waiting import SIGNAL_CHECK_S, wait_or_cancel
# the guest: its source, compiled and cached (sandbox)
from tensorjob_jupyter.sandbox.compile import (
    CompileError, GuestSource, cache_dir, cache_usage, clear_cache, detect_language,
)
from tensorjob_jupyter.sandbox.python import interpreter as python_interpreter
# the model: named once (a job's ModelRef), and the error of one that fails
from tensorjob_jupyter.inference.base import ModelError
from tensorjob_jupyter.inference.providers import ModelRef
# transcripts, read back (record): what the view's scrubbing reads
from tensorjob_jupyter.record.event_checks import MAX_LINE_BYTES, TranscriptError, parse_event
# a finished response, as the view and the terminal say it: decoded on a busy machine
from tensorjob_jupyter.record.responses import busy_machine_line
from tensorjob_jupyter.record.job_folder import EVENTS_FILE
# what a running job does now, as a map's view and progress show its items in flight
from tensorjob_jupyter.record.glimpse import GENERATING, Glimpse
from tensorjob_jupyter.record.transcript import read_line

__all__ = [
    "DEFAULT_MODEL", "Job", "JobSpec", "Overrides", "JobStats", "InferOptions", "OutputSpec", "SchemaError", "SIGNAL_CHECK_S",
    "FetchGrants", "parse_fields", "wait_or_cancel",
    "CompileError", "GuestSource", "cache_dir", "cache_usage", "clear_cache", "detect_language", "python_interpreter",
    "ModelError", "ModelRef",
    "EVENTS_FILE", "MAX_LINE_BYTES", "TranscriptError", "parse_event", "read_line", "busy_machine_line",
    "GENERATING", "Glimpse",
]

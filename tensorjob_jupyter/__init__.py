"""tensorjob-jupyter: sandboxed WebAssembly tensor jobs against a local model.

A guest (a wasm module speaking the cuttlefish proc-block ABI) returns
commands; the host carries them out under the job's grants and limits and
steps the guest again, publishing every move as an ordered event stream.

    import tensorjob_jupyter as tj
    envelope = tj.run("guests/examples/wordcount.c", input={"path": "book.txt"}, read=["book.txt"])
    report = tj.replay("guests/examples/wordcount.c", run_id)   # again, against the recorded run

    answers = tj.map("guests/examples/extract.py", "reports.jsonl", "runs/reports", read=["reports"],
                     expected="answers.jsonl", scorer="json_fields")          # a scored map
    diff = tj.replay_map("runs/reports", "extract_v2.py")   # a changed guest over it, with no model
    tj.compare("runs/reports", "runs/reports-v2")           # two maps, item by item
    queue = tj.ReviewQueue("runs/reports")                  # its values doubtful first: review, certify the rest
"""

from tensorjob_jupyter.abi import (
    AbiError, Envelope, JobError, JobFailure, JobStatus, OptionError, TensorjobError, TokenAction, Usage, codes,
)
from tensorjob_jupyter.fanout import ManifestError, MapResult, MapRun, ResumeRefused, map, start_map
from tensorjob_jupyter.fanout.errors import ClusterError, MapError, ReviewError, ScoringError
from tensorjob_jupyter.fanout.review_queue import ReviewQueue
from tensorjob_jupyter.fanout import progress as _progress
from tensorjob_jupyter.fanout.certify import Certificate
from tensorjob_jupyter.fanout.estimate import MapEstimate, estimate_map
from tensorjob_jupyter.fanout.map_spec import CascadeSpec, MapSpec
from tensorjob_jupyter.fanout.scoring import Scored
from tensorjob_jupyter.fanout.score_summary import ScoreSummary
from tensorjob_jupyter.host.jobs import Job, get_job, jobs, run
from tensorjob_jupyter.host.spec import JobSpec, Overrides
from tensorjob_jupyter.inference.providers import ModelRef
from tensorjob_jupyter.limits import Limits
from tensorjob_jupyter.host.reactor import JobStats
from tensorjob_jupyter.host.spec import InferOptions
from tensorjob_jupyter.history.runs import RunError, list_runs
from tensorjob_jupyter.history.replay_setup import ReplayError
from tensorjob_jupyter.host.schemas import SchemaError
from tensorjob_jupyter.inference.base import ModelError
from tensorjob_jupyter.record.event_checks import TranscriptError
from tensorjob_jupyter.sandbox.compile import CompileError
from tensorjob_jupyter.history.replay import ReplayJob, replay
from tensorjob_jupyter.history.report import ReplayReport
from tensorjob_jupyter.history.diff import diff_runs
from tensorjob_jupyter.history.map_compare import MapComparison, compare
from tensorjob_jupyter.history.map_replay import MapReplay, MapReplayRun, MapReplaySpec, replay_map, start_map_replay

from tensorjob_jupyter.version import __version__

__all__ = ["Envelope", "InferOptions", "Job", "JobSpec", "Overrides", "ModelRef", "JobError", "JobFailure", "JobStats",
           "JobStatus", "Limits", "ManifestError",
           "MapResult", "MapRun", "ResumeRefused", "TokenAction", "Usage", "codes", "get_job", "jobs", "map", "run",
           "start_map", "list_runs", "replay", "ReplayJob", "ReplayReport", "diff_runs", "__version__",
           "MapEstimate", "estimate_map", "Scored", "ScoreSummary", "MapComparison", "compare", "MapReplay",
           "MapReplayRun", "MapReplaySpec", "MapSpec", "CascadeSpec", "replay_map", "start_map_replay", "ReviewQueue", "Certificate", "review_widget",
           # the errors: one root, TensorjobError; a job's end (JobFailure and ModelError) and every refusal
           "TensorjobError", "AbiError", "ClusterError", "CompileError", "MapError", "ModelError", "OptionError",
           "ReplayError", "ReviewError", "RunError", "SchemaError", "ScoringError", "TranscriptError"]


def review_widget(result, **queue_options):
    """The review widget of a map (a ``MapResult`` or its run folder): ``result.review_widget()``."""
    from tensorjob_jupyter.frontends.view.review_widget import review_widget as make  # deferred: ipywidgets

    return make(result, **queue_options)


_progress.REVIEW_VIEW[:] = [review_widget]  # MapResult.review_widget(), with no import of the views below the package


def load_ipython_extension(ipython):
    """``%load_ext tensorjob_jupyter`` registers ``%%tensorjob`` and ``%tensorjob``."""
    from tensorjob_jupyter.frontends.magic import load_ipython_extension as load  # deferred: IPython, only in a kernel

    load(ipython)


def unload_ipython_extension(ipython):
    from tensorjob_jupyter.frontends.magic import unload_ipython_extension as unload  # deferred: IPython, only in a kernel

    unload(ipython)

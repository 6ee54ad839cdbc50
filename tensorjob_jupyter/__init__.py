"""tensorjob-jupyter: sandboxed WebAssembly tensor jobs against a local model.

A guest (a wasm module speaking the cuttlefish proc-block ABI) returns
commands; the host carries them out under the job's grants and limits and
steps the guest again, publishing every move as an ordered event stream.

    import tensorjob_jupyter as tj
    envelope = tj.run("guests/examples/wordcount.c", input={"path": "book.txt"}, read=["book.txt"])
    report = tj.replay("guests/examples/wordcount.c", run_id)   # again, against the recorded run
"""

from .abi import Envelope, JobError, JobStatus, TokenAction, Usage, codes
from .fanout import ManifestError, MapResult, MapRun, ResumeRefused, map, start_map
from .jobs import Job, get_job, jobs, run
from .limits import Limits
from .runner import InferOptions, JobStats
from .history import list_runs
from .replay import ReplayJob, ReplayReport, replay
from .diff import diff_runs

__version__ = "0.1.0"

__all__ = ["Envelope", "InferOptions", "Job", "JobError", "JobStats", "JobStatus", "Limits", "ManifestError",
           "MapResult", "MapRun", "ResumeRefused", "TokenAction", "Usage", "codes", "get_job", "jobs", "map", "run",
           "start_map", "list_runs", "replay", "ReplayJob", "ReplayReport", "diff_runs", "__version__"]


def load_ipython_extension(ipython):
    """``%load_ext tensorjob_jupyter`` registers ``%%tensorjob`` and ``%tensorjob``."""
    from .magic import load_ipython_extension as load

    load(ipython)


def unload_ipython_extension(ipython):
    from .magic import unload_ipython_extension as unload

    unload(ipython)

"""The codes and errors every layer names things by: error codes, event types, and the error root.

``codes`` are cuttlefish's error strings plus the host's own; ``event_types`` name every event of the
stream. ``TensorjobError`` is the root of every error raised on purpose, with two branches: ``JobFailure``
(why a job ended: a code and a message, written into its envelope) and the refusals that stop something
before it starts (``AbiError`` and ``OptionError`` here; ``CompileError``, ``MapError``... where they arise).
"""

from __future__ import annotations

class codes:
    """The error codes, exact strings. Cuttlefish's nine plus ours (marked)."""

    MODEL_LOAD_FAILED = "model_load_failed"
    CAPABILITY_DENIED = "capability_denied"
    SCHEMA_VALIDATION_FAILED = "schema_validation_failed"
    SCRIPT_ERROR = "script_error"
    WASM_TRAP = "wasm_trap"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"
    UNSUPPORTED = "unsupported"
    NOT_FOUND = "not_found"
    #: Ours: the job ran into one of its configured limits (steps, handles,
    #: emit payload size, token budget). The message names the limit.
    LIMIT_EXCEEDED = "limit_exceeded"
    #: Ours: the inference worker's request queue was full.
    BUSY = "busy"
    #: Ours: a map item whose Dask worker kept dying, retries exhausted.
    WORKER_LOST = "worker_lost"
    #: Ours: a bug in the host, not the guest; the traceback is logged.
    INTERNAL_ERROR = "internal_error"
    #: Ours: a replay (``tensorjob replay``) met a command its recording lacks --
    #: another prompt, another window, past the recording's end -- and stopped
    #: there; the message names the step, what was recorded and what was asked.
    REPLAY_DIVERGENCE = "replay_divergence"
    #: Ours: a job being debugged (``--debug``, ``--break-on``) stayed paused
    #: longer than its ``max_paused_s`` and the host cancelled it (status
    #: ``cancelled``), so a forgotten debug cell cannot hold the kernel.
    PAUSED_TOO_LONG = "paused_too_long"
    #: Ours: a field the job was told to ground (``--require-grounded``, ``require_grounded=``) was found
    #: in no window the job read, or is not in its result; the message names the field.
    UNGROUNDED = "ungrounded"


class event_types:
    """The event stream's ``type`` strings, exact: the one table every producer and reader names them by.

    Job-level events describe the reactor; ``response.*`` and ``error`` are
    the Open Responses events of one ``infer`` (one response each), in the
    spec's own words.
    """

    JOB_CREATED = "job.created"
    JOB_PROGRESS = "job.progress"
    JOB_FILE_OPENED = "job.file.opened"
    JOB_FILE_SLICED = "job.file.sliced"
    JOB_CHUNK = "job.chunk"
    JOB_EMBEDDED = "job.embedded"
    JOB_FETCH = "job.fetch"
    #: A Python guest's interpreter started: which one (its SHA-256), the guest's file, and the
    #: random seed and wall-clock origin the host gave it (a replay gives them again).
    JOB_INTERPRETER = "job.interpreter"
    #: A Python guest's printed lines (``stream``: stdout or stderr; ``lines``; ``dropped`` past the cap).
    JOB_LOG = "job.log"
    #: Clock readings a Python guest took since the last event (nanoseconds since it started), for replay.
    JOB_CLOCK = "job.clock"
    JOB_DOCUMENT_PAGE = "job.document.page"
    JOB_IMAGE_CREATED = "job.image.created"
    JOB_PAUSED = "job.paused"
    JOB_RESUMED = "job.resumed"
    JOB_REPLAY_DIVERGED = "job.replay.diverged"
    JOB_COMPLETED = "job.completed"
    JOB_FAILED = "job.failed"
    JOB_CANCELLED = "job.cancelled"
    #: Never written: what ``show`` reports for a transcript that stops before its job's end.
    JOB_INTERRUPTED = "job.interrupted"
    RESPONSE_CREATED = "response.created"
    RESPONSE_IN_PROGRESS = "response.in_progress"
    RESPONSE_OUTPUT_ITEM_ADDED = "response.output_item.added"
    RESPONSE_CONTENT_PART_ADDED = "response.content_part.added"
    RESPONSE_OUTPUT_TEXT_DELTA = "response.output_text.delta"
    RESPONSE_OUTPUT_TEXT_DONE = "response.output_text.done"
    RESPONSE_CONTENT_PART_DONE = "response.content_part.done"
    RESPONSE_FUNCTION_CALL_ARGUMENTS_DELTA = "response.function_call_arguments.delta"
    RESPONSE_FUNCTION_CALL_ARGUMENTS_DONE = "response.function_call_arguments.done"
    RESPONSE_OUTPUT_ITEM_DONE = "response.output_item.done"
    RESPONSE_COMPLETED = "response.completed"
    RESPONSE_INCOMPLETE = "response.incomplete"
    RESPONSE_FAILED = "response.failed"
    ERROR = "error"


EVENT_TYPES = frozenset(v for k, v in vars(event_types).items() if not k.startswith("_") and isinstance(v, str))
#: The events a job's stream ends with, one of them exactly once.
TERMINAL_EVENT_TYPES = frozenset({event_types.JOB_COMPLETED, event_types.JOB_FAILED, event_types.JOB_CANCELLED})


ERROR_CODES = frozenset(
    v for k, v in vars(codes).items() if not k.startswith("_") and isinstance(v, str)
)

#: Codes that only the host may report: they say the host or the cluster broke,
#: that a replay left its recording, that a debugger's pause ran out, or that the host
#: found a required field in nothing the job read.
#: A guest's ``fail`` with one of them is reported as ``script_error`` (see
#: ``guest_failure``), so nobody debugging it is pointed at the host.
HOST_ONLY_CODES = frozenset({codes.INTERNAL_ERROR, codes.WORKER_LOST, codes.REPLAY_DIVERGENCE,
                             codes.PAUSED_TOO_LONG, codes.UNGROUNDED})


class TensorjobError(Exception):
    """The root of every error this package raises on purpose, each with a one-line message.

    Two branches: ``JobFailure``, why a job ended (a code and a message, written into its envelope); and
    the refusals that stop something before it starts -- a bad option (``OptionError``), a guest that does
    not compile (``CompileError``), a run or transcript that cannot be read or replayed (``RunError``,
    ``TranscriptError``, ``ReplayError``), a manifest or a run folder (``MapError``), a schema
    (``SchemaError``), a malformed command (``AbiError``). The refusals that are about a value are
    ``ValueError``s too. The command line and the magics catch this root once: anything else is a bug.
    """


class JobFailure(TensorjobError):
    """Why a job ends: an error code (``codes``) and a one-line message.

    The one exception family of a job's end. Every layer raises it, or a
    subclass named for where the failure arose (``GuestTrap``, ``AccessError``,
    ``DocumentError``, ``FetchError``, ``ModelError``, ...), and the reactor
    catches it once and writes ``JobError(code, message)`` into the envelope.
    Errors that stop a job before it starts (a bad option, a guest that does
    not compile, a run that cannot be replayed) are the other branch of
    ``TensorjobError``: they have no envelope.
    """

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message

    def __reduce__(self):  # subclasses take other arguments: rebuild from (code, message) in any process
        return _rebuild_failure, (type(self), self.code, self.message)


def _rebuild_failure(cls: type[JobFailure], code: str, message: str) -> JobFailure:
    failure = cls.__new__(cls)
    JobFailure.__init__(failure, code, message)
    return failure


class OptionError(TensorjobError, ValueError):
    """An option that cannot be used: one line, naming the flag (exit 2, or a ``UsageError`` in a notebook)."""


class AbiError(TensorjobError, ValueError):
    """A guest produced bytes that are not a valid command (-> ``wasm_trap``)."""


__all__ = [
    "codes", "event_types", "EVENT_TYPES", "TERMINAL_EVENT_TYPES", "ERROR_CODES", "HOST_ONLY_CODES",
    "TensorjobError", "JobFailure", "OptionError", "AbiError"
]

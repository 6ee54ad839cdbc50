"""abi: the guest boundary and the names every layer shares -- the ground floor above ``text``.

Owns: ``errors`` (the error codes, the event types, ``TensorjobError`` and ``JobFailure``), ``strict_json``
(the one strict reader of JSON from a guest or a file) and ``wire`` (commands, events, the usage and the
envelope, and their reading). May import: ``text`` only.
This door names them all, so ``from tensorjob_jupyter.abi import Envelope, codes`` reads as it always has.
"""

from tensorjob_jupyter.abi.errors import (
    ERROR_CODES, EVENT_TYPES, HOST_ONLY_CODES, TERMINAL_EVENT_TYPES, AbiError, JobFailure, OptionError,
    TensorjobError, codes, event_types,
)
from tensorjob_jupyter.abi.strict_json import (
    MAX_COUNT, MAX_DEPTH, U32_MAX, U64_MAX, CheckedJson, checked_input, checked_value, dumps, encode_json,
    loads_strict,
)
from tensorjob_jupyter.abi.wire import (
    BINARY, INFER_EXTENSIONS, INFER_SAMPLING, MAX_CHOICE_CHARS, MAX_CHOICES, MAX_GRAMMAR_CHARS, MAX_REGEX_CHARS,
    MAX_STOP_CHARS, MAX_STOPS, MAX_TOOLS, MAX_TOP_LOGPROBS, TEXT, UNSUPPORTED_COMMANDS, Command, Crop, Done,
    DocumentText, Embed, Embedded, Emit, Emitted, Envelope, Event, Fail, Fetch, ImageOp, ImageOperation, Infer,
    InferDone, JobError, JobStatus, MediaKind, Open, Opened, PageImage, PageImaged, PageText, PageTextAttempted,
    PageTexted, PageTextOpt, Resize, Slice, SliceBytes, Sliced, SlicedBytes, TokenAction, UnsupportedCommand, Usage,
    command_from_json, encode_event, event_from_json, parse_command,
)

__all__ = [
    "U32_MAX", "U64_MAX", "codes", "event_types", "EVENT_TYPES", "TERMINAL_EVENT_TYPES", "ERROR_CODES",
    "HOST_ONLY_CODES", "TensorjobError", "JobFailure", "OptionError", "AbiError", "JobStatus", "TokenAction",
    "MediaKind", "TEXT",
    "BINARY", "INFER_EXTENSIONS", "INFER_SAMPLING", "Infer", "Open", "Slice", "SliceBytes", "Embed", "Emit", "Done",
    "Fail", "PageText", "PageTextOpt", "PageImage", "DocumentText", "Resize", "Crop", "ImageOperation", "ImageOp",
    "Fetch", "Command", "UNSUPPORTED_COMMANDS", "InferDone", "Opened", "Sliced", "SlicedBytes", "Embedded", "Emitted",
    "PageTexted", "PageTextAttempted", "PageImaged", "Event", "MAX_COUNT", "Usage", "JobError", "Envelope", "dumps",
    "encode_event", "MAX_DEPTH", "loads_strict", "checked_value", "CheckedJson", "checked_input", "encode_json", "UnsupportedCommand",
    "command_from_json", "MAX_TOOLS", "MAX_STOPS", "MAX_STOP_CHARS", "MAX_REGEX_CHARS", "MAX_GRAMMAR_CHARS",
    "MAX_CHOICES", "MAX_CHOICE_CHARS", "MAX_TOP_LOGPROBS", "parse_command",
    "event_from_json"
]

"""The wire types that cross the guest boundary: commands, events, usage and the envelope, and their reading.

This is the cuttlefish proc-block ABI in Python. A guest returns a ``Command`` (JSON tagged by ``"cmd"``)
from ``cf_init``/``cf_step``; the host answers with an ``Event`` (tagged by ``"event"``), snake_case, the tag
first and the other fields in declaration order, so the bytes sent are the bytes cuttlefish's serde sends.
``parse_command`` judges a guest's bytes (the strict JSON reader, ``abi.strict_json``, then the command's
own fields), refusing anything serde_json would refuse with an ``AbiError`` naming the problem.
The job result is an ``Envelope``: ``status``, ``result`` (completed only), ``error`` and ``usage``.
The rule, and why it is kept at this one boundary: docs/limits.md.
"""

from __future__ import annotations

import enum
import math
import re
from dataclasses import dataclass, field
from typing import Any, Union

import orjson

from tensorjob_jupyter.abi.errors import AbiError
from tensorjob_jupyter.abi.strict_json import U32_MAX, U64_MAX, dumps, loads_strict
from tensorjob_jupyter.text import clip

class JobStatus(str, enum.Enum):
    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    INTERRUPTED = "interrupted"

    @property
    def is_terminal(self) -> bool:
        return self in (JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED)

    def __str__(self) -> str:  # pragma: no cover - convenience
        return self.value


class TokenAction(enum.IntEnum):
    """What ``cf_on_token`` returns: 0 continues; *anything* else stops."""

    CONTINUE = 0
    STOP = 1

    @classmethod
    def from_i32(cls, value: int) -> "TokenAction":
        return cls.CONTINUE if value == 0 else cls.STOP


# --- media kinds -------------------------------------------------------------


@dataclass(frozen=True)
class MediaKind:
    """What ``opened`` says a handle holds: text, image, document or binary."""

    kind: str = "text"
    format: str | None = None  # image only
    pages: int | None = None  # document only
    has_text_layer: bool | None = None  # document only

    def to_json(self) -> dict:
        out: dict[str, Any] = {"kind": self.kind}
        if self.kind == "image":
            out["format"] = self.format
        elif self.kind == "document":
            out["pages"] = self.pages
            out["has_text_layer"] = self.has_text_layer
        return out

    @classmethod
    def from_json(cls, value: Any) -> "MediaKind":
        obj = _expect_object(value, "kind")
        kind = _field(obj, "kind", str, "kind")
        if kind == "text" or kind == "binary":
            return cls(kind)
        if kind == "image":
            return cls("image", format=_field(obj, "format", str, "kind"))
        if kind == "document":
            return cls(
                "document",
                pages=_u32(obj, "pages", "kind"),
                has_text_layer=_field(obj, "has_text_layer", bool, "kind"),
            )
        raise AbiError(f"unknown media kind {clip(kind, 64)!r}")


TEXT = MediaKind("text")
BINARY = MediaKind("binary")

# --- commands ----------------------------------------------------------------


#: ``infer``'s optional fields, this project's extension of cuttlefish's ``infer``: written
#: only when set, after cuttlefish's own, so a cuttlefish guest's command is byte-identical.
INFER_EXTENSIONS = ("format", "tools", "tool_choice", "temperature", "top_p", "top_k", "min_p", "repeat_penalty",
                    "seed", "stop", "regex", "choices", "grammar", "logprobs", "top_logprobs")
#: The sampling fields of ``infer`` (each overrides the job's setting for that infer).
INFER_SAMPLING = ("temperature", "top_p", "top_k", "min_p", "repeat_penalty", "seed", "stop")


@dataclass(frozen=True)
class Infer:
    prompt: str
    max_tokens: int
    images: tuple[int, ...] = ()
    #: Structured output: ``{"type": "json_schema", "name", "schema", "strict"?, "description"?, "quote"?}``,
    #: ``{"type": "json_object"}`` or ``{"type": "text"}``, as Open Responses' ``text.format``.
    format: dict | None = None
    #: Function tools: ``{"type": "function", "name", "description"?, "parameters"?, "strict"?}``.
    tools: tuple[dict, ...] | None = None
    #: ``"auto"``, ``"required"``, ``"none"`` or ``{"type": "function", "name": ...}``.
    tool_choice: str | dict | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repeat_penalty: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] | None = None
    #: The whole answer matches this regular expression (llguidance's syntax: Rust's ``regex`` crate).
    regex: str | None = None
    #: The answer is one of these strings.
    choices: tuple[str, ...] | None = None
    #: The answer is a sentence of this Lark grammar (llguidance's dialect, from its ``start`` rule).
    grammar: str | None = None
    #: ``infer_done`` carries each token's logprob (``logprobs``), as Open Responses' events do.
    logprobs: bool | None = None
    #: ... with this many of the most likely tokens beside each (0 to ``MAX_TOP_LOGPROBS``; implies ``logprobs``).
    top_logprobs: int | None = None
    cmd = "infer"

    @property
    def wants_logprobs(self) -> bool:
        """Whether ``infer_done`` is to carry the tokens' logprobs."""
        return bool(self.logprobs) or bool(self.top_logprobs)

    def to_json(self) -> dict:
        out = {"cmd": "infer", "prompt": self.prompt, "max_tokens": self.max_tokens, "images": list(self.images)}
        for name in INFER_EXTENSIONS:
            value = getattr(self, name)
            if value is not None:
                out[name] = list(value) if isinstance(value, tuple) else value
        return out

    def sampling(self) -> dict:
        """The sampling fields this infer sets (names as ``Sampler``'s)."""
        return {name: getattr(self, name) for name in INFER_SAMPLING if getattr(self, name) is not None}


@dataclass(frozen=True)
class Open:
    path: str
    cmd = "open"

    def to_json(self) -> dict:
        return {"cmd": "open", "path": self.path}


@dataclass(frozen=True)
class Slice:
    handle: int
    offset: int
    len: int
    cmd = "slice"

    def to_json(self) -> dict:
        return {"cmd": "slice", "handle": self.handle, "offset": self.offset, "len": self.len}


@dataclass(frozen=True)
class SliceBytes:
    handle: int
    offset: int
    len: int
    cmd = "slice_bytes"

    def to_json(self) -> dict:
        return {"cmd": "slice_bytes", "handle": self.handle, "offset": self.offset,
                "len": self.len}


@dataclass(frozen=True)
class Embed:
    texts: tuple[str, ...]
    cmd = "embed"

    def to_json(self) -> dict:
        return {"cmd": "embed", "texts": list(self.texts)}


@dataclass(frozen=True)
class Emit:
    progress: Any
    cmd = "emit"

    def to_json(self) -> dict:
        return {"cmd": "emit", "progress": self.progress}


@dataclass(frozen=True)
class Done:
    result: Any
    cmd = "done"

    def to_json(self) -> dict:
        return {"cmd": "done", "result": self.result}


@dataclass(frozen=True)
class Fail:
    code: str
    message: str
    cmd = "fail"

    def to_json(self) -> dict:
        return {"cmd": "fail", "code": self.code, "message": self.message}


@dataclass(frozen=True)
class PageText:
    """The text of one page (zero-based); fails on a page without text."""

    handle: int
    page: int
    cmd = "page_text"

    def to_json(self) -> dict:
        return {"cmd": "page_text", "handle": self.handle, "page": self.page}


@dataclass(frozen=True)
class PageTextOpt:
    """The text of one page, or an error as data (``page_text_attempted``)."""

    handle: int
    page: int
    cmd = "page_text_opt"

    def to_json(self) -> dict:
        return {"cmd": "page_text_opt", "handle": self.handle, "page": self.page}


@dataclass(frozen=True)
class PageImage:
    """Render one page (zero-based) to a PNG under a new handle."""

    handle: int
    page: int
    cmd = "page_image"

    def to_json(self) -> dict:
        return {"cmd": "page_image", "handle": self.handle, "page": self.page}


@dataclass(frozen=True)
class DocumentText:
    """All the text of a document in one answer (pages separated by form feeds)."""

    handle: int
    cmd = "document_text"

    def to_json(self) -> dict:
        return {"cmd": "document_text", "handle": self.handle}


@dataclass(frozen=True)
class Resize:
    """Scale to fit within the bounds, keeping the aspect ratio, never enlarging."""

    max_width: int
    max_height: int
    op = "resize"

    def to_json(self) -> dict:
        return {"op": "resize", "max_width": self.max_width, "max_height": self.max_height}


@dataclass(frozen=True)
class Crop:
    """A region of the image; one reaching outside it is refused, not clamped."""

    x: int
    y: int
    width: int
    height: int
    op = "crop"

    def to_json(self) -> dict:
        return {"op": "crop", "x": self.x, "y": self.y, "width": self.width, "height": self.height}


ImageOperation = Union[Resize, Crop]


@dataclass(frozen=True)
class ImageOp:
    """Transform an image handle into a new handle holding a PNG."""

    handle: int
    op: ImageOperation
    cmd = "image_op"

    def to_json(self) -> dict:
        return {"cmd": "image_op", "handle": self.handle, "op": self.op.to_json()}


@dataclass(frozen=True)
class Fetch:
    """Download a granted URL; answered by ``opened``, exactly like ``open``."""

    url: str
    cmd = "fetch"

    def to_json(self) -> dict:
        return {"cmd": "fetch", "url": self.url}


Command = Union[Infer, Open, Slice, SliceBytes, Embed, Emit, Done, Fail, PageText, PageTextOpt, PageImage,
                DocumentText, ImageOp, Fetch]

#: Cuttlefish commands this host knows by name but does not implement. A guest
#: that sends one fails with ``unsupported`` rather than an opaque parse error.
#: (Empty: every command of cuttlefish 0.9.0 is implemented.)
UNSUPPORTED_COMMANDS: frozenset[str] = frozenset()

# --- events ------------------------------------------------------------------


@dataclass(frozen=True)
class InferDone:
    text: str
    tokens_out: int
    #: The model's tool calls, ``[{"call_id", "name", "arguments"}]`` (``arguments`` is JSON text);
    #: present only when it called one (this project's extension, like ``infer``'s ``tools``).
    tool_calls: tuple[dict, ...] | None = None
    #: Each token's ``{"token", "logprob", "bytes", "top_logprobs", "runner_up_logprob"}``: present when the
    #: infer asked (``logprobs``/``top_logprobs``) and the model gave them (this project's extension).
    logprobs: tuple[dict, ...] | None = None
    #: ``{field path: confidence 0..1 or null}`` of an answer with fields (a format's JSON, a choice, a regex
    #: match): present when the model gave logprobs to measure it by (this project's extension).
    confidence: dict | None = None

    def to_json(self) -> dict:
        out = {"event": "infer_done", "text": self.text, "tokens_out": self.tokens_out}
        if self.tool_calls is not None:
            out["tool_calls"] = list(self.tool_calls)
        if self.logprobs is not None:
            out["logprobs"] = list(self.logprobs)
        if self.confidence is not None:
            out["confidence"] = self.confidence
        return out


@dataclass(frozen=True)
class Opened:
    handle: int
    len: int
    kind: MediaKind = TEXT

    def to_json(self) -> dict:
        return {"event": "opened", "handle": self.handle, "len": self.len,
                "kind": self.kind.to_json()}


@dataclass(frozen=True)
class Sliced:
    text: str
    next_offset: int

    def to_json(self) -> dict:
        return {"event": "sliced", "text": self.text, "next_offset": self.next_offset}


@dataclass(frozen=True)
class SlicedBytes:
    bytes_base64: str
    next_offset: int

    def to_json(self) -> dict:
        return {"event": "sliced_bytes", "bytes_base64": self.bytes_base64,
                "next_offset": self.next_offset}


@dataclass(frozen=True)
class Embedded:
    vectors: list[list[float]]

    def to_json(self) -> dict:
        return {"event": "embedded", "vectors": self.vectors}


@dataclass(frozen=True)
class Emitted:
    def to_json(self) -> dict:
        return {"event": "emitted"}


@dataclass(frozen=True)
class PageTexted:
    """The answer to ``page_text`` and ``document_text``."""

    text: str

    def to_json(self) -> dict:
        return {"event": "page_texted", "text": self.text}


@dataclass(frozen=True)
class PageTextAttempted:
    """The answer to ``page_text_opt``: ``text`` or ``error``, the other null."""

    text: str | None
    error: str | None

    def to_json(self) -> dict:
        return {"event": "page_text_attempted", "text": self.text, "error": self.error}


@dataclass(frozen=True)
class PageImaged:
    """A new handle holding a PNG (``page_image``, ``image_op``), with its size in bytes."""

    handle: int
    len: int

    def to_json(self) -> dict:
        return {"event": "page_imaged", "handle": self.handle, "len": self.len}


Event = Union[InferDone, Opened, Sliced, SlicedBytes, Embedded, Emitted, PageTexted, PageTextAttempted, PageImaged]

# --- usage and the envelope --------------------------------------------------

@dataclass
class Usage:
    """What a job used: every envelope carries one, whatever the job's status."""

    tokens_in: int = 0
    """Prompt tokens of all its infers."""
    tokens_out: int = 0
    """Tokens its infers generated."""
    duration_ms: int = 0
    """Wall time of the job, start to end, in milliseconds."""
    model: str = ""
    """The model's name (empty when the job had none)."""

    def to_json(self) -> dict:
        return {"tokens_in": self.tokens_in, "tokens_out": self.tokens_out,
                "duration_ms": self.duration_ms, "model": self.model}

    @classmethod
    def from_json(cls, obj: dict) -> "Usage":
        return cls(obj.get("tokens_in", 0), obj.get("tokens_out", 0),
                   obj.get("duration_ms", 0), obj.get("model", ""))


@dataclass(frozen=True)
class JobError:
    """A job's error: ``code`` (one of ``abi.codes``, cuttlefish's strings) and a one-line ``message``."""

    code: str
    message: str

    def to_json(self) -> dict:
        return {"code": self.code, "message": self.message}


@dataclass
class Envelope:
    """How a job ended, as cuttlefish's envelope: ``job.wait()``, ``tj.run`` and ``envelope.json`` give it.

    ``ok`` is True when it completed; ``to_json()``/``from_json()`` are the wire form (``result`` only when
    completed, ``error`` only when failed or cancelled, ``usage`` always).
    """

    status: JobStatus
    """``completed``, ``failed`` or ``cancelled`` (``JobStatus``)."""
    usage: Usage = field(default_factory=Usage)
    """Tokens in and out, the wall time and the model (``Usage``)."""
    result: Any = None
    """The guest's ``done`` value, a JSON value; only when completed."""
    error: JobError | None = None
    """Why it did not complete: ``code`` (one of ``abi.codes``) and ``message``; None when completed."""
    sources: dict[str, list[dict]] | None = None
    """Where each field of ``result`` was found in what the job read, by its dotted path
    (``host.fields``); an empty list: found nowhere. None when not located (only a completed job is)."""
    confidence: dict[str, float | None] | None = None
    """How sure the model was of each field of ``result`` (0 to 1) by its dotted path; None for a field
    no model answer spelled. None when the job has no confidence to give."""
    rejected: dict[str, str] | None = None
    """The fields of ``result`` the job required grounded and found not grounded, by dotted path, with why in
    one line (``host/requirements.py``): null in the tables' ``final.FIELD``. None when none was rejected."""

    def __post_init__(self) -> None:
        self.status = JobStatus(self.status)
        if self.status is not JobStatus.COMPLETED and self.result is not None:
            raise ValueError("only a completed envelope carries a result")
        if self.status is not JobStatus.COMPLETED and (self.sources is not None or self.confidence is not None
                                                        or self.rejected is not None):
            raise ValueError("only a completed envelope carries sources, confidence and rejected fields")
        if self.status is JobStatus.COMPLETED and self.error is not None:
            raise ValueError("a completed envelope carries no error")

    @property
    def ok(self) -> bool:
        return self.status is JobStatus.COMPLETED

    def to_json(self) -> dict:
        out: dict[str, Any] = {"status": self.status.value}
        if self.status is JobStatus.COMPLETED:
            out["result"] = self.result
        if self.error is not None:
            out["error"] = self.error.to_json()
        out["usage"] = self.usage.to_json()
        # ours, after cuttlefish's fields (status, result or error, usage), so its readers see its shape first
        if self.sources is not None:
            out["sources"] = self.sources
        if self.confidence is not None:
            out["confidence"] = self.confidence
        if self.rejected is not None:
            out["rejected"] = self.rejected
        return out

    @classmethod
    def from_json(cls, obj: dict) -> "Envelope":
        err = obj.get("error")
        return cls(
            status=JobStatus(obj["status"]),
            usage=Usage.from_json(obj.get("usage", {})),
            result=obj.get("result"),
            error=JobError(err["code"], err["message"]) if err else None,
            sources=obj.get("sources"),
            confidence=obj.get("confidence"),
            rejected=obj.get("rejected"),
        )


# --- encoding ----------------------------------------------------------------


def encode_event(event: Event) -> bytes:
    """An event's JSON bytes, as the guest receives them.

    Events carrying bulk text (a slice window, an infer's text) are encoded
    with orjson, which writes the same bytes as ``dumps`` about fifteen times
    faster; the JSON string escaper is most of the cost of a large window.
    """
    if isinstance(event, (Sliced, SlicedBytes, InferDone, PageTexted, PageTextAttempted)):
        return orjson.dumps(event.to_json())
    return dumps(event.to_json()).encode("utf-8")


# --- reading commands and events ---------------------------------------------


def _expect_object(value: Any, what: str) -> dict:
    if not isinstance(value, dict):
        raise AbiError(f"{what} must be a JSON object, got {_type_name(value)}")
    return value


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number with a fraction" if not math.isfinite(value) or value != int(value) else "a float"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _field(obj: dict, name: str, typ: type, where: str) -> Any:
    if name not in obj:
        raise AbiError(f"`{where}` is missing field `{name}`")
    value = obj[name]
    if typ is str and not isinstance(value, str):
        raise AbiError(f"`{where}.{name}` must be a string, got {_type_name(value)}")
    if typ is bool and not isinstance(value, bool):
        raise AbiError(f"`{where}.{name}` must be a boolean, got {_type_name(value)}")
    return value


def _int_in(value: Any, bound: int, label: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise AbiError(f"`{label}` must be an unsigned integer, got {_type_name(value)}")
    if value < 0:
        raise AbiError(f"`{label}` must not be negative, got {value}")
    if value > bound:
        raise AbiError(f"`{label}` = {value} is out of range (at most {bound})")
    return value


def _u32(obj: dict, name: str, where: str) -> int:
    if name not in obj:
        raise AbiError(f"`{where}` is missing field `{name}`")
    return _int_in(obj[name], U32_MAX, f"{where}.{name}")


def _u64(obj: dict, name: str, where: str) -> int:
    if name not in obj:
        raise AbiError(f"`{where}` is missing field `{name}`")
    return _int_in(obj[name], U64_MAX, f"{where}.{name}")


def _any(obj: dict, name: str, where: str) -> Any:
    if name not in obj:
        raise AbiError(f"`{where}` is missing field `{name}`")
    return obj[name]


class UnsupportedCommand(AbiError):
    """A cuttlefish command this host knows by name but does not implement."""


def command_from_json(value: Any) -> Command:
    obj = _expect_object(value, "a command")
    if "cmd" not in obj:
        raise AbiError("command has no `cmd` tag")
    tag = obj["cmd"]
    if not isinstance(tag, str):
        raise AbiError(f"`cmd` must be a string, got {_type_name(tag)}")
    if tag == "infer":
        images = obj.get("images", [])
        if not isinstance(images, list):
            raise AbiError(f"`infer.images` must be an array, got {_type_name(images)}")
        return Infer(
            prompt=_field(obj, "prompt", str, "infer"),
            max_tokens=_u32(obj, "max_tokens", "infer"),
            images=tuple(_int_in(h, U32_MAX, "infer.images[]") for h in images),
            **_infer_extensions(obj),
        )
    if tag == "open":
        return Open(path=_field(obj, "path", str, "open"))
    if tag == "slice":
        return Slice(_u32(obj, "handle", "slice"), _u64(obj, "offset", "slice"), _u64(obj, "len", "slice"))
    if tag == "slice_bytes":
        return SliceBytes(_u32(obj, "handle", "slice_bytes"), _u64(obj, "offset", "slice_bytes"),
                          _u64(obj, "len", "slice_bytes"))
    if tag == "embed":
        texts = _any(obj, "texts", "embed")
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            raise AbiError("`embed.texts` must be an array of strings")
        return Embed(tuple(texts))
    if tag == "emit":
        return Emit(_any(obj, "progress", "emit"))
    if tag == "done":
        return Done(_any(obj, "result", "done"))
    if tag == "fail":
        return Fail(_field(obj, "code", str, "fail"), _field(obj, "message", str, "fail"))
    if tag in ("page_text", "page_text_opt", "page_image"):
        handle, page = _u32(obj, "handle", tag), _u32(obj, "page", tag)
        if tag == "page_text":
            return PageText(handle, page)
        return PageTextOpt(handle, page) if tag == "page_text_opt" else PageImage(handle, page)
    if tag == "document_text":
        return DocumentText(_u32(obj, "handle", tag))
    if tag == "image_op":
        return ImageOp(_u32(obj, "handle", tag), _image_operation(_any(obj, "op", tag)))
    if tag == "fetch":
        return Fetch(_field(obj, "url", str, tag))
    if tag in UNSUPPORTED_COMMANDS:
        raise UnsupportedCommand(f"`{tag}` is a cuttlefish command this host does not implement")
    raise AbiError(f"unknown command `{clip(tag, 64)}`")


#: A function's or a format's name: what Open Responses allows.
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_TOOLS = 64
MAX_STOPS = 16
MAX_STOP_CHARS = 256
#: An infer's ``regex`` and ``grammar`` (characters), and its ``choices`` (how many, each in characters): the
#: grammar engine's compile time and memory grow with them (inference/grammar.py).
MAX_REGEX_CHARS = 4096
MAX_GRAMMAR_CHARS = 32 * 1024
MAX_CHOICES = 1024
MAX_CHOICE_CHARS = 1024
#: The most alternatives an infer may ask for beside each token (``top_logprobs``; OpenAI's bound).
MAX_TOP_LOGPROBS = 20


def _name(obj: dict, where: str) -> str:
    name = _field(obj, "name", str, where)
    if not _NAME.match(name):
        raise AbiError(f"`{where}.name` must be 1 to 64 letters, digits, _ or -, got {clip(name, 64)!r}")
    return name


def _optional(obj: dict, name: str, typ: type, where: str) -> Any:
    if name not in obj or obj[name] is None:
        return None
    return _field(obj, name, typ, where)


def _known(obj: dict, names: tuple[str, ...]) -> dict:
    return {k: obj[k] for k in names if k in obj and obj[k] is not None}


def _infer_format(value: Any) -> dict:
    obj = _expect_object(value, "`infer.format`")
    kind = _field(obj, "type", str, "infer.format")
    if kind in ("text", "json_object"):
        return {"type": kind}
    if kind != "json_schema":
        raise AbiError(f"`infer.format.type` must be text, json_schema or json_object, got {clip(kind, 64)!r}")
    _name(obj, "infer.format")
    _expect_object(_any(obj, "schema", "infer.format"), "`infer.format.schema`")
    _optional(obj, "strict", bool, "infer.format")
    _optional(obj, "description", str, "infer.format")
    _optional(obj, "quote", bool, "infer.format")
    return _known(obj, ("type", "name", "schema", "description", "strict", "quote"))


def _infer_tools(value: Any) -> tuple[dict, ...]:
    if not isinstance(value, list):
        raise AbiError(f"`infer.tools` must be an array, got {_type_name(value)}")
    if len(value) > MAX_TOOLS:
        raise AbiError(f"`infer.tools` has {len(value)} tools, more than the {MAX_TOOLS} allowed")
    tools, names = [], set()
    for i, item in enumerate(value):
        where = f"infer.tools[{i}]"
        obj = _expect_object(item, f"`{where}`")
        kind = obj.get("type", "function")
        if kind != "function":
            raise AbiError(f"`{where}.type` must be \"function\" (function tools only), got "
                           f"{clip(str(kind), 64)!r}")
        name = _name(obj, where)
        if name in names:
            raise AbiError(f"`{where}.name`: two tools are named {name!r}")
        names.add(name)
        _optional(obj, "description", str, where)
        _optional(obj, "strict", bool, where)
        if obj.get("parameters") is not None:
            _expect_object(obj["parameters"], f"`{where}.parameters`")
        tools.append({"type": "function", **_known(obj, ("name", "description", "parameters", "strict"))})
    return tuple(tools)


def _tool_choice(value: Any, tools: tuple[dict, ...] | None) -> str | dict:
    names = {t["name"] for t in tools or ()}
    if isinstance(value, str):
        if value not in ("auto", "required", "none"):
            raise AbiError(f"`infer.tool_choice` must be auto, required, none or "
                           f"{{\"type\":\"function\",\"name\":...}}, got {clip(value, 64)!r}")
        if value != "none" and not names:
            raise AbiError(f"`infer.tool_choice` is {value!r} but the infer gives no `tools`")
        return value
    obj = _expect_object(value, "`infer.tool_choice`")
    if obj.get("type") != "function":
        raise AbiError("`infer.tool_choice` as an object must be {\"type\":\"function\",\"name\":...}")
    name = _name(obj, "infer.tool_choice")
    if name not in names:
        raise AbiError(f"`infer.tool_choice` names {name!r}, which is not one of the infer's tools")
    return {"type": "function", "name": name}


def _bounded_text(value: Any, where: str, most: int) -> str:
    if not isinstance(value, str):
        raise AbiError(f"`{where}` must be a string, got {_type_name(value)}")
    if not value:
        raise AbiError(f"`{where}` must not be empty")
    if len(value) > most:
        raise AbiError(f"`{where}` is {len(value)} characters, over the {most} allowed")
    return value


def _number_in(obj: dict, name: str, low: float, high: float, *, low_open: bool = False) -> float:
    value = obj[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise AbiError(f"`infer.{name}` must be a number, got {_type_name(value)}")
    if value < low or value > high or (low_open and value == low):
        bound = f"{'over' if low_open else 'at least'} {low} and at most {high}"
        raise AbiError(f"`infer.{name}` = {value} is out of range ({bound})")
    return float(value)


def _infer_extensions(obj: dict) -> dict:
    """``infer``'s optional fields (absent or null: not set), each checked; ``AbiError`` names a bad one."""
    out: dict[str, Any] = {}
    present = {k for k in INFER_EXTENSIONS if obj.get(k) is not None}
    if not present:
        return out
    if "format" in present:
        out["format"] = _infer_format(obj["format"])
    if "tools" in present:
        out["tools"] = _infer_tools(obj["tools"])
    if "tool_choice" in present:
        out["tool_choice"] = _tool_choice(obj["tool_choice"], out.get("tools"))
    if "temperature" in present:
        out["temperature"] = _number_in(obj, "temperature", 0.0, 10.0)
    if "top_p" in present:
        out["top_p"] = _number_in(obj, "top_p", 0.0, 1.0, low_open=True)
    if "min_p" in present:
        out["min_p"] = _number_in(obj, "min_p", 0.0, 1.0)
    if "repeat_penalty" in present:
        out["repeat_penalty"] = _number_in(obj, "repeat_penalty", 0.0, 10.0, low_open=True)
    if "top_k" in present:
        out["top_k"] = _int_in(obj["top_k"], U32_MAX, "infer.top_k")
    if "seed" in present:
        out["seed"] = _int_in(obj["seed"], U32_MAX, "infer.seed")
    if "regex" in present:
        out["regex"] = _bounded_text(obj["regex"], "infer.regex", MAX_REGEX_CHARS)
    if "grammar" in present:
        out["grammar"] = _bounded_text(obj["grammar"], "infer.grammar", MAX_GRAMMAR_CHARS)
    if "logprobs" in present:
        if not isinstance(obj["logprobs"], bool):
            raise AbiError(f"`infer.logprobs` must be true or false, got {_type_name(obj['logprobs'])}")
        out["logprobs"] = obj["logprobs"]
    if "top_logprobs" in present:
        out["top_logprobs"] = _int_in(obj["top_logprobs"], MAX_TOP_LOGPROBS, "infer.top_logprobs")
        if out["top_logprobs"] and out.get("logprobs") is False:
            raise AbiError("`infer.top_logprobs` lists alternatives beside each token's logprob: it cannot be "
                           "given with `logprobs: false`")
    if "choices" in present:
        choices = obj["choices"]
        if not isinstance(choices, list) or not choices or not all(isinstance(c, str) and c for c in choices):
            raise AbiError("`infer.choices` must be a non-empty array of non-empty strings")
        if len(choices) > MAX_CHOICES or any(len(c) > MAX_CHOICE_CHARS for c in choices):
            raise AbiError(f"`infer.choices` takes at most {MAX_CHOICES} strings of at most {MAX_CHOICE_CHARS} "
                           f"characters")
        out["choices"] = tuple(choices)
    if "stop" in present:
        stop = obj["stop"]
        stops = [stop] if isinstance(stop, str) else stop
        if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
            raise AbiError("`infer.stop` must be a non-empty string or an array of them")
        if len(stops) > MAX_STOPS or any(len(s) > MAX_STOP_CHARS for s in stops):
            raise AbiError(f"`infer.stop` takes at most {MAX_STOPS} strings of at most {MAX_STOP_CHARS} "
                           f"characters")
        constrained = out.get("format", {}).get("type", "text") != "text" or (
            out.get("tools") and out.get("tool_choice", "auto") != "none") or any(
            k in out for k in ("regex", "choices", "grammar"))
        if constrained:
            raise AbiError("`infer.stop` cannot be given with a format, tools, a regex, choices or a grammar: a "
                           "stop string could cut the answer short of what it must be")
        out["stop"] = tuple(stops)
    return out


def _image_operation(value: Any) -> ImageOperation:
    obj = _expect_object(value, "`image_op.op`")
    if "op" not in obj:
        raise AbiError("`image_op.op` has no `op` tag")
    tag = obj["op"]
    if tag == "resize":
        return Resize(_u32(obj, "max_width", "image_op.op"), _u32(obj, "max_height", "image_op.op"))
    if tag == "crop":
        return Crop(_u32(obj, "x", "image_op.op"), _u32(obj, "y", "image_op.op"),
                    _u32(obj, "width", "image_op.op"), _u32(obj, "height", "image_op.op"))
    if not isinstance(tag, str):
        raise AbiError(f"`image_op.op.op` must be a string, got {_type_name(tag)}")
    raise AbiError(f"unknown image operation `{clip(tag, 64)}` (resize or crop)")


def parse_command(raw: bytes | bytearray | memoryview, *, max_values: int = 1_000_000) -> Command:
    """Bytes from a guest -> a ``Command``, or ``AbiError`` naming the problem."""
    return command_from_json(loads_strict(raw, max_values=max_values))


def event_from_json(value: Any) -> Event:
    """Parse an event (used by tests and replay; the host only writes events)."""
    obj = _expect_object(value, "an event")
    tag = obj.get("event")
    if tag == "infer_done":
        calls = obj.get("tool_calls")
        if calls is not None and not (isinstance(calls, list) and all(
                isinstance(c, dict) and all(isinstance(c.get(k), str) for k in ("call_id", "name", "arguments"))
                for c in calls)):
            raise AbiError("`infer_done.tool_calls` must be an array of {call_id, name, arguments} strings")
        logprobs = obj.get("logprobs")
        if logprobs is not None and not (isinstance(logprobs, list) and all(isinstance(x, dict) for x in logprobs)):
            raise AbiError("`infer_done.logprobs` must be an array of objects or null")
        confidence = obj.get("confidence")
        if confidence is not None and not (isinstance(confidence, dict) and all(
                v is None or (type(v) in (int, float) and 0 <= v <= 1) for v in confidence.values())):
            raise AbiError("`infer_done.confidence` must be an object of numbers from 0 to 1 (or null) or null")
        return InferDone(_field(obj, "text", str, "infer_done"), _u32(obj, "tokens_out", "infer_done"),
                         tuple(calls) if calls is not None else None,
                         tuple(logprobs) if logprobs is not None else None, confidence)
    if tag == "opened":
        kind = MediaKind.from_json(obj["kind"]) if "kind" in obj else TEXT
        return Opened(_u32(obj, "handle", "opened"), _u64(obj, "len", "opened"), kind)
    if tag == "sliced":
        return Sliced(_field(obj, "text", str, "sliced"), _u64(obj, "next_offset", "sliced"))
    if tag == "sliced_bytes":
        return SlicedBytes(_field(obj, "bytes_base64", str, "sliced_bytes"),
                           _u64(obj, "next_offset", "sliced_bytes"))
    if tag == "embedded":
        return Embedded(_any(obj, "vectors", "embedded"))
    if tag == "emitted":
        return Emitted()
    if tag == "page_texted":
        return PageTexted(_field(obj, "text", str, "page_texted"))
    if tag == "page_text_attempted":
        text, error = obj.get("text"), obj.get("error")
        if not (text is None or isinstance(text, str)) or not (error is None or isinstance(error, str)):
            raise AbiError("`page_text_attempted.text` and `.error` must be strings or null")
        return PageTextAttempted(text, error)
    if tag == "page_imaged":
        return PageImaged(_u32(obj, "handle", "page_imaged"), _u64(obj, "len", "page_imaged"))
    raise AbiError(f"unknown event `{tag}`")


__all__ = [
    "JobStatus", "TokenAction", "MediaKind", "TEXT", "BINARY", "INFER_EXTENSIONS", "INFER_SAMPLING", "Infer", "Open",
    "Slice", "SliceBytes", "Embed", "Emit", "Done", "Fail", "PageText", "PageTextOpt", "PageImage", "DocumentText",
    "Resize", "Crop", "ImageOperation", "ImageOp", "Fetch", "Command", "UNSUPPORTED_COMMANDS", "InferDone", "Opened",
    "Sliced", "SlicedBytes", "Embedded", "Emitted", "PageTexted", "PageTextAttempted", "PageImaged", "Event",
    "Usage", "JobError", "Envelope", "encode_event", "UnsupportedCommand", "command_from_json",
    "MAX_TOOLS", "MAX_STOPS", "MAX_STOP_CHARS", "MAX_REGEX_CHARS", "MAX_GRAMMAR_CHARS", "MAX_CHOICES",
    "MAX_CHOICE_CHARS", "MAX_TOP_LOGPROBS", "parse_command", "event_from_json"
]

"""The request and answer shapes every model backend speaks.

A job never touches a model directly: it sends a ``GenerateRequest`` (or a
list of texts to embed) to a backend and gets a ``concurrent.futures.Future``
back, so the job's own thread stays free to step the guest, watch for
cancellation and forward tokens while the model works elsewhere. Streaming is
a callback per token whose return value says whether to go on: that is the
return path a guest's stop verdict (or a cancel) takes to reach the decoder.

``ModelEngine`` is the synchronous thing that owns a model and runs only on its
worker thread; ``Backend`` is what jobs hold (see ``worker.InferenceWorker``).
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable, Optional, Protocol, Sequence

from tensorjob_jupyter.abi import JobFailure, codes
from tensorjob_jupyter.inference.logprobs import TokenLogprob

#: Called with each piece of text; False stops the generation. A piece may be a ``logprobs.TokenText``,
#: a ``str`` that carries the records of the tokens it was made of. A callback may also have a
#: ``ready(timeout) -> bool`` method: whether it would take the next piece now without waiting
#: (``host/tokens.py``'s lookahead credit), waiting up to ``timeout`` seconds to become so.
TokenCallback = Callable[[str], bool]

FINISH_STOP = "stop"
FINISH_LENGTH = "length"
FINISH_CANCELLED = "cancelled"
#: The caller's ``on_token`` said stop (a guest's verdict); how a response records an answer so ended.
FINISH_GUEST_STOP = "guest_stop"


class ModelError(JobFailure):
    """The model failed (to load, or while generating): ``model_load_failed``."""

    CODE = codes.MODEL_LOAD_FAILED

    def __init__(self, message: str):
        super().__init__(self.CODE, message)
        #: What the request had spent when it failed (a grammar past its bounds mid-answer), set by the engine
        #: where it knows; None: nothing known (the caller counts what it was delivered).
        self.usage: GenerateUsage | None = None


class QueueFull(ModelError):
    """The worker's request queue is full (or a server said too many requests); the request was not accepted:
    ``busy``."""

    CODE = codes.BUSY


class ConstraintError(ModelError):
    """The engine cannot constrain decoding as asked (a grammar it refuses, or one that would cost the shared
    model past its bounds): ``schema_validation_failed``.

    Raised before any token of the request is generated, or -- a grammar whose cost grows with its output --
    at the token that would pass the bounds (that request alone fails)."""

    CODE = codes.SCHEMA_VALIDATION_FAILED


class RequestTooLarge(ModelError):
    """One request asks more of the shared model than a request may (an embed past its token budget);
    it was not run: ``limit_exceeded``."""

    CODE = codes.LIMIT_EXCEEDED


class ModelTimeout(ModelError):
    """The model did not answer in time (a served model's server went silent or ran past its limit): ``timeout``."""

    CODE = codes.TIMEOUT


#: The repetition penalty a job uses unless told otherwise: mild, so a small
#: model does not loop on its own sentences (``Sampler``'s own default is 1.0, off).
DEFAULT_REPEAT_PENALTY = 1.1


@dataclass(frozen=True)
class Sampler:
    """Sampling settings; temperature 0 means greedy decoding."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repeat_penalty: float = 1.0
    seed: int = 0
    stop: tuple[str, ...] = ()

    def to_json(self) -> dict:
        """As a job's record shows it (``job.created``, the response object)."""
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k,
                "min_p": self.min_p, "repeat_penalty": self.repeat_penalty, "seed": self.seed,
                "stop": list(self.stop)}


@dataclass(frozen=True)
class LoraChoice:
    """One adapter, by configured name, and the scale to apply it at."""

    name: str
    scale: float = 1.0


@dataclass(frozen=True)
class Constraint:
    """What the output must be, for an engine that can constrain decoding: exactly one of

    * ``schema``: the canonical JSON text of a JSON Schema the whole output must match (checked by the
      host: ``host/structured.py``);
    * ``regex``: a regular expression the whole output matches;
    * ``choices``: the output is one of these strings;
    * ``lark``: a Lark grammar (llguidance's dialect) the output is a sentence of.

    With ``free_text`` (a schema only) the output may instead be plain text: the first token decides --
    one that begins with ``{`` binds the rest of the output to the schema, any other first character frees
    it (text cannot begin with whitespace or ``{``). That is how a model chooses between a tool call and an
    answer (``tool_choice: "auto"``).
    """

    schema: str | None = None
    free_text: bool = False
    regex: str | None = None
    choices: tuple[str, ...] | None = None
    lark: str | None = None

    def __post_init__(self) -> None:
        given = [k for k in ("schema", "regex", "choices", "lark") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"a Constraint takes exactly one of schema, regex, choices and lark, got {given}")
        if self.free_text and self.schema is None:
            raise ValueError("free_text goes with a schema (a tool call or an answer)")

    @property
    def kind(self) -> str:
        """``json``, ``regex``, ``choices`` or ``lark``."""
        return ("json" if self.schema is not None else "regex" if self.regex is not None
                else "choices" if self.choices is not None else "lark")


@dataclass(frozen=True)
class ToolUse:
    """The functions a model may call, for an engine that takes them natively (a served model's
    ``tools`` and ``tool_choice``). The local engine does not read it: ``constraint`` and ``system``
    say the same to its grammar and its prompt.

    ``functions``: JSON text of a list of ``{"name", "description"?, "parameters"}``, the guest's own
    schemas; ``choice``: ``auto``, ``required``, or ``function`` with ``name`` the one to call.
    """

    functions: str
    choice: str
    name: str | None = None


@dataclass(frozen=True)
class GenerateRequest:
    prompt: str
    max_tokens: int
    sampler: Sampler = field(default_factory=Sampler)
    cache_prompt: bool = True
    lora: tuple[LoraChoice, ...] = ()
    #: Apply the model's chat template to the prompt; None: when the model has one.
    chat: bool | None = False
    #: Constrained decoding (structured output, tool calls); None: free text.
    constraint: Constraint | None = None
    #: Instructions before the prompt (the tools a model may call): a system turn
    #: in chat form, a paragraph before the prompt in raw form.
    system: str | None = None
    #: The tools themselves, for an engine that takes them natively; None: no tool may be called.
    tools: ToolUse | None = None
    #: Decode this request with no other sequence in its decode steps, waiting for the batch to drain first
    #: and keeping others waiting meanwhile (a deterministic map: its answer does not depend on what else runs).
    #: An engine that does not batch, or cannot tell (a served model), ignores it.
    alone: bool = False
    #: With ``alone``: the decode threads to use for it (None: the engine's own); restored afterwards.
    threads: int | None = None
    #: Record each generated token's logprob (``logprobs.TokenLogprob``, on the pieces and the result): a
    #: served model is asked for them, the local engine reads them off the logits it samples from.
    logprobs: bool = True
    #: How many of the most likely tokens each record lists beside the chosen one (0 to
    #: ``logprobs.MAX_TOP_LOGPROBS``).
    top_logprobs: int = 0


@dataclass
class GenerateUsage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    time_to_first_token_s: float | None = None
    tokens_per_second: float | None = None
    #: The most sequences decoded together in one step while this request ran (1: alone); None: not known.
    batch: int | None = None
    #: The decode threads the engine used for it; None: not known.
    threads: int | None = None
    #: The threads the engine decodes with on a free machine: more than ``threads`` when it fitted fewer to the
    #: CPUs other work left it (``LlamaEngine``); None: not known.
    own_threads: int | None = None
    #: The tokens a second the engine's sequences decoded at in steps of ``batch`` while other work left the machine
    #: quiet (``LlamaEngine``, when it watches the machine): what ``tokens_per_second`` is to be read against.
    quiet_tokens_per_second: float | None = None


@dataclass
class GenerateResult:
    text: str
    finish_reason: str
    usage: GenerateUsage = field(default_factory=GenerateUsage)
    #: The delivered tokens' records, in order (what the pieces carried); None where the engine gave none
    #: (a served model that offers no logprobs, a request that asked for none).
    logprobs: list[TokenLogprob] | None = None


#: A generation's answer: (result, None) on success, (None, error) on failure.
DoneCallback = Callable[[Optional[GenerateResult], Optional[BaseException]], None]


@dataclass
class Pending:
    """One generate request handed to a batching engine, with where its answer goes."""

    request: GenerateRequest
    on_token: TokenCallback
    done: DoneCallback
    tokens: list[int] | None = None  # the prompt, once the engine has tokenized it
    #: True once the request's job has ended (timeout, cancel): the engine ends it at once, between decode
    #: steps and inside a grammar's whole-vocabulary pass, without waiting for a token to deliver.
    abandoned: Callable[[], bool] = lambda: False
    #: ``on_token``'s ``ready`` (see ``TokenCallback``): a batching engine asks it before delivering, and a
    #: sequence whose listener is not ready keeps its token and sits the next decode out, so one late listener
    #: never holds the others' decode step.
    ready: Callable[[float], bool] = lambda timeout: True


class ModelEngine(Protocol):
    """Owns one model; called only from its worker thread.

    An engine may also offer ``serve(first: Pending, admit)``: run ``first``
    and every request ``admit(wait)`` hands over meanwhile in shared decode
    steps (``wait``: seconds to wait for one to arrive, default 0), calling
    each ``Pending.done`` as it finishes (continuous batching). The worker uses
    it when present.

    And ``embedding(texts)``: an embed in pieces, an object whose ``step()``
    decodes one bounded piece and says whether it is finished, with the
    vectors then in ``vectors``. The worker serves waiting generation requests
    between the pieces and stops an abandoned embed there.
    """

    model_name: str

    def generate(self, request: GenerateRequest, on_token: TokenCallback) -> GenerateResult: ...

    def embed(self, texts: Sequence[str]) -> list[list[float]]: ...

    def prompt_tokens(self, request: GenerateRequest) -> list[int]:
        """The tokens of ``request``'s prompt as this engine decodes it (nothing is decoded)."""
        ...


class Backend(Protocol):
    """What a job holds: submit work, get futures. Thread-safe."""

    @property
    def model_name(self) -> str: ...

    def generate_stream(self, request: GenerateRequest, on_token: TokenCallback) -> "Future[GenerateResult]": ...

    def embed(self, texts: Sequence[str]) -> "Future[list[list[float]]]": ...


__all__ = [
    "TokenCallback", "FINISH_STOP", "FINISH_LENGTH", "FINISH_CANCELLED", "FINISH_GUEST_STOP", "ModelError",
    "QueueFull", "ConstraintError", "RequestTooLarge", "ModelTimeout", "DEFAULT_REPEAT_PENALTY", "Sampler",
    "LoraChoice", "Constraint", "ToolUse", "GenerateRequest", "GenerateUsage", "GenerateResult", "DoneCallback",
    "Pending", "ModelEngine", "Backend"
]

"""The OpenAI wire of ``tensorjob serve``: a request body read into one checked generation, an answer written back.

``plan`` reads a ``/v1/completions`` or ``/v1/chat/completions`` body as a guest's ``infer`` is read
(``abi.command_from_json``, then ``host/structured.py`` for the constraint), with OpenAI's, llama-cpp-python's and
vLLM's ways of asking for structured output; every field that would change the answer and is not honoured is
refused (``RequestError``, an HTTP status and one line), never ignored. ``Answer`` writes the answer back, whole or
as server-sent events. The HTTP app, its bounds and the socket are ``server.py``'s.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass
from typing import Any

from tensorjob_jupyter import abi
from tensorjob_jupyter.host.schemas import SchemaError
from tensorjob_jupyter.host.structured import OutputSpec
from tensorjob_jupyter.inference.base import (
    FINISH_LENGTH, ConstraintError, GenerateRequest, GenerateResult, ModelError, QueueFull, RequestTooLarge, Sampler,
)
from tensorjob_jupyter.inference.logprobs import logprobs_of, openai_logprobs

#: ``max_tokens`` when a request gives none.
DEFAULT_MAX_TOKENS = 256
#: Fields that change an answer and that this server does not honour: refused, never silently ignored
#: (the value each may have and still be served).
UNSERVED_FIELDS: dict[str, tuple[Any, ...]] = {
    "logit_bias": (None, {}), "presence_penalty": (None, 0, 0.0), "frequency_penalty": (None, 0, 0.0),
    "echo": (None, False), "suffix": (None, ""), "best_of": (None, 1)}


class ClientLeft(Exception):
    """The client hung up before its answer was ready."""


class RequestError(Exception):
    """A request this server answers with an HTTP error: ``status`` and a one-line message."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind


@dataclass(frozen=True)
class Planned:
    """One checked generation request, and what its answer reports."""

    request: GenerateRequest
    stream: bool
    include_usage: bool
    chat: bool
    #: Each token's logprob is answered (``logprobs`` asked).
    logprobs: bool = False


# --- an OpenAI request as an infer -------------------------------------------------------------


#: ``response_format`` types beyond OpenAI's (this server's extension), each the infer field of the same name.
TEXT_FORMATS = ("regex", "choices", "grammar")
#: vLLM's body fields for structured output (``guided_*`` before its v0.12; ``structured_outputs`` since v0.10.2,
#: whose keys are below), and the infer field each becomes.
VLLM_FIELDS = {"guided_json": "format", "guided_regex": "regex", "guided_choice": "choices",
               "guided_grammar": "grammar"}
VLLM_STRUCTURED_OUTPUTS = {"json": "format", "regex": "regex", "choice": "choices", "grammar": "grammar"}


def _response_format(value: Any) -> dict:
    """OpenAI's ``response_format`` (and llama-cpp-python's json_object with a schema, and this server's regex,
    choices and grammar) as an infer's fields: ``format``, ``regex``, ``choices`` or ``grammar``."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise RequestError(400, "response_format must be an object")
    kind = value.get("type")
    if kind == "text":
        return {}
    if kind == "json_object":
        if isinstance(value.get("schema"), dict):
            return {"format": {"type": "json_schema", "name": "output", "schema": value["schema"]}}
        return {"format": {"type": "json_object"}}
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
            raise RequestError(400, "response_format json_schema needs json_schema.schema, an object")
        return {"format": {"type": "json_schema", "name": str(spec.get("name") or "output")[:64],
                           "schema": spec["schema"]}}
    if kind in TEXT_FORMATS:
        if value.get(kind) is None:
            raise RequestError(400, f"response_format {kind} needs {kind}, "
                                    f"{'an array of strings' if kind == 'choices' else 'a string'}")
        return {kind: value[kind]}
    raise RequestError(400, "response_format.type must be text, json_object, json_schema, regex, choices or grammar, "
                            f"not {str(kind)[:40]!r}")


def _json_format(schema: Any, where: str) -> dict:
    """vLLM's JSON Schema (an object, or its JSON text) as an infer's format."""
    if isinstance(schema, str):
        try:
            schema = abi.loads_strict(schema.encode("utf-8", "surrogatepass"), what=f"`{where}`")
        except abi.AbiError as e:
            raise RequestError(400, str(e)) from None
    if not isinstance(schema, dict):
        raise RequestError(400, f"`{where}` must be a JSON Schema object")
    return {"type": "json_schema", "name": "output", "schema": schema}


def _constraints(body: dict) -> dict:
    """The infer's ``format``, ``regex``, ``choices`` or ``grammar`` from ``response_format`` and vLLM's fields; a
    field given twice is refused here, two different ones by the infer's own checks."""
    given: list[tuple[str, str, Any]] = [("response_format", k, v)
                                         for k, v in _response_format(body.get("response_format")).items()]
    for name, field in VLLM_FIELDS.items():
        if body.get(name) is not None:
            value = _json_format(body[name], name) if field == "format" else body[name]
            given.append((name, field, value))
    outputs = body.get("structured_outputs")
    if outputs is not None:
        if not isinstance(outputs, dict):
            raise RequestError(400, "structured_outputs must be an object")
        # a client that sends vLLM's whole StructuredOutputsParams sends its other fields as null or false
        unknown = sorted(k for k, v in outputs.items() if v not in (None, False) and k not in VLLM_STRUCTURED_OUTPUTS)
        if unknown:
            raise RequestError(400, f"tensorjob serve takes structured_outputs with json, regex, choice or grammar, "
                                    f"not {', '.join(str(k)[:40] for k in unknown[:4])}")
        for key, field in VLLM_STRUCTURED_OUTPUTS.items():
            if outputs.get(key) is not None:
                name = f"structured_outputs.{key}"
                given.append((name, field, _json_format(outputs[key], name) if field == "format" else outputs[key]))
    fields: dict[str, Any] = {}
    source: dict[str, str] = {}
    for name, field, value in given:
        if field in source:
            raise RequestError(400, f"{source[field]} and {name} both constrain the answer: give one")
        fields[field], source[field] = value, name
    return fields


def _chat_prompt(messages: Any) -> tuple[str, str | None]:
    """(the user's text, the system text) of a chat request: one user message after an optional system one."""
    if not isinstance(messages, list) or not messages:
        raise RequestError(400, "messages must be a non-empty array")
    system = None
    if isinstance(messages[0], dict) and messages[0].get("role") in ("system", "developer") and len(messages) == 2:
        system = _content(messages[0])
        messages = messages[1:]
    if len(messages) != 1 or not isinstance(messages[0], dict) or messages[0].get("role") != "user":
        raise RequestError(400, "tensorjob serve takes one user message, after an optional system message "
                                "(a conversation's turns are the client's to fold into them)")
    return _content(messages[0]), system


def _content(message: dict) -> str:
    content = message.get("content")
    if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                   for p in content):
            raise RequestError(400, "only text content is served (no images or audio)")
        content = "".join(p["text"] for p in content)
    if not isinstance(content, str):
        raise RequestError(400, "a message's content must be a string")
    return content


def plan(body: Any, *, chat: bool) -> Planned:
    """Check one ``/chat/completions`` or ``/completions`` body; ``RequestError`` says what is wrong."""
    if not isinstance(body, dict):
        raise RequestError(400, "the request body must be a JSON object")
    if body.get("tools") or body.get("functions"):
        raise RequestError(400, "tensorjob serve does not take tools: hold the call to a response_format "
                                "(tensorjob's own client does)")
    if body.get("n", 1) != 1:
        raise RequestError(400, "n must be 1")
    for name, served_values in UNSERVED_FIELDS.items():
        value = body.get(name)
        if not any(value == v and type(value) is type(v) for v in served_values):
            raise RequestError(400, f"tensorjob serve does not take {name} (it would be ignored, and the answer "
                                    f"would not be what was asked)")
    if chat:
        prompt, system = _chat_prompt(body.get("messages"))
    else:
        given = body.get("prompt")
        if isinstance(given, list) and len(given) == 1:
            given = given[0]
        if not isinstance(given, str):
            raise RequestError(400, "prompt must be a string (one prompt a request)")
        prompt, system = given, None
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    infer = {"cmd": "infer", "prompt": prompt, "max_tokens": DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens,
             **_constraints(body)}
    for name in abi.INFER_SAMPLING:
        if body.get(name) is not None:
            infer[name] = body[name]
    try:
        command = abi.command_from_json(infer)
        if not isinstance(command, abi.Infer):  # "cmd" is "infer" above: nothing else parses from it
            raise TypeError(f"an infer parsed as {type(command).__name__}")
        spec = OutputSpec.of(command)
    except (abi.AbiError, SchemaError) as e:
        raise RequestError(400, str(e).replace("`infer.", "`").replace("infer: ", "")) from None
    options = body.get("stream_options")
    logprobs, top = _logprobs(body, chat)
    request = GenerateRequest(command.prompt, command.max_tokens, Sampler(**command.sampling()), chat=chat,
                              constraint=spec.constraint, system=system, logprobs=logprobs, top_logprobs=top)
    return Planned(request, bool(body.get("stream")),
                   isinstance(options, dict) and bool(options.get("include_usage")), chat, logprobs)


def _logprobs(body: dict, chat: bool) -> tuple[bool, int]:
    """(whether each token's logprob is answered, how many alternatives beside it), as OpenAI reads them:
    chat's ``logprobs`` (true or false) and ``top_logprobs`` (which needs it), completions' ``logprobs: N``."""
    most = abi.MAX_TOP_LOGPROBS
    asked, top = body.get("logprobs"), body.get("top_logprobs")

    def count(value: Any, name: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= most:
            raise RequestError(400, f"{name} must be a whole number from 0 to {most}")
        return value

    if chat:
        if asked is not None and not isinstance(asked, bool):
            raise RequestError(400, "logprobs must be true or false")
        n = 0 if top is None else count(top, "top_logprobs")
        if n and not asked:
            raise RequestError(400, "top_logprobs needs logprobs: true")
        return bool(asked), n
    if top not in (None, 0) or isinstance(top, bool):
        raise RequestError(400, "/completions takes logprobs: N (the alternatives beside each token), "
                                "not top_logprobs")
    if asked is None or asked is False:
        return False, 0
    return True, count(asked, "logprobs")


# --- answers ----------------------------------------------------------------------------------


class Answer:
    """The OpenAI objects of one answer: chunks while it streams, the whole at its end."""

    def __init__(self, planned: Planned, model: str):
        self.chat = planned.chat
        self.logprobs = planned.logprobs
        self.model = model
        self._chars = 0  # of the answer streamed so far: the legacy shape's text_offset
        self.id = ("chatcmpl-" if self.chat else "cmpl-") + secrets.token_hex(12)
        self.created = int(time.time())

    def _envelope(self, choices: list, *, whole: bool) -> dict:
        kind = ("chat.completion" if whole else "chat.completion.chunk") if self.chat else "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model, "choices": choices}

    def piece(self, text: str) -> bytes:
        choice = ({"index": 0, "delta": {"content": text}, "finish_reason": None} if self.chat
                  else {"index": 0, "text": text, "finish_reason": None})
        choice["logprobs"] = self._logprobs(logprobs_of(text))
        self._chars += len(text)
        return event_bytes(self._envelope([choice], whole=False))

    def _logprobs(self, records) -> dict | None:
        return openai_logprobs(records, chat=self.chat, offset=self._chars) if self.logprobs else None

    def end(self, result: GenerateResult, include_usage: bool) -> bytes:
        finish = _finish(result)
        choice = ({"index": 0, "delta": {}, "finish_reason": finish, "logprobs": None} if self.chat
                  else {"index": 0, "text": "", "finish_reason": finish, "logprobs": None})
        out = event_bytes(self._envelope([choice], whole=False))
        if include_usage:
            out += event_bytes({**self._envelope([], whole=False), "usage": _usage(result)})
        return out + b"data: [DONE]\n\n"

    def whole(self, result: GenerateResult) -> dict:
        finish = _finish(result)
        choice = ({"index": 0, "message": {"role": "assistant", "content": result.text}, "finish_reason": finish}
                  if self.chat else {"index": 0, "text": result.text, "finish_reason": finish})
        choice["logprobs"] = self._logprobs(result.logprobs or ())
        return {**self._envelope([choice], whole=True), "usage": _usage(result)}


def _finish(result: GenerateResult) -> str:
    return "length" if result.finish_reason == FINISH_LENGTH else "stop"


def _usage(result: GenerateResult) -> dict:
    u = result.usage
    return {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
            "total_tokens": u.prompt_tokens + u.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": u.cached_tokens}}


def event_bytes(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n\n"


def parse_body(data: bytes) -> Any:
    """A request body, bounded as a guest's command is: depth, values, no NaN, no duplicate keys, UTF-8."""
    try:
        return abi.loads_strict(data, what="the request body")
    except abi.AbiError as e:
        raise RequestError(400, str(e)) from None


def error_body(status: int, message: str, kind: str) -> dict:
    return {"error": {"message": message, "type": kind, "code": status}}


def model_failure(e: BaseException) -> RequestError:
    if isinstance(e, QueueFull):
        return RequestError(429, str(e), "rate_limit_error")
    if isinstance(e, (ConstraintError, RequestTooLarge)):
        return RequestError(400, str(e))
    if isinstance(e, ModelError) and "n_ctx" in str(e):  # the prompt does not fit the context
        return RequestError(400, str(e))
    return RequestError(500, f"{type(e).__name__}: {e}" if not isinstance(e, ModelError) else str(e), "server_error")


__all__ = [
    "DEFAULT_MAX_TOKENS", "UNSERVED_FIELDS", "ClientLeft", "RequestError", "Planned", "TEXT_FORMATS", "VLLM_FIELDS",
    "VLLM_STRUCTURED_OUTPUTS", "plan", "Answer", "event_bytes", "parse_body", "error_body", "model_failure",
]

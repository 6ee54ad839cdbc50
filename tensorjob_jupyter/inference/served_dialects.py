"""What each kind of OpenAI-compatible server understands beyond the OpenAI API: its ``Dialect``.

vLLM, llama.cpp's server, llama-cpp-python's, Ollama, this package's own ``tensorjob serve`` and a hosted
OpenAI endpoint differ in the fields they take for the repeat penalty, top-k and min-p, where a schema, a regex,
choices or a Lark grammar goes and which of them they enforce, which tool choices they take natively, and
whether one embeddings request may hold several texts. ``DIALECTS`` names each, and ``OWNERS`` reads one off
the ``owned_by`` of a server's ``/v1/models``. Apart from the backend because it is a table of facts about
servers, which grows with them, not with the client.

Design: docs/internals/inference.md#what-maps-to-the-request
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from tensorjob_jupyter.inference.base import Constraint

#: ``owned_by`` in this package's own server's ``/v1/models`` (``serve/server.py``), and its dialect's name.
TENSORJOB_OWNER = "tensorjob"


@dataclass(frozen=True)
class Dialect:
    """What one kind of OpenAI-compatible server accepts beyond the OpenAI API."""

    name: str
    #: the extra body field for llama.cpp's multiplicative repeat penalty; None: not sent
    repeat_penalty: str | None = None
    #: top_k and min_p as extra body fields, and the top_k that means "off"
    top_k_min_p: bool = False
    top_k_off: int = 0
    #: "json_schema" (the OpenAI shape) or "json_object" (llama-cpp-python: a json_object with a schema)
    schema_format: str = "json_schema"
    #: one text per /embeddings request: llama-cpp-python answers every text of a batch after the first
    #: with the wrong vectors when it returns one vector per token
    embed_one_at_a_time: bool = False
    #: the ``tool_choice`` kinds sent as native ``tools``/``tool_choice`` (``auto``, ``required``,
    #: ``function``); any other choice is held to the host's call JSON with ``response_format``
    native_tools: frozenset[str] = frozenset(("auto", "required", "function"))
    #: whether the server's chat template shows the model its tools; if not, they travel in a system turn too
    renders_tools: bool = True
    #: ``parallel_tool_calls: false`` is understood (a response holds one call)
    one_call_field: bool = False
    #: the ``Constraint`` kinds the server holds its decoding to (``json``, ``regex``, ``choices``, ``lark``);
    #: a constraint of another kind is sent unconstrained, and the host checks the answer
    enforces: frozenset[str] = frozenset(("json",))
    #: where a regex, choices or a Lark grammar goes: ``structured_outputs`` (vLLM's fields) or
    #: ``response_format`` (this package's own server's extension of it)
    text_fields: str = "response_format"

    def response_format(self, schema: Any) -> dict:
        if self.schema_format == "json_object":
            return {"type": "json_object", "schema": schema}
        return {"type": "json_schema", "json_schema": {"name": "output", "schema": schema, "strict": True}}

    def constraint_fields(self, c: Constraint) -> dict[str, Any]:
        """The request fields that hold the server to ``c`` (of a kind in ``enforces``)."""
        if c.schema is not None:  # c.kind == "json"
            return {"response_format": self.response_format(json.loads(c.schema))}
        value = c.regex if c.regex is not None else list(c.choices) if c.choices is not None else c.lark
        if self.text_fields == "structured_outputs":
            # vLLM: ``structured_outputs`` (read since v0.10.2, the only form since v0.12) and the same value
            # in the ``guided_*`` field older servers read (and newer ones ignore)
            key = {"regex": "regex", "choices": "choice", "lark": "grammar"}[c.kind]
            return {"structured_outputs": {key: value}, f"guided_{key}": value}
        kind = "grammar" if c.kind == "lark" else c.kind
        return {"response_format": {"type": kind, kind: value}}


ALL_KINDS = frozenset(("json", "regex", "choices", "lark"))

DIALECTS = {
    "openai": Dialect("openai", one_call_field=True),
    "llama.cpp": Dialect("llama.cpp", "repeat_penalty", True, 0),
    # llama-cpp-python enforces a named function only (a grammar on its parameters), and its generic
    # chat handler leaves the tools out of the prompt
    "llama-cpp-python": Dialect("llama-cpp-python", "repeat_penalty", True, 0, "json_object", True,
                                native_tools=frozenset(("function",)), renders_tools=False),
    # vLLM's "auto" needs server flags (--enable-auto-tool-choice); "required" and a named function do not
    # vLLM's structured outputs take a regex, choices and a grammar besides a schema
    "vllm": Dialect("vllm", "repetition_penalty", True, -1, native_tools=frozenset(("required", "function")),
                    enforces=ALL_KINDS, text_fields="structured_outputs"),
    # this package's own server (serve/server.py): the local engine's sampling and grammars; calls held to a
    # schema
    TENSORJOB_OWNER: Dialect(TENSORJOB_OWNER, "repeat_penalty", True, 0, native_tools=frozenset(),
                             enforces=ALL_KINDS),
    # Ollama ignores tool_choice, and a model without a tool template refuses tools: calls held to a schema
    "ollama": Dialect("ollama", native_tools=frozenset()),
}
#: ``owned_by`` in ``/v1/models`` -> the dialect; anything else speaks plain OpenAI.
OWNERS = {"me": "llama-cpp-python", "llamacpp": "llama.cpp", "vllm": "vllm", TENSORJOB_OWNER: TENSORJOB_OWNER,
          "library": "ollama", "ollama": "ollama"}


@dataclass(frozen=True)
class ServerInfo:
    """What ``/v1/models`` told of a server: the model id its requests carry, and the dialect it speaks."""

    model: str
    dialect: Dialect


__all__ = ["TENSORJOB_OWNER", "Dialect", "ALL_KINDS", "DIALECTS", "OWNERS", "ServerInfo"]

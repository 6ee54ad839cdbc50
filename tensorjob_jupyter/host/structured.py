"""Structured output and tool calls: what a guest's ``infer`` may ask the model to produce.

An ``infer`` may carry a ``format``, a ``regex``, ``choices``, a Lark ``grammar``, or ``tools``. ``OutputSpec.of``
checks them and refuses what the grammar engine cannot enforce before a token is generated; ``OutputRouter``
publishes the streamed text as the right Open Responses item; ``OutputSpec.check`` checks the finished output
independently of the engine that produced it. What is remembered between infers is bounded in bytes.

Design: docs/internals/host.md#structuredpy
"""

from __future__ import annotations

import dataclasses
import json
import secrets
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from tensorjob_jupyter.host.quoting import asks_quotes
from tensorjob_jupyter.host.schemas import (
    MAX_SCHEMA_BYTES, SPEC_MEMO_BYTES, SchemaError, check_schema, first_error, tool_call_schema, validator_for,
)
from tensorjob_jupyter.inference import grammar
from tensorjob_jupyter.inference.base import Constraint, ConstraintError, ToolUse
from tensorjob_jupyter.inference.logprobs import logprobs_of
from tensorjob_jupyter.inference.memo import MISSING, BytesLRU

# --- one infer's output --------------------------------------------------------------------------


#: The infer fields that hold a whole answer to a text grammar, and how messages name each.
TEXT_CONSTRAINTS = ("regex", "choices", "grammar")
KIND_WORDS = {"regex": "regex", "choices": "choices", "grammar": "Lark grammar", "json": "format's schema"}

TOOLS_SYSTEM = ("You can call functions. To call one, reply with only a JSON object: "
                '{"name": <the function\'s name>, "arguments": <an object of its parameters>}. '
                "Take the arguments' values from the user's message.")


@dataclass
class ToolCall:
    call_id: str
    name: str
    arguments: str

    def to_json(self) -> dict:
        return {"call_id": self.call_id, "name": self.name, "arguments": self.arguments}


@dataclass
class OutputSpec:
    """What one infer's output must be, checked: the constraint, the instructions, the reports.

    ``kind``: ``text`` (free), ``json`` (a format), ``regex``, ``choices``,
    ``grammar`` (a Lark grammar), ``call`` (a tool call is required) or
    ``auto`` (a tool call or an answer, the model's choice).
    """

    kind: str = "text"
    constraint: Constraint | None = None
    system: str | None = None
    format: dict = field(default_factory=lambda: {"type": "text"})
    tools: list[dict] = field(default_factory=list)
    tool_choice: Any = "none"
    #: the guest's schemas, as given: the output is validated against these
    output_schema: Any = None
    tool_schemas: dict[str, Any] = field(default_factory=dict)
    #: string fields are to be copied from what the job read (``quoting.py``): the constraint is made per infer
    quote: bool = False

    @property
    def constrained(self) -> bool:
        return self.kind not in ("text", "auto")

    @classmethod
    def of(cls, infer, check_running: Callable[[], None] | None = None) -> "OutputSpec":
        """The spec of an ``abi.Infer`` (its shapes already checked); ``SchemaError`` if a schema
        asks for what the grammar cannot enforce.

        ``check_running`` (the job's cancel and deadline check): when given and the spec is not memoised,
        the check runs on a helper thread while this one calls it every ``CHECK_POLL_S``; what it raises
        ends the wait at once. No deadline reaches host work, and the first check in a process pays for
        importing ``jsonschema`` (seconds on a loaded machine): without this a job past its time limit
        ends only when its schema check does. The abandoned check finishes on its own (bounded by the
        schema's size) and is memoised for the next infer."""
        fmt = infer.format
        tools = list(infer.tools or ())
        choice = infer.tool_choice if infer.tool_choice is not None else ("auto" if tools else "none")
        text = {k: getattr(infer, k, None) for k in TEXT_CONSTRAINTS if getattr(infer, k, None) is not None}
        structured = fmt is not None and fmt.get("type") != "text"
        if not structured and not text and (not tools or choice == "none"):
            return cls(tools=[_tool_report(t) for t in tools], tool_choice=choice)
        key = json.dumps({"format": fmt, "tools": tools, "tool_choice": choice,  # key order is meaning
                          **{k: list(v) if isinstance(v, tuple) else v for k, v in text.items()}})
        if len(key) > MAX_SCHEMA_BYTES:  # ASCII (non-ASCII is escaped): characters are bytes
            raise SchemaError(f"the format, tools, regex, choices and grammar of this infer are {len(key)} bytes "
                              f"of JSON, over the {MAX_SCHEMA_BYTES} a schema may take; send a smaller one (fewer "
                              f"or shorter enum values or choices, fewer tools)")
        return _compile(key) if check_running is None else _compile_watched(key, check_running)

    # -- the finished output ------------------------------------------------------------------

    def check(self, text: str, call_id: str | None = None) -> tuple[str, list[ToolCall] | None]:
        """(the message text, the tool calls) of a finished output; ``SchemaError`` if it does not
        match what was asked. A tool call's message text is empty."""
        if self.kind == "text" or (self.kind == "auto" and not text.startswith("{")):
            return text, None
        if self.kind in TEXT_CONSTRAINTS:
            assert self.constraint is not None, "a regex, choices or grammar kind comes with its constraint"
            if not grammar.matches(self.constraint, text):
                raise SchemaError(f"the model's output does not match the infer's {KIND_WORDS[self.kind]}")
            return text, None
        try:
            value = json.loads(text)
        except ValueError as e:
            raise SchemaError(f"the model's output is not JSON: {e}") from None
        except RecursionError:  # a grammar may allow any depth ({"type": "object"}, a recursive schema)
            raise SchemaError("the model's output is JSON nested too deeply to be read (past Python's recursion "
                              "limit)") from None
        if self.kind == "json":
            error = first_error(validator_for(self.output_schema), value)
            if error is not None:
                raise SchemaError(f"the model's output does not match the format's schema: {error}")
            return text, None
        if not isinstance(value, dict) or set(value) != {"name", "arguments"}:
            raise SchemaError('the model\'s tool call is not {"name": ..., "arguments": {...}}')
        name = value["name"]
        if name not in self.tool_schemas or (isinstance(self.tool_choice, dict)
                                             and name != self.tool_choice["name"]):
            raise SchemaError(f"the model called {str(name)[:80]!r}, which is not a function it was given")
        error = first_error(validator_for(self.tool_schemas[name]), value["arguments"])
        if error is not None:
            raise SchemaError(f"the arguments of the model's call to {name} do not match its parameters: {error}")
        return "", [ToolCall(call_id or new_call_id(), name, arguments_text(text))]

    def tool_use(self) -> ToolUse | None:
        """The tools as an engine that takes them natively wants them; None when no call may be made."""
        if self.kind not in ("call", "auto"):
            return None
        functions = []
        for tool in self.tools:
            function = {"name": tool["name"]}
            if tool.get("description") is not None:
                function["description"] = tool["description"]
            function["parameters"] = tool["parameters"] if tool["parameters"] is not None else EMPTY_PARAMETERS
            functions.append(function)
        if isinstance(self.tool_choice, dict):
            return ToolUse(json.dumps(functions), "function", self.tool_choice["name"])
        return ToolUse(json.dumps(functions), self.tool_choice)

    def response_fields(self) -> dict:
        """What the response object reports about the output: ``text``, ``tools``, ``tool_choice``, and
        (this project's extension) the ``regex``, ``choices`` or ``grammar`` the answer was held to."""
        out = {"text": {"format": self.format}, "tools": self.tools, "tool_choice": self.tool_choice}
        if self.kind in TEXT_CONSTRAINTS:
            c = self.constraint
            assert c is not None, "a regex, choices or grammar kind comes with its constraint"
            out[self.kind] = c.regex if c.regex is not None else list(c.choices) if c.choices is not None else c.lark
        return out


def new_call_id() -> str:
    return f"call_{secrets.token_hex(12)}"


def arguments_text(call_text: str) -> str:
    """The ``arguments`` value of a tool call's JSON text, exactly as written (what was streamed)."""
    scanner = CallScanner()
    scanner.feed(call_text)
    return scanner.arguments


def _tool_report(tool: dict) -> dict:
    out = {"type": "function", "name": tool["name"], "parameters": tool.get("parameters"),
           "strict": tool.get("strict", True)}
    if tool.get("description") is not None:
        out["description"] = tool["description"]
    return out


EMPTY_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": False}


SPECS = BytesLRU(SPEC_MEMO_BYTES)


def _compile(key: str) -> OutputSpec:
    """The checked spec of ``key`` (the infer's format, tools and tool_choice as JSON); the spec is kept between
    infers as JSON text, in a memo bounded in bytes, and each call gets its own copy."""
    kept = SPECS.get(key)
    if kept is MISSING:
        spec = compile_spec(key)
        kept = json.dumps(dataclasses.asdict(spec))
        SPECS.put(key, kept, sys.getsizeof(key) + sys.getsizeof(kept))
        return spec
    fields = json.loads(kept)
    constraint = fields.pop("constraint")
    if constraint is not None and constraint["choices"] is not None:
        constraint["choices"] = tuple(constraint["choices"])
    return OutputSpec(**fields, constraint=Constraint(**constraint) if constraint is not None else None)


#: How often a watched schema check looks at the job's cancel and deadline.
CHECK_POLL_S = 0.02


def _compile_watched(key: str, check_running: Callable[[], None]) -> OutputSpec:
    if SPECS.get(key) is not MISSING:
        return _compile(key)
    box: dict[str, Any] = {}
    done = threading.Event()

    def check() -> None:
        try:
            box["spec"] = _compile(key)
        except BaseException as e:  # noqa: BLE001 - handed to the job's thread
            box["error"] = e
        finally:
            done.set()

    threading.Thread(target=check, name="tensorjob-schema-check", daemon=True).start()
    while not done.wait(CHECK_POLL_S):
        check_running()
    if "error" in box:
        raise box["error"]
    return box["spec"]


def compile_spec(key: str) -> "OutputSpec":
    request = json.loads(key)
    fmt, tools, choice = request["format"], request["tools"], request["tool_choice"]
    text = [k for k in TEXT_CONSTRAINTS if k in request]
    structured = fmt is not None and fmt.get("type") != "text"
    calls = bool(tools) and choice != "none"
    if structured and calls and choice == "auto":
        raise SchemaError('a format with tools needs tool_choice "required", "none" or one function: '
                          'with "auto" an answer and a call would both begin with "{"')
    asked = text + (["format"] if structured and not calls else []) + (["tools"] if calls else [])
    if len(asked) > 1:
        raise SchemaError(f"an infer takes one of format, regex, choices, grammar and tools (with a tool_choice "
                          f"other than none), got {' and '.join(asked)}")
    spec = OutputSpec(tools=[_tool_report(t) for t in tools], tool_choice=choice)
    if text:
        kind = spec.kind = text[0]
        value = request[kind]
        constraint = (Constraint(regex=value) if kind == "regex" else
                      Constraint(choices=tuple(value)) if kind == "choices" else Constraint(lark=value))
    elif calls:
        chosen = [t for t in tools if not isinstance(choice, dict) or t["name"] == choice["name"]]
        for i, tool in enumerate(tools):
            parameters = tool.get("parameters")
            parameters = EMPTY_PARAMETERS if parameters is None else parameters
            where = f"tools[{i}].parameters"
            check_schema(parameters, where)
            if not isinstance(parameters, dict) or parameters.get("type", "object") != "object":
                raise SchemaError(f"{where}: a function's parameters must be an object schema "
                                  f'({{"type": "object", "properties": ...}})')
            spec.tool_schemas[tool["name"]] = parameters
        schema = tool_call_schema([(t["name"], spec.tool_schemas[t["name"]]) for t in chosen])
        spec.kind = "auto" if choice == "auto" else "call"
        spec.system = _tools_system(chosen, choice)
        constraint = Constraint(json.dumps(schema, separators=(",", ":"), ensure_ascii=False),
                                free_text=spec.kind == "auto")
    if structured:  # reported; when a call is required the call is the answer
        if fmt["type"] == "json_object":
            spec.output_schema = {"type": "object"}
            spec.format = {"type": "json_object"}
        else:
            spec.output_schema = fmt["schema"]
            spec.format = {k: fmt[k] for k in ("type", "name", "schema", "description", "strict", "quote")
                           if k in fmt}
            spec.format.setdefault("strict", True)
        check_schema(spec.output_schema, "format.schema")
    if structured and not calls:
        spec.kind = "json"
        spec.quote = asks_quotes(spec.format, spec.output_schema)
        constraint = Constraint(json.dumps(spec.output_schema, separators=(",", ":"), ensure_ascii=False))
    try:
        grammar.check(constraint)  # what the engine cannot enforce is refused before any token
    except ConstraintError as e:
        raise SchemaError(e.message) from None
    spec.constraint = constraint
    return spec


def _tools_system(tools: list[dict], choice: Any) -> str:
    lines = [TOOLS_SYSTEM]
    if choice == "auto":
        lines.append("If no function helps, reply in plain text instead.")
    elif isinstance(choice, dict):
        lines.append(f"Call the function {choice['name']}.")
    else:
        lines.append("Call one of them.")
    lines.append("Functions:")
    for tool in tools:
        described = {"name": tool["name"]}
        if tool.get("description"):
            described["description"] = tool["description"]
        described["parameters"] = tool.get("parameters") or EMPTY_PARAMETERS
        lines.append(json.dumps(described, ensure_ascii=False))
    return "\n".join(lines)


# --- streaming: which item the text is, and a call's parts ------------------------------------------


class CallScanner:
    """Reads a tool call's JSON text as it streams: its ``name`` once written, its ``arguments`` as they grow.

    A small incremental scanner over the top-level object (strings and
    escapes respected): it records where the value of ``"name"`` and of
    ``"arguments"`` begin and end, in one pass over each new character.
    """

    def __init__(self) -> None:
        self.text = ""
        self.name: str | None = None
        self.args_start: int | None = None
        self.args_end: int | None = None
        self._depth = 0
        self._in_string = False
        self._escape = False
        self._string_start = 0
        self._expect = "key"  # at depth 1: key, colon, value
        self._key: str | None = None
        self._value_start: int | None = None

    @property
    def arguments(self) -> str:
        """The arguments' text so far (all of it once the value has ended)."""
        if self.args_start is None:
            return ""
        return self.text[self.args_start:self.args_end if self.args_end is not None else len(self.text)].rstrip()

    def feed(self, piece: str) -> None:
        start = len(self.text)
        self.text += piece
        for i in range(start, len(self.text)):
            self._char(i, self.text[i])

    def _end_value(self, end: int) -> None:
        if self._key == "name" and self.name is None and self._value_start is not None:
            try:
                name = json.loads(self.text[self._value_start:end])
            except ValueError:
                name = None
            self.name = name if isinstance(name, str) else None
        elif self._key == "arguments" and self.args_end is None:
            self.args_end = end
        self._expect = "comma"
        self._value_start = None

    def _begin_value(self, i: int) -> None:
        self._value_start = i
        if self._key == "arguments" and self.args_start is None:
            self.args_start = i

    def _char(self, i: int, c: str) -> None:
        if self._in_string:
            if self._escape:
                self._escape = False
            elif c == "\\":
                self._escape = True
            elif c == '"':
                self._in_string = False
                if self._depth == 1:
                    if self._expect == "key":
                        try:
                            self._key = json.loads(self.text[self._string_start:i + 1])
                        except ValueError:
                            self._key = None
                        self._expect = "colon"
                    elif self._expect == "value":
                        self._end_value(i + 1)
            return
        if c == '"':
            self._in_string = True
            if self._depth == 1:
                self._string_start = i
                if self._expect == "value" and self._value_start is None:
                    self._begin_value(i)
            return
        if c in "{[":
            if self._depth == 1 and self._expect == "value" and self._value_start is None:
                self._begin_value(i)
            self._depth += 1
            return
        if c in "}]":
            self._depth -= 1
            if self._depth == 1 and self._expect == "value" and self._value_start is not None:
                self._end_value(i + 1)
            elif self._depth == 0 and self._expect == "value" and self._value_start is not None:
                self._end_value(i)  # a number, true, false or null ended by the object's end
            return
        if self._depth != 1:
            return
        if c == ":" and self._expect == "colon":
            self._expect = "value"
        elif c == ",":
            if self._expect == "value" and self._value_start is not None:
                self._end_value(i)
            self._expect = "key"
        elif not c.isspace() and self._expect == "value" and self._value_start is None:
            self._begin_value(i)


class OutputRouter:
    """Publishes one infer's streamed text as the right Open Responses item.

    ``text``/``json`` output is a message; ``call`` output is a function
    call, opened when its name is known, its arguments streamed as
    ``response.function_call_arguments.delta``; ``auto`` output is decided by
    its first character (``{`` is a call: the grammar allows nothing else).
    """

    def __init__(self, spec: OutputSpec, response) -> None:
        self.spec = spec
        self.response = response
        self.mode = {"auto": None, "call": "call"}.get(spec.kind, "message")
        self.scanner: CallScanner | None = None
        self._sent = 0

    def delta(self, piece: str) -> None:
        if self.mode is None:
            if not piece:
                return
            self.mode = "call" if piece.startswith("{") else "message"
        if self.mode == "message":
            self.response.delta(piece, [record.to_json() for record in logprobs_of(piece)])
            return
        if self.scanner is None:
            self.scanner = CallScanner()
        scanner = self.scanner
        scanner.feed(piece)
        if scanner.name is None:
            return
        if not self.response.call_open:
            self.response.open_call(scanner.name)
        args = scanner.arguments if scanner.args_end is not None else scanner.text[scanner.args_start:] \
            if scanner.args_start is not None else ""
        if len(args) > self._sent:
            self.response.call_delta(args[self._sent:])
            self._sent = len(args)

    @property
    def is_call(self) -> bool:
        return self.mode == "call"


__all__ = [
    "TEXT_CONSTRAINTS", "KIND_WORDS", "TOOLS_SYSTEM", "ToolCall", "OutputSpec", "new_call_id", "arguments_text",
    "EMPTY_PARAMETERS", "SPECS", "CHECK_POLL_S", "compile_spec", "CallScanner", "OutputRouter"
]

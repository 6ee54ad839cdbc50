"""Structured output, tool calls and sampling a guest can ask for (issue 13).

Fast tests use the scripted engine (exact replies, every host path) and the
tiny random-weight GGUF (real constrained decoding: llguidance's token mask
over llama.cpp's logits, exact and in milliseconds); the slow ones hold the
embedded SmolLM2 to its schemas over many prompts, make it call tools, check
the quick start no longer loops and load it by name from a Hugging Face cache
laid out here. Every response event any of them publishes is validated
against the openai SDK's models (tests/conftest.py). What each keyword family
of JSON Schema yields, the text constraints (regex, choices, a Lark grammar)
and properties over generated schemas are in test_grammar_engine.py.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

import tensorjob_jupyter as tj
from tensorjob_jupyter import abi
from tensorjob_jupyter.abi import AbiError, codes
from tensorjob_jupyter.sandbox.compile import GuestSource
from tensorjob_jupyter.inference import ScriptedBackend
from tensorjob_jupyter.inference.base import Constraint, GenerateRequest, ModelError, Sampler
from tensorjob_jupyter.host.structured import CallScanner, OutputSpec
from tensorjob_jupyter.host.schemas import SchemaError

from llama_support import Collector, smollm, tiny_files  # noqa: F401

ROOT = Path(__file__).resolve().parents[2]
ECHO = ROOT / "tests" / "guests" / "infer_echo.c"

WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40},
                                                          "unit": {"enum": ["C", "F"]}},
                          "required": ["city", "unit"]}}
TIME = {"type": "function", "name": "get_time", "description": "The time in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40}},
                       "required": ["city"]}}
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 40},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                           "tags": {"type": "array", "items": {"type": "string", "maxLength": 20},
                                                    "maxItems": 3}},
          "required": ["name", "age", "tags"]}


@pytest.fixture(scope="module")
def echo():
    return GuestSource.from_file(ECHO)


def run_echo(echo, backend, options, prompt="hi", max_tokens=64, **kwargs):
    """``backend=None``: the embedded model."""
    if backend is not None:
        kwargs["backend"] = backend
    job = tj.Job(echo, input={"prompt": prompt, "max_tokens": max_tokens, "options": options}, **kwargs).start()
    job.wait(120)
    return job


def responses(job):
    return [e for e in job.events if e["type"].startswith("response.") or e["type"] == "error"]


def json_format(schema, name="answer"):
    return {"format": {"type": "json_schema", "name": name, "schema": schema, "strict": True}}


# --- the wire: infer's new fields ------------------------------------------------------------------------


def test_the_new_fields_parse_and_are_written_only_when_set():
    plain = {"cmd": "infer", "prompt": "p", "max_tokens": 3, "images": []}
    assert abi.command_from_json(plain).to_json() == plain  # a cuttlefish infer: byte-identical
    full = {**plain, **json_format(PERSON), "tools": [WEATHER], "tool_choice": {"type": "function", "name": "get_weather"},
            "temperature": 0.7, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "repeat_penalty": 1.2, "seed": 9}
    cmd = abi.command_from_json(full)
    assert cmd.to_json() == full
    assert cmd.sampling() == {"temperature": 0.7, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "repeat_penalty": 1.2,
                              "seed": 9}
    assert abi.command_from_json({**plain, "stop": "\n"}).stop == ("\n",)
    assert abi.command_from_json({**plain, "format": None, "seed": None}).to_json() == plain  # null: not set


@pytest.mark.parametrize("extra, message", [
    ({"format": {"type": "yaml"}}, "`infer.format.type` must be text, json_schema or json_object"),
    ({"format": {"type": "json_schema", "schema": {}}}, "`infer.format` is missing field `name`"),
    ({"format": {"type": "json_schema", "name": "a b", "schema": {}}}, "`infer.format.name` must be 1 to 64"),
    ({"format": {"type": "json_schema", "name": "x", "schema": [1]}}, "`infer.format.schema` must be a JSON object"),
    ({"format": {"type": "json_schema", "name": "x", "schema": {}, "strict": "yes"}}, "`infer.format.strict` must"),
    ({"tools": {"name": "x"}}, "`infer.tools` must be an array"),
    ({"tools": [WEATHER, WEATHER]}, "two tools are named 'get_weather'"),
    ({"tools": [{**WEATHER, "type": "web_search"}]}, "`infer.tools[0].type` must be \"function\""),
    ({"tools": [{**WEATHER, "parameters": "none"}]}, "`infer.tools[0].parameters` must be a JSON object"),
    ({"tool_choice": "required"}, "`infer.tool_choice` is 'required' but the infer gives no `tools`"),
    ({"tools": [WEATHER], "tool_choice": "always"}, "`infer.tool_choice` must be auto, required, none"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "name": "get_time"}}, "not one of the infer's tools"),
    ({"temperature": -0.1}, "`infer.temperature` = -0.1 is out of range"),
    ({"temperature": "hot"}, "`infer.temperature` must be a number"),
    ({"top_p": 0}, "`infer.top_p` = 0 is out of range (over 0.0 and at most 1.0)"),
    ({"top_k": -1}, "`infer.top_k` must not be negative"),
    ({"seed": 2**32}, "`infer.seed` = 4294967296 is out of range"),
    ({"repeat_penalty": 0}, "`infer.repeat_penalty` = 0 is out of range"),
    ({"stop": [""]}, "`infer.stop` must be a non-empty string or an array of them"),
    ({"stop": ["x"] * 17}, "`infer.stop` takes at most 16 strings"),
    ({**json_format(PERSON), "stop": ["}"]}, "`infer.stop` cannot be given with a format, tools, a regex"),
    ({"regex": "[a-z]+", "stop": "x"}, "`infer.stop` cannot be given with a format, tools, a regex, choices or a"),
    ({"regex": ""}, "`infer.regex` must not be empty"),
    ({"regex": 5}, "`infer.regex` must be a string, got"),
    ({"regex": "a" * (abi.MAX_REGEX_CHARS + 1)}, f"`infer.regex` is {abi.MAX_REGEX_CHARS + 1} characters, over the "
                                                 f"{abi.MAX_REGEX_CHARS} allowed"),
    ({"grammar": "x" * (abi.MAX_GRAMMAR_CHARS + 1)}, f"over the {abi.MAX_GRAMMAR_CHARS} allowed"),
    ({"choices": []}, "`infer.choices` must be a non-empty array of non-empty strings"),
    ({"choices": ["a", ""]}, "`infer.choices` must be a non-empty array of non-empty strings"),
    ({"choices": "a"}, "`infer.choices` must be a non-empty array of non-empty strings"),
    ({"choices": ["a"] * (abi.MAX_CHOICES + 1)}, f"`infer.choices` takes at most {abi.MAX_CHOICES} strings"),
    ({"choices": ["a" * (abi.MAX_CHOICE_CHARS + 1)]}, f"of at most {abi.MAX_CHOICE_CHARS} characters"),
])
def test_a_bad_shape_is_refused_by_name(extra, message):
    with pytest.raises(AbiError, match=re.escape(message)):
        abi.command_from_json({"cmd": "infer", "prompt": "p", "max_tokens": 3, **extra})


def test_a_guest_sending_a_bad_shape_traps(echo):
    job = run_echo(echo, ScriptedBackend("x"), {"tool_choice": "required"})
    assert job.envelope.error.code == codes.WASM_TRAP
    assert "tool_choice" in job.envelope.error.message


def test_infer_done_carries_tool_calls_only_when_there_are_some():
    assert abi.InferDone("t", 1).to_json() == {"event": "infer_done", "text": "t", "tokens_out": 1}
    calls = ({"call_id": "call_1", "name": "f", "arguments": "{}"},)
    event = abi.InferDone("", 2, calls).to_json()
    assert event["tool_calls"] == list(calls)
    assert abi.event_from_json(event) == abi.InferDone("", 2, calls)


# --- schemas: what the grammar cannot enforce is refused before any token -----------------------------


@pytest.mark.parametrize("schema, message", [
    ({"type": "strange"}, "format.schema is not a valid JSON Schema at #/type"),
    ({"type": "object", "properties": {"a": {"minLength": -1}}}, "is not a valid JSON Schema at #/properties/a"),
    ({"type": "array", "items": {"type": "string"}, "uniqueItems": True}, 'Unimplemented keys: ["uniqueItems"]'),
    ({"type": "object", "properties": {"a": {"not": {"type": "string"}}}}, 'Unimplemented keys: ["not"]'),
    ({"if": {"type": "string"}, "then": {"maxLength": 3}}, 'Unimplemented keys: ["if", "then"]'),
    ({"$ref": "https://example.org/s.json"}, "has a $ref that does not resolve (only references within the schema"),
    ({"$ref": "#/$defs/nope"}, "'/$defs/nope' does not exist"),
    ({"properties": {"a": {"$ref": "#/$defs/nope"}}}, "Pointer '/$defs/nope' does not exist"),
    ({"type": "string", "pattern": "(?=a)"}, "look-around, including look-ahead and look-behind, is not supported"),
    ({"type": "integer", "minimum": 5, "maximum": 3}, "Unsatisfiable schema"),
])
def test_a_schema_the_grammar_cannot_enforce_is_refused_naming_the_keyword(schema, message):
    with pytest.raises(SchemaError, match=re.escape(message)) as refused:
        OutputSpec.of(abi.command_from_json({"cmd": "infer", "prompt": "p", "max_tokens": 3,
                                             **json_format(schema)}))
    assert "\n" not in str(refused.value)


def test_the_refusal_ends_the_job_before_any_token(echo):
    backend = ScriptedBackend("never asked")
    job = run_echo(echo, backend, json_format({"type": "number", "not": {"const": 3}}))
    assert job.envelope.error.code == codes.SCHEMA_VALIDATION_FAILED
    assert 'infer: the JSON schema cannot be enforced: Unimplemented keys: ["not"]' in job.envelope.error.message
    assert backend.scripted.prompts == [] and responses(job) == []


def test_tool_parameters_are_checked_like_a_format(echo):
    bad = {**WEATHER, "parameters": {"type": "object", "properties": {"n": {"type": "array", "uniqueItems": True}}}}
    job = run_echo(echo, ScriptedBackend("x"), {"tools": [bad], "tool_choice": "required"})
    assert job.envelope.error.code == codes.SCHEMA_VALIDATION_FAILED
    assert 'Unimplemented keys: ["uniqueItems"]' in job.envelope.error.message
    invalid = {**WEATHER, "parameters": {"type": "object", "properties": {"n": {"type": 7}}}}
    job = run_echo(echo, ScriptedBackend("x"), {"tools": [TIME, invalid], "tool_choice": "required"})
    assert "tools[1].parameters is not a valid JSON Schema at #/properties/n/type" in job.envelope.error.message
    job = run_echo(echo, ScriptedBackend("x"), {"tools": [{**WEATHER, "parameters": {"type": "string"}}]})
    assert "must be an object schema" in job.envelope.error.message
    job = run_echo(echo, ScriptedBackend("x"), {**json_format(PERSON), "tools": [WEATHER]})
    assert 'with "auto" an answer and a call would both begin with "{"' in job.envelope.error.message


def test_schemas_are_bounded_in_bytes_and_depth_so_host_work_is():
    from tensorjob_jupyter.host.schemas import MAX_SCHEMA_BYTES

    big = {"enum": ["x" * 1000 + str(i) for i in range(MAX_SCHEMA_BYTES // 1000 + 1)]}
    with pytest.raises(SchemaError, match=f"over the {MAX_SCHEMA_BYTES} a schema may take"):
        OutputSpec.of(abi.command_from_json({"cmd": "infer", "prompt": "", "max_tokens": 1, **json_format(big)}))
    choices = [f"{i:04d}" + "c" * 1000 for i in range(abi.MAX_CHOICES)]  # the text constraints count as well
    with pytest.raises(SchemaError, match=f"over the {MAX_SCHEMA_BYTES}"):
        OutputSpec.of(abi.command_from_json({"cmd": "infer", "prompt": "", "max_tokens": 1, "choices": choices}))

    def nested(levels):
        schema: dict = {"type": "integer"}
        for _ in range(levels):
            schema = {"type": "array", "items": schema, "maxItems": 1}
        return {"cmd": "infer", "prompt": "", "max_tokens": 1, **json_format(schema)}

    assert OutputSpec.of(abi.parse_command(json.dumps(nested(100)).encode())).kind == "json"
    with pytest.raises(AbiError, match="nested too deeply"):  # what a guest can send: serde_json's depth
        abi.parse_command(json.dumps(nested(200)).encode())


# --- the scripted model: events, infer_done, validation -------------------------------------------------


CALL = '{"name": "get_weather", "arguments": {"city": "Paris \\"Lutetia\\"", "unit": "C"}}'


def test_a_required_tool_call_streams_as_a_function_call_item(echo):
    job = run_echo(echo, ScriptedBackend(CALL), {"tools": [WEATHER, TIME], "tool_choice": "required"})
    assert job.envelope.ok, job.envelope
    result = job.result
    [call] = result["event"]["tool_calls"]
    assert result["event"]["text"] == "" and call["name"] == "get_weather"
    assert json.loads(call["arguments"]) == {"city": 'Paris "Lutetia"', "unit": "C"} == result["call"]
    assert result["streamed"] == CALL  # the guest saw every token through cf_on_token
    events = responses(job)
    kinds = [e["type"] for e in events]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert kinds[-4:] == ["response.function_call_arguments.delta", "response.function_call_arguments.done",
                          "response.output_item.done", "response.completed"]
    assert "response.output_text.delta" not in kinds and "response.content_part.added" not in kinds
    added = events[2]["item"]
    assert (added["type"], added["name"], added["arguments"], added["status"]) == (
        "function_call", "get_weather", "", "in_progress")
    deltas = [e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta"]
    assert len(deltas) > 1 and "".join(deltas) == call["arguments"]
    done = next(e for e in events if e["type"] == "response.function_call_arguments.done")
    assert done["arguments"] == call["arguments"] and done["item_id"] == added["id"]
    final = events[-1]["response"]
    assert final["output"][0]["call_id"] == call["call_id"] == added["call_id"]
    assert final["output"][0]["status"] == "completed" and final["output_text"] == ""
    assert final["tool_choice"] == "required" and [t["name"] for t in final["tools"]] == ["get_weather", "get_time"]


def test_auto_lets_the_first_token_choose_a_call_or_an_answer(echo):
    answer = run_echo(echo, ScriptedBackend("It is sunny."), {"tools": [WEATHER]})
    assert answer.envelope.ok and answer.result["event"] == {"event": "infer_done", "text": "It is sunny.",
                                                            "tokens_out": 3}
    assert "response.content_part.added" in [e["type"] for e in responses(answer)]
    assert responses(answer)[-1]["response"]["tool_choice"] == "auto"
    call = run_echo(echo, ScriptedBackend(CALL), {"tools": [WEATHER]})
    assert call.envelope.ok and call.result["event"]["tool_calls"][0]["name"] == "get_weather"


def test_a_structured_answer_is_validated_and_reported(echo):
    reply = '{"name": "Ada", "age": 36, "tags": ["maths"]}'
    job = run_echo(echo, ScriptedBackend(reply), {**json_format(PERSON, "person"), "temperature": 0.5, "seed": 4})
    assert job.envelope.ok and job.result["parsed"] == json.loads(reply) and job.result["event"]["text"] == reply
    final = responses(job)[-1]["response"]
    assert final["text"]["format"] == {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}
    assert final["temperature"] == 0.5 and final["sampler"]["seed"] == 4 and final["sampler"]["repeat_penalty"] == 1.1


def test_output_that_does_not_validate_fails_the_job_and_the_response(echo):
    job = run_echo(echo, ScriptedBackend('{"name": "Ada", "age": 300, "tags": []}'), json_format(PERSON))
    assert job.envelope.error.code == codes.SCHEMA_VALIDATION_FAILED
    assert "does not match the format's schema" in job.envelope.error.message
    assert [e["type"] for e in responses(job)][-2:] == ["error", "response.failed"]
    job = run_echo(echo, ScriptedBackend('{"name": "get_time", "arguments": {}}'),
                   {"tools": [WEATHER, TIME], "tool_choice": {"type": "function", "name": "get_weather"}})
    assert "which is not a function it was given" in job.envelope.error.message


def test_structured_output_cut_by_its_token_limit_ends_the_job(echo):
    job = run_echo(echo, ScriptedBackend('{"name": "Ada", "age": 36, "tags": []}'), json_format(PERSON), max_tokens=3)
    assert job.envelope.error.code == codes.LIMIT_EXCEEDED
    assert "before the JSON was complete" in job.envelope.error.message
    final = responses(job)[-1]
    assert final["type"] == "response.incomplete" and final["response"]["incomplete_details"] == {
        "reason": "max_output_tokens"}


def test_json_object_takes_any_object(echo):
    job = run_echo(echo, ScriptedBackend('{"anything": [1, 2]}'), {"format": {"type": "json_object"}})
    assert job.envelope.ok and job.result["parsed"] == {"anything": [1, 2]}
    job = run_echo(echo, ScriptedBackend("[1]"), {"format": {"type": "json_object"}})
    assert job.envelope.error.code == codes.SCHEMA_VALIDATION_FAILED


class Recording(ScriptedBackend):
    def __init__(self, reply):
        super().__init__(reply)
        self.requests = []

    def generate_stream(self, request, on_token):
        self.requests.append(request)
        return super().generate_stream(request, on_token)


def test_sampling_per_infer_overrides_the_job_and_tools_are_told_to_the_model(echo):
    backend = Recording(CALL)
    infer = tj.InferOptions(sampler=Sampler(temperature=0.2, top_p=0.8, seed=1, repeat_penalty=1.3))
    job = run_echo(echo, backend, {"tools": [WEATHER], "tool_choice": "required", "temperature": 0.9, "top_k": 5,
                                   "seed": 77}, infer=infer)
    assert job.envelope.ok
    [request] = backend.requests
    assert request.sampler == Sampler(temperature=0.9, top_p=0.8, top_k=5, seed=77, repeat_penalty=1.3)
    assert request.constraint is not None and not request.constraint.free_text
    assert "get_weather" in request.system and "The weather in a city" in request.system
    schema = json.loads(request.constraint.schema)
    assert schema["properties"]["name"] == {"const": "get_weather"}


# --- streaming a call: the scanner ----------------------------------------------------------------------


@pytest.mark.parametrize("text", [
    '{"name": "f", "arguments": {"a": "x}\\"y", "b": [1, {"c": null}]}}',
    '{ "arguments" : {"a": 1} , "name" : "f" }',
    '{"name":"f","arguments":{}}',
])
def test_the_scanner_finds_the_name_and_the_arguments_however_the_text_is_split(text):
    expected = json.loads(text)
    for size in (1, 2, 3, 7, len(text)):
        scanner = CallScanner()
        for i in range(0, len(text), size):
            scanner.feed(text[i:i + size])
        assert scanner.name == expected["name"]
        assert json.loads(scanner.arguments) == expected["arguments"]


# --- the view and the terminal ---------------------------------------------------------------------------


def test_the_view_shows_a_call_by_name_and_a_structured_answer_as_a_tree(echo):
    from tensorjob_jupyter.frontends.view import render
    from tensorjob_jupyter.frontends.view.state import ViewState

    call = run_echo(echo, ScriptedBackend(CALL), {"tools": [WEATHER], "tool_choice": "required"})
    state = ViewState()
    for event in call.events:
        state.apply(event)
    [infer] = state.infers
    assert (infer.kind, infer.call_name, infer.value) == ("call", "get_weather", {"city": 'Paris "Lutetia"',
                                                                                  "unit": "C"})
    html = render.tokens(state)
    assert "tool call" in html and "<b>get_weather</b>" in html and "<details" in html and "Lutetia" in html
    answer = run_echo(echo, ScriptedBackend('{"name": "<b>Ada</b>", "age": 36, "tags": []}'), json_format(PERSON))
    state = ViewState()
    for event in answer.events:
        state.apply(event)
    assert state.infers[0].kind == "json" and state.infers[0].value["age"] == 36
    html = render.tokens(state)
    assert "· JSON" in html and "&lt;b&gt;Ada" in html and "<b>Ada" not in html


def test_the_terminal_shows_the_call_growing_and_the_answer_as_json(echo):
    from tensorjob_jupyter.frontends.terminal import LivePrinter

    def printed(job):
        err = io.StringIO()
        printer = LivePrinter(job, out=io.StringIO(), err=err, quiet=False, chunks_to_stdout=True)
        for event in job.events:
            printer.show(event)
        return err.getvalue()

    text = printed(run_echo(echo, ScriptedBackend(CALL), {"tools": [WEATHER], "tool_choice": "required"}))
    assert '  call get_weather {"city": "Paris \\"Lutetia\\"", "unit": "C"}' in text
    text = printed(run_echo(echo, ScriptedBackend('{"name": "Ada", "age": 36, "tags": ["\\u001b[31mred"]}'),
                            json_format(PERSON)))
    assert '  = {\n      "name": "Ada",\n      "age": 36,' in text and "\x1b" not in text


# --- the tiny model: real grammar-constrained decoding, exact and fast ------------------------------------


SCHEMAS = [
    PERSON,
    {"type": "object", "properties": {"when": {"type": "string", "format": "date"},
                                      "id": {"type": "string", "format": "uuid"},
                                      "code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"},
                                      "kind": {"anyOf": [{"type": "null"}, {"enum": ["a", "b"]}]},
                                      "pair": {"type": "array", "prefixItems": [{"type": "boolean"},
                                                                                {"type": "number"}]}},
     "required": ["when", "id", "code", "kind", "pair"]},
    {"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer", "minimum": 1, "maximum": 9},
                                                         "next": {"anyOf": [{"$ref": "#/$defs/node"},
                                                                            {"type": "null"}]}},
                        "required": ["v", "next"]}},
     "$ref": "#/$defs/node"},
    {"type": ["string", "null"], "maxLength": 8},
    {"type": "array", "items": {"type": "integer", "minimum": -3, "maximum": 3}, "minItems": 2, "maxItems": 4},
]


@pytest.fixture(scope="module")
def tiny_engine(tiny_files):  # noqa: F811
    from tensorjob_jupyter.inference.llama import LlamaEngine

    # one thread: the tiny model gains nothing from more, and the fast loop runs a worker per core
    engine = LlamaEngine(tiny_files["model"], n_ctx=256, n_threads=1, n_threads_batch=1)
    yield engine
    engine.close()


def constrained(engine, schema, *, seed=0, temperature=0.0, max_tokens=200, free_text=False):
    spec = OutputSpec.of(abi.command_from_json({"cmd": "infer", "prompt": "the cat", "max_tokens": 1,
                                                **json_format(schema)}))
    constraint = Constraint(spec.constraint.schema, free_text)
    collector = Collector()
    result = engine.generate(GenerateRequest("the cat", max_tokens, Sampler(temperature=temperature, seed=seed),
                                             cache_prompt=False, constraint=constraint), collector)
    return result, collector


@pytest.mark.parametrize("index", range(len(SCHEMAS)))
def test_the_tiny_model_held_to_a_schema_always_validates(tiny_engine, index):
    schema = SCHEMAS[index]
    for seed in range(6):
        result, collector = constrained(tiny_engine, schema, seed=seed, temperature=1.0 if seed else 0.0)
        if result.finish_reason == "length":
            continue  # a random model may wander inside a string until the limit; never invalid when it ends
        jsonschema.validate(json.loads(result.text), schema)
        assert collector.text == result.text


def test_checking_the_free_choice_first_picks_the_same_tokens_as_grammar_first(tiny_engine, monkeypatch):
    from tensorjob_jupyter.inference import grammar

    for schema in SCHEMAS:
        fast, _ = constrained(tiny_engine, schema, max_tokens=60)
        monkeypatch.setattr(grammar.GrammarSampler, "check_first", False)
        reference, _ = constrained(tiny_engine, schema, max_tokens=60)
        monkeypatch.setattr(grammar.GrammarSampler, "check_first", True)
        assert fast.text == reference.text and fast.finish_reason == reference.finish_reason


def test_free_text_is_released_after_a_first_token_that_is_not_a_call(tiny_engine):
    result, _ = constrained(tiny_engine, PERSON, free_text=True, max_tokens=20)
    assert result.text and (result.text.startswith("{") or not result.text[0].isspace())


def test_a_constraint_that_does_not_compile_is_a_constraint_error():
    from tensorjob_jupyter.inference import grammar
    from tensorjob_jupyter.inference.base import ConstraintError

    for constraint in (Constraint(regex="(a"), Constraint(lark="start: missing"),
                       Constraint(json.dumps({"type": "string", "pattern": "(a)\\1"}))):
        with pytest.raises(ConstraintError, match="cannot be enforced") as refused:
            grammar.check(constraint)
        assert refused.value.CODE == codes.SCHEMA_VALIDATION_FAILED


def test_the_grammar_api_is_part_of_the_llama_cpp_check():
    import types

    import llama_cpp
    from llama_cpp import _internals

    from tensorjob_jupyter.inference import library

    assert library.missing_llama_cpp_api(llama_cpp, _internals) == []
    lib = types.SimpleNamespace(**{n: getattr(llama_cpp, n) for n in library.LIBRARY_USED
                                   if n not in ("llama_sampler_apply", "llama_vocab_n_tokens")})
    assert library.missing_llama_cpp_api(lib, _internals) == ["llama_cpp.llama_sampler_apply",
                                                              "llama_cpp.llama_vocab_n_tokens"]


# --- job options and models by name -----------------------------------------------------------------------


def hf_cache(tmp_path, model_file, repo="test-org/tiny-GGUF", name="tiny-Q4_1.gguf") -> Path:
    """A Hugging Face hub cache holding ``model_file`` as the snapshot of ``repo``, as huggingface_hub lays it out."""
    cache = tmp_path / "hf-cache"
    folder = cache / ("models--" + repo.replace("/", "--"))
    commit = "0123456789abcdef0123456789abcdef01234567"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(commit)
    blob = folder / "blobs" / "f00d"
    blob.parent.mkdir()
    blob.write_bytes(Path(model_file).read_bytes()) if Path(model_file).stat().st_size < 10**7 else None
    snapshot = folder / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (snapshot / name).symlink_to(blob if blob.exists() else Path(model_file))
    return cache


def test_a_hf_model_resolves_offline_from_the_cache(tmp_path, tiny_files, monkeypatch, echo):  # noqa: F811
    from tensorjob_jupyter.inference import hub

    cache = hf_cache(tmp_path, tiny_files["model"])
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    path = hub.resolve("hf:test-org/tiny-GGUF")
    assert path.read_bytes() == tiny_files["model"].read_bytes()
    assert hub.resolve("hf:test-org/tiny-GGUF:Q4_1") == path == hub.resolve("hf:test-org/tiny-GGUF:tiny-Q4_1.gguf")
    with pytest.raises(ModelError, match="no file with 'Q8_0' in its name.*HF_HUB_OFFLINE|not in the Hugging Face"):
        hub.resolve("hf:test-org/tiny-GGUF:Q8_0")
    with pytest.raises(ModelError, match=r"hf:other/repo is not in the Hugging Face cache .* HF_HUB_OFFLINE is set"):
        hub.resolve("hf:other/repo")
    job = tj.Job(echo, input={"prompt": "the cat", "max_tokens": 4}, model="hf:test-org/tiny-GGUF").start()
    assert job.wait(60).ok and job.backend.model_name == "tiny-Q4_1"


def test_a_hf_model_that_is_not_cached_is_one_line_from_the_cli(tmp_path):
    env = {"HF_HUB_CACHE": str(tmp_path / "empty"), "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT),
           "TENSORJOB_RUNS": str(tmp_path / "runs"), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-m", "tensorjob_jupyter.frontends.cli", "run", str(ECHO), "--model",
                           "hf:nobody/nothing-GGUF:Q4_K_M"], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "--model hf:nobody/nothing-GGUF:Q4_K_M: hf:nobody/nothing-GGUF:Q4_K_M is not in the Hugging Face" \
           in done.stderr


def test_choosing_a_file_by_quant_or_name():
    from tensorjob_jupyter.inference import hub

    files = ["README.md", "m-Q4_K_M.gguf", "m-Q8_0.gguf", "big/m-Q6_K-00001-of-00002.gguf",
             "big/m-Q6_K-00002-of-00002.gguf", "mmproj-m-f16.gguf"]
    assert hub.choose(hub.parse_ref("hf:a/b"), files) == ["m-Q4_K_M.gguf"]
    assert hub.choose(hub.parse_ref("hf:a/b:q8_0"), files) == ["m-Q8_0.gguf"]
    assert hub.choose(hub.parse_ref("hf:a/b:Q6_K"), files) == ["big/m-Q6_K-00001-of-00002.gguf",
                                                              "big/m-Q6_K-00002-of-00002.gguf"]
    assert hub.choose(hub.parse_ref("hf:a/b:m-Q8_0.gguf"), files) == ["m-Q8_0.gguf"]
    with pytest.raises(ModelError, match="no file with 'Q2_K'"):
        hub.choose(hub.parse_ref("hf:a/b:Q2_K"), files)
    for bad in ("hf:", "hf:justone", "hf:a/b/c", "hf:../x/y", "hf:a/b:../../etc/passwd"):
        with pytest.raises(ValueError):
            hub.parse_ref(bad)


# --- the real model --------------------------------------------------------------------------------------


PROMPTS = ["Describe a person who lives by the sea.", "Invent a character for a detective story.",
           "Who is the keeper of the lighthouse?", "Make up a musician and their favourite songs.",
           "A chef from Lyon.", "Tell me about an astronaut.", "A farmer in the mountains.", "Describe a child.",
           "An old sailor and his ship.", "A teacher of mathematics.", "Describe yourself.",
           "Write about a painter.", "Someone who collects stamps.", "A baker who wakes at four.",
           "The first person on Mars.", "A librarian with a secret.", "Describe a runner.", "A pilot.",
           "A gardener and her roses.", "Someone famous."]
EVENT_SCHEMA = {"type": "object", "properties": {
    "title": {"type": "string", "maxLength": 60},
    "date": {"type": "string", "format": "date"},
    "rating": {"type": "integer", "minimum": 1, "maximum": 5},
    "mood": {"enum": ["happy", "sad", "neutral"]},
    "people": {"type": "array", "items": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 30}, "role": {"type": ["string", "null"], "maxLength": 30}},
        "required": ["name", "role"]}, "maxItems": 3}},
    "required": ["title", "date", "rating", "mood", "people"]}


@pytest.mark.slow
@pytest.mark.parametrize("schema", [PERSON, EVENT_SCHEMA], ids=["person", "event"])
def test_the_embedded_model_held_to_a_schema_always_validates(smollm, schema):  # noqa: F811
    spec = OutputSpec.of(abi.command_from_json({"cmd": "infer", "prompt": "", "max_tokens": 1,
                                                **json_format(schema)}))
    futures = [smollm.generate_stream(GenerateRequest(f"{p} Answer in JSON.", 256,
                                                      Sampler(repeat_penalty=1.1), chat=None,
                                                      constraint=spec.constraint), lambda _: True)
               for p in PROMPTS]
    for prompt, fut in zip(PROMPTS, futures):
        result = fut.result(600)
        assert result.finish_reason == "stop", (prompt, result.text)
        jsonschema.validate(json.loads(result.text), schema)
        assert spec.check(result.text)[0] == result.text


@pytest.mark.slow
def test_the_embedded_model_calls_the_tools_it_must(echo):
    required = run_echo(echo, None, {"tools": [WEATHER, TIME], "tool_choice": "required"},
                        prompt="What is the weather in Paris, in Celsius?", max_tokens=96)
    assert required.envelope.ok, required.envelope
    [call] = required.result["event"]["tool_calls"]
    assert call["name"] in ("get_weather", "get_time")
    jsonschema.validate(json.loads(call["arguments"]),
                        {"get_weather": WEATHER, "get_time": TIME}[call["name"]]["parameters"])
    named = run_echo(echo, None, {"tools": [WEATHER, TIME], "tool_choice": {"type": "function", "name": "get_time"}},
                     prompt="What time is it in Tokyo?", max_tokens=96)
    assert named.envelope.ok and named.result["event"]["tool_calls"][0]["name"] == "get_time"
    auto = run_echo(echo, None, {"tools": [WEATHER]}, prompt="What is the weather in Oslo?", max_tokens=96)
    assert auto.envelope.status.value in ("completed", "failed")
    if auto.envelope.ok:  # a call or an answer, the model's choice; either way, shaped as such
        event = auto.result["event"]
        item = next(e for e in responses(auto) if e["type"] == "response.output_item.added")["item"]
        assert (item["type"] == "function_call") == ("tool_calls" in event)
    else:  # only an unfinished free answer can end it: a call is held to its grammar
        assert auto.envelope.error.code == codes.LIMIT_EXCEEDED


def sentences(text: str) -> list[str]:
    return [re.sub(r"\W+", " ", s).strip().lower() for s in re.split(r"(?<=[.!?])\s+|\n+", text) if s.strip()]


def test_the_repeated_sentence_check_sees_a_loop():
    looping = "It was built in 1835. It is a lighthouse. It is a lighthouse. It is"
    assert len(sentences(looping)) != len(set(sentences(looping)))


@pytest.mark.slow
def test_the_quick_start_summary_repeats_no_sentence_and_is_deterministic(tmp_path):
    argv = [sys.executable, "-m", "tensorjob_jupyter.frontends.cli", "run", "guests/examples/summarise.c", "--read",
            "examples/data", "--input", '{"path": "examples/data/lighthouse.txt"}', "--quiet"]
    runs = [subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600,
                           env={**__import__("os").environ, "PYTHONPATH": str(ROOT),
                                "TENSORJOB_RUNS": str(tmp_path / "runs"),
                                # pinned: a busy machine's fitted thread count would change greedy text
                                "TENSORJOB_THREADS": "2"}) for _ in range(2)]
    assert runs[0].returncode == 0, runs[0].stderr
    summary = json.loads(runs[0].stdout)["summary"]
    said = sentences(summary)
    assert len(said) >= 2 and len(said) == len(set(said)), summary
    assert runs[1].stdout == runs[0].stdout  # greedy: the same summary again


@pytest.mark.slow
def test_the_embedded_model_by_name_from_a_hf_cache(tmp_path):
    from tensorjob_jupyter.inference.models import default_model_path

    cache = hf_cache(tmp_path, default_model_path(), repo="HuggingFaceTB/SmolLM2-135M-Instruct-GGUF",
                     name="smollm2-135m-instruct-q4_1.gguf")
    env = {**__import__("os").environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT),
           "TENSORJOB_RUNS": str(tmp_path / "runs")}
    done = subprocess.run([sys.executable, "-m", "tensorjob_jupyter.frontends.cli", "run", "guests/examples/extract.c",
                           "--read", "examples/data", "--input", '{"path": "examples/data/lighthouse.txt"}',
                           "--model", "hf:HuggingFaceTB/SmolLM2-135M-Instruct-GGUF:Q4_1", "--json", "--quiet"],
                          cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    envelope = json.loads(done.stdout)
    assert envelope["usage"]["model"] == "smollm2-135m-instruct-q4_1"
    facts = envelope["result"]["facts"]  # the schema's required fields; it allows others (no additionalProperties)
    assert {"title", "year", "keywords"} <= set(facts) and isinstance(facts["year"], int)


def test_lora_and_no_prompt_cache_reach_the_engine_from_the_options(tiny_files, echo):  # noqa: F811
    from tensorjob_jupyter.frontends.options import JobOptions

    def run(**options):
        spec = JobOptions(model=str(tiny_files["model"]), **options).checked().spec(GuestSource.of(echo))
        job = tj.Job(spec.replace(input={"prompt": "the cat the cat", "max_tokens": 8})).start()
        assert job.wait(60).ok, job.envelope
        done = [e for e in job.events if e["type"] in ("response.completed", "response.incomplete")]
        return job.result["event"]["text"], done[-1]["response"]["usage"]["input_tokens_details"]["cached_tokens"]

    plain, _ = run()
    adapted, _ = run(lora=(f"a={tiny_files['lora_a']}:1.0",))
    assert adapted != plain  # the adapter changes every prediction of the tiny model
    assert run(lora=(f"a={tiny_files['lora_a']}:0",))[0] == plain  # at scale 0 it does nothing
    assert run()[1] > 0  # the same prompt again reuses its KV cache...
    assert run(no_prompt_cache=True)[1] == 0  # ...unless told not to


def test_large_bounds_and_long_alternatives_compile_and_decode_at_once(tiny_engine):
    """No keyword cap is left: bounds in the hundreds of thousands and a thousand alternatives are grammars
    the engine compiles and decodes from without delay."""
    largest = {"type": "object", "properties": {
        "s": {"type": "string", "minLength": 1, "maxLength": 100_000},
        "a": {"type": "array", "items": {"type": "boolean"}, "maxItems": 100_000},
        "i": {"type": "integer", "minimum": -10**15, "maximum": 10**15},
        "p": {"type": "string", "pattern": "^[a-z]{1,4096}$"},
        "e": {"enum": [f"v{i}" for i in range(1024)]},
        "any": {"anyOf": [{"const": i} for i in range(1024)]}},
        "required": ["s", "a", "i", "p", "e", "any"]}
    result, _ = constrained(tiny_engine, largest, max_tokens=4)
    assert result.finish_reason == "length" and result.text.startswith("{")

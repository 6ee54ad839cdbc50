"""The grammar engine (llguidance) as a guest meets it: what each keyword family of JSON Schema yields, what is
refused, the text constraints, and properties over generated schemas (issue 28).

Structured output moved from llama.cpp's GBNF and home-made guards to llguidance, which enforces far more of
JSON Schema. What must hold, tested here at the host and engine level:

* every keyword family users write is enforced: a constrained answer validates with ``jsonschema`` (an
  independent implementation, with its format checker) -- checked without a model (each family's grammar takes
  valid answers and refuses invalid ones, the examples themselves checked by ``jsonschema``), and on the embedded
  SmolLM2 (slow);
* what the engine cannot enforce (``if``/``then``, ``not``, ``uniqueItems``...) is refused before the model runs,
  in one line naming the keyword;
* each text constraint -- ``regex``, ``choices``, a Lark ``grammar`` -- works from an ``infer`` command of a real
  job, its answer reported and checked;
* properties: generated schemas over the supported keywords, sampled over the tiny random-weight model's
  vocabulary and sampler chain with random logits (which explore a grammar far more than a real model does, and
  cost no decode), always validate; a smaller run does the same on SmolLM2; ``choices`` of arbitrary strings
  always answer one of them; and ``grammar.matches`` agrees with Python's ``re.fullmatch`` on simple regexes;
* where the engine and ``jsonschema`` disagreed, the engine now follows: dates and times are held to what
  Python's calendar accepts, a token that writes no text (``<unk>``) is never allowed as text, a vocabulary
  whose tokenizer cannot spell a space is spelled from its own pieces, and a compiled grammar's shared lexer
  filling up no longer fails later requests. One slip of llguidance's own remains, pinned by a strict xfail
  (a narrow number range with an exclusive whole bound); llguidance also writes an object's properties only in
  the schema's order, a subset of what JSON Schema allows.

Other engineers cover the Python-guest API, the C SDK and the CLI; schemas as an attacker writes them are in
``test_hostile_schemas.py``.
"""

from __future__ import annotations

import json
import re
import string
import threading
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, note, settings, strategies as st

import tensorjob_jupyter as tj
from tensorjob_jupyter import abi
from tensorjob_jupyter.abi import codes
from tensorjob_jupyter.host.schemas import SchemaError
from tensorjob_jupyter.host.structured import OutputSpec
from tensorjob_jupyter.inference import ScriptedBackend, grammar
from tensorjob_jupyter.inference.base import Constraint, ConstraintError, GenerateRequest, Sampler
from tensorjob_jupyter.sandbox.compile import GuestSource

from llama_support import Collector, smollm, tiny_files  # noqa: F401

ROOT = Path(__file__).resolve().parents[2]
ECHO = ROOT / "tests" / "guests" / "infer_echo.c"
#: The tiny model decodes on one thread: it gains nothing from more, and the fast loop runs a worker per core,
#: where llama.cpp's threads spinning at each step's barrier would slow every decode tenfold.
ONE_THREAD = {"n_threads": 1, "n_threads_batch": 1}


# --- helpers ---------------------------------------------------------------------------------------------


def infer_fields(**fields) -> abi.Infer:
    return abi.command_from_json({"cmd": "infer", "prompt": "p", "max_tokens": 1, **fields})


def json_format(schema) -> dict:
    return {"format": {"type": "json_schema", "name": "answer", "schema": schema, "strict": True}}


def spec_of(schema) -> OutputSpec:
    return OutputSpec.of(infer_fields(**json_format(schema)))


def validate(value, schema) -> None:
    """``jsonschema``'s verdict, formats included: raises ``ValidationError`` unless ``value`` is valid."""
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    cls(schema, format_checker=cls.FORMAT_CHECKER).validate(value)


def is_valid(value, schema) -> bool:
    try:
        validate(value, schema)
    except jsonschema.ValidationError:
        return False
    return True


@pytest.fixture(scope="module")
def echo():
    return GuestSource.from_file(ECHO)


@pytest.fixture(scope="module")
def tiny_engine(tiny_files):  # noqa: F811
    from tensorjob_jupyter.inference.llama import LlamaEngine

    engine = LlamaEngine(tiny_files["model"], n_ctx=256, **ONE_THREAD)
    yield engine
    engine.close()


def constrained(engine, constraint: Constraint, *, seed=0, temperature=1.0, max_tokens=120, prompt="the cat"):
    collector = Collector()
    result = engine.generate(GenerateRequest(prompt, max_tokens, Sampler(temperature=temperature, seed=seed),
                                             cache_prompt=False, constraint=constraint), collector)
    assert collector.text == result.text  # what streamed is the answer
    return result


def draw_answer(engine, constraint: Constraint, *, seed: int, max_tokens: int) -> tuple[bytes, bool]:
    """An answer drawn under ``constraint`` from the tiny model's vocabulary and sampler chain, with random logits
    in place of its forward pass (what a random-weight model gives, without paying for the decode): its bytes, and
    whether the grammar let it end before ``max_tokens`` ran out (else the bytes are those written by then)."""
    chain = engine._sampler(GenerateRequest("x", max_tokens, Sampler(temperature=1.0, seed=seed),
                                            constraint=constraint), [])
    rng = np.random.default_rng(seed)
    pieces = []
    try:
        for _ in range(max_tokens):
            token = chain.sample_logits((rng.standard_normal(engine.n_vocab) * 3).astype(np.float32))
            if engine.is_eog(token):
                return b"".join(pieces), True
            pieces.append(engine.piece(token))
        return b"".join(pieces), False
    finally:
        chain.close()


def sample_answer(engine, constraint: Constraint, *, seed: int, max_tokens: int) -> str | None:
    """``draw_answer``'s answer as text; None when ``max_tokens`` ran out before the grammar let it end."""
    data, finished = draw_answer(engine, constraint, seed=seed, max_tokens=max_tokens)
    return data.decode("utf-8") if finished else None


def run_echo(echo, backend, options, prompt="hi", max_tokens=64, **kwargs):
    """``backend=None``: the embedded model."""
    if backend is not None:
        kwargs["backend"] = backend
    job = tj.Job(echo, input={"prompt": prompt, "max_tokens": max_tokens, "options": options}, **kwargs).start()
    job.wait(300)
    return job


def final_response(job) -> dict:
    return [e for e in job.events if e["type"] in ("response.completed", "response.incomplete",
                                                    "response.failed")][-1]["response"]


# --- the keyword families users write ----------------------------------------------------------------------


#: Each family: a schema, answers it must take, answers it must refuse (in the engine's JSON layout: one space
#: after ``:`` and ``,``), and a prompt for the embedded model.
FAMILIES = {
    "oneOf": (
        {"type": "object", "properties": {"answer": {"oneOf": [
            {"type": "integer", "minimum": 0, "maximum": 99}, {"type": "string", "maxLength": 12},
            {"type": "null"}]}}, "required": ["answer"], "additionalProperties": False},
        ['{"answer": 42}', '{"answer": "forty-two"}', '{"answer": null}'],
        ['{"answer": 4.5}', '{"answer": true}', '{"answer": 420}', '{}'],
        "What is six times seven?"),
    "anyOf": (
        {"anyOf": [{"type": "object", "properties": {"city": {"type": "string", "maxLength": 24}},
                    "required": ["city"], "additionalProperties": False},
                   {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "maxItems": 3}]},
        ['{"city": "Oslo"}', "[1, 2]", "[]"],
        ['{"town": "Oslo"}', "[1, 2, 3, 4]", '"Oslo"', "[10]"],
        "Which city is the capital of Norway?"),
    "allOf": (
        {"type": "object", "properties": {"name": {}, "age": {}}, "additionalProperties": False,
         "allOf": [{"properties": {"name": {"type": "string", "maxLength": 20}}, "required": ["name"]},
                   {"properties": {"age": {"type": "integer", "minimum": 0, "maximum": 120}}, "required": ["age"]}]},
        ['{"name": "Ada", "age": 36}', '{"name": "", "age": 0}'],
        ['{"name": "Ada"}', '{"name": "Ada", "age": 121}', '{"name": "Ada", "age": 3, "x": 1}'],
        "Describe a mathematician."),
    "number bounds": (
        {"type": "object", "properties": {
            "count": {"type": "integer", "minimum": 3, "maximum": 7},
            "level": {"type": "integer", "exclusiveMinimum": -3, "exclusiveMaximum": 3},
            "ratio": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
            "temperature": {"type": "number", "minimum": -40.5, "maximum": 60}},
         "required": ["count", "level", "ratio", "temperature"], "additionalProperties": False},
        ['{"count": 3, "level": -2, "ratio": 0.5, "temperature": -40.5}',
         '{"count": 7, "level": 2, "ratio": 0.999, "temperature": 60}'],
        ['{"count": 8, "level": 0, "ratio": 0.5, "temperature": 1}',
         '{"count": 3, "level": 3, "ratio": 0.5, "temperature": 1}',
         '{"count": 3, "level": 0, "ratio": 0, "temperature": 1}',
         '{"count": 3, "level": 0, "ratio": 1, "temperature": 1}',
         '{"count": 3, "level": 0, "ratio": 0.5, "temperature": -40.6}',
         '{"count": 3.5, "level": 0, "ratio": 0.5, "temperature": 1}'],
        "Give the weather: how many clouds, the wind level, the humidity ratio and the temperature."),
    "pattern": (
        {"type": "object", "properties": {
            "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"},
            "note": {"type": "string", "pattern": "[0-9]{3}", "maxLength": 16}},
         "required": ["code", "note"], "additionalProperties": False},
        ['{"code": "ABC-12", "note": "room 101"}', '{"code": "ZZZ-00", "note": "123"}'],
        ['{"code": "AB-12", "note": "room 101"}', '{"code": "ABC-123", "note": "101"}',
         '{"code": "ABC-12", "note": "room 10"}', '{"code": "ABC-12", "note": "12345678901234567"}'],
        "Give a product code and a short note with a room number."),
    "format": (
        {"type": "object", "properties": {
            "day": {"type": "string", "format": "date"},
            "when": {"type": "string", "format": "date-time", "maxLength": 32},  # bounds its fraction of a second
            "email": {"type": "string", "format": "email", "maxLength": 40},
            "id": {"type": "string", "format": "uuid"}},
         "required": ["day", "when", "email", "id"], "additionalProperties": False},
        ['{"day": "2024-02-29", "when": "2021-03-04T05:06:07Z", "email": "ada@example.org", '
         '"id": "123e4567-e89b-12d3-a456-426614174000"}'],
        ['{"day": "2023-02-29", "when": "2021-03-04T05:06:07Z", "email": "ada@example.org", '
         '"id": "123e4567-e89b-12d3-a456-426614174000"}',
         '{"day": "2024-02-29", "when": "2021-03-04 05:06:07", "email": "ada@example.org", '
         '"id": "123e4567-e89b-12d3-a456-426614174000"}',
         '{"day": "2024-02-29", "when": "2021-03-04T05:06:07Z", "email": "ada", '
         '"id": "123e4567-e89b-12d3-a456-426614174000"}',
         '{"day": "2024-02-29", "when": "2021-03-04T05:06:07Z", "email": "ada@example.org", "id": "123"}'],
        "Register a meeting: its day, its start time, the organiser's email and an id."),
    "additionalProperties": (
        {"type": "object", "properties": {"name": {"type": "string", "maxLength": 16}}, "required": ["name"],
         "additionalProperties": {"type": "boolean"}, "maxProperties": 3},
        ['{"name": "Ada"}', '{"name": "Ada", "likes_tea": true}'],
        ['{"name": "Ada", "age": 36}', '{"name": "Ada", "a": true, "b": false, "c": true}'],
        "Describe a person with yes/no facts about them."),
    "$ref recursion": (
        {"$defs": {"node": {"type": "object", "properties": {
            "label": {"type": "string", "maxLength": 12},
            "children": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}},
            "required": ["label", "children"], "additionalProperties": False}},
         "$ref": "#/$defs/node"},
        ['{"label": "root", "children": [{"label": "leaf", "children": []}]}'],
        ['{"label": "root", "children": [{"label": "leaf"}]}',
         '{"label": "root", "children": [{"label": "a", "children": []}, {"label": "b", "children": []}, '
         '{"label": "c", "children": []}]}'],
        "Draw a tiny family tree: one parent and two children, who have no children of their own."),
    "enum and const": (
        {"type": "object", "properties": {
            "pick": {"enum": [{"x": 1, "y": [True, None]}, [1, "two", 3.5], "plain", 7, None, False]},
            "fixed": {"const": {"k": ["v", {"z": None}]}}},
         "required": ["pick", "fixed"], "additionalProperties": False},
        ['{"pick": {"x": 1, "y": [true, null]}, "fixed": {"k": ["v", {"z": null}]}}',
         '{"pick": [1, "two", 3.5], "fixed": {"k": ["v", {"z": null}]}}',
         '{"pick": null, "fixed": {"k": ["v", {"z": null}]}}'],
        ['{"pick": 8, "fixed": {"k": ["v", {"z": null}]}}', '{"pick": "plain", "fixed": {"k": ["v"]}}',
         '{"pick": {"x": 1}, "fixed": {"k": ["v", {"z": null}]}}'],
        "Pick one."),
    "items": (
        {"type": "object", "properties": {
            "colors": {"type": "array", "items": {"type": "string", "maxLength": 12}, "minItems": 2, "maxItems": 4},
            "scores": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 100},
                       "minItems": 3, "maxItems": 3}},
         "required": ["colors", "scores"], "additionalProperties": False},
        ['{"colors": ["red", "blue"], "scores": [1, 2, 3]}'],
        ['{"colors": ["red"], "scores": [1, 2, 3]}', '{"colors": ["a", "b", "c", "d", "e"], "scores": [1, 2, 3]}',
         '{"colors": ["red", "blue"], "scores": [1, 2]}'],
        "Name your favourite colours and three test scores."),
    "string lengths": (
        {"type": "object", "properties": {
            "short": {"type": "string", "minLength": 2, "maxLength": 5},
            "long": {"type": "string", "minLength": 20, "maxLength": 40}},
         "required": ["short", "long"], "additionalProperties": False},
        ['{"short": "ab", "long": "twenty characters ok"}', '{"short": "héllo", "long": "' + "é" * 40 + '"}'],
        ['{"short": "a", "long": "twenty characters ok"}', '{"short": "abcdef", "long": "twenty characters ok"}',
         '{"short": "ab", "long": "too short"}'],
        "Give a nickname and a one-line description."),
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_each_keyword_family_takes_the_answers_it_allows_and_refuses_the_others(family):
    """Without a model: the grammar of each family's schema takes exactly what ``jsonschema`` says is valid
    (over the examples, which ``jsonschema`` checks first)."""
    schema, valid, invalid, _ = FAMILIES[family]
    spec = spec_of(schema)  # supported: no refusal
    assert spec.kind == "json"
    for text in valid:
        assert is_valid(json.loads(text), schema), text  # the example itself is right
        assert grammar.matches(spec.constraint, text), (family, text)
        assert spec.check(text)[0] == text
    for text in invalid:
        assert not is_valid(json.loads(text), schema), text
        assert not grammar.matches(spec.constraint, text), (family, text)


#: What llguidance cannot enforce, and where it sits: each is refused naming the keyword.
UNENFORCEABLE = [
    ({"type": "string", "if": {"maxLength": 3}, "then": {"pattern": "^a"}}, ["if", "then"]),
    ({"type": "object", "properties": {"a": {"type": "string", "not": {"const": "x"}}}}, ["not"]),
    ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, ["uniqueItems"]),
    ({"type": "array", "contains": {"type": "integer"}, "minContains": 2}, ["contains", "minContains"]),
    ({"type": "object", "dependentRequired": {"a": ["b"]}}, ["dependentRequired"]),
    ({"type": "object", "dependentSchemas": {"a": {"required": ["b"]}}}, ["dependentSchemas"]),
    ({"type": "object", "propertyNames": {"pattern": "^a"}}, ["propertyNames"]),
    ({"type": "object", "unevaluatedProperties": False}, ["unevaluatedProperties"]),
    ({"type": "array", "unevaluatedItems": False}, ["unevaluatedItems"]),
    ({"$defs": {"a": {"type": "array", "items": {"$ref": "#/$defs/a"}, "uniqueItems": True}}, "$ref": "#/$defs/a"},
     ["uniqueItems"]),
]


@pytest.mark.parametrize("schema, keywords", UNENFORCEABLE, ids=[" ".join(k) for _, k in UNENFORCEABLE])
def test_what_the_engine_cannot_enforce_is_refused_in_one_line_naming_the_keyword(schema, keywords):
    with pytest.raises(SchemaError) as refused:
        spec_of(schema)
    message = str(refused.value)
    assert "\n" not in message and len(message) < 600, message
    for keyword in keywords:
        assert f'"{keyword}"' in message, message


def test_a_refused_keyword_ends_the_job_before_the_model_runs(echo):
    backend = ScriptedBackend("never asked")
    job = run_echo(echo, backend, json_format({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}))
    assert job.envelope.error.code == codes.SCHEMA_VALIDATION_FAILED
    assert 'Unimplemented keys: ["uniqueItems"]' in job.envelope.error.message
    assert backend.scripted.prompts == []
    assert not [e for e in job.events if e["type"].startswith("response.")]


@pytest.mark.parametrize("fields, words", [
    ({"regex": "(unclosed"}, ["the regex cannot be enforced", "unclosed group"]),
    ({"regex": "(?=look)ahead"}, ["the regex cannot be enforced", "look-around"]),
    ({"regex": "(a)\\1"}, ["backreferences are not supported"]),
    ({"grammar": "start: nowhere"}, ["the Lark grammar cannot be enforced", 'unknown name: "nowhere"']),
    ({"grammar": 'greeting: "hi"'}, ["the Lark grammar cannot be enforced", "no start rule"]),
    ({**json_format({"type": "string", "pattern": "(a)\\1"})}, ["backreferences are not supported"]),
    ({**json_format({"type": "string", "format": "no-such-format"})}, ["Unknown format: no-such-format"]),
    ({**json_format({"type": "integer", "minimum": 5, "maximum": 3})}, ["Unsatisfiable schema"]),
])
def test_a_constraint_that_does_not_compile_is_refused_in_one_line(fields, words):
    with pytest.raises(SchemaError) as refused:
        OutputSpec.of(infer_fields(**fields))
    message = str(refused.value)
    assert "\n" not in message and len(message) < 600, message
    for word in words:
        assert word in message, message


# --- dates and times: what the engine allows is what jsonschema accepts --------------------------------------


def dates_around_leap_days():
    for year in (1, 4, 100, 400, 1900, 1999, 2000, 2023, 2024, 2100, 9996, 9999):
        for month, day in ((2, 28), (2, 29), (2, 30), (4, 30), (4, 31), (12, 31)):
            yield f"{year:04d}-{month:02d}-{day:02d}"
    yield "0000-01-01"
    yield "0000-02-29"


@pytest.mark.parametrize("fmt, wrap", [("date", "{}"), ("date-time", "{}T23:59:59.5+05:30"),
                                       ("date-time", "{}t10:00:00z")])
def test_a_date_the_engine_allows_is_a_date_jsonschema_accepts(fmt, wrap):
    """llguidance alone allows the 29th of February of every year and the year 0000; held to the exact pattern,
    its verdict on each date is ``jsonschema``'s."""
    schema = {"type": "string", "format": fmt}
    constraint = spec_of(schema).constraint
    for day in dates_around_leap_days():
        text = wrap.format(day)
        assert grammar.matches(constraint, json.dumps(text)) == is_valid(text, schema), text


@pytest.mark.parametrize("clock, accepted", [("23:59:59Z", True), ("23:59:60Z", False), ("24:00:00Z", False),
                                             ("10:00:00.25-23:59", True), ("10:00:00", False)])
def test_a_time_the_engine_allows_is_a_time_jsonschema_accepts(clock, accepted):
    for fmt, text in (("time", clock), ("date-time", "2024-02-29T" + clock)):
        schema = {"type": "string", "format": fmt}
        assert is_valid(text, schema) == accepted
        assert grammar.matches(spec_of(schema).constraint, json.dumps(text)) == accepted, (fmt, text)


def test_the_date_pattern_joins_a_pattern_of_the_guests_own_and_leaves_data_alone():
    own = {"type": "string", "format": "date", "pattern": "^20"}
    constraint = spec_of(own).constraint
    assert grammar.matches(constraint, '"2024-02-29"')
    assert not grammar.matches(constraint, '"2023-02-29"')  # the calendar's
    assert not grammar.matches(constraint, '"1999-01-01"')  # the guest's
    data = {"const": {"format": "date", "pattern": "x"}}  # a value, not a schema
    assert grammar.matches(spec_of(data).constraint, '{"format": "date", "pattern": "x"}')


@pytest.mark.xfail(strict=True, reason="llguidance 1.9: a number range narrower than 1 with an exclusive bound "
                                      "at a whole number lets that number through written without a fraction (or "
                                      "as -0); jsonschema refuses it, so the job fails schema_validation_failed. "
                                      "When this passes, the property's generator can drop its workaround")
@pytest.mark.parametrize("schema, text", [
    ({"type": "number", "minimum": -1.5, "exclusiveMaximum": -1}, "-1"),
    ({"type": "number", "minimum": -0.5, "exclusiveMaximum": 0}, "-0"),
    ({"type": "number", "exclusiveMinimum": 1, "maximum": 1.5}, "1"),
])
def test_an_exclusive_whole_bound_of_a_narrow_range(schema, text):
    assert not is_valid(json.loads(text), schema)
    assert not grammar.matches(spec_of(schema).constraint, text)


# --- each text constraint kind from an infer command ----------------------------------------------------------


def test_the_text_constraints_parse_and_are_written_only_when_set():
    plain = {"cmd": "infer", "prompt": "p", "max_tokens": 3, "images": []}
    for extra in ({"regex": "[a-z]+"}, {"choices": ["a", "b \"c\""]}, {"grammar": 'start: "x"'}):
        cmd = abi.command_from_json({**plain, **extra})
        assert cmd.to_json() == {**plain, **extra}
    assert abi.command_from_json(plain).to_json() == plain


TEXT_KINDS = {
    "regex": ({"regex": "[0-9]{3}-[a-z]{2,4}"}, lambda text: re.fullmatch("[0-9]{3}-[a-z]{2,4}", text)),
    "choices": ({"choices": ["red", "green", 'blue "dark"', "vert ✓"]},
                lambda text: text in ("red", "green", 'blue "dark"', "vert ✓")),
    "grammar": ({"grammar": 'start: greeting " " name "!"\ngreeting: "hello" | "hi"\nname: /[A-Z][a-z]{1,8}/\n'},
                lambda text: re.fullmatch("(hello|hi) [A-Z][a-z]{1,8}!", text)),
}


@pytest.mark.parametrize("kind", list(TEXT_KINDS))
def test_each_text_constraint_holds_the_answer_of_a_job_on_the_tiny_model(echo, tiny_files, kind):  # noqa: F811
    """A random-weight model, sampled: anything it writes is held to the constraint, the guest gets it in
    ``infer_done``, the response reports what it was held to and the transcript keeps the infer."""
    from tensorjob_jupyter.inference.models import get_backend

    fields, holds = TEXT_KINDS[kind]
    backend = get_backend(tiny_files["model"], **ONE_THREAD)
    for seed in range(3):
        job = run_echo(echo, backend, {**fields, "temperature": 1.0, "seed": seed}, max_tokens=48)
        assert job.envelope.ok, job.envelope
        text = job.result["event"]["text"]
        assert holds(text), (kind, text)
        assert job.result["streamed"] == text
        response = final_response(job)
        assert response["output_text"] == text
        assert response[kind] == fields[kind]  # what the answer was held to (this project's extension)
        created = next(e for e in job.events if e["type"] == "response.created")
        assert created["command"][kind] == fields[kind]  # the infer as the guest sent it, for replay


def test_a_text_answer_that_does_not_match_fails_the_job(echo):
    """A served model that does not enforce the constraint is caught by the check (the same grammar over bytes)."""
    for fields, reply in (({"regex": "[0-9]+"}, "12a"), ({"choices": ["yes", "no"]}, "yes!"),
                          ({"grammar": 'start: "a"+'}, "aab")):
        job = run_echo(echo, ScriptedBackend(reply), fields)
        assert job.envelope.error.code == codes.SCHEMA_VALIDATION_FAILED, (fields, job.envelope)
        assert "does not match the infer's" in job.envelope.error.message
        assert [e["type"] for e in job.events if e["type"].startswith("response.") or e["type"] == "error"][-2:] \
            == ["error", "response.failed"]


def test_an_infer_takes_one_constraint_and_no_stop_beside_it():
    with pytest.raises(SchemaError, match="an infer takes one of format, regex, choices, grammar and tools"):
        OutputSpec.of(infer_fields(regex="a", choices=["a"]))
    with pytest.raises(SchemaError, match="got regex and format"):
        OutputSpec.of(infer_fields(regex="a", **json_format({"type": "string"})))
    for extra in ({"regex": "a"}, {"choices": ["a"]}, {"grammar": 'start: "a"'}):
        with pytest.raises(abi.AbiError, match="`infer.stop` cannot be given with"):
            infer_fields(stop=["x"], **extra)


# --- the sampler and the engine ---------------------------------------------------------------------------


def test_a_grammar_that_cannot_go_on_ends_the_answer_where_it_is_complete(tiny_engine):
    result = constrained(tiny_engine, Constraint(choices=("only",)), max_tokens=30)
    assert result.text == "only" and result.finish_reason == "stop"


def test_a_grammar_refused_by_the_engine_is_schema_validation_failed_before_any_token(echo, tiny_files,  # noqa: F811
                                                                                      monkeypatch):
    """Should the host's check ever pass a grammar the engine's compile refuses, the request still fails alone,
    before any token, as ``schema_validation_failed``."""
    from tensorjob_jupyter.inference.models import get_backend

    monkeypatch.setattr(grammar, "check", lambda constraint: None)
    job = run_echo(echo, get_backend(tiny_files["model"], **ONE_THREAD), {"grammar": "start: undefined_rule"})
    assert job.envelope.error.code == codes.SCHEMA_VALIDATION_FAILED, job.envelope
    assert "the Lark grammar cannot be enforced" in job.envelope.error.message
    assert not [e for e in job.events if e["type"] == "response.output_text.delta"]
    after = run_echo(echo, get_backend(tiny_files["model"], **ONE_THREAD), {"choices": ["fine"]})
    assert after.envelope.ok and after.result["event"]["text"] == "fine"


def test_a_token_that_writes_no_text_is_never_allowed_as_text(tiny_engine):
    """llguidance's own reader of a llama.cpp vocabulary takes the unknown token for the text ``<unk>`` and lets
    it into any string, while the engine writes nothing for it: an answer came out five characters short of its
    ``minLength``. Every token that writes no text is now special to the grammar, which never allows it."""
    matcher = tiny_engine.grammars().matcher(Constraint(regex="[<>a-z/]{5,9}"))
    mask = np.zeros((1, (tiny_engine.n_vocab + 31) // 32), dtype=np.int32)
    matcher.unsafe_compute_mask_ptr(mask.ctypes.data, mask.nbytes)
    allowed = np.unpackbits(mask.view(np.uint8), bitorder="little")[:tiny_engine.n_vocab].astype(bool)
    silent = [t for t in range(tiny_engine.n_vocab) if tiny_engine.piece(t) == b""]
    assert silent and not allowed[silent].any()
    expected = {bytes([b]) for b in b"<>/" + string.ascii_lowercase.encode()}
    assert {tiny_engine.piece(t) for t in np.nonzero(allowed)[0]} == expected


def walk(engine, constraint: Constraint, steps: int, seed: int) -> int:
    """Sample ``steps`` tokens of random logits under ``constraint`` (no decode); how many were taken before a
    ``ConstraintError`` (raised) or the end of the grammar."""
    chain = engine._sampler(GenerateRequest("x", steps, Sampler(temperature=1.0, seed=seed), constraint=constraint),
                            [])
    rng = np.random.default_rng(seed)
    try:
        for i in range(steps):
            token = chain.sample_logits((rng.standard_normal(engine.n_vocab) * 3).astype(np.float32))
            if engine.is_eog(token):
                return i
        return steps
    finally:
        chain.close()


def remembering_regex(window: int) -> str:
    """A regex whose lexer state remembers the last ``window`` letters and digits: a new state for each of them
    at each step."""
    cls = "[A-Za-z0-9]"
    return cls + "*(" + "|".join(f"{ch}{cls}{{{window}}}{ch}" for ch in string.ascii_letters + string.digits) + ")"


def test_a_shared_lexer_filled_by_earlier_requests_does_not_fail_the_next_one(tiny_engine, monkeypatch):
    """Copies of a kept grammar share one lexer: requests that each stay far inside the lexer's bound used to fill
    it together, and every later request with that grammar failed at its first token. Each request now answers
    for its own walk alone -- and one whose own walk passes the bound still fails."""
    constraint = Constraint(regex=remembering_regex(19))
    for seed in range(4):  # each ~100 steps of up to ~60 new lexer states: ~5,000 each, ~20,000 together
        walk(tiny_engine, constraint, 100, seed)
    with pytest.raises(ConstraintError, match="too many states"):
        walk(tiny_engine, constraint, 400, seed=9)  # ~20,000 states of its own
    # the same requests without the fresh compile (a grammar of their own, so no earlier walk counts): they fail
    monkeypatch.setattr(grammar.GrammarSampler, "_renew", lambda self: False)
    with pytest.raises(ConstraintError, match="too many states"):
        for seed in range(4):
            walk(tiny_engine, Constraint(regex=remembering_regex(18)), 100, seed)


# --- the embedded model on every keyword family (slow) ----------------------------------------------------------


#: The family whose answers no bound ends: a tree may nest as deep as the model goes on writing.
UNBOUNDED_FAMILIES = {"$ref recursion"}


@pytest.mark.slow
@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_embedded_model_held_to_each_keyword_family_answers_valid_json(smollm, family):  # noqa: F811
    schema, _, _, prompt = FAMILIES[family]
    spec = spec_of(schema)
    prompts = [f"{prompt} Answer in JSON.", f"{prompt} Be brief; reply with JSON only."]
    futures = [smollm.generate_stream(GenerateRequest(p, 200, Sampler(repeat_penalty=1.1), chat=None,
                                                      constraint=spec.constraint), lambda _: True)
               for p in prompts]
    finished = 0
    for p, fut in zip(prompts, futures):
        result = fut.result(600)
        if result.finish_reason == "length" and family in UNBOUNDED_FAMILIES:
            # still inside its tree at the limit: unfinished, never invalid
            assert grammar.allows_prefix(spec.constraint, result.text.encode("utf-8")), (family, p, result.text)
            continue
        assert result.finish_reason == "stop", (family, p, result.text)
        validate(json.loads(result.text), schema)
        assert spec.check(result.text)[0] == result.text
        finished += 1
    assert finished >= 1, family


SLOW_TEXT_KINDS = {
    "regex": ({"regex": "(yes|no), because [a-z ,]{5,60}\\."},
              lambda text: re.fullmatch("(yes|no), because [a-z ,]{5,60}\\.", text)),
    "choices": ({"choices": ["positive", "negative", "neutral"]},
                lambda text: text in ("positive", "negative", "neutral")),
    "grammar": ({"grammar": 'start: item (", " item)*\nitem: /[A-Za-z]{2,12}/\n'},
                lambda text: re.fullmatch("[A-Za-z]{2,12}(, [A-Za-z]{2,12})*", text)),
}


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(SLOW_TEXT_KINDS))
def test_each_text_constraint_holds_the_embedded_models_answer_in_a_job(echo, kind):
    fields, holds = SLOW_TEXT_KINDS[kind]
    prompt = {"regex": "Is the sea salty? Answer yes or no, and say why.",
              "choices": "Classify the sentiment: 'I loved this film.'",
              "grammar": "List three fruits."}[kind]
    job = run_echo(echo, None, fields, prompt=prompt, max_tokens=64)
    if kind == "grammar" and not job.envelope.ok:  # a list may go on to the limit: never invalid when it ends
        assert job.envelope.error.code == codes.LIMIT_EXCEEDED, job.envelope
        return
    assert job.envelope.ok, job.envelope
    text = job.result["event"]["text"]
    assert holds(text), (kind, text)
    assert final_response(job)[kind] == fields[kind]


# --- properties --------------------------------------------------------------------------------------------------


PATTERN_ATOMS = ["a", "b", "c", "x", "[ab]", "[a-c]", "[0-9]", "[^a]", "."]
QUANTIFIERS = ["*", "+", "?", "{2}", "{0,2}", "{1,3}", "{2,}", "*?", "+?", "??"]


def regex_bodies(max_leaves: int = 6):
    def extend(inner):
        return st.one_of(
            st.lists(inner, min_size=2, max_size=3).map("".join),
            st.lists(inner, min_size=2, max_size=3).map(lambda xs: "(" + "|".join(xs) + ")"),
            st.lists(inner, min_size=2, max_size=3).map(lambda xs: "(?:" + "|".join(xs) + ")"),
            st.tuples(inner, st.sampled_from(QUANTIFIERS)).map(lambda t: f"(?:{t[0]}){t[1]}"),
        )
    return st.recursive(st.sampled_from(PATTERN_ATOMS), extend, max_leaves=max_leaves)


def min_width(body: str) -> int:
    from re import _parser  # the stdlib's own regex parser: the shortest string a pattern matches

    return _parser.parse(body).getwidth()[0]


def string_schemas():
    def pattern_schema(args):
        body, anchored = args
        if anchored:
            return {"type": "string", "pattern": f"^{body}$"}
        schema = {"type": "string", "pattern": body}
        if min_width(body) <= 8:  # unanchored: any text around it; bounded so a random walk ends
            schema["maxLength"] = 12
        return schema

    return st.one_of(
        st.tuples(st.integers(0, 4), st.integers(0, 8)).map(
            lambda t: {"type": "string", "minLength": t[0], "maxLength": t[0] + t[1]}),
        st.tuples(regex_bodies(4), st.booleans()).map(pattern_schema),
        st.sampled_from(["date", "date-time", "time", "email", "uuid"]).map(
            lambda f: {"type": "string", "format": f, "maxLength": 40} if f == "email"
            else {"type": "string", "format": f}),
    )


def number_schemas():
    bound = st.integers(-40, 40).map(lambda n: n / 4)

    def numeric(args):
        kind, low, span, low_key, high_key = args
        if kind == "integer":
            low, span = int(low), int(span) + 2
        elif "exclusive" in low_key + high_key:
            span = max(span, 1.0)  # narrower: llguidance's known slip (test_an_exclusive_whole_bound_of_a_narrow_range)
        return {"type": kind, low_key: low, high_key: low + span}

    return st.tuples(st.sampled_from(["integer", "number"]), bound, st.integers(1, 40).map(lambda n: n / 2),
                     st.sampled_from(["minimum", "exclusiveMinimum"]),
                     st.sampled_from(["maximum", "exclusiveMaximum"])).map(numeric)


def json_values():
    scalars = st.one_of(st.none(), st.booleans(), st.integers(-1000, 1000), st.integers(-40, 40).map(lambda n: n / 8),
                        st.text(max_size=6))
    return st.recursive(scalars, lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text("abkz", min_size=1, max_size=3), inner, max_size=3)),
        max_leaves=6)


def leaf_schemas():
    return st.one_of(
        string_schemas(), number_schemas(),
        st.sampled_from([{"type": "boolean"}, {"type": "null"}, {"type": ["string", "null"], "maxLength": 6}]),
        st.lists(json_values(), min_size=1, max_size=5).map(lambda values: {"enum": values}),
        json_values().map(lambda value: {"const": value}),
    )


KEYS = st.text("abcxyz_", min_size=1, max_size=4)
LOOSE = [{}, {"minimum": -10_000}, {"maxLength": 64}, {"maxItems": 8}, {"description": "any"}]


def schemas():
    def obj(args):
        props, required_mask, additional = args
        schema = {"type": "object", "properties": props,
                  "required": [k for k, keep in zip(props, required_mask) if keep]}
        if additional is not None:
            schema["additionalProperties"] = additional
        return schema

    def linked_list(value):
        return {"$defs": {"node": {"type": "object", "properties": {
            "value": value, "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}},
            "required": ["value", "next"], "additionalProperties": False}}, "$ref": "#/$defs/node"}

    def extend(inner):
        return st.one_of(
            st.tuples(st.dictionaries(KEYS, inner, min_size=1, max_size=3), st.lists(st.booleans(), min_size=3,
                                                                                     max_size=3),
                      st.sampled_from([False, False, None, {"type": "integer", "minimum": 0, "maximum": 9}])).map(obj),
            st.tuples(inner, st.integers(0, 2), st.integers(0, 2)).map(
                lambda t: {"type": "array", "items": t[0], "minItems": t[1], "maxItems": t[1] + t[2]}),
            st.lists(inner, min_size=1, max_size=3).map(lambda xs: {"anyOf": xs}),
            st.tuples(inner, st.sampled_from(LOOSE)).map(lambda t: {"allOf": [t[0], t[1]]}),
            st.tuples(st.integers(0, 5), st.integers(0, 5)).map(lambda t: {"oneOf": [
                {"type": "integer", "minimum": t[0], "maximum": t[0] + t[1]}, {"type": "boolean"},
                {"type": "string", "maxLength": t[1]}]}),
        )
    # a $ref resolves from the root: recursion ($defs) only at the top, around any of the others
    tree = st.recursive(leaf_schemas(), extend, max_leaves=8)
    return st.one_of(tree, tree.map(linked_list))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(schema=schemas(), seed=st.integers(0, 2**16))
def test_any_supported_schema_held_on_the_random_model_answers_valid_json(tiny_engine, schema, seed):
    """Generated schemas over the supported keywords: each compiles, and every answer drawn at random under it
    validates with ``jsonschema``; an answer cut by the token limit is unfinished, never invalid: what it wrote is
    the start of an answer the grammar takes, one the schema's whole answers begin with."""
    note(json.dumps(schema))
    spec = spec_of(schema)  # every keyword generated is supported: no refusal
    data, finished = draw_answer(tiny_engine, spec.constraint, seed=seed, max_tokens=150)
    event("finished" if finished else "cut at the token limit")
    note(repr(data))
    if not finished:
        assert data and grammar.allows_prefix(spec.constraint, data)
        assert not grammar.allows_prefix(spec.constraint, data + b"\x00")  # the check refuses what JSON cannot hold
        return
    text = data.decode("utf-8")
    validate(json.loads(text), schema)
    assert spec.check(text)[0] == text


def greedy_tokens(engine, constraint: Constraint, logits: list[np.ndarray], shortcut: bool) -> tuple[list[int], int]:
    """The tokens a greedy chain with the repetition penalty takes under ``constraint`` from these logits, and how
    many of its choices the grammar refused. ``shortcut`` False: the reference -- the mask applied first and the
    chain run over the masked logits, its buffer written whole every time."""
    chain = engine._sampler(GenerateRequest("x", len(logits), Sampler(temperature=0.0, repeat_penalty=1.3),
                                            constraint=constraint), [1, 2, 3])
    if not shortcut:
        chain.check_first = False
        chain._greedy = False
    taken = []
    try:
        for row in logits:
            taken.append(chain.sample_logits(row.copy()))  # the sampler penalises its row in place
            if engine.is_eog(taken[-1]):
                break
        return taken, chain.grammar_full if shortcut else 0
    finally:
        chain.close()


def pieces_the_grammar_writes(engine) -> list[int]:
    """Tokens a JSON answer is made of (quotes, braces, separators, a letter, a digit): boosted, they are chosen
    again and again, so the repetition penalty decides among tokens the grammar allows."""
    wanted = {b'"', b"{", b"}", b":", b",", b" ", b"a", b"1", b"[", b"]"}
    return [t for t in range(engine.n_vocab) if engine.piece(t) in wanted]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(schema=schemas(), seed=st.integers(0, 2**16), boost=st.sampled_from([0.0, 1.0]))
def test_a_greedy_choice_refused_by_the_grammar_is_the_chains_own_choice_under_the_mask(tiny_engine, schema, seed,
                                                                                         boost):
    """A greedy chain whose choice the grammar refuses takes the largest penalised logit the mask allows, without
    running the chain again, and keeps its buffer's ids between tokens: always the tokens of the chain run over
    the masked logits with a buffer written whole. Tokens JSON is made of are boosted (``boost``), so the
    penalty on repeats decides between tokens the grammar allows."""
    note(json.dumps(schema))
    constraint = spec_of(schema).constraint
    rng = np.random.default_rng(seed)
    boosted = pieces_the_grammar_writes(tiny_engine)
    rows = []
    for _ in range(60):
        row = (rng.standard_normal(tiny_engine.n_vocab) * 3).astype(np.float32)
        row[boosted] += 6 * boost
        rows.append(row)
    taken, refused = greedy_tokens(tiny_engine, constraint, rows, shortcut=True)
    event(f"choices the grammar refused: {'some' if refused else 'none'}")
    assert (taken, 0) == greedy_tokens(tiny_engine, constraint, rows, shortcut=False)


def test_the_greedy_shortcut_is_taken(tiny_engine):
    """The property above compares something: random logits under a JSON schema make the grammar refuse the
    chain's choice often, so the shortcut runs."""
    constraint = spec_of({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}).constraint
    rng = np.random.default_rng(1)
    rows = [(rng.standard_normal(tiny_engine.n_vocab) * 3).astype(np.float32) for _ in range(20)]
    taken, refused = greedy_tokens(tiny_engine, constraint, rows, shortcut=True)
    assert refused >= 3 and taken


def test_random_answers_to_the_families_finish_and_validate(tiny_engine):
    """The property above cannot pass by never finishing: answers drawn at random under each family's schema
    mostly end within the limit, and every one that ends validates."""
    finished = 0
    for family, (schema, _, _, _) in FAMILIES.items():
        constraint = spec_of(schema).constraint
        for seed in range(4):
            text = sample_answer(tiny_engine, constraint, seed=seed, max_tokens=200)
            if text is not None:
                finished += 1
                validate(json.loads(text), schema)
    assert finished >= 2 * len(FAMILIES), finished


@pytest.mark.slow
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(schema=schemas())
def test_any_supported_schema_held_on_the_embedded_model_answers_valid_json(smollm, schema):  # noqa: F811
    note(json.dumps(schema))
    spec = spec_of(schema)
    result = smollm.generate_stream(GenerateRequest("Fill in this form. Answer in JSON.", 80,
                                                    Sampler(repeat_penalty=1.1), chat=None,
                                                    constraint=spec.constraint), lambda _: True).result(600)
    note(result.text)
    if result.finish_reason == "length":  # cut at the token limit: unfinished, never invalid
        assert result.usage.completion_tokens == 80, result.usage
        assert grammar.allows_prefix(spec.constraint, result.text.encode("utf-8")), result.text
        return
    assert result.finish_reason == "stop", result
    validate(json.loads(result.text), schema)
    assert spec.check(result.text)[0] == result.text


#: Any character a JSON string may carry (no lone surrogate: the ABI refuses those), control characters included.
CHOICE_TEXT = st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=8)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(choices=st.lists(st.one_of(CHOICE_TEXT, st.sampled_from(['"', "\\", '\\"', "\x7f", "\u2028", "\x00", "é😀"])),
                        min_size=1, max_size=6, unique=True),
       seed=st.integers(0, 2**16))
def test_the_answer_to_choices_is_always_one_of_them(tiny_engine, choices, seed):
    spec = OutputSpec.of(infer_fields(choices=choices))
    text = sample_answer(tiny_engine, spec.constraint, seed=seed, max_tokens=64)
    assert text in choices, (choices, text)
    assert spec.check(text)[0] == text
    for choice in choices:
        assert grammar.matches(spec.constraint, choice)
    longer = choices[0] + "x"
    assert grammar.matches(spec.constraint, longer) == (longer in choices)


@settings(max_examples=100, deadline=None)
@given(data=st.data(), body=regex_bodies(), anchored=st.booleans())
def test_grammar_matches_agrees_with_python_fullmatch_on_simple_regexes(data, body, anchored):
    pattern = f"^{body}$" if anchored else body
    compiled = re.compile(pattern)
    constraint = Constraint(regex=pattern)
    grammar.check(constraint)
    texts = data.draw(st.lists(st.text("abcx0\n", max_size=7), min_size=5, max_size=12))
    texts += data.draw(st.lists(st.from_regex(compiled, fullmatch=True, alphabet="abcx0\n"), min_size=1,
                                max_size=4))
    for text in texts:
        assert grammar.matches(constraint, text) == bool(compiled.fullmatch(text)), (pattern, text)


def test_matches_checks_the_whole_answer_and_is_safe_from_any_thread():
    constraint = Constraint(regex="[a-c]{2,3}")
    assert grammar.matches(constraint, "abc") and not grammar.matches(constraint, "abca")
    assert not grammar.matches(constraint, "a") and not grammar.matches(constraint, "")
    verdicts: list = []
    threads = [threading.Thread(target=lambda: verdicts.append(grammar.matches(constraint, "ab"))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert verdicts == [True] * 8

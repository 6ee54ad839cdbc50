"""Quote mode: string fields copied from what the job read, held there by the grammar and checked after.

The grammar is llguidance's own (its substring lexemes): these tests hold what quote mode promises on top of
it -- which fields are quoted, that a copy of whole words passes and nothing else does, that the check after
the answer agrees with the grammar (a served model may not enforce it), and that a job on a model that writes
something else fails ``schema_validation_failed`` naming the field.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tensorjob_jupyter as tj
from tensorjob_jupyter.host.quoting import (
    MAX_QUOTE_CHARS, Quotes, asks_quotes, check_quoted, quote_constraint, quote_pieces,
)
from tensorjob_jupyter.host.schemas import SchemaError
from tensorjob_jupyter.host.structured import compile_spec
from tensorjob_jupyter.inference import grammar
from tensorjob_jupyter.inference.scripted import ScriptedBackend

from llama_support import smollm  # noqa: F401
import wat

EXTRACT = Path(__file__).resolve().parents[2] / "guests" / "examples" / "extract.c"

INVOICE = 'Vendor: Acme Tools GmbH\nCustomer: "Blue River" Ltd\nTotal due: 1.234,56 EUR\n'
SCHEMA = {"type": "object", "properties": {"vendor": {"type": "string"}, "total": {"type": "number"},
                                           "due": {"type": ["string", "null"]},
                                           "tags": {"type": "array", "items": {"type": "string"}},
                                           "kind": {"enum": ["invoice", "receipt"]}},
          "required": ["vendor", "total"]}


def spec_of(schema: dict, quote: bool = True):
    fmt = {"type": "json_schema", "name": "facts", "schema": schema, **({"quote": True} if quote else {})}
    return compile_spec(json.dumps({"format": fmt, "tools": [], "tool_choice": "none"}))


def quotes(schema: dict = SCHEMA, text: str = INVOICE, quote: bool = True) -> Quotes:
    return Quotes.of(spec_of(schema, quote), [text])


def answer(**fields) -> str:
    value = {"vendor": "Acme Tools GmbH", "total": 1234.56, "due": None, "tags": [], "kind": "invoice", **fields}
    return json.dumps(value, ensure_ascii=False)


def test_the_pieces_are_cut_where_json_escapes_and_kept_once_in_the_order_read():
    assert quote_pieces(['a "b" c\\d\ne\tf', "a", "e"]) == ["a", "b", "c", "d", "e", "f"]
    assert quote_pieces(["  ,  \n --- \n"]) == []  # no word: nothing to copy
    big = quote_pieces(["x" * 10 + "\n" + "y" * MAX_QUOTE_CHARS])
    assert big == ["x" * 10]  # what passes the bound is not offered


def test_quote_on_the_format_quotes_every_plain_string_and_only_those():
    q = quotes()
    assert q.paths == (("vendor",), ("due",), ("tags", "[]"))  # not the number, not the enum
    assert grammar.matches(q.constraint, answer())
    assert grammar.matches(q.constraint, answer(due="1.234,56 EUR", tags=["Blue River", "Ltd"]))
    assert not grammar.matches(q.constraint, answer(vendor="Acme Tool"))  # ends inside a word
    assert not grammar.matches(q.constraint, answer(vendor="Acme Tools GmbH Customer"))  # across a line
    assert not grammar.matches(q.constraint, answer(vendor='Customer: "Blue'))  # across an escaped quote
    assert not grammar.matches(q.constraint, answer(kind="bill"))  # the rest is still the schema
    assert not grammar.matches(q.constraint, answer(vendor=None))  # a string field takes no null


def test_quote_on_one_field_quotes_that_field_alone():
    schema = {"type": "object", "properties": {"vendor": {"type": "string", "quote": True},
                                               "note": {"type": "string"}}}
    spec = spec_of(schema, quote=False)
    assert spec.quote and asks_quotes(spec.format, schema)
    q = Quotes.of(spec, [INVOICE])
    assert q.paths == (("vendor",),)
    assert grammar.matches(q.constraint, '{"vendor": "GmbH", "note": "anything at all"}')
    assert not grammar.matches(q.constraint, '{"vendor": "anything", "note": "GmbH"}')


def test_a_property_named_quote_is_a_name_not_the_keyword():
    schema = {"type": "object", "properties": {"quote": {"type": "string"}}}
    assert not spec_of(schema, quote=False).quote
    q = quotes(schema)
    assert q.paths == (("quote",),)
    assert grammar.matches(q.constraint, '{"quote": "Acme"}')


@pytest.mark.parametrize("schema, words", [
    ({"type": "object", "properties": {"n": {"type": "integer"}}}, "no field"),
    ({"type": "object", "properties": {"s": {"type": "string", "maxLength": 5}}}, "no field"),
    ({"anyOf": [{"type": "string"}, {"type": "integer"}]}, "no field"),
])
def test_a_schema_with_nothing_to_quote_is_refused_before_any_token(schema, words):
    with pytest.raises(SchemaError, match=words):
        quotes(schema)


def test_a_schema_quote_mode_cannot_write_is_one_error_not_a_crash():
    surrogate = {"type": "object", "properties": {"\ud800": {"type": "string"}}}
    with pytest.raises(SchemaError, match="not valid Unicode"):
        quotes(surrogate)
    array = {"type": "array", "items": {"type": "string"}, "properties": {"a": {"type": "string"}}}
    assert grammar.matches(quotes(array).constraint, '["Acme", "Ltd"]')  # its type decides, as the schema's does
    assert quote_pieces(["word " * 20_000])[0].endswith("word")  # a long run is cut at a word's end


def test_nothing_read_leaves_nothing_to_copy():
    with pytest.raises(SchemaError, match="read no text"):
        quotes(text="")
    nullable = {"type": "object", "properties": {"due": {"type": ["string", "null"]}}}
    assert grammar.matches(quotes(nullable, text="").constraint, '{"due": null}')


def test_the_check_after_the_answer_names_the_field_that_was_not_copied():
    q = quotes()
    q.check(answer(tags=["Ltd", "EUR"]))
    with pytest.raises(SchemaError, match=r"tags\.\[\] is 'Limited'"):
        q.check(answer(tags=["Ltd", "Limited"]))


WORDS = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=WORDS, start=st.integers(0, 40), length=st.integers(1, 40))
def test_what_the_grammar_lets_through_the_check_after_lets_through(text, start, length):
    """Any substring of what was read that the grammar accepts as a quoted value, the check after accepts (so a
    served model's answer is held to no less, and a local one is never failed for what it was allowed)."""
    schema = {"type": "object", "properties": {"v": {"type": "string"}}}
    pieces = quote_pieces([text])
    if not pieces:
        return
    constraint, paths = quote_constraint({"quote": True}, schema, pieces)
    value = text[start:start + length]
    document = json.dumps({"v": value}, ensure_ascii=False)
    if grammar.matches(constraint, document):
        assert check_quoted({"v": value}, paths, pieces) is None, (value, pieces)


def test_a_model_that_writes_what_was_not_read_fails_the_job_naming_the_field(tmp_path):
    """The scripted model holds to no grammar: the host's check after the answer is what stops it."""
    doc = tmp_path / "invoice.txt"
    doc.write_text(INVOICE, encoding="utf-8")
    infer = {"cmd": "infer", "prompt": "facts", "max_tokens": 60,
             "format": {"type": "json_schema", "name": "facts", "schema": SCHEMA, "quote": True}}
    commands = [{"cmd": "open", "path": str(doc)}, {"cmd": "slice", "handle": 0, "offset": 0, "len": 4096}, infer,
                {"cmd": "done", "result": {}}]
    invented = ScriptedBackend(answer(vendor="Acme Holdings"))
    envelope = tj.Job(wat.script_guest(commands), read=[tmp_path], backend=invented, runs_dir=tmp_path / "r").start().wait(60)
    assert envelope.error is not None and envelope.error.code == "schema_validation_failed"
    assert "vendor is 'Acme Holdings', which is not copied from what the job read" in envelope.error.message
    copied = ScriptedBackend(answer(vendor="Acme Tools GmbH"))
    assert tj.Job(wat.script_guest(commands), read=[tmp_path], backend=copied, runs_dir=tmp_path / "r").start().wait(60).ok


def test_a_quote_before_anything_was_read_fails_before_any_token(tmp_path):
    infer = {"cmd": "infer", "prompt": "facts", "max_tokens": 60,
             "format": {"type": "json_schema", "name": "facts", "schema": SCHEMA, "quote": True}}
    backend = ScriptedBackend(answer())
    envelope = tj.Job(wat.script_guest([infer, {"cmd": "done", "result": {}}]), backend=backend,
                      runs_dir=tmp_path).start().wait(60)
    assert envelope.error is not None and envelope.error.code == "schema_validation_failed"
    assert "read no text" in envelope.error.message
    assert backend.scripted.requests == []


@pytest.mark.slow  # the real model
def test_the_real_model_in_quote_mode_copies_each_string_from_where_it_stands(smollm, tmp_path):  # noqa: F811
    doc = tmp_path / "invoice.txt"
    doc.write_text(INVOICE, encoding="utf-8")
    schema = {"type": "object", "properties": {"vendor": {"type": "string"}, "customer": {"type": "string"}},
              "required": ["vendor", "customer"]}
    job = tj.Job(EXTRACT, input={"path": str(doc), "schema": schema, "quote": True, "max_tokens": 40},
                 read=[tmp_path], backend=smollm, runs_dir=tmp_path / "runs").start()
    envelope = job.wait(300)
    assert envelope.ok, envelope.error
    data = doc.read_bytes()
    for field in ("vendor", "customer"):
        value = envelope.result["facts"][field]
        sources = envelope.sources[f"facts.{field}"]
        assert value and sources and sources[0]["match"] == "exact", (field, value, sources)
        assert data[sources[0]["start"]:sources[0]["end"]].decode() == value  # exact offsets, by construction

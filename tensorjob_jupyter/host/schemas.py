"""A guest's JSON Schema, checked: that it is one, that it is small enough, and the validator its answer meets.

Every schema an ``infer`` carries (its ``format``, each tool's
``parameters``) is checked here before anything is built from it: that it is
a JSON Schema (``jsonschema``'s own meta-schema check) no larger than
``MAX_SCHEMA_BYTES`` (with ``abi``'s bounds on depth and values), whose
references the validator can follow to check an answer (it recurses once per
link: a ``$ref`` chain a few hundred long is refused). Whether the
grammar engine can *enforce* it is the engine's to say
(``inference/grammar.check``: it names the keyword it cannot).
``tool_call_schema`` writes the one schema a tool call is held to, each
tool's parameters placed whole under ``$defs`` with their local references
rebased, so every tool keeps its own ``$defs`` and recursion.
``validator_for`` gives the validator an answer is checked with, against
the schema exactly as the guest gave it.
"""

from __future__ import annotations

import json
import sys
import threading
from typing import Any

from tensorjob_jupyter.abi import TensorjobError
from tensorjob_jupyter.inference.memo import BytesLRU

#: The whole of one infer's ``format`` and ``tools`` as compact JSON (non-ASCII escaped): what memory a schema
#: costs (its checked spec, its validator, its grammar, the events that report it) grows with this.
MAX_SCHEMA_BYTES = 128 * 1024
#: Keywords whose values are data, not schemas: a ``$ref`` inside them is not a reference.
DATA_KEYWORDS = frozenset({"enum", "const", "default", "examples"})
#: Keywords whose values map names (of properties, of definitions) to schemas.
NAMED_SCHEMAS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})


class SchemaError(TensorjobError, ValueError):
    """A schema the grammar cannot enforce, or output that does not match: ``schema_validation_failed``."""


def _pointer(path: list) -> str:
    return "#" + "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in path)


def check_schema(value: Any, where: str) -> None:
    """``SchemaError`` unless ``value`` is a JSON Schema an answer can be checked against; ``where`` names it in
    the message."""
    _check_is_json_schema(value, where)
    _check_answers_can_be_checked(value, where)


def tool_call_schema(tools: list[tuple[str, Any]]) -> dict:
    """The schema of a call to one of ``tools`` (``(name, parameters)`` pairs): ``{"name": NAME,
    "arguments": ARGUMENTS}``, the arguments held to that tool's parameters. Each tool's parameters sit
    whole under ``$defs`` (``$id`` dropped, so its references resolve in the combined document), and every
    local reference in them (``#...``) is rebased onto where they now sit."""
    defs, calls = {}, []
    for i, (name, parameters) in enumerate(tools):
        key = f"tool-{i}"
        base = f"#/$defs/{key}"
        placed = _rebased(parameters, base)
        if isinstance(placed, dict):
            placed = {k: v for k, v in placed.items() if k not in ("$id", "$schema")}
        defs[key] = placed
        calls.append({"type": "object", "properties": {"name": {"const": name}, "arguments": {"$ref": base}},
                      "required": ["name", "arguments"], "additionalProperties": False})
    schema = calls[0] if len(calls) == 1 else {"anyOf": calls}
    return {**schema, "$defs": defs}


def _rebased(node: Any, base: str) -> Any:
    if isinstance(node, list):
        return [_rebased(v, base) for v in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "$ref" and isinstance(value, str) and value.startswith("#"):
            out[key] = base + value[1:]
        elif key in DATA_KEYWORDS:
            out[key] = value
        elif key in NAMED_SCHEMAS and isinstance(value, dict):
            out[key] = {name: _rebased(schema, base) for name, schema in value.items()}
        else:
            out[key] = _rebased(value, base)
    return out


_import_lock = threading.Lock()


def _jsonschema():
    """``jsonschema``, imported on first use -- without ``rfc3987_syntax``.

    jsonschema imports every format checker's library it finds when it is
    imported; ``rfc3987_syntax`` (the ``iri`` format, pulled in by
    jupyter-events' ``jsonschema[format-nongpl]``) builds a parser as it
    loads: about 1 s on an idle machine, over 10 s on a loaded one, on the
    thread of the first job that checks a schema, where no deadline reaches
    (a job ended that much past its time limit). Hidden from that first
    import, jsonschema simply has no ``iri`` checker, which nothing here
    uses; whoever imports ``rfc3987_syntax`` later gets it as usual.
    """
    with _import_lock:
        if "jsonschema" not in sys.modules and "rfc3987_syntax" not in sys.modules:
            sys.modules["rfc3987_syntax"] = None  # type: ignore[assignment]  # its import raises ImportError
            try:
                import jsonschema  # deferred: heavy, and only a structured infer needs it
            finally:
                if sys.modules.get("rfc3987_syntax", False) is None:
                    del sys.modules["rfc3987_syntax"]
    import jsonschema  # deferred: heavy, and only a structured infer needs it

    return jsonschema


def _check_is_json_schema(value: Any, where: str) -> None:
    jsonschema = _jsonschema()

    if not isinstance(value, (dict, bool)):
        raise SchemaError(f"{where} must be a JSON Schema (an object)")
    try:
        cls = jsonschema.validators.validator_for(value, default=jsonschema.Draft202012Validator)
        cls.check_schema(value)
    except jsonschema.exceptions.SchemaError as e:
        location = _pointer(list(e.path))
        raise SchemaError(f"{where} is not a valid JSON Schema at {location}: {e.message[:300]}") from None
    except jsonschema.exceptions.UnknownType as e:  # pragma: no cover - check_schema catches types
        raise SchemaError(f"{where}: {e}") from None
    except RecursionError:  # a pattern Python's re cannot compile (groups nested ~500 deep), or the schema itself
        raise SchemaError(f"{where} is nested too deeply to check (its structure or a pattern's groups)") from None


def _check_answers_can_be_checked(value: Any, where: str) -> None:
    """``SchemaError`` if the validator cannot follow ``value`` to check any answer.

    ``jsonschema`` checks by recursion, one level of Python's recursion limit (and several frames) per ``$ref``
    link, ``allOf`` entry or nested subschema it follows: a chain of references a few hundred long -- which fits
    well inside ``MAX_SCHEMA_BYTES``, and which the grammar engine enforces -- leaves it able to check no answer
    at all. Probed with ``null``: every ``$ref``, ``allOf``, ``anyOf`` and ``oneOf`` is followed whatever the
    value, so such a schema is refused here, before the model runs, and not after it has answered."""
    try:
        first_error(validator_for(value), None, deep_ok=False)
    except RecursionError:
        raise SchemaError(f"{where} nests too deeply for an answer to be checked against it: its chains of $ref, "
                          f"allOf, anyOf or oneOf pass the depth the validator can follow (a few hundred links)") \
            from None
    except _unresolvable() as e:
        raise SchemaError(f"{where} has a $ref that does not resolve (only references within the schema are "
                          f"followed): {' '.join(str(e).split())[:300]}") from None


def _unresolvable() -> type[Exception]:
    """The error ``jsonschema`` raises for a ``$ref`` it cannot follow (``referencing``, its dependency)."""
    _jsonschema()
    from referencing.exceptions import Unresolvable

    return Unresolvable


#: Bytes of memory a validator holds per byte of its schema's JSON: 1.5 for an enum of long strings, 33 for
#: small nested objects (measured with tracemalloc); validators are weighed at the high end.
VALIDATOR_BYTES_PER_SCHEMA_BYTE = 40
#: The bytes kept, between infers, of validators and of checked specs.
VALIDATOR_MEMO_BYTES = 16 * 1024 * 1024
SPEC_MEMO_BYTES = 8 * 1024 * 1024

VALIDATORS = BytesLRU(VALIDATOR_MEMO_BYTES)


def _make_validator(schema_json: str, strict_format: bool):
    jsonschema = _jsonschema()

    schema = json.loads(schema_json)
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema, format_checker=cls.FORMAT_CHECKER if strict_format else None)


def validator_for(schema: Any, strict_format: bool = True):
    """A validator for ``schema``, kept between infers in a memo bounded in bytes."""
    schema_json = json.dumps(schema, sort_keys=True)
    return VALIDATORS.get_or_make((schema_json, strict_format), lambda: _make_validator(schema_json, strict_format),
                                   lambda _v: sys.getsizeof(schema_json) * VALIDATOR_BYTES_PER_SCHEMA_BYTE)


def first_error(validator, value: Any, deep_ok: bool = True) -> str | None:
    """What is wrong with ``value`` (one line), or None. A value nested deeper than the validator can follow (a
    model's answer several hundred levels deep under a recursive schema) is an error too, saying so; with
    ``deep_ok`` False its ``RecursionError`` is raised instead."""
    jsonschema = _jsonschema()

    try:
        error = jsonschema.exceptions.best_match(validator.iter_errors(value))
    except RecursionError:
        if not deep_ok:
            raise
        return "it is nested too deeply to be checked against the schema (past Python's recursion limit) (at #)"
    except _unresolvable() as e:
        if not deep_ok:
            raise
        return f"a $ref on its way does not resolve: {' '.join(str(e).split())[:300]} (at #)"
    if error is None:
        return None
    return f"{error.message[:300]} (at {_pointer(list(error.absolute_path))})"


__all__ = [
    "MAX_SCHEMA_BYTES", "DATA_KEYWORDS", "NAMED_SCHEMAS", "SchemaError", "check_schema", "tool_call_schema",
    "VALIDATOR_BYTES_PER_SCHEMA_BYTE", "VALIDATOR_MEMO_BYTES", "SPEC_MEMO_BYTES", "VALIDATORS", "validator_for",
    "first_error"
]

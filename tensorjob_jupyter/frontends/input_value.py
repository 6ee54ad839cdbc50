"""The job input (``--input``) as people write it: JSON, a Python literal, or in a notebook a ``$name``.

A Python literal is read with ``ast.literal_eval``, which builds values and never runs code, and only on text of
at most ``MAX_LITERAL_CHARS``. Whatever the form, the value is then held to the rule guest output is held to
(``abi.checked_value``); a text that is none of these, or a string quoted once too often, is one error that
shows how to write it.

Design: docs/internals/frontends.md#input_valuepy
"""

from __future__ import annotations

import ast
import json
from typing import Any, Mapping

from tensorjob_jupyter.abi import checked_value, TensorjobError

#: Python literals longer than this are not parsed (``ast`` works in memory proportional to the text).
MAX_LITERAL_CHARS = 1 << 20

HOW = ("write the value as JSON or as a Python literal, quoted once for the line: --input '{\"path\": \"a.txt\"}', "
       "--input \"{'path': 'a.txt'}\", --input '\"some text\"'")


class InputError(TensorjobError, ValueError):
    """An ``--input`` that cannot be read: one line, naming the flag."""


def read_input(text: str, variables: Mapping[str, Any] | None) -> Any:
    """The job input ``text`` means; ``variables`` are the notebook's (None: a terminal, no ``$name``)."""
    text = text.strip()
    if text.startswith("$") and text[1:].isidentifier():
        return _checked(_variable(text[1:], variables))
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        value = _literal(text, f"{e.msg} at column {e.colno}")
    if _holds_a_container(value):
        shown = value if len(value) <= 40 else value[:40] + "..."
        raise InputError(f"--input is a string holding {shown!r}: it was quoted once too often; {HOW}")
    return _checked(value)


def _variable(name: str, variables: Mapping[str, Any] | None) -> Any:
    if variables is None:
        raise InputError(f"--input ${name}: variables can be named only in a notebook")
    if name not in variables:
        raise InputError(f"--input ${name}: no variable named {name!r} in the notebook")
    return variables[name]


def _literal(text: str, json_problem: str) -> Any:
    """A Python literal; ``InputError`` (saying how to write it) if ``text`` is not one."""
    if len(text) <= MAX_LITERAL_CHARS:
        try:
            return ast.literal_eval(text)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            pass
    raise InputError(f"--input is not valid JSON ({json_problem}), nor a Python literal or a $name: {HOW}")


def _holds_a_container(value: Any) -> bool:
    """A string whose text is itself a JSON or Python object or array."""
    if not isinstance(value, str):
        return False
    inner = value.strip()
    if (inner[:1], inner[-1:]) not in (("{", "}"), ("[", "]")) or len(inner) > MAX_LITERAL_CHARS:
        return False
    for parse in (json.loads, ast.literal_eval):
        try:
            return isinstance(parse(inner), (dict, list))
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            continue
    return False


def _checked(value: Any) -> Any:
    try:
        return checked_value(value, "--input")[0]
    except ValueError as e:
        raise InputError(str(e)) from None


__all__ = ["MAX_LITERAL_CHARS", "HOW", "InputError", "read_input"]

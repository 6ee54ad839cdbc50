"""Every Open Responses event the project produces, validated by the schema of record: the openai SDK.

``validate(event)`` checks one ``response.*`` or ``error`` event against the
SDK's model for its ``type`` (the SDK's ``ResponseStreamEvent`` union,
discriminated by ``type``); events of other types are the project's own.
``tests/conftest.py`` applies it to every event any test publishes.
"""

from __future__ import annotations

import typing

from openai.types.responses import ResponseStreamEvent


def _models() -> dict[str, type]:
    union = typing.get_args(ResponseStreamEvent)[0]
    out = {}
    for model in typing.get_args(union):
        for literal in typing.get_args(model.model_fields["type"].annotation):
            out[literal] = model
    return out


MODELS = _models()


def is_open_responses(event_type: str) -> bool:
    return event_type in MODELS


def validate(event: dict) -> None:
    """Raise pydantic's ``ValidationError`` if an Open Responses event is not of the spec's shape."""
    model = MODELS.get(event["type"])
    if model is not None:
        model.model_validate(event)

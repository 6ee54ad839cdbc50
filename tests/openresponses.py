"""Every Open Responses event the project produces, validated by the schema of record: the openai SDK.

``validate(event)`` checks one ``response.*`` or ``error`` event against the
SDK's model for its ``type`` (the SDK's ``ResponseStreamEvent`` union,
discriminated by ``type``); events of other types are the project's own.
``tests/conftest.py`` applies it to every event any test publishes.
"""

from __future__ import annotations

import functools
import typing


@functools.cache
def models() -> dict[str, type]:
    """The SDK's model for each event type, built on first use: importing the SDK takes most of a second,
    which the pytest process that only hands tests to workers never needs to spend."""
    from openai.types.responses import ResponseStreamEvent

    union = typing.get_args(ResponseStreamEvent)[0]
    out = {}
    for model in typing.get_args(union):
        for literal in typing.get_args(model.model_fields["type"].annotation):
            out[literal] = model
    return out


def is_open_responses(event_type: str) -> bool:
    return event_type.startswith("response.") or event_type == "error"


def validate(event: dict) -> None:
    """Raise pydantic's ``ValidationError`` if an Open Responses event is not of the spec's shape."""
    model = models().get(event["type"])
    if model is not None:
        model.model_validate(event)

"""What a running job is doing now, in a few fields: a live view's glance at a map's items in flight.

``GlimpseTracker`` sees every event its stream publishes (``EventStream.publish`` calls ``see`` under the stream's
lock) and keeps only constants' worth: the phase (starting, reading its prompt, generating, running its guest),
the infers begun, the tokens streamed by the current one and the tail of its text, as one frozen ``Glimpse``
replaced whole, never changed: any thread may read it, so a view polling many items at its own rate costs the
jobs one small object an event.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tensorjob_jupyter.abi import event_types

#: The phases, in the words a view shows.
STARTING, READING, GENERATING, GUEST = "starting", "reading its prompt", "generating", "running its guest"
#: Characters of the current infer's text a glimpse keeps (its end).
TAIL_CHARS = 160

#: What a model streams: an answer's text, or a function call's arguments.
_STREAMED = frozenset({event_types.RESPONSE_OUTPUT_TEXT_DELTA, event_types.RESPONSE_FUNCTION_CALL_ARGUMENTS_DELTA})
_ENDED = frozenset({event_types.RESPONSE_COMPLETED, event_types.RESPONSE_INCOMPLETE, event_types.RESPONSE_FAILED})


@dataclass(frozen=True)
class Glimpse:
    """A running job at one moment: its ``phase``, the ``infers`` it began, the ``tokens`` the current (or last)
    infer streamed (a delta's token records where it has them, else one a delta), and the last ``TAIL_CHARS``
    characters of that infer's text or function call's arguments (``tail``)."""

    phase: str = STARTING
    infers: int = 0
    tokens: int = 0
    tail: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"phase": self.phase, "infers": self.infers, "tokens": self.tokens, "tail": self.tail}


class GlimpseTracker:
    """Keeps the latest ``Glimpse`` of one stream as its events are published (see the module doc)."""

    def __init__(self) -> None:
        self._now = Glimpse()

    def see(self, kind: str, fields: dict[str, Any]) -> None:
        """Take in one published event (its ``type`` and fields)."""
        now = self._now
        if kind in _STREAMED:
            delta, records = fields.get("delta"), fields.get("logprobs")
            tail = (now.tail + delta)[-TAIL_CHARS:] if isinstance(delta, str) else now.tail
            tokens = len(records) if isinstance(records, list) and records else 1  # a delta's tokens, where said
            now = Glimpse(GENERATING, now.infers, now.tokens + tokens, tail)
        elif kind == event_types.RESPONSE_CREATED:
            now = Glimpse(READING, now.infers + 1, 0, "")
        elif kind in _ENDED:
            now = Glimpse(GUEST, now.infers, now.tokens, now.tail)
        else:
            return
        self._now = now

    def glimpse(self) -> Glimpse:
        return self._now


__all__ = ["STARTING", "READING", "GENERATING", "GUEST", "TAIL_CHARS", "Glimpse", "GlimpseTracker"]

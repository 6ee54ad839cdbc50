"""Token bytes in, whole characters out: what a listener of a generation may see.

A model's tokens are byte strings, and one character can span several of
them (an emoji is often three or four tokens). A listener -- the job's event
stream, a guest's ``cf_on_token`` -- must never see half a character, and it
must never see text that a stop string later takes back. So text passes
through a ``TextStream`` between the decoder and the listener: incomplete
UTF-8 sequences and any tail that could begin a stop string are held back
until they are complete or ruled out, and the result's text is exactly the
concatenation of what was delivered.

This is pure Python with no llama.cpp in it: any engine that produces token
bytes can use it, and it is tested without a model.
"""

from __future__ import annotations

import codecs
from typing import Iterable


class TextStream:
    """Token bytes in, deliverable text out: whole UTF-8 characters, stop strings cut.

    ``push(data)`` returns ``(text, stopped)``: the text that may be delivered
    now, and whether a stop string was found (the text then ends just before
    it, and nothing after it is ever delivered). Incomplete UTF-8 sequences
    and any tail that could begin a stop string are held back; ``flush()``
    releases what is held when generation ends for another reason (the bytes
    of a character the generation never finished are dropped, not shown
    broken). Invalid bytes (not merely incomplete ones) become U+FFFD.
    """

    def __init__(self, stops: Iterable[str] = ()):
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._held = ""
        self.stops = tuple(s for s in stops if s)

    def push(self, data: bytes) -> tuple[str, bool]:
        text = self._held + self._decoder.decode(data)
        if not self.stops:
            self._held = ""
            return text, False
        cut = min((i for i in (text.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self._held = ""
            return text[:cut], True
        keep = self._stop_prefix_len(text)
        self._held = text[len(text) - keep:] if keep else ""
        return text[:len(text) - keep], False

    def _stop_prefix_len(self, text: str) -> int:
        best = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:k]):
                    best = k
                    break
        return best

    def flush(self) -> str:
        """The held text, when generation ends; an unfinished character is dropped."""
        text = self._held
        self._held = ""
        self._decoder.reset()
        if self.stops:
            cut = min((i for i in (text.find(s) for s in self.stops) if i >= 0), default=-1)
            if cut >= 0:
                return text[:cut]
        return text


__all__ = ["TextStream"]

"""A deterministic engine for tests and demos: replies from a script.

``ScriptedEngine`` answers each prompt with a fixed (or computed) text, streamed as word tokens,
honours ``max_tokens`` and the stop verdict the way a real decoder does, and can pause, fail or
give each word a logprob, so every path of the host can be tested without a model. It ships in the
installed package because it is public API: guest authors' tests import ``ScriptedBackend``, and a
Dask map pickles it by module path for its workers. It is small, pure Python, and imports no model
library.

Design: docs/internals/inference.md#scriptedpy
"""

from __future__ import annotations

import hashlib
import math
import struct
import time
import zlib
from typing import Callable, Sequence, Union

from tensorjob_jupyter.inference.base import (
    FINISH_LENGTH, FINISH_STOP, GenerateRequest, GenerateResult, GenerateUsage, ModelError, TokenCallback,
)
from tensorjob_jupyter.inference.logprobs import (
    MAX_TOP_LOGPROBS, TokenLogprob, TokenText, TopLogprob, clamp_logprob,
)
from tensorjob_jupyter.inference.worker import InferenceWorker

Reply = str | Callable[[str], str]
#: A scripted word's logprob: the same for every word, one a word in order (the last for any after), or a
#: function of the word's index and its piece.
ScriptedLogprobs = Union[float, Sequence[float], Callable[[int, str], float]]


class ScriptedEngine:
    def __init__(self, reply: Reply | Sequence[str] = "a stub summary", *, token_delay_s: float = 0.0,
                 fail: str | None = None, model_name: str = "scripted", embedding_dim: int = 8,
                 logprobs: ScriptedLogprobs | None = None):
        self.reply = reply
        self.logprobs = logprobs
        self.token_delay_s = token_delay_s
        self.fail = fail
        self.model_name = model_name
        self.embedding_dim = embedding_dim
        self.prompts: list[str] = []
        self.requests: list[GenerateRequest] = []  # each request as it came, for tests of what was asked

    def _text_for(self, prompt: str) -> str:
        if callable(self.reply):
            return self.reply(prompt)
        if isinstance(self.reply, str):
            return self.reply
        replies = list(self.reply)
        return replies[min(len(self.prompts) - 1, len(replies) - 1)] if replies else ""

    def generate(self, request: GenerateRequest, on_token: TokenCallback) -> GenerateResult:
        self.prompts.append(request.prompt)
        self.requests.append(request)
        if self.fail:
            raise ModelError(self.fail)
        words = self._text_for(request.prompt).split()
        started = time.perf_counter()
        first = None
        pieces: list[str] = []
        records: list[TokenLogprob] | None = [] if self.logprobs is not None and request.logprobs else None
        finish = FINISH_STOP
        for i, word in enumerate(words):
            if i >= request.max_tokens:
                finish = FINISH_LENGTH
                break
            if self.token_delay_s:
                time.sleep(self.token_delay_s)
            piece = word if i == 0 else " " + word
            if records is not None:
                record = self._record(i, piece, request.top_logprobs)
                records.append(record)
                piece = TokenText(piece, (record,))
            pieces.append(piece)
            first = first if first is not None else time.perf_counter() - started
            if not on_token(piece):
                break
        elapsed = time.perf_counter() - started
        usage = GenerateUsage(prompt_tokens=len(request.prompt.split()), completion_tokens=len(pieces),
                              time_to_first_token_s=first,
                              tokens_per_second=(len(pieces) / elapsed) if elapsed > 0 and pieces else None)
        return GenerateResult("".join(pieces), finish, usage, records)

    def _record(self, index: int, piece: str, top: int) -> TokenLogprob:
        given = self.logprobs
        assert given is not None, "generate keeps records only for a backend given logprobs"
        if callable(given):
            value = given(index, piece)
        elif isinstance(given, (int, float)):
            value = given
        else:
            values = list(given)
            value = values[min(index, len(values) - 1)] if values else 0.0
        logprob = clamp_logprob(value)
        rest = -math.expm1(logprob)  # the probability no scripted word took
        runner = clamp_logprob(math.log(rest)) if rest > 0 else None
        data = piece.encode("utf-8", "replace")
        alternatives = [TopLogprob(data, logprob)]
        if runner is not None:
            alternatives.append(TopLogprob(b"<other>", runner))
            alternatives.sort(key=lambda t: -t.logprob)
        n = min(max(top, 0), MAX_TOP_LOGPROBS)
        return TokenLogprob(data, logprob, runner, tuple(alternatives[:n]))

    def prompt_tokens(self, request: GenerateRequest) -> list[int]:
        """The prompt as this engine counts it (``usage.prompt_tokens``): one token a word, each a number
        made from the word."""
        return [zlib.crc32(word.encode("utf-8")) for word in request.prompt.split()]

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        if self.fail:
            raise ModelError(self.fail)
        out = []
        for text in texts:
            digest = hashlib.sha256(text.encode("utf-8")).digest()
            raw = [v / 2**31 - 1.0 for v in struct.unpack(f"<{self.embedding_dim}I",
                                                          (digest * 4)[: 4 * self.embedding_dim])]
            norm = math.sqrt(sum(x * x for x in raw)) or 1.0
            out.append([x / norm for x in raw])
        return out


class ScriptedBackend(InferenceWorker):
    """An ``InferenceWorker`` serving a ``ScriptedEngine``."""

    def __init__(self, reply: Reply | Sequence[str] = "a stub summary", **kwargs):
        queue_size = kwargs.pop("queue_size", 64)
        self.scripted = ScriptedEngine(reply, **kwargs)
        super().__init__(self.scripted, queue_size=queue_size, name="tensorjob-scripted")


__all__ = ["Reply", "ScriptedEngine", "ScriptedBackend"]

"""Each generated token's log-probability: what the sampler's distribution gave the token it chose.

``token_logprob`` reads the logits row the sampler has just drawn from: after the repetition
penalty, the grammar's mask and the temperature, not after top-k, top-p or min-p, so the numbers
stay comparable across settings. ``TokenText`` is streamed text that carries its tokens' records,
so a listener that wants only text still sees a ``str``. The OpenAI wire shapes live here too, both
ways (``read_openai_logprobs``), so ``served.py`` and ``tensorjob serve`` share one shape.

What a server sends costs at most what was asked: ``read_openai_logprobs`` refuses more records than
``most`` before it reads any (the count of a list is known before its items are looked at), and reads at
most ``read`` alternatives of a record, dropping the rest unread; each record's bytes are at most
``MAX_TOKEN_BYTES``. The text those records came in is bounded before it is parsed, in ``served.py``.

Design: docs/internals/inference.md#logprobspy
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from tensorjob_jupyter.abi import MAX_TOP_LOGPROBS
from tensorjob_jupyter.inference.penalties import apply_repeat_penalty

#: The most bytes of one token's text a record keeps (a vocabulary's longest tokens are a few dozen).
MAX_TOKEN_BYTES = 256
#: The lowest logprob a record writes: lower values (and -inf, a token the distribution gave nothing)
#: are written as this, so every record is a finite JSON number.
MIN_LOGPROB = -1.0e4


def clamp_logprob(value: float) -> float:
    """A logprob as a record holds it: finite, at most 0 (rounding can give +1e-7 for a sure token), never
    ``-0.0``, at least ``MIN_LOGPROB``. NaN is not a logprob: ``ValueError``."""
    value = float(value)
    if math.isnan(value):
        raise ValueError("a logprob is not NaN")
    if value >= 0.0:
        return 0.0
    return max(value, MIN_LOGPROB)


def token_text(data: bytes) -> str:
    """A token's bytes as text: a token can hold part of a character, which shows as U+FFFD (the bytes are
    kept beside it)."""
    return data.decode("utf-8", "replace")


@dataclass(frozen=True, slots=True)
class TopLogprob:
    """One of the most likely tokens at a position."""

    token: bytes
    logprob: float

    def to_json(self) -> dict:
        return {"token": token_text(self.token), "logprob": self.logprob, "bytes": list(self.token)}


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One generated token: its bytes, its logprob, the most likely other token's logprob (``runner_up``;
    None where the distribution allowed no other token) and the ``top`` alternatives (best first, the chosen
    token among them when it is one of the best; empty unless asked)."""

    token: bytes
    logprob: float
    runner_up: float | None = None
    top: tuple[TopLogprob, ...] = ()

    def to_json(self) -> dict:
        """The Open Responses shape (seed 002: ``token``, ``logprob``, ``bytes``, ``top_logprobs``), and this
        project's ``runner_up_logprob``."""
        return {"token": token_text(self.token), "logprob": self.logprob, "bytes": list(self.token),
                "top_logprobs": [t.to_json() for t in self.top], "runner_up_logprob": self.runner_up}

    @classmethod
    def from_json(cls, value: Any, read: int = MAX_TOP_LOGPROBS) -> "TokenLogprob":
        """A record read back (a transcript, a server's answer): ``ValueError`` unless it is one as written --
        ``bytes`` (or, without them, ``token``'s UTF-8) at most ``MAX_TOKEN_BYTES``, finite logprobs at most
        0, at most ``MAX_TOP_LOGPROBS`` alternatives, of which the first ``read`` are read and kept (the rest
        dropped unread)."""
        if not isinstance(value, dict):
            raise ValueError("a token's logprob is not an object")
        data = _token_bytes(value)
        runner = value.get("runner_up_logprob")
        top = value.get("top_logprobs")
        if top is None:
            top = []
        if not isinstance(top, list) or len(top) > MAX_TOP_LOGPROBS:
            raise ValueError(f"top_logprobs is not a list of at most {MAX_TOP_LOGPROBS}")
        return cls(data, _read_logprob(value.get("logprob")),
                   None if runner is None else _read_logprob(runner),
                   tuple(TopLogprob(_token_bytes(t), _read_logprob(t.get("logprob") if isinstance(t, dict) else None))
                         for t in top[:max(0, int(read))]))


def _read_logprob(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value > 0:
        raise ValueError("a logprob is a finite number at most 0")
    return clamp_logprob(value)


def _token_bytes(value: Any) -> bytes:
    if not isinstance(value, dict):
        raise ValueError("a token is not an object")
    raw = value.get("bytes")
    if raw is not None:
        if not isinstance(raw, list) or len(raw) > MAX_TOKEN_BYTES or not all(
                type(b) is int and 0 <= b <= 255 for b in raw):
            raise ValueError(f"a token's bytes are not a list of at most {MAX_TOKEN_BYTES} bytes")
        return bytes(raw)
    text = value.get("token")
    if not isinstance(text, str):
        raise ValueError("a token has neither bytes nor text")
    data = text.encode("utf-8", "replace")  # a lone surrogate (JSON can spell one) becomes "?"
    if len(data) > MAX_TOKEN_BYTES:
        raise ValueError(f"a token is longer than {MAX_TOKEN_BYTES} bytes")
    return data


class TokenText(str):
    """Text delivered to a token callback, with the ``logprobs`` of the tokens that made it (in order; empty
    where the engine gives none). Equal to, and usable as, the plain ``str``."""

    logprobs: tuple[TokenLogprob, ...]

    def __new__(cls, text: str, logprobs: Iterable[TokenLogprob] = ()) -> "TokenText":
        self = super().__new__(cls, text)
        self.logprobs = tuple(logprobs)
        return self

    def __reduce__(self):
        return TokenText, (str(self), self.logprobs)


def openai_logprobs(records: Sequence[TokenLogprob], *, chat: bool, offset: int = 0) -> dict:
    """``records`` in a choice's ``logprobs`` field: ``{"content": [...]}`` for a chat answer, the legacy
    completions object for a raw one (``text_offset``: each token's character offset in the answer, from
    ``offset``, the characters of the answer before these tokens)."""
    if chat:
        return {"content": [r.to_json() for r in records]}
    tokens, offsets = [], []
    for r in records:
        text = token_text(r.token)
        tokens.append(text)
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": [r.logprob for r in records],
            "top_logprobs": [{token_text(t.token): t.logprob for t in r.top} for r in records],
            "text_offset": offsets}


def read_openai_logprobs(value: Any, top: int = 0, *, most: int | None = None,
                         read: int = MAX_TOP_LOGPROBS) -> list[TokenLogprob]:
    """The records in a choice's ``logprobs`` as a server sent it (either shape of ``openai_logprobs``),
    each with at most ``top`` alternatives; a record's ``runner_up`` is the server's own
    (``runner_up_logprob``) or the best alternative that is not the chosen token. ``ValueError`` unless every
    record is one (``TokenLogprob.from_json``'s bounds; a legacy object's lists of one length), and when there
    are more than ``most`` records (None: any number), before any is read. Only the best ``read``
    alternatives of a record are read (what was asked: the rest are dropped unread)."""
    if not isinstance(value, dict):
        raise ValueError("logprobs is not an object")
    most = None if most is None else max(0, int(most))
    if "content" in value:
        content = value["content"]
        if content is None:
            return []
        if not isinstance(content, list):
            raise ValueError("logprobs.content is not a list")
        if most is not None and len(content) > most:
            raise ValueError(f"logprobs.content holds more than {most} records")
        records = [TokenLogprob.from_json(item, read) for item in content]
    else:
        tokens, logprobs, tops = value.get("tokens"), value.get("token_logprobs"), value.get("top_logprobs")
        if not isinstance(tokens, list) or not isinstance(logprobs, list) or len(tokens) != len(logprobs):
            raise ValueError("logprobs' tokens and token_logprobs are not lists of one length")
        if most is not None and len(tokens) > most:
            raise ValueError(f"logprobs holds more than {most} tokens")
        if tops is None:
            tops = [None] * len(tokens)
        if not isinstance(tops, list) or len(tops) != len(tokens):
            raise ValueError("logprobs' top_logprobs is not a list as long as its tokens")
        records = []
        for token, logprob, alternatives in zip(tokens, logprobs, tops):
            if alternatives is None:
                alternatives = {}
            if not isinstance(alternatives, dict) or len(alternatives) > MAX_TOP_LOGPROBS:
                raise ValueError(f"a token's top_logprobs is not a map of at most {MAX_TOP_LOGPROBS}")
            records.append(TokenLogprob.from_json({
                "token": token, "logprob": logprob,
                "top_logprobs": sorted(({"token": t, "logprob": lp} for t, lp in alternatives.items()),
                                       key=lambda t: -t["logprob"] if isinstance(t["logprob"], (int, float)) else 0)},
                read))
    return [_with_runner_up(r, top) for r in records]


def _with_runner_up(record: TokenLogprob, top: int) -> TokenLogprob:
    runner = record.runner_up
    if runner is None:
        runner = max((t.logprob for t in record.top if t.token != record.token), default=None)
    return TokenLogprob(record.token, record.logprob, runner, record.top[:max(0, int(top))])


def logprobs_of(piece: str) -> tuple[TokenLogprob, ...]:
    """The token records a piece carries (none for a plain ``str``)."""
    return getattr(piece, "logprobs", ())


def penalised(logits: np.ndarray, recent: Sequence[int], penalty: float) -> np.ndarray:
    """``logits`` after llama.cpp's repeat penalty over the ``recent`` tokens (its window): each token in it,
    once however often, has a positive logit divided by ``penalty`` and any other multiplied by it. A copy."""
    out = np.array(logits, dtype=np.float32, copy=True)
    if recent:
        apply_repeat_penalty(out, recent, penalty)
    return out


def token_logprob(logits: np.ndarray, token: int, piece: Callable[[int], bytes], *, temperature: float = 0.0,
                  penalty: float = 1.0, recent: Sequence[int] = (), allowed: np.ndarray | None = None,
                  top: int = 0) -> TokenLogprob:
    """The record of ``token``, drawn from ``logits`` (one row, one float per vocabulary entry).

    ``penalty`` and ``recent``: the repeat penalty and its window (the tokens the penalties sampler has
    seen, last ``PENALTY_LAST_N``); ``allowed``: the grammar's mask for this token (a boolean per vocabulary
    entry; None: every token); ``temperature``: 0 for greedy (read at 1); ``top``: how many alternatives
    to list (at most ``MAX_TOP_LOGPROBS``); ``piece``: a token's bytes."""
    # the row is read, not written: one array made at most (the mask's or the temperature's), one pass a sum
    z = penalised(logits, recent, penalty) if recent and penalty != 1.0 else np.asarray(logits, dtype=np.float32)
    if allowed is not None:
        z = np.where(allowed, z, np.float32(-np.inf))
    if temperature > 0.0 and temperature != 1.0:
        z = z / np.float32(temperature)
    chosen = float(z[token])
    # the best other token: the larger of the bests on either side (no copy with the token left out)
    other = max((float(part.max()) for part in (z[:token], z[token + 1:]) if part.size), default=-math.inf)
    best = math.nan if math.isnan(other) or math.isnan(chosen) else max(chosen, other)  # z.max(), NaN as it gives
    if not math.isfinite(best):  # nothing allowed: the sampler could not have drawn it
        return TokenLogprob(piece(token)[:MAX_TOKEN_BYTES], MIN_LOGPROB)
    shifted = np.subtract(z, np.float32(best))
    total = best + math.log(float(np.exp(shifted, out=shifted).sum(dtype=np.float64)))
    alternatives: tuple[TopLogprob, ...] = ()
    n = min(max(int(top), 0), MAX_TOP_LOGPROBS, z.size)
    if n:
        ids = np.argpartition(z, -n)[-n:]
        ids = ids[np.argsort(-z[ids], kind="stable")]
        alternatives = tuple(TopLogprob(piece(int(i))[:MAX_TOKEN_BYTES], clamp_logprob(float(z[i]) - total))
                             for i in ids if math.isfinite(float(z[i])))
    return TokenLogprob(piece(token)[:MAX_TOKEN_BYTES],
                        clamp_logprob(chosen - total) if math.isfinite(chosen) else MIN_LOGPROB,
                        clamp_logprob(other - total) if math.isfinite(other) else None, alternatives)


__all__ = [
    "MAX_TOP_LOGPROBS", "MAX_TOKEN_BYTES", "MIN_LOGPROB", "clamp_logprob", "token_text", "TopLogprob", "TokenLogprob",
    "TokenText", "logprobs_of", "openai_logprobs", "read_openai_logprobs", "penalised", "token_logprob"
]

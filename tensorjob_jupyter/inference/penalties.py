"""The repetition penalty, applied to the logits of the few tokens it touches.

llama.cpp's penalties sampler looks every vocabulary entry up in its window's token counts, on every
token: a pass over 262,144 entries for Gemma's vocabulary to change at most ``PENALTY_LAST_N`` logits.
Here the window's distinct tokens are gathered, penalised with llama.cpp's formula in float32 (a
positive logit divided by the penalty, any other multiplied by it, once however often the token
recurs) and written back, before the rest of the chain sees the row: the same floats bit for bit, so
the same tokens. ``logprobs.penalised`` uses the same formula for the records it writes.

Design: docs/internals/inference.md#penaltiespy
"""

from __future__ import annotations

import collections
from typing import Iterable, Sequence

import numpy as np

#: The tokens the penalty looks back over, the prompt's included (llama.cpp's ``penalty_last_n``).
PENALTY_LAST_N = 64


def apply_repeat_penalty(logits: np.ndarray, recent: Iterable[int], penalty: float) -> None:
    """Penalise ``logits`` (a float32 row over the vocabulary) in place, as llama.cpp's penalties sampler
    does with this repeat penalty and no frequency or presence penalty: each distinct token of ``recent``
    (ids outside the row are ignored) has a positive logit divided by ``penalty`` and any other multiplied
    by it, in float32."""
    if penalty == 1.0:
        return
    ids = np.unique(np.fromiter(recent, dtype=np.int64))
    ids = ids[(ids >= 0) & (ids < logits.size)]
    if not ids.size:
        return
    values = logits[ids]
    factor = np.float32(penalty)
    logits[ids] = np.where(values <= 0, values * factor, values / factor)


class RepeatPenalty:
    """One request's repeat penalty: its window (the last ``PENALTY_LAST_N`` tokens of the prompt, then of
    the prompt and the tokens taken) and the penalty. ``apply`` penalises a row in place before the chain
    chooses from it; ``accept`` takes the chosen token into the window, as the chain's sampler would."""

    def __init__(self, penalty: float, prompt: Sequence[int], last_n: int = PENALTY_LAST_N):
        self.penalty = float(penalty)
        self.window: collections.deque[int] = collections.deque(prompt[-last_n:] if last_n else (), maxlen=last_n)

    def apply(self, logits: np.ndarray) -> None:
        apply_repeat_penalty(logits, self.window, self.penalty)

    def accept(self, token: int) -> None:
        self.window.append(int(token))


class PenalisedChain:
    """A llama.cpp sampler chain (without a penalties sampler) with the repeat penalty applied to the
    context's logits row first. Samples as ``LlamaSampler.sample`` does; ``close`` closes the chain."""

    def __init__(self, chain, penalty: RepeatPenalty, logits_row):
        self.chain = chain
        self.penalty = penalty
        self._row = logits_row  # (ctx, i) -> that output's logits as a writable float32 array

    def sample(self, ctx, i: int) -> int:
        self.penalty.apply(self._row(ctx, i))
        token = self.chain.sample(ctx, i)
        self.penalty.accept(token)
        return token

    def close(self) -> None:
        self.chain.close()


__all__ = ["PENALTY_LAST_N", "apply_repeat_penalty", "RepeatPenalty", "PenalisedChain"]

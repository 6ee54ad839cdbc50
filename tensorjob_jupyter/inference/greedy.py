"""Greedy decoding's choice made on the logits row itself, not on llama.cpp's candidate array.

``llama_sampler_sample`` copies a row into an array of (id, logit, p) candidates -- 3 MiB a token for
Gemma's 262,144-token vocabulary -- before its greedy sampler scans it for the first of the largest
logits. ``greedy_token`` is that scan on the row (numpy's ``argmax`` also takes the first of equal
maxima), about a tenth of the time; ``GreedySampler`` is a free greedy request's sampler, the repeat
penalty applied to the row first (``penalties``). The grammar sampler chooses greedily the same way.

Design: docs/internals/inference.md#greedypy
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from tensorjob_jupyter.inference.penalties import RepeatPenalty


def greedy_token(logits: np.ndarray) -> int:
    """The token llama.cpp's greedy sampler chooses from ``logits``: the first of the largest."""
    return int(np.argmax(logits))


class GreedySampler:
    """A greedy request's sampler without a llama.cpp chain: output ``i``'s row (``logits_row(ctx, i)``,
    the context's own buffer), the repeat penalty applied in place where there is one, its first largest
    logit. Samples as ``LlamaSampler.sample`` does."""

    def __init__(self, penalty: RepeatPenalty | None, logits_row: Callable[..., np.ndarray]):
        self.penalty = penalty
        self._row = logits_row

    def sample(self, ctx, i: int) -> int:
        row = self._row(ctx, i)
        if self.penalty is not None:
            self.penalty.apply(row)
        token = greedy_token(row)
        if self.penalty is not None:
            self.penalty.accept(token)
        return token

    def close(self) -> None:
        pass


__all__ = ["greedy_token", "GreedySampler"]

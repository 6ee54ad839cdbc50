"""The sampler each request of the llama.cpp engine decodes under.

llama.cpp's sampler chain for the request's settings (top-k, top-p, min-p, temperature, a seeded draw), behind
the repeat penalty (``penalties``: applied to the window's logits alone, not by llama.cpp's sampler over the
whole vocabulary) and, for a constraint, its grammar (``grammar.GrammarSampler``); greedy without a
constraint is the row's argmax (``greedy``). Every kind samples and closes as the chain does, so the decode
step never asks which it holds. Apart from the engine because it only turns settings into an object.

Design: docs/internals/inference.md#what-the-engine-guarantees
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from tensorjob_jupyter.inference.base import GenerateRequest
from tensorjob_jupyter.inference.grammar import GrammarSampler
from tensorjob_jupyter.inference.greedy import GreedySampler
from tensorjob_jupyter.inference.penalties import PENALTY_LAST_N, PenalisedChain, RepeatPenalty

#: Output ``i``'s logits of a context, in the context's own buffer: ``logits_row(ctx, i)``.
LogitsRow = Callable[[Any, int], np.ndarray]


def request_sampler(engine: Any, internals: Any, request: GenerateRequest, prompt: list[int],
                    abandoned: Callable[[], bool] | None, logits_row: LogitsRow):
    """``request``'s sampler, for a prompt of tokens ``prompt`` (the penalty window includes it); ``engine``: the
    model a grammar is compiled for (``grammars()``); ``internals``: llama-cpp-python's ``_internals``."""
    s = request.sampler
    sampler = internals.LlamaSampler()
    if s.temperature <= 0.0:
        sampler.add_greedy()
    else:
        if s.top_k and s.top_k > 0:
            sampler.add_top_k(int(s.top_k))
        if 0.0 < s.top_p < 1.0:
            sampler.add_top_p(float(s.top_p), 1)
        if s.min_p and s.min_p > 0.0:
            sampler.add_min_p(float(s.min_p), 1)
        sampler.add_temp(float(s.temperature))
        sampler.add_dist(int(s.seed) & 0xFFFFFFFF)
    penalty = None
    if s.repeat_penalty and s.repeat_penalty != 1.0:  # the penalty window includes the prompt
        penalty = RepeatPenalty(float(s.repeat_penalty), prompt, PENALTY_LAST_N)
    if request.constraint is not None:
        try:
            return GrammarSampler(engine, sampler, request.constraint, greedy=s.temperature <= 0.0,
                                  abandoned=abandoned, keep_mask=request.logprobs, penalty=penalty)
        except BaseException:
            sampler.close()
            raise
    if s.temperature <= 0.0:  # the row's first largest logit, without llama.cpp's candidate array
        sampler.close()
        return GreedySampler(penalty, logits_row)
    return sampler if penalty is None else PenalisedChain(sampler, penalty, logits_row)


__all__ = ["LogitsRow", "request_sampler"]

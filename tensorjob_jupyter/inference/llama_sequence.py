"""What the llama.cpp engine decodes: slots, and the generations running in them.

A ``Slot`` is one llama.cpp sequence, a KV stream of its own that outlives the requests it serves (the prefix
cache, ``llama_cache``); a ``Generation`` is one request being generated in a slot. They are plain records,
apart from the code that acts on them, so that admission (``llama_scheduler``), batch building
(``llama_batch``), the cache and the engine's decode step (``llama``) each read the same two shapes.

Design: docs/internals/inference.md#the-engines-rooms
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from tensorjob_jupyter.inference.base import Pending
from tensorjob_jupyter.inference.grammar import GrammarSampler
from tensorjob_jupyter.inference.greedy import GreedySampler
from tensorjob_jupyter.inference.logprobs import TokenLogprob
from tensorjob_jupyter.inference.penalties import PenalisedChain
from tensorjob_jupyter.inference.text_stream import TextStream

if TYPE_CHECKING:  # llama-cpp-python is imported when an engine is made (library.llama_cpp_library)
    from llama_cpp._internals import LlamaSampler

#: A LoRA selection, normalised: (adapter name, scale) pairs, none of scale 0.
LoraKey = tuple[tuple[str, float], ...]


@dataclass
class Slot:
    """One llama.cpp sequence: the tokens whose KV it holds, and under which LoRA."""

    seq_id: int
    tokens: list[int] = field(default_factory=list)  # whose KV it holds now
    prompt: list[int] = field(default_factory=list)  # while busy: the prompt it reads (its KV, but for the last token)
    lora: LoraKey = ()
    last_used: float = 0.0
    busy: bool = False


@dataclass(eq=False)  # each is itself: compared and hashed by identity
class Generation:
    """One generation in progress."""

    pending: Pending
    slot: Slot
    sampler: LlamaSampler | PenalisedChain | GreedySampler | GrammarSampler | None  # None once released
    stream: TextStream
    prompt_tokens: int
    cached_tokens: int
    limit: int  # completion tokens allowed (max_tokens, or what the context leaves)
    started: float
    parts: list[str] = field(default_factory=list)
    n_out: int = 0
    next_token: int = -1
    held: int | None = None  # a sampled token its listener was not ready for: delivered before it decodes again
    first_at: float | None = None
    last_at: float | None = None
    batch: int = 1  # the most sequences decoded in one step with this one (itself included)
    logprobs: list[TokenLogprob] = field(default_factory=list)  # records of tokens sampled, not yet delivered
    delivered_logprobs: list[TokenLogprob] = field(default_factory=list)
    choosing: Future | None = None  # its grammar's choice of the next token, on a mask thread
    windows: int = 0  # the machine's windows (``llama_machine``) that ended while it ran, and how many were busy
    busy_windows: int = 0
    logits: np.ndarray | None = None  # the copy of its logits that choice is made from
    prompt: list[int] = field(default_factory=list)  # all of its prompt's tokens
    copy_from: Generation | None = None  # a busy one whose KV of the first ``copy_len`` prompt tokens it waits to copy
    copy_len: int = 0

    @property
    def reading(self) -> bool:
        """Whether its prompt is still being read (its KV short of all but the last prompt token)."""
        return self.copy_from is not None or len(self.slot.tokens) < len(self.prompt) - 1


__all__ = ["LoraKey", "Slot", "Generation"]

"""The llama.cpp engine's KV and prefix cache: which slot a request runs in, and what of its prompt it skips.

Each slot keeps the KV of the last tokens it read, keyed by the LoRA selection they were computed under. A
request starts in the idle slot holding the longest prefix of its prompt -- or, when a busy slot holds (or is
reading) a longer one, in a slot that takes a copy of that slot's KV once it has read that far, so a prefix
shared by requests that start together is decoded once. Apart from the scheduler and the decode step because
it is the one place that knows what each slot's KV holds; ``PrefixCache`` touches the context's memory only
through removing and copying a sequence's cells.

Design: docs/internals/inference.md#copying-a-prefix
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import numpy as np

from tensorjob_jupyter.inference.llama_sequence import Generation, LoraKey, Slot

#: The fewest prompt tokens a copy of another slot's KV must save over the request's own slot: a copy
#: across KV streams moves the whole stream buffer, which costs about what decoding a token or two does.
PREFIX_COPY_MIN_TOKENS = 32


class PrefixCache:
    """The engine's slots and what their KV holds, over one llama.cpp context (``ctx``: its ``LlamaContext``)."""

    def __init__(self, ctx: Any, n_slots: int):
        self._ctx = ctx
        self.slots = [Slot(i) for i in range(n_slots)]
        #: KV copies from one slot to another (a shared prefix decoded once), since creation.
        self.copies = 0

    def held_prefix(self, tokens: list[int], key: LoraKey) -> int:
        """The longest prefix of ``tokens`` a slot under LoRA selection ``key`` holds or, while busy, will hold."""
        held = [will_hold(slot) if slot.busy else slot.tokens for slot in self.slots if slot.lora == key]
        return max((common_prefix(h, tokens) for h in held if h), default=0)

    def copy_worth(self, tokens: list[int], key: LoraKey) -> int:
        """``held_prefix`` counted in steps of ``PREFIX_COPY_MIN_TOKENS``, the least a copy saves: what admission
        ranks waiting requests by."""
        return self.held_prefix(tokens, key) // PREFIX_COPY_MIN_TOKENS

    def pick(self, tokens: list[int], key: LoraKey, use_cache: bool) -> tuple[Slot, int, Slot | None]:
        """The idle slot to run in, how many prompt tokens of KV it will start with, and the busy slot
        to copy them from (None: its own cache; see the module doc on a shared prefix)."""
        idle = [s for s in self.slots if not s.busy]
        best, best_len = None, 0
        if use_cache:
            for slot in idle:
                if slot.lora != key or not slot.tokens:
                    continue
                n = common_prefix(slot.tokens, tokens)
                if n > best_len:
                    best, best_len = slot, n
        source, source_len = None, 0
        if use_cache:
            for slot in self.slots:
                if slot.busy and slot.lora == key:
                    n = common_prefix(will_hold(slot), tokens)
                    if n > source_len:
                        source, source_len = slot, n
        # at least one prompt token is always decoded, for fresh logits
        limit = len(tokens) - 1
        if source is not None and min(source_len, limit) >= min(best_len, limit) + PREFIX_COPY_MIN_TOKENS:
            # the copy replaces the whole of the slot's KV: take the idle slot whose own cache is worth least
            worth = {id(s): (common_prefix(s.tokens, tokens) if s.lora == key else 0, bool(s.tokens), s.last_used)
                     for s in idle}
            return min(idle, key=lambda s: worth[id(s)]), min(source_len, limit), source
        if best is None:
            empty = [s for s in idle if not s.tokens]
            best = empty[0] if empty else min(idle, key=lambda s: s.last_used)
            best_len = 0
        return best, min(best_len, limit), None

    def drop(self, slot: Slot) -> None:
        """Forget all that ``slot`` holds."""
        self._ctx.kv_cache_seq_rm(slot.seq_id, 0, -1)
        slot.tokens = []

    def cut_back(self, slot: Slot) -> None:
        """Drop any KV past the tokens ``slot`` says it holds (all of it if llama.cpp cannot cut there)."""
        if not self._ctx.kv_cache_seq_rm(slot.seq_id, len(slot.tokens), -1):
            self.drop(slot)

    def release(self, slot: Slot) -> None:
        """``slot``'s generation has ended: it is idle, its KV kept for the next request."""
        slot.busy = False
        slot.last_used = time.monotonic()

    def keep(self, gen: Generation, reuse: int) -> None:
        """Start ``gen`` from the first ``reuse`` tokens its own slot's KV holds (all of it dropped if
        llama.cpp cannot cut the rest)."""
        slot = gen.slot
        if not self._ctx.kv_cache_seq_rm(slot.seq_id, reuse, -1):
            self.drop(slot)
            reuse = 0
        slot.tokens = gen.prompt[:reuse]
        gen.cached_tokens = reuse

    def take_copies(self, active: list[Generation]) -> None:
        """Copy into each waiting generation's slot the prefix it shares with a busy slot, once that slot has read
        it. A source that ended or moved on before then leaves the generation to its own slot's cache.

        Across KV streams only a whole stream can be copied; llama.cpp does it before the next decode, whichever
        sequences that decode is for, so the cells copied are the ones held now."""
        for gen in active:
            source = gen.copy_from
            if source is None:
                continue
            if common_prefix(source.slot.tokens, gen.prompt) >= gen.copy_len:
                self._ctx.kv_cache_seq_cp(source.slot.seq_id, gen.slot.seq_id, -1, -1)
                self.copies += 1
                gen.copy_from = None
                self.keep(gen, gen.copy_len)
            elif not source.reading or not any(other is source for other in active):
                gen.copy_from = None
                limit = len(gen.prompt) - 1
                self.keep(gen, min(common_prefix(gen.slot.tokens, gen.prompt), limit))


def will_hold(slot: Slot) -> list[int]:
    """The tokens a busy slot's KV holds or, while its prompt is read, will hold: what a copy of it may share."""
    reading = slot.prompt[:-1]
    return slot.tokens if slot.tokens[:len(reading)] == reading else reading


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many tokens ``a`` and ``b`` begin with alike."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    x = np.asarray(a[:n], dtype=np.int64)
    y = np.asarray(b[:n], dtype=np.int64)
    diff = np.flatnonzero(x != y)
    return int(diff[0]) if diff.size else n


__all__ = ["PREFIX_COPY_MIN_TOKENS", "PrefixCache", "will_hold", "common_prefix"]

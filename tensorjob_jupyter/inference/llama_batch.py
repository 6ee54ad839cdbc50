"""Building one decode of the llama.cpp engine: which prompt tokens ride along the running steps, and in what order.

A step carries each running generation's next token and the next chunk of every prompt being read, so a
request that starts mid-batch never makes long answers wait a whole prompt. ``PromptRates`` sizes the chunks
from what steps have cost (a step within ``PROMPT_STEP_RATIO`` of the running step alone) -- or reads the prompts
whole where a running answer is short or nearly done, or answers are so long that starts are rare (``whole``),
``share``
splits them among the prompts being read, and ``fill_batch`` lays the step out in slot order, the order in
which llama.cpp computes a batch over separate KV streams in the fewest passes. Apart from the decode step
because it is arithmetic over measurements and token lists: it can be read, and tested, without a model.

Design: docs/internals/inference.md#what-the-engine-guarantees
"""

from __future__ import annotations

import math
from typing import Any

from tensorjob_jupyter.inference.llama_sequence import Generation

#: While other sequences decode, a step that also reads prompt tokens costs about this many times a step of theirs
#: alone: the prompt tokens a step takes are fitted to the rates the engine has measured (``PromptRates.budget``).
PROMPT_STEP_RATIO = 2.0
#: A prompt chunk read beside running sequences is computed in a micro-batch of its own (llama.cpp cuts a batch over
#: separate KV streams into equal parts), at a fixed cost besides its tokens. Where the ratio leaves a chunk so small
#: that the fixed part is more than ``1 - PROMPT_CHUNK_SHARE`` of it (a quiet CPU: the micro-batch's pass over the
#: weights is most of a step of one sequence), it grows, up to a step of this many times theirs.
PROMPT_STEP_RATIO_MAX = 3.0
#: The least share of a chunk's cost its tokens are to have, where ``PROMPT_STEP_RATIO_MAX`` leaves room for it.
PROMPT_CHUNK_SHARE = 0.5
#: The fewest prompt tokens a step takes for each prompt it reads while others run, however slow the measured rates
#: make them: on a 2-core CPU under load a prompt token costs nearly what a step of one sequence does (on one thread,
#: a step of one sequence took 21 ms; with a chunk of 2 prompt tokens beside it 63 ms, with 8 tokens 172 ms).
PROMPT_MIN_TOKENS = 1
#: The fewest tokens of a prompt read with nothing else running that measure what a prompt token costs read alone
#: (the fixed part of its micro-batch a small share of it).
LONE_MIN_TOKENS = 32
#: Where answers are long enough that a slot frees only once in this many steps (the mean answer over the running
#: sequences), prompts are read whole: one longer step in so many stays out of the running answers' 95th-percentile
#: gap, and the new sequence starts answering at once instead of after its chunk steps.
WHOLE_RARE_STEPS = 25
#: How much of each new measurement the rates take (an exponential average: one slow step moves them little).
RATE_WEIGHT = 0.2


class PromptRates:
    """What decode steps have cost, measured (``measured``), and the prompt tokens the next step may read
    (``budget``) for an engine whose decodes hold at most ``n_batch`` tokens."""

    def __init__(self, n_batch: int):
        self.n_batch = n_batch
        #: seconds a decode step takes by how many sequences it decodes; what a prompt's chunk read beside running
        #: sequences adds to it, and its tokens; what a prompt token costs read alone
        self.step_s: dict[int, float] = {}
        self.chunk_s: float | None = None
        self.chunk_tokens: float | None = None
        self.last_chunk = 0
        self.lone_token_s: float | None = None
        #: completion tokens the engine's finished generations produced, on average (what an answer here is)
        self.answer_tokens: float | None = None

    def budget(self, running: int, readers: int = 1) -> int:
        """The prompt tokens the next step may read, for ``readers`` prompts, while ``running`` sequences have read
        theirs: all the batch holds when none have; else what keeps a step within ``PROMPT_STEP_RATIO`` of their
        step alone -- whether they decode in it or sit it out (a late listener, a grammar still choosing: they wait
        for it all the same) -- and never fewer than ``PROMPT_MIN_TOKENS`` a prompt. Before anything is measured,
        the fewest.

        What a token costs is measured at the chunk sizes read, their micro-batch's fixed part included, so the sizes
        settle where a step costs the ratio (rounded, not floored: from small chunks, whose cost a token is mostly the
        fixed part, flooring would never let them grow). Where that leaves the fixed part more than ``1 -
        PROMPT_CHUNK_SHARE`` of a chunk -- told by a token's cost read alone -- chunks grow to the size where it is
        not, but never past a step of ``PROMPT_STEP_RATIO_MAX`` times theirs. A chunk is at most twice the last one
        measured, so that sizes grow a measured step at a time."""
        room = max(0, self.n_batch - running)
        if not running:
            return room
        least = min(room, readers * PROMPT_MIN_TOKENS)
        step = self.step_estimate(running)
        if step is None or self.chunk_s is None or not self.chunk_tokens:
            return least
        # a token beside running sequences costs no less than alone (a step timed under their average looks free)
        per_token = max(self.chunk_s / self.chunk_tokens, self.lone_token_s or 0.0, 1e-9)
        n = round((PROMPT_STEP_RATIO - 1.0) * step / per_token)
        if self.lone_token_s:
            fixed = max(0.0, self.chunk_s - self.chunk_tokens * self.lone_token_s)
            worth = readers * math.ceil(fixed / self.lone_token_s * PROMPT_CHUNK_SHARE / (1.0 - PROMPT_CHUNK_SHARE))
            n = max(n, min(worth, round((PROMPT_STEP_RATIO_MAX - 1.0) * step / per_token)))
        # at most twice the last chunk measured: one step timed short cannot make the next one long
        n = min(n, readers * max(PROMPT_MIN_TOKENS, 2 * self.last_chunk))
        return min(room, max(least, n))

    def whole(self, budget: int, running: int, need: int, left: int) -> int:
        """``budget``, or every one of the ``need`` prompt tokens still to read in this step, when read ``budget`` a
        step they would take at least as many steps as the soonest-ending of the ``running`` sequences is expected
        to have ``left`` (``expected_left``): short answers, or an answer near its end. Chunks would then spread the
        prompts over steps each paying its micro-batch's pass over the weights, and the new sequences' first tokens
        would come after a slot had freed anyway; read whole, they start that many steps sooner, and the running
        ones wait one longer step for it. Whole too where answers are so long that starts are rare
        (``starts_rare``): the longer step is then one gap in ``WHOLE_RARE_STEPS`` or more, under the gaps' 95th
        percentile. Otherwise, while every running answer is long, chunks (and smooth gaps) stay. Never more than
        the batch's room."""
        room = max(0, self.n_batch - running)
        if not running or need <= budget or need > room:
            return budget
        return need if math.ceil(need / max(1, budget)) >= left or self.starts_rare(running) else budget

    def starts_rare(self, running: int) -> bool:
        """Whether a slot frees so seldom -- the mean answer (``answer_tokens``) over the ``running`` sequences is at
        least ``WHOLE_RARE_STEPS`` steps -- that a whole read's longer step is one gap in that many."""
        return self.answer_tokens is not None and self.answer_tokens / max(1, running) >= WHOLE_RARE_STEPS

    def expected_left(self, limit: int, produced: int) -> int:
        """The tokens a running generation allowed ``limit`` and ``produced`` so far is still expected to make: up
        to the engine's mean answer (``answer_tokens``, once any has finished) while it is short of it; one past
        it, a long answer, all its limit allows (the mean says nothing of it)."""
        most = max(0, limit - produced)
        mean = None if self.answer_tokens is None else round(self.answer_tokens)
        return most if mean is None or produced >= mean else min(most, mean - produced)

    def answered(self, tokens: int) -> None:
        """A generation finished with ``tokens`` completion tokens: folded into ``answer_tokens``."""
        self.answer_tokens = average(self.answer_tokens, float(tokens))

    def step_estimate(self, decoding: int) -> float | None:
        """Seconds a step of ``decoding`` sequences alone takes: measured, else the most the sizes measured say it
        takes at least (a step of more sequences costs more, and no more a sequence); None before any."""
        if decoding in self.step_s:
            return self.step_s[decoding]
        return max((s if d < decoding else s * decoding / d for d, s in self.step_s.items()), default=None)

    def measured(self, seconds: float, decoding: int, prompt_tokens: int, running: int | None = None,
                 readers: int = 1) -> None:
        """Fold one step's time into the rates ``budget`` fits the prompt tokens to: a step of ``decoding``
        sequences alone; what a prompt's chunk read while ``running`` sequences had read theirs (default: the
        decoding ones) added to it -- beyond the decoding ones' step, or all of it when they sat the step out -- and
        its size, for each of ``readers`` prompts (llama.cpp computes each prompt's chunk in a micro-batch of its own,
        apart from the next tokens of other KV streams); and what a prompt token costs read with none running, one
        prompt in a large chunk."""
        running = decoding if running is None else running
        if not prompt_tokens:
            if decoding:
                self.step_s[decoding] = average(self.step_s.get(decoding), seconds)
            return
        if not running:
            if readers == 1 and prompt_tokens >= LONE_MIN_TOKENS:
                self.lone_token_s = average(self.lone_token_s, seconds / prompt_tokens)
            return
        step = self.step_estimate(decoding) if decoding else 0.0
        if step is None or not readers:
            return
        self.chunk_s = average(self.chunk_s, max(0.0, seconds - step) / readers)
        self.chunk_tokens = average(self.chunk_tokens, prompt_tokens / readers)
        self.last_chunk = -(-prompt_tokens // readers)


def share(reading: list[Generation], budget: int) -> dict[Generation, list[int]]:
    """The next chunk of each prompt being read, ``budget`` tokens in all shared out evenly (a prompt needing less
    than its share leaves the rest to the others): prompts read together are read in the same decodes."""
    needs = sorted(((len(gen.prompt) - 1 - len(gen.slot.tokens), gen) for gen in reading), key=lambda ns: ns[0])
    chunks: dict[Generation, list[int]] = {}
    for k, (need, gen) in enumerate(needs):
        take = min(need, budget // (len(needs) - k))
        if take > 0:
            start = len(gen.slot.tokens)
            chunks[gen] = gen.prompt[start:start + take]
            budget -= take
    return chunks


def fill_batch(batch: Any, decoding: list[Generation], chunks: dict[Generation, list[int]]) -> dict[int, int]:
    """Lay out one decode in ``batch`` (a ``llama_batch``): each decoding generation's next token (its logits kept)
    and each prompt chunk (no logits), in slot order; the batch row of each decoding generation's token, by ``id``.

    In slot order because llama.cpp cuts a batch over separate KV streams into micro-batches of runs of
    consecutive sequence ids, each sequence giving as many tokens as the fewest of them: [1, 2, 3, 0] is two
    graph computes a step, [0, 1, 2, 3] one, and a prompt chunk goes with the next tokens as its first token
    and in a compute of its own for the rest."""
    rows: dict[int, int] = {}
    n = 0
    for gen in sorted([*decoding, *chunks], key=by_slot):
        pos = len(gen.slot.tokens)
        tokens = chunks.get(gen) or [gen.next_token]
        for j, token in enumerate(tokens):
            batch.token[n] = token
            batch.pos[n] = pos + j
            batch.n_seq_id[n] = 1
            batch.seq_id[n][0] = gen.slot.seq_id
            batch.logits[n] = gen not in chunks
            n += 1
        if gen not in chunks:
            rows[id(gen)] = n - 1
    batch.n_tokens = n
    return rows


def by_slot(gen: Generation) -> int:
    return gen.slot.seq_id


def average(old: float | None, new: float) -> float:
    """``new`` folded into the running average ``old`` with weight ``RATE_WEIGHT`` (``new`` when there is none)."""
    return new if old is None else old + RATE_WEIGHT * (new - old)


__all__ = ["PROMPT_STEP_RATIO", "PROMPT_STEP_RATIO_MAX", "PROMPT_CHUNK_SHARE", "PROMPT_MIN_TOKENS", "LONE_MIN_TOKENS",
           "RATE_WEIGHT", "PromptRates", "share", "fill_batch", "by_slot", "average"]

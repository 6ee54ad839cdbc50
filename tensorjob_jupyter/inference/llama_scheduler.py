"""Admission into the llama.cpp engine's running batch: which waiting request starts next, and when.

Between decode steps, while a slot is free, the worker's queue is asked for what waits (up to
``PREFIX_LOOKAHEAD``); before the first step requests sent together are waited for a few milliseconds
(``ADMIT_WINDOW_S``) so that they start together. Of those waiting, the one sharing the longest prefix with
what the slots hold starts first (its KV is copied, not decoded again: ``llama_cache``), without passing any
request over more than ``PREFIX_PASS_LIMIT`` times. A request decoded alone, or under another LoRA selection,
waits for the batch to drain. Apart from the engine because these are rules about requests, not about the
model: ``Admission`` never touches llama.cpp, and starts a request through the engine's own ``start``.

Design: docs/internals/inference.md#the-engines-rooms
"""

from __future__ import annotations

from typing import Callable, Protocol, Sequence

from tensorjob_jupyter.inference.base import GenerateRequest, LoraChoice, Pending
from tensorjob_jupyter.inference.llama_cache import PrefixCache
from tensorjob_jupyter.inference.llama_sequence import Generation, LoraKey

#: Before a batch's first decode step, once a second request has come with the first, how long to wait
#: for another: requests sent together (jobs started at once) arrive a few milliseconds apart, and one
#: that misses the first steps costs the batch as many extra steps at its end. Waited again after each
#: arrival; never for a lone request, never once decoding.
ADMIT_WINDOW_S = 0.005
#: Requests a batch takes off the worker's queue to choose from while a slot is free: the next to start is the one
#: sharing the longest prefix with what the slots hold or are reading (``prefix_first``).
PREFIX_LOOKAHEAD = 32
#: How many times a waiting request may be passed over for one sharing a longer prefix before it starts next.
PREFIX_PASS_LIMIT = 8


class AdmittingEngine(Protocol):
    """What admission reads of the engine."""

    n_slots: int
    prefix_order: bool

    @property
    def lora(self) -> LoraKey: ...

    def lora_key(self, choices: Sequence[LoraChoice]) -> LoraKey: ...

    def prompt_tokens(self, request: GenerateRequest) -> list[int]: ...


#: Start a request if it can join the running generations now (False: it must wait); answers one that never can.
Start = Callable[[Pending, list[Generation]], bool]


class Admission:
    """The requests one ``serve`` call waits to start: ``first``, and what ``admit`` hands over meanwhile
    (``admit()``: one queued now, or None; ``admit(seconds)``: waiting that long for one). ``start`` is the
    engine's: it starts a request among the running generations, or says it must wait."""

    def __init__(self, engine: AdmittingEngine, cache: PrefixCache, first: Pending,
                 admit: Callable[..., Pending | None] | None, start: Start):
        self._engine = engine
        self._cache = cache
        self._admit = admit
        self._start = start
        self.waiting: list[Pending] = [first]
        self._passed: dict[int, int] = {}  # id of a waiting request -> times one behind it started first
        self._gather = True  # until the first decode step

    def fill(self, active: list[Generation]) -> None:
        """Before a decode step: take what is queued while a slot is free, up to ``PREFIX_LOOKAHEAD`` waiting, and
        start what may start (``start_waiting``); before the first step, once two have come together, wait
        ``ADMIT_WINDOW_S`` for each next one."""
        engine, admit, waiting = self._engine, self._admit, self.waiting
        while True:
            while admit is not None and len(active) < engine.n_slots and len(waiting) < PREFIX_LOOKAHEAD:
                item = admit()
                if item is None:
                    break
                waiting.append(item)
            self.start_waiting(active)
            if not (self._gather and admit is not None and 1 < len(active) < engine.n_slots and not waiting):
                break
            item = admit(ADMIT_WINDOW_S)
            if item is None:
                break
            waiting.append(item)
        self._gather = False

    def start_waiting(self, active: list[Generation]) -> None:
        """Answer the waiting requests that need no slot (abandoned, nothing to generate) at once, then start the
        others while a slot is free, prefix-first (``next_to_start``)."""
        waiting, passed = self.waiting, self._passed
        needless = [w for w in waiting if w.abandoned() or w.request.max_tokens <= 0]
        if needless:
            for item in needless:
                self._start(item, active)
                passed.pop(id(item), None)
            gone = {id(item) for item in needless}
            waiting[:] = [w for w in waiting if id(w) not in gone]
        while waiting and len(active) < self._engine.n_slots:
            k = self.next_to_start(active)
            if not self._start(waiting[k], active):
                return
            for item in waiting[:k]:
                passed[id(item)] = passed.get(id(item), 0) + 1
            passed.pop(id(waiting.pop(k)), None)

    def next_to_start(self, active: list[Generation]) -> int:
        """Which waiting request starts next: of the leading ones that may join the batch as it runs (the same
        LoRA selection, none decoded alone), the one whose prompt shares the longest prefix with a slot's KV, held
        or being read -- counted in steps of the least a copy saves (``PrefixCache.copy_worth``) -- else the
        earliest (``prefix_first``)."""
        engine, waiting = self._engine, self.waiting
        if not engine.prefix_order or len(waiting) == 1 or any(gen.pending.request.alone for gen in active):
            return 0
        scores: list[int] = []
        try:
            key = engine.lora_key(waiting[0].request.lora) if not active else engine.lora
            for item in waiting:
                request = item.request
                if request.alone or engine.lora_key(request.lora) != key:
                    break
                if item.tokens is None:
                    item.tokens = engine.prompt_tokens(request)
                scores.append(self._cache.copy_worth(item.tokens, key) if request.cache_prompt else 0)
        except Exception:  # noqa: BLE001 - a request that cannot be read is answered by ``start``, in its turn
            pass
        if len(scores) < 2:
            return 0
        return prefix_first(scores, [self._passed.get(id(item), 0) for item in waiting[:len(scores)]])


def may_join(request: GenerateRequest, active: list[Generation], slots: int) -> bool:
    """Whether ``request`` may join ``active`` now as far as its slot goes: one is free, and neither it nor any
    running one is decoded alone (such a request waits for the batch to drain, and holds the others back)."""
    if len(active) >= slots:
        return False
    return not (active and (request.alone or any(gen.pending.request.alone for gen in active)))


def prefix_first(scores: Sequence[int], passed: Sequence[int]) -> int:
    """The index of the waiting request to start (in arrival order, with the prefix each shares with the slots and
    the times each was passed over): the highest score, the earliest among equals -- but the first once it has been
    passed over ``PREFIX_PASS_LIMIT`` times. One ahead of another has been passed over at least as often, so no
    request is passed over more than that (longest-prefix-first, as SGLang schedules, without its starvation)."""
    if passed[0] >= PREFIX_PASS_LIMIT:
        return 0
    return max(range(len(scores)), key=lambda i: (scores[i], -i))


__all__ = ["ADMIT_WINDOW_S", "PREFIX_LOOKAHEAD", "PREFIX_PASS_LIMIT", "AdmittingEngine", "Start", "Admission",
           "may_join", "prefix_first"]

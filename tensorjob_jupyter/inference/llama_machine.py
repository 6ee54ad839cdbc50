"""Watching the machine around the llama.cpp engine: its decode threads fitted to the CPUs other work leaves.

llama.cpp's threads meet at every decode step, so one thread the machine cannot run holds all the others
(``topology``). An engine given no thread count looks, every ``THREADS_CHECK_S``, at what the rest of the
machine uses of its CPUs, and decodes with the count that fits once two windows in a row agree. The same
windows tell which generations ran on a quiet machine: their rates, per batch size, are the model's quiet rate
that each answer reports beside its own. Apart from the engine because it reads the machine, not the model.

Design: docs/internals/inference.md#topologypy
"""

from __future__ import annotations

import logging
from typing import Callable

from tensorjob_jupyter.inference.llama_batch import average
from tensorjob_jupyter.inference.llama_sequence import Generation
from tensorjob_jupyter.inference.topology import CpuShare, fitting_threads, logical_cpus

log = logging.getLogger("tensorjob_jupyter.llama")
log.addHandler(logging.NullHandler())

#: How often an engine given no thread count looks at what the rest of the machine uses of its CPUs; its
#: generation threads change when two windows in a row say the same (``MachineWatch.fit``).
THREADS_CHECK_S = 2.0
#: Over one of those windows, the machine is quiet while other work keeps fewer of its CPUs busy than this: a
#: sequence that saw only quiet windows gives the model's quiet rate for its batch size (``quiet_tokens_per_second``).
QUIET_OTHERS_CPUS = 0.25


class MachineWatch:
    """The threads an engine decodes with (``threads_now``), fitted to the machine, for an engine whose own
    counts are ``own_threads`` (generation) and ``own_threads_batch`` (prompts); ``set_threads(n, n_batch)``
    sets them on its context; ``cpu_share``: how the machine's other work is measured (None: nothing is
    watched, nothing changes)."""

    def __init__(self, own_threads: int, own_threads_batch: int, set_threads: Callable[[int, int], None],
                 cpu_share: CpuShare | None):
        self.own_threads = own_threads
        self._own_threads_batch = own_threads_batch
        self._set_threads = set_threads
        self.cpu_share = cpu_share
        self.threads_now = own_threads  # a request decoded alone may ask for others (``use``)
        #: the threads that fit the machine now, and a verdict waiting for its second window
        self.fitted = own_threads
        self.next_fit: int | None = None
        #: tokens a second of a sequence by the most sequences it was decoded with, on a quiet machine
        self.quiet_rates: dict[int, float] = {}

    def use(self, threads: int | None) -> None:
        """Decode with ``threads`` threads from now on (None: the engine's own, as fitted to the machine)."""
        want = max(1, int(threads)) if threads else self.fitted
        if want != self.threads_now:
            batch = self._own_threads_batch if want == self.own_threads else want
            self._set_threads(want, batch)
            self.threads_now = want

    def fit(self, active: list[Generation]) -> None:
        """Count a window that has ended into each of ``active``, and fit the threads to it (never while a
        request decoded alone runs with its own): when two windows of ``THREADS_CHECK_S`` in a row say the same
        other count, that is the count from the next step on. llama.cpp's threads meet every step, so a thread
        the machine cannot run holds the rest (``topology``)."""
        if self.cpu_share is None:
            return
        others = self.cpu_share.others()
        if others is None:
            return
        for gen in active:
            gen.windows += 1
            gen.busy_windows += others >= QUIET_OTHERS_CPUS
        if any(gen.pending.request.alone for gen in active):
            return
        cpus = logical_cpus()
        verdict = fitting_threads(self.own_threads, cpus, others)
        if verdict == self.fitted:
            self.next_fit = None
        elif verdict == self.next_fit:
            self.fitted, self.next_fit = verdict, None
            self.use(None)
            log.info("tensorjob: other work uses %.1f of %d CPUs: decoding with %d threads", others, cpus, verdict)
        else:
            self.next_fit = verdict

    def learn(self, gen: Generation, tokens_per_second: float) -> None:
        """``gen`` has finished at this rate: the quiet rate of its batch size, if it saw only quiet windows."""
        if gen.windows and not gen.busy_windows:
            self.quiet_rates[gen.batch] = average(self.quiet_rates.get(gen.batch), tokens_per_second)

    def quiet_rate(self, batch: int) -> float | None:
        """The tokens a second a sequence decoded with ``batch - 1`` others makes on a quiet machine, once learnt."""
        return self.quiet_rates.get(batch)


__all__ = ["THREADS_CHECK_S", "QUIET_OTHERS_CPUS", "MachineWatch"]

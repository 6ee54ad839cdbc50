"""The cascade's guarantee: which threshold a sample certifies, by an exact bound, whatever the score.

A uniform random sample of the map's items (``draw_sample``: seeded) gives, for each sampled item, whether the
proxy's answer agreed with the oracle's. ``certify`` tries thresholds in a fixed sequence -- the distinct proxy
scores of *all* items, highest first, from where the sample is expected to hold enough items to certify anything
-- and at each bounds the agreement of the items scored at or above it from below by the exact one-sided
Clopper-Pearson bound (``scipy.stats.beta.ppf``) at level ``delta``; it stops at the first threshold whose bound is
under the target. A fixed sequence tested in order and stopped at its first failure needs no correction for the
thresholds tried: certifying any threshold whose items agree less than the target needs the first such one in the
sequence to pass, which happens with probability at most ``delta``. The sequence depends only on the scores, never
on the agreements; given how many sampled items lie above a threshold, they are a uniform sample of its items
(sampled without replacement: the binomial bound is conservative). ``simulate`` measures how often it fails.
Design: docs/maps.md#a-cascade-with-a-guarantee
"""

from __future__ import annotations

import functools
import math
import random
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

__all__ = ["check_target", "check_delta", "lower_bound", "needed", "default_sample_size", "draw_sample", "Step",
           "Certificate", "certify", "Simulation", "simulate"]


def check_target(target: Any) -> float:
    """``target`` as a share from just over 0 to 1; ``ValueError`` (one line) otherwise."""
    if isinstance(target, bool) or not isinstance(target, (int, float)) or not 0 < target <= 1:
        raise ValueError(f"--target {target!r}: the share of items that must agree, over 0 and at most 1 "
                         f"(e.g. 0.9)")
    return float(target)


def check_delta(delta: Any) -> float:
    """``delta`` as a probability strictly between 0 and 1; ``ValueError`` (one line) otherwise."""
    if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not 0 < delta < 1:
        raise ValueError(f"--delta {delta!r}: the chance the guarantee may fail, over 0 and under 1 (e.g. 0.1)")
    return float(delta)


@functools.lru_cache(maxsize=65536)
def lower_bound(agree: int, n: int, delta: float) -> float:
    """The one-sided (1 - ``delta``) Clopper-Pearson lower bound on a share, ``agree`` of ``n`` sampled agreeing:
    ``beta.ppf(delta, agree, n - agree + 1)``, 0 when none agree (or none were sampled)."""
    if n <= 0 or agree <= 0:
        return 0.0
    from scipy.stats import beta  # deferred: scipy's import is slow, and only a cascade needs it

    return float(beta.ppf(delta, agree, n - agree + 1))


def needed(target: float, delta: float) -> int | None:
    """The fewest sampled items that can certify ``target`` at ``delta`` (all of them agreeing: the bound is then
    ``delta ** (1 / n)``); None when no sample can (a target of 1)."""
    if target >= 1:
        return None
    n = max(1, math.ceil(math.log(delta) / math.log(target)))
    while lower_bound(n, n, delta) < target:  # rounding at the edge
        n += 1
    while n > 1 and lower_bound(n - 1, n - 1, delta) >= target:
        n -= 1
    return n


def default_sample_size(total: int, target: float, delta: float) -> int:
    """The sample a cascade draws unless told: five times the fewest items the bound needs, or a tenth of the items
    where that is more, at most every item (a sample of every item is the oracle alone: a map that small saves
    nothing). Measured by ``simulate``: a sample a few times what the bound needs certifies far lower thresholds
    than one just large enough, whose first step fails at a single disagreement."""
    least = needed(target, delta) or total
    return min(total, max(5 * least, math.ceil(total / 10)))


#: Where the sequence of thresholds starts: the highest whose items the sample is expected to hold this many
#: times the fewest the bound needs (a later start tolerates a disagreement or two in the first step).
START = 1.5


def draw_sample(total: int, size: int, seed: int) -> list[int]:
    """``size`` distinct items of ``total`` (every item when ``size`` is larger), drawn uniformly with ``seed``,
    in item order."""
    return sorted(random.Random(seed).sample(range(total), min(size, total)))


@dataclass(frozen=True)
class Step:
    """One threshold tried: the items scored at or above it (``above``), how many of them were sampled and how
    many of those agreed, the lower bound on their agreement, and whether it reached the target."""

    threshold: float
    above: int
    sampled: int
    agree: int
    bound: float
    passed: bool

    def to_json(self) -> dict:
        return {"threshold": self.threshold, "above": self.above, "sampled": self.sampled, "agree": self.agree,
                "bound": round(self.bound, 6), "passed": self.passed}


@dataclass(frozen=True)
class Certificate:
    """What ``certify`` found: the lowest threshold certified (None: none, every item goes to the oracle, and
    ``reason`` says why), the bound there, the items at or above it, and every step tried."""

    target: float
    delta: float
    threshold: float | None
    bound: float | None
    above: int
    needed: int | None
    steps: tuple[Step, ...] = field(default=())
    reason: str | None = None

    def to_json(self) -> dict:
        return {"target": self.target, "delta": self.delta, "threshold": self.threshold,
                "bound": None if self.bound is None else round(self.bound, 6), "above": self.above,
                "needed": self.needed, "reason": self.reason, "method": "clopper-pearson, fixed sequence",
                "steps": [s.to_json() for s in self.steps]}


def certify(scores: Sequence[float | None], sample: Sequence[int], agree: Mapping[int, bool], target: float,
            delta: float, *, start: float = START) -> Certificate:
    """The lowest threshold at which the items scored at or above it agree with the oracle on at least ``target``
    of them with probability at least 1 - ``delta`` (see the module doc). ``scores``: every item's proxy score
    (None: no score, never above a threshold); ``sample``: the items drawn uniformly (``draw_sample``);
    ``agree``: each sampled item's agreement (an item missing counts as not agreeing)."""
    target, delta = check_target(target), check_delta(delta)
    total = len(scores)
    least = needed(target, delta)
    if least is None:
        return Certificate(target, delta, None, None, 0, None, reason="a target of 1 cannot be certified by any "
                                                                      "sample: every item goes to the oracle")
    if len(sample) < least:
        return Certificate(target, delta, None, None, 0, least,
                           reason=f"the sample has {len(sample)} items and the bound needs at least {least} for a "
                                  f"target of {target:g} at delta {delta:g}: every item goes to the oracle")
    thresholds = sorted({s for s in scores if s is not None}, reverse=True)
    if not thresholds:
        return Certificate(target, delta, None, None, 0, least,
                           reason="no item has a proxy score (no confidence was recorded): every item goes to the "
                                  "oracle")
    population = sorted((s for s in scores if s is not None), reverse=True)
    sampled = sorted(((s, bool(agree.get(i, False))) for i in sample if (s := scores[i]) is not None),
                     key=lambda pair: pair[0], reverse=True)
    steps: list[Step] = []
    chosen: Step | None = None
    p = q = agreeing = 0
    for t in thresholds:
        while p < len(population) and population[p] >= t:
            p += 1
        while q < len(sampled) and sampled[q][0] >= t:
            agreeing += sampled[q][1]
            q += 1
        if len(sample) * p < start * least * total:  # not yet expected to hold enough sampled items: not a step
            continue
        bound = lower_bound(agreeing, q, delta)
        step = Step(t, p, q, agreeing, bound, bound >= target)
        steps.append(step)
        if not step.passed:
            break
        chosen = step
    if chosen is None:
        why = ("the lowest score's items are fewer than a sample this size certifies"
               if not steps else f"the sampled items' agreement bounds at {steps[0].bound:.3f}, under the target "
                                 f"{target:g}, at the first threshold tried ({steps[0].agree} of "
                                 f"{steps[0].sampled} agreed)")
        return Certificate(target, delta, None, None, 0, least, tuple(steps),
                           reason=f"no threshold certified ({why}): every item goes to the oracle")
    return Certificate(target, delta, chosen.threshold, chosen.bound, chosen.above, least, tuple(steps))


@dataclass(frozen=True)
class Simulation:
    """``simulate``'s figures: runs, how many certified a threshold, how many of those were wrong (the items at or
    above it agree less than the target), the violation rate over all runs, and the mean share of items the
    oracle answered (the sample included) and the mean agreement of the cascade's answers with the oracle's."""

    runs: int
    certified: int
    violations: int
    violation_rate: float
    oracle_share: float
    agreement: float

    def to_json(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def simulate(scores: Sequence[float | None], agree: Sequence[bool], target: float, delta: float, *,
             sample_size: int | None = None, runs: int = 1000, seed: int = 0, start: float = START) -> Simulation:
    """The cascade's threshold choice run ``runs`` times over recorded answers (each item's proxy score and
    whether its proxy answer agrees with its oracle answer), each with a fresh sample: zero model cost."""
    total = len(scores)
    size = sample_size if sample_size is not None else default_sample_size(total, target, delta)
    certified = violations = 0
    oracle = agreement = 0.0
    for run in range(runs):
        sample = draw_sample(total, size, seed + run)
        chosen = certify(scores, sample, {i: agree[i] for i in sample}, target, delta, start=start)
        picked = set(sample)
        if chosen.threshold is None:
            oracle += 1.0
            agreement += 1.0
            continue
        certified += 1
        threshold = chosen.threshold
        above = [i for i in range(total) if (s := scores[i]) is not None and s >= threshold]
        if sum(agree[i] for i in above) < target * len(above):
            violations += 1
        kept = [i for i in above if i not in picked]
        oracle += (total - len(kept)) / total
        agreement += (total - sum(1 for i in kept if not agree[i])) / total
    return Simulation(runs, certified, violations, violations / runs if runs else 0.0,
                      oracle / runs if runs else 0.0, agreement / runs if runs else 0.0)

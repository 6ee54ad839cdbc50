"""What a review certifies of the values nobody reviewed: a stratified random sample and a bound valid at any stop.

The sample is drawn once per run folder (its seed in ``review_plan.json``): each field's values cut into strata
by the review's order score, a seeded shuffle in each, interleaved so any first ``m`` hold each stratum in
proportion to its size. From the sampled values decided so far (a skip counted as wrong) a confidence sequence
for sampling without replacement (``most_wrong``: the prior-posterior ratio of a beta-binomial, ``scipy.stats``)
bounds the wrong values in the strata not reviewed whole at every sample size at once (proven for uniform
draws; for this stratified sample and its shrinking pool, measured), so a review may stop the moment the bound
reaches its target; the wrong values found are taken off, which leaves a bound on the wrong among the values
nobody reviewed, whatever the score (docs/maps.md, "Review, correct, certify", says why). Per field and overall; with a target, how many more sampled reviews reach it. ``certificate.json`` keeps
the statement with a fingerprint of the values, so a replay that changes them makes it stale.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence, TypeGuard

from tensorjob_jupyter.abi import dumps
from tensorjob_jupyter.fanout.errors import ReviewError
from tensorjob_jupyter.fanout.map_folder import fsync_write
from tensorjob_jupyter.fanout.map_folder_reader import CERTIFICATE, REVIEW_PLAN, FolderError, read_folder_json, shown
from tensorjob_jupyter.fanout.review_rows import ValueRow
from tensorjob_jupyter.fanout.reviews import Review

PLAN_FORMAT = "tensorjob-review-plan/1"
CERTIFICATE_FORMAT = "tensorjob-certificate/1"
#: How sure a certificate is unless told (``--confidence``).
DEFAULT_CONFIDENCE = 0.95
#: Strata a field's values are cut into by score, at most; a stratum holds at least ``MIN_STRATUM`` values.
STRATA_PER_FIELD = 8
MIN_STRATUM = 10
#: The method, in the statement's words.
METHOD = ("confidence sequence for sampling without replacement (beta-binomial prior-posterior ratio, "
          "Waudby-Smith & Ramdas 2020), valid at any stopping time, over a sample stratified by score, proportional")
#: The confidence sequence's prior on the share wrong: Beta(1, 19), a mean of 5% wrong. Any prior keeps the
#: guarantee; one near the shares a review certifies (90-95% right) makes the bound tightest there.
PRIOR = (1.0, 19.0)
#: The largest certificate.json or review_plan.json read back.
MAX_CERTIFICATE_BYTES = 16 * 1024 * 1024

Place = tuple[int, str]


# --- the sample --------------------------------------------------------------------------------------------


def plan_seed(run_dir: str | os.PathLike) -> int:
    """The run folder's sample seed (``review_plan.json``), drawn and recorded at first use: written whole
    beside it, then linked into place, so two kernels starting at once agree on one seed."""
    path = Path(run_dir) / REVIEW_PLAN
    plan = read_folder_json(path, MAX_CERTIFICATE_BYTES)
    if plan is None:
        tmp = path.with_name(f"{REVIEW_PLAN}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        fsync_write(tmp, json.dumps({"format": PLAN_FORMAT, "seed": secrets.randbits(63)}) + "\n")
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass  # another kernel drew one first: its seed is the folder's
        except OSError as e:
            raise ReviewError(f"{shown(path)} cannot be written: {e.strerror or e}") from None
        finally:
            tmp.unlink(missing_ok=True)
        plan = read_folder_json(path, MAX_CERTIFICATE_BYTES)
    drawn = plan.get("seed") if isinstance(plan, dict) and plan.get("format") == PLAN_FORMAT else None
    if not isinstance(drawn, int) or isinstance(drawn, bool) or not 0 <= drawn < 2 ** 63:
        raise FolderError(f"{shown(path)} is not a review plan (no \"format\": \"{PLAN_FORMAT}\" with a whole-number "
                          f"\"seed\"); the run folder was edited or is damaged")
    return drawn


def strata(rows: Iterable[ValueRow]) -> dict[Place, tuple[str, int]]:
    """Each value's stratum: its field and its bin among that field's values by the review's order (``sort_key``),
    ``STRATA_PER_FIELD`` bins of about equal size, at least ``MIN_STRATUM`` values each (fewer bins for fewer)."""
    by_field: dict[str, list[ValueRow]] = {}
    for row in rows:
        by_field.setdefault(row.field, []).append(row)
    out: dict[Place, tuple[str, int]] = {}
    for name, members in by_field.items():
        members.sort(key=lambda r: r.sort_key)
        bins = max(1, min(STRATA_PER_FIELD, len(members) // MIN_STRATUM))
        for j, row in enumerate(members):
            out[(row.item, row.field)] = (name, j * bins // len(members))
    return out


def sample_order(rows: Sequence[ValueRow], seed: int) -> list[Place]:
    """Every value once, in the order the sample draws them: each stratum shuffled (seeded), the strata interleaved
    by each draw's place in its stratum (``(j + u) / size``, ``u`` a seeded offset), so the first ``m`` of any set of
    strata hold each in proportion to its size, to within one value."""
    rng = random.Random(seed)
    groups: dict[tuple[str, int], list[Place]] = {}
    for place, stratum in strata(rows).items():
        groups.setdefault(stratum, []).append(place)
    keyed = []
    for stratum in sorted(groups):
        members = sorted(groups[stratum])
        rng.shuffle(members)
        offset, tie = rng.random(), rng.random()
        keyed += [((j + offset) / len(members), tie, place) for j, place in enumerate(members)]
    keyed.sort(key=lambda k: (k[0], k[1]))
    return [place for _, _, place in keyed]


def fingerprint(rows: Iterable[ValueRow]) -> str:
    """The SHA-256 of the values (item, field, value, in item and field order): what a certificate was made on."""
    digest = hashlib.sha256()
    for row in sorted(rows, key=lambda r: (r.item, r.order)):
        digest.update(dumps([row.item, row.field, row.value]).encode("utf-8") + b"\n")
    return digest.hexdigest()


# --- the bound ---------------------------------------------------------------------------------------------


def most_wrong(pool: int, sampled: int, wrong: int, confidence: float) -> int:
    """The most values of a ``pool`` that can be wrong, given ``wrong`` of the first ``sampled`` drawn from it
    uniformly without replacement, at ``confidence`` -- at every sample size at once, so it holds wherever the
    review stops. The prior-posterior ratio ``R(W) = prior(W) / posterior(W)`` over ``W`` wrong in the pool (a
    beta-binomial prior ``PRIOR``, its posterior a beta-binomial over the values not sampled) is a nonnegative
    martingale of mean 1 under the true ``W``, so by Ville's inequality ``R`` reaches ``1 / (1 - confidence)`` at
    any sample size with probability at most ``1 - confidence``; the bound is the largest ``W`` below that.
    ``log R`` is convex in ``W`` (``log_prior_posterior_ratio``), so its least and the set's upper end are found
    by bisection."""
    if not 0 <= wrong <= sampled <= pool:
        raise ValueError(f"a sample of {sampled} with {wrong} wrong is not one of a pool of {pool}")
    if sampled == 0:
        return pool
    level = -math.log1p(-confidence)
    low, high = wrong, pool - sampled + wrong  # the counts the sample leaves possible

    def ratio(count: int) -> float:
        return log_prior_posterior_ratio(pool, sampled, wrong, count)

    while low < high:  # the least log R: the first count from which it no longer falls
        mid = (low + high) // 2
        low, high = (mid + 1, high) if ratio(mid + 1) < ratio(mid) else (low, mid)
    if ratio(low) >= level:
        return low  # nothing is inside (a sample that rare): the likeliest count
    high = pool - sampled + wrong
    while low < high:  # the last count under the level, log R rising from here
        mid = (low + high + 1) // 2
        low, high = (mid, high) if ratio(mid) < level else (low, mid - 1)
    return low


def log_prior_posterior_ratio(pool: int, sampled: int, wrong: int, count: int) -> float:
    """``log R(count)`` of ``most_wrong``: ``betabinom(pool, *PRIOR).logpmf(count)`` less the posterior's
    ``betabinom(pool - sampled, a + wrong, b + sampled - wrong).logpmf(count - wrong)`` -- their beta functions of
    ``count`` cancel, which leaves binomial coefficients and a constant (checked against ``scipy.stats.betabinom``
    in tests/fanout/test_review.py)."""
    a, b = PRIOR
    return (_log_choose(pool, count) - _log_choose(pool - sampled, count - wrong)
            + _log_beta(a + wrong, b + sampled - wrong) - _log_beta(a, b))


def _log_choose(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def _log_beta(a: float, b: float) -> float:
    return math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)


@dataclass(frozen=True)
class Bound:
    """What the review says of one set of values (a field's, or all): how many there are, were reviewed (decided),
    were corrected (decided wrong), are not reviewed; the sample it rests on (``sampled``, of which ``wrong``:
    skips counted wrong) and the lower bound on the share right of those not reviewed (``lower``; 1 when all were
    reviewed); ``needed``: more sampled reviews that reach the target at the rate seen so far (None: no target)."""

    name: str | None
    values: int
    reviewed: int
    corrected: int
    unreviewed: int
    sampled: int
    wrong: int
    lower: float
    needed: int | None = None

    def statement(self, confidence: float, target: float | None = None) -> str:
        """``712 values not reviewed: at least 95.1% right with 95% confidence (48 sampled, 1 wrong); 96
        reviewed, 41 corrected`` (the bound rounded down), and where the target stands."""
        what = f"{self.name}: " if self.name is not None else ""
        done = f"{self.reviewed} reviewed, {self.corrected} corrected"
        if not self.unreviewed:
            text = f"{what}all {_values(self.values)} reviewed, {self.corrected} corrected"
        else:
            text = (f"{what}{_values(self.unreviewed)} not reviewed: at least {percent(self.lower, down=True)} right with "
                    f"{percent(confidence)} confidence ({self.sampled} sampled, {self.wrong} wrong); {done}")
        if target is not None and self.needed is not None:
            text += (f"; target {percent(target)} reached" if self.needed == 0 else
                     f"; about {self.needed} more sampled review{'' if self.needed == 1 else 's'} to reach "
                     f"{percent(target)}")
        return text

    def to_json(self) -> dict[str, Any]:
        return {"field": self.name, "values": self.values, "reviewed": self.reviewed, "corrected": self.corrected,
                "unreviewed": self.unreviewed, "sampled": self.sampled, "wrong": self.wrong,
                "lower": round(self.lower, 6), "needed": self.needed}


def _values(count: int) -> str:
    return f"{count} value" + ("" if count == 1 else "s")


def percent(share: float, *, down: bool = False) -> str:
    """``95.1%`` (``down``: rounded down, so a bound is never shown above itself); ``95%`` for a whole one."""
    value = math.floor(share * 1000 + 1e-9) / 10 if down else round(share * 100, 1)
    return f"{value:g}%"


def bound_of(name: str | None, places: Sequence[Place], order: Sequence[Place],
             stratum: Mapping[Place, Any], decided: Mapping[Place, Review], skipped: set[Place],
             confidence: float, target: float | None = None) -> Bound:
    """The ``Bound`` of the values at ``places`` (see the module doc); ``order``: the sample's (``sample_order``),
    ``stratum``: each place's, ``decided``: the deciding review of each place decided, ``skipped``: those skipped."""
    mine = set(places)
    open_strata = {stratum[p] for p in mine if p not in decided}
    pool = [p for p in mine if stratum[p] in open_strata]  # the strata not reviewed whole
    corrected_all = sum(1 for p in mine if p in decided and not decided[p].right)
    unreviewed = sum(1 for p in mine if p not in decided)
    corrected_pool = sum(1 for p in pool if p in decided and not decided[p].right)
    in_pool = set(pool)
    sampled = wrong = 0
    for place in order:
        if place not in in_pool:
            continue
        if place in decided:
            sampled, wrong = sampled + 1, wrong + (not decided[place].right)
        elif place in skipped:
            sampled, wrong = sampled + 1, wrong + 1
        else:
            break  # the sample is its decided first values, in its order
    lower = _unreviewed_lower(len(pool), corrected_pool, unreviewed, sampled, wrong, confidence)
    needed = None
    if target is not None:
        needed = _needed(len(pool), corrected_pool, unreviewed, sampled, wrong, confidence, target)
    return Bound(name, len(mine), len(mine) - unreviewed, corrected_all, unreviewed, sampled, wrong, lower, needed)


def _unreviewed_lower(pool: int, known_wrong: int, unreviewed: int, sampled: int, wrong: int,
                      confidence: float) -> float:
    """At least this share of the ``unreviewed`` values is right: the pool holds at most ``most_wrong`` wrong,
    ``known_wrong`` of them found already."""
    if unreviewed <= 0:
        return 1.0
    return 1.0 - min(unreviewed, max(0, most_wrong(pool, sampled, wrong, confidence) - known_wrong)) / unreviewed


def _needed(pool: int, known_wrong: int, unreviewed: int, sampled: int, wrong: int, confidence: float,
            target: float) -> int:
    """How many more sampled reviews bring the bound to ``target`` if they are wrong at the rate seen so far (each
    wrong one found and corrected): the fewest, found by bisection; every unreviewed value at most."""
    rate = wrong / sampled if sampled else 0.0

    def reaches(more: int) -> bool:
        found = math.floor(rate * more)
        return _unreviewed_lower(pool, known_wrong + found, unreviewed - more, sampled + more, wrong + found,
                                 confidence) >= target

    if reaches(0):
        return 0
    # a skipped value is sampled (counted wrong) and still unreviewed: the pool bounds the sample, not these
    low, high = 0, max(1, min(unreviewed, pool - sampled))
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if reaches(mid) else (mid, high)
    return high


# --- the certificate ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Certificate:
    """The statement a review makes of the values nobody reviewed, overall and per field, at ``confidence``
    (with ``target``: how far from it), for the values whose ``fingerprint`` it carries; ``stale`` when read back
    over values that changed since."""

    confidence: float
    overall: Bound
    fields: tuple[Bound, ...]
    seed: int
    fingerprint: str
    target: float | None = None
    stale: bool = False

    @property
    def reached(self) -> bool:
        """Whether the target is reached (False with no target)."""
        return self.target is not None and self.overall.lower >= self.target

    def statement(self) -> str:
        text = self.overall.statement(self.confidence, self.target)
        return text + ("  (stale: the map's values changed since; review again to certify them)" if self.stale
                       else "")

    def lines(self) -> list[str]:
        """The statement, then one line a field."""
        return [self.statement()] + ["  " + b.statement(self.confidence, self.target) for b in self.fields]

    def __str__(self) -> str:
        return "\n".join(self.lines())

    def to_json(self) -> dict[str, Any]:
        return {"format": CERTIFICATE_FORMAT, "statement": self.overall.statement(self.confidence, self.target),
                "confidence": self.confidence, "target": self.target, "method": METHOD, "seed": self.seed,
                "fingerprint": self.fingerprint, "overall": self.overall.to_json(),
                "fields": [b.to_json() for b in self.fields], **({"stale": True} if self.stale else {})}

    @classmethod
    def from_json(cls, data: Any) -> "Certificate":
        """A certificate.json read back (``ValueError`` when it is not one this module wrote)."""
        if not isinstance(data, dict) or data.get("format") != CERTIFICATE_FORMAT:
            raise ValueError(f"no \"format\": \"{CERTIFICATE_FORMAT}\"")
        confidence, target = data.get("confidence"), data.get("target")
        if not _share(confidence) or not (target is None or _share(target)):
            raise ValueError("a confidence or target that is not a share from 0 to 1")
        if not isinstance(data.get("seed"), int) or not isinstance(data.get("fingerprint"), str):
            raise ValueError("no seed or fingerprint")
        fields = data.get("fields")
        if not isinstance(fields, list):
            raise ValueError("fields that are not a list")
        return cls(float(confidence), _bound(data.get("overall")), tuple(_bound(f) for f in fields), data["seed"],
                   data["fingerprint"], None if target is None else float(target))


def _share(value: Any) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0.0 <= value <= 1.0


def _bound(data: Any) -> Bound:
    if not isinstance(data, dict):
        raise ValueError("a bound that is not an object")
    counts: list[int] = []
    for k in ("values", "reviewed", "corrected", "unreviewed", "sampled", "wrong"):
        count = data.get(k)
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise ValueError("counts that are not whole numbers")
        counts.append(count)
    name, lower, needed = data.get("field"), data.get("lower"), data.get("needed")
    if not (name is None or isinstance(name, str)) or not _share(lower):
        raise ValueError("a field that is not a path, or a bound that is not a share")
    if not (needed is None or isinstance(needed, int) and not isinstance(needed, bool) and needed >= 0):
        raise ValueError("a count needed that is not a whole number")
    values, reviewed, corrected, unreviewed, sampled, wrong = counts
    return Bound(name, values, reviewed, corrected, unreviewed, sampled, wrong, float(lower or 0.0), needed)


def certify(rows: Sequence[ValueRow], decided: Mapping[Place, Review], skipped: set[Place], seed: int, *,
            confidence: float = DEFAULT_CONFIDENCE, target: float | None = None,
            order: Sequence[Place] | None = None) -> Certificate:
    """The certificate of the values ``rows`` as reviewed so far (``decided``, ``skipped``: ``ReviewBook``'s),
    from the sample ``seed`` draws (``order``: ``sample_order(rows, seed)``, where the caller has it)."""
    check_share("confidence", confidence, open_ends=True)
    if target is not None:
        check_share("target", target, open_ends=True)
    order = sample_order(rows, seed) if order is None else order
    stratum = strata(rows)
    by_field: dict[str, list[Place]] = {}  # in the order the fields first appear in the results
    for row in sorted(rows, key=lambda r: (r.item, r.order)):
        by_field.setdefault(row.field, []).append((row.item, row.field))
    everything = [(row.item, row.field) for row in rows]
    overall = bound_of(None, everything, order, stratum, decided, skipped, confidence, target)
    fields = tuple(bound_of(name, places, order, stratum, decided, skipped, confidence, target)
                   for name, places in by_field.items())
    return Certificate(confidence, overall, fields, seed, fingerprint(rows), target)


def check_share(name: str, value: Any, *, open_ends: bool = False) -> float:
    """``value`` as a share from 0 to 1 (``open_ends``: strictly between); ``ReviewError`` naming ``name``."""
    ok = _share(value) and (not open_ends or 0.0 < value < 1.0)
    if not ok:
        between = "strictly between 0 and 1" if open_ends else "from 0 to 1"
        raise ReviewError(f"{name} is a share {between} (0.95 is 95%), not {value!r}")
    return float(value)


def write_certificate(run_dir: str | os.PathLike, certificate: Certificate) -> None:
    """Keep ``certificate`` as ``run_dir/certificate.json`` (whole, atomically)."""
    fsync_write(Path(run_dir) / CERTIFICATE, json.dumps(certificate.to_json(), indent=2) + "\n")


def read_certificate(run_dir: str | os.PathLike, current: Callable[[], str] | None = None) -> Certificate | None:
    """The certificate kept in ``run_dir`` (None without one), ``stale`` where ``current()`` -- the fingerprint
    of the values now -- is not the one it was made on; ``FolderError`` for one that is not a certificate."""
    path = Path(run_dir) / CERTIFICATE
    data = read_folder_json(path, MAX_CERTIFICATE_BYTES)
    if data is None:
        return None
    try:
        certificate = Certificate.from_json(data)
    except ValueError as e:
        raise FolderError(f"{shown(path)} is not a certificate a review wrote ({e}); the run folder was edited or "
                          f"is damaged") from None
    if current is not None and current() != certificate.fingerprint:
        certificate = Certificate(certificate.confidence, certificate.overall, certificate.fields, certificate.seed,
                                  certificate.fingerprint, certificate.target, stale=True)
    return certificate


__all__ = ["PLAN_FORMAT", "CERTIFICATE_FORMAT", "DEFAULT_CONFIDENCE", "STRATA_PER_FIELD", "MIN_STRATUM", "METHOD",
           "MAX_CERTIFICATE_BYTES", "PRIOR", "plan_seed", "strata", "sample_order", "fingerprint", "most_wrong",
           "log_prior_posterior_ratio", "Bound", "percent", "bound_of", "Certificate", "certify", "check_share", "write_certificate", "read_certificate"]

"""The cascade's bound: the exact Clopper-Pearson figures against scipy's own ``binomtest``, the threshold chosen
on populations made by hand, and the guarantee itself -- over any scores and any agreement pattern (Hypothesis),
and in a 1,000-run simulation -- measured as how often the threshold certified is one the full data refutes."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import binom, binomtest

from tensorjob_jupyter.fanout.cascade_bound import (
    certify, check_delta, check_target, default_sample_size, draw_sample, lower_bound, needed, simulate,
)


@pytest.mark.parametrize("k, n, delta", [(0, 10, 0.1), (3, 10, 0.1), (10, 10, 0.05), (29, 30, 0.1), (1, 1, 0.2),
                                         (150, 200, 0.01)])
def test_the_lower_bound_is_scipys_exact_one_sided_interval(k, n, delta):
    expected = binomtest(k, n).proportion_ci(confidence_level=1 - 2 * delta, method="exact").low
    assert lower_bound(k, n, delta) == pytest.approx(expected, abs=1e-9)


def test_the_fewest_items_that_can_certify_a_target():
    assert needed(0.9, 0.1) == 22
    assert lower_bound(22, 22, 0.1) >= 0.9 > lower_bound(21, 21, 0.1)
    assert needed(0.5, 0.1) == 4 and needed(1.0, 0.1) is None
    assert default_sample_size(60, 0.9, 0.1) == 60 and default_sample_size(1000, 0.9, 0.1) == 110


@pytest.mark.parametrize("bad", [0, -0.1, 1.01, "0.9", True, float("nan")])
def test_a_target_outside_0_1_is_one_line(bad):
    with pytest.raises(ValueError, match=r"^--target .*over 0 and at most 1"):
        check_target(bad)


@pytest.mark.parametrize("bad", [0, 1, 1.5, -0.2, None])
def test_a_delta_outside_0_1_is_one_line(bad):
    with pytest.raises(ValueError, match=r"^--delta .*over 0 and under 1"):
        check_delta(bad)


def test_the_sample_is_seeded_uniform_and_in_item_order():
    a, b = draw_sample(100, 20, 7), draw_sample(100, 20, 7)
    assert a == b == sorted(set(a)) and len(a) == 20 and a != draw_sample(100, 20, 8)
    assert draw_sample(5, 20, 1) == [0, 1, 2, 3, 4]


def test_a_proxy_that_always_agrees_is_certified_at_its_lowest_score():
    scores = [i / 200 for i in range(200)]
    sample = draw_sample(200, 120, 1)
    got = certify(scores, sample, {i: True for i in sample}, 0.9, 0.1)
    assert got.threshold == 0.0 and got.above == 200 and got.bound >= 0.9
    assert [s.passed for s in got.steps] == [True] * len(got.steps)


def test_a_proxy_that_disagrees_low_is_cut_where_its_agreement_ends():
    scores = [i / 400 for i in range(400)]
    agree = {i: i >= 200 for i in range(400)}  # the upper half always agrees, the lower half never
    sample = draw_sample(400, 200, 3)
    got = certify(scores, sample, agree, 0.9, 0.1)
    assert got.threshold is not None and 0.4 <= got.threshold <= 0.6
    assert not got.steps[-1].passed  # it stopped at its first failure


def test_no_scores_too_small_a_sample_or_a_target_of_one_certify_nothing_and_say_why():
    assert "no item has a proxy score" in certify([None] * 50, list(range(30)), {}, 0.9, 0.1).reason
    small = certify([0.5] * 50, list(range(10)), {i: True for i in range(10)}, 0.9, 0.1)
    assert small.threshold is None and "the bound needs at least 22" in small.reason
    assert "a target of 1" in certify([0.5] * 50, list(range(50)), {}, 1.0, 0.1).reason
    worst = certify([0.5] * 50, list(range(40)), {i: False for i in range(40)}, 0.9, 0.1)
    assert worst.threshold is None and "every item goes to the oracle" in worst.reason


def violations(scores, agree, target, delta, size, runs, seed):
    """How many of ``runs`` samples certified a threshold whose items, in the full data, agree under target."""
    bad = 0
    for r in range(runs):
        sample = draw_sample(len(scores), size, seed + r)
        got = certify(scores, sample, {i: agree[i] for i in sample}, target, delta)
        if got.threshold is None:
            continue
        above = [i for i, s in enumerate(scores) if s is not None and s >= got.threshold]
        bad += sum(agree[i] for i in above) < target * len(above)
    return bad


def unlikely_under_delta(bad: int, runs: int, delta: float) -> bool:
    """Whether ``bad`` violations in ``runs`` would be a surprise (p < 1e-4) if the true rate were ``delta``."""
    return binom.sf(bad - 1, runs, delta) < 1e-4


populations = st.integers(20, 70).flatmap(lambda n: st.tuples(
    st.lists(st.one_of(st.none(), st.sampled_from([0.0, 0.25, 0.5, 0.75, 1.0]), st.floats(0, 1)),
             min_size=n, max_size=n),
    st.lists(st.booleans(), min_size=n, max_size=n)))


@settings(max_examples=40)
@given(populations, st.sampled_from([0.5, 0.7, 0.8, 0.9]), st.sampled_from([0.05, 0.1, 0.2]),
       st.floats(0.4, 1.0), st.integers(0, 10**6))
def test_any_scores_and_agreements_a_refuted_threshold_is_certified_at_most_delta_of_the_time(
        population, target, delta, share, seed):
    scores, agree = population
    runs = 120
    bad = violations(scores, agree, target, delta, max(1, int(share * len(scores))), runs, seed)
    assert not unlikely_under_delta(bad, runs, delta), (bad, runs)


def adversarial(n: int, target: float, rng: random.Random) -> tuple[list[float], list[bool]]:
    """Scores that rank well, with the agreement of every upper band just under or at the target: the thresholds
    a sample can most easily be fooled by."""
    scores = [rng.random() for _ in range(n)]
    agree = [rng.random() < target - 0.03 + 0.1 * s for s in scores]
    return scores, agree


def just_under(n: int, target: float, rng: random.Random) -> tuple[list[float], list[bool]]:
    """A score with no signal and every item's agreement just under the target: any threshold certified is wrong."""
    agree = [i < int((target - 0.01) * n) for i in range(n)]
    rng.shuffle(agree)
    return [rng.random() for _ in range(n)], agree


@pytest.mark.parametrize("population", [adversarial, just_under])
@pytest.mark.parametrize("target, delta", [(0.9, 0.1), (0.8, 0.05)])
def test_a_thousand_runs_violate_the_target_at_most_about_delta_of_the_time(population, target, delta):
    scores, agree = population(600, target, random.Random(11))
    sim = simulate(scores, agree, target, delta, sample_size=200, runs=1000, seed=5)
    assert sim.runs == 1000 and sim.certified > 0
    assert sim.violation_rate <= delta + 3 * (delta * (1 - delta) / 1000) ** 0.5, sim
    assert sim.agreement >= target  # the cascade's answers as a whole, on average

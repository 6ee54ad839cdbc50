"""How sure a mean score over n items is: the Wilson score interval, and when a mean is too thin to trust.

    low, high = wilson_interval(0.8, 40)     # 95%: (0.65, 0.90)

One place for the statistics, so a map's summary (``score_summary``) and a comparison of two maps
(``history.map_compare``) state the same interval in the same words (``INTERVAL_METHOD``).

Design: docs/internals/fanout.md#scoringpy
"""

from __future__ import annotations

import math

#: How sure an interval is, and the normal quantile that gives it.
CONFIDENCE = 0.95
_Z = 1.959963984540054
#: How the intervals are computed, in the summary's words.
INTERVAL_METHOD = "Wilson score interval, 95%"


def wilson_interval(mean: float, n: int, z: float = _Z) -> tuple[float, float]:
    """The Wilson score interval around a share ``mean`` of ``n`` items (95% by default).

    For pass/fail it is the textbook interval; for scores between 0 and 1 it is conservative (wider than
    needed), since such scores vary at most as much as pass/fail with the same mean does."""
    if n <= 0:
        return (0.0, 1.0)
    mean = min(1.0, max(0.0, mean))
    z2 = z * z
    centre = (mean + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(mean * (1 - mean) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return (max(0.0, min(mean, centre - half)), min(1.0, max(mean, centre + half)))


#: Scored items under which a summary says its mean is thin.
THIN = 30


__all__ = ["CONFIDENCE", "INTERVAL_METHOD", "THIN", "wilson_interval"]

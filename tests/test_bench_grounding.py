"""bench/bench_grounding.py's places section on a few invoices: the figures it prints rest on a detector that
holds its goals on the bench's own documents (six languages, four fields, wrong places, inventions, forgeries)."""

import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import bench_grounding  # noqa: E402


def test_not_grounded_tells_wrong_values_from_right_ones_on_invoices_in_six_languages():
    figures = bench_grounding.places(24, random.Random(7))
    counts = figures["counts"]
    assert counts["forged"][0] == counts["forged"][1], "no one-character forgery is grounded"
    assert counts["elsewhere"][0] >= 0.85 * counts["elsewhere"][1], counts
    assert figures["recall"] >= 0.85 and figures["precision"] >= 0.95, figures
    assert all(ok == n for ok, n in figures["right_found_by_language"].values()), figures["right_found_by_language"]


def test_the_labelled_detector_counts_a_null_as_flagged_and_judges_numbers_within_a_cent():
    assert bench_grounding.is_right(1234.56, 1234.561) and not bench_grounding.is_right(1234.5, 1234.56)
    assert bench_grounding.is_right(" acme gmbh", "ACME GmbH") and not bench_grounding.is_right(None, "ACME GmbH")
    assert not bench_grounding.is_right(True, 1)  # a boolean is not a number here
    values = [("a", True, True), ("a", False, None), ("b", False, False), ("b", True, False), ("c", False, True)]
    d = bench_grounding.detector(values)
    assert (d["flagged"], d["wrong"], d["values"]) == (3, 3, 5)
    assert d["precision"] == 2 / 3 and d["recall"] == 2 / 3

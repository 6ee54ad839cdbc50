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

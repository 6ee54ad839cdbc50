"""Review, correct, certify: how many reviews a labelled map needs before its final values are certified.

Run from the repository root::

    python bench/bench_review.py                  # 30 notes + 30 invoices on the embedded model, ~5 min
    python bench/bench_review.py --run-dir DIR    # again over a map made before (kept with --keep DIR)

A labelled map of ``guests/examples/extract.c`` on the embedded model over two kinds of document (bench_grounding's
notes and invoices in six languages), then a simulated reviewer that answers from the labels (accept a right value,
correct a wrong one) drives the review three ways, each to the point where the final values (the corrections
included) are certified at least 0.90 and 0.95 right overall at 95% confidence:

* **the tool's order** (``ReviewQueue``: the doubtful values first, a stratified sample of the rest beside them,
  the confidence sequence on the values nobody reviewed, valid wherever it stops), run on a copy of the map's
  folder as a user would;
* **a uniformly random order** (the plain sampling baseline: every value reviewed is corrected, the rest bounded by
  the same confidence sequence on the sample so far), the median over 200 orders;
* **everything** reviewed.

Then the bound's realised violation rate: 1,000 maps resampled from the recorded values (each value's score and
whether it was right), each reviewed by the tool's policy until it certifies 0.90, counting the runs whose stated
bound on the unreviewed values is above their true share right (at most the stated 5%). Goal: 0.90 certified
with at most 0.6x the reviews the random order needs.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import tensorjob_jupyter as tj  # noqa: E402
from tensorjob_jupyter.fanout.certify import certify, most_wrong, sample_order  # noqa: E402
from tensorjob_jupyter.fanout.review_queue import (  # noqa: E402
    DEFAULT_SAMPLE_SHARE, DOUBT, SAMPLE, ReviewQueue, turn_for,
)
from tensorjob_jupyter.fanout.review_rows import ValueRow, doubtful_first  # noqa: E402
from tensorjob_jupyter.fanout.reviews import new_review  # noqa: E402

from bench_grounding import EXTRACT, is_right, labelled_sets  # noqa: E402

TARGETS = (0.90, 0.95)
CONFIDENCE = 0.95


def make_map(n: int, tmp: Path, quote: bool = False) -> tuple[Path, list[dict]]:
    """The labelled map: ``n`` notes and ``n`` invoices, one run folder; the truths by item (``quote``: the string
    fields in quote mode)."""
    sets = labelled_sets(n, random.Random(55), tmp)
    items, truths, read = [], [], []
    for folder, kind_items, kind_truths in sets.values():
        items += [{**item, "quote": quote} for item in kind_items]
        truths += kind_truths
        read.append(folder)
    run_dir = tmp / "map"
    started = time.perf_counter()
    result = tj.map(EXTRACT, items, run_dir, read=read)
    print(f"  map: {result.completed} of {len(items)} items completed on the embedded model in "
          f"{time.perf_counter() - started:.0f} s", flush=True)
    (run_dir / "truths.json").write_text(json.dumps(truths), encoding="utf-8")
    return run_dir, truths


def truth_of(truths: list[dict], row: ValueRow) -> object:
    return truths[row.item].get(row.field.split(".")[-1])


def overall_final(certificate, values: int) -> float:
    """The lower bound on the share right of all final values: those reviewed are right (corrected), the rest
    at least the certificate's bound."""
    b = certificate.overall
    return (b.reviewed + b.lower * b.unreviewed) / values


def tool_order(run_dir: Path, truths: list[dict], tmp: Path, sample_share: float | None = None) -> dict:
    """The review as a user runs it, on a copy of the map's folder: reviews needed for each target."""
    copy = tmp / "tool"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(run_dir, copy)
    shares = {} if sample_share is None else {"sample_share": sample_share}
    queue = ReviewQueue(copy, confidence=CONFIDENCE, seed=7, **shares)
    values = len(queue.rows)
    right_of = {(r.item, r.field): is_right(r.value, truth_of(truths, r)) for r in queue.rows}
    needed: dict[float, dict] = {}
    reviews = 0
    while len(needed) < len(TARGETS):
        shown = queue.next()
        if shown is None:
            break
        row = shown.row
        if right_of[(row.item, row.field)]:
            certificate = queue.decide("accept")
        else:
            truth = truth_of(truths, row)
            certificate = queue.decide("null") if truth is None else queue.decide("correct", truth)
        reviews += 1
        bound = overall_final(certificate, values)
        for target in TARGETS:
            if target not in needed and bound >= target:
                decided = set(queue.book.decided)
                final_right = sum(1 for place, right in right_of.items() if right or place in decided)
                needed[target] = {"reviews": reviews, "bound": bound, "final_accuracy": final_right / values,
                                  "statement": certificate.statement()}
    return {"values": values, "model_right": sum(right_of.values()), "needed": needed}


def random_order(rights: list[bool], rng: random.Random, rounds: int = 200) -> dict[float, float]:
    """The median reviews a uniformly random order needs to certify each target (plain sampling)."""
    n = len(rights)
    found: dict[float, list[int]] = {t: [] for t in TARGETS}
    for _ in range(rounds):
        order = rights[:]
        rng.shuffle(order)
        wrong = 0
        pending = list(TARGETS)
        for k, ok in enumerate(order, 1):
            wrong += not ok  # found and corrected; the rest bounded by the same confidence sequence
            bound = 1 - min(n - k, most_wrong(n, k, wrong, CONFIDENCE) - wrong) / n
            for target in list(pending):
                if bound >= target:
                    found[target].append(k)
                    pending.remove(target)
            if not pending:
                break
        for target in pending:
            found[target].append(n)
    return {t: statistics.median(ks) for t, ks in found.items()}


def corrections_needed(rights: list[bool]) -> dict[float, int]:
    """The fewest reviews any order needs for each target: the final values must truly be that right, so all but
    ``(1 - target) * n`` of the wrong values must be corrected (a floor no order can go under)."""
    n, wrong = len(rights), rights.count(False)
    return {t: max(0, wrong - math.floor((1 - t) * n + 1e-9)) for t in TARGETS}


def simulated_violations(population: list[tuple[float, bool, str]], values: int, runs: int, target: float,
                         rng: random.Random, sample_share: float = 0.5) -> dict:
    """The tool's policy on ``runs`` maps resampled from ``population`` (score, right, field): how often the
    stated bound on the unreviewed values was above their true share right, where it certified ``target``."""
    violated = certified = 0
    for run in range(runs):
        drawn = [rng.choice(population) for _ in range(values)]
        rows = [ValueRow(i, str(i), field, "v", None, None, None, None, None, score, "least_confidence", 0)
                for i, (score, _, field) in enumerate(drawn)]
        right = {(i, field): ok for i, (_, ok, field) in enumerate(drawn)}
        doubt = [(r.item, r.field) for r in doubtful_first(rows)]
        sample = sample_order(rows, run)
        decided: dict = {}
        turns = {DOUBT: 0, SAMPLE: 0}
        queues = {DOUBT: iter(doubt), SAMPLE: iter(sample)}
        stated = None
        while len(decided) < values:
            pick = turn_for(turns, sample_share)  # the queue's own rule
            place = next((p for p in queues[pick] if p not in decided), None)
            if place is None:
                pick = DOUBT if pick == SAMPLE else SAMPLE
                place = next((p for p in queues[pick] if p not in decided), None)
            turns[pick] += 1
            decided[place] = new_review(place[0], str(place[0]), place[1], "v",
                                        "accept" if right[place] else "correct", None if right[place] else "w")
            certificate = certify(rows, decided, set(), run, confidence=CONFIDENCE, order=sample)
            if overall_final(certificate, values) >= target:
                stated = certificate.overall
                break
        if stated is None or not stated.unreviewed:
            continue
        certified += 1
        unreviewed = [ok for place, ok in right.items() if place not in decided]
        violated += sum(unreviewed) / len(unreviewed) < stated.lower
    return {"runs": runs, "certified": certified, "violated": violated,
            "rate": violated / certified if certified else None}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=30, help="documents of each kind (default 30: 60 items)")
    parser.add_argument("--run-dir", type=Path, help="a map made before by this bench (--keep): no model run")
    parser.add_argument("--keep", type=Path, help="keep the map's folder here, for --run-dir")
    parser.add_argument("--simulations", type=int, default=1000)
    parser.add_argument("--quote", action="store_true", help="map the string fields in quote mode (a map more right)")
    parser.add_argument("--sample-share", type=float, default=None,
                        help="the share of the queue's turns given to the sample (ReviewQueue's sample_share)")
    args = parser.parse_args()
    print(f"load: {os.getloadavg()[0]:.2f}", flush=True)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        if args.run_dir is not None:
            run_dir = args.run_dir
            truths = json.loads((run_dir / "truths.json").read_text(encoding="utf-8"))
        else:
            run_dir, truths = make_map(args.items, tmp, args.quote)
            if args.keep is not None:
                shutil.copytree(run_dir, args.keep, dirs_exist_ok=True)
        started = time.perf_counter()
        tool = tool_order(run_dir, truths, tmp, args.sample_share)
        tool_s = time.perf_counter() - started
        rows = ReviewQueue(tmp / "tool", confidence=CONFIDENCE, seed=7).rows
    rights = [is_right(r.value, truth_of(truths, r)) for r in rows]
    values = len(rows)
    rng = random.Random(3)
    plain = random_order(rights, rng)
    floor = corrections_needed(rights)
    print(f"  {values} values ({tool['model_right']} right as the model gave them: "
          f"{tool['model_right'] / values:.3f}); the tool's review took {tool_s:.1f} s of host time in all")
    figures: dict = {"values": values, "model_accuracy": tool["model_right"] / values, "targets": {}}
    for target in TARGETS:
        mine = tool["needed"].get(target)
        k = mine["reviews"] if mine else values
        ratio = k / plain[target] if plain[target] else float("nan")
        print(f"  certify {target:.2f} at {CONFIDENCE:.0%}: the tool's order {k} reviews, random order "
              f"{plain[target]:.0f} (median of 200), everything {values}; no order under {floor[target]} (the wrong "
              f"values that must be corrected: {floor[target] / plain[target]:.2f}x random): {ratio:.2f}x random"
              + ("  (goal <= 0.6x)" if target == 0.90 else ""))
        if mine:
            print(f"      final accuracy then {mine['final_accuracy']:.3f} (bound {mine['bound']:.3f}); "
                  f"\"{mine['statement']}\"")
        figures["targets"][str(target)] = {"tool": k, "random_median": plain[target], "everything": values,
                                           "corrections_needed": floor[target],
                                           "ratio": ratio, **({"final_accuracy": mine["final_accuracy"]} if mine else {})}
    population = [(r.score, ok, r.field) for r, ok in zip(rows, rights)]
    started = time.perf_counter()
    share = args.sample_share if args.sample_share is not None else DEFAULT_SAMPLE_SHARE
    v = simulated_violations(population, values, args.simulations, 0.90, random.Random(11), share)
    print(f"  violations: {v['violated']} of {v['certified']} certified runs ({v['runs']} resampled maps) stated a "
          f"bound above the unreviewed values' true share right: rate {v['rate'] if v['rate'] is None else round(v['rate'], 4)}"
          f" (at most {1 - CONFIDENCE:.0%}); {time.perf_counter() - started:.0f} s")
    figures["violations"] = v
    print(f"load: {os.getloadavg()[0]:.2f}")
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())

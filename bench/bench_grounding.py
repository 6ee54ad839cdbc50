"""Sources: how well the locator finds a result's fields in what a job read, and what it costs.

Run from the repository root::

    python bench/bench_grounding.py           # 400 documents, 40 jobs
    python bench/bench_grounding.py --quick   # 100 documents, 10 jobs
    python bench/bench_grounding.py --real    # also: the share of item time on the embedded model

1. **Precision and recall** against true spans: documents made here, each with fields planted at known byte
   offsets, given to ``host.grounding.locate`` as exact values and as the normalised spellings a model writes
   (case changed, digit groups dropped, ISO dates of spelled-out days, runs of spaces). A field counts as found
   right when its best source overlaps its true span. Goal: >= 0.95 each.
2. **Planted values flagged**: values in no document (what a scripted model invents) must be found nowhere.
   Goal: 100%.
3. **Cost**: jobs that slice a 4 KiB document and return 12 fields, with the locator timed inside each job,
   against the same job's own wall time (the baseline, measured in the same run): the locator's share of item
   time. ``--real``: the same for ``guests/examples/extract.c`` on the embedded model. Goal: <= 2%.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import tensorjob_jupyter as tj  # noqa: E402
from tensorjob_jupyter.host import grounding, reactor  # noqa: E402
from tensorjob_jupyter.host.windows import Place, Segment  # noqa: E402

WORDS = ("report invoice customer order kettle widget battery charger delivery refund warranty model serial "
         "account branch office quarter revenue growth market team meeting review policy").split()
NAMES = ("Ann Lee", "Zoë Ångström", "Bo Ng", "José Müller", "Łukasz Wiśniewski", "Søren Kierkegaard")


def filler(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def make_document(rng: random.Random) -> tuple[str, list[tuple[object, str, int, int]]]:
    """A document and its fields: (value as a model would write it, kind, true start, true end) in bytes."""
    parts, fields, pos = [], [], 0

    def put(text: str, value: object, kind: str) -> None:
        nonlocal pos
        gap = filler(rng, rng.randint(5, 30)) + " "
        parts.append(gap)
        pos += len(gap.encode())
        start = pos
        parts.append(text)
        pos += len(text.encode())
        fields.append((value, kind, start, pos))
        parts.append(". ")
        pos += 2

    name, other = rng.sample(NAMES, 2)  # two values: a field's true span is its only one
    put(name, name, "exact")
    put(other.upper(), other, "normalised")
    n = rng.randint(1000, 10**9)
    put(f"{n:,}", n, "normalised")
    put(str(n + 7), n + 7, "exact")
    day = datetime.date(2000, 1, 1) + datetime.timedelta(days=rng.randint(0, 9000))
    put(day.strftime("%B %-d, %Y"), day.isoformat(), "normalised")
    phrase = filler(rng, 4)
    put(phrase.replace(" ", "   "), phrase, "normalised")
    serial = f"SN-{rng.randint(10**5, 10**6)}"
    put(serial, serial, "exact")
    parts.append(filler(rng, 20))
    return "".join(parts), fields


def quality(n_docs: int, rng: random.Random) -> dict:
    right = {"exact": 0, "normalised": 0}
    total = dict(right)
    found = dict(right)
    planted = flagged = 0
    for i in range(n_docs):
        text, fields = make_document(rng)
        segment = [Segment(Place(file=f"/bench/{i}.txt"), 0, text.encode())]
        result = {f"f{k}": value for k, (value, _, _, _) in enumerate(fields)}
        invented = [f"{rng.choice(NAMES)} Jr", f"{filler(rng, 3)} {rng.randint(10**9, 10**10)}"]
        result.update({f"planted{k}": v for k, v in enumerate(invented)})
        sources = grounding.locate(result, segment)
        for k, (_, kind, start, end) in enumerate(fields):
            total[kind] += 1
            got = sources.get(f"f{k}") or []
            if got:
                found[kind] += 1
                if got[0]["start"] < end and start < got[0]["end"]:
                    right[kind] += 1
        for k in range(len(invented)):
            planted += 1
            flagged += sources.get(f"planted{k}") == []
    return {kind: {"precision": right[kind] / max(1, found[kind]), "recall": right[kind] / max(1, total[kind]),
                   "fields": total[kind]} for kind in total} | {"planted_flagged": flagged / planted,
                                                                 "planted": planted}


class Timed:
    """``reactor.ground`` timed: the locator's seconds, summed."""

    def __init__(self):
        self.seconds, self.calls, self._ground = 0.0, 0, reactor.ground

    def __enter__(self):
        def ground(*args, **kwargs):
            t = time.perf_counter()
            try:
                return self._ground(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t
                self.calls += 1
        reactor.ground = ground
        return self

    def __exit__(self, *exc):
        reactor.ground = self._ground


def cost(jobs: int, rng: random.Random, tmp: Path, *, real: bool) -> dict:
    docs = tmp / "docs"
    docs.mkdir(exist_ok=True)
    paths = []
    for i in range(jobs):
        text, _ = make_document(rng)
        path = docs / f"d{i}.txt"
        path.write_text((text + " ") * max(1, 4096 // len(text)), encoding="utf-8")
        paths.append(path)
    if real:
        guest = ROOT / "guests" / "examples" / "extract.c"
        inputs = [{"path": str(p), "max_tokens": 160, "window": 2048} for p in paths]
        model = None
    else:
        guest = ROOT / "tests" / "guests" / "quote.c"
        inputs = [{"path": str(p), "claim": {f"c{k}": rng.choice(WORDS) + " " + rng.choice(WORDS) for k in range(11)}}
                  for p in paths]
        model = None
    item_s = []
    with Timed() as timed:
        for given in inputs:
            t = time.perf_counter()
            envelope = tj.Job(guest, input=given, read=[docs], runs_dir=tmp / "runs", model=model).start().wait(600)
            item_s.append(time.perf_counter() - t)
            if not envelope.ok:
                raise SystemExit(f"a bench job failed: {envelope.error}")
    total = sum(item_s)
    return {"jobs": jobs, "item_ms_median": 1000 * statistics.median(item_s),
            "locate_ms_mean": 1000 * timed.seconds / max(1, timed.calls), "share": timed.seconds / total}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--real", action="store_true")
    args = parser.parse_args()
    rng = random.Random(36)
    n_docs, jobs = (100, 10) if args.quick else (400, 40)
    print(f"load: {os.getloadavg()[0]:.2f}")
    q = quality(n_docs, rng)
    for kind in ("exact", "normalised"):
        print(f"{kind:>10}: precision {q[kind]['precision']:.3f}  recall {q[kind]['recall']:.3f}  "
              f"({q[kind]['fields']} fields; goal >= 0.95 each)")
    print(f"   planted: {q['planted_flagged']:.1%} of {q['planted']} flagged not found (goal 100%)")
    summary = {"quality": q}
    with tempfile.TemporaryDirectory() as tmp:
        tj.Job(ROOT / "tests" / "guests" / "quote.c", input={"path": "/", "claim": 0})  # compiled once, not timed
        c = cost(jobs, rng, Path(tmp), real=False)
        print(f"  scripted: locator {c['locate_ms_mean']:.3f} ms a job against an item of {c['item_ms_median']:.1f} ms"
              f" (median): {c['share']:.2%} of item time (goal <= 2%)")
        summary["cost"] = c
        if args.real:
            r = cost(max(3, jobs // 8), rng, Path(tmp), real=True)
            print(f"  embedded: locator {r['locate_ms_mean']:.3f} ms a job against an item of "
                  f"{r['item_ms_median']:.1f} ms (median): {r['share']:.2%} of item time (goal <= 2%)")
            summary["cost_real"] = r
    print(f"load: {os.getloadavg()[0]:.2f}")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())

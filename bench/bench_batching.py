"""Continuous batching on the embedded model: a map's requests, this code against ``--baseline``'s.

    python bench/bench_batching.py [--items 32] [--rounds 3] [--baseline REF|none] [--long-answers]

The model side of the map users run first (bench/map_vs_plain.py's reports: extract.c's prompt, its JSON
Schema held by the grammar, greedy, repetition penalty 1.1, the chat template), sent to one model's worker
as a map sends them: ``--concurrency`` in flight (default 4, the engine's slots), the next sent as soon as
one is answered, so items start while others decode. Each code runs in a fresh process (the baseline
checked out with ``git archive``), the model loaded and one request answered before the clock starts;
rounds interleave the two codes, and each figure is the median round.

Per code: items/s and tokens/s; time to first token (median, p95); the gap between a running item's tokens
(median, p95) over all of them, and over those gaps during which another item was starting (sent, its
first token not yet out) -- where a prompt read in a pass of its own holds the running items. Goals (issue
39): the p95 gap while items start <= 2x the median gap, and items/s >= 1.1x the baseline's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_host_map import checkout, load  # noqa: E402  (the same checkout and load reading)
from map_vs_plain import LONG_SCHEMA, SCHEMA, WINDOW, PROMPT, reports  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

CHILD = r'''
import json, sys, threading, time
from tensorjob_jupyter.inference.base import Constraint, GenerateRequest, Sampler
from tensorjob_jupyter.inference.models import get_backend

payload = json.loads(sys.stdin.read())
backend = get_backend()
schema = json.dumps(payload["schema"], sort_keys=True, separators=(",", ":"))

def request(prompt):
    return GenerateRequest(prompt, payload["max_tokens"], sampler=Sampler(repeat_penalty=1.1), chat=True,
                           constraint=Constraint(schema=schema))

backend.generate_stream(request("Read the document and answer with its facts as JSON. <document>The Old Mill, "
                                "1801.</document>"), lambda t: True).result(600)
prompts = payload["prompts"]
sent, tokens, answered, texts = {}, {i: [] for i in range(len(prompts))}, {}, {}
slots = threading.Semaphore(payload["concurrency"])
all_done = threading.Event()
clock = time.perf_counter

def send(i):
    def on_token(text, i=i):
        tokens[i].append(clock())
        return True
    def finished(future, i=i):
        answered[i] = clock()
        texts[i] = future.result().text if future.exception() is None else None
        slots.release()
        if len(answered) == len(prompts):
            all_done.set()
    sent[i] = clock()
    backend.generate_stream(request(prompts[i]), on_token).add_done_callback(finished)

start = clock()
for i in range(len(prompts)):
    slots.acquire()
    send(i)
all_done.wait(3600)
print(json.dumps({"start": start, "sent": sent, "tokens": tokens, "answered": answered, "texts": texts}))
'''


def figures(raw: dict) -> dict:
    """items/s, tokens/s, first-token and gap percentiles from one child's timings."""
    sent = {int(k): v for k, v in raw["sent"].items()}
    tokens = {int(k): v for k, v in raw["tokens"].items()}
    end = max(raw["answered"].values())
    wall = end - raw["start"]
    starting = [(sent[i], ts[0]) for i, ts in tokens.items() if ts]  # an item sent, its first token not yet out
    gaps, gaps_starting = [], []
    for i, ts in tokens.items():
        for a, b in zip(ts, ts[1:]):
            gaps.append(b - a)
            if any(s < b and f > a for j, (s, f) in enumerate(starting) if j != i):
                gaps_starting.append(b - a)
    ttft = [ts[0] - sent[i] for i, ts in tokens.items() if ts]
    n_tokens = sum(len(ts) for ts in tokens.values())
    valid = sum(1 for t in raw["texts"].values() if t is not None and _is_json(t))
    return {"items_s": len(sent) / wall, "tokens_s": n_tokens / wall, "wall_s": wall,
            "ttft_median_s": statistics.median(ttft), "ttft_p95_s": _p95(ttft),
            "gap_median_s": statistics.median(gaps), "gap_p95_s": _p95(gaps),
            "gap_starting_p95_s": _p95(gaps_starting) if gaps_starting else None,
            "valid_json": valid, "items": len(sent)}


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]


def run_child(tree: Path, payload: dict) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", CHILD], input=json.dumps(payload), capture_output=True, text=True,
                         env=env, cwd=tree, timeout=3600)
    if out.returncode != 0:
        raise SystemExit(f"the child in {tree} failed:\n{out.stderr[-3000:]}")
    return figures(json.loads(out.stdout.strip().splitlines()[-1]))


def prompts(folder: Path, n: int, tag: str, schema: dict) -> list[str]:
    manifest = reports(folder, n, tag, 0, schema)
    paths = [json.loads(line)["path"] for line in manifest.read_text().splitlines()]
    return [PROMPT.format(text=Path(p).read_text(encoding="utf-8")[:WINDOW]) for p in paths]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--baseline", default="main", help="git ref whose code is the baseline (none: no baseline)")
    ap.add_argument("--long-answers", action="store_true", help="answers with a 200-400 character summary")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    schema, max_tokens = (LONG_SCHEMA, 160) if args.long_answers else (SCHEMA, 64)
    rows: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-batching-") as tmp:
        trees = {"this code": ROOT}
        if args.baseline != "none":
            trees = {f"baseline ({args.baseline})": checkout(args.baseline, Path(tmp) / "baseline"), **trees}
        for r in range(args.rounds):
            for name, tree in trees.items():
                payload = {"prompts": prompts(Path(tmp), args.items, f"r{r}-{len(rows.get(name, []))}-{name[:4]}",
                                              schema),
                           "schema": schema, "max_tokens": max_tokens, "concurrency": args.concurrency}
                row = run_child(tree, payload)
                row["load"] = load()
                rows.setdefault(name, []).append(row)
                print(f"round {r + 1} {name}: {row['items_s']:.2f} items/s, gap p95 while starting "
                      f"{row['gap_starting_p95_s'] or 0:.3f} s (median {row['gap_median_s']:.3f} s), "
                      f"load {row['load']}",
                      flush=True)
    medians = {name: {k: statistics.median(row[k] for row in rs if row[k] is not None)
                      for k in rs[0] if k != "load"} for name, rs in rows.items()}
    base = next((m for name, m in medians.items() if name.startswith("baseline")), None)
    print(f"\n{args.items} items, concurrency {args.concurrency}, {'long answers' if args.long_answers else 'default'}"
          f", median of {args.rounds}")
    print(f"{'code':<20}{'items/s':>9}{'x base':>8}{'tok/s':>8}{'ttft med':>10}{'ttft p95':>10}{'gap med':>9}"
          f"{'gap p95':>9}{'p95 starting':>14}{'/ median':>10}{'json':>7}")
    for name, m in medians.items():
        ratio = m["items_s"] / base["items_s"] if base else float("nan")
        starting = m["gap_starting_p95_s"]
        print(f"{name:<20}{m['items_s']:>9.2f}{ratio:>8.2f}{m['tokens_s']:>8.1f}{m['ttft_median_s']:>10.3f}"
              f"{m['ttft_p95_s']:>10.3f}{m['gap_median_s']:>9.3f}{m['gap_p95_s']:>9.3f}{starting:>14.3f}"
              f"{starting / m['gap_median_s']:>10.2f}{int(m['valid_json']):>4}/{int(m['items'])}")
    if args.json:
        print(json.dumps({"rows": rows, "medians": medians}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Continuous batching on the embedded model: a map's requests, this code against ``--baseline``'s.

    python bench/bench_batching.py [--items 32] [--rounds 3] [--baseline REF|none] [--long-answers]
    python bench/bench_batching.py --start-and-cancel [--rounds 3] [--baseline REF|none]

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

``--start-and-cancel`` (issue 53, items 10 and 11) runs two jobs' worth of scenes instead, each code in a fresh
process through real jobs (tj.Job, a scripted guest that infers once): [10] a job whose ~500-token prompt is being
read alone is cancelled, and another job with a one-word answer starts at once: the time from the cancel to its
first token, against the same job alone, and the cancelled prompt's tokens decoded to the end before it; [11] one
job decodes a long answer and another job's ~500-token prompt starts beside it: the running job's gaps between
tokens while it was alone (median) and while the other one started (median, p95, max), and the starter's time to
first token.
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


SCENES = r'''
import json, statistics, sys, tempfile, threading, time
sys.path.insert(0, sys.argv[1])  # the repository's tests/: scripted guests
from wat import script_guest
import tensorjob_jupyter as tj
from tensorjob_jupyter.inference import llama
from tensorjob_jupyter.inference.models import get_backend

clock = time.perf_counter
tokens, decodes = {}, []  # prompt -> token times (as the engine takes each); each decode's prompt rows and end
accept, fill, decode = llama.LlamaEngine._accept, llama.LlamaEngine._fill_batch, llama.LlamaEngine._decode

def accepting(self, seq, token):
    tokens.setdefault(seq.pending.request.prompt, []).append(clock())
    return accept(self, seq, token)

def filling(self, decoding, chunks):
    decodes.append({"prompt": sum(len(c) for c in chunks.values()), "decoding": len(decoding), "end": None})
    return fill(self, decoding, chunks)

def decoding(self):
    decode(self)
    decodes[-1]["end"] = clock()  # ran to its end (an ended one raises)

llama.LlamaEngine._accept, llama.LlamaEngine._fill_batch, llama.LlamaEngine._decode = accepting, filling, decoding
backend = get_backend()
runs = tempfile.mkdtemp(prefix="bench-batching-scenes-")

def job(prompt, max_tokens):
    guest = script_guest([{"cmd": "infer", "prompt": prompt, "max_tokens": max_tokens}, {"cmd": "done", "result": 1}])
    return tj.Job(guest, backend=backend, runs_dir=runs, job_timeout_s=3600).start()

LONG = " ".join(f"Entry {i}: the mill at station {i} ground {i * 7} sacks of grain." for i in range(25))
SHORT, RUNNING = "Say one word.", "Tell me a very long story about a dragon and a mill."
job("Say hi.", 2).wait(600)
out = {}
t = clock()
job(SHORT, 1).wait(600)
out["next_alone_s"] = tokens.pop(SHORT)[0] - t
decodes.clear()
leaving = job(LONG + " Summarise.", 4)
while not any(d["prompt"] for d in decodes):
    time.sleep(0.002)
time.sleep(0.2)
t = clock()
leaving.cancel()
following = job(SHORT, 1)
following.wait(600)
leaving.wait(600)
first = tokens.pop(SHORT)[0]
out["next_after_cancel_s"] = first - t
out["cancelled_prompt_decoded"] = sum(d["prompt"] for d in decodes
                                      if d["end"] is not None and d["end"] <= first and d["prompt"] >= 64)
tokens.clear()
running = job(RUNNING, 160)
while len(tokens.get(RUNNING, [])) < 40:
    time.sleep(0.01)
sent = clock()
starting = job(LONG + " Summarise.", 4)
starting.wait(3600)
running.wait(3600)
times, started = tokens[RUNNING], tokens[LONG + " Summarise."][0]
alone = [b - a for a, b in zip(times, times[1:]) if b <= sent]
beside = sorted(b - a for a, b in zip(times, times[1:]) if b > sent and a < started)
alone.sort()
out.update(gap_alone_median_s=alone[len(alone) // 2], gap_alone_p95_s=alone[min(len(alone) - 1, int(0.95 * len(alone)))],
           gap_starting_median_s=statistics.median(beside),
           gap_starting_p95_s=beside[min(len(beside) - 1, int(0.95 * len(beside)))], gap_starting_max_s=beside[-1],
           starter_ttft_s=started - sent)
print(json.dumps(out))
'''


def scenes(tree: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", SCENES, str(ROOT / "tests")], capture_output=True, text=True,
                         env=env, cwd=tree, timeout=3600)
    if out.returncode != 0:
        raise SystemExit(f"the scenes in {tree} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def start_and_cancel(trees: dict[str, Path], rounds: int) -> dict[str, dict]:
    rows: dict[str, list[dict]] = {}
    for r in range(rounds):
        for name, tree in trees.items():
            row = scenes(tree)
            row["load"] = load()
            rows.setdefault(name, []).append(row)
            print(f"round {r + 1} {name}: [10] next job's first token {row['next_after_cancel_s']:.2f} s after the "
                  f"cancel (alone {row['next_alone_s']:.2f} s), {row['cancelled_prompt_decoded']} cancelled prompt "
                  f"tokens decoded to the end before it; [11] gaps alone {row['gap_alone_median_s'] * 1000:.0f} ms "
                  f"(p95 {row['gap_alone_p95_s'] / row['gap_alone_median_s']:.1f}x), "
                  f"while another starts median {row['gap_starting_median_s'] / row['gap_alone_median_s']:.1f}x "
                  f"p95 {row['gap_starting_p95_s'] / row['gap_alone_median_s']:.1f}x "
                  f"max {row['gap_starting_max_s'] / row['gap_alone_median_s']:.1f}x, starter's first token "
                  f"{row['starter_ttft_s']:.1f} s; load {row['load']}", flush=True)
    medians = {name: {k: statistics.median(row[k] for row in rs) for k in rs[0] if k != "load"}
               for name, rs in rows.items()}
    print(f"\nmedian of {rounds}")
    print(f"{'code':<20}{'[10] wait':>10}{'alone':>7}{'decoded':>9}{'[11] gap':>10}{'med x':>7}{'p95 x':>7}"
          f"{'max x':>7}{'ttft':>7}")
    for name, m in medians.items():
        gap = m["gap_alone_median_s"]
        print(f"{name:<20}{m['next_after_cancel_s']:>10.2f}{m['next_alone_s']:>7.2f}"
              f"{m['cancelled_prompt_decoded']:>9.0f}{gap * 1000:>8.0f}ms{m['gap_starting_median_s'] / gap:>7.1f}"
              f"{m['gap_starting_p95_s'] / gap:>7.1f}{m['gap_starting_max_s'] / gap:>7.1f}{m['starter_ttft_s']:>7.1f}")
    return {"rows": rows, "medians": medians}


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
    ap.add_argument("--start-and-cancel", action="store_true",
                    help="issue 53's scenes: a cancel mid-prompt, and a long prompt starting beside one running job")
    args = ap.parse_args(argv)
    if args.start_and_cancel:
        with tempfile.TemporaryDirectory(prefix="bench-batching-") as tmp:
            trees = {"this code": ROOT}
            if args.baseline != "none":
                trees = {f"baseline ({args.baseline})": checkout(args.baseline, Path(tmp) / "baseline"), **trees}
            result = start_and_cancel(trees, args.rounds)
        if args.json:
            print(json.dumps(result))
        return 0
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

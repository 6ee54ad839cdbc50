"""Prefix-aware order on the embedded model: queued requests started longest-prefix-first against arrival order.

    python bench/bench_prefix_order.py [--documents 8] [--questions 4] [--concurrency 8] [--rounds 3]

The model side of a map that asks several questions of each of several documents (bench/map_vs_plain.py's
reports; the document first, then the question, so a document's items share a prompt of about 170 tokens):
the items sent in the map's order -- every document's first question, then every document's second, ... --
``--concurrency`` in flight (default 8: more items than the engine's 4 slots, so requests queue and the
engine chooses), the next sent as soon as one is answered. Two engines in the same process, each fresh a
round (its caches empty): ``LlamaEngine(prefix_order=False)``, arrival order, the baseline; and the default,
which starts first the queued request sharing the longest prefix with what a slot holds or reads. Rounds
interleave the two; each figure is the median round.

Per order: items/s, the cached share (prompt tokens whose KV came from a cache or a copy, of all prompt tokens),
the prefix copies, and how many items gave the same answer in both orders (greedy: those that differ were decoded
beside other sequences, or from a copy, and a near tie turned -- docs/maps.md, "When greedy answers can differ"). Issue
39's ask: start together the items that share the most, so the prefix copy serves more of them; report the
cached share.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from map_vs_plain import WINDOW, reports  # noqa: E402  (the same reports)

QUESTIONS = ["What is the place called? Answer in a few words.", "In which year was it completed?",
             "Who paid for the repairs?", "What happened during the war?", "Who looks after it today?",
             "What did its keeper write down?"]


def prompts(folder: Path, documents: int, questions: int, tag: str) -> list[str]:
    """The items in the map's order: question q of every document, then question q + 1 of every document."""
    manifest = reports(folder, documents, tag, 0)
    texts = [Path(json.loads(line)["path"]).read_text(encoding="utf-8")[:WINDOW]
             for line in manifest.read_text().splitlines()]
    return [f"<document>\n{text}\n</document>\n\n{QUESTIONS[q % len(QUESTIONS)]}"
            for q in range(questions) for text in texts]


def run(prefix_order: bool, items: list[str], concurrency: int, max_tokens: int) -> dict:
    """One round: a fresh engine, ``items`` sent ``concurrency`` at a time; its figures and answers."""
    from tensorjob_jupyter.inference.base import GenerateRequest
    from tensorjob_jupyter.inference.llama import LlamaEngine
    from tensorjob_jupyter.inference.models import default_model_path
    from tensorjob_jupyter.inference.worker import InferenceWorker

    engine = LlamaEngine(default_model_path(), prefix_order=prefix_order)
    worker = InferenceWorker(engine)
    try:
        worker.generate_stream(GenerateRequest("Say hello.", 2, chat=True), lambda t: True).result(600)
        results: dict[int, object] = {}
        room = threading.Semaphore(concurrency)
        done = threading.Event()

        def finished(future, i):
            results[i] = future.result()
            room.release()
            if len(results) == len(items):
                done.set()

        start = time.perf_counter()
        for i, prompt in enumerate(items):
            room.acquire()
            worker.generate_stream(GenerateRequest(prompt, max_tokens, chat=True), lambda t: True) \
                .add_done_callback(lambda f, i=i: finished(f, i))
        done.wait(3600)
        wall = time.perf_counter() - start
        usage = [results[i].usage for i in range(len(items))]
        prompt_tokens = sum(u.prompt_tokens for u in usage)
        return {"items_s": len(items) / wall, "wall_s": wall,
                "cached_share": sum(u.cached_tokens for u in usage) / max(1, prompt_tokens),
                "prompt_tokens": prompt_tokens, "prefix_copies": engine.prefix_copies,
                "texts": [results[i].text for i in range(len(items))]}
    finally:
        worker.close()
        engine.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--documents", type=int, default=8)
    ap.add_argument("--questions", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    rows: dict[str, list[dict]] = {"arrival order": [], "prefix-first": []}
    with tempfile.TemporaryDirectory(prefix="bench-prefix-order-") as tmp:
        for r in range(args.rounds):
            items = prompts(Path(tmp), args.documents, args.questions, f"r{r}")
            for name, prefix_order in (("arrival order", False), ("prefix-first", True)):
                row = run(prefix_order, items, args.concurrency, args.max_tokens)
                rows[name].append(row)
                print(f"round {r + 1} {name}: {row['items_s']:.2f} items/s, cached share {row['cached_share']:.2f}, "
                      f"{row['prefix_copies']} prefix copies", file=sys.stderr, flush=True)
    same = [sum(x == y for x, y in zip(a["texts"], b["texts"]))
            for a, b in zip(rows["arrival order"], rows["prefix-first"])]
    summary = {name: {key: statistics.median(row[key] for row in got)
                      for key in ("items_s", "wall_s", "cached_share", "prefix_copies")}
               for name, got in rows.items()}
    base, new = summary["arrival order"], summary["prefix-first"]
    summary["ratio_items_s"] = new["items_s"] / base["items_s"]
    summary["same_answers"] = statistics.median(same)
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    n = args.documents * args.questions
    print(f"{n} items ({args.documents} documents x {args.questions} questions, in the map's order), "
          f"{args.concurrency} in flight, 4 slots, median of {args.rounds}:")
    for name in ("arrival order", "prefix-first"):
        row = summary[name]
        print(f"  {name:14} {row['items_s']:6.2f} items/s  cached share {row['cached_share']:.2f}  "
              f"{row['prefix_copies']:.0f} prefix copies  ({row['wall_s']:.1f} s)")
    print(f"  prefix-first / arrival order: {summary['ratio_items_s']:.2f}x items/s; the same answer in both orders: "
          f"{summary['same_answers']:.0f} of {n} items (greedy; the rest differ by batch composition, docs/maps.md)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Replay of a recorded run against the run itself, on the real model.

Run from the repository root::

    python bench/bench_replay.py            # a 256-token summary; 7 replays
    python bench/bench_replay.py --quick    # a 64-token summary; 3 replays

1. **Record**: ``guests/examples/summarise.c`` over ``examples/data/lighthouse.txt``
   on the embedded model (SmolLM2-135M-Instruct), asking for 256 tokens in one
   window. The model is loaded and warmed first, so the load is not counted:
   the figure is the job's own wall time, from ``Job(...)`` to its envelope.
2. **Replay** the same guest (compiled once, as the compile cache would give
   it) against that transcript with no model, N times: wall time from
   ``ReplayJob(...)`` to its envelope -- reading the recording, instantiating
   the guest, reading the file again, answering every token through
   ``cf_on_token`` and publishing it, writing the replay's own transcript.
   Goal: at least 20 times faster than the run.
3. A **bare loop over the transcript's events**, the least any replay must
   do: read ``events.jsonl``, parse every line, join the deltas. The ratio
   replay / bare is what a replay costs beyond reading its recording.
4. Where a replay's time goes: the same replay of a 1-token recording (the
   fixed cost: the job, its transcript and thread, the guest instantiated,
   the file read) against the 256-token one (the cost a token).

Replays and bare loops are interleaved and the medians reported. The last
line is a one-line JSON summary. The record step needs the model (about a
second of loading, then the generation at the machine's speed).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import orjson  # noqa: E402

import tensorjob_jupyter as tj
from tensorjob_jupyter.sandbox.compile import GuestSource
from tensorjob_jupyter.inference.base import GenerateRequest
from tensorjob_jupyter.inference.models import get_backend
from tensorjob_jupyter.history.replay import ReplayJob

DATA = ROOT / "examples" / "data"


def record(guest: GuestSource, tokens: int, runs_dir: str) -> tuple[tj.Job, float]:
    backend = get_backend()
    backend.generate_stream(GenerateRequest("Warm up.", 4), lambda _t: True).result()  # load and warm
    started = time.perf_counter()
    job = tj.Job(guest, backend=backend, runs_dir=runs_dir, read=[DATA],
                 input={"path": str(DATA / "lighthouse.txt"), "max_tokens": tokens, "window": 1 << 20})
    envelope = job.start().wait()
    elapsed = time.perf_counter() - started
    assert envelope.ok, envelope
    return job, elapsed


def replay_once(guest: GuestSource, run_dir: Path, runs_dir: str, expected) -> float:
    started = time.perf_counter()
    job = ReplayJob(guest, run_dir, runs_dir=runs_dir)
    envelope = job.start().wait()
    elapsed = time.perf_counter() - started
    assert envelope.ok and envelope.result == expected, envelope
    assert job.report.same_result and job.report.divergence is None
    return elapsed


def bare_loop(run_dir: Path) -> float:
    started = time.perf_counter()
    pieces = []
    with open(run_dir / "events.jsonl", "rb") as f:
        for line in f:
            event = orjson.loads(line)
            if event["type"] == "response.output_text.delta":
                pieces.append(event["delta"])
    "".join(pieces)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--tokens", type=int, default=None)
    parser.add_argument("--replays", type=int, default=None)
    args = parser.parse_args()
    tokens = args.tokens or (64 if args.quick else 256)
    replays = args.replays or (3 if args.quick else 7)
    load = [f"{x:.2f}" for x in os.getloadavg()]
    guest = GuestSource.from_file(ROOT / "guests" / "examples" / "summarise.c")
    with tempfile.TemporaryDirectory() as runs_dir:
        job, run_s = record(guest, tokens, runs_dir)
        run_dir = Path(job.run_dir)
        generated = job.envelope.usage.tokens_out
        deltas = sum(1 for e in job.events if e["type"] == "response.output_text.delta")
        events = len(job.events)
        short, _ = record(guest, 1, runs_dir)
        replay_s, bare_s, short_s = [], [], []
        for _ in range(replays):
            replay_s.append(replay_once(guest, run_dir, runs_dir, job.result))
            bare_s.append(bare_loop(run_dir))
            short_s.append(replay_once(guest, Path(short.run_dir), runs_dir, short.result))
    replay_med, bare_med, short_med = statistics.median(replay_s), statistics.median(bare_s), statistics.median(short_s)
    per_token_us = (replay_med - short_med) / max(deltas - 1, 1) * 1e6
    speedup = run_s / replay_med
    print(f"cores: {os.cpu_count()}, load: {load}; the run: {generated} tokens ({deltas} deltas, {events} events), "
          f"{job.envelope.usage.tokens_in} tokens in")
    print(f"[1] replay {replay_med * 1000:.1f} ms (median of {replays}; {min(replay_s) * 1000:.1f}.."
          f"{max(replay_s) * 1000:.1f}) against the run's {run_s * 1000:.0f} ms: {speedup:.0f}x faster; "
          f"goal 20x: {'met' if speedup >= 20 else 'NOT met'}")
    print(f"[2] bare loop over the transcript's events {bare_med * 1000:.2f} ms: the replay takes "
          f"{replay_med / bare_med:.1f}x the bare loop")
    print(f"[3] a replay of a 1-token recording {short_med * 1000:.1f} ms (the fixed cost); "
          f"{per_token_us:.1f} us a token beyond it")
    print(json.dumps({"cores": os.cpu_count(), "tokens": generated, "deltas": deltas, "events": events,
                      "run_s": run_s, "replay_s": replay_med, "replay_runs_s": replay_s, "bare_s": bare_med,
                      "speedup": speedup, "replay_over_bare": replay_med / bare_med, "fixed_s": short_med,
                      "per_token_us": per_token_us}))


if __name__ == "__main__":
    main()

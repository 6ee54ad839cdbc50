"""What debugging costs: a job in ``--debug`` mode running free, and scrubbing a long job's view.

Run from the repository root::

    python bench/bench_debug.py            # 20,000-step jobs, 9 interleaved runs
    python bench/bench_debug.py --quick    # 5,000-step jobs, 5 runs

1. **Overhead of ``--debug`` with no breakpoints.** The same job twice, as a
   real ``tj.Job`` with its transcript: once plain, once with ``debug=True``
   and ``resume()`` called before it starts (so it never waits, but every
   command passes the debugger's stop point and is recorded as the last
   command). Two workloads: ``emit`` steps (the cheapest command, so the
   worst case for a per-command cost) and one ``infer`` of N tokens on a
   zero-cost model (the per-token path, which the debugger never touches).
   Goal: debug >= 0.95 x plain (at most 5% overhead).
2. **Re-folding the view to an arbitrary event of a 10,000-event job.** A
   job that opens a file, reads it in 3,500 windows, emits 3,500 progress
   payloads and streams one 3,000-token infer (10,011 events). The
   ``Timeline`` (``view/scrub.py``) is built once (one pass over the
   transcript, checkpoints every 256 events); then ``state_at(k)`` and the
   rendering of every panel for 200 random events, against re-folding from
   the first event each time (no checkpoints), the baseline, measured in the
   same run. Goal: under 100 ms for any event.

Each ratio is the median of the ratios of interleaved pairs (the absolute
figures are medians too); absolute numbers swing with the machine's load
(shown first), the ratios much less. The last line is a one-line JSON summary.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import tensorjob_jupyter as tj
from tensorjob_jupyter.inference import ScriptedBackend
from tensorjob_jupyter.frontends.view import render
from tensorjob_jupyter.frontends.view.scrub import Timeline

import wat  # noqa: E402

GOAL_OVERHEAD = 0.95
GOAL_REFOLD_S = 0.100


# --- 1. overhead ------------------------------------------------------------------------------------


def emit_guest(steps: int) -> bytes:
    """Returns ``emit`` for ever (the script repeats its last command): the job's ``max_steps`` ends it
    with ``limit_exceeded`` after exactly ``steps`` commands, the same way in both runs."""
    return wat.script_guest([{"cmd": "emit", "progress": {"i": 1}}])


def token_guest(tokens: int) -> bytes:
    return wat.script_guest([{"cmd": "infer", "prompt": "go", "max_tokens": tokens},
                             {"cmd": "done", "result": "ok"}], stop_after_tokens=2**31 - 1)


def run_emits(steps: int, runs_dir: str, debug: bool) -> float:
    """Steps per second of one job returning ``steps`` emits (it ends at max_steps)."""
    job = tj.Job(emit_guest(steps), backend=None, runs_dir=runs_dir, max_steps=steps, debug=debug)
    if debug:
        job.resume()  # as if Continue were clicked at once: the job never waits
    started = time.perf_counter()
    envelope = job.start().wait()
    elapsed = time.perf_counter() - started
    assert envelope.error is not None and envelope.error.code == "limit_exceeded", envelope
    assert job.stats.steps == steps
    return steps / elapsed


def run_tokens(tokens: int, runs_dir: str, debug: bool) -> float:
    backend = ScriptedBackend(" ".join(["tok"] * tokens))
    job = tj.Job(token_guest(tokens), backend=backend, runs_dir=runs_dir, debug=debug)
    if debug:
        job.resume()
    started = time.perf_counter()
    envelope = job.start().wait()
    elapsed = time.perf_counter() - started
    backend.close()
    assert envelope.ok and envelope.usage.tokens_out == tokens, envelope
    return tokens / elapsed


def interleaved(plain, debug, runs: int) -> tuple[float, float, list[float]]:
    """Medians of each, and every pair's ratio (debug / plain); the figure is the median of the ratios,
    which a burst of load on a shared machine moves least."""
    a, b, ratios = [], [], []
    for i in range(runs):
        if i % 2:  # alternate which goes first
            y, x = debug(), plain()
        else:
            x, y = plain(), debug()
        a.append(x)
        b.append(y)
        ratios.append(y / x)
    return statistics.median(a), statistics.median(b), ratios


# --- 2. re-folding -----------------------------------------------------------------------------------


def long_job(runs_dir: str, data_dir: Path) -> tj.Job:
    """A finished job of 10,011 events: open, 3,500 windows, 3,500 progress payloads, a 3,000-token infer."""
    doc = data_dir / "doc.txt"
    doc.write_bytes(b"tensor jobs read files in windows.\n" * 8000)  # 280 KB
    windows, emits, tokens = 3500, 3500, 3000
    commands: list = [{"cmd": "open", "path": str(doc)}]
    for i in range(windows):
        commands.append({"cmd": "slice", "handle": 0, "offset": i * 64, "len": 64})
        if i < emits:
            commands.append({"cmd": "emit", "progress": {"done": i + 1, "total": windows}})
    commands += [{"cmd": "infer", "prompt": "sum up", "max_tokens": tokens}, {"cmd": "done", "result": "ok"}]
    backend = ScriptedBackend(" ".join(["word"] * tokens))
    job = tj.Job(wat.input_script_guest(), input_bytes=wat.pack_commands(commands), read=[data_dir],
                 backend=backend, runs_dir=runs_dir)
    envelope = job.start().wait()
    backend.close()
    assert envelope.ok, envelope
    return job


def refold(job: tj.Job, samples: int, seed: int = 16) -> dict:
    n = len(job.stream)
    tracemalloc.start()
    kept = Timeline(job.transcript_path, job.name)  # once under tracemalloc, for the memory it keeps
    kept_bytes, _peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del kept
    started = time.perf_counter()
    timeline = Timeline(job.transcript_path, job.name)
    build_s = time.perf_counter() - started
    assert len(timeline) == n
    naive = Timeline(job.transcript_path, job.name, every=10**9)  # one checkpoint: re-fold from the start
    rng = random.Random(seed)
    ks = [rng.randrange(n) for _ in range(samples)] + [n - 1, n // 2]
    fold_s, total_s, naive_s = [], [], []
    for i, k in enumerate(ks):
        t0 = time.perf_counter()
        state = timeline.state_at(k)
        t1 = time.perf_counter()
        for renderer in render.RENDERERS.values():
            renderer(state)
        t2 = time.perf_counter()
        fold_s.append(t1 - t0)
        total_s.append(t2 - t0)
        if i % 10 == 0:  # the baseline is slow: a sample of it
            t3 = time.perf_counter()
            naive.state_at(k)
            naive_s.append(time.perf_counter() - t3)
    check = timeline.state_at(n - 1)
    assert check.status == "completed" and check.tokens == 3000
    q = statistics.quantiles(total_s, n=20)
    return {"events": n, "checkpoints": timeline.checkpoints, "every": timeline.every,
            "build_s": round(build_s, 4), "kept_mb": round(kept_bytes / 1e6, 2),
            "refold_median_ms": round(1000 * statistics.median(fold_s), 2),
            "refold_render_median_ms": round(1000 * statistics.median(total_s), 2),
            "refold_render_p95_ms": round(1000 * q[18], 2),
            "refold_render_max_ms": round(1000 * max(total_s), 2),
            "from_start_median_ms": round(1000 * statistics.median(naive_s), 2),
            "speedup": round(statistics.median(naive_s) / statistics.median(fold_s), 1),
            "goal_ms": GOAL_REFOLD_S * 1000, "goal_met": max(total_s) < GOAL_REFOLD_S}


def overhead(label: str, unit: str, count: int, run, runs_dir: str, runs: int) -> dict:
    """``--debug`` with no breakpoints against plain, ``run(count, runs_dir, debug)`` interleaved; printed and returned."""
    plain, debug, ratios = interleaved(lambda: run(count, runs_dir, False), lambda: run(count, runs_dir, True), runs)
    ratio = statistics.median(ratios)
    print(f"{label}: --debug (no breakpoints) {debug:,.0f} {unit}/s against plain {plain:,.0f}: median pair ratio "
          f"{ratio:.3f} (pairs {min(ratios):.3f}..{max(ratios):.3f}); goal >= {GOAL_OVERHEAD}: "
          f"{'met' if ratio >= GOAL_OVERHEAD else 'NOT met'}")
    return {unit: count, f"plain_{unit}_per_s": round(plain), f"debug_{unit}_per_s": round(debug),
            "ratio": round(ratio, 4), "ratio_min": round(min(ratios), 4), "ratio_max": round(max(ratios), 4),
            "goal": GOAL_OVERHEAD, "goal_met": ratio >= GOAL_OVERHEAD}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--runs", type=int, default=None)
    args = parser.parse_args()
    steps = 5_000 if args.quick else 20_000
    tokens = 5_000 if args.quick else 20_000
    runs = args.runs or (5 if args.quick else 9)
    wall = time.perf_counter()
    print(f"cores: {os.cpu_count()}, load: {open('/proc/loadavg').read().split()[:3]}, "
          f"{steps} steps / {tokens} tokens a job, {runs} runs")
    summary: dict = {"bench": "bench_debug", "mode": "quick" if args.quick else "full"}
    with tempfile.TemporaryDirectory() as tmp:
        runs_dir = str(Path(tmp) / "runs")
        run_emits(500, runs_dir, True)  # warm up: module cache, imports
        summary["emit"] = overhead("[1a] emit steps", "steps", steps, run_emits, runs_dir, runs)
        summary["tokens"] = overhead("[1b] tokens", "tokens", tokens, run_tokens, runs_dir, runs)
        data = Path(tmp) / "data"
        data.mkdir()
        job = long_job(runs_dir, data)
        r = refold(job, 50 if args.quick else 200)
        print(f"[2] re-fold a {r['events']:,}-event job to a random event: {r['refold_median_ms']} ms median "
              f"({r['refold_render_median_ms']} ms with every panel rendered; p95 {r['refold_render_p95_ms']} ms, "
              f"max {r['refold_render_max_ms']} ms) against {r['from_start_median_ms']} ms folding from the first "
              f"event: {r['speedup']}x; building the timeline once {1000 * r['build_s']:.0f} ms, "
              f"{r['checkpoints']} checkpoints every {r['every']} events, {r['kept_mb']} MB kept; goal < "
              f"{r['goal_ms']:.0f} ms: {'met' if r['goal_met'] else 'NOT met'}")
        summary["refold"] = r
    summary["wall_s"] = round(time.perf_counter() - wall, 1)
    print(json.dumps(summary, separators=(",", ":")))


if __name__ == "__main__":
    main()

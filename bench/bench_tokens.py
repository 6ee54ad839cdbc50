"""Tokens per second through the host, with a model that costs nothing.

Run from the repository root::

    python bench/bench_tokens.py            # 20,000 tokens a job; 1, 2, 4 and 8 jobs at once
    python bench/bench_tokens.py --quick    # 5,000 tokens a job
    python bench/bench_tokens.py --breakdown  # also: where each microsecond of a token goes

A job whose guest asks for one long ``infer`` and judges every token in
``cf_on_token`` (it always says continue) runs against ``ScriptedBackend``
with no delay, so every microsecond measured is the host's: the handoff
between the model's thread and the job's, the wasm calls (``cf_alloc``, the
copy, ``cf_on_token``), building, encoding and writing the Open Responses
delta event, the transcript, the subscribers' queues.

1. **One job** against a *bare loop* of the same calls on the same module
   through wasmtime-py's public API (``set_epoch_deadline``, ``cf_alloc``,
   copy the token in, ``set_epoch_deadline``, ``cf_on_token``), in the same
   process. Goal: at least 20,000 tokens/s, or 0.8 of the bare loop,
   whichever is lower.
2. **N jobs at once** (1, 2, 4, 8), each with its own zero-cost backend
   (so the model never serialises them: the host is all there is), against
   one job. Goal: 8 jobs carry at least as many tokens per second in all as
   one; reported with the machine's core count.
3. With ``--breakdown``, one instrumented job: the share of each part of a
   token's way through the host.

Runs are interleaved and the medians reported; ratios are against baselines
measured in the same process. The last line is a one-line JSON summary.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import wasmtime  # noqa: E402

import tensorjob_jupyter as tj  # noqa: E402
from tensorjob_jupyter.guest import I32, _engine_config  # noqa: E402
from tensorjob_jupyter.inference import ScriptedBackend  # noqa: E402

import wat  # noqa: E402


def token_guest(tokens: int) -> bytes:
    """One infer of ``tokens`` tokens, every token judged (continue), then done."""
    return wat.script_guest([{"cmd": "infer", "prompt": "go", "max_tokens": tokens},
                             {"cmd": "done", "result": "ok"}], stop_after_tokens=2**31 - 1)


def backend(tokens: int) -> ScriptedBackend:
    return ScriptedBackend(" ".join(["tok"] * tokens))


def run_jobs(n: int, tokens: int, runs_dir: str) -> float:
    """Tokens per second of ``n`` jobs at once, in all."""
    guest = token_guest(tokens)
    backends = [backend(tokens) for _ in range(n)]
    jobs = [tj.Job(guest, backend=b, runs_dir=runs_dir) for b in backends]
    started = time.perf_counter()
    for job in jobs:
        job.start()
    for job in jobs:
        envelope = job.wait()
        assert envelope.ok and envelope.usage.tokens_out == tokens, envelope
    elapsed = time.perf_counter() - started
    for b in backends:
        b.close()
    return n * tokens / elapsed


def bare_loop(tokens: int) -> float:
    """cf_on_token calls per second through wasmtime-py's public API, as the host makes them."""
    cfg, _ = _engine_config(tj.Limits())
    engine = wasmtime.Engine(cfg)
    store = wasmtime.Store(engine)
    module = wasmtime.Module(engine, token_guest(tokens))
    instance = wasmtime.Instance(store, module, [])
    ex = instance.exports(store)
    alloc, on_token, memory = ex["cf_alloc"], ex["cf_on_token"], ex["memory"]
    piece = b" tok"
    started = time.perf_counter()
    for _ in range(tokens):
        store.set_epoch_deadline(500)
        ptr = alloc(store, len(piece))
        base = ctypes.addressof(memory.data_ptr(store).contents)
        ctypes.memmove(base + ptr, piece, len(piece))
        store.set_epoch_deadline(500)
        assert on_token(store, ptr, len(piece)) == 0
    return tokens / (time.perf_counter() - started)


def median_pairs(measure_a, measure_b, runs: int) -> tuple[float, float, list[float]]:
    a, b, ratios = [], [], []
    for _ in range(runs):
        x, y = measure_a(), measure_b()
        a.append(x)
        b.append(y)
        ratios.append(y / x)
    return statistics.median(a), statistics.median(b), ratios


def breakdown(tokens: int, runs_dir: str) -> dict:
    """One job with timers around each part of the per-token path (patched in for this run only)."""
    from tensorjob_jupyter import guest as guest_module
    from tensorjob_jupyter import responses

    totals: dict[str, float] = {}

    def timed(owner, name, label):
        original = getattr(owner, name)

        def wrapper(*args, **kwargs):
            t = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                totals[label] = totals.get(label, 0.0) + time.perf_counter() - t
        setattr(owner, name, wrapper)
        return lambda: setattr(owner, name, original)

    restore = [timed(guest_module.Guest, "on_token", "guest.on_token (cf_alloc, copy, cf_on_token)"),
               timed(responses.ResponseStream, "delta", "delta event (build, encode, write, fan out)"),
               timed(tj.events.EventStream, "publish", "  of which EventStream.publish")]
    try:
        started = time.perf_counter()
        rate = run_jobs(1, tokens, runs_dir)
        total = time.perf_counter() - started
    finally:
        for undo in restore:
            undo()
    per_token = {k: v / tokens * 1e6 for k, v in totals.items()}
    per_token["everything else (handoff between threads, the reactor's loop)"] = (
        total / tokens * 1e6 - per_token["guest.on_token (cf_alloc, copy, cf_on_token)"]
        - per_token["delta event (build, encode, write, fan out)"])
    return {"tokens_per_s": rate, "us_per_token": per_token}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--breakdown", action="store_true")
    parser.add_argument("--runs", type=int, default=None)
    args = parser.parse_args()
    tokens = 5_000 if args.quick else 20_000
    runs = args.runs or (3 if args.quick else 5)
    cores = os.cpu_count()
    print(f"cores: {cores}, load: {open('/proc/loadavg').read().split()[:3]}, tokens a job: {tokens}")
    summary: dict = {"cores": cores, "tokens": tokens}
    with tempfile.TemporaryDirectory() as runs_dir:
        bare, one, ratios = median_pairs(lambda: bare_loop(tokens), lambda: run_jobs(1, tokens, runs_dir), runs)
        goal = min(20_000, 0.8 * bare)
        print(f"[1] one job {one:,.0f} tokens/s against the bare cf_on_token loop {bare:,.0f} calls/s: "
              f"ratio {one / bare:.2f} (pairs {min(ratios):.2f}..{max(ratios):.2f}); "
              f"goal {goal:,.0f} tokens/s: {'met' if one >= goal else 'NOT met'}")
        summary["one_job"] = {"tokens_per_s": one, "bare_calls_per_s": bare, "ratio": one / bare}
        summary["concurrent"] = {}
        for n in (2, 4, 8):
            base, many, ratios = median_pairs(lambda: run_jobs(1, tokens, runs_dir),
                                              lambda: run_jobs(n, tokens, runs_dir), runs)
            print(f"[2] {n} jobs at once {many:,.0f} tokens/s in all against one job {base:,.0f}: "
                  f"ratio {many / base:.2f} (pairs {min(ratios):.2f}..{max(ratios):.2f})"
                  + (f"; goal >= 1.0: {'met' if many >= base else 'NOT met'}" if n == 8 else ""))
            summary["concurrent"][n] = {"tokens_per_s": many, "one_job": base, "ratio": many / base}
        if args.breakdown:
            b = breakdown(tokens, runs_dir)
            print(f"[3] where a token's time goes (one instrumented job, {b['tokens_per_s']:,.0f} tokens/s "
                  f"with the timers on):")
            for label, us in b["us_per_token"].items():
                print(f"    {us:7.1f} us  {label}")
            summary["breakdown"] = b
    print(json.dumps(summary))


if __name__ == "__main__":
    threading.excepthook = lambda a: None  # a benchmark's stray thread must not interleave tracebacks
    main()

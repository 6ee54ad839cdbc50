"""Served-model benchmark: jobs through an OpenAI-compatible server against the same jobs in-process.

1. **One job.** Tokens per second of one whole job (a wasm guest with
   ``cf_on_token``, the event stream, the transcript) whose model is
   llama-cpp-python's OpenAI-compatible server (``python -m llama_cpp.server``
   on the embedded SmolLM2, a separate process on loopback), against the same
   job on the in-process model.
2. **Four jobs at once.** Aggregate tokens per second of four concurrent jobs
   through the server against four on the in-process model. Goal: served >=
   0.8 x in-process. llama-cpp-python's server decodes one request at a time
   (a lock around its one ``Llama``) while the in-process worker batches the
   four sequences into one ``llama_decode`` per step, so with that server the
   ratio is bounded by what batching buys. **2b** runs the four jobs against
   a server that batches, ``tensorjob serve`` (serve/server.py: the same
   worker behind the API, in its own process), alternating with four more
   in-process: the served path's own cost when the server is not the limit.
3. **Host overhead per token of the served path**: the CPU time the
   backend's request threads spend (the openai SDK, SSE parsing, the socket,
   this package's code and the job's token callback) divided by the text
   pieces they delivered, in microseconds: in the jobs of 1 (per-request costs
   spread over their tokens), and apart -- per piece of a 2,000-piece stream and
   per request of a 1-piece one -- against a scripted server on loopback that
   answers at once (tests/served_support.py ``FakeServer``), so no model time
   hides in it.

Both sides run in one process, alternating, with the server and the local
model using the same llama.cpp thread count; medians of the repetitions are
reported with the absolute numbers. The last line is a JSON summary.
Run ``python bench/bench_served.py [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import tensorjob_jupyter as tj  # noqa: E402
from tensorjob_jupyter.inference.models import default_model_path, get_backend  # noqa: E402
from tensorjob_jupyter.inference.served import ServedBackend  # noqa: E402
from tensorjob_jupyter.inference.topology import physical_cores  # noqa: E402
from served_support import FakeServer, LlamaServer, free_port, wait_until  # noqa: E402  (tests/served_support.py)
from wat import script_guest  # noqa: E402  (tests/wat.py)

PROMPTS = ["Write a long story about a dragon who learns to cook.",
           "Explain in detail how the printing press changed Europe.",
           "Give a detailed recipe for bread, step by step.",
           "Describe a walk through a busy harbour at dawn, in detail."]

def guest_for(prompt: str, max_tokens: int) -> bytes:
    return script_guest([{"cmd": "infer", "prompt": prompt, "max_tokens": max_tokens},
                         {"cmd": "done", "result": "ok"}], stop_after_tokens=1 << 30)


def run_job(backend, prompt: str, max_tokens: int) -> tuple[int, float]:
    started = time.perf_counter()
    envelope = tj.run(guest_for(prompt, max_tokens), backend=backend, timeout=600)
    wall = time.perf_counter() - started
    if envelope.status.value != "completed":
        raise RuntimeError(f"benchmark job failed: {envelope}")
    return envelope.usage.tokens_out, wall


def run_four(backend, max_tokens: int) -> tuple[int, float]:
    results: list = [None] * 4

    def one(i: int) -> None:
        results[i] = run_job(backend, PROMPTS[i], max_tokens)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    if any(r is None for r in results):
        raise RuntimeError("a benchmark job failed")
    return sum(n for n, _ in results), wall


class TensorjobServer:
    """``tensorjob serve`` (serve/server.py) in its own process: the batching worker behind the API."""

    def __init__(self, threads: int, log):
        self.process = subprocess.Popen([sys.executable, "-m", "tensorjob_jupyter.frontends.cli", "serve", "--port",
                                         "0", "--threads", str(threads)], stdout=subprocess.PIPE, stderr=log,
                                        text=True, cwd=ROOT)
        line = self.process.stdout.readline()  # "serving at http://127.0.0.1:PORT/v1 ..." once the model is loaded
        if not line.startswith("serving at "):
            self.close()
            raise RuntimeError(f"tensorjob serve did not start: {line!r}")
        self.url = line.split()[2]

    def close(self) -> None:
        self.process.kill()
        self.process.wait(10)


def client_cost(reps: int) -> tuple[float, float]:
    """(us per piece of a long stream, ms per request of a one-piece stream) of the served path's own CPU."""
    from tensorjob_jupyter.inference.base import GenerateRequest

    with FakeServer() as fake:
        backend = ServedBackend(fake.url, api_key_env="TENSORJOB_BENCH_NO_KEY")
        per_piece, per_request = [], []
        for pieces, out in ((2000, per_piece), (1, per_request)):
            fake.pieces = [f" w{i}" for i in range(pieces)]
            fake.usage = None
            backend.generate_stream(GenerateRequest("p", 4000, chat=True), lambda _p: True).result(60)  # warm
            for _ in range(reps * 5):
                cpu = backend.stats.host_cpu_s
                backend.generate_stream(GenerateRequest("p", 4000, chat=True), lambda _p: True).result(60)
                out.append(backend.stats.host_cpu_s - cpu)
        backend.close()
    return statistics.median(per_piece) / 2000 * 1e6, statistics.median(per_request) * 1e3


def median_rate(samples: list[tuple[int, float]]) -> float:
    return statistics.median(n / wall for n, wall in samples)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer, shorter runs")
    args = parser.parse_args(argv)
    n_tokens, reps = (48, 2) if args.quick else (128, 3)
    threads = physical_cores()
    summary: dict = {"tokens": n_tokens, "reps": reps, "threads": threads}
    with tempfile.TemporaryDirectory(prefix="tensorjob-bench-served-") as tmp:
        os.environ["TENSORJOB_RUNS"] = str(Path(tmp) / "runs")
        local = get_backend(n_threads=threads, n_threads_batch=threads)
        print(f"model {default_model_path().name}; {threads} llama.cpp threads on each side; "
              f"{n_tokens} tokens x {reps} repetitions; load {open('/proc/loadavg').read().split()[0]}")
        with LlamaServer(default_model_path(), Path(tmp) / "server.log", threads=threads,
                         extra=("--flash_attn", "True")) as server:  # the in-process engine's attention kernel
            served = ServedBackend(server.url, api_key_env="TENSORJOB_BENCH_NO_KEY")
            for backend in (local, served):  # warm both (model load, connection, chat template)
                run_job(backend, PROMPTS[0], 4)
            one_local, one_served, four_local, four_served = [], [], [], []
            cpu0, pieces0 = served.stats.host_cpu_s, served.stats.pieces
            for _ in range(reps):
                one_served.append(run_job(served, PROMPTS[0], n_tokens))
                one_local.append(run_job(local, PROMPTS[0], n_tokens))
            per_token_us = (served.stats.host_cpu_s - cpu0) / max(1, served.stats.pieces - pieces0) * 1e6
            for _ in range(reps):
                four_served.append(run_four(served, n_tokens))
                four_local.append(run_four(local, n_tokens))
            served.close()
        ol, os_, fl, fs = (median_rate(x) for x in (one_local, one_served, four_local, four_served))
        print(f"[1] one job, served vs in-process: ratio {os_ / ol:.3f}  served {os_:.1f} tok/s, "
              f"in-process {ol:.1f} tok/s")
        print(f"[2] four jobs at once, served vs in-process: ratio {fs / fl:.3f} (goal >= 0.8)  "
              f"served {fs:.1f} tok/s aggregate, in-process {fl:.1f} tok/s aggregate "
              "(llama-cpp-python's server decodes one request at a time)")
        piece_us, request_ms = client_cost(reps)
        print(f"[3] host overhead of the served path: {per_token_us:.0f} us per token in the jobs above "
              f"(request threads' CPU time / pieces delivered, {n_tokens}-token answers); apart: "
              f"{piece_us:.0f} us per piece of a long stream + {request_ms:.1f} ms per request")
        summary.update(one_ratio=os_ / ol, one_served_tok_s=os_, one_local_tok_s=ol, four_ratio=fs / fl,
                       four_served_tok_s=fs, four_local_tok_s=fl, served_us_per_token=per_token_us,
                       served_us_per_piece=piece_us, served_ms_per_request=request_ms)
        with open(Path(tmp) / "serve.log", "wb") as log:
            server = TensorjobServer(threads, log)
            try:
                batched = ServedBackend(server.url, api_key_env="TENSORJOB_BENCH_NO_KEY")
                run_job(batched, PROMPTS[0], 4)
                four_batched, four_local2 = [], []
                for _ in range(reps):
                    four_batched.append(run_four(batched, n_tokens))
                    four_local2.append(run_four(local, n_tokens))
                batched.close()
            finally:
                server.close()
        fb, fl2 = median_rate(four_batched), median_rate(four_local2)
        print(f"[2b] four jobs at once, tensorjob serve vs in-process: ratio {fb / fl2:.3f} (goal >= 0.8)  "
              f"served {fb:.1f} tok/s aggregate, in-process {fl2:.1f} tok/s aggregate")
        summary.update(four_batching_ratio=fb / fl2, four_batching_served_tok_s=fb, four_local2_tok_s=fl2)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())

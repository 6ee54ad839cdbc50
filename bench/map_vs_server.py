"""``bench_map.py --vs-server``: ``tensorjob map`` against llama.cpp's own server, the peer a throughput user picks.

The same map as ``--vs-plain`` (short reports, one schema-held answer each, ``guests/examples/extract.c``, the
embedded model): ``tensorjob map`` as typed, a whole process, against ``llama-server`` with its model loaded,
``-np`` = the map's concurrency, continuous batching, ``-c`` = the map's per-slot context times the slots, the
same threads, and an asyncio OpenAI client keeping that many streamed requests in flight with the same prompt,
JSON Schema (``response_format``), greedy sampling, repetition penalty and ``max_tokens``. Default answers and
``--long-answers`` alternate within each round. The binary is not built here: ``LLAMA_SERVER`` names it, and
without it the row is skipped with how to build it (bench/README.md).

Per-token timings on both sides: the server's from the client's stream (time to the first content chunk,
gaps between chunks); the map's from its own transcripts (each ``response.output_text.delta`` event's
``t_ms``, millisecond resolution, against its ``response.created``).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from map_vs_plain import GUEST, LONG_SCHEMA, PROMPT, ROOT, SCHEMA, WINDOW, median_row, reports, tensorjob

#: ``--long-answers``' default budget: a 200-400 character summary is about 110 tokens.
LONG_MAX_TOKENS = 160
#: The map's sampling (the host's defaults): greedy, repetition penalty 1.1 over the last 64 tokens.
REPEAT_PENALTY, REPEAT_LAST_N = 1.1, 64
#: The engine's default context per slot, prompt and reply.
N_CTX = 2048
BUILD_HINT = """\
--vs-server: skipped -- set LLAMA_SERVER to a llama-server binary (absent or not executable: {where}).
Build one from the llama.cpp sources llama-cpp-python's sdist vendors (nothing is built by the bench):
    pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36
    tar xzf llama_cpp_python-0.3.36.tar.gz && cd llama_cpp_python-0.3.36/vendor/llama.cpp
    cmake -B build -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DCMAKE_BUILD_TYPE=Release
    cmake --build build --target llama-server -j
    export LLAMA_SERVER=$PWD/build/bin/llama-server"""


def server_binary() -> str | None:
    """The executable ``LLAMA_SERVER`` names, or None (and the build hint printed)."""
    where = os.environ.get("LLAMA_SERVER", "")
    if where and os.path.isfile(where) and os.access(where, os.X_OK):
        return where
    print(BUILD_HINT.format(where=where or "LLAMA_SERVER is not set"), flush=True)
    return None


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile (``p`` in 0..1); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, math.ceil(p * len(ordered)) - 1))]


def latency(first_token_s: list[float], gaps_s: list[float]) -> dict:
    return {"ttft_med_ms": 1000 * statistics.median(first_token_s) if first_token_s else math.nan,
            "ttft_p95_ms": 1000 * percentile(first_token_s, 0.95),
            "gap_med_ms": 1000 * statistics.median(gaps_s) if gaps_s else math.nan,
            "gap_p95_ms": 1000 * percentile(gaps_s, 0.95)}


def valid_answer(answer, schema: dict) -> bool:
    return isinstance(answer, dict) and set(schema["required"]) <= set(answer)


# --- the server -----------------------------------------------------------------------------------


class Server:
    """``llama-server`` on a free local port, up until ``close``; its log in ``folder``."""

    def __init__(self, binary: str, model: str, folder: Path, *, slots: int, threads: int, threads_batch: int,
                 extra: list[str]):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.argv = [binary, "-m", model, "--host", "127.0.0.1", "--port", str(self.port), "-np", str(slots), "-cb",
                     "-c", str(N_CTX * slots), "-b", "512", "-ub", "512", "-t", str(threads), "-tb",
                     str(threads_batch), "--jinja", "--no-webui", *extra]
        self.log = folder / "llama-server.log"
        started = time.perf_counter()
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{self.port}"
        self._wait_healthy(timeout=300)
        self.load_s = time.perf_counter() - started

    def _wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited ({self.proc.returncode}):\n"
                                   + self.log.read_text(errors="replace")[-3000:])
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"llama-server not healthy after {timeout:.0f} s")

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


async def one_request(client, semaphore, text: str, schema: dict, max_tokens: int) -> dict:
    """One streamed chat completion: its answer, tokens, time to the first content chunk and the gaps after."""
    async with semaphore:
        started = time.perf_counter()
        stream = await client.chat.completions.create(
            model="default", messages=[{"role": "user", "content": PROMPT.format(text=text)}], stream=True,
            response_format={"type": "json_schema", "json_schema": {"name": "facts", "schema": schema}},
            temperature=0.0, max_tokens=max_tokens, stream_options={"include_usage": True},
            extra_body={"repeat_penalty": REPEAT_PENALTY, "repeat_last_n": REPEAT_LAST_N})
        parts: list[str] = []
        stamps: list[float] = []
        usage = None
        async for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            for choice in chunk.choices:
                if choice.delta.content:
                    stamps.append(time.perf_counter())
                    parts.append(choice.delta.content)
        tokens = usage.completion_tokens if usage is not None else len(stamps)
        prompt_tokens = usage.prompt_tokens if usage is not None else 0
        return {"text": "".join(parts), "tokens_out": tokens, "tokens_in": prompt_tokens,
                "first_token_s": stamps[0] - started if stamps else None,
                "gaps_s": [b - a for a, b in zip(stamps, stamps[1:])]}


async def serve_items(url: str, manifest: Path, slots: int) -> tuple[list[dict], float]:
    """Every manifest item through the server, ``slots`` in flight; the answers and the wall time of all."""
    from openai import AsyncOpenAI, DefaultAsyncHttpxClient

    try:
        import httpx2 as httpx  # the HTTP client of the openai releases that use it
    except ImportError:
        import httpx

    items = [json.loads(line) for line in manifest.read_text(encoding="utf-8").splitlines() if line.strip()]
    texts = []
    for item in items:  # read as extract.c reads it: the first WINDOW bytes, before the clock starts
        with open(item["path"], "rb") as f:
            texts.append(f.read(WINDOW).decode("utf-8", "ignore"))
    semaphore = asyncio.Semaphore(slots)
    # a fresh connection a request: llama-server may close a kept-alive connection just as the client reuses it
    # ("Server disconnected without sending a response"), and a retry would add the client's back-off to the figures
    http = DefaultAsyncHttpxClient(limits=httpx.Limits(max_connections=2 * slots, max_keepalive_connections=0))
    async with AsyncOpenAI(base_url=url + "/v1", api_key="none", timeout=1200, max_retries=0,
                           http_client=http) as client:
        started = time.perf_counter()
        answers = await asyncio.gather(*(one_request(client, semaphore, text, item["schema"], item["max_tokens"])
                                         for text, item in zip(texts, items)))
        wall = time.perf_counter() - started
    return list(answers), wall


def server_row(server: Server, manifest: Path, slots: int, schema: dict) -> dict:
    answers, wall = asyncio.run(serve_items(server.url, manifest, slots))
    invalid = 0
    for a in answers:
        try:
            invalid += not valid_answer(json.loads(a["text"]), schema)
        except ValueError:
            invalid += 1
    n = len(answers)
    tokens = sum(a["tokens_out"] for a in answers)
    return {"wall_s": wall, "items_s": n / wall, "tok_s": tokens / wall, "tokens_out": tokens,
            "tokens_in": sum(a["tokens_in"] for a in answers), "invalid": invalid, "load": os.getloadavg()[0],
            **latency([a["first_token_s"] for a in answers if a["first_token_s"] is not None],
                      [g for a in answers for g in a["gaps_s"]])}


# --- the map --------------------------------------------------------------------------------------


def map_token_times(run_dir: Path) -> dict:
    """From each item's transcript: time to its first token (``response.created`` to the first
    ``response.output_text.delta``) and the gaps between deltas, all items and those whose request came
    after the model's first token anywhere (the first wave also waits for the model to load)."""
    per_item = []
    for events_path in run_dir.glob("jobs/*/events.jsonl"):
        created_at, asked, stamps = 0.0, None, []
        for line in events_path.read_text(encoding="utf-8").splitlines():
            event = json.loads(line)
            kind = event["type"]
            if kind == "job.created":
                created_at = event["created_at"]
            elif kind == "response.created" and asked is None:
                asked = event["t_ms"] / 1000
            elif kind == "response.output_text.delta":
                stamps.append(event["t_ms"] / 1000)
        if asked is not None and stamps:
            per_item.append((created_at + asked, stamps[0] - asked, [b - a for a, b in zip(stamps, stamps[1:])]))
    ready = min((at + first for at, first, _ in per_item), default=0.0)
    after = [first for at, first, _ in per_item if at >= ready]
    out = latency([first for _, first, _ in per_item], [g for _, _, gaps in per_item for g in gaps])
    out["ttft_loaded_med_ms"] = 1000 * statistics.median(after) if after else math.nan
    out["ttft_loaded_p95_ms"] = 1000 * percentile(after, 0.95)
    out["loaded_items"] = len(after)
    return out


def map_row(folder: Path, manifest: Path, run_dir: Path, concurrency: list[str], schema: dict) -> dict:
    summary, wall = tensorjob("map", str(GUEST), "--over", str(manifest), "--read", str(folder / "docs"),
                              "--run-dir", str(run_dir), *concurrency)
    n = summary["total"]
    usages = [json.loads(p.read_text())["usage"] for p in run_dir.glob("jobs/*/envelope.json")]
    tokens = sum(u["tokens_out"] for u in usages)
    results = [json.loads(line) for line in (run_dir / "results.jsonl").read_text(encoding="utf-8").splitlines()
               if line.strip()]
    valid = sum(valid_answer((r.get("result") or {}).get("facts"), schema) for r in results)
    return {"wall_s": wall, "items_s": n / wall, "tok_s": tokens / wall, "tokens_out": tokens,
            "tokens_in": sum(u["tokens_in"] for u in usages), "elapsed_s": summary["elapsed_s"],
            "invalid": n - valid, "load": os.getloadavg()[0],
            **map_token_times(run_dir)}


# --- the bench ------------------------------------------------------------------------------------


def busy_cores(n: int) -> list[subprocess.Popen]:
    """``n`` processes that each keep one core busy (a Python loop), so a loaded machine can be reproduced:
    ``--busy N``."""
    if n:
        print(f"  --busy {n}: {n} process(es) each spinning one core for the whole run", flush=True)
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def vs_server_bench(args) -> int:
    binary = server_binary()
    if binary is None:
        return 0
    from tensorjob_jupyter.fanout.concurrency import auto_concurrency
    from tensorjob_jupyter.inference.models import default_model_path
    from tensorjob_jupyter.inference.topology import default_threads

    threads, threads_batch = default_threads()
    model = args.model if args.model not in (None, "default") else str(default_model_path())
    slots = auto_concurrency() if args.concurrency in (None, "auto") else int(args.concurrency)
    concurrency = ["--concurrency", str(slots)]
    if args.model not in (None, "default"):
        concurrency += ["--model", model]
    n = max(int(size) for size in args.sizes.split(","))
    long = ("long answers", LONG_SCHEMA, max(args.max_tokens, LONG_MAX_TOKENS))
    kinds = [long] if args.long_answers else [("default answers", SCHEMA, args.max_tokens), long]
    folder = Path(tempfile.mkdtemp(prefix="bench-map-server-"))
    print(f"machine: {os.cpu_count()} CPUs, 1-min load {os.getloadavg()[0]:.1f}"
          f"{f', {args.busy} busy core(s) added (--busy)' if getattr(args, 'busy', 0) else ' (quiet)'}; "
          f"{n} reports; concurrency {slots} "
          f"(server -np {slots} -cb -c {N_CTX * slots}); llama.cpp threads {threads}/{threads_batch} on both sides; "
          f"{args.rounds} interleaved round(s); server {binary} {args.server_args or ''}", flush=True)
    server = Server(binary, model, folder, slots=slots, threads=threads, threads_batch=threads_batch,
                    extra=shlex.split(args.server_args or ""))
    spinners = busy_cores(getattr(args, "busy", 0))
    try:
        warm = reports(folder, 1, "warm", 8)
        asyncio.run(serve_items(server.url, warm, 1))  # the server's first request: not timed
        print(f"  llama-server up and warmed in {server.load_s:.1f} s (not in the figures)", flush=True)
        figures: dict = {name: {"server": [], "map": []} for name, _, _ in kinds}
        for r in range(args.rounds):
            for name, schema, max_tokens in kinds:
                tag = name.split()[0]
                order = ("map", "server") if r % 2 == 0 else ("server", "map")
                for side in order:
                    manifest = reports(folder, n, f"{side}-{tag}-{r}", max_tokens, schema)
                    if side == "map":
                        row = map_row(folder, manifest, folder / f"run-{tag}-{r}", concurrency, schema)
                    else:
                        row = server_row(server, manifest, slots, schema)
                    figures[name][side].append(row)
                    print(f"  round {r + 1}: {name:<16} {side:<7} {row['items_s']:.2f} items/s, {row['tok_s']:.1f} "
                          f"tok/s, TTFT {row['ttft_med_ms']:.0f}/{row['ttft_p95_ms']:.0f} ms, "
                          f"gaps {row['gap_med_ms']:.1f}/{row['gap_p95_ms']:.1f} ms (median/p95), "
                          f"{row['tokens_out']} tokens, {row['invalid']} invalid (load {row['load']:.1f})", flush=True)
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
        server.close()
        shutil.rmtree(folder, ignore_errors=True)
    report(figures, kinds, n, slots)
    if args.json:
        print(json.dumps(figures, indent=2, default=str))
    return 0


def report(figures: dict, kinds: list, n: int, slots: int) -> None:
    loads = [row["load"] for sides in figures.values() for rows in sides.values() for row in rows]
    for name, _, max_tokens in kinds:
        server = median_row(figures[name]["server"], "items_s")
        cli = median_row(figures[name]["map"], "items_s")
        rounds = len(figures[name]["server"])
        print(f"\n{n} reports, {name} (at most {max_tokens} tokens), {slots} at once, median of {rounds} round(s) "
              f"(the median round by items/s):\n")
        print(f"{'':<28}{'items/s':>8}{'tok/s':>8}{'TTFT med':>10}{'p95':>8}{'gap med':>9}{'p95':>7}{'tokens':>8}"
              f"{'invalid':>8}   every round (items/s)")
        for label, row, side in (("llama-server (model loaded)", server, "server"),
                                 ("tensorjob map (process)", cli, "map")):
            print(f"{label:<28}{row['items_s']:>8.2f}{row['tok_s']:>8.1f}{row['ttft_med_ms']:>10.0f}"
                  f"{row['ttft_p95_ms']:>8.0f}{row['gap_med_ms']:>9.1f}{row['gap_p95_ms']:>7.1f}{row['tokens_out']:>8}"
                  f"{row['invalid']:>8}   " + " ".join(f"{x['items_s']:.2f}" for x in figures[name][side]))
        print(f"{'map / server':<28}{cli['items_s'] / server['items_s']:>8.2f}{cli['tok_s'] / server['tok_s']:>8.2f}"
              f"{cli['ttft_med_ms'] / server['ttft_med_ms']:>10.2f}{cli['ttft_p95_ms'] / server['ttft_p95_ms']:>8.2f}"
              f"{cli['gap_med_ms'] / server['gap_med_ms']:>9.2f}{cli['gap_p95_ms'] / server['gap_p95_ms']:>7.2f}"
              f"   (items/s, tok/s: higher is better for the map; TTFT, gaps: lower)  goal items/s >= 1.1")
        print(f"  the map's TTFT counting only the {cli['loaded_items']} items asked after the model was loaded: "
              f"median {cli['ttft_loaded_med_ms']:.0f} ms, p95 {cli['ttft_loaded_p95_ms']:.0f} ms; its items' own "
              f"time (model load excluded) {cli['elapsed_s']:.1f} s of the process's {cli['wall_s']:.1f} s")
        print(f"  prompt tokens an item (the same prompt and chat template on both sides): server "
              f"{server['tokens_in'] / n:.1f}, map {cli['tokens_in'] / n:.1f}")
    print(f"\n  TTFT: request (server: sent by the client; map: the guest's infer) to the first token; gaps between "
          f"successive tokens (the map's from its transcripts' t_ms, 1 ms resolution). invalid: answers that are not "
          f"JSON with every required field.\n1-min load average during the runs: {min(loads):.1f}-{max(loads):.1f}")


__all__ = ["vs_server_bench", "server_binary", "BUILD_HINT", "ROOT"]

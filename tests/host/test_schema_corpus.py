"""The real-world schema corpus (``bench/schemas/real_world.jsonl``: 289 JSON Schemas shipped in 20 packages) as
a job's ``infer`` meets it: what README and docs/guests.md claim of it holds.

``bench/bench_structured.py`` measures the same corpus with the model (answers, speed); this holds the count
of schemas a job accepts, with no model: a change that refuses more of what people write fails here. Every
refusal is one line (a guest reads it in its ``schema_validation_failed``), and the schemas accepted compile
for a model too (the tiny random-weight model's vocabulary: the model-side compile is what a job does next).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tensorjob_jupyter import abi
from tensorjob_jupyter.host.schemas import SchemaError
from tensorjob_jupyter.host.structured import OutputSpec
from tensorjob_jupyter.inference.base import ConstraintError

from llama_support import tiny_files  # noqa: F401

pytestmark = pytest.mark.slow  # 289 schemas checked and compiled: seconds, so in the full suite

CORPUS = Path(__file__).resolve().parents[2] / "bench" / "schemas" / "real_world.jsonl"
#: What README and docs/guests.md say: 140 of the 289 are enforced.
CLAIMED = 140


def infer_with(schema) -> abi.Infer:
    return abi.command_from_json({"cmd": "infer", "prompt": "", "max_tokens": 1,
                                  "format": {"type": "json_schema", "name": "example", "schema": schema}})


@pytest.fixture(scope="module")
def judged():
    """Each corpus schema with its OutputSpec, or the refusal's message."""
    lines = CORPUS.read_text(encoding="utf-8").split("\n")  # not splitlines(): strings hold U+2028
    rows = [json.loads(line) for line in lines if line]
    out = []
    for row in rows:
        try:
            out.append((row, OutputSpec.of(infer_with(row["schema"])), None))
        except (SchemaError, ConstraintError, abi.AbiError) as e:
            out.append((row, None, str(e)))
    return out


def test_the_corpus_is_what_its_readme_says(judged):
    assert len(judged) == 289
    assert len({row["package"] for row, _, _ in judged}) == 20


def test_as_many_real_world_schemas_are_accepted_as_the_docs_claim(judged):
    accepted = [row["id"] for row, spec, _ in judged if spec is not None]
    assert len(accepted) >= CLAIMED, f"{len(accepted)} of {len(judged)} accepted; the docs claim {CLAIMED}"


def test_every_refusal_is_one_line_naming_what_is_refused(judged):
    for row, _, message in judged:
        if message is not None:
            assert message and "\n" not in message and len(message) <= 600, (row["id"], message)


def test_the_accepted_schemas_compile_for_a_model_too(judged, tiny_files):  # noqa: F811
    from tensorjob_jupyter.inference.llama import LlamaEngine

    engine = LlamaEngine(tiny_files["model"], n_ctx=256, n_threads=1, n_threads_batch=1)
    try:
        grammars = engine.grammars()
        refused = []
        for row, spec, _ in judged:
            if spec is not None:
                try:
                    grammars.matcher(spec.constraint)
                except ConstraintError as e:
                    refused.append((row["id"], str(e)))
        assert not refused, refused[:3]
    finally:
        engine.close()

"""The real model's logprobs and confidence: per token, after the grammar's mask, kept by a replay.

Short generations on the shared SmolLM2 fixture; the model's words are never asserted, only what must hold on
any machine: one record per generated token, each logprob at most 0, the records spelling the text, each
constrained field's confidence in [0, 1], and a replay with no model giving the same confidence.
"""

from __future__ import annotations

import json

import pytest

import tensorjob_jupyter as tj
from tensorjob_jupyter.abi import event_types
from tensorjob_jupyter.history.replay import replay
from tensorjob_jupyter.record.transcript import EventReader

from llama_support import smollm  # noqa: F401
import wat

SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                           "mood": {"enum": ["happy", "sad", "calm"]}},
          "required": ["city", "mood"], "additionalProperties": False}


def guest(result_from_answer: dict) -> bytes:
    infer = {"cmd": "infer", "prompt": "Name a city and a mood as JSON.", "max_tokens": 40, "logprobs": True,
             "top_logprobs": 3, "format": {"type": "json_schema", "name": "city", "schema": SCHEMA, "strict": True}}
    return wat.script_guest([infer, {"cmd": "done", "result": result_from_answer}])


@pytest.mark.slow  # the real model
def test_the_real_model_gives_a_logprob_per_token_and_a_confidence_per_field_that_a_replay_keeps(
        smollm, tmp_path):  # noqa: F811
    # first learn the answer (the guest's result is scripted, so it is run once to see what the model says)
    probe = tj.Job(guest({}), backend=smollm, runs_dir=tmp_path / "probe").start()
    assert probe.wait(120).ok
    events = list(EventReader(probe.run_dir))
    done = next(e for e in events if e["type"] == event_types.RESPONSE_OUTPUT_TEXT_DONE)
    answer = json.loads(done["text"])
    records = done["logprobs"]
    assert records and all(r["logprob"] <= 0 for r in records)
    assert all(len(r["top_logprobs"]) <= 3 and r["top_logprobs"] for r in records)
    assert bytes(b for r in records for b in r["bytes"]) == done["text"].encode()  # one record per token
    completed = next(e for e in events if e["type"] == event_types.RESPONSE_COMPLETED)
    assert len(records) == completed["response"]["usage"]["output_tokens"]
    deltas = [r for e in events if e["type"] == event_types.RESPONSE_OUTPUT_TEXT_DELTA for r in e["logprobs"]]
    assert deltas == records

    job = tj.Job(guest(answer), backend=smollm, runs_dir=tmp_path / "runs").start()
    envelope = job.wait(120)
    assert envelope.ok and envelope.result == answer
    assert set(envelope.confidence) == {"city", "mood"}
    assert all(0.0 <= v <= 1.0 for v in envelope.confidence.values())

    report = replay(guest(answer), job.run_dir, runs_dir=tmp_path / "replays")
    assert report.divergence is None and report.envelope.confidence == envelope.confidence

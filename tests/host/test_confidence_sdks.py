"""C and Zig guests read each token's logprob and each field's confidence through the ABI (``infer_done``'s
``logprobs`` and ``confidence``), and re-ask when the model was unsure: real compiled guests, real jobs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import tensorjob_jupyter as tj
from tensorjob_jupyter.inference.scripted import ScriptedBackend

GUESTS = Path(__file__).resolve().parents[1] / "guests"
ANSWER = '{"name": "Ada"}'


@pytest.mark.parametrize("source", ["reask.c", "reask.zig"])
@pytest.mark.parametrize("logprob, asks", [(-0.01, 1), (-3.0, 2)], ids=["sure", "unsure"])
def test_a_compiled_guest_re_asks_when_the_model_is_unsure_of_a_field(source, logprob, asks, tmp_path):
    envelope = tj.run(GUESTS / source, backend=ScriptedBackend(ANSWER, logprobs=logprob), runs_dir=tmp_path)
    assert envelope.ok, envelope
    result = envelope.result
    answer = result["answer"] if isinstance(result["answer"], dict) else json.loads(result["answer"])
    assert answer == {"name": "Ada"} and result["asks"] == asks and result["tokens"] > 0
    assert 0 < result["confidence"] <= 1
    assert (result["confidence"] < 0.5) == (logprob < -1)


@pytest.mark.parametrize("source", ["reask.c", "reask.zig"])
def test_a_model_without_logprobs_gives_a_compiled_guest_no_confidence(source, tmp_path):
    envelope = tj.run(GUESTS / source, backend=ScriptedBackend(ANSWER), runs_dir=tmp_path)
    assert envelope.ok, envelope
    assert (envelope.result["confidence"], envelope.result["asks"], envelope.result["tokens"]) == (None, 1, 0)

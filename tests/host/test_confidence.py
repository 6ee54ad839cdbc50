"""Logprobs and confidence: each token's logprob, each answer field's and each result field's confidence.

``token_logprob`` is checked against numpy's own softmax on made-up logits (the mask, the temperature and
the repeat penalty); ``answer_confidence`` and ``FieldConfidence`` on hand-made token records; Hypothesis
looks for JSON answers whose leaves ``json_leaves`` reads otherwise than ``json.loads``, for token records
read back from a transcript that break ``TokenLogprob.from_json``, and for logprob values that break the
Open Responses events (every event is checked by the openai SDK's types in ``conftest``). A job on the
scripted backend carries them to the events, the envelope and the transcript, and a replay with no model
gives them back. The real model's are in ``test_confidence_model.py``.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import tensorjob_jupyter as tj
from tensorjob_jupyter.abi import event_types
from tensorjob_jupyter.history.replay import replay
from tensorjob_jupyter.host.confidence import FieldConfidence, answer_confidence, answer_margins, json_leaves
from tensorjob_jupyter.host.fields import field_path, result_fields
from tensorjob_jupyter.inference.logprobs import (
    MAX_TOKEN_BYTES, MIN_LOGPROB, TokenLogprob, TokenText, TopLogprob, clamp_logprob, openai_logprobs, penalised,
    read_openai_logprobs, token_logprob,
)
from tensorjob_jupyter.inference.scripted import ScriptedBackend
from tensorjob_jupyter.record.transcript import EventReader

import wat

VOCAB = [b"a", b"b", b"c", b"d", b"e"]


def piece(i: int) -> bytes:
    return VOCAB[i]


def softmax(z: np.ndarray) -> np.ndarray:
    z = z.astype(np.float64)
    e = np.exp(z - z.max())
    return e / e.sum()


# --- one token's logprob ---------------------------------------------------------------------------------


def test_a_token_logprob_is_the_log_of_its_softmax_probability_and_the_runner_up_is_the_best_other():
    logits = np.array([2.0, 1.0, 0.5, -1.0, 3.0], dtype=np.float32)
    p = softmax(logits)
    record = token_logprob(logits, 0, piece, top=3)
    assert record.token == b"a"
    assert record.logprob == pytest.approx(math.log(p[0]), abs=1e-5)
    assert record.runner_up == pytest.approx(math.log(p[4]), abs=1e-5)
    assert [t.token for t in record.top] == [b"e", b"a", b"b"]
    assert [t.logprob for t in record.top] == sorted((t.logprob for t in record.top), reverse=True)
    assert record.to_json()["bytes"] == [ord("a")]


def test_the_grammar_mask_and_the_temperature_shape_the_distribution_the_token_was_drawn_from():
    logits = np.array([2.0, 1.0, 0.5, -1.0, 3.0], dtype=np.float32)
    allowed = np.array([True, True, False, False, False])
    masked = token_logprob(logits, 1, piece, allowed=allowed, top=5)
    assert masked.logprob == pytest.approx(math.log(softmax(np.array([2.0, 1.0]))[1]), abs=1e-5)
    assert {t.token for t in masked.top} == {b"a", b"b"}  # a token the grammar forbids is no alternative
    only = token_logprob(logits, 1, piece, allowed=np.array([False, True, False, False, False]))
    assert only.logprob == 0.0 and only.runner_up is None  # the grammar left one token: it was sure
    hot = token_logprob(logits, 0, piece, temperature=2.0)
    assert hot.logprob == pytest.approx(math.log(softmax(logits / 2.0)[0]), abs=1e-5)
    nothing = token_logprob(logits, 0, piece, allowed=np.zeros(5, bool))
    assert nothing.logprob == MIN_LOGPROB


def test_the_repeat_penalty_is_llama_cpps():
    logits = np.array([2.0, -1.0, 0.5, 1.0, 3.0], dtype=np.float32)
    out = penalised(logits, [0, 1, 1], 2.0)
    assert out.tolist() == [1.0, -2.0, 0.5, 1.0, 3.0]
    assert logits.tolist() == [2.0, -1.0, 0.5, 1.0, 3.0]  # a copy
    record = token_logprob(logits, 0, piece, penalty=2.0, recent=[0, 1, 1])
    assert record.logprob == pytest.approx(math.log(softmax(out)[0]), abs=1e-5)


def reference_logprob(logits, token, piece, *, temperature=0.0, penalty=1.0, recent=(), allowed=None, top=0):
    """The record as first written: a penalised copy masked, scaled, its maximum, then the token set to minus
    infinity for the runner-up. What ``token_logprob`` must give, bit for bit."""
    z = penalised(logits, recent, penalty)
    if allowed is not None:
        np.copyto(z, np.float32(-np.inf), where=~allowed)
    if temperature > 0.0 and temperature != 1.0:
        z /= np.float32(temperature)
    best = float(z.max())
    if not math.isfinite(best):
        return TokenLogprob(piece(token), MIN_LOGPROB)
    total = best + math.log(float(np.exp(z - np.float32(best)).sum(dtype=np.float64)))
    chosen = float(z[token])
    alternatives: tuple = ()
    n = min(max(int(top), 0), 20, z.size)
    if n:
        ids = np.argpartition(z, -n)[-n:]
        ids = ids[np.argsort(-z[ids], kind="stable")]
        alternatives = tuple(TopLogprob(piece(int(i)), clamp_logprob(float(z[i]) - total))
                             for i in ids if math.isfinite(float(z[i])))
    z[token] = -np.inf
    other = float(z.max())
    return TokenLogprob(piece(token), clamp_logprob(chosen - total) if math.isfinite(chosen) else MIN_LOGPROB,
                        clamp_logprob(other - total) if math.isfinite(other) else None, alternatives)


@given(st.lists(st.floats(width=32, allow_nan=False) | st.sampled_from([-np.inf, 0.0]), min_size=1, max_size=60),
       st.data())
def test_a_record_is_the_one_a_penalised_masked_copy_gives(values, data):
    """The record read from the row without copying it (the runner-up from either side of the token, the maximum
    from the two) is the one a masked, penalised, scaled copy gives, bit for bit, and the row is left as it was."""
    logits = np.array(values, dtype=np.float32)
    before = logits.copy()
    token = data.draw(st.integers(0, len(values) - 1))
    options = {"temperature": data.draw(st.sampled_from([0.0, 0.5, 1.0, 3.0])), "top": data.draw(st.integers(0, 20))}
    if data.draw(st.booleans()):
        options["allowed"] = np.array(data.draw(st.lists(st.booleans(), min_size=len(values), max_size=len(values))))
    if data.draw(st.booleans()):
        options["penalty"] = data.draw(st.sampled_from([1.1, 1.3, 2.0]))
        options["recent"] = data.draw(st.lists(st.integers(0, len(values) - 1), max_size=80))
    piece = lambda i: bytes([i % 256])  # noqa: E731
    with np.errstate(all="ignore"):
        assert token_logprob(logits, token, piece, **options) == reference_logprob(logits, token, piece, **options)
    assert np.array_equal(logits.view(np.uint32), before.view(np.uint32))


@given(st.lists(st.floats(-1e4, 1e4, width=32), min_size=2, max_size=40), st.data())
def test_any_logits_give_finite_logprobs_at_most_zero(values, data):
    logits = np.array(values, dtype=np.float32)
    token = data.draw(st.integers(0, len(values) - 1))
    record = token_logprob(logits, token, lambda i: bytes([i % 256]), top=data.draw(st.integers(0, 20)),
                           temperature=data.draw(st.sampled_from([0.0, 0.5, 1.0, 3.0])))
    for value in [record.logprob, *(t.logprob for t in record.top)] + (
            [record.runner_up] if record.runner_up is not None else []):
        assert math.isfinite(value) and MIN_LOGPROB <= value <= 0.0
    assert TokenLogprob.from_json(json.loads(json.dumps(record.to_json()))) == record


def test_clamping_keeps_a_logprob_a_finite_json_number_at_most_zero():
    assert clamp_logprob(1e-7) == 0.0 and math.copysign(1, clamp_logprob(-0.0)) == 1.0
    assert clamp_logprob(float("-inf")) == MIN_LOGPROB
    with pytest.raises(ValueError):
        clamp_logprob(float("nan"))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**30, 10**30) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20)


@given(json_values, st.sampled_from([None, 1, 2]), st.booleans())
def test_json_leaves_reads_every_leaf_as_json_loads_does_with_its_span(value, indent, ascii_only):
    text = json.dumps(value, indent=indent, ensure_ascii=ascii_only)
    leaves = json_leaves(text)
    assert leaves is not None
    expected = list(result_fields(json.loads(text)))
    assert [(field_path(parts), leaf) for parts, leaf, _, _ in leaves] == expected
    for _, leaf, start, end in leaves:
        assert json.loads(text[start:end]) == leaf


@given(st.text(max_size=40))
def test_json_leaves_says_none_for_text_that_is_not_one_json_value(text):
    try:
        json.loads(text)
    except ValueError:
        assert json_leaves(text) is None


untrusted_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(
        st.sampled_from(["token", "logprob", "bytes", "top_logprobs", "runner_up_logprob", "x"]), inner,
        max_size=5), max_leaves=30)


@given(untrusted_json)
def test_a_token_record_read_back_is_one_as_written_or_a_value_error(value):
    try:
        record = TokenLogprob.from_json(value)
    except ValueError:
        return
    assert len(record.token) <= MAX_TOKEN_BYTES and MIN_LOGPROB <= record.logprob <= 0.0
    assert record.runner_up is None or MIN_LOGPROB <= record.runner_up <= 0.0
    json.dumps(record.to_json(), allow_nan=False)


server_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(
        st.sampled_from(["content", "tokens", "token_logprobs", "top_logprobs", "text_offset", "token", "logprob",
                         "bytes", "runner_up_logprob", "x"]) | st.text(max_size=3), inner, max_size=5),
    max_leaves=40)


@given(server_json, st.integers(0, 20))
def test_a_server_s_logprobs_are_records_as_written_or_a_value_error(value, top):
    try:
        records = read_openai_logprobs(value, top)
    except ValueError:
        return
    for record in records:
        assert len(record.top) <= top and MIN_LOGPROB <= record.logprob <= 0.0
        assert record.runner_up is None or MIN_LOGPROB <= record.runner_up <= 0.0
        json.dumps(record.to_json(), allow_nan=False)


logprob_values = st.floats(-50.0, 0.0)
records_strategy = st.lists(st.builds(
    lambda token, lp, tops: TokenLogprob(token.encode(), lp, None, tuple(
        TopLogprob(t.encode(), v) for t, v in sorted(tops.items(), key=lambda kv: -kv[1]))),
    st.text(min_size=1, max_size=6), logprob_values,
    st.dictionaries(st.text(min_size=1, max_size=6), logprob_values, max_size=4)), max_size=8)


@given(records_strategy, st.booleans())
def test_records_written_in_either_openai_shape_read_back_the_same(records, chat):
    """What ``tensorjob serve`` writes, its client reads: tokens, logprobs, alternatives, and a runner-up that
    is the best alternative other than the chosen token."""
    back = read_openai_logprobs(json.loads(json.dumps(openai_logprobs(records, chat=chat))), top=20)
    assert [(r.token, r.logprob) for r in back] == [(r.token, r.logprob) for r in records]
    for r, b in zip(records, back):
        assert sorted((t.token, t.logprob) for t in b.top) == sorted((t.token, t.logprob) for t in r.top)
        assert b.runner_up == max((t.logprob for t in r.top if t.token != r.token), default=None)


# --- an answer's fields ----------------------------------------------------------------------------------


def records_for(pieces: list[str], logprobs: list[float], runner_up: list[float | None] | None = None):
    runner_up = runner_up or [None] * len(pieces)
    return [TokenLogprob(p.encode(), lp, r) for p, lp, r in zip(pieces, logprobs, runner_up)]


def test_a_field_s_confidence_is_the_probability_of_the_tokens_that_spell_it():
    pieces = ['{"', 'name', '":', ' "', 'Ada', ' Love', 'lace', '",', ' "n', '":', ' 4', '2', '}']
    lps = [0.0, 0.0, 0.0, 0.0, -0.1, -0.2, -0.3, -0.05, 0.0, 0.0, -0.5, -0.25, 0.0]
    text = "".join(pieces)
    leaves = answer_confidence(text, records_for(pieces, lps), "json")
    # "Ada Lovelace" spans ' "' .. '",' (the quotes are its tokens too)
    assert leaves[("name",)] == ("Ada Lovelace", pytest.approx(math.exp(-0.1 - 0.2 - 0.3 - 0.05)))
    assert leaves[("n",)] == (42, pytest.approx(math.exp(-0.5 - 0.25)))


def test_an_enum_field_and_a_choice_are_measured_against_the_runner_up():
    schema = {"type": "object", "properties": {"mood": {"enum": ["happy", "sad"]}, "ok": {"type": "boolean"}}}
    pieces = ['{"mood": "', 'happy', '", "ok": ', 'true', '}']
    lps = [0.0, math.log(0.6), 0.0, math.log(0.9), 0.0]
    runner = [None, math.log(0.2), None, math.log(0.1), None]
    leaves = answer_confidence("".join(pieces), records_for(pieces, lps, runner), "json", schema)
    assert leaves[("mood",)][1] == pytest.approx(0.6 / (0.6 + 0.2))  # not 0.6: only the options count
    assert leaves[("ok",)][1] == pytest.approx(0.9)
    chosen = answer_confidence("yes", records_for(["yes"], [math.log(0.5)], [math.log(0.5)]), "choices")
    assert chosen == {(): ("yes", pytest.approx(0.5))}


def test_tokens_that_do_not_spell_the_answer_give_no_confidence():
    assert answer_confidence('{"a": 1}', records_for(['{"a": 2}'], [-0.1]), "json") is None
    assert answer_confidence('{"a": 1}', [], "json") is None
    assert answer_confidence("free text", records_for(["free text"], [-0.1]), "text") is None


def cut_anywhere(text: str, data) -> list[bytes]:
    """``text``'s UTF-8 bytes cut at up to ten places Hypothesis draws (a token may end inside a character)."""
    raw = text.encode("utf-8")
    cuts = sorted(set(data.draw(st.lists(st.integers(1, max(1, len(raw) - 1)), max_size=10))))
    bounds = [0, *[c for c in cuts if c < len(raw)], len(raw)]
    return [raw[a:b] for a, b in zip(bounds, bounds[1:])]


@given(json_values, st.data())
def test_any_json_answer_split_anywhere_gives_confidences_in_0_1(value, data):
    text = json.dumps(value, ensure_ascii=False)
    records = [TokenLogprob(piece, data.draw(st.floats(MIN_LOGPROB, 0.0)),
                            data.draw(st.none() | st.floats(MIN_LOGPROB, 0.0))) for piece in cut_anywhere(text, data)]
    leaves = answer_confidence(text, records, "json")
    assert leaves is not None
    for _, score in leaves.values():
        assert score is not None and 0.0 <= score <= 1.0
    folded = FieldConfidence()
    folded.add(leaves)
    confidence = folded.of(value)
    assert confidence is None or set(confidence) == {path for path, _ in result_fields(value)}


def test_a_leaf_s_margin_is_its_deciding_token_against_the_runner_up():
    pieces = ['{"', 'name', '":', ' "', 'Ada', ' Love', 'lace', '",', ' "n', '":', ' 4', '2', '}']
    lps = [0.0, 0.0, 0.0, 0.0, math.log(0.9), math.log(0.5), math.log(0.8), 0.0, 0.0, 0.0, math.log(0.7), 0.0, 0.0]
    runner = [None, None, None, None, math.log(0.05), math.log(0.4), math.log(0.1), None, None, None, None, None,
              None]
    margins = answer_margins("".join(pieces), records_for(pieces, lps, runner), "json")
    assert margins[("name",)] == ("Ada Lovelace", pytest.approx(0.5 / (0.5 + 0.4)))  # ' Love': its least sure token
    assert margins[("n",)] == (42, 1.0)  # ' 4' had no other token the distribution allowed
    assert answer_margins('{"a": 1}', records_for(['{"a": 2}'], [-0.1]), "json") is None


@given(json_values, st.data())
def test_a_leaf_s_margin_is_never_under_the_probability_of_its_spelling(value, data):
    text = json.dumps(value, ensure_ascii=False)
    records = []
    for piece in cut_anywhere(text, data):
        lp = data.draw(st.floats(-30.0, 0.0))
        room = 1.0 - math.exp(lp)  # what the other tokens may hold between them
        runner = (math.log(room * data.draw(st.floats(1e-6, 1.0))) if room > 1e-9 and data.draw(st.booleans())
                  else None)
        records.append(TokenLogprob(piece, lp, runner))
    spelled, margins = answer_confidence(text, records, "json"), answer_margins(text, records, "json")
    assert spelled is not None and margins is not None and set(margins) == set(spelled)
    for parts, (leaf, margin) in margins.items():
        assert margin is not None and 0.0 <= margin <= 1.0
        score = spelled[parts][1]
        assert score is not None and margin >= score - 1e-9, (parts, leaf, margin, score)


def test_a_result_field_takes_the_confidence_of_the_answer_leaf_it_came_from():
    folded = FieldConfidence()
    folded.add({("name",): ("Ada", 0.8), ("n",): (1, 0.5)})
    folded.add({("name",): ("Grace", 0.3)})
    assert folded.of({"name": "Ada", "n": 1.0, "other": "Grace", "made": "by the guest", "flag": True}) == {
        "name": 0.8, "n": 0.5, "other": 0.3, "made": None, "flag": None}
    assert FieldConfidence().of({"a": 1}) is None


# --- through a job, its transcript and a replay ----------------------------------------------------------

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}
ANSWER = '{"name": "Ada", "age": 36}'


def confident_guest(logprobs: bool = True, top: int = 2) -> bytes:
    infer = {"cmd": "infer", "prompt": "who?", "max_tokens": 20,
             "format": {"type": "json_schema", "name": "person", "schema": SCHEMA, "strict": True}}
    if logprobs:
        infer.update(logprobs=True, top_logprobs=top)
    return wat.script_guest([infer, {"cmd": "done", "result": {"name": "Ada", "age": 36, "note": "mine"}}])


def events_of(job) -> list[dict]:
    return list(EventReader(job.run_dir))


def test_a_job_carries_logprobs_to_its_events_and_confidence_to_its_envelope_and_a_replay_keeps_them(tmp_path):
    backend = ScriptedBackend(ANSWER, logprobs=[-0.1, -0.2, -0.3, -0.4])
    job = tj.Job(confident_guest(), backend=backend, runs_dir=tmp_path).start()
    envelope = job.wait(60)
    assert envelope.ok, envelope
    conf = envelope.confidence
    assert set(conf) == {"name", "age", "note"} and conf["note"] is None  # the guest's own: no answer spelled it
    assert 0.0 < conf["name"] < 1.0 and 0.0 < conf["age"] < 1.0
    events = events_of(job)
    deltas = [e for e in events if e["type"] == event_types.RESPONSE_OUTPUT_TEXT_DELTA]
    assert deltas and all(len(d["logprobs"]) == 1 and d["logprobs"][0]["logprob"] <= 0 for d in deltas)
    assert all(len(d["logprobs"][0]["top_logprobs"]) == 2 for d in deltas)
    done = next(e for e in events if e["type"] == event_types.RESPONSE_OUTPUT_TEXT_DONE)
    assert [r["logprob"] for r in done["logprobs"]] == [d["logprobs"][0]["logprob"] for d in deltas]
    assert json.loads((job.run_dir / "envelope.json").read_text())["confidence"] == conf

    report = replay(confident_guest(), job.run_dir, runs_dir=tmp_path / "replays")
    assert report.divergence is None and report.same_result
    assert report.envelope.confidence == conf


def test_a_guest_gets_the_logprobs_and_confidence_in_infer_done_only_when_it_asks(tmp_path):
    from tensorjob_jupyter import abi
    backend = ScriptedBackend(ANSWER, logprobs=-0.5)
    seen = {}
    for asked in (True, False):
        job = tj.Job(confident_guest(asked), backend=backend, runs_dir=tmp_path).start()
        assert job.wait(60).ok
        seen[asked] = job
    # what the guest received is the event the infer's response.completed precedes; read it off the wire form
    done = abi.InferDone("x", 1, logprobs=({"token": "x", "logprob": -0.5, "bytes": [120], "top_logprobs": [],
                                             "runner_up_logprob": None},), confidence={"": 0.6})
    assert abi.event_from_json(json.loads(abi.encode_event(done))) == done
    assert seen[True].wait().confidence == seen[False].wait().confidence  # the envelope's, asked or not


def test_a_model_that_gives_no_logprobs_leaves_confidence_none(tmp_path):
    job = tj.Job(confident_guest(), backend=ScriptedBackend(ANSWER), runs_dir=tmp_path).start()
    envelope = job.wait(60)
    assert envelope.ok and envelope.confidence is None and "confidence" not in envelope.to_json()
    deltas = [e for e in events_of(job) if e["type"] == event_types.RESPONSE_OUTPUT_TEXT_DELTA]
    assert deltas and all(d["logprobs"] == [] for d in deltas)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.floats(allow_nan=False), min_size=1, max_size=6))
def test_no_logprob_value_breaks_the_events(tmp_path, values):
    """Any scripted value (huge, tiny, positive, -inf) is written as a logprob the SDK's types accept."""
    job = tj.Job(confident_guest(top=20), backend=ScriptedBackend(ANSWER, logprobs=values), runs_dir=tmp_path).start()
    envelope = job.wait(60)
    assert envelope.ok
    for score in (envelope.confidence or {}).values():
        assert score is None or 0.0 <= score <= 1.0


def test_a_replay_of_a_transcript_with_broken_records_has_no_confidence_but_the_same_result(tmp_path):
    backend = ScriptedBackend(ANSWER, logprobs=-0.1)
    job = tj.Job(confident_guest(), backend=backend, runs_dir=tmp_path).start()
    assert job.wait(60).confidence
    lines = job.transcript_path.read_text().splitlines()
    broken = []
    for line in lines:
        event = json.loads(line)
        if event["type"] == event_types.RESPONSE_OUTPUT_TEXT_DELTA:
            event["logprobs"] = [{"token": "x", "logprob": 5, "bytes": [1] * 10_000}]
        broken.append(json.dumps(event))
    job.transcript_path.write_text("\n".join(broken) + "\n")
    report = replay(confident_guest(), job.run_dir, runs_dir=tmp_path / "replays")
    assert report.same_result and report.envelope.confidence is None


def test_token_text_is_a_plain_string_that_carries_its_records():
    record = TokenLogprob(b"hi", -0.5)
    text = TokenText("hi", [record])
    assert text == "hi" and isinstance(text, str) and text.logprobs == (record,)
    import pickle
    assert pickle.loads(pickle.dumps(text)).logprobs == (record,)


def test_a_map_keeps_each_item_s_confidence_in_results_jsonl_and_rows_give_confidence_columns(tmp_path):
    from tensorjob_jupyter.fanout import map as tj_map
    result = tj_map(confident_guest(), [{"id": "a"}, {"id": "b"}], tmp_path / "run",
                    backend=ScriptedBackend(ANSWER, logprobs=-0.1))
    assert result.completed == 2
    records = [json.loads(line) for line in result.results_path.read_text().splitlines()]
    assert all(set(r["confidence"]) == {"name", "age", "note"} for r in records)
    rows = result.rows()
    assert all(0 < row["confidence.name"] < 1 and row["confidence.note"] is None for row in rows)
    assert rows[0]["confidence.age"] == records[0]["confidence"]["age"]
    # read back as untrusted: a value out of range is None, not a number that looks like one
    edited = [{**r, "confidence": {"name": 7, "age": "high"}} for r in records]
    result.results_path.write_text("".join(json.dumps(r) + "\n" for r in edited))
    assert result.confidences() == {0: {"name": None, "age": None}, 1: {"name": None, "age": None}}
    plain = tj_map(confident_guest(), [{"id": "a"}], tmp_path / "plain", backend=ScriptedBackend(ANSWER))
    assert not any(key.startswith("confidence.") for key in plain.rows()[0])


def test_a_null_is_measured_against_the_best_non_null_start():
    """A null is the model's choice to give no value: ``p / (p + q)`` at its deciding token, ``q`` the most likely
    token that does not begin ``null`` too (from ``top`` where given, else the runner-up)."""
    pieces = ['{"due": ', 'null', ', "n": ', '4', '}']
    lps = [0.0, math.log(0.6), 0.0, math.log(0.9), 0.0]
    runner = [None, math.log(0.3), None, None, None]
    first = answer_confidence("".join(pieces), records_for(pieces, lps, runner), "json")
    assert first[("due",)] == (None, pytest.approx(0.6 / (0.6 + 0.3)))  # not 0.6, the tokens' probability
    # with top alternatives: another spelling of null (" nu") is not an alternative to it; '"' is
    top = (TopLogprob(b"null", math.log(0.6)), TopLogprob(b" nu", math.log(0.3)), TopLogprob(b'"', math.log(0.1)))
    records = [TokenLogprob(p.encode(), lp, r, top if p == "null" else ()) for p, lp, r in zip(pieces, lps, runner)]
    leaves = answer_confidence("".join(pieces), records, "json")
    assert leaves[("due",)][1] == pytest.approx(0.6 / (0.6 + 0.1))
    # every alternative listed begins null: the least of them bounds the best non-null start
    only_nulls = (TopLogprob(b"null", math.log(0.6)), TopLogprob(b"n", math.log(0.2)))
    records = [TokenLogprob(p.encode(), lp, r, only_nulls if p == "null" else ()) for p, lp, r in
               zip(pieces, lps, runner)]
    assert answer_confidence("".join(pieces), records, "json")[("due",)][1] == pytest.approx(0.6 / (0.6 + 0.2))
    # a sure null (no other token allowed) is 1; the confidence reaches the result's null field
    sure = answer_confidence("".join(pieces), records_for(pieces, lps), "json")
    assert sure[("due",)] == (None, 1.0)
    folded = FieldConfidence()
    folded.add(first)
    assert folded.of({"due": None, "n": 4})["due"] == pytest.approx(0.6 / (0.6 + 0.3))

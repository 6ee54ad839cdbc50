"""The reactor end to end on real wasm: files, infer and tokens, the event stream, the transcript."""

import json
import threading
import time


import tensorjob_jupyter as tj
from tensorjob_jupyter.abi import JobStatus, codes
from tensorjob_jupyter.record.transcript import read_run as load_transcript
from tensorjob_jupyter.inference import ScriptedBackend

import wat

DONE = {"cmd": "done", "result": "finished"}


def types(job):
    return [e["type"] for e in job.events]


def run_job(commands, **kwargs):
    script_kwargs = {k: kwargs.pop(k) for k in ("stop_after_tokens", "extra", "imports", "init_body") if k in kwargs}
    job = tj.Job(wat.script_guest(commands, **script_kwargs), **kwargs).start()
    job.wait(30)
    return job


# --- emit, open, slice -----------------------------------------------------------------------


def test_emit_goes_to_subscribers_verbatim():
    payload = {"done": 1, "total": 3, "nested": ["é", None, 1.5]}
    job = run_job([{"cmd": "emit", "progress": payload}, DONE])
    assert job.envelope.ok and job.result == "finished"
    [progress] = [e for e in job.events if e["type"] == "job.progress"]
    assert progress["progress"] == payload


def test_open_and_slice_publish_file_events(tmp_path):
    doc = tmp_path / "doc.txt"
    doc.write_text("hello window world")
    job = run_job([{"cmd": "open", "path": str(doc)}, {"cmd": "slice", "handle": 0, "offset": 6, "len": 6}, DONE],
                  read=[tmp_path])
    assert job.envelope.ok
    opened = next(e for e in job.events if e["type"] == "job.file.opened")
    assert (opened["handle"], opened["len"], opened["kind"]) == (0, 18, {"kind": "text"})
    sliced = next(e for e in job.events if e["type"] == "job.file.sliced")
    assert (sliced["offset"], sliced["length"], sliced["next_offset"], sliced["preview"]) == (6, 6, 12, "window")
    assert job.stats.bytes_read == 6


def test_a_read_outside_the_grant_fails_with_capability_denied(tmp_path, healthy):
    (tmp_path / "granted").mkdir()
    job = run_job([{"cmd": "open", "path": "/etc/passwd"}, DONE], read=[tmp_path / "granted"])
    assert job.envelope.error.code == codes.CAPABILITY_DENIED and job.result is None
    assert "read not permitted: /etc/passwd" in job.envelope.error.message


def test_a_missing_file_inside_the_grant_is_not_found(tmp_path):
    job = run_job([{"cmd": "open", "path": str(tmp_path / "nope.txt")}, DONE], read=[tmp_path])
    assert job.envelope.error.code == codes.NOT_FOUND


def test_the_window_cap_returns_fewer_bytes_to_the_guest(tmp_path):
    (tmp_path / "big.txt").write_text("z" * 10_000)
    job = run_job([{"cmd": "open", "path": str(tmp_path / "big.txt")},
                   {"cmd": "slice", "handle": 0, "offset": 0, "len": 1_000_000}, DONE],
                  read=[tmp_path], limits=tj.Limits(max_window_bytes=1000))
    sliced = next(e for e in job.events if e["type"] == "job.file.sliced")
    assert (sliced["requested"], sliced["length"], sliced["next_offset"]) == (1_000_000, 1000, 1000)


def test_too_many_open_handles_is_a_limit(tmp_path, healthy):
    (tmp_path / "f.txt").write_text("x")
    job = run_job([{"cmd": "open", "path": str(tmp_path / "f.txt")}], read=[tmp_path],
                  limits=tj.Limits(max_handles=3))
    assert job.envelope.error.code == codes.LIMIT_EXCEEDED and "max_handles" in job.envelope.error.message
    assert job.stats.files_opened == 3


def test_slice_bytes_returns_padded_base64(tmp_path):
    (tmp_path / "b.bin").write_bytes(b"\x00\x01\x02\x03\xff")
    job = run_job([{"cmd": "open", "path": str(tmp_path / "b.bin")},
                   {"cmd": "slice_bytes", "handle": 0, "offset": 1, "len": 4}, DONE], read=[tmp_path])
    assert job.envelope.ok
    opened = next(e for e in job.events if e["type"] == "job.file.opened")
    assert opened["kind"] == {"kind": "binary"}
    sliced = next(e for e in job.events if e["type"] == "job.file.sliced")
    assert sliced["binary"] and sliced["preview_base64"] == "AQID/w=="


# --- infer and tokens ------------------------------------------------------------------------


INFER = {"cmd": "infer", "prompt": "say something", "max_tokens": 16}


def test_infer_streams_tokens_as_one_open_responses_sequence():
    job = run_job([INFER, DONE], backend=ScriptedBackend("alpha beta gamma"))
    assert job.envelope.ok
    seq = [t for t in types(job) if t.startswith("response.")]
    assert seq == ["response.created", "response.in_progress", "response.output_item.added",
                   "response.content_part.added", "response.output_text.delta", "response.output_text.delta",
                   "response.output_text.delta", "response.output_text.done", "response.content_part.done",
                   "response.output_item.done", "response.completed"]
    deltas = [e["delta"] for e in job.events if e["type"] == "response.output_text.delta"]
    assert deltas == ["alpha", " beta", " gamma"]
    item_ids = {e["item_id"] for e in job.events if "item_id" in e}
    assert len(item_ids) == 1
    done = next(e for e in job.events if e["type"] == "response.completed")["response"]
    assert done["status"] == "completed" and done["output_text"] == "alpha beta gamma"
    assert done["incomplete_details"] is None and done["error"] is None
    assert done["usage"]["output_tokens"] == 3
    assert done["usage"]["input_tokens_details"] == {"cached_tokens": 0, "cache_write_tokens": 2}
    assert job.envelope.usage.tokens_out == 3 and job.envelope.usage.tokens_in == 2
    assert job.envelope.usage.model == "scripted"


def test_reaching_max_tokens_is_response_incomplete():
    job = run_job([{"cmd": "infer", "prompt": "p", "max_tokens": 2}, DONE], backend=ScriptedBackend("a b c d"))
    inc = next(e for e in job.events if e["type"] == "response.incomplete")["response"]
    assert inc["incomplete_details"] == {"reason": "max_output_tokens"} and inc["output"][0]["status"] == "incomplete"
    assert job.envelope.usage.tokens_out == 2


def test_a_stop_verdict_truncates_generation_and_is_not_an_error(monkeypatch):
    from tensorjob_jupyter.host import tokens

    # the guest's verdict, not the fallback for a guest too slow to answer (a loaded machine can be that slow)
    monkeypatch.setattr(tokens, "LOOKAHEAD_WAIT_S", 30.0)
    backend = ScriptedBackend(" ".join(f"w{i}" for i in range(50)))
    job = run_job([INFER | {"max_tokens": 50}, DONE], backend=backend, stop_after_tokens=1)
    assert job.envelope.ok
    assert job.envelope.usage.tokens_out <= 2
    # The guest's stop ends the response as a stop sequence would: completed, with our finish_reason.
    done = next(e for e in job.events if e["type"] == "response.completed")
    assert done["finish_reason"] == "guest_stop" and done["response"]["incomplete_details"] is None


def test_the_model_waits_for_a_guest_that_judges_tokens_and_never_for_one_that_cannot(monkeypatch):
    """A guest with no say over the answer (no ``cf_on_token``) lets the model run free from its first piece; one
    that judges each piece holds the model one piece ahead until its verdict."""
    from concurrent.futures import Future

    from tensorjob_jupyter.host import tokens

    monkeypatch.setattr(tokens, "LOOKAHEAD_WAIT_S", 300.0)  # a wait for the guest: far longer than this test

    class Model:  # generate_stream's pieces are offered by the test's own producer thread
        def generate_stream(self, request, on_piece):
            return Future()

    def produce(source, pieces):
        done = threading.Event()
        threading.Thread(target=lambda: ([source(p) for p in pieces], done.set()), daemon=True).start()
        return done

    free = tokens.ModelTokens(Model(), None, threading.Event(), None, judged=False)
    assert produce(free, "abcdef").wait(20)  # not one piece judged, nothing waited for
    assert [free.get(1) for _ in range(6)] == list("abcdef")

    held = tokens.ModelTokens(Model(), None, threading.Event(), None)
    done = produce(held, "ab")
    assert held.get(30) == "a"
    assert not done.wait(0.3)  # "b" waits for the guest's verdict on "a"
    held.judged(0)
    assert done.wait(20) and held.get(20) == "b"


def test_each_token_reaches_subscribers_before_cf_on_token():
    # cf_on_token traps on the first token: the delta must already be published.
    job = run_job([INFER, DONE], backend=ScriptedBackend("first second"),
                  extra='(func (export "cf_on_token") (param i32 i32) (result i32) (unreachable))')
    assert job.envelope.error.code == codes.WASM_TRAP and "cf_on_token" in job.envelope.error.message
    assert [e["delta"] for e in job.events if e["type"] == "response.output_text.delta"][:1] == ["first"]
    assert types(job)[-3:] == ["error", "response.failed", "job.failed"]


def test_a_model_error_is_model_load_failed_with_error_then_response_failed(healthy):
    job = run_job([INFER, DONE], backend=ScriptedBackend(fail="weights are corrupt"))
    assert job.envelope.error.code == codes.MODEL_LOAD_FAILED
    assert "weights are corrupt" in job.envelope.error.message
    assert types(job)[-3:] == ["error", "response.failed", "job.failed"]
    err = next(e for e in job.events if e["type"] == "error")
    assert (err["code"], err["error_type"], err["param"]) == ("model_load_failed", "model_error", None)
    assert "weights are corrupt" in err["message"]


def test_a_job_without_a_model_cannot_infer():
    job = run_job([INFER, DONE], backend=None)
    assert job.envelope.error.code == codes.MODEL_LOAD_FAILED and "no model" in job.envelope.error.message


def test_images_need_a_vision_model():
    job = run_job([INFER | {"images": [0]}, DONE], backend=ScriptedBackend("x"))
    assert job.envelope.error.code == codes.UNSUPPORTED


def test_the_job_token_budget_clamps_then_refuses(healthy):
    job = run_job([INFER, INFER, DONE], backend=ScriptedBackend("a b c d e"), limits=tj.Limits(max_tokens=3))
    assert job.envelope.error.code == codes.LIMIT_EXCEEDED and "token budget" in job.envelope.error.message
    assert job.envelope.usage.tokens_out == 3  # usage survives the failure
    assert job.result is None


def test_usage_is_set_on_a_failure_after_inference():
    job = run_job([INFER, {"cmd": "fail", "code": "x", "message": "late"}], backend=ScriptedBackend("a b"))
    env = job.envelope
    assert env.status is JobStatus.FAILED and env.usage.tokens_out == 2 and env.usage.model == "scripted"
    assert "result" not in env.to_json()


def test_cancel_during_inference_reaches_the_decoder(healthy):
    backend = ScriptedBackend(" ".join(["tok"] * 1000), token_delay_s=0.01)
    job = tj.Job(wat.script_guest([INFER | {"max_tokens": 1000}, DONE]), backend=backend).start()
    time.sleep(0.2)
    job.cancel()
    env = job.wait(5)
    assert env.status is JobStatus.CANCELLED and env.error.message == "cancelled during inference"
    time.sleep(0.1)
    served = backend.requests_served
    assert served == 1  # the generation ended; the worker is free
    produced = len([e for e in job.events if e["type"] == "response.output_text.delta"])
    assert produced < 100
    assert produced <= env.usage.tokens_out <= produced + 2  # usage counts the cancelled infer
    ended = next(e for e in job.events if e["type"] == "response.incomplete")
    assert ended["finish_reason"] == "cancelled" and ended["response"]["status"] == "cancelled"


def test_embed_answers_embedded():
    job = run_job([{"cmd": "embed", "texts": ["a", "b", "c"]}, DONE], backend=ScriptedBackend("x"))
    assert job.envelope.ok
    ev = next(e for e in job.events if e["type"] == "job.embedded")
    assert (ev["count"], ev["dimensions"]) == (3, 8)


def test_a_document_command_on_a_handle_the_job_does_not_hold_is_denied():
    job = run_job([{"cmd": "page_text", "handle": 0, "page": 0}])
    assert job.envelope.error.code == codes.CAPABILITY_DENIED and "no such handle: 0" in job.envelope.error.message


# --- the stream and the transcript ----------------------------------------------------------------


def test_events_are_numbered_from_zero_without_gaps_and_carry_the_job_id(tmp_path):
    (tmp_path / "d.txt").write_text("abc")
    job = run_job([{"cmd": "emit", "progress": 1}, {"cmd": "open", "path": str(tmp_path / "d.txt")}, INFER, DONE],
                  read=[tmp_path], backend=ScriptedBackend("x y"))
    assert [e["sequence_number"] for e in job.events] == list(range(len(job.events)))
    assert all(e["job_id"] == job.id for e in job.events)
    assert types(job)[0] == "job.created" and types(job)[-1] == "job.completed"


def test_the_transcript_is_lossless_and_has_the_envelope():
    job = run_job([{"cmd": "emit", "progress": {"k": "ü\n<b>"}}, INFER, DONE], backend=ScriptedBackend("p q"))
    events, envelope = load_transcript(job.run_dir)
    assert events == job.events
    assert envelope == job.envelope.to_json()
    assert json.loads(job.envelope_path.read_text()) == envelope


def test_a_slow_subscriber_never_blocks_the_job():
    job = tj.Job(wat.script_guest([{"cmd": "emit", "progress": i} for i in range(200)] + [DONE]))
    stuck = job.subscribe(maxsize=5)  # never read
    fast = job.subscribe()
    env = job.start().wait(10)
    assert env.ok
    received = list(fast)
    assert [e["sequence_number"] for e in received] == list(range(len(job.events)))
    # The slow reader still gets every event, in order, read back from the transcript.
    assert [e["sequence_number"] for e in stuck] == list(range(len(job.events)))
    assert stuck.read_back >= len(job.events) - 5


def test_a_live_subscriber_sees_events_while_the_job_runs():
    backend = ScriptedBackend(" ".join(["w"] * 30), token_delay_s=0.01)
    job = tj.Job(wat.script_guest([INFER | {"max_tokens": 30}, DONE]), backend=backend)
    sub = job.subscribe()
    job.start()
    first_delta_at = None
    for event in sub:
        if event["type"] == "response.output_text.delta" and first_delta_at is None:
            first_delta_at = time.monotonic()
            assert not job.done
    # the stream ends with the job's last event, which is published a moment before the job is marked done
    assert first_delta_at is not None and job.wait_done(10)


def test_several_jobs_run_at_once_on_one_model():
    backend = ScriptedBackend("one two three", token_delay_s=0.005)
    jobs = [tj.Job(wat.script_guest([INFER, DONE]), backend=backend).start() for _ in range(4)]
    assert all(j.wait(30).ok for j in jobs)
    assert len({j.id for j in jobs}) == 4


def test_an_answer_decoded_with_fewer_threads_than_the_models_own_says_so_in_its_timing():
    from tensorjob_jupyter.host.reactor import decode_timing
    from tensorjob_jupyter.inference.base import GenerateUsage

    assert decode_timing(GenerateUsage(threads=1, own_threads=2))["own_threads"] == 2
    assert "own_threads" not in decode_timing(GenerateUsage(threads=2, own_threads=2))
    assert "own_threads" not in decode_timing(GenerateUsage(threads=2))

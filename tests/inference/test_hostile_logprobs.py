"""Hostile model servers (issue 53, item 13): what a served answer's token records can cost.

A chunk of 10^6 logprob records is one SSE event of 68 MB, inside the body's bound for 8192 tokens;
parsed, it held ~700 MiB and took seconds before the records past ``max_tokens`` were dropped. Now:

* **The bytes of one event are bounded before they are parsed** (``served.MAX_EVENT_BYTES``): a larger
  event is a malformed stream, refused with one line (``model_load_failed``), after ~1 MiB is read.
* **Bodies are uncompressed**: asked with ``Accept-Encoding: identity``; a gzipped answer (the same
  flood in 0.2 MB on the wire) is refused before a byte is decoded.
* **Records cost what was asked**: a chunk whose records would pass ``max_tokens`` is dropped before any
  record is read (the answer goes on without records), and a record's alternatives past those asked are
  dropped unread.

Memory is measured with tracemalloc (the server is another process: only the client is counted), and
work in records read, never in seconds.
"""

from __future__ import annotations

import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hostile_http
import tensorjob_jupyter as tj
import wat
from served_support import FakeServer
from tensorjob_jupyter.abi import codes
from tensorjob_jupyter.inference import logprobs as logprobs_module
from tensorjob_jupyter.inference import served, served_transport
from tensorjob_jupyter.inference.base import GenerateRequest, ModelError
from tensorjob_jupyter.inference.logprobs import MAX_TOP_LOGPROBS, TokenLogprob, read_openai_logprobs
from tensorjob_jupyter.inference.served import ServedBackend

KEY_ENV = "TJ_HOSTILE_LOGPROBS_KEY"
MiB = 1 << 20


@pytest.fixture(scope="module")
def hostile():
    with hostile_http.serve() as port:
        warm = backend(port, "honest")  # the SDK's imports and first client, before any memory is traced
        try:
            assert warm.generate_stream(GenerateRequest("hi", 4, chat=True), lambda _t: True).result(60).text
        finally:
            warm.close()
        yield port


def backend(port: int, mode: str) -> ServedBackend:
    return ServedBackend(hostile_http.model_url(port, mode), "m", api_key_env=KEY_ENV)


def generate(b: ServedBackend, max_tokens: int):
    """The answer's result (or its exception) and the peak of memory the client's side allocated for it."""
    tracemalloc.start()
    try:
        future = b.generate_stream(GenerateRequest("hi", max_tokens, chat=True, logprobs=True), lambda _t: True)
        try:
            outcome = future.result(120)
        except Exception as e:  # noqa: BLE001 - the test looks at it
            outcome = e
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        b.close()
    return outcome, peak


def test_one_chunk_of_a_million_records_is_refused_before_it_is_parsed(hostile):
    outcome, peak = generate(backend(hostile, "logprobs-flood"), 8192)
    assert isinstance(outcome, ModelError), outcome
    assert str(outcome) == (f"the model server's stream is malformed: an event of more than {served.MAX_EVENT_BYTES} "
                            "bytes")
    assert peak < 32 * MiB, f"the client allocated {peak / MiB:.0f} MiB for one chunk"


def test_a_job_whose_server_floods_records_fails_with_one_line(hostile, tmp_path):
    guest = wat.script_guest([{"cmd": "infer", "prompt": "hi", "max_tokens": 8192}, {"cmd": "done", "result": "ok"}])
    env = tj.Job(guest, backend=backend(hostile, "logprobs-flood"), runs_dir=tmp_path).start().wait(120)
    assert env.error is not None and env.error.code == codes.MODEL_LOAD_FAILED, env
    assert "an event of more than" in env.error.message and "\n" not in env.error.message


def test_a_compressed_answer_is_refused_whatever_it_decodes_to(hostile):
    outcome, peak = generate(backend(hostile, "logprobs-gzip"), 8192)
    assert isinstance(outcome, ModelError), outcome
    assert str(outcome) == "the model server's answer is compressed (Content-Encoding: gzip), though asked for identity"
    assert peak < 32 * MiB, f"the client allocated {peak / MiB:.0f} MiB for 0.2 MB on the wire"


def test_every_request_asks_for_an_uncompressed_body():
    with FakeServer() as fake:
        b = ServedBackend(fake.url, "fake-model", api_key_env=KEY_ENV)
        try:
            assert b.generate_stream(GenerateRequest("hi", 8, chat=True), lambda _t: True).result(30).text
            assert b.embed(["a"]).result(30)
        finally:
            b.close()
        assert [r["headers"].get("accept-encoding") for r in fake.requests] == ["identity", "identity"]


def test_records_past_max_tokens_are_dropped_before_any_is_read(hostile, monkeypatch):
    read = []
    original = TokenLogprob.from_json.__func__
    monkeypatch.setattr(TokenLogprob, "from_json",
                        classmethod(lambda cls, value, *a: read.append(1) or original(cls, value, *a)))
    outcome, _ = generate(backend(hostile, "logprobs-many"), 8)
    assert not isinstance(outcome, BaseException), outcome
    assert outcome.text == "hello" and not outcome.logprobs  # the answer went on without its records
    assert len(read) == 0, f"{len(read)} records read for an answer of at most 8 tokens"


def test_a_record_reads_only_the_alternatives_asked():
    junk = {"token": "z", "logprob": "not a number"}  # never read: past what was asked
    good = [{"token": t, "logprob": -0.1 * (i + 1), "bytes": [ord(t)]} for i, t in enumerate("abc")]
    value = {"content": [{"token": "a", "logprob": -0.1, "bytes": [97], "top_logprobs": good + [junk] * 10}]}
    with pytest.raises(ValueError):
        read_openai_logprobs(value, 1)  # every one read: the junk fails
    [record] = read_openai_logprobs(value, 1, read=3)
    assert [t.token for t in record.top] == [b"a"] and record.runner_up == pytest.approx(-0.2)
    too_long = {f"{i:03}" + "z" * 300: -5.0 for i in range(MAX_TOP_LOGPROBS - 2)}  # tokens no record holds
    legacy = {"tokens": ["a"], "token_logprobs": [-0.1], "top_logprobs": [{"a": -0.1, "b": -0.2, **too_long}]}
    with pytest.raises(ValueError):
        read_openai_logprobs(legacy, 0)
    [record] = read_openai_logprobs(legacy, 0, read=2)  # the best two are read, the rest dropped unread
    assert record.top == () and record.runner_up == pytest.approx(-0.2)


def test_more_records_than_most_are_refused_before_any_is_read():
    junk = [{"token": "a", "logprob": float("nan")}] * 9  # a record read would fail on its NaN
    with pytest.raises(ValueError, match="more than 8 records"):
        read_openai_logprobs({"content": junk}, most=8)
    with pytest.raises(ValueError, match="more than 8 tokens"):
        read_openai_logprobs({"tokens": ["a"] * 9, "token_logprobs": [float("nan")] * 9}, most=8)
    assert len(read_openai_logprobs({"content": [{"token": "a", "logprob": -1.0}] * 8}, most=8)) == 8
    assert logprobs_module.read_openai_logprobs({"content": []}, most=0) == []


# --- counting an event's bytes as they arrive ----------------------------------------------------------

BOUND = 64
ENDINGS = [b"\n", b"\r", b"\r\n"]


class _Call:
    what = "answer"

    def check(self, n):
        pass


def guarded(chunks):
    """Read ``chunks`` through the answer's guard: True when it read them all, False when it refused."""
    body = served_transport.GuardedBody(iter(chunks), _Call(), events=True)
    try:
        for _ in body:
            pass
    except ModelError as e:
        assert "an event of more than" in str(e)
        return False
    return True


def stream(events, endings):
    """SSE ``events`` (each a list of data lines), each event's lines and the blank line after them ended by
    one of ``endings`` in turn (one server's style: a CR then an LF would be one line end, not a blank line)."""
    return b"".join(line + endings[i % len(endings)]
                    for i, lines in enumerate(events) for line in [*lines, b""])


def split(data, cuts):
    edges = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    return [data[a:b] for a, b in zip(edges, edges[1:])]


data_line = st.binary(max_size=20).map(lambda b: b"data: " + b.replace(b"\r", b"").replace(b"\n", b""))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(data_line, min_size=1, max_size=3), min_size=1, max_size=6),
       st.lists(st.sampled_from(ENDINGS), min_size=1, max_size=4), st.lists(st.integers(0, 10**4), max_size=12))
def test_events_within_the_bound_pass_in_any_chunks_and_a_larger_one_never_does(events, endings, cuts):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(served_transport, "MAX_EVENT_BYTES", BOUND)
        # an event's bytes: its lines and their ends, the blank line's end, and the LF a CRLF blank line leaves
        within = [lines for lines in events if sum(len(x) + 2 for x in lines) + 3 <= BOUND]
        if within:
            data = stream(within, endings)
            assert guarded(split(data, cuts)) and guarded([data]) and guarded([bytes([b]) for b in data])
        data = stream([*events[:1], [b"data: " + b"x" * BOUND], *events[1:]], endings)
        assert not guarded(split(data, cuts)) and not guarded([bytes([b]) for b in data])

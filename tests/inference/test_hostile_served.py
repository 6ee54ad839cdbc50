"""Hostile model servers (issue 31): what a served model's listing, numbers and messages can cost a job.

The server is tests/hostile_http.py in its own process (raw sockets, so it can break the OpenAI API
as no server library would): a ``/v1/models`` that never ends or trickles a byte every half second, a
usage count past 64 bits or past 2^53, a 500,000-character model id, an error that quotes the key
back after enough text that clipping first would keep most of it. Whatever it does:

* **The listing is bounded and never held on the caller's thread.** A job is created at once (nothing
  is asked of the server there); the listing is asked on a request thread, at most
  ``MAX_MODELS_BYTES`` and ``MODELS_TIMEOUT_S`` in all, and the job waits for it under its own
  deadline and cancel. ``tensorjob run`` against an endless listing ends in moments, its memory flat.
* **Numbers are checked where they arrive** (the transcript's own rule: counts from 0 to 2^53), the
  job's totals stop at 2^53, and the internal-error path cannot fail: every run ends with an envelope
  that ``tensorjob show`` reads.
* **No message holds the key**, nor any run of ``KEY_RUN_CHARS`` of its characters: not the error,
  the transcript, the envelope, ``show``.

And what a finished job keeps for ``jobs()`` is counted: its input too, kept as JSON bytes.
"""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import threading
import time
import tracemalloc

import psutil
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hostile_http
import tensorjob_jupyter as tj
import wat
from tensorjob_jupyter.abi import Envelope, JobStatus, Usage, codes
from tensorjob_jupyter.host import jobs as jobs_module
from tensorjob_jupyter.inference import served, served_errors, served_transport
from tensorjob_jupyter.inference.base import GenerateResult, GenerateUsage, ModelError
from tensorjob_jupyter.inference.served import ServedBackend
from tensorjob_jupyter.record.event_checks import MAX_COUNT, check_envelope
from tensorjob_jupyter.record.recording import Recording
from tensorjob_jupyter.record.transcript import read_envelope, read_envelope_summary

KEY = "sk-hostile-0123456789abcdefghijKLMN"
KEY_ENV = "TJ_HOSTILE_KEY"
RUN = 6  # served.KEY_RUN_CHARS: a run of the key this long is scrubbed


@pytest.fixture(scope="module")
def hostile():
    with hostile_http.serve() as port:
        yield port


@pytest.fixture(autouse=True)
def the_key(monkeypatch):
    monkeypatch.setenv(KEY_ENV, KEY)


def infer_guest() -> bytes:
    return wat.script_guest([{"cmd": "infer", "prompt": "Say hello.", "max_tokens": 4},
                             {"cmd": "done", "result": "ok"}])


def backend(port: int, mode: str, **kwargs) -> ServedBackend:
    return ServedBackend(hostile_http.model_url(port, mode), api_key_env=KEY_ENV, **kwargs)


def created_in_thread(**kwargs):
    """``tj.Job(...)`` made on a daemon thread: (the job or None, seconds it took, up to 5)."""
    box = []
    started = time.monotonic()
    maker = threading.Thread(target=lambda: box.append(tj.Job(infer_guest(), **kwargs)), daemon=True)
    maker.start()
    maker.join(5)
    return (box[0] if box else None), time.monotonic() - started


def key_runs(text: str, run: int = RUN) -> list[str]:
    """The runs of ``run`` characters of the key that ``text`` holds."""
    return [KEY[i:i + run] for i in range(len(KEY) - run + 1) if KEY[i:i + run] in text]


def readable(run_dir) -> None:
    """The run reads back as the project's own reader reads it: envelope, summary and every event."""
    assert read_envelope(run_dir) is not None and read_envelope_summary(run_dir) is not None
    Recording.read(run_dir)


# --- the listing -----------------------------------------------------------------------------------


def test_a_job_is_created_without_asking_the_server_and_waits_for_it_under_its_deadline_and_cancel(hostile, tmp_path):
    url = hostile_http.model_url(hostile, "models-trickle")  # a byte every half second, never done
    opts = {"model": url, "model_options": {"api_key_env": KEY_ENV}, "runs_dir": tmp_path}
    job, took = created_in_thread(**opts, job_timeout_s=1.5)
    assert job is not None and took < 2, f"creating the job took {took:.1f} s: the listing ran on the caller's thread"
    assert job.events[0]["model"] == "?"
    started = time.monotonic()
    env = job.start().wait(10)
    assert env.error.code == codes.TIMEOUT and time.monotonic() - started < 4, env
    job, _ = created_in_thread(**opts)
    job.start()
    time.sleep(0.5)
    job.cancel()
    started = time.monotonic()
    assert job.wait(5).status == JobStatus.CANCELLED and time.monotonic() - started < 2


def test_the_listing_is_bounded_in_all_its_time_and_its_bytes(hostile):
    started = time.monotonic()
    with pytest.raises(ModelError, match=r"more than 1048576 bytes"):
        backend(hostile, "models-endless").resolve_model().result(30)
    assert time.monotonic() - started < 10
    b = backend(hostile, "models-trickle", request_timeout_s=1.0)
    started = time.monotonic()
    with pytest.raises(ModelError, match=r"took longer than 1 s \(request_timeout_s\)"):
        b.resolve_model().result(30)
    assert 0.9 < time.monotonic() - started < 3
    assert served.MAX_MODELS_BYTES == 1 << 20


@pytest.mark.slow
def test_tensorjob_run_against_an_endless_listing_ends_at_once_with_flat_memory(hostile, tmp_path):
    guest = tmp_path / "g.wasm"
    guest.write_bytes(infer_guest())
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "tensorjob_jupyter.frontends.cli", "run", str(guest), "--model",
                             hostile_http.model_url(hostile, "models-endless"), "--api-key-env", KEY_ENV, "--json",
                             "--runs", str(tmp_path / "runs")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    peak = 0
    while proc.poll() is None and time.monotonic() - started < 60 and peak < 1 << 30:
        try:
            peak = max(peak, psutil.Process(proc.pid).memory_info().rss)
        except psutil.Error:
            pass
        time.sleep(0.05)
    if proc.poll() is None:
        proc.kill()
    out, err = proc.communicate()
    assert peak < 400 << 20, f"tensorjob run grew to {peak >> 20} MiB"
    assert proc.returncode == 1 and time.monotonic() - started < 30, (proc.returncode, err[-2000:])
    envelope = json.loads(out)
    assert envelope["error"]["code"] == codes.MODEL_LOAD_FAILED and "/models" in envelope["error"]["message"]


# --- numbers from the server ------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["usage-huge", "usage-big"])
def test_usage_past_the_transcript_s_range_is_not_taken_and_the_run_reads_back(hostile, mode, tmp_path):
    job = tj.Job(infer_guest(), backend=backend(hostile, mode), runs_dir=tmp_path).start()
    env = job.wait(30)  # the job thread survived: it answered
    assert env.ok, env
    assert 0 <= env.usage.tokens_in <= MAX_COUNT and env.usage.tokens_out <= 4
    [done] = [e for e in job.events if e["type"] == "response.completed"]
    assert done["response"]["usage"]["output_tokens"] <= 4
    readable(job.run_dir)


def test_a_huge_model_id_is_recorded_clipped_and_the_run_reads_back(hostile, tmp_path):
    job = tj.Job(infer_guest(), backend=backend(hostile, "long-id"), runs_dir=tmp_path).start()
    env = job.wait(30)
    assert env.ok, env
    readable(job.run_dir)
    assert env.usage.model.startswith("mmmm") and len(env.usage.model) <= served.MAX_MODEL_ID_CHARS + 1
    assert (job.run_dir / "envelope.json").stat().st_size < 4096


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["usage-huge", "usage-big", "long-id"])
def test_tensorjob_run_and_show_read_what_a_hostile_server_made_of_a_run(hostile, mode, tmp_path):
    guest = tmp_path / "g.wasm"
    guest.write_bytes(infer_guest())
    cli = [sys.executable, "-m", "tensorjob_jupyter.frontends.cli"]
    run = subprocess.run([*cli, "run", str(guest), "--model", hostile_http.model_url(hostile, mode), "--api-key-env",
                          KEY_ENV, "--json", "--runs", str(tmp_path / "runs")], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr[-3000:]
    envelope = json.loads(run.stdout)
    assert envelope["status"] == "completed" and check_envelope(envelope) is None
    [run_dir] = (tmp_path / "runs").iterdir()
    show = subprocess.run([*cli, "show", str(run_dir)], capture_output=True, text=True, timeout=120)
    assert show.returncode == 0 and "damaged" not in show.stdout + show.stderr, show.stderr[-2000:]


class _AbsurdUsage:
    """A backend whose answer claims 10**4000 prompt tokens (no orjson writes it): the host's own path."""

    model_name = "absurd"

    def generate_stream(self, request, on_token):
        from concurrent.futures import Future

        on_token("hi")
        future: Future = Future()
        future.set_result(GenerateResult("hi", "stop", GenerateUsage(prompt_tokens=10 ** 4000, completion_tokens=1)))
        return future

    def embed(self, texts):
        raise NotImplementedError


def test_the_internal_error_path_cannot_fail(tmp_path):
    job = tj.Job(infer_guest(), backend=_AbsurdUsage(), runs_dir=tmp_path).start()
    env = job.wait(30)
    assert job.done and env.status in (JobStatus.COMPLETED, JobStatus.FAILED)
    assert 0 <= env.usage.tokens_in <= MAX_COUNT
    readable(job.run_dir)
    # the envelope's encoder itself: the fallback keeps only counts a transcript can hold
    data = jobs_module.encode_envelope("j", Envelope(JobStatus.COMPLETED, Usage(10 ** 4000, 2 ** 64, -1, "m")))
    written = json.loads(data)
    assert written["status"] == "failed" and written["error"]["code"] == codes.INTERNAL_ERROR
    assert check_envelope(written) is None and written["usage"]["tokens_in"] == 0

    class Unprintable(Exception):
        def __str__(self):
            raise ValueError("no text")

    from tensorjob_jupyter.host.reactor import internal_error
    assert internal_error("j", Unprintable()).code == codes.INTERNAL_ERROR


JSON_NUMBERS = st.one_of(st.integers(min_value=-(10 ** 30), max_value=10 ** 30), st.integers(), st.floats(),
                        st.booleans(), st.none(), st.text(max_size=4), st.lists(st.integers(), max_size=2))


@settings(max_examples=300, deadline=None)
@given(usage=st.dictionaries(st.sampled_from(["prompt_tokens", "completion_tokens", "total_tokens",
                                              "prompt_tokens_details"]),
                             JSON_NUMBERS | st.dictionaries(st.just("cached_tokens"), JSON_NUMBERS), max_size=4),
       max_tokens=st.integers(1, 100_000), pieces=st.integers(0, 100))
def test_any_usage_a_server_sends_becomes_counts_a_transcript_holds(usage, max_tokens, pieces):
    b = ServedBackend("http://127.0.0.1:9/v1")
    call = served_transport.Call("generate", 1 << 20, max_tokens)
    call.pieces = pieces
    got = b._usage(usage, call)
    for value in (got.prompt_tokens, got.completion_tokens, got.cached_tokens):
        assert type(value) is int and 0 <= value <= MAX_COUNT
    assert got.completion_tokens <= max(max_tokens, pieces) and got.cached_tokens <= got.prompt_tokens
    written = json.loads(jobs_module.encode_envelope("j", Envelope(JobStatus.COMPLETED, Usage(
        got.prompt_tokens, got.completion_tokens, 1, b.model_name))))
    assert written["status"] == "completed" and check_envelope(written) is None


# --- the key --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["key-echo", "key-echo-part"])
def test_no_message_or_file_holds_the_key_or_a_run_of_it(hostile, mode, tmp_path, capsys):
    job = tj.Job(infer_guest(), backend=backend(hostile, mode), runs_dir=tmp_path).start()
    env = job.wait(30)
    assert env.error.code == codes.MODEL_LOAD_FAILED and "HTTP 401" in env.error.message, env
    assert "xxxxxxxx" in env.error.message  # the server's own words are quoted...
    assert not key_runs(env.error.message), env.error.message  # ...without any of the key
    for path in job.run_dir.rglob("*"):
        if path.is_file():
            assert not key_runs(path.read_text(errors="replace")), path
    from tensorjob_jupyter.frontends.cli import main

    capsys.readouterr()
    main(["show", str(job.run_dir)])
    shown = capsys.readouterr()
    assert "401" in shown.out + shown.err and not key_runs(shown.out + shown.err)


KEY_ALPHABET = st.characters(codec="ascii", categories=("L", "N"), include_characters="-_")


@settings(max_examples=300, deadline=None)
@given(key=st.text(KEY_ALPHABET, min_size=8, max_size=64), before=st.text(max_size=300), after=st.text(max_size=300),
       cut=st.integers(0, 64), n=st.integers(20, 300))
def test_no_clip_leaves_a_run_of_the_key(key, before, after, cut, n):
    """Whole or in part, anywhere a clip may cut: what a message quotes has no run of the key."""
    assert served.KEY_RUN_CHARS == RUN
    for text in (before + key + after, before + key[cut:] + after, before + key[:cut] + after):
        for shown in (served.scrub_key(text, key), served_errors.clip(text, n, lambda t: served.scrub_key(t, key))):
            assert not any(key[i:i + RUN] in shown for i in range(len(key) - RUN + 1)), shown


# --- what finished jobs keep ----------------------------------------------------------------------------


def test_finished_jobs_count_their_inputs_and_keep_them_as_bytes(tmp_path, monkeypatch):
    monkeypatch.setattr(jobs_module, "KEEP_FINISHED_BYTES", 8 << 20)
    guest = wat.script_guest([{"cmd": "done", "result": "ok"}])
    tj.Job(guest, backend=None, runs_dir=tmp_path).start().wait(30)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(12):
            job = tj.Job(guest, backend=None, runs_dir=tmp_path, input={"text": "x" * (3 << 20), "i": i})
            assert job.start().wait(30).ok
            assert job.input["i"] == i and len(job.input["text"]) == 3 << 20
        del job
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    finished = [j for j in tj.jobs() if j.done]
    accounted = sum(j.retained_bytes for j in finished)
    assert accounted <= (8 << 20) + (3 << 20) + 4096  # the bound, and the newest job over it
    assert kept < accounted + (2 << 20), f"{kept >> 20} MiB kept, {accounted >> 20} MiB counted"

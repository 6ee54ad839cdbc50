"""``tensorjob serve`` as people run it: the command in its own process, jobs elsewhere pointed at it.

The server runs the embedded SmolLM2 with one slot, so a sequence left
running would hold up the next request: a stop verdict or a cancel that did
not reach the server shows as a next job that waits. The HTTP API's every
answer and refusal on a scripted model is tests/frontends/test_serve_api.py; the
served path's figures (four jobs through this server against four
in-process) are bench/bench_served.py.
"""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

import tensorjob_jupyter as tj
from tensorjob_jupyter.abi import codes
from tensorjob_jupyter.host.spec import InferOptions
from tensorjob_jupyter.inference.base import Sampler
from tensorjob_jupyter.inference.models import get_backend
from tensorjob_jupyter.inference.served import ServedBackend

from served_support import TensorjobServe, answer, infer_guest, run, wait_until

pytestmark = pytest.mark.slow
pytest.importorskip("uvicorn")

THREADS = 1
KEY = "tj-serve-test-key-5b1e"


Serve = functools.partial(TensorjobServe, threads=THREADS)


@pytest.fixture(scope="module")
def server():
    s = Serve("--slots", "1")
    yield s
    s.close()
    assert s.process.returncode in (0, -15), s.process.returncode  # Ctrl-C/SIGTERM: a clean stop


@pytest.fixture
def served(server):
    backend = ServedBackend(server.url)
    yield backend
    backend.close()


@pytest.mark.parametrize("chat", [False, True], ids=["raw", "chat"])
def test_a_job_through_the_server_gives_the_in_process_greedy_answer(served, chat):
    """The same engine and kernels on both sides: the same tokens, compared whole."""
    options = InferOptions(sampler=Sampler(repeat_penalty=1.0), chat=chat)
    local = get_backend(n_threads=THREADS, n_threads_batch=THREADS)
    for prompt in ("The capital of France is", "Write a haiku about the sea."):
        local_job, here = run(infer_guest(prompt, max_tokens=40), backend=local, infer=options)
        job, there = run(infer_guest(prompt, max_tokens=40), backend=served, infer=options)
        assert here.ok and there.ok, (here, there)
        assert answer(job) == answer(local_job) and len(answer(job)) > 20
        assert there.usage.tokens_in > 0 and there.usage.tokens_out == here.usage.tokens_out


def test_a_stop_verdict_and_a_cancel_free_the_server_s_one_slot(served):
    # a count continued as raw text runs to its 2,000 tokens: about half a minute of the one slot, unless the
    # server stops the sequence
    raw = InferOptions(sampler=Sampler(repeat_penalty=1.0), chat=False)
    job, env = run(infer_guest("Count from one to one thousand: one, two, three, four,", max_tokens=2000,
                               stop_after_tokens=2), backend=served, infer=raw)
    assert env.ok and env.usage.tokens_out <= 3, env
    started = time.monotonic()
    job, env = run(infer_guest("Hi", max_tokens=2), backend=served)
    assert env.ok and time.monotonic() - started < 8, env
    job = tj.Job(infer_guest("Count from one to one thousand: one, two, three, four,", max_tokens=2000),
                 backend=served, infer=raw).start()
    assert wait_until(lambda: answer(job) != "", 60, 0.05)
    job.cancel()
    assert job.wait(10).status.value == "cancelled"
    started = time.monotonic()
    job, env = run(infer_guest("Hi", max_tokens=2), backend=served)
    assert env.ok and time.monotonic() - started < 8, env


def test_a_format_and_a_tool_call_are_held_to_their_schemas(server, served):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]}
    job, env = run(infer_guest("Name a city, as JSON.", max_tokens=40,
                               format={"type": "json_schema", "name": "place", "schema": schema}), backend=served)
    assert env.ok and set(json.loads(answer(job))) == {"city"}, env
    tool = {"type": "function", "name": "get_weather", "parameters": schema}
    job, env = run(infer_guest("What is the weather in Oslo?", max_tokens=40, tools=[tool], tool_choice="required"),
                   backend=served)
    assert env.ok, env
    [item] = [e["item"] for e in job.events if e["type"] == "response.output_item.done"]
    assert item["type"] == "function_call" and set(json.loads(item["arguments"])) == {"city"}
    # a schema the grammar cannot enforce is refused by the server itself, before a token (a job's own
    # host refuses it even earlier, so the request is sent here by hand)
    request = urllib.request.Request(server.url + "/chat/completions", method="POST", headers={
        "Content-Type": "application/json"}, data=json.dumps({"messages": [{"role": "user", "content": "x"}],
                                                             "response_format": {"type": "json_schema", "json_schema": {
                                                                 "name": "n", "schema": {"not": {}}}}}).encode())
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    assert refused.value.code == 400 and "not" in json.loads(refused.value.read())["error"]["message"]


def test_a_job_through_the_server_has_the_engine_s_logprobs_and_each_field_s_confidence(served):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                               "big": {"type": "boolean"}}, "required": ["city", "big"]}
    job, env = run(infer_guest("Name a city, and say whether it is big, as JSON.", max_tokens=40, logprobs=True,
                               top_logprobs=3, format={"type": "json_schema", "name": "place", "schema": schema}),
                   backend=served)
    assert env.ok, env
    deltas = [e for e in job.events if e["type"] == "response.output_text.delta"]
    records = [r for d in deltas for r in d["logprobs"]]
    assert records and "".join(r["token"] for r in records) == answer(job)  # a record a token, in order
    # the alternatives the grammar allowed, at most the three asked (a forced token has itself alone)
    assert all(-1e4 <= r["logprob"] <= 0 and 1 <= len(r["top_logprobs"]) <= 3 for r in records)
    assert any(len(r["top_logprobs"]) == 3 for r in records)
    assert all(r["runner_up_logprob"] is None or r["runner_up_logprob"] <= 0 for r in records)
    [done] = [e for e in job.events if e["type"] == "response.completed"]
    confidence = done["confidence"]
    assert set(confidence) == {"city", "big"} and all(0 < c <= 1 for c in confidence.values()), confidence


def post(server, path: str, body: dict) -> dict:
    request = urllib.request.Request(server.url + path, method="POST", headers={"Content-Type": "application/json"},
                                     data=json.dumps(body).encode())
    with urllib.request.urlopen(request, timeout=120) as r:
        return json.loads(r.read())


def test_a_regex_and_choices_hold_the_answer_from_a_request_and_from_a_job(server, served):
    user = [{"role": "user", "content": "How many legs does a spider have? Answer with a number."}]
    for fields in ({"response_format": {"type": "regex", "regex": "[0-9]{1,3}"}}, {"guided_regex": "[0-9]{1,3}"}):
        text = post(server, "/chat/completions", {"messages": user, "max_tokens": 8, **fields})[
            "choices"][0]["message"]["content"]
        assert re.fullmatch("[0-9]{1,3}", text), (fields, text)
    choices = ["yes", "no", "maybe"]
    completion = post(server, "/completions", {"prompt": "Is the sky blue? Answer:", "max_tokens": 8,
                                               "response_format": {"type": "choices", "choices": choices}})
    assert completion["choices"][0]["text"] in choices, completion
    # a job's regex and choices reach the server as its response_format (the client's dialect for this server)
    job, env = run(infer_guest("Name a year of the twentieth century.", max_tokens=8, regex="19[0-9]{2}"),
                   backend=served)
    assert env.ok and re.fullmatch("19[0-9]{2}", answer(job)), (env, answer(job))
    job, env = run(infer_guest("Is water wet?", max_tokens=8, choices=choices), backend=served)
    assert env.ok and answer(job) in choices, (env, answer(job))
    # what the grammar cannot enforce is 400 with the reason, before a token
    with pytest.raises(urllib.error.HTTPError) as refused:
        post(server, "/chat/completions", {"messages": user, "response_format": {"type": "regex", "regex": "(?=1)1"}})
    assert refused.value.code == 400 and "look-around" in json.loads(refused.value.read())["error"]["message"]


def test_the_command_line_runs_a_job_on_the_server_and_records_where(server, tmp_path):
    guest = tmp_path / "g.wasm"
    guest.write_bytes(infer_guest("Say hello.", max_tokens=8))
    proc = subprocess.run([sys.executable, "-m", "tensorjob_jupyter.frontends.cli", "run", str(guest), "--model",
                           server.url, "--json", "--runs", str(tmp_path / "runs")], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["status"] == "completed"
    [events] = (tmp_path / "runs").glob("*/events.jsonl")
    created = json.loads(events.read_text().splitlines()[0])
    assert created["model_server"]["url"] == server.url


def test_each_request_is_one_line_on_stdout_unless_quiet(server, served):
    line = re.compile(r"\d\d:\d\d:\d\d POST /v1/(chat/)?completions 200 (\d+)\+(\d+) tokens \d+ ms")
    before = len(server.lines)  # the server is the module's: earlier tests' requests are logged above
    job, env = run(infer_guest("Say hello.", max_tokens=4), backend=served)
    assert env.ok, env
    assert wait_until(lambda: any(line.fullmatch(x) for x in server.lines[before:]), 10, 0.05), server.lines
    [logged] = [m for m in map(line.fullmatch, server.lines[before:]) if m][-1:]
    assert int(logged.group(2)) == env.usage.tokens_in and int(logged.group(3)) == env.usage.tokens_out
    quiet = Serve("--quiet")
    try:
        backend = ServedBackend(quiet.url)
        job, env = run(infer_guest("Say hello.", max_tokens=2), backend=backend)
        assert env.ok, env
        backend.close()
    finally:
        quiet.close()
    assert quiet.output() == ""


def test_with_a_key_a_job_needs_it_and_no_message_holds_it(monkeypatch):
    s = Serve("--api-key-env", "TJ_SERVE_KEY", env={"TJ_SERVE_KEY": KEY})
    try:
        monkeypatch.setenv("TJ_SERVE_CLIENT_KEY", KEY)
        backend = ServedBackend(s.url, api_key_env="TJ_SERVE_CLIENT_KEY")
        job, env = run(infer_guest("Hi", max_tokens=2), backend=backend)
        assert env.ok, env
        backend.close()
        monkeypatch.setenv("TJ_SERVE_CLIENT_KEY", "wrong-key-0000")
        backend = ServedBackend(s.url, api_key_env="TJ_SERVE_CLIENT_KEY")
        job, env = run(infer_guest("Hi", max_tokens=2), backend=backend)
        assert env.error.code == codes.MODEL_LOAD_FAILED and "refused the key" in env.error.message, env
        assert KEY not in env.error.message and "wrong-key" not in env.error.message
        backend.close()
    finally:
        s.close()
    assert KEY not in s.output() + s.process.stderr.read()


@pytest.mark.parametrize("args,status,says", [
    (["--model", "/no/such/model.gguf"], 1, "/no/such/model.gguf"),
    (["--model", "http://127.0.0.1:9/v1"], 2, "not another server"),
    (["--port", "70000"], 2, "--port 70000"),
    (["--slots", "0"], 2, "--slots 0"),
    (["--threads", "0"], 2, "--threads 0"),
    (["--api-key-env", "TJ_SURELY_UNSET_VAR"], 2, "not set"),
])
def test_a_bad_option_or_model_is_one_line_and_no_server(args, status, says):
    env = {k: v for k, v in os.environ.items() if k != "TJ_SURELY_UNSET_VAR"}
    proc = subprocess.run([sys.executable, "-m", "tensorjob_jupyter.frontends.cli", "serve", *args],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == status and says in proc.stderr and proc.stdout == "", proc
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr

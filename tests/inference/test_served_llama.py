"""A model served elsewhere, against a real server: llama-cpp-python's ``python -m llama_cpp.server``.

The server runs the embedded SmolLM2 as a separate process on a loopback
port (tests/served_support.py), started once for this module and killed at
its end. Each guarantee of issue 24 is checked against it: the same greedy
answer as in-process, a stop verdict, a cancel and the job's time limit that
end the generation on the server (it prints "disconnected" when a client leaves mid-stream, and
its next request is not held up), nothing left behind in this process, a
schema the server enforces, embeddings, what the transcript records, and a
map on a Dask cluster whose workers all send their infers to the one server.

Greedy answers are compared whole. They are the same only where both sides
run the same kernels: llama.cpp resolves flash attention "auto" to on for
this model (what the in-process engine asks for), while llama-cpp-python's
server turns it off unless told, and the two kernels round differently
enough to flip a near-tie within a few dozen tokens. The test server is
started with ``--flash_attn True``; then the same prompt gives the same
tokens, whatever prefix of it either side had cached.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

import tensorjob_jupyter as tj
from tensorjob_jupyter.host.spec import InferOptions
from tensorjob_jupyter.inference.base import Sampler
from tensorjob_jupyter.inference.models import default_model_path, get_backend
from tensorjob_jupyter.inference.served import ServedBackend

from served_support import (KEY, LlamaServer, answer, connections_to, infer_guest, run, served_threads,
                            wait_until)

pytestmark = pytest.mark.slow
psutil = pytest.importorskip("psutil")
pytest.importorskip("uvicorn")

THREADS = 1  # the server's and the local model's: one llama.cpp thread each on a shared 2-core machine
RAW_GREEDY = InferOptions(sampler=Sampler(repeat_penalty=1.0), chat=False)
CHAT_GREEDY = InferOptions(sampler=Sampler(repeat_penalty=1.0), chat=True)


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    log = tmp_path_factory.mktemp("llama-server") / "server.log"
    with LlamaServer(default_model_path(), log, threads=THREADS, embedding=True,
                     extra=("--flash_attn", "True")) as s:  # the in-process engine's attention: see above
        yield s


@pytest.fixture
def served(server):
    backend = ServedBackend(server.url)
    yield backend
    backend.close()
    assert wait_until(lambda: not served_threads(), 5), served_threads()
    assert wait_until(lambda: not connections_to(server.port), 5), connections_to(server.port)


def disconnects(server) -> int:
    return server.log().count("Disconnected from client")


@pytest.mark.parametrize("options,prompts", [
    (RAW_GREEDY, ("The capital of France is", "Once upon a time", "Water boils at")),
    (CHAT_GREEDY, ("Name three primary colours.", "Write a haiku about the sea.")),
], ids=["raw", "chat"])
def test_the_same_guest_gives_the_same_greedy_answer_locally_and_through_the_server(served, options, prompts):
    local = get_backend(n_threads=THREADS, n_threads_batch=THREADS)
    for prompt in prompts:
        guest = infer_guest(prompt, max_tokens=48)
        local_job, here = run(guest, backend=local, infer=options)
        job, there = run(guest, backend=served, infer=options)
        assert here.ok and there.ok, (here, there)
        assert answer(local_job) == answer(job) and len(answer(job)) > 20
        deltas = [e for e in job.events if e["type"] == "response.output_text.delta"]
        assert there.usage.tokens_out == len(deltas) > 0  # llama-cpp-python reports no usage: pieces counted
        assert there.usage.model == served.model_name  # llama-cpp-python's id: the model's path


def test_a_stop_verdict_ends_the_generation_on_the_server(server, served):
    before = disconnects(server)
    started = time.monotonic()
    job, env = run(infer_guest("Count from one to one thousand: one, two, three,", max_tokens=2000,
                               stop_after_tokens=2), backend=served, infer=RAW_GREEDY)
    assert env.ok, env
    [done] = [e for e in job.events if e["type"] == "response.completed"]
    assert done["finish_reason"] == "guest_stop" and env.usage.tokens_out <= 3
    assert wait_until(lambda: disconnects(server) > before, 10), "the server never saw the client leave"
    # the server is free again at once: 2,000 tokens would take it minutes
    job, env = run(infer_guest("Hi", max_tokens=1), backend=served, infer=RAW_GREEDY)
    assert env.ok and time.monotonic() - started < 60


def test_cancel_closes_the_connection_and_leaves_no_thread_or_socket(server, served):
    before = disconnects(server)
    job = tj.Job(infer_guest("Once upon a time, a dragon", max_tokens=2000), backend=served,
                 infer=RAW_GREEDY).start()
    streaming = wait_until(lambda: job.wait_done(0) or any(e["type"] == "response.output_text.delta"
                                                           for e in job.events), 120, 0.1)
    assert streaming and not job.wait_done(0), job.envelope
    assert connections_to(server.port) and served_threads()  # while it streams: one socket, one thread
    started = time.monotonic()
    job.cancel()
    env = job.wait(10)
    assert env.status.value == "cancelled" and time.monotonic() - started < 3, env
    assert wait_until(lambda: disconnects(server) > before, 10)
    assert wait_until(lambda: not connections_to(server.port), 5), connections_to(server.port)
    assert wait_until(lambda: not served_threads(), 5), served_threads()


def test_the_job_time_limit_closes_the_connection_mid_answer(server, served):
    before = disconnects(server)
    started = time.monotonic()
    job, env = run(infer_guest("Count from one to one thousand: one, two, three, four,", max_tokens=2000),
                   backend=served, infer=RAW_GREEDY, limits=tj.Limits(job_timeout_s=2))
    assert env.status.value == "failed" and env.error.code == "timeout", env
    assert time.monotonic() - started < 10 and any(e["type"] == "response.output_text.delta" for e in job.events)
    assert wait_until(lambda: disconnects(server) > before, 10), "the server never saw the client leave"
    assert wait_until(lambda: not connections_to(server.port), 5), connections_to(server.port)
    assert wait_until(lambda: not served_threads(), 5), served_threads()


def test_the_server_enforces_a_schema_and_the_answer_is_validated(served):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                               "country": {"type": "string", "maxLength": 30}},
              "required": ["city", "country"]}
    job, env = run(infer_guest("Name a city and its country, as JSON.", max_tokens=60,
                               format={"type": "json_schema", "name": "place", "schema": schema}), backend=served)
    assert env.ok, env
    value = json.loads(answer(job))
    assert set(value) == {"city", "country"} and all(isinstance(v, str) for v in value.values())


def test_a_named_function_is_the_server_s_tool_choice_and_streams_back_as_a_valid_call(served, monkeypatch):
    sent = []
    body_of = ServedBackend._body

    def spy(self, request, info, chat):
        body, extra = body_of(self, request, info, chat)
        sent.append(body)
        return body, extra

    monkeypatch.setattr(ServedBackend, "_body", spy)
    tool = {"type": "function", "name": "get_weather", "description": "The current weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24}},
                           "required": ["city"]}}
    job, env = run(infer_guest("What is the weather in Oslo?", max_tokens=40, tools=[tool],
                               tool_choice={"type": "function", "name": "get_weather"}), backend=served)
    assert env.ok, env
    assert sent[-1]["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert sent[-1]["tools"][0]["function"]["name"] == "get_weather" and "response_format" not in sent[-1]
    [item] = [e["item"] for e in job.events if e["type"] == "response.output_item.done"]
    assert item["type"] == "function_call" and item["name"] == "get_weather"
    assert set(json.loads(item["arguments"])) == {"city"}
    # the server streamed the arguments (its tool_calls deltas), and they reached the guest as they came
    pieces = [e for e in job.events if e["type"] == "response.function_call_arguments.delta"]
    assert len(pieces) >= 3 and env.usage.tokens_out >= 3


def test_the_server_s_logprobs_give_the_job_s_fields_a_confidence(served):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]}
    job, env = run(infer_guest("Name a city, as JSON.", max_tokens=30, logprobs=True,
                               format={"type": "json_schema", "name": "place", "schema": schema}),
                   backend=served, infer=CHAT_GREEDY)
    assert env.ok, env
    records = [r for e in job.events if e["type"] == "response.output_text.delta" for r in e["logprobs"]]
    assert records and all(r["logprob"] <= 0 for r in records)
    [done] = [e for e in job.events if e["type"] == "response.completed"]
    assert set(done["confidence"]) == {"city"} and 0 < done["confidence"]["city"] <= 1, done["confidence"]


def test_embeddings_through_the_server_are_unit_vectors_in_input_order(served):
    a, b, a_again = served.embed(["a lighthouse on a cliff", "tax law", "a lighthouse on a cliff"]).result(120)
    assert len(a) == len(b) > 0 and a == a_again
    assert abs(sum(x * x for x in a) - 1) < 1e-6 and a != b
    [b_alone] = served.embed(["tax law"]).result(120)
    assert b_alone == b


def test_a_map_on_a_dask_cluster_sends_every_worker_s_infers_to_the_one_server(server, tmp_path):
    pytest.importorskip("distributed")
    from dask_procs import ProcessCluster, worker_env

    guest = tmp_path / "infer.wasm"
    guest.write_bytes(infer_guest("Say one word.", max_tokens=4))
    manifest = tmp_path / "items.jsonl"
    manifest.write_text("".join(json.dumps({"n": i}) + "\n" for i in range(4)))
    script = (
        "import json, sys\nimport tensorjob_jupyter as tj\n"
        "r = tj.map(sys.argv[1], sys.argv[2], sys.argv[3], cluster=sys.argv[4], model=sys.argv[5],\n"
        "           model_options={'api_key_env': 'TJ_TEST_KEY'})\n"
        "print(json.dumps(r.to_json()))\n")
    before = server.log().count("POST /v1/chat/completions")
    env = worker_env(TJ_TEST_KEY=KEY)
    with ProcessCluster(tmp_path / "cluster", workers=2, env=env) as cluster:
        out = subprocess.run([sys.executable, "-c", script, str(guest), str(manifest), str(tmp_path / "run"),
                              cluster.address, server.url], capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["completed"] == 4 and summary["failed"] == 0, summary
    assert server.log().count("POST /v1/chat/completions") - before >= 4
    ledger = json.loads((tmp_path / "run" / "ledger.json").read_text())
    assert ledger["sessions"][-1]["where"].startswith("dask"), ledger  # the items ran on the workers
    for transcript in (tmp_path / "run" / "jobs").rglob("events.jsonl"):
        text = transcript.read_text()
        assert KEY not in text
        created = json.loads(text.splitlines()[0])
        assert created["model_server"]["url"] == server.url

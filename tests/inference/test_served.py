"""A model on an OpenAI-compatible server (issue 24): every path, against a scripted fake server.

The fake (tests/served_support.py) is a real HTTP server on loopback, so
these tests run the whole client -- the openai SDK, its SSE parser, the
sockets -- and see from the server's side when a connection closes. What
the real server proves (the same answer as in-process, a stop that ends the
generation on the server, a map on a Dask cluster) is in
test_served_llama.py.
"""

from __future__ import annotations

import json
import pickle
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tensorjob_jupyter as tj
from tensorjob_jupyter.abi import codes
from tensorjob_jupyter.host import GuestSource, InferOptions, ModelRef
from tensorjob_jupyter.inference.base import (Constraint, GenerateRequest, ModelError, ModelTimeout, QueueFull,
                                              Sampler)
from tensorjob_jupyter.inference.served import (DIALECTS, ServedBackend, ServerBusy, CallText, is_served,
                                                normalise_url, served_backend)

from served_support import KEY, FakeServer, connections_to, free_port, served_threads, wait_until
from wat import script_guest

psutil = pytest.importorskip("psutil")


@pytest.fixture
def fake():
    with FakeServer() as server:
        yield server


@pytest.fixture(autouse=True)
def no_served_thread_or_socket_outlives_a_test():
    yield
    assert wait_until(lambda: not served_threads(), 5), served_threads()


def infer_guest(max_tokens=16, stop_after_tokens=None, **fields):
    return script_guest([{"cmd": "infer", "prompt": "Say hello.", "max_tokens": max_tokens, **fields},
                         {"cmd": "done", "result": "ok"}], stop_after_tokens=stop_after_tokens)


def run_job(backend, guest=None, timeout=30, **kwargs):
    job = tj.Job(guest or infer_guest(), backend=backend, **kwargs).start()
    envelope = job.wait(timeout)
    return job, envelope


def of_type(job, kind):
    return [e for e in job.events if e["type"] == kind]


def backend_for(fake, **kwargs):
    kwargs.setdefault("api_key_env", "TJ_TEST_KEY")
    return ServedBackend(fake.url, **kwargs)


@pytest.fixture(autouse=True)
def the_key(monkeypatch):
    monkeypatch.setenv("TJ_TEST_KEY", KEY)


# --- naming the server ----------------------------------------------------------------------------


def test_a_url_names_a_served_model_and_is_recorded_without_credentials():
    assert is_served("http://127.0.0.1:8000/v1") and is_served("HTTPS://example.com")
    assert not is_served("model.gguf") and not is_served("hf:org/repo") and not is_served(None)
    assert normalise_url("http://127.0.0.1:8000") == "http://127.0.0.1:8000/v1"
    assert normalise_url("https://Example.com:443/api/v1/") == "https://example.com:443/api/v1"
    for bad, why in [("http://user:pw@host/v1", "password"), ("http://host/v1?key=1", "query"),
                     ("ftp://host/v1", "http"), ("http:///v1", "http")]:
        with pytest.raises(ValueError, match=why):
            normalise_url(bad)
    with pytest.raises(ModelError, match="environment variable name"):
        ServedBackend("http://127.0.0.1:1/v1", api_key_env="NOT A NAME")


def test_the_only_model_is_the_default_and_several_are_listed_by_name():
    with FakeServer(models=["only-one"]) as fake:
        backend = backend_for(fake)
        assert backend.model_name == "?" and not fake.requests  # naming it asks nothing of the server
        assert backend.resolve_model().result(10) == "only-one" == backend.model_name
    with FakeServer(models=["a-7b", "b-13b"]) as fake:
        backend = backend_for(fake)
        job, env = run_job(backend)
        assert env.error.code == codes.MODEL_LOAD_FAILED
        assert "2 models (a-7b, b-13b)" in env.error.message and "--model-name" in env.error.message
        assert backend_for(fake, model="b-13b").model_name == "b-13b"
        job, env = run_job(backend_for(fake, model="c-70b"))
        assert env.error.code == codes.MODEL_LOAD_FAILED and "does not serve 'c-70b'" in env.error.message


def test_one_backend_per_server_model_and_key_variable_per_process_and_it_does_not_pickle(fake):
    a = served_backend(fake.url + "/", None, "TJ_TEST_KEY")
    assert served_backend(fake.url, None, "TJ_TEST_KEY") is a
    assert served_backend(fake.url, "fake-model", "TJ_TEST_KEY") is not a
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(a)
    assert KEY not in repr(a) and KEY not in json.dumps(a.server)


# --- streaming, usage, what the request carries ---------------------------------------------------------


def test_tokens_stream_to_the_guest_and_usage_and_cached_tokens_reach_the_envelope_and_the_events(fake):
    job, env = run_job(backend_for(fake))
    assert env.ok, env
    deltas = [e["delta"] for e in of_type(job, "response.output_text.delta")]
    assert deltas == fake.pieces
    done = of_type(job, "response.completed")[0]["response"]
    assert done["model"] == "fake-model"
    assert done["usage"]["input_tokens"] == 7 and done["usage"]["output_tokens"] == 5
    assert done["usage"]["input_tokens_details"]["cached_tokens"] == 3
    assert env.usage.tokens_in == 7 and env.usage.tokens_out == 5 and env.usage.model == "fake-model"
    created = of_type(job, "job.created")[0]
    assert created["model"] == "?"  # not yet asked when the job was created (its first infer asked)
    [request] = fake.requests
    assert request["path"] == "/v1/chat/completions"
    assert request["headers"]["authorization"] == f"Bearer {KEY}"  # sent to the server, and nowhere else
    body = request["body"]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["messages"] == [{"role": "user", "content": "Say hello."}]
    assert (body["max_tokens"], body["temperature"], body["top_p"], body["seed"]) == (16, 0.0, 1.0, 0)
    assert "repeat_penalty" not in body and "top_k" not in body  # plain OpenAI: not part of its API
    for path in job.run_dir.rglob("*"):
        if path.is_file():
            assert KEY not in path.read_text(errors="replace"), path


def test_what_maps_for_a_llama_cpp_server_and_for_vllm():
    with FakeServer(owned_by="me") as fake:  # llama-cpp-python's /v1/models says owned_by "me"
        run_job(backend_for(fake), infer_guest(temperature=0.5, top_k=7, min_p=0.1, repeat_penalty=1.3, seed=9,
                                               stop=["\n\n"]))
        body = fake.requests[-1]["body"]
        assert (body["temperature"], body["top_k"], body["min_p"], body["repeat_penalty"], body["seed"],
                body["stop"]) == (0.5, 7, 0.1, 1.3, 9, ["\n\n"])
    with FakeServer(owned_by="vllm") as fake:
        run_job(backend_for(fake))
        body = fake.requests[-1]["body"]
        assert body["repetition_penalty"] == 1.1 and body["top_k"] == -1 and "repeat_penalty" not in body


def test_raw_text_goes_to_completions_with_the_system_text_before_the_prompt(fake):
    backend = backend_for(fake)
    request = GenerateRequest("the prompt", 8, Sampler(), chat=False, system="the system")
    pieces = []
    result = backend.generate_stream(request, lambda p: pieces.append(p) or True).result(10)
    assert fake.requests[-1]["path"] == "/v1/completions"
    assert fake.requests[-1]["body"]["prompt"] == "the system\n\nthe prompt"
    assert result.text == "".join(pieces) == "".join(fake.pieces) and result.finish_reason == "stop"


def test_a_stop_string_is_cut_here_even_when_the_server_does_not_cut_it(fake):
    backend = backend_for(fake)
    pieces = []
    request = GenerateRequest("p", 8, Sampler(stop=(" fri",)))
    result = backend.generate_stream(request, lambda p: pieces.append(p) or True).result(10)
    assert result.text == "".join(pieces) == "Hello there," and result.finish_reason == "stop"
    assert fake.requests[-1]["body"]["stop"] == [" fri"]


def test_a_schema_becomes_response_format_and_an_answer_that_breaks_it_fails_validation(fake):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    fake.pieces = ['{"n": ', '"not a number"}']
    job, env = run_job(backend_for(fake), infer_guest(format={"type": "json_schema", "name": "x", "schema": schema}))
    assert env.error.code == codes.SCHEMA_VALIDATION_FAILED, env
    fmt = fake.requests[-1]["body"]["response_format"]
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["schema"]["required"] == ["n"]
    fake.pieces = ['{"n": ', "42}"]
    job, env = run_job(backend_for(fake), infer_guest(format={"type": "json_schema", "name": "x", "schema": schema}))
    assert env.ok, env


#: Each text constraint an infer may carry, with an answer of the fake's ("Hello there, friend.") that holds to it.
TEXT_CONSTRAINTS = {
    "regex": {"regex": "[A-Z][a-z]+( [a-z]+)*, [a-z]+[.]"},
    "choices": {"choices": ["Hello there, friend.", "Goodbye."]},
    "grammar": {"grammar": 'start: "Hello" REST\nREST: /[a-z ,]+[.]/'},
}


@pytest.mark.slow  # a CLI in a subprocess, or a long search: in the full suite, not the fast loop
@pytest.mark.parametrize("kind", sorted(TEXT_CONSTRAINTS))
def test_a_regex_choices_or_grammar_goes_in_the_fields_each_server_enforces_or_not_at_all(kind):
    fields = TEXT_CONSTRAINTS[kind]
    value = fields[kind]
    vllm_key = {"regex": "regex", "choices": "choice", "grammar": "grammar"}[kind]
    constraint_fields = {"response_format", "structured_outputs", "guided_regex", "guided_choice", "guided_grammar",
                         "guided_json", "grammar", "json_schema"}
    for owned_by in ("vllm", "tensorjob", "openai", "llamacpp", "me", "library"):
        with FakeServer(owned_by=owned_by) as fake:
            job, env = run_job(backend_for(fake), infer_guest(**fields))
            assert env.ok, (owned_by, env)
            body = fake.requests[-1]["body"]
            sent = {name: body[name] for name in constraint_fields if name in body}
            if owned_by == "vllm":  # structured_outputs (v0.10.2 on), and the guided_* field of older servers
                assert sent == {"structured_outputs": {vllm_key: value}, f"guided_{vllm_key}": value}, sent
            elif owned_by == "tensorjob":  # this package's own server: its response_format extension
                assert sent == {"response_format": {"type": kind, kind: value}}, sent
            else:  # llama.cpp (GBNF only), llama-cpp-python, OpenAI, Ollama: sent free, checked after
                assert sent == {}, (owned_by, sent)
    # raw text (/completions) carries the same fields
    with FakeServer(owned_by="vllm") as fake:
        job, env = run_job(backend_for(fake), infer_guest(**fields), infer=InferOptions(chat=False))
        body = fake.requests[-1]["body"]
        assert env.ok and fake.requests[-1]["path"] == "/v1/completions", env
        assert body["structured_outputs"] == {vllm_key: value} and "response_format" not in body


@pytest.mark.parametrize("owned_by", ["vllm", "tensorjob", "openai", "llamacpp"])
@pytest.mark.parametrize("kind", sorted(TEXT_CONSTRAINTS))
def test_an_answer_that_breaks_a_regex_choices_or_grammar_fails_validation_on_every_server(owned_by, kind):
    with FakeServer(owned_by=owned_by) as fake:
        fake.pieces = ["42", " apples"]  # a server that did not hold to it (or ignored a field it does not know)
        job, env = run_job(backend_for(fake), infer_guest(**TEXT_CONSTRAINTS[kind]))
        assert env.error.code == codes.SCHEMA_VALIDATION_FAILED, env
        assert "does not match" in env.error.message, env


def test_a_constraint_the_server_refuses_is_schema_validation_failed_with_its_reason():
    with FakeServer(owned_by="vllm") as fake:
        fake.mode, fake.status = "status", 400
        fake.error_message = "Invalid regex in structured_outputs: look-around is not supported"
        job, env = run_job(backend_for(fake), infer_guest(regex="[a-z]+"))
        assert env.error.code == codes.SCHEMA_VALIDATION_FAILED, env
        assert "HTTP 400" in env.error.message and "look-around" in env.error.message, env


def test_llama_cpp_python_gets_its_json_object_with_a_schema_and_tools_travel_in_the_system_turn():
    tool = {"type": "function", "name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
    with FakeServer(owned_by="me") as fake:
        fake.pieces = ['{"name": "get_weather", ', '"arguments": {"city": "Oslo"}}']
        job, env = run_job(backend_for(fake), infer_guest(tools=[tool], tool_choice="required"))
        assert env.ok, env
        body = fake.requests[-1]["body"]
        assert body["response_format"]["type"] == "json_object"
        assert body["response_format"]["schema"]["properties"]["name"] == {"const": "get_weather"}
        assert body["messages"][0]["role"] == "system" and "get_weather" in body["messages"][0]["content"]
        [call] = [e for e in job.events if e["type"] == "response.output_item.done"]
        assert call["item"]["type"] == "function_call" and json.loads(call["item"]["arguments"]) == {"city": "Oslo"}
        # "auto" (a call or text) is no response_format: sent free, validated after
        fake.pieces = ['{"name": "get_weather", ', '"arguments": {"town": "Oslo"}}']
        job, env = run_job(backend_for(fake), infer_guest(tools=[tool], tool_choice="auto"))
        assert "response_format" not in fake.requests[-1]["body"]
        assert env.error.code == codes.SCHEMA_VALIDATION_FAILED, env


WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city.", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def call_deltas(*arguments, name="get_weather"):
    """OpenAI's streamed shape of one call: the name and id first, then the arguments in pieces."""
    first = {"role": "assistant", "content": None, "tool_calls": [
        {"index": 0, "id": "call_abc", "type": "function", "function": {"name": name, "arguments": ""}}]}
    return [first] + [{"tool_calls": [{"index": 0, "function": {"arguments": a}}]} for a in arguments]


def test_tools_go_to_the_server_as_tools_and_its_streamed_call_is_the_job_s_function_call(fake):
    fake.mode = "deltas"
    fake.deltas = call_deltas('{"city": ', '"Oslo"}')
    job, env = run_job(backend_for(fake), infer_guest(tools=[WEATHER], tool_choice="required"))
    assert env.ok, env
    body = fake.requests[-1]["body"]
    assert body["tools"] == [{"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city.", "parameters": WEATHER["parameters"]}}]
    assert body["tool_choice"] == "required" and body["parallel_tool_calls"] is False
    # the server renders its tools: no response_format and no instructions of the host's own
    assert "response_format" not in body and [m["role"] for m in body["messages"]] == ["user"]
    [item] = [e["item"] for e in of_type(job, "response.output_item.done")]
    assert item["type"] == "function_call" and item["name"] == "get_weather"
    assert json.loads(item["arguments"]) == {"city": "Oslo"}
    assert "".join(e["delta"] for e in of_type(job, "response.function_call_arguments.delta")) == '{"city": "Oslo"}'
    assert env.usage.tokens_out == 3  # the name, then two pieces of arguments
    # one function by name; arguments that break its parameters are schema_validation_failed, never accepted
    fake.deltas = call_deltas('{"town": "Oslo"}')
    job, env = run_job(backend_for(fake), infer_guest(tools=[WEATHER], tool_choice={"type": "function",
                                                                                      "name": "get_weather"}))
    assert fake.requests[-1]["body"]["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert env.error.code == codes.SCHEMA_VALIDATION_FAILED and "city" in env.error.message, env
    # "auto": the server may answer in text
    fake.mode = "ok"
    job, env = run_job(backend_for(fake), infer_guest(tools=[WEATHER], tool_choice="auto"))
    assert env.ok and fake.requests[-1]["body"]["tool_choice"] == "auto", env
    assert "".join(e["delta"] for e in of_type(job, "response.output_text.delta")) == "".join(fake.pieces)


@pytest.mark.parametrize("deltas,code,says", [
    # the model's output breaking its shape, as a bad call would
    ([{"content": "Let me look."}] + call_deltas('{"city": "Oslo"}'), codes.SCHEMA_VALIDATION_FAILED,
     "text and then a tool call"),
    (call_deltas('{"city": "Oslo"}') + [{"content": "Done."}], codes.SCHEMA_VALIDATION_FAILED,
     "a tool call and then text"),
    # the server's stream breaking the protocol
    ([{"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}], codes.MODEL_LOAD_FAILED, "without a name"),
    (call_deltas("{}") + [{"tool_calls": [{"index": 0, "function": {"name": "other"}}]}], codes.MODEL_LOAD_FAILED,
     "changes its name"),
    ([{"tool_calls": {"index": 0}}], codes.MODEL_LOAD_FAILED, "not a list"),
])
def test_a_call_the_host_cannot_read_as_one_call_fails_with_what_broke(fake, deltas, code, says):
    fake.mode = "deltas"
    fake.deltas = deltas
    job, env = run_job(backend_for(fake), infer_guest(tools=[WEATHER], tool_choice="auto"))
    assert env.error.code == code and says in env.error.message, env


def test_a_call_without_indexes_is_one_call_and_a_new_id_at_the_same_index_is_another():
    reader = CallText()
    text = reader.feed([{"index": None, "id": "c1", "function": {"name": "f", "arguments": '{"a"'}}])
    text += reader.feed([{"function": {"arguments": ": 1}"}}])  # no index, no id: the same call
    assert not reader.another and json.loads(text + reader.close()) == {"name": "f", "arguments": {"a": 1}}
    reader.feed([{"index": 0, "id": "c2", "function": {"name": "f", "arguments": "{}"}}])
    assert reader.another


def test_a_call_cut_at_max_tokens_stays_open_and_fails_as_the_local_one_does(fake):
    fake.mode = "deltas"
    fake.deltas = call_deltas('{"city": ', '"Os', 'lo"}')
    job, env = run_job(backend_for(fake), infer_guest(max_tokens=2, tools=[WEATHER], tool_choice="required"))
    assert env.error.code == codes.LIMIT_EXCEEDED and "max_tokens" in env.error.message, env


def test_blanks_before_a_call_are_dropped_and_a_second_call_ends_the_answer_with_the_first(fake):
    fake.mode = "deltas"
    second = {"tool_calls": [{"index": 1, "id": "call_2", "type": "function",
                              "function": {"name": "get_weather", "arguments": '{"city": "Bergen"}'}}]}
    fake.deltas = [{"content": "\n "}] + call_deltas('{"city": "Oslo"}') + [second]
    job, env = run_job(backend_for(fake), infer_guest(tools=[WEATHER], tool_choice="auto"))
    assert env.ok, env
    [item] = [e["item"] for e in of_type(job, "response.output_item.done")]
    assert item["type"] == "function_call" and json.loads(item["arguments"]) == {"city": "Oslo"}


def test_which_tool_choices_each_server_enforces_natively():
    named = {"type": "function", "name": "get_weather"}
    # llama-cpp-python: a named function only, and its template does not show tools: the system turn stays
    with FakeServer(owned_by="me") as fake:
        fake.mode = "deltas"
        fake.deltas = call_deltas('{"city": "Oslo"}')
        job, env = run_job(backend_for(fake), infer_guest(tools=[WEATHER], tool_choice=named))
        assert env.ok, env
        body = fake.requests[-1]["body"]
        assert body["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
        assert "parallel_tool_calls" not in body and "response_format" not in body
        assert body["messages"][0]["role"] == "system" and "get_weather" in body["messages"][0]["content"]
    # Ollama ignores tool_choice: every call is held to the call JSON, as for the local model
    with FakeServer(owned_by="library") as fake:
        fake.pieces = ['{"name": "get_weather", "arguments": {"city": "Oslo"}}']
        job, env = run_job(backend_for(fake), infer_guest(tools=[WEATHER], tool_choice="required"))
        body = fake.requests[-1]["body"]
        assert env.ok and "tools" not in body and body["response_format"]["type"] == "json_schema", env
    # vLLM: "auto" needs server flags, so it is held to the call JSON here and validated after
    with FakeServer(owned_by="vllm") as fake:
        fake.pieces = ['{"name": "get_weather", "arguments": {"city": "Oslo"}}']
        job, env = run_job(backend_for(fake), infer_guest(tools=[WEATHER], tool_choice="auto"))
        assert env.ok, env
        body = fake.requests[-1]["body"]
        assert "tools" not in body and body["messages"][0]["role"] == "system"
        run_job(backend_for(fake), infer_guest(tools=[WEATHER], tool_choice="required"))
        assert fake.requests[-1]["body"]["tool_choice"] == "required"
    # raw text (chat=False) has no tools field: the call JSON, as before
    with FakeServer() as fake:
        fake.pieces = ['{"name": "get_weather", "arguments": {"city": "Oslo"}}']
        job, env = run_job(backend_for(fake), infer_guest(tools=[WEATHER], tool_choice="required"),
                           infer=InferOptions(chat=False))
        assert env.ok and "tools" not in fake.requests[-1]["body"], env


@settings(max_examples=100, deadline=None)
@given(name=st.text(min_size=1, max_size=20), arguments=st.dictionaries(st.text(max_size=8), st.integers()),
       cuts=st.lists(st.integers(0, 200), max_size=8), repeat_name=st.booleans())
def test_any_chunking_of_a_streamed_call_gives_the_call_s_json(name, arguments, cuts, repeat_name):
    text = json.dumps(arguments, ensure_ascii=False)
    bounds = sorted({0, len(text), *(min(c, len(text)) for c in cuts)})
    pieces = [text[a:b] for a, b in zip(bounds, bounds[1:])]
    reader = CallText()
    out = reader.feed([{"index": 0, "function": {"name": name, "arguments": ""}}])
    for piece in pieces:
        out += reader.feed([{"index": 0, "function": {"name": name if repeat_name else None, "arguments": piece}}])
    out += reader.close()
    assert json.loads(out) == {"name": name, "arguments": arguments} and not reader.another


def test_embeddings_come_in_input_order_and_unit_length(fake):
    fake.mode = "embed"
    vectors = backend_for(fake).embed(["a", "bbbb"]).result(10)
    assert fake.requests[-1]["path"] == "/v1/embeddings"
    assert fake.requests[-1]["body"]["encoding_format"] == "float"
    assert [round(v[0], 4) for v in vectors] == [round(1 / 26 ** 0.5, 4), round(4 / 41 ** 0.5, 4)]
    assert all(abs(sum(x * x for x in v) - 1) < 1e-9 for v in vectors)


def test_a_lora_selection_is_refused_for_a_served_model(fake):
    from tensorjob_jupyter.inference.base import LoraChoice

    with pytest.raises(ModelError, match="LoRA"):
        backend_for(fake).generate_stream(GenerateRequest("p", 4, lora=(LoraChoice("a"),)), lambda p: True)


# --- stop, cancel, timeouts: the connection closes, nothing is left ----------------------------------------


def test_a_stop_verdict_closes_the_stream_at_once(fake):
    fake.mode = "endless"
    started = time.monotonic()
    job, env = run_job(backend_for(fake), infer_guest(max_tokens=100000, stop_after_tokens=3))
    assert env.ok, env
    [done] = of_type(job, "response.completed")
    assert done["finish_reason"] == "guest_stop"
    # the lookahead lets the pieces run free when the job's thread is slow to judge them (a loaded machine)
    assert len(of_type(job, "response.output_text.delta")) < 200
    assert wait_until(lambda: fake.closed, 2), "the server never saw the client leave"
    assert fake.closed[0] - started < 3
    assert wait_until(lambda: not connections_to(fake.port), 2), connections_to(fake.port)


def test_an_endless_stream_is_cut_at_max_tokens(fake):
    fake.mode = "endless"
    backend = backend_for(fake)
    result = backend.generate_stream(GenerateRequest("p", 20), lambda p: True).result(10)
    assert result.finish_reason == "length" and result.usage.completion_tokens == 20
    assert wait_until(lambda: fake.closed, 2)


@pytest.mark.parametrize("mode", ["no_headers", "stall"])
def test_cancel_closes_the_connection_before_and_after_the_headers(fake, mode):
    fake.mode = mode
    job = tj.Job(infer_guest(), backend=backend_for(fake)).start()
    assert wait_until(lambda: fake.requests, 5)
    time.sleep(0.2)
    started = time.monotonic()
    job.cancel()
    env = job.wait(10)
    assert env.status.value == "cancelled", env
    assert time.monotonic() - started < 5
    assert wait_until(lambda: fake.closed, 2), "the server never saw the client leave"
    assert wait_until(lambda: not connections_to(fake.port), 2), connections_to(fake.port)


def test_a_job_timeout_closes_the_connection(fake):
    fake.mode = "stall"
    started = time.monotonic()
    job, env = run_job(backend_for(fake), job_timeout_s=1.0)
    assert env.error.code == codes.TIMEOUT, env
    assert time.monotonic() - started < 4
    assert wait_until(lambda: fake.closed, 2)
    assert wait_until(lambda: not connections_to(fake.port), 2)


@pytest.mark.slow
def test_a_silent_server_and_an_endless_stream_of_pings_are_timeouts(fake):
    fake.mode = "stall"
    job, env = run_job(backend_for(fake, read_timeout_s=0.5))
    assert env.error.code == codes.TIMEOUT and "read_timeout_s" in env.error.message, env
    fake.mode = "pings"
    job, env = run_job(backend_for(fake, request_timeout_s=1.0))
    assert env.error.code == codes.TIMEOUT and "request_timeout_s" in env.error.message, env
    assert wait_until(lambda: len(fake.closed) == 2, 2)


# --- a server that is down, busy, broken --------------------------------------------------------------


def test_a_server_that_is_down_fails_the_job_fast_with_model_load_failed():
    url = f"http://127.0.0.1:{free_port()}/v1"
    started = time.monotonic()
    job, env = run_job(ServedBackend(url, api_key_env="TJ_TEST_KEY"))
    assert env.error.code == codes.MODEL_LOAD_FAILED, env
    assert time.monotonic() - started < 3
    assert env.error.message == f"cannot reach the model server at {url}: connection refused"
    assert of_type(job, "job.created")[0]["model"] == "?"
    # a job that never infers does not need the server
    job, env = run_job(ServedBackend(url), script_guest([{"cmd": "done", "result": "ok"}]))
    assert env.ok


@pytest.mark.parametrize("status,code", [(429, codes.BUSY), (503, codes.BUSY), (500, codes.MODEL_LOAD_FAILED),
                                         (401, codes.MODEL_LOAD_FAILED), (504, codes.TIMEOUT),
                                         (404, codes.MODEL_LOAD_FAILED)])
def test_http_errors_end_the_job_with_the_documented_code_and_never_the_key(fake, status, code):
    fake.mode, fake.status = "status", status
    fake.error_message = f"Incorrect API key provided: {KEY}"  # a server that echoes the key back
    job, env = run_job(backend_for(fake))
    assert env.error.code == code, env
    assert f"HTTP {status}" in env.error.message and KEY not in env.error.message
    assert "\n" not in env.error.message
    [error] = of_type(job, "error")
    assert error["code"] == code and KEY not in error["message"]
    for path in job.run_dir.rglob("*"):
        if path.is_file():
            assert KEY not in path.read_text(errors="replace"), path


@pytest.mark.parametrize("mode,says", [("malformed", "malformed"), ("truncated", "ended before the answer")])
def test_a_malformed_or_truncated_stream_is_model_load_failed(fake, mode, says):
    fake.mode = mode
    job, env = run_job(backend_for(fake))
    assert env.error.code == codes.MODEL_LOAD_FAILED and says in env.error.message, env


def test_a_full_queue_answers_busy_at_once(fake):
    fake.mode = "stall"
    backend = backend_for(fake, concurrency=1, queue_size=1)
    first = backend.generate_stream(GenerateRequest("p", 4), lambda p: True)
    second = backend.generate_stream(GenerateRequest("p", 4), lambda p: True)
    with pytest.raises(QueueFull, match="full"):
        backend.generate_stream(GenerateRequest("p", 4), lambda p: True)
    job, env = run_job(backend)
    assert env.error.code == codes.BUSY, env
    assert second.cancel()  # still waiting: it never starts
    assert not first.cancel()  # running: cancel aborts it instead
    assert first.result(5).finish_reason == "cancelled"
    assert backend.threads == 0 or wait_until(lambda: backend.threads == 0, 2)


def test_concurrent_requests_run_on_at_most_concurrency_threads(fake):
    fake.mode = "slow"
    backend = backend_for(fake, concurrency=2)
    seen = set()

    def on_token(piece):
        seen.add(threading.current_thread().name)
        return True

    futures = [backend.generate_stream(GenerateRequest("p", 8), on_token) for _ in range(5)]
    assert all(f.result(20).text == "".join(fake.pieces) for f in futures)
    assert 1 <= len(seen) <= 2 and backend.threads <= 2
    backend.close()
    with pytest.raises(ModelError, match="closed"):
        backend.generate_stream(GenerateRequest("p", 8), on_token)


def test_exceptions_the_reactor_maps():
    assert issubclass(ServerBusy, QueueFull) and issubclass(ModelTimeout, ModelError)
    assert set(DIALECTS) == {"openai", "llama.cpp", "llama-cpp-python", "vllm", "tensorjob", "ollama"}
    assert Constraint("{}").free_text is False
    # which constraint kinds each server holds its decoding to; the rest are sent free and checked after
    assert {name: set(d.enforces) for name, d in DIALECTS.items()} == {
        "openai": {"json"}, "llama.cpp": {"json"}, "llama-cpp-python": {"json"}, "ollama": {"json"},
        "vllm": {"json", "regex", "choices", "lark"}, "tensorjob": {"json", "regex", "choices", "lark"}}


def test_a_served_run_replays_without_the_server(tmp_path):
    with FakeServer() as fake:
        guest = infer_guest()
        job, env = run_job(backend_for(fake))
        assert env.ok
    report = tj.replay(guest, job.id, timeout=30)  # the server is gone
    assert report.envelope.ok and report.divergence is None, report.envelope
    replayed = [e["delta"] for e in report.job.events if e["type"] == "response.output_text.delta"]
    assert replayed == fake.pieces


def test_replay_live_of_a_served_run_names_the_server_and_never_sends_to_it_unasked(tmp_path):
    """A transcript may come from anywhere: ``--live`` never takes its server (nor the key variable it
    names) on its own; it says which server the run used and that ``--model URL`` names one."""
    from tensorjob_jupyter.history.replay_setup import ReplayError

    with FakeServer() as fake:
        guest = infer_guest()
        job, env = run_job(backend_for(fake))
        assert env.ok
        sent = len(fake.requests)
        with pytest.raises(ReplayError) as refused:
            tj.replay(guest, job.id, live=True, timeout=30)
        message = str(refused.value)
        assert fake.url in message and "--model URL" in message and "fake-model" in message, message
        assert len(fake.requests) == sent  # nothing went to the recorded server
        report = tj.replay(guest, job.id, live=True, model=fake.url, timeout=30)  # named: accepted
        assert report.envelope.ok and report.divergence is None, report.envelope


# --- naming a served model everywhere: Job, the options, tj.map, the command line ---------------------------


def test_a_job_names_its_served_model_by_url_and_records_the_url_and_id_never_the_key(fake):
    job = tj.Job(infer_guest(), model=fake.url, model_options={"api_key_env": "TJ_TEST_KEY"}).start()
    env = job.wait(30)
    assert env.ok, env
    created = of_type(job, "job.created")[0]
    # the server is asked which model it serves on the job's thread, before the first infer: the job
    # created first records "?" there, the answer and the usage name the model, and so do later jobs
    assert created["model"] == "?"
    assert of_type(job, "response.created")[0]["response"]["model"] == "fake-model" == env.usage.model
    assert created["model_server"] == {"url": fake.url, "api_key_env": "TJ_TEST_KEY"}
    assert of_type(tj.Job(infer_guest(), model=fake.url, model_options={"api_key_env": "TJ_TEST_KEY"}),
                   "job.created")[0]["model"] == "fake-model"
    assert fake.requests[-1]["headers"]["authorization"] == f"Bearer {KEY}"
    assert all(KEY not in p.read_text(errors="replace") for p in job.run_dir.rglob("*") if p.is_file())


def test_the_options_name_a_served_model_its_id_and_its_key_variable(fake):
    import argparse

    from tensorjob_jupyter.frontends.options import JobOptions, OptionError, add_job_arguments
    from tensorjob_jupyter.inference import ModelRef

    parser = argparse.ArgumentParser()
    add_job_arguments(parser)
    args = parser.parse_args(["--model", fake.url, "--model-name", "fake-model", "--api-key-env", "TJ_TEST_KEY"])
    options = JobOptions.from_args(args)
    assert options.model_ref() == ModelRef("url", fake.url, "fake-model", "TJ_TEST_KEY")
    job = tj.Job(options.spec(GuestSource.of(infer_guest()))).start()
    assert job.wait(30).ok and job.backend is served_backend(fake.url, "fake-model", "TJ_TEST_KEY")

    class Settings:  # c.TensorJob.model_path / model_name / api_key_env
        model_path, model_name, api_key_env = fake.url, "fake-model", "TJ_TEST_KEY"

    assert JobOptions.from_settings(Settings()).model_ref() == options.model_ref()
    for argv, says in [(["--model", "http://u:pw@127.0.0.1:1/v1"], "password"),
                       (["--model-name", "x"], "only for a model on a server"),
                       (["--model", fake.url, "--lora", "a=b.gguf"], "chosen on its server"),
                       (["--model", fake.url, "--api-key-env", "NOT-A-NAME"], "environment variable")]:
        with pytest.raises(OptionError, match=says):
            JobOptions.from_args(parser.parse_args(argv))


def test_a_map_s_backend_spec_carries_the_url_id_and_key_variable_never_the_key(fake):
    from tensorjob_jupyter.fanout.items import BackendSpec

    spec = BackendSpec.of(None, ModelRef.parse(fake.url, model_name="fake-model", api_key_env="TJ_TEST_KEY"))
    assert (spec.model.kind, spec.model.name, spec.model.served_name) == ("url", fake.url, "fake-model")
    data = pickle.dumps(spec)
    assert KEY.encode() not in data and b"TJ_TEST_KEY" in data
    assert pickle.loads(data).build() is served_backend(fake.url, "fake-model", "TJ_TEST_KEY")


def test_a_map_s_items_share_the_one_server(fake, tmp_path):
    fake.mode = "slow"
    manifest = [{"i": i} for i in range(5)]
    result = tj.map(infer_guest(max_tokens=8), manifest, tmp_path / "run", model=fake.url,
                    model_options={"api_key_env": "TJ_TEST_KEY"}, concurrency=3)
    assert result.completed == 5 and result.failed == 0
    assert len([r for r in fake.requests if r["path"] == "/v1/chat/completions"]) == 5


@pytest.mark.slow
def test_the_command_line_runs_a_job_on_a_served_model(fake, tmp_path):
    import subprocess
    import sys

    guest = tmp_path / "infer.wasm"
    guest.write_bytes(infer_guest())
    done = subprocess.run([sys.executable, "-m", "tensorjob_jupyter.frontends.cli", "run", str(guest), "--model",
                           fake.url, "--api-key-env", "TJ_TEST_KEY", "--runs", str(tmp_path / "runs"), "--json"],
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["status"] == "completed"
    assert fake.requests[-1]["headers"]["authorization"] == f"Bearer {KEY}"  # the child read its own environment
    assert KEY not in done.stdout + done.stderr


# --- logprobs --------------------------------------------------------------------------------------

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}
JSON_PIECES = ['{"name": ', '"Ada"', ', "age": ', "36}"]


def json_guest(**fields):
    infer = {"cmd": "infer", "prompt": "who?", "max_tokens": 20,
             "format": {"type": "json_schema", "name": "person", "schema": SCHEMA}, **fields}
    return script_guest([infer, {"cmd": "done", "result": {"name": "Ada", "age": 36}}])


def chat_record(piece, logprob, runner=None):
    """A piece as one token in the chat shape: its bytes and the top two, as the OpenAI API sends them."""
    data = list(piece.encode())
    top = [{"token": piece, "logprob": logprob, "bytes": data}]
    if runner is not None:
        top.append({"token": "x", "logprob": runner, "bytes": [120]})
    return {"content": [{"token": piece, "logprob": logprob, "bytes": data, "top_logprobs": top}]}


def test_a_served_model_s_logprobs_reach_the_events_and_give_each_field_a_confidence(fake):
    fake.pieces = JSON_PIECES
    fake.logprobs = lambda i, piece, chat: chat_record(piece, -0.1 * (i + 1), -3.0)
    job, env = run_job(backend_for(fake), json_guest(logprobs=True, top_logprobs=1))
    assert env.ok, env
    body = fake.requests[-1]["body"]
    assert body["logprobs"] is True and body["top_logprobs"] == 2  # the runner-up is always asked
    deltas = of_type(job, "response.output_text.delta")
    assert [d["delta"] for d in deltas] == JSON_PIECES
    assert [d["logprobs"][0]["logprob"] for d in deltas] == pytest.approx([-0.1, -0.2, -0.3, -0.4])
    assert all(len(d["logprobs"][0]["top_logprobs"]) == 1 for d in deltas)  # as many as the guest asked
    assert all(d["logprobs"][0]["runner_up_logprob"] == -3.0 for d in deltas)
    assert set(env.confidence) == {"name", "age"} and all(0 < c < 1 for c in env.confidence.values())


def test_raw_completions_ask_logprobs_as_a_count_and_read_the_legacy_shape(fake):
    fake.pieces = ["Hello", " there"]
    fake.logprobs = lambda i, piece, chat: {"tokens": [piece], "token_logprobs": [-0.5],
                                            "top_logprobs": [{piece: -0.5, "z": -2.0}], "text_offset": [0]}
    job, env = run_job(backend_for(fake), infer_guest(logprobs=True), infer=InferOptions(chat=False))
    assert env.ok, env
    assert fake.requests[-1]["path"] == "/v1/completions" and fake.requests[-1]["body"]["logprobs"] == 2
    records = [d["logprobs"][0] for d in of_type(job, "response.output_text.delta")]
    assert [(r["token"], r["logprob"], r["runner_up_logprob"]) for r in records] == [
        ("Hello", -0.5, -2.0), (" there", -0.5, -2.0)]


def test_a_server_that_gives_no_logprobs_leaves_them_null_and_one_that_refuses_them_is_asked_without(fake):
    fake.pieces = JSON_PIECES
    job, env = run_job(backend_for(fake), json_guest())
    assert env.ok and env.confidence is None
    assert all(not d["logprobs"] for d in of_type(job, "response.output_text.delta"))

    fake.refuse_logprobs = True
    backend = backend_for(fake)
    for _ in range(2):
        job, env = run_job(backend, json_guest())
        assert env.ok, env
    asked = [r["body"].get("logprobs") for r in fake.requests[-3:]]
    assert asked == [True, None, None]  # refused once, then asked without, and never asked again
    backend.close()


def test_records_that_are_not_records_or_too_many_end_the_records_but_never_the_answer(fake):
    fake.pieces = JSON_PIECES
    broken = {1: {"content": [{"token": "x", "logprob": 0.5}]},  # a logprob above 0
              2: {"content": "not a list"}}
    fake.logprobs = lambda i, piece, chat: broken.get(i, chat_record(piece, -0.1))
    job, env = run_job(backend_for(fake), json_guest(logprobs=True))
    assert env.ok, env
    carried = [len(d["logprobs"]) for d in of_type(job, "response.output_text.delta")]
    assert carried == [1, 0, 0, 0]  # the first record, then none: the rest of the answer went on without
    fake.logprobs = lambda i, piece, chat: {"content": [chat_record(piece, -0.1)["content"][0]] * 50}
    job, env = run_job(backend_for(fake), json_guest(logprobs=True))
    assert env.ok and [len(d["logprobs"]) for d in of_type(job, "response.output_text.delta")] == [0, 0, 0, 0]


def test_a_request_that_records_no_logprobs_asks_for_none(fake):
    backend = backend_for(fake)
    done = backend.generate_stream(GenerateRequest("hi", 8, logprobs=False), lambda _t: True).result(30)
    assert done.logprobs is None and "logprobs" not in fake.requests[-1]["body"]
    backend.close()

"""``tensorjob serve``'s HTTP API (serve/server.py), in process, on a scripted backend.

Each request goes through the real Starlette app and its ASGI stack
(Starlette's ``TestClient``); the model is ``ScriptedBackend``, so every
answer and every failure is one the test chose. The real server process on
the real model -- jobs through it, a stop that frees its slot, the key -- is
tests/frontends/test_serve.py.
"""

from __future__ import annotations

import io
import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorjob_jupyter.serve.openai_wire import RequestError, plan
from tensorjob_jupyter.serve.server import MAX_BODY_BYTES, RequestLog, build_app
from tensorjob_jupyter.inference.base import QueueFull
from tensorjob_jupyter.inference.scripted import ScriptedBackend

pytest.importorskip("starlette")
from starlette.testclient import TestClient  # noqa: E402

MODEL = "scripted"
JSON = {"content-type": "application/json"}


@pytest.fixture
def backend():
    b = ScriptedBackend("Hello there friend")
    yield b
    b.close()


@pytest.fixture
def client(backend):
    with TestClient(build_app(backend, MODEL)) as c:
        yield c


def chat(content="Say hello.", **fields):
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], **fields}


def sse_objects(text: str) -> list:
    out = []
    for block in text.split("\n\n"):
        if block.startswith("data: "):
            data = block[len("data: "):]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def test_models_lists_the_one_model_owned_by_tensorjob(client):
    answer = client.get("/v1/models").json()
    assert answer["data"] == [{"id": MODEL, "object": "model", "created": 0, "owned_by": "tensorjob"}]


def test_a_streamed_chat_answer_is_pieces_then_the_finish_then_usage_then_done(client, backend):
    r = client.post("/v1/chat/completions", json=chat(stream=True, max_tokens=16, temperature=0.0, seed=3,
                                                      stream_options={"include_usage": True}))
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = sse_objects(r.text)
    assert events[-1] == "[DONE]"
    pieces = [e["choices"][0]["delta"]["content"] for e in events[:-3]]
    assert "".join(pieces) == "Hello there friend" and len(pieces) == 3
    assert events[-3]["choices"][0]["finish_reason"] == "stop"
    assert events[-2]["choices"] == [] and events[-2]["usage"]["completion_tokens"] == 3
    assert {e["id"] for e in events[:-1]} == {events[0]["id"]} and events[0]["object"] == "chat.completion.chunk"
    assert backend.scripted.prompts == ["Say hello."]


def test_each_request_is_one_log_line_with_its_status_tokens_and_time(backend):
    out = io.StringIO()
    with TestClient(build_app(backend, MODEL, log=RequestLog(out))) as c:
        c.get("/v1/models")
        c.post("/v1/chat/completions", json=chat(max_tokens=2))
        c.post("/v1/chat/completions", json=chat(stream=True, max_tokens=16))
        c.post("/v1/completions", json={"model": MODEL, "prompt": "Once", "max_tokens": -1})
        c.post("/v1/embeddings", json={"model": MODEL, "input": ["a", "b"]})
    lines = out.getvalue().splitlines()
    assert len(lines) == 5, lines
    stamp = r"\d\d:\d\d:\d\d "
    assert re.fullmatch(stamp + r"GET /v1/models 200 \d+ ms", lines[0]), lines[0]
    assert re.fullmatch(stamp + r"POST /v1/chat/completions 200 \d+\+2 tokens \d+ ms", lines[1]), lines[1]
    assert re.fullmatch(stamp + r"POST /v1/chat/completions 200 \d+\+3 tokens \d+ ms", lines[2]), lines[2]
    assert re.fullmatch(stamp + r"POST /v1/completions 400 \d+ ms", lines[3]), lines[3]
    assert re.fullmatch(stamp + r"POST /v1/embeddings 200 2 texts \d+ ms", lines[4]), lines[4]


def test_a_whole_answer_and_a_raw_completion(client):
    r = client.post("/v1/chat/completions", json=chat(max_tokens=2))
    body = r.json()
    assert body["object"] == "chat.completion" and body["choices"][0]["message"] == {
        "role": "assistant", "content": "Hello there"}
    assert body["choices"][0]["finish_reason"] == "length" and body["usage"]["completion_tokens"] == 2
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": "Once", "max_tokens": 8})
    assert r.json()["object"] == "text_completion" and r.json()["choices"][0]["text"] == "Hello there friend"


def test_a_system_message_and_text_parts_are_taken_and_sampling_maps_to_the_request():
    request = plan(chat(max_tokens=5, temperature=0.7, top_p=0.9, top_k=20, min_p=0.05, repeat_penalty=1.2,
                        seed=11, stop=["\n\n"]) | {"messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]}]},
        chat=True).request
    assert (request.prompt, request.system, request.max_tokens, request.chat) == ("Hi there", "Be brief.", 5, True)
    s = request.sampler
    assert (s.temperature, s.top_p, s.top_k, s.min_p, s.repeat_penalty, s.seed, s.stop) == (
        0.7, 0.9, 20, 0.05, 1.2, 11, ("\n\n",))


def test_response_format_becomes_the_grammar_s_constraint():
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    for fmt in ({"type": "json_schema", "json_schema": {"name": "c", "schema": schema}},
                {"type": "json_object", "schema": schema}):  # OpenAI's shape, and llama-cpp-python's
        request = plan(chat(response_format=fmt), chat=True).request
        assert json.loads(request.constraint.schema)["properties"]["city"] == {"type": "string"}
    assert plan(chat(response_format={"type": "json_object"}), chat=True).request.constraint is not None
    assert plan(chat(response_format={"type": "text"}), chat=True).request.constraint is None


def test_a_regex_choices_or_grammar_response_format_and_vllm_s_fields_become_the_constraint(client, backend):
    lark = 'start: "yes" | "no"'
    for fields, kind, value in [
            ({"response_format": {"type": "regex", "regex": "[0-9]+"}}, "regex", "[0-9]+"),
            ({"response_format": {"type": "choices", "choices": ["yes", "no"]}}, "choices", ("yes", "no")),
            ({"response_format": {"type": "grammar", "grammar": lark}}, "lark", lark),
            ({"guided_regex": "[0-9]+"}, "regex", "[0-9]+"),  # vLLM's fields before its v0.12
            ({"guided_choice": ["yes", "no"]}, "choices", ("yes", "no")),
            ({"guided_grammar": lark}, "lark", lark),
            ({"structured_outputs": {"regex": "[0-9]+"}}, "regex", "[0-9]+"),  # and since its v0.10.2
            ({"structured_outputs": {"choice": ["yes", "no"]}}, "choices", ("yes", "no")),
            ({"structured_outputs": {"grammar": lark}}, "lark", lark)]:
        for is_chat in (True, False):
            body = chat(**fields) if is_chat else {"model": MODEL, "prompt": "Once", **fields}
            constraint = plan(body, chat=is_chat).request.constraint
            assert constraint.kind == kind and getattr(constraint, kind) == value, fields
        # and the engine answers it (the scripted model's text: the grammar is the real engine's business)
        r = client.post("/v1/chat/completions", json=chat(max_tokens=4, **fields))
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"], (fields, r.text)
    for fields in ({"guided_json": {"type": "object"}}, {"guided_json": '{"type": "object"}'},
                   {"structured_outputs": {"json": {"type": "object"}}}):
        assert json.loads(plan(chat(**fields), chat=True).request.constraint.schema) == {"type": "object"}
    assert plan(chat(structured_outputs={"regex": None}), chat=True).request.constraint is None


@pytest.mark.parametrize("body,says", [
    # what the grammar engine cannot enforce, with its reason
    (chat(response_format={"type": "regex", "regex": "(?=a)b"}), "look-around"),
    (chat(response_format={"type": "regex", "regex": "(ab"}), "unclosed group"),
    (chat(response_format={"type": "grammar", "grammar": "start: foo"}), "unknown name"),
    (chat(response_format={"type": "grammar", "grammar": "root ::= \"a\""}), "the Lark grammar cannot be enforced"),
    (chat(guided_regex="(ab"), "unclosed group"),
    (chat(structured_outputs={"grammar": "start: foo"}), "unknown name"),
    # shapes, as an infer's are checked
    (chat(response_format={"type": "regex"}), "needs regex"),
    (chat(response_format={"type": "regex", "regex": 5}), "`regex` must be a string"),
    (chat(response_format={"type": "choices", "choices": []}), "`choices` must be a non-empty array"),
    (chat(response_format={"type": "grammar", "grammar": "x" * 40000}), "over the"),
    (chat(response_format={"type": "regex", "regex": "[a-z]+"}, stop=["\n"]), "`stop` cannot be given"),
    (chat(response_format={"type": "regex", "regex": "[a-z]+"}, guided_regex="[0-9]+"), "both constrain"),
    (chat(response_format={"type": "json_object"}, guided_choice=["a"]), "takes one of format"),
    (chat(structured_outputs={"whitespace_pattern": " "}), "not whitespace_pattern"),
    (chat(structured_outputs=["regex"]), "structured_outputs must be an object"),
    (chat(guided_json="{not json"), "guided_json"),
    (chat(guided_json=[1]), "JSON Schema object"),
])
def test_a_constraint_the_checks_refuse_is_400_with_their_reason(client, body, says):
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 400 and says in r.json()["error"]["message"], r.text
    assert "\n" not in r.json()["error"]["message"]


@pytest.mark.parametrize("body,says", [
    (chat(max_tokens=-1), "max_tokens"),
    (chat(temperature="hot"), "temperature"),
    (chat(stop=[""]), "stop"),
    (chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"not": {}}}}), "not"),
    (chat(response_format={"type": "yaml"}), "response_format"),
    (chat(tools=[{"type": "function", "function": {"name": "f"}}]), "tools"),
    (chat(n=2), "n must be 1"),
    (chat(top_logprobs=3), "top_logprobs needs logprobs: true"),
    (chat(logprobs=True, top_logprobs=21), "top_logprobs must be a whole number from 0 to 20"),
    (chat(logprobs=True, top_logprobs=True), "top_logprobs must be a whole number"),
    (chat(logit_bias={"50256": -100}), "logit_bias"),
    (chat(presence_penalty=0.5), "presence_penalty"),
    (chat(frequency_penalty=1), "frequency_penalty"),
    (chat(logprobs=1), "logprobs must be true or false"),  # chat's is a boolean; completions' a count
    ({"model": MODEL, "messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]},
     "one user message"),
    ({"model": MODEL, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "only text"),
    ({"model": MODEL, "messages": []}, "non-empty"),
    ([1, 2], "JSON object"),
])
def test_a_request_the_checks_refuse_is_400_with_their_reason(client, body, says):
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 400 and says in r.json()["error"]["message"], r.text
    assert r.json()["error"]["type"] == "invalid_request_error"


def test_a_body_that_is_not_json_or_too_large_is_refused(client):
    r = client.post("/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    for body, says in ((b"[" * 100_000 + b"]" * 100_000, "deep"), (b'{"a": 1, "a": 2}', "duplicate"),
                       (b'{"temperature": NaN}', "NaN"), (b'"\xff"', "UTF-8")):
        r = client.post("/v1/chat/completions", content=body, headers=JSON)
        assert r.status_code == 400 and says in r.json()["error"]["message"], (body[:20], r.text)
    r = client.post("/v1/chat/completions", content=b"x" * (MAX_BODY_BYTES + 1), headers=JSON)
    assert r.status_code == 413

    def chunked():  # no Content-Length: counted as it arrives
        for _ in range(MAX_BODY_BYTES // 65536 + 2):
            yield b" " * 65536

    assert client.post("/v1/chat/completions", content=chunked(), headers=JSON).status_code == 413


def test_a_web_page_cannot_use_a_loopback_server(backend):
    """A page may POST text/plain anywhere without a preflight, and may rebind its own name to 127.0.0.1."""
    with TestClient(build_app(backend, MODEL, loopback_only=True), base_url="http://127.0.0.1:8000") as c:
        assert c.post("/v1/chat/completions", json=chat()).status_code == 200
        r = c.post("/v1/chat/completions", content=json.dumps(chat()), headers={"content-type": "text/plain"})
        assert r.status_code == 415
        r = c.post("/v1/chat/completions", json=chat(), headers={"host": "evil.example:8000"})
        assert r.status_code == 403 and c.get("/v1/models", headers={"host": "evil.example"}).status_code == 403
        for host in ("localhost:8000", "[::1]:8000", "127.0.0.1", "LOCALHOST"):
            assert c.get("/v1/models", headers={"host": host}).status_code == 200, host
        # a loopback name with anything but a port after it is not a loopback name
        for host in ("localhost:evil", "localhost:8000:1", "127.0.0.1:", "[::1]x", "[::1]:99999", "localhost.:80",
                     "127.0.0.1.evil.example", "", "[::1", "localhost :80"):
            assert c.get("/v1/models", headers={"host": host}).status_code == 403, host


@settings(max_examples=300, deadline=None)
@given(name=st.sampled_from(["localhost", "127.0.0.1", "[::1]"]), rest=st.text(max_size=12))
def test_a_loopback_name_with_anything_but_a_port_after_it_is_not_loopback(name, rest):
    from tensorjob_jupyter.serve.server import LOOPBACK_NAMES, host_name

    port = rest[1:] if rest.startswith(":") else None
    is_port = rest == "" or (port is not None and port.isascii() and port.isdigit() and len(port) <= 5
                             and int(port) <= 65535)
    assert (host_name(name + rest) in LOOPBACK_NAMES) == is_port or (name + rest).lower() in LOOPBACK_NAMES


def test_what_is_not_honoured_is_refused_and_what_changes_nothing_is_served(client):
    for fields in ({"logprobs": False}, {"logprobs": None, "top_logprobs": None}, {"logit_bias": {}},
                   {"presence_penalty": 0, "frequency_penalty": 0.0}):
        assert client.post("/v1/chat/completions", json=chat(**fields)).status_code == 200, fields
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": "Once", "echo": True})
    assert r.status_code == 400 and "echo" in r.json()["error"]["message"]
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": "Once", "best_of": 3})
    assert r.status_code == 400 and "best_of" in r.json()["error"]["message"]


def test_an_embed_past_the_engine_s_budget_is_400(backend):
    from tensorjob_jupyter.inference.base import RequestTooLarge

    class Budget(ScriptedBackend):
        def embed(self, texts):
            raise RequestTooLarge("the texts to embed are 99999 tokens, more than one request may embed")

    budget = Budget()
    with TestClient(build_app(budget, MODEL)) as c:
        r = c.post("/v1/embeddings", json={"input": ["a"] * 3})
        assert r.status_code == 400 and "99999 tokens" in r.json()["error"]["message"]
    budget.close()


def test_a_full_queue_is_429_and_a_failing_model_is_500(backend):
    class Full(ScriptedBackend):
        def generate_stream(self, request, on_token):
            raise QueueFull("the inference queue is full (64 requests waiting)")

    full = Full()
    with TestClient(build_app(full, MODEL)) as c:
        r = c.post("/v1/chat/completions", json=chat())
        assert r.status_code == 429 and r.json()["error"]["type"] == "rate_limit_error"
    full.close()
    broken = ScriptedBackend(fail="the model broke")
    with TestClient(build_app(broken, MODEL)) as c:
        r = c.post("/v1/chat/completions", json=chat())
        assert r.status_code == 500 and r.json()["error"]["message"] == "the model broke"
        r = c.post("/v1/chat/completions", json=chat(stream=True))  # the stream has begun: an error event ends it
        assert r.status_code == 200 and "error" in sse_objects(r.text)[-1]
    broken.close()


def test_embeddings_come_back_in_order(client):
    r = client.post("/v1/embeddings", json={"model": MODEL, "input": ["a", "b", "a"]})
    rows = r.json()["data"]
    assert [row["index"] for row in rows] == [0, 1, 2] and rows[0]["embedding"] == rows[2]["embedding"]
    assert client.post("/v1/embeddings", json={"input": 3}).status_code == 400


def test_with_a_key_every_request_needs_it(backend):
    with TestClient(build_app(backend, MODEL, api_key="s3cret-key")) as c:
        assert c.get("/v1/models").status_code == 401
        r = c.post("/v1/chat/completions", json=chat(), headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401 and "s3cret" not in r.text
        assert c.get("/v1/models", headers={"Authorization": "Bearer s3cret-key"}).status_code == 200
        assert c.post("/v1/embeddings", json={"input": "a"}).status_code == 401


@pytest.fixture(scope="module")
def shared_client():
    """One app for every example of the property below (a fresh one per example costs more than the test)."""
    backend = ScriptedBackend("ok")
    with TestClient(build_app(backend, MODEL)) as c:
        yield c
    backend.close()


@settings(max_examples=100, deadline=None)
@given(body=st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
                         lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
                             st.sampled_from(["messages", "role", "content", "max_tokens", "stream", "prompt",
                                              "temperature", "stop", "response_format", "type", "json_schema",
                                              "schema", "seed", "top_k", "n", "text", "regex", "choices",
                                              "grammar", "guided_regex", "guided_choice", "structured_outputs",
                                              "choice"]), inner, max_size=5),
                         max_leaves=12))
def test_any_json_body_is_answered_or_refused_never_a_server_error(shared_client, body):
    for path in ("/v1/chat/completions", "/v1/completions"):
        r = shared_client.post(path, content=json.dumps(body), headers=JSON)
        assert r.status_code in (200, 400), (body, r.text)
        if r.status_code == 400:
            assert r.json()["error"]["message"]


def test_plan_refuses_with_request_error_not_anything_else():
    with pytest.raises(RequestError):
        plan({"prompt": 3}, chat=False)


# --- logprobs ----------------------------------------------------------------------------------------


@pytest.fixture
def confident():
    b = ScriptedBackend("Hello there friend", logprobs=[-0.25, -0.5, -0.6])  # each word the likelier option
    yield b
    b.close()


def test_a_chat_answer_has_each_token_s_logprob_streamed_and_whole_in_the_openai_shape(confident):
    from openai.types.chat import ChatCompletion, ChatCompletionChunk

    with TestClient(build_app(confident, MODEL)) as c:
        r = c.post("/v1/chat/completions", json=chat(stream=True, logprobs=True, top_logprobs=2))
        chunks = [e for e in sse_objects(r.text) if e != "[DONE]"]
        pieces = [ChatCompletionChunk.model_validate(e).choices[0] for e in chunks if e["choices"]]
        records = [t for p in pieces if p.logprobs for t in p.logprobs.content]
        assert [t.token for t in records] == ["Hello", " there", " friend"]
        assert [t.logprob for t in records] == [-0.25, -0.5, -0.6]
        assert all(len(t.top_logprobs) == 2 and t.top_logprobs[0].token == t.token for t in records)
        assert all(bytes(t.bytes).decode() == t.token for t in records)

        whole = ChatCompletion.model_validate(c.post("/v1/chat/completions", json=chat(logprobs=True)).json())
        content = whole.choices[0].logprobs.content
        assert [t.logprob for t in content] == [-0.25, -0.5, -0.6] and all(not t.top_logprobs for t in content)
        assert confident.scripted.requests[-1].top_logprobs == 0 and confident.scripted.requests[-1].logprobs

        plain = c.post("/v1/chat/completions", json=chat()).json()
        assert plain["choices"][0]["logprobs"] is None  # not asked: null, as OpenAI answers
        assert confident.scripted.requests[-1].logprobs is False  # and the engine records none


def test_a_raw_completion_answers_logprobs_n_in_the_legacy_shape(confident):
    from openai.types import Completion

    with TestClient(build_app(confident, MODEL)) as c:
        body = c.post("/v1/completions", json={"model": MODEL, "prompt": "Once", "logprobs": 1}).json()
        legacy = Completion.model_validate(body).choices[0].logprobs
        assert legacy.tokens == ["Hello", " there", " friend"] and legacy.token_logprobs == [-0.25, -0.5, -0.6]
        assert legacy.text_offset == [0, 5, 11] and [list(t) for t in legacy.top_logprobs] == [
            ["Hello"], [" there"], [" friend"]]
        r = c.post("/v1/completions", json={"model": MODEL, "prompt": "Once", "logprobs": 2, "stream": True})
        offsets = [o for e in sse_objects(r.text) if e != "[DONE]" and e["choices"] and e["choices"][0]["logprobs"]
                   for o in e["choices"][0]["logprobs"]["text_offset"]]
        assert offsets == [0, 5, 11]
        for wrong, says in ((21, "from 0 to 20"), (-1, "from 0 to 20"), (True, "whole number"), ("2", "whole")):
            r = c.post("/v1/completions", json={"model": MODEL, "prompt": "Once", "logprobs": wrong})
            assert r.status_code == 400 and says in r.json()["error"]["message"], (wrong, r.text)
        r = c.post("/v1/completions", json={"model": MODEL, "prompt": "Once", "top_logprobs": 2})
        assert r.status_code == 400 and "logprobs: N" in r.json()["error"]["message"]

"""``JobSpec.merge(Overrides)``: what was given replaces exactly its own field, and nothing else moves; the model
a transcript records (``ModelRef.to_json``) reads back as itself, and nothing a file holds reads back as anything
but a reference or one ``ValueError``.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tensorjob_jupyter as tj
from tensorjob_jupyter.host.spec import INFER_FIELDS, UNSET, Overrides
from tensorjob_jupyter.limits import FIELDS as LIMIT_FIELDS
from tensorjob_jupyter.world.fetch import FetchGrants
from tests import wat

GUEST = wat.script_guest([{"cmd": "done", "result": 0}])
BASE = tj.JobSpec.of(GUEST, input={"a": 1}, read=["."], fetch=["https://example.org/"], max_tokens=64,
                     infer=tj.InferOptions.of(temperature=0.3, seed=7, lora={"style": 0.5}),
                     model="/models/base.gguf", model_options={"loras": {"style": "/models/style.gguf"}},
                     require_grounded="title")

text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
json_value = st.recursive(st.none() | st.booleans() | st.integers(-2**53, 2**53) | text,
                          lambda kids: st.lists(kids, max_size=3) | st.dictionaries(text, kids, max_size=3),
                          max_leaves=8)
paths = st.lists(st.sampled_from(["a.txt", "docs", "/tmp/x"]), max_size=3).map(tuple)
infer_values = {"temperature": st.floats(0, 2), "top_p": st.floats(0.01, 1), "repeat_penalty": st.floats(0.5, 2),
                "seed": st.integers(0, 2**32 - 1), "chat": st.booleans(), "cache_prompt": st.booleans(),
                "top_k": st.integers(0, 100), "min_p": st.floats(0, 1), "stop": st.lists(text, max_size=2).map(tuple),
                "lora": st.dictionaries(st.sampled_from(["style", "other"]), st.floats(-2, 2), max_size=2)}

overrides = st.fixed_dictionaries({}, optional={
    "input": json_value, "read": paths, "fetch": st.just(("https://example.com/",)), "input_bytes": st.binary(max_size=8),
    "limits": st.dictionaries(st.sampled_from(["max_tokens", "max_steps", "max_handles"]), st.integers(1, 1000),
                              min_size=1).map(lambda d: tuple(d.items())),
    "infer": st.dictionaries(st.sampled_from(sorted(infer_values)), st.none(), min_size=1).flatmap(
        lambda keys: st.fixed_dictionaries({k: infer_values[k] for k in keys})).map(lambda d: tuple(d.items())),
    "runs_dir": st.just("/tmp/runs"), "cwd": st.just("/tmp"), "name": text, "debug": st.booleans(),
    "break_on": st.just(("infer",)), "require_grounded": st.just(("year",)),
    "model_name": st.none(), "loras": st.just((("other", "/models/other.gguf"),)),
}).map(lambda kw: Overrides(**kw))


def test_merging_nothing_is_the_spec_itself():
    assert BASE.merge(Overrides()) is BASE
    assert Overrides().given == frozenset()


def test_an_override_of_nothing_known_is_refused_where_it_is_made():
    with pytest.raises(TypeError, match="max_infers"):
        Overrides(limits=(("max_infers", 3),))
    with pytest.raises(TypeError, match="warmth"):
        Overrides(infer=(("warmth", 3),))
    with pytest.raises(ValueError):
        Overrides.of(max_tokens=-1)


@settings(max_examples=200, deadline=None)
@given(overrides)
def test_what_was_given_replaces_its_own_field_and_nothing_else_moves(o):
    merged = BASE.merge(o)
    given = o.given
    for f in ("read", "fetch", "input_bytes", "runs_dir", "cwd", "name", "debug", "break_on", "require_grounded"):
        assert getattr(merged, f) == (getattr(o, f) if f in given else getattr(BASE, f)), f
    assert isinstance(merged.fetch, FetchGrants) and isinstance(o.fetch, (FetchGrants, type(None)))  # parsed once
    assert merged.input == (o.input if o.input is not UNSET else BASE.input)
    given_limits = dict(o.limits)
    for f in LIMIT_FIELDS:
        assert getattr(merged.limits, f) == given_limits.get(f, getattr(BASE.limits, f)), f
    given_infer = dict(o.infer)
    sampler = dataclasses.asdict(merged.infer.sampler)
    for f in INFER_FIELDS:
        if f in ("chat", "cache_prompt"):
            assert getattr(merged.infer, f) == given_infer.get(f, getattr(BASE.infer, f))
        elif f == "lora":
            expected = given_infer.get("lora", {c.name: c.scale for c in BASE.infer.lora})
            assert {c.name: c.scale for c in merged.infer.lora} == expected
        else:
            assert sampler[f] == given_infer.get(f, getattr(BASE.infer.sampler, f)), f
    assert merged.guest is BASE.guest
    assert merged.model.name == BASE.model.name and merged.model.kind == BASE.model.kind
    assert merged.model.loras == (o.loras if o.loras is not None else BASE.model.loras)
    assert given <= {f.name for f in dataclasses.fields(Overrides)} | set(LIMIT_FIELDS) | set(INFER_FIELDS)


def test_another_model_takes_none_of_the_old_ones_options_and_the_same_url_keeps_them():
    served = tj.ModelRef.parse("http://127.0.0.1:9/v1", model_name="a", api_key_env="KEY_A")
    assert served.with_options(tj.ModelRef.parse("http://127.0.0.1:9/v1")) == served
    assert served.with_options(tj.ModelRef.parse("http://127.0.0.1:10/v1")).served_name is None
    assert served.with_options(model_name="b").served_name == "b"
    assert BASE.model.with_options(tj.ModelRef.parse("/models/other.gguf")).loras == ()
    spec = BASE.merge(Overrides(model=tj.ModelRef.parse("http://127.0.0.1:9/v1", model_name="m")))
    assert spec.model.kind == "url" and spec.model.served_name == "m" and spec.model.loras == ()
    with pytest.raises(tj.ModelError, match="--model-name"):  # a served model's option, for a local one
        BASE.merge(Overrides(model_name="m"))


refs = st.one_of(
    st.builds(lambda n, k: tj.ModelRef.parse("http://127.0.0.1:8000/v1", model_name=n, api_key_env=k),
              st.none() | st.from_regex(r"[a-z][a-z0-9-]{0,10}", fullmatch=True),
              st.none() | st.from_regex(r"[A-Z][A-Z0-9_]{0,10}", fullmatch=True)),
    st.builds(lambda loras, threads: tj.ModelRef.parse("/models/m.gguf", loras=loras,
                                                       **({"n_threads": threads} if threads else {})),
              st.dictionaries(st.from_regex(r"[a-z]{1,6}", fullmatch=True), st.just("/models/l.gguf"), max_size=2),
              st.none() | st.integers(1, 64)),
    st.just(tj.ModelRef()), st.just(tj.ModelRef.parse("hf:org/repo:Q4_K_M")))


@given(refs)
def test_a_recorded_model_reads_back_as_itself(ref):
    assert tj.ModelRef.from_json(ref.to_json()) == ref


anything = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | text,
                        lambda kids: st.lists(kids, max_size=3) | st.dictionaries(text, kids, max_size=4),
                        max_leaves=12)
shaped = st.fixed_dictionaries({"kind": st.sampled_from(["embedded", "file", "hf", "url", "other"]),
                                "name": st.sampled_from(["", "/m.gguf", "hf:o/r", "http://h:1/v1", "x"])},
                               optional={"served_name": anything, "api_key_env": anything, "loras": anything,
                                         "engine": anything})


@settings(max_examples=300, deadline=None)
@given(st.one_of(anything, shaped))
def test_a_model_ref_from_a_file_is_a_reference_or_one_value_error(obj):
    try:
        ref = tj.ModelRef.from_json(obj)
    except ValueError as e:
        assert str(e) and "\n" not in str(e)
        return
    assert isinstance(ref, tj.ModelRef) and ref.kind == obj["kind"]
    assert tj.ModelRef.from_json(ref.to_json()) == ref

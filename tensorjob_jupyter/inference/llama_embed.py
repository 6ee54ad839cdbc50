"""Embeddings on the llama.cpp engine: a second context on the same weights, decoded a piece at a time.

``EmbeddingContext`` is made on the first embed: per-token outputs (mean-pooled here), a unified KV cache
that holds one text at the longest plus a piece. ``Embedding`` is one embed request, decoded in pieces of at
most ``EMBED_PIECE_TOKENS`` so that the worker can serve generation requests between them and notice a client
that left; a long text's KV stays between its pieces. Apart from the generation engine because it shares
only the weights with it: no slot, sampler or decode step of the generation context is involved.

Design: docs/internals/inference.md#embeddings-and-logs
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np

from tensorjob_jupyter.inference.base import ModelError, RequestTooLarge
from tensorjob_jupyter.inference.library import CaptureLog, log_reason
from tensorjob_jupyter.inference.llama_text import ModelText

#: Texts one embedding decode may hold.
EMBED_SEQS = 64
#: Tokens one embedding decode takes at most (causal models): the longest the worker is held by an embed
#: before it serves waiting generation requests (64 tokens take about half a second on one core of this
#: project's test machine with the embedded model; a piece of 128 was twice the wait and embedded no faster).
EMBED_PIECE_TOKENS = 64
#: Tokens one embed request may hold in all (after each text is cut to the embedding context).
EMBED_MAX_TOKENS = 32_768


class EmbeddingContext:
    """The embedding context of a model (``model``: its ``LlamaModel``; ``lc`` and ``internals``:
    llama-cpp-python and its ``_internals``), made on first use (``open``); ``longest``: the longest text
    embedded, in tokens (capped at the model's training context ``n_ctx_train`` once made)."""

    def __init__(self, lc: Any, internals: Any, model: Any, model_path: Path, *, longest: int, n_ctx_train: int,
                 n_threads: int, n_threads_batch: int):
        self.lc = lc
        self._internals = internals
        self._model = model
        self._model_path = model_path
        self.longest = longest
        self._n_ctx_train = n_ctx_train
        self._n_threads = n_threads
        self._n_threads_batch = n_threads_batch
        self.ctx: Any = None
        self.batch: Any = None
        self.seqs = 1  # texts one decode may hold
        self.piece = 1  # tokens one decode takes at most
        self.causal = True

    @property
    def n_embd(self) -> int:
        return self._model.n_embd()

    def open(self) -> tuple[Any, Any]:
        """The context and its batch: per-token outputs (no pooling: ``Embedding`` pools them), a unified KV
        cache that holds one text at the longest plus a piece, and pieces of ``EMBED_PIECE_TOKENS`` --
        unless the model's attention is not causal (an encoder: a text's tokens see the ones after
        them), whose texts are decoded whole, a text or more a piece."""
        if self.ctx is None:
            lc = self.lc
            n = self.longest = min(self.longest, self._n_ctx_train)
            self.seqs = min(EMBED_SEQS, int(lc.llama_max_parallel_sequences()))
            ctx = self._new_context(min(EMBED_PIECE_TOKENS, n), n)
            self.causal = bool(lc.llama_get_causal_attn(ctx.ctx))
            if not self.causal:
                ctx.close()
                ctx = self._new_context(n, n)
            self.piece = min(EMBED_PIECE_TOKENS, n) if self.causal else n
            self.batch = self._internals.LlamaBatch(n_tokens=self.piece, embd=0, n_seq_max=1, verbose=False)
            self.ctx = ctx
        return self.ctx, self.batch

    def embedding(self, texts: Sequence[str], text: ModelText) -> Embedding:
        """An embed of ``texts`` (tokenized as ``text`` says), to be decoded a piece at a time (``Embedding.step``).

        Texts longer than the embedding context are truncated to it; an empty text is embedded as the
        BOS token alone. ``RequestTooLarge`` if the texts come to more than ``EMBED_MAX_TOKENS``.
        """
        self.open()
        limit = self.longest  # the model's training context at most
        seqs = []
        for one in texts:
            toks = text.tokenize(one)[:limit] if one else []
            if not toks:
                toks = [text.bos] if text.bos >= 0 else text.tokenize(" ")[:1]
            seqs.append(toks)
        total = sum(len(t) for t in seqs)
        if total > EMBED_MAX_TOKENS:
            raise RequestTooLarge(f"the texts to embed are {total} tokens, more than one request may embed "
                                  f"({EMBED_MAX_TOKENS}, EMBED_MAX_TOKENS); send fewer or shorter texts at a time")
        return Embedding(self, seqs)

    def close(self) -> None:
        for obj in (self.batch, self.ctx):
            if obj is not None:
                obj.close()

    def _new_context(self, piece: int, longest: int):
        lc = self.lc
        cp = lc.llama_context_default_params()
        cp.n_ctx = longest + piece
        cp.n_batch = piece
        cp.n_ubatch = piece
        cp.n_seq_max = self.seqs
        cp.kv_unified = True
        cp.embeddings = True
        cp.pooling_type = lc.LLAMA_POOLING_TYPE_NONE
        cp.n_threads = self._n_threads
        cp.n_threads_batch = self._n_threads_batch
        cp.no_perf = True
        with CaptureLog() as lines:
            try:
                return self._internals.LlamaContext(model=self._model, params=cp, verbose=False)
            except Exception as e:  # noqa: BLE001
                raise ModelError(f"could not create an embedding context for {self._model_path}: "
                                 f"{log_reason(lines) or e}") from None


class Embedding:
    """One embed request in pieces: each ``step()`` is one decode of at most the context's piece of tokens,
    and says whether every vector is made (``vectors``).

    The texts are decoded in order. With causal attention a text may run over several pieces: its
    KV stays in the embedding context between them, each piece's per-token outputs are summed, and its
    vector is the mean of all of them -- what llama.cpp's mean pooling computes over one decode, here
    over as many as the text needs, so no decode is longer than a piece whatever the text. A text's
    cells are freed once it is done; each piece starts from what the one before left."""

    def __init__(self, context: EmbeddingContext, seqs: list[list[int]]):
        self._context = context
        self._seqs = seqs
        self._next = 0  # the first text not yet wholly decoded
        self._offset = 0  # its tokens decoded so far
        self._sums: dict[int, np.ndarray] = {}
        self._out: list[list[float]] = []
        self._fresh = True

    @property
    def done(self) -> bool:
        return self._next >= len(self._seqs)

    @property
    def vectors(self) -> list[list[float]]:
        assert self.done, "the embedding is not finished"
        return self._out

    def step(self) -> bool:
        """Decode the next piece; True once every text is embedded."""
        if self.done:
            return True
        context = self._context
        lc = context.lc
        ctx, batch = context.open()
        piece, causal, n_seqs = context.piece, context.causal, context.seqs
        if self._fresh or not causal:  # what an abandoned embedding left; an encoder's texts never span pieces
            ctx.kv_cache_clear()
            self._fresh = False
        batch.reset()
        b = batch.batch
        taken: list[tuple[int, int, int, bool]] = []  # (text, its first row, rows, last piece of it)
        index, offset = self._next, self._offset
        while index < len(self._seqs) and b.n_tokens < piece and len(taken) < n_seqs:
            toks = self._seqs[index]
            n = min(len(toks) - offset, piece - b.n_tokens)
            if not causal and n < len(toks) - offset:
                break  # a text is decoded whole: it waits for a piece of its own
            seq_id = index % n_seqs  # at most n_seqs texts a piece, in order: distinct
            for j in range(n):
                row = b.n_tokens + j
                b.token[row] = toks[offset + j]
                b.pos[row] = offset + j
                b.seq_id[row][0] = seq_id
                b.n_seq_id[row] = 1
                b.logits[row] = True
            taken.append((index, b.n_tokens, n, offset + n == len(toks)))
            b.n_tokens += n
            if offset + n < len(toks):
                offset += n
                break
            index, offset = index + 1, 0
        rc = lc.llama_decode(ctx.ctx, b)
        if rc != 0:
            raise ModelError(f"embedding failed: llama_decode returned {rc}")
        ptr = lc.llama_get_embeddings(ctx.ctx)
        if not ptr:
            raise ModelError("embedding failed: llama.cpp returned no embeddings")
        rows = np.ctypeslib.as_array(ptr, shape=(b.n_tokens, context.n_embd))
        for text, first, n, last in taken:
            part = rows[first:first + n].sum(axis=0, dtype=np.float64)
            total = self._sums.pop(text, None)
            total = part if total is None else total + part
            if not last:
                self._sums[text] = total
                continue
            vec = total / len(self._seqs[text])
            norm = float(np.linalg.norm(vec))
            self._out.append((vec / norm if norm > 0 else vec).tolist())
            if causal:
                ctx.kv_cache_seq_rm(text % n_seqs, -1, -1)
        self._next, self._offset = index, offset
        return self.done


__all__ = ["EMBED_SEQS", "EMBED_PIECE_TOKENS", "EMBED_MAX_TOKENS", "EmbeddingContext", "Embedding"]

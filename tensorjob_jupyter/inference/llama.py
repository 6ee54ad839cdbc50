"""The llama.cpp engine: a GGUF model served through llama-cpp-python.

``LlamaEngine`` implements the ``Engine`` protocol on llama-cpp-python's low-level API rather than on
``Llama.create_completion``, because the high-level loop cannot give the host what it needs: a stop verdict that
reaches the decoder, a cancel that ends even a decode in progress, whole characters only, a prefix cache per slot
keyed by the LoRA selection, runtime LoRA, continuous batching, grammar masks off the decode thread, and
embeddings on a second context. This module is the engine itself -- the model, its generation context, and the
decode step that turns logits into delivered text: the only code that decodes on that context. It composes
rooms each readable alone: ``llama_scheduler`` (admission), ``llama_batch`` (what one decode holds),
``llama_cache`` (the KV and prefix cache), ``llama_machine`` (threads fitted to the machine), ``llama_abort``
(a decode ended part-way), ``llama_sampling``, ``llama_lora``, ``llama_text`` (tokens, the chat template) and
``llama_embed`` (embeddings), over the records of ``llama_sequence``.

Design: docs/internals/inference.md#llamapy
"""

from __future__ import annotations

import concurrent.futures
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Mapping, Sequence

import numpy as np

from tensorjob_jupyter.inference.base import (
    FINISH_CANCELLED, FINISH_LENGTH, FINISH_STOP, ConstraintError, GenerateRequest, GenerateResult,
    GenerateUsage, LoraChoice, ModelError, Pending, TokenCallback,
)
from tensorjob_jupyter.inference.gguf import check_gguf
from tensorjob_jupyter.inference.grammar import Abandoned, GrammarSampler, ModelGrammars
from tensorjob_jupyter.inference.library import CaptureLog, llama_cpp_library, log_reason
from tensorjob_jupyter.inference.llama_abort import ABORT_POLL_S, ABORT_WATCH_TOKENS, Aborted, AbortWatch
from tensorjob_jupyter.inference.llama_batch import (
    LONE_MIN_TOKENS, PROMPT_CHUNK_SHARE, PROMPT_MIN_TOKENS, PROMPT_STEP_RATIO, PROMPT_STEP_RATIO_MAX, RATE_WEIGHT,
    PromptRates, fill_batch, share,
)
from tensorjob_jupyter.inference.llama_cache import PREFIX_COPY_MIN_TOKENS, PrefixCache
from tensorjob_jupyter.inference.llama_embed import (
    EMBED_MAX_TOKENS, EMBED_PIECE_TOKENS, EMBED_SEQS, Embedding, EmbeddingContext,
)
from tensorjob_jupyter.inference.llama_lora import Adapters
from tensorjob_jupyter.inference.llama_machine import QUIET_OTHERS_CPUS, THREADS_CHECK_S, MachineWatch
from tensorjob_jupyter.inference.llama_sampling import request_sampler
from tensorjob_jupyter.inference.llama_scheduler import (
    ADMIT_WINDOW_S, PREFIX_LOOKAHEAD, PREFIX_PASS_LIMIT, Admission, may_join,
)
from tensorjob_jupyter.inference.llama_sequence import Generation, LoraKey, Slot
from tensorjob_jupyter.inference.llama_text import ModelText
from tensorjob_jupyter.inference.logprobs import TokenText, token_logprob
from tensorjob_jupyter.inference.penalties import PENALTY_LAST_N
from tensorjob_jupyter.inference.text_stream import TextStream
from tensorjob_jupyter.inference.topology import CpuShare, default_threads, gpu_offload_supported

#: While every sequence waits for its listener: how long to wait on the one (a listener bounds its own
#: wait), or on each in turn when several wait.
HELD_WAIT_S = 1.0
HELD_POLL_S = 0.001
#: After a decode step, how long the step waits for the constrained sequences' choices (each on a mask thread;
#: a mask costs microseconds to a few milliseconds): one not made by then sits the decode out until it is.
MASK_WAIT_S = 0.02
#: While no sequence can decode for want of its choice: how often to look at the jobs (one may have ended).
MASK_POLL_S = 0.05

# -- the engine ---------------------------------------------------------------------------------


class LlamaEngine:
    """A GGUF model on llama.cpp. Use from one thread only (the worker's).

    ``n_ctx``: the context of each slot, prompt and reply (capped at the
    model's training context; the KV cache holds ``n_ctx * slots`` cells,
    about 23 KB each for SmolLM2-135M); ``n_batch``: prompt tokens per decode; ``n_threads`` /
    ``n_threads_batch``: default to the physical cores / the CPUs this process
    may use, and then fitted to the CPUs other work leaves free (given either,
    the engine keeps them); ``n_gpu_layers``: default -1 (all) when the build can offload,
    else 0; ``slots``: cached sequences, and the most requests decoded
    together; ``loras``: adapter name -> GGUF path, selectable per request;
    ``embedding_n_ctx``: the longest text embedded (longer ones are cut);
    ``cpu_share``: how an engine that fits its threads measures the machine's
    other work (default: a ``CpuShare`` over ``/proc/stat``); ``prefix_order``:
    start the queued request sharing the longest prefix with the slots first
    (False: in arrival order).
    """

    def __init__(self, model_path: str | os.PathLike, *, n_ctx: int = 2048, n_batch: int = 512,
                 n_threads: int | None = None, n_threads_batch: int | None = None,
                 n_gpu_layers: int | None = None, slots: int = 4,
                 loras: Mapping[str, str | os.PathLike] | None = None,
                 embedding_n_ctx: int = 2048, model_name: str | None = None, cpu_share: CpuShare | None = None,
                 prefix_order: bool = True):
        llama_cpp = llama_cpp_library()
        from llama_cpp import _internals

        self._lc = llama_cpp
        self._internals = _internals
        self.model_path = check_gguf(model_path)
        self.model_name = model_name or self.model_path.stem
        if n_gpu_layers is None:
            n_gpu_layers = -1 if gpu_offload_supported() else 0
        self.n_gpu_layers = n_gpu_layers
        threads, threads_batch = default_threads()
        #: given no thread count, the engine fits its threads to the cores other work leaves free
        self.fits_threads = n_threads is None and n_threads_batch is None
        self.n_threads = n_threads or threads
        self.n_threads_batch = n_threads_batch or threads_batch
        self.n_slots = max(1, min(int(slots), int(llama_cpp.llama_max_parallel_sequences())))
        self._closed = False

        params = llama_cpp.llama_model_default_params()
        params.n_gpu_layers = 0x7FFFFFFF if self.n_gpu_layers < 0 else self.n_gpu_layers
        with CaptureLog() as lines:
            try:
                self._model = _internals.LlamaModel(path_model=str(self.model_path), params=params,
                                                    verbose=False)
            except Exception as e:  # noqa: BLE001 - llama-cpp-python raises ValueError
                detail = log_reason(lines) or str(e)
                raise ModelError(f"could not load model {self.model_path}: {detail}") from None
        try:
            self._vocab = self._model.vocab
            self.n_ctx_train = self._model.n_ctx_train()
            self.n_ctx = min(int(n_ctx), self.n_ctx_train) if n_ctx else self.n_ctx_train
            self.n_batch = max(1, min(int(n_batch), self.n_ctx))
            self.n_vocab = self._model.n_vocab()
            with CaptureLog() as lines:
                cp = llama_cpp.llama_context_default_params()
                cp.n_ctx = self.n_ctx * self.n_slots
                cp.n_batch = self.n_batch
                cp.n_ubatch = self.n_batch
                cp.n_threads = self.n_threads
                cp.n_threads_batch = self.n_threads_batch
                cp.n_seq_max = self.n_slots
                # each slot gets its own stream of n_ctx cells: a sequence always sits at the
                # same cells, so its numerics do not depend on what the other slots hold
                cp.kv_unified = False
                cp.no_perf = True
                try:
                    self._ctx = _internals.LlamaContext(model=self._model, params=cp, verbose=False)
                except Exception as e:  # noqa: BLE001
                    raise ModelError(f"could not create a context for {self.model_path} "
                                     f"(n_ctx={self.n_ctx} x {self.n_slots} slots): "
                                     f"{log_reason(lines) or e}") from None
            self.n_ctx = int(llama_cpp.llama_n_ctx_seq(self._ctx.ctx))
            self._batch = _internals.LlamaBatch(n_tokens=max(self.n_batch, self.n_slots), embd=0,
                                                n_seq_max=1, verbose=False)
            #: the slots and what their KV holds (``llama_cache``)
            self._cache = PrefixCache(self._ctx, self.n_slots)
            self._slots: list[Slot] = self._cache.slots
            self.prefix_order = prefix_order
            #: what decode steps cost, and so the prompt tokens the next one reads (``llama_batch``)
            self._rates = PromptRates(self.n_batch)
            #: decodes ended part-way because every sequence in them was abandoned, since creation
            self.aborted_decodes = 0
            self._abort_watch = AbortWatch.install(llama_cpp, self._ctx)
            #: the threads it decodes with, fitted to the machine, and the machine's quiet rates (``llama_machine``)
            self._machine = MachineWatch(self.n_threads, self.n_threads_batch,
                                         lambda n, n_batch: llama_cpp.llama_set_n_threads(self._ctx.ctx, n, n_batch),
                                         (cpu_share or CpuShare(THREADS_CHECK_S)) if self.fits_threads else None)
            self._loras = Adapters(llama_cpp, self._model, self._ctx, loras or {})
            self._text = ModelText(llama_cpp, self._model, self.n_ctx)
            self._embedder = EmbeddingContext(llama_cpp, _internals, self._model, self.model_path,
                                              longest=embedding_n_ctx, n_ctx_train=self.n_ctx_train,
                                              n_threads=self.n_threads, n_threads_batch=self.n_threads_batch)
            self._grammars: ModelGrammars | None = None
            self._mask_threads: ThreadPoolExecutor | None = None
        except BaseException:
            self._model.close()
            raise

    # -- lifecycle ------------------------------------------------------------------------

    def close(self) -> None:
        """Free the contexts and the model (adapters go with the model)."""
        if self._closed:
            return
        self._closed = True
        if self._mask_threads is not None:
            self._mask_threads.shutdown(wait=True, cancel_futures=True)
        if self._abort_watch is not None:
            self._abort_watch.close()
        self._embedder.close()
        for obj in (self._batch, self._ctx):
            if obj is not None:
                obj.close()
        self._model.close()

    def __repr__(self) -> str:
        return (f"<LlamaEngine {self.model_name} n_ctx={self.n_ctx} slots={self.n_slots} "
                f"gpu_layers={self.n_gpu_layers} threads={self.n_threads}>")

    @property
    def prefix_copies(self) -> int:
        """KV copies from one slot to another (a shared prefix decoded once), since creation."""
        return self._cache.copies

    # -- LoRA (``llama_lora``) and text (``llama_text``) ------------------------------------------------

    @property
    def lora_names(self) -> list[str]:
        return self._loras.names

    @property
    def lora(self) -> LoraKey:
        """The LoRA selection set on the context now (the running batch's)."""
        return self._loras.current

    def lora_key(self, choices: Sequence[LoraChoice]) -> LoraKey:
        """The normalised adapter selection; unknown names raise ``ModelError``."""
        return self._loras.key(choices)

    def tokenize(self, text: str, *, special: bool = False, add_bos: bool = True) -> list[int]:
        return self._text.tokenize(text, special=special, add_bos=add_bos)

    def piece(self, token: int) -> bytes:
        """The raw bytes of one token (may be part of a character)."""
        return self._text.piece(token)

    def is_eog(self, token: int) -> bool:
        return self._text.is_eog(token)

    @property
    def has_chat_template(self) -> bool:
        """Whether the model names a chat template (instruct models do): ``chat=None`` then uses it."""
        return self._text.has_chat_template

    def chat_prompt(self, prompt: str, system: str | None = None) -> str:
        """``prompt`` as one user turn in the model's chat template (ChatML if it has none)."""
        return self._text.chat_prompt(prompt, system)

    def uses_chat(self, request: GenerateRequest) -> bool:
        """Whether ``request`` is sent through the chat template (``chat=None``: when the model has one)."""
        return self._text.uses_chat(request)

    def prompt_tokens(self, request: GenerateRequest) -> list[int]:
        return self._text.prompt_tokens(request)

    # -- generation -----------------------------------------------------------------------------

    def generate(self, request: GenerateRequest, on_token: TokenCallback) -> GenerateResult:
        """Generate for one request, streaming whole-character text to ``on_token``."""
        box: list = []
        self.serve(Pending(request, on_token, lambda r, e: box.append((r, e))))
        result, error = box[0]
        if error is not None:
            raise error
        return result

    def serve(self, first: Pending, admit: Callable[..., Pending | None] | None = None) -> None:
        """Run ``first`` and whatever ``admit`` hands over meanwhile, batched, to completion.

        Between decode steps, while a slot is free, ``admit()`` is asked for
        the requests queued now (None: nothing more), up to ``PREFIX_LOOKAHEAD``
        waiting; before the first step, once two have come together,
        ``admit(ADMIT_WINDOW_S)`` waits a little for each next one, so requests
        sent together start together. Of those waiting, the one sharing the
        longest prefix with what the slots hold or read starts next
        (``llama_scheduler.prefix_first``: its KV is copied, not decoded again), else the
        earliest. Each request's ``done`` is called as soon as it finishes. A
        request whose LoRA selection differs from the running batch's waits
        until the batch drains, and none behind it starts before it.
        """
        active: list[Generation] = []
        admission = Admission(self, self._cache, first, admit, self._try_start)
        while True:
            admission.fill(active)
            if not active:
                if not admission.waiting:
                    return
                continue  # the batch drained: the first waiting request can start now
            try:
                self._step(active)
            except BaseException as e:  # noqa: BLE001 - fail the batch, keep the engine
                error = e if isinstance(e, ModelError) else ModelError(f"decoding failed: {e}")
                for seq in active:
                    self._release(seq)
                    self._drop_slot(seq.slot)
                    seq.pending.done(None, error)
                active.clear()

    def _try_start(self, item: Pending, active: list[Generation]) -> bool:
        """Start ``item`` if it can join ``active`` now; False means it must wait.

        It must wait when every slot is busy or the batch runs another LoRA
        selection (``llama_scheduler.may_join``).

        A request that can never run (bad LoRA name, prompt too long) is
        answered with its error and counts as started.
        """
        request = item.request
        started = time.perf_counter()
        if request.max_tokens <= 0:  # nothing to generate: answer without touching the model
            item.done(GenerateResult("", FINISH_LENGTH, GenerateUsage()), None)
            return True
        if item.abandoned():  # its job ended while it waited
            item.done(GenerateResult("", FINISH_CANCELLED, GenerateUsage()), None)
            return True
        if not may_join(request, active, self.n_slots):
            return False
        try:
            self._machine.use(request.threads if request.alone else None)
            key = self.lora_key(request.lora)
            if active and key != self._loras.current:
                return False
            if item.tokens is None:
                item.tokens = self.prompt_tokens(request)
            tokens = item.tokens
            room = self.n_ctx - len(tokens)
            limit = min(request.max_tokens, room)
            self._loras.select(key)
            slot, reuse, source = self._cache.pick(tokens, key, request.cache_prompt)
            sampler = self._sampler(request, tokens, item.abandoned)
            seq = Generation(item, slot, sampler, TextStream(request.sampler.stop), len(tokens), reuse,
                             limit, started, prompt=tokens)
            slot.busy, slot.prompt, slot.lora = True, tokens, key
            if source is None:
                self._cache.keep(seq, reuse)
            else:  # copied once the busy slot has read that far (``PrefixCache.take_copies``)
                seq.copy_from, seq.copy_len = next(other for other in active if other.slot is source), reuse
        except Abandoned:  # its job ended while the grammar was being built
            item.done(GenerateResult("", FINISH_CANCELLED, GenerateUsage()), None)
            return True
        except BaseException as e:  # noqa: BLE001 - answered through the request
            item.done(None, e if isinstance(e, ModelError) else ModelError(f"{type(e).__name__}: {e}"))
            return True
        seq.next_token = tokens[-1]  # decoded in the next step, with the batch: the first token comes from it
        active.append(seq)
        return True

    def _drop_slot(self, slot: Slot) -> None:
        self._cache.drop(slot)

    def _decode(self) -> None:
        rc = self._lc.llama_decode(self._ctx.ctx, self._batch.batch)
        if rc != 0:
            if rc == 2:
                raise Aborted()
            if rc == 1:
                raise ModelError("the KV cache has no room for this batch (llama_decode returned 1)")
            raise ModelError(f"llama_decode failed with code {rc}")

    def _sampler(self, request: GenerateRequest, prompt: list[int], abandoned=None):
        """The request's sampler (``llama_sampling``): each kind samples and closes as llama.cpp's chain does."""
        return request_sampler(self, self._internals, request, prompt, abandoned, self._logits_row)

    def _logits_row(self, ctx, i: int) -> np.ndarray:
        """Output ``i``'s logits in the context's own buffer (writable: the penalty changes a few in place)."""
        return np.ctypeslib.as_array(self._lc.llama_get_logits_ith(ctx.ctx, i), shape=(self.n_vocab,))

    def grammars(self) -> ModelGrammars:
        """This model's vocabulary as the grammar engine sees it, and its compiled grammars (built on the
        first constrained request)."""
        if self._grammars is None:
            self._grammars = ModelGrammars(self)
        return self._grammars

    def _prompt_budget(self, running: list[Generation], reading: list[Generation]) -> int:
        """The prompt tokens this step reads (``PromptRates.budget``), or all of them where a running answer is
        expected to end before chunks would (``PromptRates.whole``: measured against the rule's other form, every
        running answer, it took a short-answer map's first tokens from 1.57 to 1.37 times llama-server's)."""
        budget = self._rates.budget(len(running), len(reading))
        if not running:
            return budget
        need = sum(max(0, len(seq.prompt) - 1 - len(seq.slot.tokens)) for seq in reading)
        left = min(self._rates.expected_left(seq.limit, seq.n_out) for seq in running)
        return self._rates.whole(budget, len(running), need, left)

    def _step(self, active: list[Generation]) -> None:
        """One decode for every active sequence that has its next token, with the next chunk of the prompts
        being read (``PromptRates.budget``), then one sampled token each.

        A sequence whose job has ended is answered ``cancelled`` before the decode; a decode reading a long prompt
        whose every sequence's job ends while it runs ends there (``AbortWatch``, ``_aborted``); one whose grammar
        fails (``ConstraintError``) or sees its job end mid-token (``Abandoned``) ends alone, never the batch.
        A sequence whose listener is not ready for its token (``Pending.ready``: a job thread late to judge
        the last one) keeps it and sits the decode out, so a late job never holds the others' step; so does
        a constrained sequence whose grammar has not chosen its token within ``MASK_WAIT_S``. The worker
        waits for a listener or a grammar only when no sequence can decode.
        """
        for seq in [seq for seq in active if seq.pending.abandoned()]:
            active.remove(seq)
            self._finish(seq, FINISH_CANCELLED, "", time.perf_counter())
        self._machine.fit(active)
        for seq in [seq for seq in active if seq.choosing is not None and seq.choosing.done()]:
            self._chosen(seq, active)
        self._deliver_held(active)
        self._cache.take_copies(active)
        running = [seq for seq in active if not seq.reading]
        decoding = [seq for seq in running if seq.held is None and seq.choosing is None]
        reading = [seq for seq in active if seq.reading and seq.copy_from is None]
        chunks = share(reading, self._prompt_budget(running, reading)) if reading else {}
        if not decoding and not chunks:
            choosing = [seq.choosing for seq in active if seq.choosing is not None]
            if choosing:  # every sequence waits for a grammar, or for a listener: look again soon
                concurrent.futures.wait(choosing, timeout=MASK_POLL_S, return_when=concurrent.futures.FIRST_COMPLETED)
            return
        rows = self._fill_batch(decoding, chunks)
        prompt_tokens = sum(len(chunk) for chunk in chunks.values())
        watch = self._abort_watch if prompt_tokens >= ABORT_WATCH_TOKENS else None
        started = time.perf_counter()
        if watch is not None:
            watch.start([seq.pending.abandoned for seq in (*decoding, *chunks)])
        try:
            self._decode()
        except Aborted:
            self._aborted([*decoding, *chunks], active)
            return
        finally:
            if watch is not None:
                watch.stop()
        self._rates.measured(time.perf_counter() - started, len(decoding), prompt_tokens, len(running), len(chunks))
        for seq, chunk in chunks.items():
            seq.slot.tokens.extend(chunk)
        for seq in decoding:
            i = rows[id(seq)]
            seq.batch = max(seq.batch, len(decoding))
            seq.slot.tokens.append(seq.next_token)
            logits = np.ctypeslib.as_array(self._lc.llama_get_logits_ith(self._ctx.ctx, i), shape=(self.n_vocab,))
            sampler = seq.sampler
            if isinstance(sampler, GrammarSampler):  # chosen on a mask thread, from a copy of its logits
                seq.logits = logits.copy()
                seq.choosing = self._mask_pool().submit(sampler.sample_logits, seq.logits)
            else:
                assert sampler is not None, "a decoding sequence holds its sampler until it is released"
                self._sampled(seq, active, lambda: sampler.sample(self._ctx, i), logits)
        choosing = [seq.choosing for seq in decoding if seq.choosing is not None]
        if choosing:
            concurrent.futures.wait(choosing, timeout=MASK_WAIT_S)
            for seq in [seq for seq in decoding if seq.choosing is not None and seq.choosing.done()]:
                self._chosen(seq, active)

    def _aborted(self, batch: list[Generation], active: list[Generation]) -> None:
        """Llama.cpp ended a decode part-way because every sequence in it had been abandoned (``AbortWatch``):
        each is answered ``cancelled``, its slot's KV cut back to the tokens it held before the decode (llama.cpp
        drops what the micro-batch it stopped in wrote, not what those before it did), so the slot's cache of the
        prompt read so far stays good for a request that shares it."""
        self.aborted_decodes += 1
        now = time.perf_counter()
        for seq in batch:
            self._cache.cut_back(seq.slot)
            active.remove(seq)
            self._finish(seq, FINISH_CANCELLED, "", now)

    def _fill_batch(self, decoding: list[Generation], chunks: dict[Generation, list[int]]) -> dict[int, int]:
        """Lay out one decode in the engine's batch (``llama_batch.fill_batch``); the batch row of each decoding
        sequence's token, by ``id``."""
        return fill_batch(self._batch.batch, decoding, chunks)

    def _mask_pool(self) -> ThreadPoolExecutor:
        if self._mask_threads is None:
            self._mask_threads = ThreadPoolExecutor(self.n_slots, thread_name_prefix="tensorjob-grammar-mask")
        return self._mask_threads

    def _chosen(self, seq: Generation, active: list[Generation]) -> None:
        """Take the token a sequence's grammar has chosen on a mask thread."""
        future, seq.choosing = seq.choosing, None
        logits, seq.logits = seq.logits, None
        assert future is not None and logits is not None, "called for a sequence its grammar chose for"
        self._sampled(seq, active, future.result, logits)

    def _sampled(self, seq: Generation, active: list[Generation], sample: Callable[[], int],
                 logits: np.ndarray) -> None:
        """Take the token ``sample()`` gives ``seq`` (chosen from ``logits``): to its listener, or held."""
        try:
            token = sample()
            self._note_logprob(seq, logits, token)
        except Abandoned:
            active.remove(seq)
            self._finish(seq, FINISH_CANCELLED, "", time.perf_counter())
            return
        except ConstraintError as e:  # mid-answer: what it had spent is counted all the same
            active.remove(seq)
            e.usage = GenerateUsage(prompt_tokens=seq.prompt_tokens, completion_tokens=seq.n_out,
                                    cached_tokens=seq.cached_tokens)
            self._release(seq)
            seq.pending.done(None, e)
            return
        if not seq.pending.ready(0.0):
            seq.held = token
        elif self._accept(seq, token):
            active.remove(seq)  # answered: never answered twice if a later one fails

    def _deliver_held(self, active: list[Generation]) -> None:
        """Hand each held token to its listener once it is ready. Waits only while every sequence holds one
        (nothing to decode): a listener's ``ready`` bounds its own wait (the lookahead credit runs free)."""
        while True:
            held = [(seq, seq.held) for seq in active if seq.held is not None]
            if not held:
                return
            for seq, token in held:
                if seq.pending.ready(0.0):
                    seq.held = None
                    if self._accept(seq, token):
                        active.remove(seq)
            if any(seq.held is None for seq in active) or not active:
                return
            waiting = [seq for seq in active if seq.held is not None]
            if waiting[0].pending.ready(HELD_WAIT_S if len(waiting) == 1 else HELD_POLL_S):
                continue  # delivered on the next pass
            for seq in [seq for seq in waiting if seq.pending.abandoned()]:
                active.remove(seq)
                self._finish(seq, FINISH_CANCELLED, "", time.perf_counter())

    def _note_logprob(self, seq: Generation, logits: np.ndarray, token: int) -> None:
        """The record of ``token``, just sampled from ``logits``: its logprob under the distribution it
        was drawn from (``logprobs.token_logprob``: the row holds the repeat penalty already, the sampler
        applied it in place; the grammar's mask is the one it chose under). Kept until its text is delivered."""
        request = seq.pending.request
        if not request.logprobs:
            return
        seq.logprobs.append(token_logprob(
            logits, token, self.piece, temperature=float(request.sampler.temperature),
            allowed=getattr(seq.sampler, "allowed", None), top=request.top_logprobs))

    def _accept(self, seq: Generation, token: int) -> bool:
        """Handle one sampled token; True when the sequence has finished."""
        now = time.perf_counter()
        if seq.first_at is None:
            seq.first_at = now
        if self.is_eog(token):
            del seq.logprobs[-1:]  # the end token writes no text
            return self._finish(seq, FINISH_STOP, seq.stream.flush(), now)
        seq.n_out += 1
        seq.last_at = now
        text, stopped = seq.stream.push(self.piece(token))
        if stopped:
            return self._finish(seq, FINISH_STOP, text, now)
        if text and not self._deliver(seq, text):
            return self._finish(seq, FINISH_CANCELLED, "", now)
        if seq.n_out >= seq.limit:
            return self._finish(seq, FINISH_LENGTH, seq.stream.flush(), now)
        seq.next_token = token
        return False

    def _deliver(self, seq: Generation, text: str) -> bool:
        seq.parts.append(text)
        if seq.logprobs:  # the text carries the records of the tokens pushed since the last delivery
            records, seq.logprobs = seq.logprobs, []
            seq.delivered_logprobs.extend(records)
            text = TokenText(text, records)
        try:
            return bool(seq.pending.on_token(text))
        except BaseException:  # noqa: BLE001 - a dead listener means stop
            return False

    def _finish(self, seq: Generation, reason: str, tail: str, now: float) -> bool:
        if tail:
            self._deliver(seq, tail)
        n = seq.n_out
        if reason != FINISH_CANCELLED:
            self._rates.answered(n)  # what an answer here makes: how soon the running ones are expected to end
        tps = None
        if n > 1 and seq.first_at is not None and seq.last_at and seq.last_at > seq.first_at:
            tps = (n - 1) / (seq.last_at - seq.first_at)
            self._machine.learn(seq, tps)
        usage = GenerateUsage(prompt_tokens=seq.prompt_tokens, completion_tokens=n,
                              cached_tokens=seq.cached_tokens,
                              time_to_first_token_s=(seq.first_at - seq.started) if seq.first_at else None,
                              tokens_per_second=tps, batch=seq.batch, threads=self._machine.threads_now,
                              own_threads=self.n_threads if not seq.pending.request.alone else None,
                              quiet_tokens_per_second=self._machine.quiet_rate(seq.batch))
        self._release(seq)
        logprobs = seq.delivered_logprobs if seq.pending.request.logprobs else None
        seq.pending.done(GenerateResult("".join(seq.parts), reason, usage, logprobs), None)
        return True

    def _release(self, seq: Generation) -> None:
        self._cache.release(seq.slot)
        sampler, seq.sampler = seq.sampler, None
        if sampler is None:
            return
        if seq.choosing is not None:  # its grammar is still choosing on a mask thread: closed once it has
            seq.choosing.add_done_callback(lambda _: sampler.close())
            seq.choosing = None
        else:
            sampler.close()

    # -- embeddings ----------------------------------------------------------------------------

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One L2-normalised, mean-pooled vector per text, in input order (``embedding`` run to its end)."""
        embedding = self.embedding(texts)
        while not embedding.step():
            pass
        return embedding.vectors

    def embedding(self, texts: Sequence[str]) -> Embedding:
        """An embed to be decoded a piece at a time (``Embedding.step``), so that the worker can serve
        generation requests between its pieces and notice a client that left (``llama_embed``)."""
        return self._embedder.embedding(texts, self._text)


__all__ = [
    "PENALTY_LAST_N", "EMBED_SEQS", "EMBED_PIECE_TOKENS", "EMBED_MAX_TOKENS", "ADMIT_WINDOW_S", "HELD_WAIT_S",
    "HELD_POLL_S", "PREFIX_COPY_MIN_TOKENS", "PREFIX_LOOKAHEAD", "PREFIX_PASS_LIMIT", "PROMPT_STEP_RATIO",
    "PROMPT_STEP_RATIO_MAX", "PROMPT_CHUNK_SHARE", "PROMPT_MIN_TOKENS", "LONE_MIN_TOKENS", "RATE_WEIGHT",
    "ABORT_WATCH_TOKENS", "ABORT_POLL_S", "QUIET_OTHERS_CPUS", "LoraKey", "LlamaEngine", "Embedding"
]

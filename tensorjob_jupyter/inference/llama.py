"""The llama.cpp engine: a GGUF model served through llama-cpp-python.

``LlamaEngine`` implements the ``Engine`` protocol on llama-cpp-python's low-level API rather than
on ``Llama.create_completion``, because the high-level loop cannot give the host what it needs: a
stop verdict that reaches the decoder, a cancel that ends even a decode in progress, whole characters only, a prefix cache per slot keyed by the
LoRA selection (a busy slot's prefix copied rather than decoded again, queued requests started
longest-prefix-first), runtime LoRA, continuous batching (a starting prompt read in chunks within the
running sequences' decode steps), grammar masks
off the decode thread, and embeddings on a second context. Each slot has a KV stream of its own and
the last prompt token is decoded in a decode step, so a repeated prompt gives exactly what a cold run
gives. It is one class on purpose: the decode loop, the slots, the samplers and the embedding context
share one llama.cpp context's state, which only it touches.

Design: docs/internals/inference.md#llamapy
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import logging
import math
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

import numpy as np

from tensorjob_jupyter.inference.base import (
    FINISH_CANCELLED, FINISH_LENGTH, FINISH_STOP, ConstraintError, GenerateRequest, GenerateResult,
    GenerateUsage, LoraChoice, ModelError, Pending, RequestTooLarge, TokenCallback,
)
from tensorjob_jupyter.inference.gguf import check_gguf
from tensorjob_jupyter.inference.grammar import Abandoned, GrammarSampler, ModelGrammars
from tensorjob_jupyter.inference.library import CaptureLog, abort_switch, llama_cpp_library, log_reason
from tensorjob_jupyter.inference.logprobs import TokenLogprob, TokenText, token_logprob
from tensorjob_jupyter.inference.greedy import GreedySampler
from tensorjob_jupyter.inference.penalties import PENALTY_LAST_N, PenalisedChain, RepeatPenalty
from tensorjob_jupyter.inference.text_stream import TextStream
from tensorjob_jupyter.inference.topology import (
    CpuShare, default_threads, fitting_threads, gpu_offload_supported, logical_cpus,
)

if TYPE_CHECKING:  # llama-cpp-python is imported when an engine is made (library.llama_cpp_library)
    from llama_cpp._internals import LlamaSampler
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter
    from llama_cpp.llama_types import ChatCompletionRequestMessage

log = logging.getLogger("tensorjob_jupyter.llama")
log.addHandler(logging.NullHandler())

#: Texts one embedding decode may hold.
EMBED_SEQS = 64
#: Tokens one embedding decode takes at most (causal models): the longest the worker is held by an embed
#: before it serves waiting generation requests (64 tokens take about half a second on one core of this
#: project's test machine with the embedded model; a piece of 128 was twice the wait and embedded no faster).
EMBED_PIECE_TOKENS = 64
#: Tokens one embed request may hold in all (after each text is cut to the embedding context).
EMBED_MAX_TOKENS = 32_768
#: Before a batch's first decode step, once a second request has come with the first, how long to wait
#: for another: requests sent together (jobs started at once) arrive a few milliseconds apart, and one
#: that misses the first steps costs the batch as many extra steps at its end. Waited again after each
#: arrival; never for a lone request, never once decoding.
ADMIT_WINDOW_S = 0.005
#: While every sequence waits for its listener: how long to wait on the one (a listener bounds its own
#: wait), or on each in turn when several wait.
HELD_WAIT_S = 1.0
HELD_POLL_S = 0.001
#: The fewest prompt tokens a copy of another slot's KV must save over the request's own slot: a copy
#: across KV streams moves the whole stream buffer, which costs about what decoding a token or two does.
PREFIX_COPY_MIN_TOKENS = 32
#: Requests a batch takes off the worker's queue to choose from while a slot is free: the next to start is the one
#: sharing the longest prefix with what the slots hold or are reading (``_prefix_first``).
PREFIX_LOOKAHEAD = 32
#: How many times a waiting request may be passed over for one sharing a longer prefix before it starts next.
PREFIX_PASS_LIMIT = 8
#: While other sequences decode, a step that also reads prompt tokens costs about this many times a step of theirs
#: alone: the prompt tokens a step takes are fitted to the rates the engine has measured (``_prompt_budget``).
PROMPT_STEP_RATIO = 2.0
#: A prompt chunk read beside running sequences is computed in a micro-batch of its own (llama.cpp cuts a batch over
#: separate KV streams into equal parts), at a fixed cost besides its tokens. Where the ratio leaves a chunk so small
#: that the fixed part is more than ``1 - PROMPT_CHUNK_SHARE`` of it (a quiet CPU: the micro-batch's pass over the
#: weights is most of a step of one sequence), it grows, up to a step of this many times theirs.
PROMPT_STEP_RATIO_MAX = 3.0
#: The least share of a chunk's cost its tokens are to have, where ``PROMPT_STEP_RATIO_MAX`` leaves room for it.
PROMPT_CHUNK_SHARE = 0.5
#: The fewest prompt tokens a step takes for each prompt it reads while others run, however slow the measured rates
#: make them: on a 2-core CPU under load a prompt token costs nearly what a step of one sequence does (on one thread,
#: a step of one sequence took 21 ms; with a chunk of 2 prompt tokens beside it 63 ms, with 8 tokens 172 ms).
PROMPT_MIN_TOKENS = 1
#: The fewest tokens of a prompt read with nothing else running that measure what a prompt token costs read alone
#: (the fixed part of its micro-batch a small share of it).
LONE_MIN_TOKENS = 32
#: How much of each new measurement the rates take (an exponential average: one slow step moves them little).
RATE_WEIGHT = 0.2
#: A decode that reads at least this many prompt tokens is watched while it runs: once every sequence in it has been
#: abandoned, it ends between two of llama.cpp's graph nodes instead of at its end (``_AbortWatch``).
ABORT_WATCH_TOKENS = 64
#: How often the watch looks at the jobs of the decode it watches.
ABORT_POLL_S = 0.005
#: After a decode step, how long the step waits for the constrained sequences' choices (each on a mask thread;
#: a mask costs microseconds to a few milliseconds): one not made by then sits the decode out until it is.
MASK_WAIT_S = 0.02
#: While no sequence can decode for want of its choice: how often to look at the jobs (one may have ended).
MASK_POLL_S = 0.05
#: How often an engine given no thread count looks at what the rest of the machine uses of its CPUs; its
#: generation threads change when two windows in a row say the same (``_fit_threads``).
THREADS_CHECK_S = 2.0
#: Over one of those windows, the machine is quiet while other work keeps fewer of its CPUs busy than this: a
#: sequence that saw only quiet windows gives the model's quiet rate for its batch size (``quiet_tokens_per_second``).
QUIET_OTHERS_CPUS = 0.25

# -- the engine ---------------------------------------------------------------------------------

LoraKey = tuple[tuple[str, float], ...]


@dataclass
class _Slot:
    """One llama.cpp sequence: the tokens whose KV it holds, and under which LoRA."""

    seq_id: int
    tokens: list[int] = field(default_factory=list)  # whose KV it holds now
    prompt: list[int] = field(default_factory=list)  # while busy: the prompt it reads (its KV, but for the last token)
    lora: LoraKey = ()
    last_used: float = 0.0
    busy: bool = False


@dataclass(eq=False)  # each is itself: compared and hashed by identity
class _Sequence:
    """One generation in progress."""

    pending: Pending
    slot: _Slot
    sampler: LlamaSampler | PenalisedChain | GreedySampler | GrammarSampler | None  # None once released
    stream: TextStream
    prompt_tokens: int
    cached_tokens: int
    limit: int  # completion tokens allowed (max_tokens, or what the context leaves)
    started: float
    parts: list[str] = field(default_factory=list)
    n_out: int = 0
    next_token: int = -1
    held: int | None = None  # a sampled token its listener was not ready for: delivered before it decodes again
    first_at: float | None = None
    last_at: float | None = None
    batch: int = 1  # the most sequences decoded in one step with this one (itself included)
    logprobs: list[TokenLogprob] = field(default_factory=list)  # records of tokens sampled, not yet delivered
    delivered_logprobs: list[TokenLogprob] = field(default_factory=list)
    choosing: Future | None = None  # its grammar's choice of the next token, on a mask thread
    windows: int = 0  # the machine's windows (``_fit_threads``) that ended while it ran, and how many were busy
    busy_windows: int = 0
    logits: np.ndarray | None = None  # the copy of its logits that choice is made from
    prompt: list[int] = field(default_factory=list)  # all of its prompt's tokens
    copy_from: _Sequence | None = None  # a busy one whose KV of the first ``copy_len`` prompt tokens it waits to copy
    copy_len: int = 0

    @property
    def reading(self) -> bool:
        """Whether its prompt is still being read (its KV short of all but the last prompt token)."""
        return self.copy_from is not None or len(self.slot.tokens) < len(self.prompt) - 1


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
        self._embedding_n_ctx = embedding_n_ctx
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
            self._slots = [_Slot(i) for i in range(self.n_slots)]
            #: KV copies from one slot to another (a shared prefix decoded once), since creation.
            self.prefix_copies = 0
            self.prefix_order = prefix_order
            #: seconds a decode step takes by how many sequences it decodes; what a prompt's chunk read beside running
            #: sequences adds to it, and its tokens; what a prompt token costs read alone (measured, ``_measured``)
            self._step_s: dict[int, float] = {}
            self._chunk_s: float | None = None
            self._chunk_tokens: float | None = None
            self._last_chunk = 0
            self._lone_token_s: float | None = None
            #: decodes ended part-way because every sequence in them was abandoned, since creation
            self.aborted_decodes = 0
            switch = abort_switch(llama_cpp)
            self._abort_watch: _AbortWatch | None = None
            if switch is not None:
                callback, byte = switch
                llama_cpp.llama_set_abort_callback(self._ctx.ctx, callback, ctypes.cast(byte, ctypes.c_void_p))
                self._abort_watch = _AbortWatch(callback, byte)
            self._threads_now = self.n_threads  # a request decoded alone may ask for others (``_use_threads``)
            #: the threads that fit the machine now (``_fit_threads``), and a verdict waiting for its second window
            self._fitted = self.n_threads
            self._next_fit: int | None = None
            self._cpu_share = (cpu_share or CpuShare(THREADS_CHECK_S)) if self.fits_threads else None
            #: tokens a second of a sequence by the most sequences it was decoded with, on a quiet machine
            self._quiet_rates: dict[int, float] = {}
            self._lora: LoraKey = ()
            self._adapters: dict[str, object] = {}
            for name, path in (loras or {}).items():
                self._load_lora(name, path)
            self._pieces: dict[int, bytes] = {}
            self._piece_buf = ctypes.create_string_buffer(256)
            self._eog_cache: dict[int, bool] = {}
            self._bos = self._model.token_bos()
            self._chat_template = self._model.metadata().get("tokenizer.chat_template")
            self._chat_formatter: Jinja2ChatFormatter | None = None
            self._embed_ctx = None
            self._embed_batch = None
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
        for obj in (self._embed_batch, self._embed_ctx, self._batch, self._ctx):
            if obj is not None:
                obj.close()
        self._model.close()

    def __repr__(self) -> str:
        return (f"<LlamaEngine {self.model_name} n_ctx={self.n_ctx} slots={self.n_slots} "
                f"gpu_layers={self.n_gpu_layers} threads={self.n_threads}>")

    # -- LoRA -------------------------------------------------------------------------------

    def _load_lora(self, name: str, path: str | os.PathLike) -> None:
        if not name:
            raise ModelError("a LoRA adapter needs a name")
        p = check_gguf(path)
        with CaptureLog() as lines:
            adapter = self._lc.llama_adapter_lora_init(self._model.model, str(p).encode("utf-8"))
        if not adapter:
            raise ModelError(f"could not load LoRA adapter {name!r} from {p}: "
                             f"{log_reason(lines) or 'llama.cpp refused it'}")
        self._adapters[name] = adapter

    @property
    def lora_names(self) -> list[str]:
        return sorted(self._adapters)

    def lora_key(self, choices: Sequence[LoraChoice]) -> LoraKey:
        """The normalised adapter selection; unknown names raise ``ModelError``."""
        key = []
        for choice in choices:
            if choice.name not in self._adapters:
                known = ", ".join(self.lora_names) or "none are configured"
                raise ModelError(f"unknown LoRA adapter {choice.name!r} (known: {known})")
            if choice.scale != 0.0:
                key.append((choice.name, float(choice.scale)))
        return tuple(key)

    def _set_lora(self, key: LoraKey) -> None:
        if key == self._lora:
            return
        lc = self._lc
        if key:
            adapters = (lc.llama_adapter_lora_p_ctypes * len(key))(*(self._adapters[n] for n, _ in key))
            scales = (ctypes.c_float * len(key))(*(s for _, s in key))
            rc = lc.llama_set_adapters_lora(self._ctx.ctx, adapters, len(key), scales)
        else:
            rc = lc.llama_set_adapters_lora(self._ctx.ctx, None, 0, None)
        if rc != 0:
            raise ModelError(f"llama.cpp could not set LoRA adapters {key!r} (code {rc})")
        self._lora = key

    # -- tokens -------------------------------------------------------------------------------

    def tokenize(self, text: str, *, special: bool = False, add_bos: bool = True) -> list[int]:
        return self._model.tokenize(text.encode("utf-8"), add_bos, special)

    def piece(self, token: int) -> bytes:
        """The raw bytes of one token (may be part of a character)."""
        data = self._pieces.get(token)
        if data is None:
            buf = self._piece_buf
            n = self._lc.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, False)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = self._lc.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, False)
            data = buf.raw[:n]
            self._pieces[token] = data
        return data

    def is_eog(self, token: int) -> bool:
        eog = self._eog_cache.get(token)
        if eog is None:
            eog = self._eog_cache[token] = bool(self._lc.llama_vocab_is_eog(self._vocab, token))
        return eog

    @property
    def has_chat_template(self) -> bool:
        """Whether the model names a chat template (instruct models do): ``chat=None`` then uses it."""
        return bool(self._chat_template)

    def chat_prompt(self, prompt: str, system: str | None = None) -> str:
        """``prompt`` as one user turn in the model's chat template (ChatML if it has none),
        after a system turn when ``system`` is given."""
        if self._chat_formatter is None:
            from llama_cpp.llama_chat_format import Jinja2ChatFormatter

            template = self._chat_template or _CHATML
            eos = self._model.token_eos()
            self._chat_formatter = Jinja2ChatFormatter(
                template=template, eos_token=self._model.token_get_text(eos) if eos >= 0 else "",
                bos_token=self._model.token_get_text(self._bos) if self._bos >= 0 else "")
        messages: list[ChatCompletionRequestMessage] = []
        if system is not None:
            messages.append({"role": "system", "content": system})
        messages.append({"role": "user", "content": prompt})
        return self._chat_formatter(messages=messages).prompt

    def _chat_tokens(self, prompt: str, system: str | None = None) -> list[int]:
        """The chat-formatted prompt; the template's markup may hold control tokens, the text may not.

        The template is rendered around placeholders; its parts are tokenized
        with special tokens recognised and the texts (the user's prompt, the
        system turn) without, so a prompt containing, say, ``<|im_end|>``
        cannot forge a turn. (A template that repeats or rewrites the texts
        is rendered whole instead.)
        """
        marker = "\ue000tensorjob-content\ue000"
        system_marker = "\ue000tensorjob-system\ue000"
        rendered = self.chat_prompt(marker, system_marker if system is not None else None)
        texts = [(marker, prompt)]
        if system is not None:
            texts.insert(0, (system_marker, system))
        if any(rendered.count(m) != 1 for m, _ in texts) or (
                system is not None and rendered.index(system_marker) > rendered.index(marker)):
            return self.tokenize(self.chat_prompt(prompt, system), special=True, add_bos=False)
        tokens: list[int] = []
        rest = rendered
        for m, text in texts:
            before, rest = rest.split(m)
            tokens += self.tokenize(before, special=True, add_bos=False)
            tokens += self.tokenize(text, special=False, add_bos=False)
        return tokens + self.tokenize(rest, special=True, add_bos=False)

    def uses_chat(self, request: GenerateRequest) -> bool:
        """Whether ``request`` is sent through the chat template (``chat=None``: when the model has one)."""
        return self.has_chat_template if request.chat is None else bool(request.chat)

    def prompt_tokens(self, request: GenerateRequest) -> list[int]:
        if self.uses_chat(request):
            tokens = self._chat_tokens(request.prompt, request.system)
        elif request.system is not None:
            tokens = self.tokenize(f"{request.system}\n\n{request.prompt}")
        else:
            tokens = self.tokenize(request.prompt)
        if not tokens:
            if self._bos < 0:
                raise ModelError("the prompt is empty and the model has no BOS token to start from")
            tokens = [self._bos]
        if len(tokens) >= self.n_ctx:
            raise ModelError(f"the prompt is {len(tokens)} tokens long; the context window holds "
                             f"{self.n_ctx} (n_ctx), including the reply")
        return tokens

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
        (``_prefix_first``: its KV is copied, not decoded again), else the
        earliest. Each request's ``done`` is called as soon as it finishes. A
        request whose LoRA selection differs from the running batch's waits
        until the batch drains, and none behind it starts before it.
        """
        active: list[_Sequence] = []
        waiting: list[Pending] = [first]
        passed: dict[int, int] = {}  # id of a waiting request -> times one behind it started first
        gather = True  # until the first decode step
        while True:
            while True:
                while admit is not None and len(active) < self.n_slots and len(waiting) < PREFIX_LOOKAHEAD:
                    item = admit()
                    if item is None:
                        break
                    waiting.append(item)
                self._start_waiting(waiting, active, passed)
                if not (gather and admit is not None and 1 < len(active) < self.n_slots and not waiting):
                    break
                item = admit(ADMIT_WINDOW_S)
                if item is None:
                    break
                waiting.append(item)
            gather = False
            if not active:
                if not waiting:
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

    def _start_waiting(self, waiting: list[Pending], active: list[_Sequence], passed: dict[int, int]) -> None:
        """Answer the waiting requests that need no slot (abandoned, nothing to generate) at once, then start the
        others while a slot is free, prefix-first (``_next_to_start``)."""
        needless = [w for w in waiting if w.abandoned() or w.request.max_tokens <= 0]
        if needless:
            for item in needless:
                self._try_start(item, active)
                passed.pop(id(item), None)
            gone = {id(item) for item in needless}
            waiting[:] = [w for w in waiting if id(w) not in gone]
        while waiting and len(active) < self.n_slots:
            k = self._next_to_start(waiting, active, passed)
            if not self._try_start(waiting[k], active):
                return
            for item in waiting[:k]:
                passed[id(item)] = passed.get(id(item), 0) + 1
            passed.pop(id(waiting.pop(k)), None)

    def _next_to_start(self, waiting: list[Pending], active: list[_Sequence], passed: dict[int, int]) -> int:
        """Which waiting request starts next: of the leading ones that may join the batch as it runs (the same
        LoRA selection, none decoded alone), the one whose prompt shares the longest prefix with a slot's KV, held
        or being read -- counted in steps of ``PREFIX_COPY_MIN_TOKENS``, the least a copy saves -- else the
        earliest (``_prefix_first``)."""
        if not self.prefix_order or len(waiting) == 1 or any(seq.pending.request.alone for seq in active):
            return 0
        scores: list[int] = []
        try:
            key = self.lora_key(waiting[0].request.lora) if not active else self._lora
            for item in waiting:
                request = item.request
                if request.alone or self.lora_key(request.lora) != key:
                    break
                if item.tokens is None:
                    item.tokens = self.prompt_tokens(request)
                scores.append(self._held_prefix(item.tokens, key) // PREFIX_COPY_MIN_TOKENS
                              if request.cache_prompt else 0)
        except Exception:  # noqa: BLE001 - a request that cannot be read is answered by _try_start, in its turn
            pass
        if len(scores) < 2:
            return 0
        return _prefix_first(scores, [passed.get(id(item), 0) for item in waiting[:len(scores)]])

    def _held_prefix(self, tokens: list[int], key: LoraKey) -> int:
        """The longest prefix of ``tokens`` a slot under LoRA selection ``key`` holds or, while busy, will hold."""
        held = [_will_hold(slot) if slot.busy else slot.tokens for slot in self._slots if slot.lora == key]
        return max((_common_prefix(h, tokens) for h in held if h), default=0)

    def _try_start(self, item: Pending, active: list[_Sequence]) -> bool:
        """Start ``item`` if it can join ``active`` now; False means it must wait.

        It must wait when every slot is busy or the batch runs another LoRA
        selection.

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
        if len(active) >= self.n_slots:
            return False
        if active and (request.alone or any(seq.pending.request.alone for seq in active)):
            return False  # a request decoded alone waits for the batch to drain, and holds the others back
        try:
            self._use_threads(request.threads if request.alone else None)
            key = self.lora_key(request.lora)
            if active and key != self._lora:
                return False
            if item.tokens is None:
                item.tokens = self.prompt_tokens(request)
            tokens = item.tokens
            room = self.n_ctx - len(tokens)
            limit = min(request.max_tokens, room)
            self._set_lora(key)
            slot, reuse, source = self._pick_slot(tokens, key, request.cache_prompt)
            sampler = self._sampler(request, tokens, item.abandoned)
            seq = _Sequence(item, slot, sampler, TextStream(request.sampler.stop), len(tokens), reuse,
                            limit, started, prompt=tokens)
            slot.busy, slot.prompt, slot.lora = True, tokens, key
            if source is None:
                self._keep_cached(seq, reuse)
            else:  # copied once the busy slot has read that far (``_take_copies``)
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

    def _pick_slot(self, tokens: list[int], key: LoraKey, use_cache: bool) -> tuple[_Slot, int, _Slot | None]:
        """The idle slot to run in, how many prompt tokens of KV it will start with, and the busy slot
        to copy them from (None: its own cache; see the module doc on a shared prefix)."""
        idle = [s for s in self._slots if not s.busy]
        best, best_len = None, 0
        if use_cache:
            for slot in idle:
                if slot.lora != key or not slot.tokens:
                    continue
                n = _common_prefix(slot.tokens, tokens)
                if n > best_len:
                    best, best_len = slot, n
        source, source_len = None, 0
        if use_cache:
            for slot in self._slots:
                if slot.busy and slot.lora == key:
                    n = _common_prefix(_will_hold(slot), tokens)
                    if n > source_len:
                        source, source_len = slot, n
        # at least one prompt token is always decoded, for fresh logits
        limit = len(tokens) - 1
        if source is not None and min(source_len, limit) >= min(best_len, limit) + PREFIX_COPY_MIN_TOKENS:
            # the copy replaces the whole of the slot's KV: take the idle slot whose own cache is worth least
            worth = {id(s): (_common_prefix(s.tokens, tokens) if s.lora == key else 0, bool(s.tokens), s.last_used)
                     for s in idle}
            return min(idle, key=lambda s: worth[id(s)]), min(source_len, limit), source
        if best is None:
            empty = [s for s in idle if not s.tokens]
            best = empty[0] if empty else min(idle, key=lambda s: s.last_used)
            best_len = 0
        return best, min(best_len, limit), None

    def _use_threads(self, threads: int | None) -> None:
        """Decode with ``threads`` threads from now on (None: the engine's own, as fitted to the machine)."""
        want = max(1, int(threads)) if threads else self._fitted
        if want != self._threads_now:
            batch = self.n_threads_batch if want == self.n_threads else want
            self._lc.llama_set_n_threads(self._ctx.ctx, want, batch)
            self._threads_now = want

    def _drop_slot(self, slot: _Slot) -> None:
        self._ctx.kv_cache_seq_rm(slot.seq_id, 0, -1)
        slot.tokens = []

    def _keep_cached(self, seq: _Sequence, reuse: int) -> None:
        """Start ``seq`` from the first ``reuse`` tokens its own slot's KV holds (all of it dropped if
        llama.cpp cannot cut the rest)."""
        slot = seq.slot
        if not self._ctx.kv_cache_seq_rm(slot.seq_id, reuse, -1):
            self._drop_slot(slot)
            reuse = 0
        slot.tokens = seq.prompt[:reuse]
        seq.cached_tokens = reuse

    def _take_copies(self, active: list[_Sequence]) -> None:
        """Copy into each waiting sequence's slot the prefix it shares with a busy slot, once that slot has read
        it. A source that ended or moved on before then leaves the sequence to its own slot's cache.

        Across KV streams only a whole stream can be copied; llama.cpp does it before the next decode, whichever
        sequences that decode is for, so the cells copied are the ones held now."""
        for seq in active:
            source = seq.copy_from
            if source is None:
                continue
            if _common_prefix(source.slot.tokens, seq.prompt) >= seq.copy_len:
                self._ctx.kv_cache_seq_cp(source.slot.seq_id, seq.slot.seq_id, -1, -1)
                self.prefix_copies += 1
                seq.copy_from = None
                self._keep_cached(seq, seq.copy_len)
            elif not source.reading or not any(other is source for other in active):
                seq.copy_from = None
                limit = len(seq.prompt) - 1
                self._keep_cached(seq, min(_common_prefix(seq.slot.tokens, seq.prompt), limit))

    def _prompt_budget(self, running: int, readers: int = 1) -> int:
        """The prompt tokens the next step may read, for ``readers`` prompts, while ``running`` sequences have read
        theirs: all the batch holds when none have; else what keeps a step within ``PROMPT_STEP_RATIO`` of their
        step alone -- whether they decode in it or sit it out (a late listener, a grammar still choosing: they wait
        for it all the same) -- and never fewer than ``PROMPT_MIN_TOKENS`` a prompt. Before anything is measured,
        the fewest.

        What a token costs is measured at the chunk sizes read, their micro-batch's fixed part included, so the sizes
        settle where a step costs the ratio (rounded, not floored: from small chunks, whose cost a token is mostly the
        fixed part, flooring would never let them grow). Where that leaves the fixed part more than ``1 -
        PROMPT_CHUNK_SHARE`` of a chunk -- told by a token's cost read alone -- chunks grow to the size where it is
        not, but never past a step of ``PROMPT_STEP_RATIO_MAX`` times theirs. A chunk is at most twice the last one
        measured, so that sizes grow a measured step at a time."""
        room = max(0, self.n_batch - running)
        if not running:
            return room
        least = min(room, readers * PROMPT_MIN_TOKENS)
        step = self._step_estimate(running)
        if step is None or self._chunk_s is None or not self._chunk_tokens:
            return least
        # a token beside running sequences costs no less than alone (a step timed under their average looks free)
        per_token = max(self._chunk_s / self._chunk_tokens, self._lone_token_s or 0.0, 1e-9)
        n = round((PROMPT_STEP_RATIO - 1.0) * step / per_token)
        if self._lone_token_s:
            fixed = max(0.0, self._chunk_s - self._chunk_tokens * self._lone_token_s)
            worth = readers * math.ceil(fixed / self._lone_token_s * PROMPT_CHUNK_SHARE / (1.0 - PROMPT_CHUNK_SHARE))
            n = max(n, min(worth, round((PROMPT_STEP_RATIO_MAX - 1.0) * step / per_token)))
        # at most twice the last chunk measured: one step timed short cannot make the next one long
        n = min(n, readers * max(PROMPT_MIN_TOKENS, 2 * self._last_chunk))
        return min(room, max(least, n))

    def _step_estimate(self, decoding: int) -> float | None:
        """Seconds a step of ``decoding`` sequences alone takes: measured, else the most the sizes measured say it
        takes at least (a step of more sequences costs more, and no more a sequence); None before any."""
        if decoding in self._step_s:
            return self._step_s[decoding]
        return max((s if d < decoding else s * decoding / d for d, s in self._step_s.items()), default=None)

    def _measured(self, seconds: float, decoding: int, prompt_tokens: int, running: int | None = None,
                  readers: int = 1) -> None:
        """Fold one step's time into the rates ``_prompt_budget`` fits the prompt tokens to: a step of ``decoding``
        sequences alone; what a prompt's chunk read while ``running`` sequences had read theirs (default: the
        decoding ones) added to it -- beyond the decoding ones' step, or all of it when they sat the step out -- and
        its size, for each of ``readers`` prompts (llama.cpp computes each prompt's chunk in a micro-batch of its own,
        apart from the next tokens of other KV streams); and what a prompt token costs read with none running, one
        prompt in a large chunk."""
        running = decoding if running is None else running
        if not prompt_tokens:
            if decoding:
                self._step_s[decoding] = _average(self._step_s.get(decoding), seconds)
            return
        if not running:
            if readers == 1 and prompt_tokens >= LONE_MIN_TOKENS:
                self._lone_token_s = _average(self._lone_token_s, seconds / prompt_tokens)
            return
        step = self._step_estimate(decoding) if decoding else 0.0
        if step is None or not readers:
            return
        self._chunk_s = _average(self._chunk_s, max(0.0, seconds - step) / readers)
        self._chunk_tokens = _average(self._chunk_tokens, prompt_tokens / readers)
        self._last_chunk = -(-prompt_tokens // readers)

    def _decode(self) -> None:
        rc = self._lc.llama_decode(self._ctx.ctx, self._batch.batch)
        if rc != 0:
            if rc == 2:
                raise _Aborted()
            if rc == 1:
                raise ModelError("the KV cache has no room for this batch (llama_decode returned 1)")
            raise ModelError(f"llama_decode failed with code {rc}")

    def _sampler(self, request: GenerateRequest, prompt: list[int], abandoned=None):
        """The request's sampler: llama.cpp's chain for its settings, behind the repeat penalty (``penalties``:
        applied to the window's logits alone, not by llama.cpp's sampler over the whole vocabulary) and, for a
        constraint, its grammar; greedy without a constraint, the row's argmax (``greedy``). Every kind samples
        and closes as the chain does."""
        s = request.sampler
        sampler = self._internals.LlamaSampler()
        if s.temperature <= 0.0:
            sampler.add_greedy()
        else:
            if s.top_k and s.top_k > 0:
                sampler.add_top_k(int(s.top_k))
            if 0.0 < s.top_p < 1.0:
                sampler.add_top_p(float(s.top_p), 1)
            if s.min_p and s.min_p > 0.0:
                sampler.add_min_p(float(s.min_p), 1)
            sampler.add_temp(float(s.temperature))
            sampler.add_dist(int(s.seed) & 0xFFFFFFFF)
        penalty = None
        if s.repeat_penalty and s.repeat_penalty != 1.0:  # the penalty window includes the prompt
            penalty = RepeatPenalty(float(s.repeat_penalty), prompt, PENALTY_LAST_N)
        if request.constraint is not None:
            try:
                return GrammarSampler(self, sampler, request.constraint, greedy=s.temperature <= 0.0,
                                      abandoned=abandoned, keep_mask=request.logprobs, penalty=penalty)
            except BaseException:
                sampler.close()
                raise
        if s.temperature <= 0.0:  # the row's first largest logit, without llama.cpp's candidate array
            sampler.close()
            return GreedySampler(penalty, self._logits_row)
        return sampler if penalty is None else PenalisedChain(sampler, penalty, self._logits_row)

    def _logits_row(self, ctx, i: int) -> np.ndarray:
        """Output ``i``'s logits in the context's own buffer (writable: the penalty changes a few in place)."""
        return np.ctypeslib.as_array(self._lc.llama_get_logits_ith(ctx.ctx, i), shape=(self.n_vocab,))

    def grammars(self) -> ModelGrammars:
        """This model's vocabulary as the grammar engine sees it, and its compiled grammars (built on the
        first constrained request)."""
        if self._grammars is None:
            self._grammars = ModelGrammars(self)
        return self._grammars

    def _step(self, active: list[_Sequence]) -> None:
        """One decode for every active sequence that has its next token, with the next chunk of the prompts
        being read (``_prompt_budget``), then one sampled token each.

        A sequence whose job has ended is answered ``cancelled`` before the decode; a decode reading a long prompt
        whose every sequence's job ends while it runs ends there (``_AbortWatch``, ``_aborted``); one whose grammar
        fails (``ConstraintError``) or sees its job end mid-token (``Abandoned``) ends alone, never the batch.
        A sequence whose listener is not ready for its token (``Pending.ready``: a job thread late to judge
        the last one) keeps it and sits the decode out, so a late job never holds the others' step; so does
        a constrained sequence whose grammar has not chosen its token within ``MASK_WAIT_S``. The worker
        waits for a listener or a grammar only when no sequence can decode.
        """
        for seq in [seq for seq in active if seq.pending.abandoned()]:
            active.remove(seq)
            self._finish(seq, FINISH_CANCELLED, "", time.perf_counter())
        self._fit_threads(active)
        for seq in [seq for seq in active if seq.choosing is not None and seq.choosing.done()]:
            self._chosen(seq, active)
        self._deliver_held(active)
        self._take_copies(active)
        running = [seq for seq in active if not seq.reading]
        decoding = [seq for seq in running if seq.held is None and seq.choosing is None]
        reading = [seq for seq in active if seq.reading and seq.copy_from is None]
        chunks = _share(reading, self._prompt_budget(len(running), len(reading))) if reading else {}
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
        except _Aborted:
            self._aborted([*decoding, *chunks], active)
            return
        finally:
            if watch is not None:
                watch.stop()
        self._measured(time.perf_counter() - started, len(decoding), prompt_tokens, len(running), len(chunks))
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

    def _aborted(self, batch: list[_Sequence], active: list[_Sequence]) -> None:
        """Llama.cpp ended a decode part-way because every sequence in it had been abandoned (``_AbortWatch``):
        each is answered ``cancelled``, its slot's KV cut back to the tokens it held before the decode (llama.cpp
        drops what the micro-batch it stopped in wrote, not what those before it did), so the slot's cache of the
        prompt read so far stays good for a request that shares it."""
        self.aborted_decodes += 1
        now = time.perf_counter()
        for seq in batch:
            if not self._ctx.kv_cache_seq_rm(seq.slot.seq_id, len(seq.slot.tokens), -1):
                self._drop_slot(seq.slot)
            active.remove(seq)
            self._finish(seq, FINISH_CANCELLED, "", now)

    def _fill_batch(self, decoding: list[_Sequence], chunks: dict[_Sequence, list[int]]) -> dict[int, int]:
        """Lay out one decode: each decoding sequence's next token (its logits kept) and each prompt chunk (no
        logits), in slot order; the batch row of each decoding sequence's token, by ``id``.

        In slot order because llama.cpp cuts a batch over separate KV streams into micro-batches of runs of
        consecutive sequence ids, each sequence giving as many tokens as the fewest of them: [1, 2, 3, 0] is two
        graph computes a step, [0, 1, 2, 3] one, and a prompt chunk goes with the next tokens as its first token
        and in a compute of its own for the rest."""
        batch = self._batch.batch
        rows: dict[int, int] = {}
        n = 0
        for seq in sorted([*decoding, *chunks], key=_by_slot):
            pos = len(seq.slot.tokens)
            tokens = chunks.get(seq) or [seq.next_token]
            for j, token in enumerate(tokens):
                batch.token[n] = token
                batch.pos[n] = pos + j
                batch.n_seq_id[n] = 1
                batch.seq_id[n][0] = seq.slot.seq_id
                batch.logits[n] = seq not in chunks
                n += 1
            if seq not in chunks:
                rows[id(seq)] = n - 1
        batch.n_tokens = n
        return rows

    def _fit_threads(self, active: list[_Sequence]) -> None:
        """Fit the generation threads to the CPUs the rest of the machine leaves free (an engine given no thread
        count; never while a request decoded alone runs with its own): when two windows of ``THREADS_CHECK_S`` in a
        row say the same other count, that is the count from the next step on. llama.cpp's threads meet every
        step, so a thread the machine cannot run holds the rest (topology.py)."""
        if self._cpu_share is None:
            return
        others = self._cpu_share.others()
        if others is None:
            return
        for seq in active:
            seq.windows += 1
            seq.busy_windows += others >= QUIET_OTHERS_CPUS
        if any(seq.pending.request.alone for seq in active):
            return
        cpus = logical_cpus()
        verdict = fitting_threads(self.n_threads, cpus, others)
        if verdict == self._fitted:
            self._next_fit = None
        elif verdict == self._next_fit:
            self._fitted, self._next_fit = verdict, None
            self._use_threads(None)
            log.info("tensorjob: other work uses %.1f of %d CPUs: decoding with %d threads", others, cpus, verdict)
        else:
            self._next_fit = verdict

    def _mask_pool(self) -> ThreadPoolExecutor:
        if self._mask_threads is None:
            self._mask_threads = ThreadPoolExecutor(self.n_slots, thread_name_prefix="tensorjob-grammar-mask")
        return self._mask_threads

    def _chosen(self, seq: _Sequence, active: list[_Sequence]) -> None:
        """Take the token a sequence's grammar has chosen on a mask thread."""
        future, seq.choosing = seq.choosing, None
        logits, seq.logits = seq.logits, None
        assert future is not None and logits is not None, "called for a sequence its grammar chose for"
        self._sampled(seq, active, future.result, logits)

    def _sampled(self, seq: _Sequence, active: list[_Sequence], sample: Callable[[], int],
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

    def _deliver_held(self, active: list[_Sequence]) -> None:
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

    def _note_logprob(self, seq: _Sequence, logits: np.ndarray, token: int) -> None:
        """The record of ``token``, just sampled from ``logits``: its logprob under the distribution it
        was drawn from (``logprobs.token_logprob``: the row holds the repeat penalty already, the sampler
        applied it in place; the grammar's mask is the one it chose under). Kept until its text is delivered."""
        request = seq.pending.request
        if not request.logprobs:
            return
        seq.logprobs.append(token_logprob(
            logits, token, self.piece, temperature=float(request.sampler.temperature),
            allowed=getattr(seq.sampler, "allowed", None), top=request.top_logprobs))

    def _accept(self, seq: _Sequence, token: int) -> bool:
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

    def _deliver(self, seq: _Sequence, text: str) -> bool:
        seq.parts.append(text)
        if seq.logprobs:  # the text carries the records of the tokens pushed since the last delivery
            records, seq.logprobs = seq.logprobs, []
            seq.delivered_logprobs.extend(records)
            text = TokenText(text, records)
        try:
            return bool(seq.pending.on_token(text))
        except BaseException:  # noqa: BLE001 - a dead listener means stop
            return False

    def _finish(self, seq: _Sequence, reason: str, tail: str, now: float) -> bool:
        if tail:
            self._deliver(seq, tail)
        n = seq.n_out
        tps = None
        if n > 1 and seq.first_at is not None and seq.last_at and seq.last_at > seq.first_at:
            tps = (n - 1) / (seq.last_at - seq.first_at)
            if seq.windows and not seq.busy_windows:
                self._quiet_rates[seq.batch] = _average(self._quiet_rates.get(seq.batch), tps)
        usage = GenerateUsage(prompt_tokens=seq.prompt_tokens, completion_tokens=n,
                              cached_tokens=seq.cached_tokens,
                              time_to_first_token_s=(seq.first_at - seq.started) if seq.first_at else None,
                              tokens_per_second=tps, batch=seq.batch, threads=self._threads_now,
                              own_threads=self.n_threads if not seq.pending.request.alone else None,
                              quiet_tokens_per_second=self._quiet_rates.get(seq.batch))
        self._release(seq)
        logprobs = seq.delivered_logprobs if seq.pending.request.logprobs else None
        seq.pending.done(GenerateResult("".join(seq.parts), reason, usage, logprobs), None)
        return True

    def _release(self, seq: _Sequence) -> None:
        seq.slot.busy = False
        seq.slot.last_used = time.monotonic()
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

    def embedding(self, texts: Sequence[str]) -> "Embedding":
        """An embed to be decoded a piece at a time (``Embedding.step``), so that the worker can serve
        generation requests between its pieces and notice a client that left.

        Texts longer than the embedding context are truncated to it; an empty text is embedded as the
        BOS token alone. ``RequestTooLarge`` if the texts come to more than ``EMBED_MAX_TOKENS``.
        """
        self._embedding_context()
        limit = self._embedding_n_ctx  # the model's training context at most
        seqs = []
        for text in texts:
            toks = self.tokenize(text)[:limit] if text else []
            if not toks:
                toks = [self._bos] if self._bos >= 0 else self.tokenize(" ")[:1]
            seqs.append(toks)
        total = sum(len(t) for t in seqs)
        if total > EMBED_MAX_TOKENS:
            raise RequestTooLarge(f"the texts to embed are {total} tokens, more than one request may embed "
                                  f"({EMBED_MAX_TOKENS}, EMBED_MAX_TOKENS); send fewer or shorter texts at a time")
        return Embedding(self, seqs)

    def _embedding_context(self):
        """The embedding context: per-token outputs (no pooling: ``Embedding`` pools them), a unified KV
        cache that holds one text at the longest plus a piece, and pieces of ``EMBED_PIECE_TOKENS`` --
        unless the model's attention is not causal (an encoder: a text's tokens see the ones after
        them), whose texts are decoded whole, a text or more a piece."""
        if self._embed_ctx is None:
            lc = self._lc
            n = self._embedding_n_ctx = min(self._embedding_n_ctx, self.n_ctx_train)
            self._embed_seqs = min(EMBED_SEQS, int(lc.llama_max_parallel_sequences()))
            ctx = self._new_embedding_context(min(EMBED_PIECE_TOKENS, n), n)
            self._embed_causal = bool(lc.llama_get_causal_attn(ctx.ctx))
            if not self._embed_causal:
                ctx.close()
                ctx = self._new_embedding_context(n, n)
            self._embed_piece = min(EMBED_PIECE_TOKENS, n) if self._embed_causal else n
            self._embed_batch = self._internals.LlamaBatch(n_tokens=self._embed_piece, embd=0, n_seq_max=1,
                                                           verbose=False)
            self._embed_ctx = ctx
        return self._embed_ctx, self._embed_batch

    def _new_embedding_context(self, piece: int, longest: int):
        lc = self._lc
        cp = lc.llama_context_default_params()
        cp.n_ctx = longest + piece
        cp.n_batch = piece
        cp.n_ubatch = piece
        cp.n_seq_max = self._embed_seqs
        cp.kv_unified = True
        cp.embeddings = True
        cp.pooling_type = lc.LLAMA_POOLING_TYPE_NONE
        cp.n_threads = self.n_threads
        cp.n_threads_batch = self.n_threads_batch
        cp.no_perf = True
        with CaptureLog() as lines:
            try:
                return self._internals.LlamaContext(model=self._model, params=cp, verbose=False)
            except Exception as e:  # noqa: BLE001
                raise ModelError(f"could not create an embedding context for {self.model_path}: "
                                 f"{log_reason(lines) or e}") from None


class _Aborted(Exception):
    """``llama_decode`` returned 2: the abort callback ended it (``_AbortWatch``)."""


class _AbortWatch:
    """Ends a long decode as soon as every sequence in it has been abandoned, not at its end: while one runs, a
    thread looks at their jobs every ``ABORT_POLL_S`` and then sets the byte that llama.cpp's abort callback reads
    between graph nodes (``library.abort_switch``: no Python, no GIL, in the decode). Decodes not watched run to
    their end: the byte is clear whenever no decode is watched."""

    def __init__(self, callback: object, byte: ctypes.Array) -> None:
        self._callback = callback  # kept alive as long as llama.cpp may call it
        self._byte = byte
        self._cond = threading.Condition()
        self._watched: list[Callable[[], bool]] | None = None
        self._closed = False
        self._thread: threading.Thread | None = None

    def start(self, abandoned: list[Callable[[], bool]]) -> None:
        """Watch the decode about to run, whose sequences' jobs have ended once each of ``abandoned`` says so (if
        they already have, it ends at its first node)."""
        with self._cond:
            if all(_ended(a) for a in abandoned):
                self._byte[0] = b"\x01"
                return
            self._byte[0] = b"\x00"
            self._watched = abandoned
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="tensorjob-decode-abort", daemon=True)
                self._thread.start()
            self._cond.notify()

    def stop(self) -> None:
        """The decode has returned: clear the byte for the decodes after it."""
        with self._cond:
            self._watched = None
            self._byte[0] = b"\x00"

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._watched = None
            self._cond.notify()

    def _run(self) -> None:
        with self._cond:
            while not self._closed:
                watched = self._watched
                if watched is None:
                    self._cond.wait()
                elif all(_ended(abandoned) for abandoned in watched):
                    self._byte[0] = b"\x01"
                    self._watched = None
                else:
                    self._cond.wait(ABORT_POLL_S)


def _ended(abandoned: Callable[[], bool]) -> bool:
    try:
        return bool(abandoned())
    except Exception:  # noqa: BLE001 - a request that cannot say is not ended here
        return False


class Embedding:
    """One embed request in pieces: each ``step()`` is one decode of at most the engine's piece of tokens,
    and says whether every vector is made (``vectors``).

    The texts are decoded in order. With causal attention a text may run over several pieces: its
    KV stays in the embedding context between them, each piece's per-token outputs are summed, and its
    vector is the mean of all of them -- what llama.cpp's mean pooling computes over one decode, here
    over as many as the text needs, so no decode is longer than a piece whatever the text. A text's
    cells are freed once it is done; each piece starts from what the one before left."""

    def __init__(self, engine: LlamaEngine, seqs: list[list[int]]):
        self._engine = engine
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
        engine = self._engine
        lc = engine._lc
        ctx, batch = engine._embedding_context()
        piece, causal, n_seqs = engine._embed_piece, engine._embed_causal, engine._embed_seqs
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
        rows = np.ctypeslib.as_array(ptr, shape=(b.n_tokens, engine._model.n_embd()))
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


def _by_slot(seq: _Sequence) -> int:
    return seq.slot.seq_id


def _will_hold(slot: _Slot) -> list[int]:
    """The tokens a busy slot's KV holds or, while its prompt is read, will hold: what a copy of it may share."""
    reading = slot.prompt[:-1]
    return slot.tokens if slot.tokens[:len(reading)] == reading else reading


def _share(reading: list[_Sequence], budget: int) -> dict[_Sequence, list[int]]:
    """The next chunk of each prompt being read, ``budget`` tokens in all shared out evenly (a prompt needing less
    than its share leaves the rest to the others): prompts read together are read in the same decodes."""
    needs = sorted(((len(seq.prompt) - 1 - len(seq.slot.tokens), seq) for seq in reading), key=lambda ns: ns[0])
    chunks: dict[_Sequence, list[int]] = {}
    for k, (need, seq) in enumerate(needs):
        take = min(need, budget // (len(needs) - k))
        if take > 0:
            start = len(seq.slot.tokens)
            chunks[seq] = seq.prompt[start:start + take]
            budget -= take
    return chunks


def _prefix_first(scores: Sequence[int], passed: Sequence[int]) -> int:
    """The index of the waiting request to start (in arrival order, with the prefix each shares with the slots and
    the times each was passed over): the highest score, the earliest among equals -- but the first once it has been
    passed over ``PREFIX_PASS_LIMIT`` times. One ahead of another has been passed over at least as often, so no
    request is passed over more than that (longest-prefix-first, as SGLang schedules, without its starvation)."""
    if passed[0] >= PREFIX_PASS_LIMIT:
        return 0
    return max(range(len(scores)), key=lambda i: (scores[i], -i))


def _average(old: float | None, new: float) -> float:
    return new if old is None else old + RATE_WEIGHT * (new - old)


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    x = np.asarray(a[:n], dtype=np.int64)
    y = np.asarray(b[:n], dtype=np.int64)
    diff = np.flatnonzero(x != y)
    return int(diff[0]) if diff.size else n


_CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content']"
           " + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}"
           "{{ '<|im_start|>assistant\n' }}{% endif %}")


__all__ = [
    "PENALTY_LAST_N", "EMBED_SEQS", "EMBED_PIECE_TOKENS", "EMBED_MAX_TOKENS", "ADMIT_WINDOW_S", "HELD_WAIT_S",
    "HELD_POLL_S", "PREFIX_COPY_MIN_TOKENS", "PREFIX_LOOKAHEAD", "PREFIX_PASS_LIMIT", "PROMPT_STEP_RATIO",
    "PROMPT_STEP_RATIO_MAX", "PROMPT_CHUNK_SHARE", "PROMPT_MIN_TOKENS", "LONE_MIN_TOKENS", "RATE_WEIGHT",
    "ABORT_WATCH_TOKENS", "ABORT_POLL_S", "QUIET_OTHERS_CPUS", "LoraKey", "LlamaEngine", "Embedding"
]

"""The llama.cpp engine: a GGUF model served through llama-cpp-python.

``LlamaEngine`` implements the ``Engine`` protocol on llama-cpp-python's
low-level API rather than on ``Llama.create_completion``, because the
high-level loop cannot give us what the host needs:

* **Stopping reaches the decoder.** Each sampled token goes to ``on_token``
  *before* it is decoded; a False return ends the sequence at once, so a stop
  verdict or a cancel costs at most the token already sampled.
* **Whole characters only.** Token bytes pass through a ``TextStream``
  (``text_stream.py``): ``on_token`` only ever sees complete, final text, and
  the result's text is exactly what was delivered.
* **A prefix cache keyed by what produced the KV.** The context holds a few
  *slots* (llama.cpp sequences, each with its own KV stream). Each slot remembers
  the tokens whose KV it holds and the LoRA selection they were computed
  under; a request reuses the longest common prefix of a slot with the same
  LoRA key, and reports it as ``cached_tokens``. Switching adapters never
  reuses KV computed under another selection.
* **Runtime LoRA.** Adapters named at creation are loaded once
  (``llama_adapter_lora_init``) and set per request with their scales
  (``llama_set_adapters_lora``); an unknown name is an error, never ignored.
* **Batching.** ``serve`` decodes every active sequence in one
  ``llama_decode`` per step and can admit new requests between steps
  (continuous batching); ``InferenceWorker`` feeds it from its queue.
  Sequences in one batch share a LoRA selection, since adapters are set on
  the whole context.

On determinism: llama.cpp's kernels are not bitwise invariant to batch shape
or to where a sequence sits in the KV cache (on this CPU build a batch of
more than ~32 tokens takes another matmul path, and a sequence placed after
another one's cells attends in other blocks; logits move by a few tenths).
So each slot has a KV stream of its own, and the last prompt token is always
decoded on its own: a repeated prompt gives exactly what a cold run gives,
from the cache or not, and decode steps of a few sequences together match a
lone sequence. A prompt that merely shares a prefix with an earlier one
reuses KV computed in another batch shape and can differ from a cold run at
a near tie. Across machines, builds (instruction sets, GPU) and thread
counts greedy text is *not* the same; nothing in the suite depends on it.

* **Constrained decoding.** A request's ``Constraint`` (a JSON Schema the
  host checked) becomes a GBNF grammar through llama-cpp-python's
  JSON-schema converter (``llama_grammar.SchemaConverter``), parsed by
  llama.cpp's grammar sampler before any token is generated (a grammar it
  refuses is a ``ConstraintError``). Checking the whole vocabulary against a
  grammar costs more than a token of this model, so each token is first
  sampled freely and only checked: the grammar sees the whole vocabulary
  only when the free choice is one it rejects (``_GrammarSampler``); greedy
  decoding gets the same token at a fraction of the cost.

Embeddings use a second context on the same model weights (``embeddings``
on, mean pooling), created on first use; vectors are L2-normalised.

llama.cpp's log lines are routed to the ``tensorjob_jupyter.llama`` logger
(silent unless configured) instead of stderr, and the error lines of a
failed load become part of the ``ModelError``.

**The one module that knows llama-cpp-python's internals.** The low-level
classes used here -- ``LlamaModel``, ``LlamaContext``, ``LlamaBatch`` and
``LlamaSampler`` -- live in the private module ``llama_cpp._internals``,
which can change in any release, and so can the ctypes bindings' signatures
(``llama_sampler_init_penalties`` has gained and lost ``n_vocab`` upstream).
No other module of the package imports ``llama_cpp``. This one is tested
on llama-cpp-python >=0.3.36,<0.3.37 (``TESTED_LLAMA_CPP``, pinned the same
in ``pyproject.toml``); on first use it checks that the installed version has
every class, method, parameter, function and context field used here
(``missing_llama_cpp_api``), and refuses with a ``ModelError`` that names
what is missing and the tested range rather than failing later, mid-job,
with an ``AttributeError``. A version outside the range that has everything
is used, with one logged warning.
"""

from __future__ import annotations

import collections
import ctypes
import functools
import importlib.metadata
import inspect
import itertools
import json
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np

from .base import (FINISH_CANCELLED, FINISH_LENGTH, FINISH_STOP, Constraint, ConstraintError, GenerateRequest,
                   GenerateResult, GenerateUsage, LoraChoice, ModelError, Pending, TokenCallback)
from .models import check_gguf
from .text_stream import TextStream
from .topology import default_threads, gpu_offload_supported

log = logging.getLogger("tensorjob_jupyter.llama")
log.addHandler(logging.NullHandler())

#: The llama-cpp-python versions this module is tested on, [low, high); pyproject.toml pins the same.
TESTED_LOW, TESTED_HIGH = (0, 3, 36), (0, 3, 37)
TESTED_LLAMA_CPP = f">={'.'.join(map(str, TESTED_LOW))},<{'.'.join(map(str, TESTED_HIGH))}"
PENALTY_LAST_N = 64
EMBED_SEQS = 64

# -- llama-cpp-python: what we use of it, import, logging, backend ---------------------------

#: ``llama_cpp._internals`` classes: the keyword arguments of their constructors, and the methods used.
INTERNALS_USED = {
    "LlamaModel": (("path_model", "params", "verbose"),
                   ("close", "n_ctx_train", "n_vocab", "n_embd", "token_bos", "token_eos", "token_get_text",
                    "metadata", "tokenize")),
    "LlamaContext": (("model", "params", "verbose"), ("close", "kv_cache_seq_rm", "kv_cache_clear")),
    "LlamaBatch": (("n_tokens", "embd", "n_seq_max", "verbose"), ("close", "reset", "add_sequence")),
    "LlamaSampler": ((), ("close", "add_penalties", "add_greedy", "add_top_k", "add_top_p", "add_min_p",
                          "add_temp", "add_dist", "accept", "sample")),
}
#: Parameters whose order we rely on when calling positionally.
SIGNATURES_USED = {("LlamaSampler", "add_penalties"): ("n_vocab", "penalty_last_n", "penalty_repeat",
                                                       "penalty_freq", "penalty_present")}
#: Functions and constants of the ``llama_cpp`` bindings.
LIBRARY_USED = ("llama_log_callback", "llama_log_set", "llama_backend_init", "llama_supports_gpu_offload",
                "llama_max_parallel_sequences", "llama_model_default_params", "llama_context_default_params",
                "llama_n_ctx_seq", "llama_adapter_lora_init", "llama_adapter_lora_p_ctypes",
                "llama_set_adapters_lora", "llama_token_to_piece", "llama_vocab_is_eog", "llama_decode",
                "llama_get_embeddings_seq", "LLAMA_POOLING_TYPE_MEAN", "llama_context_params",
                # constrained decoding (_GrammarSampler)
                "llama_sampler_init_grammar", "llama_sampler_apply", "llama_sampler_accept", "llama_sampler_free",
                "llama_get_logits_ith", "llama_token_data", "llama_token_data_array")
#: ``llama_cpp.llama_grammar``: the JSON-schema-to-GBNF converter, and the methods used.
GRAMMAR_USED = {"SchemaConverter": (("prop_order", "allow_fetch", "dotall", "raw_pattern"),
                                    ("resolve_refs", "visit", "format_grammar"))}
#: Fields of the ctypes structures the grammar sampler fills.
STRUCT_FIELDS_USED = {"llama_token_data": ("id", "logit", "p"),
                      "llama_token_data_array": ("data", "size", "selected", "sorted")}
#: Fields of ``llama_context_params`` that are set.
CONTEXT_FIELDS_USED = ("n_ctx", "n_batch", "n_ubatch", "n_threads", "n_threads_batch", "n_seq_max", "kv_unified",
                       "no_perf", "embeddings", "pooling_type")

_init_lock = threading.Lock()
_library = None
_capture = threading.local()
# ggml_log_level: NONE 0, DEBUG 1, INFO 2, WARN 3, ERROR 4, CONT 5 (continues the previous line)
_LEVELS = {1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR}
_log_callback = None  # keeps the ctypes callback alive


def missing_llama_cpp_api(llama_cpp, internals, grammar=None) -> list[str]:
    """What this module uses that the given ``llama_cpp``, ``llama_cpp._internals`` and
    ``llama_cpp.llama_grammar`` (when given) lack."""
    missing = []
    for cls_name, (kwargs, methods) in GRAMMAR_USED.items():
        if grammar is None:
            break
        cls = getattr(grammar, cls_name, None)
        if cls is None:
            missing.append(f"llama_grammar.{cls_name}")
            continue
        params = inspect.signature(cls.__init__).parameters
        missing += [f"llama_grammar.{cls_name}({kw}=...)" for kw in kwargs if kw not in params]
        missing += [f"llama_grammar.{cls_name}.{m}" for m in methods if not callable(getattr(cls, m, None))]
    for struct, names in STRUCT_FIELDS_USED.items():
        have = {f[0] for f in getattr(getattr(llama_cpp, struct, None), "_fields_", ())}
        if have:
            missing += [f"{struct}.{f}" for f in names if f not in have]
    for cls_name, (kwargs, methods) in INTERNALS_USED.items():
        cls = getattr(internals, cls_name, None)
        if cls is None:
            missing.append(f"_internals.{cls_name}")
            continue
        try:
            params = inspect.signature(cls.__init__).parameters
        except (TypeError, ValueError):
            params = {}
        missing += [f"_internals.{cls_name}({kw}=...)" for kw in kwargs if kw not in params]
        missing += [f"_internals.{cls_name}.{m}" for m in methods if not callable(getattr(cls, m, None))]
    for (cls_name, method), wanted in SIGNATURES_USED.items():
        fn = getattr(getattr(internals, cls_name, None), method, None)
        if fn is None:
            continue  # reported above
        got = tuple(p for p in inspect.signature(fn).parameters if p != "self")
        if got[:len(wanted)] != wanted:
            missing.append(f"_internals.{cls_name}.{method}({', '.join(wanted)}) (it takes ({', '.join(got)}))")
    missing += [f"llama_cpp.{name}" for name in LIBRARY_USED if not hasattr(llama_cpp, name)]
    fields = {f[0] for f in getattr(getattr(llama_cpp, "llama_context_params", None), "_fields_", ())}
    if fields:
        missing += [f"llama_context_params.{f}" for f in CONTEXT_FIELDS_USED if f not in fields]
    return missing


def _installed_version() -> str:
    try:
        return importlib.metadata.version("llama-cpp-python")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - a source checkout on sys.path
        import llama_cpp

        return getattr(llama_cpp, "__version__", "unknown")


def in_tested_range(version: str) -> bool:
    """Whether ``version`` (its leading numbers) is inside ``TESTED_LLAMA_CPP``."""
    numbers = []
    for part in version.split("."):
        digits = "".join(itertools.takewhile(str.isdigit, part))
        if not digits:
            break
        numbers.append(int(digits))
        if digits != part:
            break
    return TESTED_LOW <= tuple(numbers) < TESTED_HIGH


def llama_cpp_library():
    """``llama_cpp``, checked, its log routed to ``logging``, the backend initialised (once)."""
    global _library, _log_callback
    if _library is not None:
        return _library
    with _init_lock:
        if _library is not None:
            return _library
        try:
            import llama_cpp
            import llama_cpp.llama  # noqa: F401 - installs its own log hook first; ours replaces it
            from llama_cpp import _internals, llama_grammar
        except ImportError as e:  # pragma: no cover - depends on the install
            raise ModelError(f"llama-cpp-python is not installed or does not import ({e}); "
                             f"pip install 'llama-cpp-python{TESTED_LLAMA_CPP}'") from e
        version = _installed_version()
        missing = missing_llama_cpp_api(llama_cpp, _internals, llama_grammar)
        if missing:
            raise ModelError(f"llama-cpp-python {version} lacks what tensorjob-jupyter uses from it: "
                             f"{'; '.join(missing)}. tensorjob-jupyter is tested with llama-cpp-python "
                             f"{TESTED_LLAMA_CPP}: pip install 'llama-cpp-python{TESTED_LLAMA_CPP}'")
        if not in_tested_range(version):
            log.warning("llama-cpp-python %s is outside the tested range %s; it has every part used, "
                        "so it is used", version, TESTED_LLAMA_CPP)

        @llama_cpp.llama_log_callback
        def on_log(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
            try:
                message = text.decode("utf-8", "replace") if text else ""
                lines = getattr(_capture, "lines", None)
                if lines is not None and level in (3, 4):
                    lines.append(message.strip())
                log.log(_LEVELS.get(level, logging.DEBUG), "%s", message.rstrip("\n"))
            except Exception:  # noqa: BLE001 - never raise into C
                pass

        _log_callback = on_log
        llama_cpp.llama_log_set(on_log, ctypes.c_void_p(0))
        llama_cpp.llama_backend_init()
        _library = llama_cpp
    return _library


class _CaptureLog:
    """Collect llama.cpp's warning/error lines emitted on this thread."""

    def __enter__(self) -> list[str]:
        self.lines: list[str] = []
        _capture.lines = self.lines
        return self.lines

    def __exit__(self, *exc) -> None:
        _capture.lines = None


def _reason(lines: list[str]) -> str:
    useful = [ln for ln in lines if ln]
    return ("; ".join(useful[-3:]))[:600] if useful else ""


# -- the engine ---------------------------------------------------------------------------------

LoraKey = tuple[tuple[str, float], ...]


@dataclass
class _Slot:
    """One llama.cpp sequence: the tokens whose KV it holds, and under which LoRA."""

    seq_id: int
    tokens: list[int] = field(default_factory=list)
    lora: LoraKey = ()
    last_used: float = 0.0
    busy: bool = False


@dataclass
class _Sequence:
    """One generation in progress."""

    pending: Pending
    slot: _Slot
    sampler: object
    stream: TextStream
    prompt_tokens: int
    cached_tokens: int
    limit: int  # completion tokens allowed (max_tokens, or what the context leaves)
    started: float
    parts: list[str] = field(default_factory=list)
    n_out: int = 0
    next_token: int = -1
    first_at: float | None = None
    last_at: float | None = None


class LlamaEngine:
    """A GGUF model on llama.cpp. Use from one thread only (the worker's).

    ``n_ctx``: the context of each slot, prompt and reply (capped at the
    model's training context; the KV cache holds ``n_ctx * slots`` cells,
    about 23 KB each for SmolLM2-135M); ``n_batch``: prompt tokens per decode; ``n_threads`` /
    ``n_threads_batch``: default to the physical cores / the CPUs this process
    may use; ``n_gpu_layers``: default -1 (all) when the build can offload,
    else 0; ``slots``: cached sequences, and the most requests decoded
    together; ``loras``: adapter name -> GGUF path, selectable per request;
    ``embedding_n_ctx``: the longest text embedded (longer ones are cut).
    """

    def __init__(self, model_path: str | os.PathLike, *, n_ctx: int = 2048, n_batch: int = 512,
                 n_threads: int | None = None, n_threads_batch: int | None = None,
                 n_gpu_layers: int | None = None, slots: int = 4,
                 loras: Mapping[str, str | os.PathLike] | None = None,
                 embedding_n_ctx: int = 2048, model_name: str | None = None):
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
        self.n_threads = n_threads or threads
        self.n_threads_batch = n_threads_batch or threads_batch
        self.n_slots = max(1, min(int(slots), int(llama_cpp.llama_max_parallel_sequences())))
        self._embedding_n_ctx = embedding_n_ctx
        self._closed = False

        params = llama_cpp.llama_model_default_params()
        params.n_gpu_layers = 0x7FFFFFFF if self.n_gpu_layers < 0 else self.n_gpu_layers
        with _CaptureLog() as lines:
            try:
                self._model = _internals.LlamaModel(path_model=str(self.model_path), params=params,
                                                    verbose=False)
            except Exception as e:  # noqa: BLE001 - llama-cpp-python raises ValueError
                detail = _reason(lines) or str(e)
                raise ModelError(f"could not load model {self.model_path}: {detail}") from None
        try:
            self._vocab = self._model.vocab
            self.n_ctx_train = self._model.n_ctx_train()
            self.n_ctx = min(int(n_ctx), self.n_ctx_train) if n_ctx else self.n_ctx_train
            self.n_batch = max(1, min(int(n_batch), self.n_ctx))
            self.n_vocab = self._model.n_vocab()
            with _CaptureLog() as lines:
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
                                     f"{_reason(lines) or e}") from None
            self.n_ctx = int(llama_cpp.llama_n_ctx_seq(self._ctx.ctx))
            self._batch = _internals.LlamaBatch(n_tokens=max(self.n_batch, self.n_slots), embd=0,
                                                n_seq_max=1, verbose=False)
            self._slots = [_Slot(i) for i in range(self.n_slots)]
            self._lora: LoraKey = ()
            self._adapters: dict[str, object] = {}
            for name, path in (loras or {}).items():
                self._load_lora(name, path)
            self._pieces: dict[int, bytes] = {}
            self._piece_buf = ctypes.create_string_buffer(256)
            self._eog_cache: dict[int, bool] = {}
            self._bos = self._model.token_bos()
            self._chat_template = self._model.metadata().get("tokenizer.chat_template")
            self._chat_formatter = None
            self._embed_ctx = None
            self._embed_batch = None
            self._utf8: _Utf8Table | None = None
        except BaseException:
            self._model.close()
            raise

    # -- lifecycle ------------------------------------------------------------------------

    def close(self) -> None:
        """Free the contexts and the model (adapters go with the model)."""
        if self._closed:
            return
        self._closed = True
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
        with _CaptureLog() as lines:
            adapter = self._lc.llama_adapter_lora_init(self._model.model, str(p).encode("utf-8"))
        if not adapter:
            raise ModelError(f"could not load LoRA adapter {name!r} from {p}: "
                             f"{_reason(lines) or 'llama.cpp refused it'}")
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
        messages = [{"role": "system", "content": system}] if system is not None else []
        return self._chat_formatter(messages=messages + [{"role": "user", "content": prompt}]).prompt

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

    def serve(self, first: Pending, admit: Callable[[], Pending | None] | None = None) -> None:
        """Run ``first`` and whatever ``admit`` hands over meanwhile, batched, to completion.

        Between decode steps, while a slot is free, ``admit()`` is asked for
        another request (None: nothing now). Each request's ``done`` is called
        as soon as it finishes. A request whose LoRA selection differs from the
        running batch's waits until the batch drains; nothing is admitted past
        a waiting request, so order is kept.
        """
        active: list[_Sequence] = []
        waiting: collections.deque[Pending] = collections.deque([first])
        while True:
            while waiting:
                if not self._try_start(waiting[0], active):
                    break
                waiting.popleft()
            while admit is not None and not waiting and len(active) < self.n_slots:
                item = admit()
                if item is None:
                    break
                if not self._try_start(item, active):
                    waiting.append(item)
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
        if len(active) >= self.n_slots:
            return False
        try:
            key = self.lora_key(request.lora)
            if active and key != self._lora:
                return False
            if item.tokens is None:
                item.tokens = self.prompt_tokens(request)
            tokens = item.tokens
            room = self.n_ctx - len(tokens)
            limit = min(request.max_tokens, room)
            self._set_lora(key)
            slot, reuse = self._pick_slot(tokens, key, request.cache_prompt)
            sampler = self._sampler(request, tokens)
            seq = _Sequence(item, slot, sampler, TextStream(request.sampler.stop), len(tokens), reuse,
                            limit, started)
            slot.busy = True
            try:
                idx = self._prefill(slot, tokens, reuse, key)
                token = sampler.sample(self._ctx, idx)
            except BaseException:
                self._release(seq)
                self._drop_slot(slot)
                raise
        except BaseException as e:  # noqa: BLE001 - answered through the request
            item.done(None, e if isinstance(e, ModelError) else ModelError(f"{type(e).__name__}: {e}"))
            return True
        if not self._accept(seq, token):
            active.append(seq)
        return True

    def _pick_slot(self, tokens: list[int], key: LoraKey, use_cache: bool) -> tuple[_Slot, int]:
        """The idle slot to run in and how many prompt tokens its KV already holds."""
        idle = [s for s in self._slots if not s.busy]
        best, best_len = None, 0
        if use_cache:
            for slot in idle:
                if slot.lora != key or not slot.tokens:
                    continue
                n = _common_prefix(slot.tokens, tokens)
                if n > best_len:
                    best, best_len = slot, n
        if best is None:
            empty = [s for s in idle if not s.tokens]
            best = empty[0] if empty else min(idle, key=lambda s: s.last_used)
            best_len = 0
        # at least one prompt token is always decoded, for fresh logits
        return best, min(best_len, len(tokens) - 1)

    def _drop_slot(self, slot: _Slot) -> None:
        self._ctx.kv_cache_seq_rm(slot.seq_id, 0, -1)
        slot.tokens = []

    def _prefill(self, slot: _Slot, tokens: list[int], reuse: int, key: LoraKey) -> int:
        """Bring ``slot``'s KV to ``tokens``; returns the batch index of the last token's logits."""
        if not self._ctx.kv_cache_seq_rm(slot.seq_id, reuse, -1):
            self._drop_slot(slot)
            reuse = 0
        slot.tokens = tokens[:reuse]
        slot.lora = key
        todo = tokens[reuse:]
        # The last prompt token is always decoded on its own: llama.cpp's kernels
        # are not bitwise batch-size invariant, so this makes a repeated prompt
        # (served from the cache) give exactly what a cold run gives.
        body = todo[:-1]
        for start in range(0, len(body), self.n_batch):
            self._decode_run(slot, body[start:start + self.n_batch], want_logits=False)
        self._decode_run(slot, todo[-1:], want_logits=True)
        return 0

    def _decode_run(self, slot: _Slot, chunk: list[int], *, want_logits: bool) -> None:
        batch = self._batch.batch
        pos = len(slot.tokens)
        batch.n_tokens = len(chunk)
        for i, tok in enumerate(chunk):
            batch.token[i] = tok
            batch.pos[i] = pos + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = slot.seq_id
            batch.logits[i] = False
        batch.logits[len(chunk) - 1] = want_logits
        self._decode()
        slot.tokens.extend(chunk)

    def _decode(self) -> None:
        rc = self._lc.llama_decode(self._ctx.ctx, self._batch.batch)
        if rc != 0:
            if rc == 1:
                raise ModelError("the KV cache has no room for this batch (llama_decode returned 1)")
            raise ModelError(f"llama_decode failed with code {rc}")

    def _sampler(self, request: GenerateRequest, prompt: list[int]):
        s = request.sampler
        sampler = self._internals.LlamaSampler()
        if s.repeat_penalty and s.repeat_penalty != 1.0:
            # (n_vocab, last_n, repeat, freq, present): checked against this build's library
            sampler.add_penalties(self.n_vocab, PENALTY_LAST_N, float(s.repeat_penalty), 0.0, 0.0)
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
        if s.repeat_penalty and s.repeat_penalty != 1.0:
            for tok in prompt[-PENALTY_LAST_N:]:  # the penalty window includes the prompt
                sampler.accept(tok)
        if request.constraint is not None:
            try:
                return _GrammarSampler(self, sampler, request.constraint, greedy=s.temperature <= 0.0)
            except BaseException:
                sampler.close()
                raise
        return sampler

    def utf8_table(self) -> "_Utf8Table":
        """What each token's bytes do to UTF-8 text (computed once, on the first constrained request)."""
        if self._utf8 is None:
            self._utf8 = _Utf8Table([self.piece(t) for t in range(self.n_vocab)])
        return self._utf8

    def grammar(self, constraint: Constraint) -> str:
        """The GBNF grammar of a constraint (cached by its text); ``ConstraintError`` if it has none."""
        return constraint_grammar(constraint.schema, constraint.free_text)

    def _step(self, active: list[_Sequence]) -> None:
        """One decode for every active sequence, then one sampled token each."""
        batch = self._batch.batch
        batch.n_tokens = len(active)
        for i, seq in enumerate(active):
            batch.token[i] = seq.next_token
            batch.pos[i] = len(seq.slot.tokens)
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = seq.slot.seq_id
            batch.logits[i] = True
        self._decode()
        for i, seq in enumerate(list(active)):
            seq.slot.tokens.append(seq.next_token)
            if self._accept(seq, seq.sampler.sample(self._ctx, i)):
                active.remove(seq)  # answered: never answered twice if a later one fails

    def _accept(self, seq: _Sequence, token: int) -> bool:
        """Handle one sampled token; True when the sequence has finished."""
        now = time.perf_counter()
        if seq.first_at is None:
            seq.first_at = now
        if self.is_eog(token):
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
        usage = GenerateUsage(prompt_tokens=seq.prompt_tokens, completion_tokens=n,
                              cached_tokens=seq.cached_tokens,
                              time_to_first_token_s=(seq.first_at - seq.started) if seq.first_at else None,
                              tokens_per_second=tps)
        self._release(seq)
        seq.pending.done(GenerateResult("".join(seq.parts), reason, usage), None)
        return True

    def _release(self, seq: _Sequence) -> None:
        seq.slot.busy = False
        seq.slot.last_used = time.monotonic()
        sampler, seq.sampler = seq.sampler, None
        if sampler is not None:
            sampler.close()

    # -- embeddings ----------------------------------------------------------------------------

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One L2-normalised, mean-pooled vector per text, in input order.

        Texts longer than the embedding context are truncated to it; an empty
        text is embedded as the BOS token alone.
        """
        texts = list(texts)
        if not texts:
            return []
        ctx, batch = self._embedding_context()
        lc = self._lc
        limit = self._embedding_n_ctx
        seqs = []
        for text in texts:
            toks = self.tokenize(text)[:limit] if text else []
            if not toks:
                toks = [self._bos] if self._bos >= 0 else self.tokenize(" ")[:1]
            seqs.append(toks)
        n_embd = self._model.n_embd()
        out: list[list[float]] = []
        group: list[list[int]] = []

        def run() -> None:
            ctx.kv_cache_clear()
            batch.reset()
            for seq_id, toks in enumerate(group):
                batch.add_sequence(toks, seq_id, True)
            rc = lc.llama_decode(ctx.ctx, batch.batch)
            if rc != 0:
                raise ModelError(f"embedding failed: llama_decode returned {rc}")
            for seq_id in range(len(group)):
                ptr = lc.llama_get_embeddings_seq(ctx.ctx, seq_id)
                if not ptr:
                    raise ModelError("embedding failed: llama.cpp returned no pooled vector")
                vec = np.ctypeslib.as_array(ptr, shape=(n_embd,)).astype(np.float64)
                norm = float(np.linalg.norm(vec))
                out.append((vec / norm if norm > 0 else vec).tolist())
            group.clear()

        used = 0
        for toks in seqs:
            if group and (used + len(toks) > limit or len(group) >= self._embed_seqs):
                run()
                used = 0
            group.append(toks)
            used += len(toks)
        run()
        return out

    def _embedding_context(self):
        if self._embed_ctx is None:
            lc = self._lc
            cp = lc.llama_context_default_params()
            n = min(self._embedding_n_ctx, self.n_ctx_train)
            self._embedding_n_ctx = n
            cp.n_ctx = n
            cp.n_batch = n
            cp.n_ubatch = n
            self._embed_seqs = min(EMBED_SEQS, int(lc.llama_max_parallel_sequences()))
            cp.n_seq_max = self._embed_seqs
            cp.kv_unified = True
            cp.embeddings = True
            cp.pooling_type = lc.LLAMA_POOLING_TYPE_MEAN
            cp.n_threads = self.n_threads
            cp.n_threads_batch = self.n_threads_batch
            cp.no_perf = True
            with _CaptureLog() as lines:
                try:
                    ctx = self._internals.LlamaContext(model=self._model, params=cp, verbose=False)
                except Exception as e:  # noqa: BLE001
                    raise ModelError(f"could not create an embedding context for {self.model_path}: "
                                     f"{_reason(lines) or e}") from None
            self._embed_batch = self._internals.LlamaBatch(n_tokens=n, embd=0, n_seq_max=1, verbose=False)
            self._embed_ctx = ctx
        return self._embed_ctx, self._embed_batch


# -- constrained decoding ------------------------------------------------------------------------

#: Free text, for ``Constraint.free_text``: it may not begin with whitespace or ``{`` (a tool call does).
FREE_TEXT_RULES = ('tj-free-text ::= [^{ \\t\\r\\n] tj-any-char*\n'
                   'tj-any-char ::= [\\x01-\\U0010FFFF]')
#: A character of a JSON string: no quote, backslash or control character unless escaped.
JSON_CHAR_RULE = (r'char ::= [^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] '
                  r'[0-9a-fA-F])')
#: The largest grammar accepted: llama.cpp's parser and sampler work in time and memory that grow with it.
MAX_GRAMMAR_CHARS = 256 * 1024


@functools.lru_cache(maxsize=64)
def constraint_grammar(schema: str, free_text: bool = False) -> str:
    """The GBNF grammar for output matching the JSON Schema ``schema`` (JSON text), through
    llama-cpp-python's converter; with ``free_text``, or plain text instead. ``ConstraintError``
    names what the converter cannot handle."""
    llama_cpp_library()
    from llama_cpp.llama_grammar import SchemaConverter

    try:
        value = json.loads(schema)
        converter = SchemaConverter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
        value = converter.resolve_refs(value, "schema")
        top = converter.visit(value, "tj-output")
        rules = converter.format_grammar()
    except RecursionError:
        raise ConstraintError("the JSON schema is nested too deeply to turn into a grammar") from None
    except Exception as e:  # noqa: BLE001 - the converter asserts and raises all sorts
        detail = " ".join(str(e).split())[:300] or type(e).__name__
        raise ConstraintError(f"the JSON schema cannot be turned into a grammar: {detail}") from None
    # llama-cpp-python's converter lets a JSON string hold raw control characters, which JSON forbids
    # (llama.cpp's own converter does not): hold string characters to what JSON allows.
    rules = "\n".join(JSON_CHAR_RULE if line.startswith("char ::= ") else line for line in rules.split("\n"))
    root = f"root ::= {top} | tj-free-text\n{FREE_TEXT_RULES}" if free_text else f"root ::= {top}"
    grammar = f"{rules}\n{root}\n"
    if len(grammar) > MAX_GRAMMAR_CHARS:
        raise ConstraintError(f"the JSON schema makes a grammar of {len(grammar)} characters, over the "
                              f"{MAX_GRAMMAR_CHARS} this host accepts; simplify it (fewer alternatives, smaller "
                              f"maxItems and maxLength)")
    return grammar


#: The bytes a UTF-8 lead byte may be followed by first (the rest: 80-BF); others, 80-BF.
_SECOND_BYTE = {0xE0: (0xA0, 0xBF), 0xED: (0x80, 0x9F), 0xF0: (0x90, 0xBF), 0xF4: (0x80, 0x8F)}
_CONTINUATION = (0x80, 0xBF)
_COMPLETE = (0, 0, 0)  # no character in progress


class _Utf8Table:
    """Which tokens keep a byte stream valid UTF-8, whatever character is in progress.

    llama.cpp's grammar decodes UTF-8 leniently across tokens (a lead byte
    followed by an ASCII byte passes as one odd character), so text it
    accepts could still hold invalid UTF-8 -- which the text stream turns into
    U+FFFD and a JSON string's length or a pattern then no longer holds. The
    grammar sampler also masks every token that would break UTF-8. A state is
    ``(bytes still needed, lowest, highest allowed next byte)``; a mask per
    state is computed from per-token arrays on first use.
    """

    def __init__(self, pieces: list[bytes]):
        n = len(pieces)
        self.length = np.zeros(n, np.int32)
        self.first = np.zeros(n, np.int32)
        self.lead_cont = np.zeros(n, np.int32)  # leading continuation bytes
        self.rest_valid = np.zeros(n, bool)  # the bytes after them decode (maybe ending mid-character)
        self.tail: list[tuple[int, int, int]] = [_COMPLETE] * n  # the state a token leaves when it starts afresh
        import codecs

        decoder_class = codecs.getincrementaldecoder("utf-8")
        for t, data in enumerate(pieces):
            self.length[t] = len(data)
            self.first[t] = data[0] if data else -1
            k = 0
            while k < len(data) and 0x80 <= data[k] <= 0xBF:
                k += 1
            self.lead_cont[t] = k
            decoder = decoder_class("strict")
            try:
                decoder.decode(data[k:], final=False)
            except UnicodeDecodeError:
                continue
            self.rest_valid[t] = True
            pending = decoder.getstate()[0]
            if pending:
                lead = pending[0]
                size = 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
                low, high = _SECOND_BYTE.get(lead, _CONTINUATION) if len(pending) == 1 else _CONTINUATION
                self.tail[t] = (size - len(pending), low, high)
        self._masks: dict[tuple[int, int, int], np.ndarray] = {}

    def mask(self, state: tuple[int, int, int]) -> np.ndarray:
        """The tokens allowed in ``state`` (a boolean array over the vocabulary)."""
        m = self._masks.get(state)
        if m is None:
            need, low, high = state
            if need == 0:
                m = (self.lead_cont == 0) & self.rest_valid
            else:
                fits = (self.length >= 1) & (self.first >= low) & (self.first <= high)
                short = (self.length <= need) & (self.lead_cont == self.length)
                long = (self.length > need) & (self.lead_cont == need) & self.rest_valid
                m = fits & (short | long)
            self._masks[state] = m
        return m

    def allowed(self, state: tuple[int, int, int], token: int) -> bool:
        return bool(self.mask(state)[token])

    def after(self, state: tuple[int, int, int], token: int) -> tuple[int, int, int]:
        need = state[0]
        length = int(self.length[token])
        if need and length <= need:
            return (need - length, *_CONTINUATION) if need > length else _COMPLETE
        return self.tail[token]


#: With greedy decoding, how many of the likeliest tokens are checked one by one before the grammar
#: is applied to the whole vocabulary.
TOP_CANDIDATES = 32


class _GrammarSampler:
    """A request's sampler chain, with its output held to a grammar.

    llama.cpp's grammar sampler checks every candidate token against the
    grammar, about as long as a decode step of a small model. Most tokens of
    a structured answer are ones the grammar allows anyway, so each token is
    first chosen by the chain alone and then checked alone; only when the
    grammar rejects it is the choice made again over the whole vocabulary,
    grammar first (as llama.cpp's own ``common_sampler`` does). With greedy
    decoding the next few likeliest tokens are checked alone first, which
    nearly always finds the answer. Greedy decoding picks the same token
    either way: the best one the grammar allows. A token the grammar rejected is never accepted into it (that
    aborts in C++), and a grammar that allows no token at all is an error.

    With ``free_text`` the grammar binds only an output whose first token
    begins with ``{``; any other first token releases it.
    """

    #: Check the free choice first (False: always grammar first, as llama.cpp's own sampler does; for tests).
    check_first = True

    def __init__(self, engine: "LlamaEngine", chain, constraint: Constraint, greedy: bool = False):
        self._lc = lc = engine._lc
        self._engine = engine
        self._chain = chain
        self._chain_ptr = getattr(chain, "sampler", None)
        if self._chain_ptr is None:
            raise ModelError("llama-cpp-python's LlamaSampler has no `sampler` pointer; constrained decoding "
                             f"is tested with llama-cpp-python {TESTED_LLAMA_CPP}")
        self._free_text = constraint.free_text
        self._greedy = greedy
        self._first = True
        self.grammar_checks = 0  # tokens checked alone
        self.grammar_full = 0  # tokens chosen again over the whole vocabulary
        gbnf = engine.grammar(constraint)
        with _CaptureLog() as lines:
            ptr = lc.llama_sampler_init_grammar(engine._vocab, gbnf.encode("utf-8"), b"root")
        if not ptr:
            raise ConstraintError(f"llama.cpp refused the grammar made from the JSON schema: "
                                  f"{_reason(lines) or 'it does not parse'}")
        self._grammar = ptr
        self._utf8 = engine.utf8_table()
        self._utf8_state = _COMPLETE
        n = engine.n_vocab
        self._n = n
        self._ids = np.arange(n, dtype=np.int32)
        dtype = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])
        assert dtype.itemsize == ctypes.sizeof(lc.llama_token_data)
        self._buf = np.zeros(n, dtype=dtype)
        self._one = np.zeros(1, dtype=dtype)
        data_p = ctypes.POINTER(lc.llama_token_data)
        self._buf_p = self._buf.ctypes.data_as(data_p)
        self._one_p = self._one.ctypes.data_as(data_p)
        self._arr = lc.llama_token_data_array()
        self._one_arr = lc.llama_token_data_array()

    def _fill(self, logits) -> None:
        buf = self._buf
        buf["id"] = self._ids
        buf["logit"] = logits
        buf["p"] = 0.0
        arr = self._arr
        arr.data, arr.size, arr.selected, arr.sorted = self._buf_p, self._n, -1, False

    def _choose(self, first) -> tuple[int, float]:
        """Apply ``first`` (a sampler or None) then the chain to the filled array: (token, its logit)."""
        lc, arr = self._lc, self._arr
        ref = ctypes.byref(arr)
        if first is not None:
            lc.llama_sampler_apply(first, ref)
        lc.llama_sampler_apply(self._chain_ptr, ref)
        if not 0 <= arr.selected < arr.size:
            raise ModelError("the sampler chose no token")
        chosen = arr.data[arr.selected]
        return int(chosen.id), float(chosen.logit)

    def _best_allowed(self, utf8: np.ndarray) -> int | None:
        """Greedy decoding: the likeliest of the ``TOP_CANDIDATES`` likeliest tokens (after the chain's
        penalties) that the grammar and UTF-8 allow, checked one by one; None if none is."""
        logits = self._buf["logit"]  # penalised in place by the chain, still in token order
        k = min(TOP_CANDIDATES, self._n - 1)
        top = np.argpartition(-logits, k)[:k]
        for t in top[np.lexsort((top, -logits[top]))]:  # best first; the lower id first on a tie, as greedy does
            if not np.isfinite(logits[t]):
                break
            if utf8[t] and self._allowed(int(t)):
                return int(t)
        return None

    def _allowed(self, token: int) -> bool:
        one = self._one
        one[0] = (token, 0.0, 0.0)
        arr = self._one_arr
        arr.data, arr.size, arr.selected, arr.sorted = self._one_p, 1, -1, False
        self._lc.llama_sampler_apply(self._grammar, ctypes.byref(arr))
        return bool(np.isfinite(one["logit"][0]))

    def sample(self, ctx, idx: int) -> int:
        lc = self._lc
        logits = np.ctypeslib.as_array(lc.llama_get_logits_ith(ctx.ctx, idx), shape=(self._n,))
        token = None
        if self._grammar is None or self.check_first:
            self._fill(logits)
            token, _ = self._choose(None)
        if self._grammar is not None:
            self.grammar_checks += 1
            utf8 = self._utf8.mask(self._utf8_state)
            if token is not None and not (utf8[token] and self._allowed(token)):
                token = self._best_allowed(utf8) if self._greedy else None
            if token is None:
                self.grammar_full += 1
                self._fill(logits)
                self._buf["logit"][~utf8] = -np.inf  # nothing that would break UTF-8
                token, logit = self._choose(self._grammar)
                if not np.isfinite(logit):
                    raise ConstraintError("the grammar allows no token here (the model cannot go on)")
            if not self._engine.is_eog(token):  # the sequence ends at an end token: nothing to accept
                lc.llama_sampler_accept(self._grammar, token)
                self._utf8_state = self._utf8.after(self._utf8_state, token)
            if self._first and self._free_text and not self._engine.piece(token).startswith(b"{"):
                self._release_grammar()  # free text: the grammar has done its work
        self._first = False
        lc.llama_sampler_accept(self._chain_ptr, token)
        return token

    def _release_grammar(self) -> None:
        grammar, self._grammar = self._grammar, None
        if grammar is not None:
            self._lc.llama_sampler_free(grammar)

    def close(self) -> None:
        self._release_grammar()
        chain, self._chain = self._chain, None
        if chain is not None:
            chain.close()


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

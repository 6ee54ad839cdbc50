"""The pin: which llama-cpp-python the package uses, and the one door to it.

The low-level classes used here live in the private ``llama_cpp._internals``, which can change in
any release. So only ``llama.py`` and ``grammar.py`` use what this module hands them, the versions
tested are pinned (``TESTED_LLAMA_CPP``), and on first use the installed library is checked for
everything used (``missing_llama_cpp_api``): a ``ModelError`` naming what is missing, not an
``AttributeError`` mid-job. ``llama_cpp_library()`` imports it once per process and routes its log
lines to the ``tensorjob_jupyter.llama`` logger; ``CaptureLog`` keeps a failed load's reasons.

Design: docs/internals/inference.md#librarypy
"""

from __future__ import annotations


import ctypes
import importlib.metadata
import inspect
import itertools
import logging
import threading
from typing import Mapping


from tensorjob_jupyter.inference.base import (
    ModelError,
)

log = logging.getLogger("tensorjob_jupyter.llama")
log.addHandler(logging.NullHandler())

#: The llama-cpp-python versions this module is tested on, [low, high); pyproject.toml pins the same.
TESTED_LOW, TESTED_HIGH = (0, 3, 36), (0, 3, 37)
TESTED_LLAMA_CPP = f">={'.'.join(map(str, TESTED_LOW))},<{'.'.join(map(str, TESTED_HIGH))}"

# -- llama-cpp-python: what we use of it, import, logging, backend ---------------------------

#: ``llama_cpp._internals`` classes: the keyword arguments of their constructors, and the methods used.
INTERNALS_USED = {
    "LlamaModel": (("path_model", "params", "verbose"),
                   ("close", "n_ctx_train", "n_vocab", "n_embd", "token_bos", "token_eos", "token_get_text",
                    "metadata", "tokenize")),
    "LlamaContext": (("model", "params", "verbose"),
                     ("close", "kv_cache_seq_rm", "kv_cache_seq_cp", "kv_cache_clear")),
    "LlamaBatch": (("n_tokens", "embd", "n_seq_max", "verbose"), ("close", "reset")),
    "LlamaSampler": ((), ("close", "add_greedy", "add_top_k", "add_top_p", "add_min_p", "add_temp", "add_dist",
                          "accept", "sample")),
}
#: Parameters whose order we rely on when calling positionally.
SIGNATURES_USED = {("LlamaSampler", "add_top_p"): ("p", "min_keep"), ("LlamaSampler", "add_min_p"): ("p", "min_keep"),
                   ("LlamaSampler", "sample"): ("ctx", "idx")}
#: Functions and constants of the ``llama_cpp`` bindings.
LIBRARY_USED = ("llama_log_callback", "llama_log_set", "llama_backend_init", "llama_supports_gpu_offload",
                "llama_max_parallel_sequences", "llama_model_default_params", "llama_context_default_params",
                "llama_n_ctx_seq", "llama_adapter_lora_init", "llama_adapter_lora_p_ctypes",
                "llama_set_adapters_lora", "llama_token_to_piece", "llama_vocab_is_eog", "llama_decode",
                "llama_get_embeddings", "llama_get_causal_attn", "LLAMA_POOLING_TYPE_NONE", "llama_context_params",
                # constrained decoding (grammar.py: GrammarSampler; llguidance's tokenizer from the vocabulary)
                "llama_sampler_apply", "llama_sampler_accept", "llama_get_logits_ith", "llama_token_data",
                "llama_token_data_array", "llama_vocab_n_tokens", "llama_vocab_eos", "llama_token_get_attr",
                "LLAMA_TOKEN_ATTR_CONTROL", "LLAMA_TOKEN_ATTR_USER_DEFINED", "llama_tokenize",
                # a decode whose every job has ended is stopped between graph nodes (llama_abort.py: AbortWatch)
                "llama_set_abort_callback", "ggml_abort_callback")
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


def missing_llama_cpp_api(llama_cpp, internals) -> list[str]:
    """What this module uses that the given ``llama_cpp`` and ``llama_cpp._internals`` lack."""
    missing = []
    for struct, names in STRUCT_FIELDS_USED.items():
        have = {f[0] for f in getattr(getattr(llama_cpp, struct, None), "_fields_", ())}
        if have:
            missing += [f"{struct}.{f}" for f in names if f not in have]
    for cls_name, (kwargs, methods) in INTERNALS_USED.items():
        cls = getattr(internals, cls_name, None)
        if cls is None:
            missing.append(f"_internals.{cls_name}")
            continue
        params: Mapping[str, inspect.Parameter]
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
            from llama_cpp import _internals
        except ImportError as e:  # pragma: no cover - depends on the install
            raise ModelError(f"llama-cpp-python is not installed or does not import ({e}); "
                             f"pip install 'llama-cpp-python{TESTED_LLAMA_CPP}'") from e
        version = _installed_version()
        missing = missing_llama_cpp_api(llama_cpp, _internals)
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


class CaptureLog:
    """Collect llama.cpp's warning/error lines emitted on this thread."""

    def __enter__(self) -> list[str]:
        self.lines: list[str] = []
        _capture.lines = self.lines
        return self.lines

    def __exit__(self, *exc) -> None:
        _capture.lines = None


_reads_a_byte: object = None  # C's strlen, once found and checked (False: none fits)


def abort_switch(llama_cpp) -> tuple[object, ctypes.Array] | None:
    """A ``ggml_abort_callback`` that ggml may poll between graph nodes without taking the GIL, and the byte it
    reads: set ``byte[0]`` to ``b"\\x01"`` and the decode running ends at its next node (``llama_decode`` returns 2);
    ``b"\\x00"`` lets decodes run. None where no such function is found (decodes then always run to their end).

    A Python callback would take the GIL at every one of a step's hundreds of nodes, and wait for it whenever a
    job thread runs Python; C's ``strlen`` over a two-byte buffer answers 0 or 1, which is what a ``bool`` result
    is on the calling conventions llama.cpp builds for (the result register, the low byte read). That is checked
    here once, through the callback type itself, before it is used.
    """
    global _reads_a_byte
    if _reads_a_byte is None:
        _reads_a_byte = False
        try:
            try:
                strlen = ctypes.CDLL(None).strlen  # the C library this process runs on (POSIX)
            except (AttributeError, OSError, TypeError):  # pragma: no cover - Windows
                strlen = ctypes.cdll.msvcrt.strlen
            callback = llama_cpp.ggml_abort_callback(ctypes.cast(strlen, ctypes.c_void_p).value)
            probe = ctypes.create_string_buffer(2)
            ok = callback(ctypes.addressof(probe)) is False
            probe[0] = b"\x01"
            if ok and callback(ctypes.addressof(probe)) is True:
                _reads_a_byte = callback
        except (AttributeError, OSError, TypeError, ValueError) as e:  # pragma: no cover - depends on the platform
            log.info("tensorjob: no abort callback for llama.cpp decodes here (%s); they run to their end", e)
    if not _reads_a_byte:
        return None
    return _reads_a_byte, ctypes.create_string_buffer(2)


def log_reason(lines: list[str]) -> str:
    useful = [ln for ln in lines if ln]
    return ("; ".join(useful[-3:]))[:600] if useful else ""


__all__ = [
    "TESTED_LLAMA_CPP", "INTERNALS_USED", "SIGNATURES_USED", "LIBRARY_USED", "STRUCT_FIELDS_USED",
    "CONTEXT_FIELDS_USED", "missing_llama_cpp_api", "in_tested_range", "llama_cpp_library", "CaptureLog", "log_reason",
    "abort_switch"
]

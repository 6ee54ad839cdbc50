"""LoRA adapters on the llama.cpp engine: loaded once with the model, selected per request.

Adapters named when the engine is made are loaded once (``llama_adapter_lora_init``); a request names the ones
it wants and their scales, normalised to a ``LoraKey`` that the prefix cache keys KV by, and the selection is
set on the whole context (``llama_set_adapters_lora``) -- so the requests decoded together share one. An
unknown name is an error, never ignored. Apart from the engine because it is the one place that knows the
adapters by name.

Design: docs/internals/inference.md#what-the-engine-guarantees
"""

from __future__ import annotations

import ctypes
import os
from typing import Any, Mapping, Sequence

from tensorjob_jupyter.inference.base import LoraChoice, ModelError
from tensorjob_jupyter.inference.gguf import check_gguf
from tensorjob_jupyter.inference.library import CaptureLog, log_reason
from tensorjob_jupyter.inference.llama_sequence import LoraKey


class Adapters:
    """The adapters ``loras`` (name -> GGUF path) of one model (``model``: its ``LlamaModel``), and the selection
    set on its context ``ctx`` (``current``); ``lc``: llama-cpp-python."""

    def __init__(self, lc: Any, model: Any, ctx: Any, loras: Mapping[str, str | os.PathLike]):
        self._lc = lc
        self._model = model
        self._ctx = ctx
        self.current: LoraKey = ()
        self._adapters: dict[str, object] = {}
        for name, path in loras.items():
            self._load(name, path)

    def _load(self, name: str, path: str | os.PathLike) -> None:
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
    def names(self) -> list[str]:
        return sorted(self._adapters)

    def key(self, choices: Sequence[LoraChoice]) -> LoraKey:
        """The normalised adapter selection; unknown names raise ``ModelError``."""
        key = []
        for choice in choices:
            if choice.name not in self._adapters:
                known = ", ".join(self.names) or "none are configured"
                raise ModelError(f"unknown LoRA adapter {choice.name!r} (known: {known})")
            if choice.scale != 0.0:
                key.append((choice.name, float(choice.scale)))
        return tuple(key)

    def select(self, key: LoraKey) -> None:
        """Set the selection ``key`` on the context (nothing to do if it is set already)."""
        if key == self.current:
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
        self.current = key


__all__ = ["Adapters"]

"""inference: the model -- the request shapes, one worker thread per model, the engines and the served ones.

Owns: ``base`` (the request and answer shapes, the model errors), ``providers`` (``ModelRef``, a job's model
named once, and the providers that build each kind's backend), ``worker`` (one thread per model, a bounded
queue, continuous batching), ``models`` with ``lazy``, ``hub`` and ``gguf`` (where models come from, one loaded
model per process), ``library`` (the llama-cpp-python pin, the one door to it), ``llama`` (the engine) and its
rooms ``llama_scheduler`` (admission), ``llama_batch`` (a decode's layout), ``llama_cache`` (KV and prefix
cache), ``llama_machine`` (threads fitted to the machine), ``llama_abort``, ``llama_sampling``, ``llama_lora``,
``llama_text``, ``llama_embed`` and ``llama_sequence``; ``grammar``, ``penalties``, ``greedy`` and ``logprobs``
(the constrained sampler, the repeat penalty, the greedy choice, each token's probability), ``served`` (an
OpenAI-compatible server as the model) with ``served_dialects``, ``served_transport``, ``served_stream`` and
``served_errors``; ``text_stream`` and ``memo``, ``topology`` (CPUs, threads, GPU offload) and ``scripted``
(the deterministic stand-in for a model, public for guest tests).
May import: ``abi``, ``limits``, ``text``, ``version``, ``regular_file``. Nothing above: a model knows no job.
Design: docs/internals/inference.md#__init__py
"""

from tensorjob_jupyter.inference.base import (
    Backend, ModelEngine, GenerateRequest, GenerateResult, GenerateUsage, LoraChoice, ModelError, QueueFull, Sampler,
)
from tensorjob_jupyter.inference.models import default_model_path, get_backend
from tensorjob_jupyter.inference.providers import ModelRef, model_backend
from tensorjob_jupyter.inference.scripted import ScriptedBackend, ScriptedEngine
from tensorjob_jupyter.inference.worker import InferenceWorker

__all__ = ["Backend", "ModelEngine", "GenerateRequest", "GenerateResult", "GenerateUsage", "InferenceWorker",
           "LoraChoice", "ModelError", "QueueFull", "Sampler", "ScriptedBackend", "ScriptedEngine", "default_model_path",
           "get_backend", "ModelRef", "model_backend"]

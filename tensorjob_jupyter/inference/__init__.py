"""Model backends: the request shapes, the worker thread, and the engines.

One room per reason to change:

* ``base``: the request and answer shapes every backend speaks;
* ``worker``: one thread per model, a bounded queue, continuous batching;
* ``models``: where models come from (the embedded SmolLM2, GGUF checks) and
  one loaded model per process and options; ``lazy``: load on first use;
* ``llama``: the llama.cpp engine, the only module that touches
  llama-cpp-python (and its private ``_internals``, on a pinned, checked range);
* ``served``: a model on an OpenAI-compatible server (``--model http://.../v1``),
  through the openai SDK, with the local worker's guarantees;
* ``text_stream``: token bytes to whole characters, stop strings cut;
* ``topology``: CPUs, cores, ``TENSORJOB_THREADS``, GPU offload;
* ``scripted``: the deterministic stand-in for a model, public for guest tests.
"""

from tensorjob_jupyter.inference.base import (
    Backend, ModelEngine, GenerateRequest, GenerateResult, GenerateUsage, LoraChoice, ModelError, QueueFull, Sampler,
)
from tensorjob_jupyter.inference.models import default_model_path, get_backend
from tensorjob_jupyter.inference.scripted import ScriptedBackend, ScriptedEngine
from tensorjob_jupyter.inference.worker import InferenceWorker

__all__ = ["Backend", "ModelEngine", "GenerateRequest", "GenerateResult", "GenerateUsage", "InferenceWorker",
           "LoraChoice", "ModelError", "QueueFull", "Sampler", "ScriptedBackend", "ScriptedEngine", "default_model_path",
           "get_backend"]

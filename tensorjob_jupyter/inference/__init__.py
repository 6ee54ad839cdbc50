"""Model backends: the request shapes, the worker thread, and the engines.

One room per reason to change:

* ``base``: the request and answer shapes every backend speaks, and the model errors;
* ``providers``: a job's model named once (``ModelRef``: embedded, a file, ``hf:``, a server's URL) and
  the table of providers that build each kind's backend;
* ``worker``: one thread per model, a bounded queue, continuous batching;
* ``models``: where models come from (the embedded SmolLM2, GGUF checks) and
  one loaded model per process and options; ``lazy``: load on first use;
  ``hub``: ``hf:`` models from the Hugging Face cache; ``gguf``: the file check;
* ``library``: the llama-cpp-python pin and the one door to it -- ``llama`` (the llama.cpp engine) and
  ``grammar`` (constrained decoding on llguidance) use what it hands them, and no other module touches
  llama-cpp-python;
* ``served``: a model on an OpenAI-compatible server (``--model http://.../v1``),
  through the openai SDK, with the local worker's guarantees;
* ``text_stream``: token bytes to whole characters, stop strings cut; ``memo``: caches bounded in bytes;
* ``topology``: CPUs, cores, ``TENSORJOB_THREADS``, GPU offload;
* ``scripted``: the deterministic stand-in for a model, public for guest tests.
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

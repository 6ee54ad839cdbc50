"""Model backends: the request shapes, the worker thread, and the engines."""

from .base import (Backend, Engine, GenerateRequest, GenerateResult, GenerateUsage, LoraChoice,
                   ModelError, QueueFull, Sampler)
from .models import default_model_path, get_backend
from .scripted import ScriptedBackend, ScriptedEngine
from .worker import InferenceWorker

__all__ = ["Backend", "Engine", "GenerateRequest", "GenerateResult", "GenerateUsage", "InferenceWorker",
           "LoraChoice", "ModelError", "QueueFull", "Sampler", "ScriptedBackend", "ScriptedEngine", "default_model_path",
           "get_backend"]

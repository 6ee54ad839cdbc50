"""``JobSpec``: everything that shapes one job, as one typed value, and ``Overrides``: what was given anew.

A job is its guest, its input, what it may read and fetch, the bytes staged for ``read-input``, its limits,
how its infers are sent (``InferOptions``, defined here), its model (``ModelRef``, named once), where its transcript goes,
and whether it is debugged. Every way to start a job builds one ``JobSpec``: the Python API's keywords
(``JobSpec.of``), a front end's options (``frontends/options.py``), a recorded run (``RecordedRun.spec``), a
map's template for each item. ``Overrides`` holds only what a front end (or a caller) gave, parsed once, and
``spec.merge(overrides)`` lays it over any of them: a replay is ``RecordedRun.spec(guest).merge(overrides)``,
and a map replay merges the same value into every item's. Both are frozen; a ``JobSpec`` travels to Dask workers.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Iterable

from tensorjob_jupyter.host.debugger import parse_break_on
from tensorjob_jupyter.inference.base import DEFAULT_REPEAT_PENALTY, LoraChoice, ModelError, Sampler
from tensorjob_jupyter.inference.providers import ModelRef
from tensorjob_jupyter.limits import FIELDS as LIMIT_FIELDS
from tensorjob_jupyter.limits import Limits, with_keywords
from tensorjob_jupyter.sandbox.compile import GuestSource
from tensorjob_jupyter.world.fetch import FetchGrants


@dataclass(frozen=True)
class InferOptions:
    """How this job's ``infer`` commands are sent to the model.

    The defaults: greedy decoding (temperature 0, seed 0) with a mild
    repetition penalty (``DEFAULT_REPEAT_PENALTY``), the prompt cache on, no
    adapter, and ``chat=None``: the model's chat template when it has one
    (instruct models do), raw text otherwise. An ``infer`` may set its own
    sampling (``temperature``, ``top_p``, ... ``stop``) over these.
    """

    sampler: Sampler = field(default_factory=lambda: Sampler(repeat_penalty=DEFAULT_REPEAT_PENALTY))
    cache_prompt: bool = True
    lora: tuple[LoraChoice, ...] = ()
    chat: bool | None = None
    #: Each infer decoded alone, with ``threads`` decode threads (a deterministic map; ``GenerateRequest.alone``).
    alone: bool = False
    threads: int | None = None

    @classmethod
    def of(cls, *, temperature: float = 0.0, top_p: float = 1.0, repeat_penalty: float = DEFAULT_REPEAT_PENALTY,
           seed: int = 0, chat: bool | None = None, cache_prompt: bool = True,
           lora: dict[str, float] | None = None) -> "InferOptions":
        """The options from plain values (the job options' flags); ``lora``: adapter names and their scales."""
        return cls(sampler=Sampler(temperature=temperature, top_p=top_p, repeat_penalty=repeat_penalty, seed=seed),
                   cache_prompt=cache_prompt, lora=tuple(LoraChoice(n, s) for n, s in (lora or {}).items()),
                   chat=chat)

    def to_json(self) -> dict:
        out = {"sampler": self.sampler.to_json(), "cache_prompt": self.cache_prompt,
               "lora": [{"name": c.name, "scale": c.scale} for c in self.lora], "chat": self.chat}
        if self.alone:
            out.update(alone=True, threads=self.threads)
        return out


@dataclass(frozen=True)
class JobSpec:
    """One job's setup (see the module doc); ``JobSpec.of`` builds one from the Python API's keywords."""

    #: the guest: wasm, compiled from C, Zig or WAT, or a Python script (``sandbox.compile.GuestSource``)
    guest: GuestSource
    #: the job input: a JSON value (checked when the job is made)
    input: Any = None
    #: paths the guest may read (files or folders): absolute from ``JobSpec.of`` and the front ends (so a later
    #: ``replace(cwd=...)`` does not move them); a relative one given here is relative to ``cwd``
    read: tuple[str, ...] = ()
    #: the http(s) URL prefixes the guest may fetch, parsed once (prefixes given here are parsed when the spec is made)
    fetch: FetchGrants = field(default_factory=FetchGrants)
    #: bytes staged for the guest's ``read-input``
    input_bytes: bytes = b""
    limits: Limits = field(default_factory=Limits)
    #: how the job's infers are sent: sampling, the chat template, the prompt cache, LoRA
    infer: InferOptions = field(default_factory=InferOptions)
    #: the model (``inference.providers.ModelRef``); a ``backend=`` given to ``Job`` replaces it
    model: ModelRef = field(default_factory=ModelRef)
    #: where the transcript goes (None: ``$TENSORJOB_RUNS`` or the default)
    runs_dir: str | None = None
    #: what relative paths are relative to (None: the process's working directory)
    cwd: str | None = None
    #: the job's name in views and listings (None: the guest's)
    name: str | None = None
    #: start paused before ``cf_init``; pause before these commands (``host/debugger.py``)
    debug: bool = False
    break_on: tuple[str, ...] = ()
    #: result fields (dotted paths, ``host.fields``) that must be grounded in what the job read, else each is
    #: rejected alone (``fail_item``: the job fails ``ungrounded``), and fields that must hold a value, else the
    #: job fails (``host/requirements.py``)
    require_grounded: tuple[str, ...] = ()
    require_present: tuple[str, ...] = ()
    fail_item: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.fetch, FetchGrants):  # prefixes: parsed here, once (``ValueError`` names a bad one)
            object.__setattr__(self, "fetch", FetchGrants.parse(self.fetch))

    @classmethod
    def of(cls, guest: "GuestSource | bytes | str | os.PathLike", *, input: Any = None,
           read: Iterable[str | os.PathLike] = (), fetch: Iterable[str] = (), input_bytes: bytes = b"",
           limits: Limits | None = None, infer: InferOptions | None = None,
           model: "str | os.PathLike | ModelRef | None" = None, model_options: dict | None = None,
           runs_dir: str | os.PathLike | None = None, cwd: str | os.PathLike | None = None,
           name: str | None = None, debug: bool = False, break_on: str | Iterable[str] = (),
           require_grounded: str | Iterable[str] = (), require_present: str | Iterable[str] = (),
           fail_item: bool = False, **limit_keywords: Any) -> "JobSpec":
        """The spec the Python API's keywords describe (each is the job option of the same name): ``guest``
        as wasm bytes, a ``GuestSource`` or a path (``.py``, ``.wasm``, or ``.c``, ``.zig``, ``.wat``
        compiled on the way); ``model`` a GGUF path, ``hf:...``, a server's URL or a ``ModelRef``, with
        ``model_options`` (``loras``, engine settings; a served model's ``model_name`` and
        ``api_key_env``); ``limits`` and any limit as a keyword of its own (``max_tokens=64``);
        ``require_grounded``: fields (``"title"``, ``"facts.year"``, or ``"title,year"``) the job must find in
        what it read (one that is not is rejected alone, or with ``fail_item`` fails the job);
        ``require_present``: fields that must hold a value.

        Raises at once, before anything runs: ``TypeError`` for an unknown keyword, ``ValueError`` for a
        bad limit, fetch prefix or ``break_on`` kind, ``ModelError`` for a model option of the wrong kind,
        ``FileNotFoundError`` for a read grant that does not exist or a guest, ``CompileError`` for a guest."""
        limits = with_keywords(limits, limit_keywords, "Job")
        grants = FetchGrants.parse(fetch)
        base = os.fspath(cwd) if cwd is not None else os.getcwd()
        paths: list[str] = []
        for entry in read:  # checked here, once, and made absolute: nothing below resolves them again
            given = os.fspath(entry)
            if not given or "\0" in given:
                raise ValueError(f"read grant {given!r}: a path (neither empty nor holding a NUL)")
            path = os.path.abspath(os.path.join(base, given))
            if not os.path.exists(path):
                raise FileNotFoundError(f"read grant not found: {given}")
            paths.append(path)
        try:
            model_ref = ModelRef.parse(model, **(model_options or {}))
        except ValueError as e:
            raise ModelError(str(e)) from None
        return cls(guest=GuestSource.of(guest), input=input, read=tuple(paths), fetch=grants,
                   input_bytes=bytes(input_bytes), limits=limits, infer=infer or InferOptions(), model=model_ref,
                   runs_dir=os.fspath(runs_dir) if runs_dir is not None else None,
                   cwd=os.fspath(cwd) if cwd is not None else None, name=name, debug=bool(debug),
                   break_on=tuple(parse_break_on(break_on)), require_grounded=parse_fields(require_grounded),
                   require_present=parse_fields(require_present), fail_item=bool(fail_item))

    def replace(self, **changes: Any) -> "JobSpec":
        """A copy with ``changes`` (fields of this class)."""
        return dataclasses.replace(self, **changes)

    def merge(self, overrides: "Overrides") -> "JobSpec":
        """This spec with what ``overrides`` gives in place (see ``Overrides``); ``ModelError`` for a model
        option that does not fit the model it lands on."""
        changes: dict[str, Any] = {name: getattr(overrides, name) for name in _PLAIN
                                   if getattr(overrides, name) is not None}
        if overrides.input is not UNSET:
            changes["input"] = overrides.input
        if overrides.limits:
            changes["limits"] = self.limits.replace(**dict(overrides.limits))
        if overrides.infer:
            changes["infer"] = _merged_infer(self.infer, dict(overrides.infer))
        model = overrides.model_ref(self.model)
        if model is not self.model:
            changes["model"] = model
        return dataclasses.replace(self, **changes) if changes else self


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


#: ``Overrides.input`` when no input was given (``None`` is JSON's null, a value a job may be given).
UNSET: Any = _Unset()
#: The ``InferOptions`` an override may set, by name: the sampler's fields, ``chat``, ``cache_prompt`` and
#: ``lora`` ({adapter name: scale}).
SAMPLER_FIELDS = tuple(f.name for f in dataclasses.fields(Sampler))
INFER_FIELDS = SAMPLER_FIELDS + ("chat", "cache_prompt", "lora")
#: The fields an override replaces as they are.
_PLAIN = ("read", "fetch", "input_bytes", "runs_dir", "cwd", "name", "debug", "break_on", "require_grounded",
          "require_present", "fail_item")


@dataclass(frozen=True)
class Overrides:
    """What was given for a job and nothing else -- each field None (``input``: ``UNSET``) when not given --
    parsed once, where it was given (``Overrides.of``, or a front end's options, which check every value; built
    field by field it holds what it is given, its names checked); ``JobSpec.merge`` lays it over a spec."""

    input: Any = UNSET
    read: tuple[str, ...] | None = None
    fetch: FetchGrants | None = None
    input_bytes: bytes | None = None
    #: the limits given, ``(name, value)``: each replaces the spec's own, the others stay
    limits: tuple[tuple[str, Any], ...] = ()
    #: the sampling given, ``(name, value)`` for names of ``INFER_FIELDS``: each replaces the spec's own
    infer: tuple[tuple[str, Any], ...] = ()
    #: the model given anew (parsed once, where it was given, with its options), or with no ``model`` the options
    #: given for the spec's own model
    model: ModelRef | None = None
    model_name: str | None = None
    api_key_env: str | None = None
    #: LoRA adapters, ``(name, path)``: they replace the model's own
    loras: tuple[tuple[str, str], ...] | None = None
    runs_dir: str | None = None
    cwd: str | None = None
    name: str | None = None
    debug: bool | None = None
    break_on: tuple[str, ...] | None = None
    require_grounded: tuple[str, ...] | None = None
    require_present: tuple[str, ...] | None = None
    fail_item: bool | None = None

    def __post_init__(self) -> None:
        if self.fetch is not None and not isinstance(self.fetch, FetchGrants):  # prefixes: parsed here, once
            object.__setattr__(self, "fetch", FetchGrants.parse(self.fetch))
        unknown = sorted({k for k, _ in self.infer} - set(INFER_FIELDS))
        if unknown:
            raise TypeError(f"Overrides.infer: not a sampling option: {', '.join(unknown)}")
        unknown = sorted({k for k, _ in self.limits} - set(LIMIT_FIELDS))
        if unknown:
            raise TypeError(f"Overrides.limits: not a limit: {', '.join(unknown)}")

    @classmethod
    def of(cls, *, input: Any = UNSET, read: Iterable[str | os.PathLike] | None = None,
           fetch: Iterable[str] | None = None, input_bytes: bytes | None = None, limits: Limits | None = None,
           infer: InferOptions | None = None, model: "str | os.PathLike | ModelRef | None" = None,
           model_options: dict | None = None, runs_dir: str | os.PathLike | None = None,
           cwd: str | os.PathLike | None = None, name: str | None = None, debug: bool | None = None,
           break_on: str | Iterable[str] | None = None, require_grounded: str | Iterable[str] | None = None,
           require_present: str | Iterable[str] | None = None, fail_item: bool | None = None,
           **limit_keywords: Any) -> "Overrides":
        """The overrides the Python API's keywords give (as ``JobSpec.of`` reads them; a whole ``limits`` or
        ``infer`` replaces every one of its fields, a limit keyword just its own; ``model_options`` without a
        ``model`` are the recorded model's ``model_name``, ``api_key_env`` or ``loras``). Raises before anything
        runs: ``TypeError`` for an unknown keyword, ``ValueError`` for a bad limit or fetch prefix,
        ``ModelError`` for a model that does not parse."""
        given_limits = {f: getattr(limits, f) for f in LIMIT_FIELDS} if limits is not None else {}
        if limit_keywords:
            checked = with_keywords(None, limit_keywords, "replay")  # a TypeError or ValueError names a bad one
            given_limits.update({k: getattr(checked, k) for k in limit_keywords})
        options = dict(model_options or {})
        ref = None
        if model is not None:  # parsed here, once, with its options
            try:
                ref, options = ModelRef.parse(model, **options), {}
            except ValueError as e:
                raise ModelError(str(e)) from None
        loras = options.pop("loras", None)
        model_name, api_key_env = options.pop("model_name", None), options.pop("api_key_env", None)
        if options:
            raise TypeError(f"the model's options given without a model are model_name, api_key_env and loras, "
                            f"not {', '.join(options)}")
        grants = FetchGrants.parse(fetch) if fetch is not None else None
        pairs: tuple[tuple[str, Any], ...] = ()
        if infer is not None:
            pairs = tuple((f, getattr(infer.sampler, f)) for f in SAMPLER_FIELDS) + (
                ("chat", infer.chat), ("cache_prompt", infer.cache_prompt),
                ("lora", {c.name: c.scale for c in infer.lora}))
        return cls(input=input, read=tuple(os.fspath(r) for r in read) if read is not None else None, fetch=grants,
                   input_bytes=bytes(input_bytes) if input_bytes is not None else None,
                   limits=tuple(given_limits.items()), infer=pairs,
                   model=ref, model_name=model_name,
                   api_key_env=api_key_env,
                   loras=tuple(sorted((str(k), str(v)) for k, v in loras.items())) if loras is not None else None,
                   runs_dir=os.fspath(runs_dir) if runs_dir is not None else None,
                   cwd=os.fspath(cwd) if cwd is not None else None, name=name,
                   debug=bool(debug) if debug is not None else None,
                   break_on=tuple(parse_break_on(break_on)) if break_on is not None else None,
                   require_grounded=parse_fields(require_grounded) if require_grounded is not None else None,
                   require_present=parse_fields(require_present) if require_present is not None else None,
                   fail_item=bool(fail_item) if fail_item is not None else None)

    @property
    def given(self) -> frozenset[str]:
        """The names of what was given (``input``, ``read``, ..., each limit's and sampling option's name)."""
        names = {f.name for f in dataclasses.fields(self)
                 if f.name not in ("input", "limits", "infer") and getattr(self, f.name) is not None}
        if self.input is not UNSET:
            names.add("input")
        return frozenset(names | {k for k, _ in self.limits} | {k for k, _ in self.infer})

    def model_ref(self, base: ModelRef) -> ModelRef:
        """``base`` with the model options given here in place (``ModelRef.with_options``); ``ModelError`` names
        one that does not fit the model it lands on."""
        try:
            return base.with_options(model=self.model, model_name=self.model_name, api_key_env=self.api_key_env,
                                     loras=dict(self.loras) if self.loras is not None else None)
        except ValueError as e:
            raise ModelError(str(e)) from None

    def replace(self, **changes: Any) -> "Overrides":
        return dataclasses.replace(self, **changes)


def _merged_infer(infer: InferOptions, given: dict[str, Any]) -> InferOptions:
    """``infer`` with the sampling options in ``given`` in place (a given ``lora`` is the whole choice of
    adapters); the rest of it (a deterministic map's ``alone`` and ``threads``) stays."""
    sampler = dataclasses.replace(infer.sampler, **{k: given[k] for k in SAMPLER_FIELDS if k in given})
    changes: dict[str, Any] = {"sampler": sampler}
    for name in ("chat", "cache_prompt"):
        if name in given:
            changes[name] = given[name]
    if "lora" in given:
        changes["lora"] = tuple(LoraChoice(n, float(s)) for n, s in dict(given["lora"]).items())
    return dataclasses.replace(infer, **changes)


#: Fields ``require_grounded`` may name at most, and the longest name.
MAX_REQUIRED_FIELDS = 100
MAX_FIELD_NAME_CHARS = 1000


def parse_fields(fields: str | Iterable[str]) -> tuple[str, ...]:
    """Field names as ``require_grounded`` takes them -- ``"title,facts.year"``, or a list of names or of such
    lists -- each stripped, in order, once; ``ValueError`` names an empty or over-long one."""
    parts = [fields] if isinstance(fields, str) else list(fields)
    out: list[str] = []
    for part in parts:
        if not isinstance(part, str):
            raise ValueError(f"require_grounded takes field names (text), got {type(part).__name__}")
        for name in part.split(","):
            name = name.strip()
            if not name:
                raise ValueError(f"require_grounded: an empty field name in {part!r}")
            if len(name) > MAX_FIELD_NAME_CHARS:
                raise ValueError(f"require_grounded: a field name of {len(name)} characters (at most "
                                 f"{MAX_FIELD_NAME_CHARS})")
            if name not in out:
                out.append(name)
    if len(out) > MAX_REQUIRED_FIELDS:
        raise ValueError(f"require_grounded names {len(out)} fields (at most {MAX_REQUIRED_FIELDS}: name an "
                         f"object to require every field in it)")
    return tuple(out)


__all__ = ["InferOptions", "JobSpec", "Overrides", "UNSET", "SAMPLER_FIELDS", "INFER_FIELDS", "MAX_REQUIRED_FIELDS", "MAX_FIELD_NAME_CHARS", "parse_fields"]

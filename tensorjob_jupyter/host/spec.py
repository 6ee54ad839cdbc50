"""``JobSpec``: everything that shapes one job, as one typed value -- what every front end builds and ``Job`` takes.

A job is its guest, its input, what it may read and fetch, the bytes staged
for ``read-input``, its limits, how its infers are sent (``InferOptions``),
its model (``ModelRef``, named once), where its transcript goes, and whether
it is debugged. They used to travel as fifteen keywords through every layer;
now each way to start a job builds one ``JobSpec`` and hands it over:

* ``JobSpec.of(guest, **keywords)`` reads the Python API's keywords (``tj.run``, ``Job(...)``: unchanged
  for callers) and checks them at once -- a bad limit, a bad ``fetch`` prefix or ``break_on`` kind, a guest
  that does not compile, a model option of the wrong kind;
* the options table (``frontends/options.py``) builds one from the command line, a magic's line or the
  notebook's settings;
* a replay builds one from its ``RecordedRun``, with what was given anew in place
  (``history/replay_setup.py``); a map builds one for every item from its template (``fanout``).

A ``JobSpec`` is frozen and small enough to travel to a Dask worker once
per map; ``replace`` gives a changed copy.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Iterable

from tensorjob_jupyter.host.debugger import parse_break_on
from tensorjob_jupyter.host.reactor import InferOptions
from tensorjob_jupyter.inference.base import ModelError
from tensorjob_jupyter.inference.providers import ModelRef
from tensorjob_jupyter.limits import Limits, with_keywords
from tensorjob_jupyter.sandbox.compile import GuestSource
from tensorjob_jupyter.world.fetch import FetchGrants


@dataclass(frozen=True)
class JobSpec:
    """One job's setup (see the module doc); ``JobSpec.of`` builds one from the Python API's keywords."""

    #: the guest: wasm, compiled from C, Zig or WAT, or a Python script (``sandbox.compile.GuestSource``)
    guest: GuestSource
    #: the job input: a JSON value (checked when the job is made)
    input: Any = None
    #: paths the guest may read (files or folders), relative to ``cwd``
    read: tuple[str, ...] = ()
    #: http(s) URL prefixes the guest may fetch
    fetch: tuple[str, ...] = ()
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
    #: result fields (dotted paths, ``host.fields``) that must be found in what the job read, else it fails
    #: ``ungrounded`` (``host/grounding.py``)
    require_grounded: tuple[str, ...] = ()

    @classmethod
    def of(cls, guest: "GuestSource | bytes | str | os.PathLike", *, input: Any = None,
           read: Iterable[str | os.PathLike] = (), fetch: Iterable[str] = (), input_bytes: bytes = b"",
           limits: Limits | None = None, infer: InferOptions | None = None,
           model: "str | os.PathLike | ModelRef | None" = None, model_options: dict | None = None,
           runs_dir: str | os.PathLike | None = None, cwd: str | os.PathLike | None = None,
           name: str | None = None, debug: bool = False, break_on: str | Iterable[str] = (),
           require_grounded: str | Iterable[str] = (), **limit_keywords: Any) -> "JobSpec":
        """The spec the Python API's keywords describe (each is the job option of the same name): ``guest``
        as wasm bytes, a ``GuestSource`` or a path (``.py``, ``.wasm``, or ``.c``, ``.zig``, ``.wat``
        compiled on the way); ``model`` a GGUF path, ``hf:...``, a server's URL or a ``ModelRef``, with
        ``model_options`` (``loras``, engine settings; a served model's ``model_name`` and
        ``api_key_env``); ``limits`` and any limit as a keyword of its own (``max_tokens=64``);
        ``require_grounded``: fields (``"title"``, ``"facts.year"``, or ``"title,year"``) the job must find in
        what it read.

        Raises at once, before anything runs: ``TypeError`` for an unknown keyword, ``ValueError`` for a
        bad limit, fetch prefix or ``break_on`` kind, ``ModelError`` for a model option of the wrong kind,
        ``FileNotFoundError`` or ``CompileError`` for a guest."""
        limits = with_keywords(limits, limit_keywords, "Job")
        fetch = tuple(fetch)
        check_fetch(fetch)
        try:
            model_ref = ModelRef.parse(model, **(model_options or {}))
        except ValueError as e:
            raise ModelError(str(e)) from None
        return cls(guest=GuestSource.of(guest), input=input, read=tuple(os.fspath(r) for r in read), fetch=fetch,
                   input_bytes=bytes(input_bytes), limits=limits, infer=infer or InferOptions(), model=model_ref,
                   runs_dir=os.fspath(runs_dir) if runs_dir is not None else None,
                   cwd=os.fspath(cwd) if cwd is not None else None, name=name, debug=bool(debug),
                   break_on=tuple(parse_break_on(break_on)), require_grounded=parse_fields(require_grounded))

    def replace(self, **changes: Any) -> "JobSpec":
        """A copy with ``changes`` (fields of this class)."""
        return dataclasses.replace(self, **changes)


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


def check_fetch(prefixes: Iterable[str]) -> None:
    """``ValueError`` naming a ``fetch`` prefix that is not an http(s) URL prefix."""
    FetchGrants.parse(prefixes)


__all__ = ["JobSpec", "MAX_REQUIRED_FIELDS", "MAX_FIELD_NAME_CHARS", "parse_fields", "check_fetch"]

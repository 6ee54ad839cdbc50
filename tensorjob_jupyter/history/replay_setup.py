"""What a replay takes from its recording: ``RecordedRun``, the run's setup read once, and the replay's ``JobSpec``.

A replay re-runs a guest against a recorded run's world (``replay.py``); unless given anew it takes the run's
own setup from the transcript's ``job.created`` -- input, limits, sampling and the model (its whole
``ModelRef``). A transcript is a file from anywhere, so that setup is read and checked once (``load_run``), a
recorded limit looser than the defaults is not taken unless given again, a recorded server is never adopted, and
no grant is ever taken from it unasked: a replay reads only what ``--read`` (``read=``) grants on this machine
and fetches only what ``--fetch`` grants, or the recorded grants when ``recorded_grants`` asks for them.
``RecordedRun.spec`` is the run's own ``JobSpec``; ``replay_spec`` merges what was given (``Overrides``) over it,
and ``adoption_lines`` says what a replay took, and which grants it did not, before it runs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
from dataclasses import dataclass
from typing import Any, Iterable

from tensorjob_jupyter.abi import TensorjobError
from tensorjob_jupyter.inference.base import LoraChoice, ModelError, Sampler
from tensorjob_jupyter.limits import FIELDS as LIMIT_FIELDS
from tensorjob_jupyter.limits import Limits
from tensorjob_jupyter.limits import check as limits_check
from tensorjob_jupyter.host.spec import InferOptions
from tensorjob_jupyter.sandbox.compile import GuestSource
from tensorjob_jupyter.host.spec import JobSpec, Overrides, parse_fields
from tensorjob_jupyter.world.fetch import FetchGrants
from tensorjob_jupyter.inference.lazy import DEFAULT_MODEL_NAME
from tensorjob_jupyter.inference.providers import ModelRef
from tensorjob_jupyter.record.event_checks import MAX_COUNT
from tensorjob_jupyter.text import for_terminal
from tensorjob_jupyter.record.recording import (
    Recording,
)
from tensorjob_jupyter.history.runs import resolve_run

_SHA256 = re.compile(r"[0-9a-f]{64}")
_EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


class ReplayError(TensorjobError, ValueError):
    """A replay that cannot start: its run cannot be replayed, or what it needs was not given (one line)."""


@dataclass(frozen=True)
class RecordedRun:
    """A recorded run, ready to replay: its recording and its setup, read from ``job.created`` once, checked."""

    recording: Recording
    input: Any
    #: the grants as the run was given them (all their names), else its canonical roots
    read: tuple[str, ...]
    #: the grants' canonical roots
    grants: tuple[str, ...]
    fetch: tuple[str, ...]
    #: the run's directory (guest paths are relative to it), if it exists here
    cwd: str | None
    #: the bytes the run staged for ``read-input``: only their length and SHA-256 are recorded
    input_bytes: int
    input_sha256: str
    #: the run's limits, none looser than the defaults, and the looser ones (not taken unless given again)
    limits: Limits
    looser_limits: dict
    infer: InferOptions
    #: the model it ran on, and a served model's server (its URL and key variable)
    model: str | None
    model_server: dict | None
    #: the result fields the run had to find in what it read (``--require-grounded``)
    require_grounded: tuple[str, ...] = ()
    #: the model it ran on, whole (transcripts before it was recorded: None)
    model_ref: ModelRef | None = None
    #: the fields it required present, and whether a field not grounded failed it (``--fail-item``)
    require_present: tuple[str, ...] = ()
    fail_item: bool = False

    @classmethod
    def of(cls, recording: Recording) -> "RecordedRun":
        """``recording``'s setup, checked; ``ReplayError`` (one line) says what cannot be replayed."""
        shown = for_terminal(recording.id, one_line=True)
        if recording.version < 1:
            raise ReplayError(f"{shown}: its transcript predates format version 1 and records no prompts, so it "
                              f"cannot be replayed (tensorjob show still shows it)")
        created = recording.created
        try:
            lists = {}
            for key in ("read", "grants", "fetch"):
                value = created.get(key) or []
                if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
                    raise ValueError(f"{key} is not a list of strings")
                lists[key] = tuple(value)
            staged = created.get("input_bytes") or {}
            if not isinstance(staged, dict):
                raise ValueError("input_bytes is not an object")
            size, digest = staged.get("bytes", 0), staged.get("sha256", _EMPTY_SHA256)
            if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= MAX_COUNT:
                raise ValueError("input_bytes.bytes is not a count")
            if not isinstance(digest, str) or not _SHA256.fullmatch(digest):
                raise ValueError("input_bytes.sha256 is not a SHA-256")
            taken, looser = _limit_values(created.get("limits") or {})
            required = parse_fields(created.get("require_grounded") or ())
            present = parse_fields(created.get("require_present") or ())
            fail_item = created.get("fail_item") is True
            infer = _infer_options(created.get("infer") or {})
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ReplayError(f"{shown}: its job.created cannot be replayed: "
                              f"{for_terminal(str(e), one_line=True)[:200]}") from None
        cwd = created.get("cwd")
        server = created.get("model_server")
        model_ref = _recorded_model(created.get("model_ref"))
        return cls(recording, created.get("input"), lists["read"] or lists["grants"], lists["grants"],
                   lists["fetch"], cwd if isinstance(cwd, str) and os.path.isdir(cwd) else None, size, digest,
                   Limits(**taken), looser, infer, recording.model, server if isinstance(server, dict) else None,
                   required, model_ref, present, fail_item)

    @property
    def id(self) -> str:
        return self.recording.id

    @property
    def guest_sha256(self) -> str | None:
        return self.recording.guest.get("sha256")

    def spec(self, guest: Any, *, recorded_grants: bool = False, grants: bool = True) -> JobSpec:
        """The run's own ``JobSpec`` for ``guest``: its input, sampling, limits (none looser than the defaults),
        ``cwd``, required fields and model -- and no grant at all: a transcript is a file from anywhere, and what
        it says was granted must never decide what a guest reads or fetches on this machine. Only with
        ``recorded_grants`` (asked for: ``--recorded-grants``) does it take the recorded read grants and fetch
        prefixes; then ``ReplayError`` if a grant does not exist here (files are read live). ``grants=False``:
        no recorded read grant even then (the read grants are given anew)."""
        read: tuple[str, ...] = ()
        if grants and recorded_grants:
            missing = [g for g in self.grants if not os.path.exists(g)]
            if missing:
                raise ReplayError(f"the run was granted {for_terminal(missing[0], one_line=True)}, which does not "
                                  f"exist here; files are read live, so give the grants again with --read")
            read = tuple(r for r in self.read if os.path.exists(r))
        model = self.model_ref if self.model_ref is not None and not self.model_ref.served else ModelRef()
        return JobSpec(guest=guest, input=self.input, read=read, fetch=FetchGrants.parse(self.fetch) if recorded_grants else FetchGrants(),
                       limits=self.limits,
                       infer=self.infer, model=model, cwd=self.cwd,  # a recorded server is never taken
                       require_grounded=self.require_grounded, require_present=self.require_present,
                       fail_item=self.fail_item)


def _recorded_model(obj: Any) -> ModelRef | None:
    """The model a transcript recorded, as far as a replay may take it: its file or ``hf:`` name, a served model's
    id and its adapters -- never its key variable (a transcript must not choose which key is sent) nor its engine
    settings (this machine's own apply). None when absent or not a reference (an older transcript, or a damaged
    one: a replay then asks for the model, as for a run recorded before ``model_ref`` was)."""
    if obj is None:
        return None
    try:
        ref = ModelRef.from_json(obj)
    except ValueError:
        return None
    return dataclasses.replace(ref, api_key_env=None, engine=())


def load_run(run: Any, runs: str | os.PathLike | None = None) -> RecordedRun:
    """The recorded run ``run`` (an id, a path, a ``Job``, a ``Recording`` or a ``RecordedRun``), ready to
    replay; ``ReplayError`` if it cannot be."""
    if isinstance(run, RecordedRun):
        return run
    return RecordedRun.of(run if isinstance(run, Recording) else Recording.read(resolve_run(run, runs)))


def replay_spec(guest: Any, run: RecordedRun, overrides: Overrides | None = None, *, live: bool = False,
                recorded_grants: bool = False, backend_given: bool = False, **keywords: Any) -> JobSpec:
    """The ``JobSpec`` of a replay of ``guest`` against ``run``: ``run.spec(guest)`` with ``overrides`` (what a
    front end was given), or the Python API's ``keywords`` (``Overrides.of``), merged over it: it reads and
    fetches only what they grant (``given_here``), or with ``recorded_grants`` what the run was granted. A ``live``
    replay runs on the recorded model unless another is given -- never on a recorded server, which must be
    named again (``--model URL``; its recorded model id then carries over to the same URL, never a key variable) --
    unless ``backend_given``: a backend of the caller's answers its infers."""
    if keywords:
        if overrides is not None:
            raise TypeError("replay_spec takes overrides or keywords, not both")
        overrides = Overrides.of(**keywords)
    overrides = given_here(overrides or Overrides())
    spec = run.spec(GuestSource.of(guest), recorded_grants=recorded_grants,
                    grants=overrides.read is None).merge(overrides)
    if live and not backend_given:
        spec = spec.replace(model=live_model(run, overrides))
    return spec


def given_here(overrides: Overrides) -> Overrides:
    """``overrides`` with the read grants it gives made absolute against this process's directory (unless it
    gives a ``cwd`` too): a replay's job runs in the recorded directory, so that a guest's relative paths mean
    what they meant, but ``--read data`` names ``./data`` here -- never a folder that a transcript's ``cwd``
    chooses."""
    if overrides.read is None or overrides.cwd is not None:
        return overrides
    return dataclasses.replace(overrides, read=tuple(os.path.abspath(r) if r else r for r in overrides.read))


def live_model(run: RecordedRun, overrides: Overrides) -> ModelRef:
    """The model a live replay of ``run`` with ``overrides`` runs on: the one they name, else the one the run
    recorded -- if it may be taken (``ReplayError`` says what to name instead)."""
    if overrides.model is None and run.model_ref is None and not embedded_model_will_do(run):
        raise ReplayError(live_model_needed(run))
    try:
        ref = overrides.model_ref(run.model_ref or ModelRef())
    except ModelError as e:
        raise ReplayError(f"--live: {e}") from None
    if overrides.model is None and not ref.here():  # the recorded one, with what was given for it
        raise ReplayError(live_model_needed(run))
    return ref


def embedded_model_will_do(run: RecordedRun) -> bool:
    """Whether a live replay of ``run`` may run on the embedded model with no other named: only if the run used
    it, as its ``model`` field says. (A run that recorded its ``model_ref`` is replayed on that instead when it is
    on this machine now -- ``ModelRef.here``: a ``hf:`` one already cached -- and never on a server.)"""
    return run.model in (None, DEFAULT_MODEL_NAME) and run.model_server is None


def live_model_needed(run: RecordedRun) -> str:
    """Why ``--live`` needs a model named: the run's model was not recorded whole (an older transcript), or it
    ran on a server. A server is named but never adopted: a transcript may come from anywhere, and must not
    choose where a request (with the key of a variable it names) is sent."""
    model = for_terminal(str(run.model), one_line=True)[:200]
    url = run.model_ref.name if run.model_ref is not None and run.model_ref.served else (
        (run.model_server or {}).get("url"))
    if isinstance(url, str):
        shown = for_terminal(url, one_line=True)[:200]
        return (f"--live: the run used the model {model} on the server {shown}; name the server to send its "
                f"infers to with --model URL (a replay never takes a server from its transcript)")
    if run.model_ref is not None:
        shown = for_terminal(run.model_ref.label, one_line=True)[:200]
        return (f"--live: the run used the model {shown}, which is not on this machine (or an adapter of it is "
                f"not); name the model with --model PATH")
    return f"--live: the run used the model {model}; name its GGUF file with --model PATH"


def _looser(value: Any, default: Any) -> bool:
    """Whether a limit of ``value`` allows more than ``default`` (None: no bound at all)."""
    if value is None:
        return default is not None
    return default is not None and value > default


def _limit_values(values: Any) -> tuple[dict, dict]:
    """Recorded limits split in two: those no looser than the defaults (taken), and the looser ones (not)."""
    if not isinstance(values, dict):
        raise ValueError("limits is not an object")
    defaults = Limits()
    taken: dict[str, Any] = {}
    refused: dict[str, Any] = {}
    for name, value in values.items():
        if name in LIMIT_FIELDS:
            try:
                limits_check(name, value)
            except ValueError as e:
                raise ValueError(f"limits.{name} {e}") from None
            (refused if _looser(value, getattr(defaults, name)) else taken)[name] = value
    return taken, refused


def _finite(obj: dict, name: str, low: float, high: float, default: float) -> float:
    value = obj.get(name, default)
    if type(value) not in (int, float) or not low <= value <= high:
        raise ValueError(f"infer.sampler.{name} is not a number from {low:g} to {high:g}")
    return value


def _infer_options(obj: Any) -> InferOptions:
    if not isinstance(obj, dict) or not isinstance(obj.get("sampler") or {}, dict):
        raise ValueError("infer is not an object of sampler settings")
    sampler = dict(obj.get("sampler") or {})
    stop = sampler.get("stop") or ()
    if not isinstance(stop, (list, tuple)) or not all(isinstance(x, str) for x in stop):
        raise ValueError("infer.sampler.stop is not a list of strings")
    for name, low, high, default in (("temperature", 0, 1e6, 0.0), ("top_p", 0, 1, 1.0), ("min_p", 0, 1, 0.0),
                                     ("repeat_penalty", 0, 1e6, 1.0), ("top_k", 0, 2 ** 31, 0),
                                     ("seed", -2 ** 63, 2 ** 64, 0)):
        _finite(sampler, name, low, high, default)
    for name in ("top_k", "seed"):
        if name in sampler and type(sampler[name]) is not int:
            raise ValueError(f"infer.sampler.{name} is not a whole number")
    sampler["stop"] = tuple(stop)
    known = {k: v for k, v in sampler.items() if k in Sampler.__dataclass_fields__}
    lora = obj.get("lora") or ()
    if not isinstance(lora, (list, tuple)) or not all(isinstance(c, dict) and isinstance(c.get("name"), str)
                                                      for c in lora):
        raise ValueError("infer.lora is not a list of adapters")
    threads = obj.get("threads")
    threads = threads if isinstance(threads, int) and not isinstance(threads, bool) and 1 <= threads <= 1024 else None
    alone = obj.get("alone") is True
    return InferOptions(sampler=Sampler(**known), cache_prompt=bool(obj.get("cache_prompt", True)),
                        lora=tuple(LoraChoice(c["name"], _finite(c, "scale", -100, 100, 1.0)) for c in lora),
                        chat=obj.get("chat") if isinstance(obj.get("chat"), bool) else None,
                        alone=alone, threads=threads if alone else None)


#: Items of a list an adoption line names before it says how many more.
ADOPTED_SHOWN = 5


def _named(items: list[str]) -> str:
    shown = ", ".join(for_terminal(str(x), one_line=True)[:200] for x in items[:ADOPTED_SHOWN])
    return shown + (f", … {len(items) - ADOPTED_SHOWN} more" if len(items) > ADOPTED_SHOWN else "")


def adoption_lines(run: RecordedRun, *, read: Iterable[Any], fetch: Iterable[Any], limits: Limits,
                   live: bool = False, model: ModelRef | None = None, recorded_grants: bool = False) -> list[str]:
    """What a replay about to run with ``read``, ``fetch``, ``limits`` and (live) ``model`` took from its
    recording that lets the guest do more -- the grants and fetch prefixes (only with ``recorded_grants``),
    limits other than the defaults, the model it recorded -- and what it did not take: the recorded grants
    (a replay runs under none unless given), the recorded limits looser than the defaults; one inert line
    each."""
    lines = []
    if (model is not None and run.model_ref is not None and model.name and not model.served
            and model.kind == run.model_ref.kind and model.name == run.model_ref.name):
        adapters = f" with the adapters {_named([n for n, _ in model.loras])}" if model.loras else ""
        lines.append(f"replay: --live runs on the recorded model {model.label}{adapters} (--model replaces it)")
    read, fetch = [os.fspath(r) for r in read], [str(f) for f in fetch]
    asked = " (--recorded-grants takes them)" if live else ""
    if recorded_grants and read and set(read) <= set(run.read) | set(run.grants):
        lines.append(f"replay: reads under the recorded run's grants: {_named(read)} (--read replaces them)")
    elif not read and run.read:
        lines.append(f"replay: {'--live ' if live else ''}reads only what --read grants now; "
                     f"the recorded grants are not taken: {_named(list(run.read))}{asked}")
    if recorded_grants and fetch and set(fetch) <= set(run.fetch):
        lines.append(f"replay: may fetch under the recorded run's URL prefixes: {_named(fetch)} "
                     f"(--fetch replaces them)")
    elif not fetch and run.fetch:
        lines.append(f"replay: {'--live ' if live else ''}fetches only what --fetch grants now; "
                     f"the recorded URL prefixes are not taken: {_named(list(run.fetch))}{asked}")
    defaults = Limits()
    taken = {k: getattr(run.limits, k) for k in LIMIT_FIELDS if getattr(run.limits, k) != getattr(defaults, k)}
    refused = run.looser_limits
    changed = [f"{k} {v}" for k, v in taken.items() if getattr(limits, k) == v]
    if changed:
        lines.append(f"replay: limits from the recorded run: {_named(changed)}")
    looser = [f"{k} {v} (default {getattr(defaults, k)})" for k, v in refused.items() if getattr(limits, k) != v]
    if looser:
        lines.append(f"replay: recorded limits looser than the defaults are not taken: {_named(looser)}; "
                     f"give them again to use them")
    return [for_terminal(line, one_line=True) for line in lines]


def grants_line(read: Iterable[Any] | None, fetch: Iterable[Any] | None, *, recorded_grants: bool = False) -> str:
    """The one line a map replay says before it runs: what its items may read and fetch -- what ``--read`` and
    ``--fetch`` give (``read``, ``fetch``: None when not given), else nothing, or with ``recorded_grants`` each
    item's recorded grants."""
    def part(given: Iterable[Any] | None, flag: str, verb: str, nothing: str) -> str:
        if given is not None:
            named = [os.fspath(g) for g in given]
            return f"{verb} only what {flag} grants: {_named(named)}" if named else f"{nothing} ({flag} grants none)"
        if recorded_grants:
            return f"{verb} under its recorded run's grants (--recorded-grants)"
        return f"{nothing} ({flag} grants them)"

    reads = part(read, "--read", "reads", "reads no file")
    fetches = part(fetch, "--fetch", "fetches", "fetches no URL")
    return for_terminal(f"replay: each item {reads}, and {fetches}; a replay takes no grant from its recordings",
                        one_line=True)


def sampling_of(options: InferOptions) -> dict:
    return {"sampler": options.sampler.to_json(), "chat": options.chat,
            "lora": [{"name": c.name, "scale": c.scale} for c in options.lora]}


__all__ = [
    "ReplayError", "RecordedRun", "load_run", "replay_spec", "live_model", "live_model_needed", "embedded_model_will_do", "ADOPTED_SHOWN", "adoption_lines",
    "given_here", "grants_line",
    "sampling_of"
]

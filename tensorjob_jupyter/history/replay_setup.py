"""What a replay takes from its recording: ``RecordedRun``, the run's setup read once, and the replay's ``JobSpec``.

A replay re-runs a guest against a recorded run's world (``replay.py``).
Unless given anew, it takes the run's own setup from the transcript's
``job.created``: its input, grants, fetch prefixes, limits and sampling. A
transcript is a file from anywhere, so that setup is read once and checked
when the run is loaded (``load_run``, giving a ``RecordedRun`` -- typed
fields, never the raw dict again), and a limit the file records looser than
the defaults is not taken unless given again (``RecordedRun.limits``,
``looser_limits``). ``replay_spec`` builds the replay's ``JobSpec`` from it
with what was given in place, and ``adoption_lines`` says in a few lines
what a replay took, before it runs. ``RECORDED`` is the keyword value that
means "the run's own".
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from typing import Any, Iterable

from tensorjob_jupyter.abi import TensorjobError
from tensorjob_jupyter.inference.base import (
    LoraChoice, Sampler,
)
from tensorjob_jupyter.limits import FIELDS as LIMIT_FIELDS
from tensorjob_jupyter.limits import Limits
from tensorjob_jupyter.limits import check as limits_check
from tensorjob_jupyter.host.reactor import InferOptions
from tensorjob_jupyter.host.spec import JobSpec, parse_fields
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


# --- --------------------------------------------------------

_RECORDED: Any = type("Recorded", (), {"__repr__": lambda self: "RECORDED"})()
#: A keyword left as ``RECORDED`` takes the recorded run's value.
RECORDED = _RECORDED


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
            infer = _infer_options(created.get("infer") or {})
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ReplayError(f"{shown}: its job.created cannot be replayed: "
                              f"{for_terminal(str(e), one_line=True)[:200]}") from None
        cwd = created.get("cwd")
        server = created.get("model_server")
        return cls(recording, created.get("input"), lists["read"] or lists["grants"], lists["grants"],
                   lists["fetch"], cwd if isinstance(cwd, str) and os.path.isdir(cwd) else None, size, digest,
                   Limits(**taken), looser, infer, recording.model, server if isinstance(server, dict) else None,
                   required)

    @property
    def id(self) -> str:
        return self.recording.id

    @property
    def guest_sha256(self) -> str | None:
        return self.recording.guest.get("sha256")


def load_run(run: Any, runs: str | os.PathLike | None = None) -> RecordedRun:
    """The recorded run ``run`` (an id, a path, a ``Job``, a ``Recording`` or a ``RecordedRun``), ready to
    replay; ``ReplayError`` if it cannot be."""
    if isinstance(run, RecordedRun):
        return run
    return RecordedRun.of(run if isinstance(run, Recording) else Recording.read(resolve_run(run, runs)))


def replay_spec(guest: Any, run: RecordedRun, *, input: Any = RECORDED, read: Any = RECORDED,
                fetch: Any = RECORDED, infer: Any = RECORDED, limits: Any = RECORDED,
                input_bytes: bytes | None = None, model: Any = None, model_options: dict | None = None,
                runs_dir: str | os.PathLike | None = None, cwd: Any = RECORDED, name: str | None = None,
                debug: bool = False, break_on: Any = (), live: bool = False, recorded_grants: bool = False,
                require_grounded: Any = RECORDED, **limit_keywords: Any) -> JobSpec:
    """The ``JobSpec`` of a replay of ``guest`` against ``run``: each keyword left ``RECORDED`` is the run's own
    (``input``, ``read``, ``fetch``, ``infer``, ``limits`` -- limit keywords apply on top --, ``cwd`` and
    ``require_grounded``); ``input_bytes`` must be the bytes the run staged; ``model``: the model ``--live`` falls
    back to. A ``live`` replay takes the recorded ``read`` grants only with ``recorded_grants=True``: a transcript
    is a file from anywhere, and what it grants must never widen what a guest running live may read."""
    if read is RECORDED:
        read = run.read if recorded_grants or not live else ()
    return JobSpec.of(guest, input=run.input if input is RECORDED else input,
                      read=read, fetch=run.fetch if fetch is RECORDED else fetch,
                      infer=run.infer if infer is RECORDED else infer, limits=run.limits if limits is RECORDED else limits,
                      input_bytes=b"" if input_bytes is None else input_bytes, model=model, model_options=model_options,
                      runs_dir=runs_dir, cwd=run.cwd if cwd is RECORDED else cwd, name=name, debug=debug,
                      break_on=break_on,
                      require_grounded=run.require_grounded if require_grounded is RECORDED else require_grounded,
                      **limit_keywords)


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
    taken, refused = {}, {}
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
                   live: bool = False) -> list[str]:
    """What a replay about to run with ``read``, ``fetch`` and ``limits`` took from its recording that
    lets the guest do more -- the grants, the fetch prefixes, limits other than the defaults -- and the
    recorded limits it did not take (looser than the defaults), one inert line each."""
    lines = []
    read, fetch = [os.fspath(r) for r in read], [str(f) for f in fetch]
    if read and set(read) <= set(run.read) | set(run.grants):
        lines.append(f"replay: reads under the recorded run's grants: {_named(read)} (--read replaces them)")
    elif live and not read and run.read:
        lines.append(f"replay: --live reads only what --read grants now; the recorded grants are not taken: "
                     f"{_named(list(run.read))} (--recorded-grants takes them)")
    if fetch and set(fetch) <= set(run.fetch):
        lines.append(f"replay: may fetch under the recorded run's URL prefixes: {_named(fetch)} "
                     f"(--fetch replaces them)")
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


def sampling_of(options: InferOptions) -> dict:
    return {"sampler": options.sampler.to_json(), "chat": options.chat,
            "lora": [{"name": c.name, "scale": c.scale} for c in options.lora]}


__all__ = [
    "ReplayError", "RECORDED", "RecordedRun", "load_run", "replay_spec", "ADOPTED_SHOWN", "adoption_lines",
    "sampling_of"
]

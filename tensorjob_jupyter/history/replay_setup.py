"""What a replay takes from its recording: the run's input, grants, fetch prefixes, limits, sampling.

A replay re-runs a guest against a recorded run's world (``replay.py``);
unless given anew, it takes the run's own setup from the transcript's
``job.created``. A transcript is a file from anywhere, so this is checked
when the recording is loaded (``load_recording``), and a limit the file
records looser than the defaults is not taken unless the command line gives
it again (``recorded_limits``). ``adoption_lines`` says in a few lines what a
replay took, before it runs. ``RECORDED`` is the keyword value that means
"the run's own".
"""

from __future__ import annotations

import hashlib
import os
import re
from typing import Any, Iterable

from tensorjob_jupyter.abi import TensorjobError
from tensorjob_jupyter.inference.base import (
    LoraChoice, Sampler,
)
from tensorjob_jupyter.limits import FIELDS as LIMIT_FIELDS
from tensorjob_jupyter.limits import Limits
from tensorjob_jupyter.limits import check as limits_check
from tensorjob_jupyter.host.reactor import InferOptions
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


def load_recording(run: Any, runs: str | os.PathLike | None = None) -> Recording:
    """The recording of ``run`` (an id, a path, a ``Job`` or a ``Recording``), ready to replay."""
    if isinstance(run, Recording):
        recording = run
    else:
        recording = Recording.read(resolve_run(run, runs))
    if recording.version < 1:
        raise ReplayError(f"{for_terminal(recording.id, one_line=True)}: its transcript predates format version 1 "
                          f"and records no prompts, so it cannot be replayed (tensorjob show still shows it)")
    try:  # a transcript is a file from anywhere: check the setup replay reads from it, once
        recorded_limits(recording)
        recorded_infer_options(recording)
        created = recording.created
        for key in ("read", "grants", "fetch"):
            if not all(isinstance(x, str) for x in created.get(key) or []):
                raise ValueError(f"{key} is not a list of strings")
        staged = created.get("input_bytes") or {}
        if not isinstance(staged, dict):
            raise ValueError("input_bytes is not an object")
        size, digest = staged.get("bytes", 0), staged.get("sha256", _EMPTY_SHA256)
        if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= MAX_COUNT:
            raise ValueError("input_bytes.bytes is not a count")
        if not isinstance(digest, str) or not _SHA256.fullmatch(digest):
            raise ValueError("input_bytes.sha256 is not a SHA-256")
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise ReplayError(f"{for_terminal(recording.id, one_line=True)}: its job.created cannot be replayed: "
                          f"{for_terminal(str(e), one_line=True)[:200]}") from None
    return recording


def _looser(value: Any, default: Any) -> bool:
    """Whether a limit of ``value`` allows more than ``default`` (None: no bound at all)."""
    if value is None:
        return default is not None
    return default is not None and value > default


def _recorded_limit_values(recording: Recording) -> tuple[dict, dict]:
    """The run's limits split in two: those no looser than the defaults (taken), and the looser ones (not)."""
    values = recording.created.get("limits") or {}
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


def recorded_limits(recording: Recording) -> Limits:
    """The run's limits, none looser than the default: a transcript may claim any, so a looser one is used
    only when given again (a command-line flag, a keyword)."""
    return Limits(**_recorded_limit_values(recording)[0])


def recorded_looser_limits(recording: Recording) -> dict:
    """The run's limits that are looser than the defaults, which a replay does not take unless given again."""
    return _recorded_limit_values(recording)[1]


def _finite(obj: dict, name: str, low: float, high: float, default: float) -> float:
    value = obj.get(name, default)
    if type(value) not in (int, float) or not low <= value <= high:
        raise ValueError(f"infer.sampler.{name} is not a number from {low:g} to {high:g}")
    return value


def recorded_infer_options(recording: Recording) -> InferOptions:
    obj = recording.created.get("infer") or {}
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
    return InferOptions(sampler=Sampler(**known), cache_prompt=bool(obj.get("cache_prompt", True)),
                        lora=tuple(LoraChoice(c["name"], _finite(c, "scale", -100, 100, 1.0)) for c in lora),
                        chat=obj.get("chat") if isinstance(obj.get("chat"), bool) else None)


def recorded_read(recording: Recording) -> list[str]:
    """The grants as the run was given them (all their names), else its canonical roots."""
    created = recording.created
    return list(created.get("read") or created.get("grants") or [])


#: Items of a list an adoption line names before it says how many more.
ADOPTED_SHOWN = 5


def _named(items: list[str]) -> str:
    shown = ", ".join(for_terminal(str(x), one_line=True)[:200] for x in items[:ADOPTED_SHOWN])
    return shown + (f", … {len(items) - ADOPTED_SHOWN} more" if len(items) > ADOPTED_SHOWN else "")


def adoption_lines(recording: Recording, *, read: Iterable[Any], fetch: Iterable[Any], limits: Limits) -> list[str]:
    """What a replay about to run with ``read``, ``fetch`` and ``limits`` took from its recording that
    lets the guest do more -- the grants, the fetch prefixes, limits other than the defaults -- and the
    recorded limits it did not take (looser than the defaults), one inert line each."""
    lines = []
    created = recording.created
    read, fetch = [os.fspath(r) for r in read], [str(f) for f in fetch]
    recorded = set(recorded_read(recording)) | set(created.get("grants") or ())
    if read and set(read) <= recorded:
        lines.append(f"replay: reads under the recorded run's grants: {_named(read)} (--read replaces them)")
    if fetch and set(fetch) <= set(created.get("fetch") or ()):
        lines.append(f"replay: may fetch under the recorded run's URL prefixes: {_named(fetch)} "
                     f"(--fetch replaces them)")
    taken, refused = _recorded_limit_values(recording)
    defaults = Limits()
    changed = [f"{k} {v}" for k, v in taken.items() if v != getattr(defaults, k) and getattr(limits, k) == v]
    if changed:
        lines.append(f"replay: limits from the recorded run: {_named(changed)}")
    looser = [f"{k} {v} (default {getattr(defaults, k)})" for k, v in refused.items() if getattr(limits, k) != v]
    if looser:
        lines.append(f"replay: recorded limits looser than the defaults are not taken: {_named(looser)}; "
                     f"give them again to use them")
    return [for_terminal(line, one_line=True) for line in lines]


def recorded_cwd(recording: Recording) -> str | None:
    """The run's directory (guest paths are relative to it), if it exists here."""
    cwd = recording.created.get("cwd")
    return cwd if isinstance(cwd, str) and os.path.isdir(cwd) else None


def sampling_of(options: InferOptions) -> dict:
    return {"sampler": options.sampler.to_json(), "chat": options.chat,
            "lora": [{"name": c.name, "scale": c.scale} for c in options.lora]}



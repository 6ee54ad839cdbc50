"""Requirements: what a job asks of its result's fields, and the fields it rejects.

``--require-grounded FIELDS`` asks that each named field be grounded in what the job read (``grounding.grounds``);
``--require-present FIELDS`` that each named field hold a value. A null (or blank text) claims nothing, so it is
never ungrounded: only ``--require-present`` fails it. A field that is present but not grounded is **rejected
alone**: the job completes, its envelope says why (``rejected``: path -> one line), the tables show it null in
``final.FIELD`` and the rest of the result stays. ``--fail-item`` fails the whole job instead (code
``ungrounded``), as one bad field made it before. A missing field, a null that must be present, or an object or
array too large to check whole fails the job either way: there is no field to reject.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from tensorjob_jupyter import abi
from tensorjob_jupyter.abi import JobFailure, codes
from tensorjob_jupyter.host.fields import MAX_FIELDS, MISSING, child_path, result_fields, value_at
from tensorjob_jupyter.host.grounding import (
    DEFAULT_BOUNDS, FUZZY, Bounds, claims, grounds, locate, source_label,
)
from tensorjob_jupyter.host.windows import ReadWindows
from tensorjob_jupyter.text import clip

log = logging.getLogger("tensorjob_jupyter")


@dataclass(frozen=True)
class Requirements:
    """What a job requires of its result: fields grounded, fields present, and whether a field that is not
    grounded fails the job (``fail_item``) or is rejected alone."""

    grounded: tuple[str, ...] = ()
    present: tuple[str, ...] = ()
    fail_item: bool = False

    def __bool__(self) -> bool:
        return bool(self.grounded or self.present)


def check_present(result: Any, present: Sequence[str]) -> None:
    """``JobFailure`` (``ungrounded``) for the first field of ``present`` that is missing or holds no value."""
    for name in present:
        shown = clip(name, 200)
        value = value_at(result, name)
        if value is MISSING:
            raise JobFailure(codes.UNGROUNDED, f"the result has no field `{shown}` (require_present)")
        leaves = list(result_fields(value, limit=MAX_FIELDS))
        if not leaves:
            raise JobFailure(codes.UNGROUNDED, f"field `{shown}` of the result holds no value (require_present)")
        for rel, leaf in leaves:
            if not claims(leaf):
                raise JobFailure(codes.UNGROUNDED, f"field `{clip(child_path(name, rel), 200)}` of the result is "
                                                   f"{abi.dumps(leaf)} (require_present)")


def rejections(result: Any, sources: dict[str, list[dict]], grounded: Sequence[str]) -> dict[str, str]:
    """Each field of ``grounded`` (a field, or every field of an object or array) that holds a value but is not
    grounded, with why in one line, in the order named. Raises ``JobFailure`` (``ungrounded``) for what no
    rejection can answer: a field the result lacks, an object or array of more than ``MAX_FIELDS`` values."""
    out: dict[str, str] = {}
    for name in grounded:
        shown = clip(name, 200)
        value = value_at(result, name)
        if value is MISSING:
            raise JobFailure(codes.UNGROUNDED, f"the result has no field `{shown}`, which must be found in what the "
                                               f"job read (require_grounded)")
        leaves = list(result_fields(value, limit=MAX_FIELDS + 1))
        if len(leaves) > MAX_FIELDS:
            raise JobFailure(codes.UNGROUNDED, f"field `{shown}` of the result holds more than {MAX_FIELDS} values, "
                                               f"more than the locator checks (require_grounded: name a part of it)")
        for rel, leaf in leaves:
            path = child_path(name, rel)
            if not claims(leaf) or path in out:
                continue  # a null claims nothing: only require_present fails it
            why = _not_grounded(path, leaf, sources.get(path))
            if why is not None:
                out[path] = why
    return out


def _not_grounded(path: str, leaf: Any, found: list[dict] | None) -> str | None:
    what, value = f"field `{clip(path, 200)}`", clip(abi.dumps(leaf), 80)
    if found is None:
        return f"{what} = {value} could not be looked for within the locator's bounds (require_grounded)"
    if not found:
        return (f"{what} = {value} was found in no window the job read (require_grounded; a value rephrased or "
                f"computed is not found either)")
    if grounds(found):
        return None
    best = found[0]
    how = (f"only under a label that names another field ({clip(best.get('label') or '', 40)!r} names "
           f"{best.get('under')})" if best.get("elsewhere")
           else f"only a fuzzy match (similarity {best.get('score')})" if best.get("match") == FUZZY
           else "only as a spelling that reads as another value too")
    return f"{what} = {value} was found {how}, at {source_label(best)}: not the value itself (require_grounded)"


def require_grounded(result: Any, sources: dict[str, list[dict]], required: Sequence[str]) -> None:
    """``JobFailure`` (``ungrounded``) for the first field of ``required`` that is not grounded (``--fail-item``)."""
    rejected = rejections(result, sources, required)
    if rejected:
        raise JobFailure(codes.UNGROUNDED, next(iter(rejected.values())))


def ground(result: Any, windows: ReadWindows, required: Requirements = Requirements(), *,
           bounds: Bounds = DEFAULT_BOUNDS,
           check: Callable[[], None] | None = None) -> tuple[dict[str, list[dict]] | None, dict[str, str]]:
    """A completed job's sources (``locate`` over ``windows``, under the job's ``check``) and the fields it
    rejects (see the module doc). The job's own failure (cancelled, past its deadline) passes through; a bug in
    locating leaves the job's sources out (None) and goes to the log, unless fields are required: then it is
    the job's failure."""
    check_present(result, required.present)
    try:
        sources = locate(result, windows.segments(), first=required.grounded, bounds=bounds, check=check)
    except JobFailure:
        raise
    except Exception:  # noqa: BLE001 - a locator bug must not take a completed job's result away
        if required.grounded:
            raise
        log.exception("tensorjob: could not locate the result's fields")
        return None, {}
    if required.fail_item:
        require_grounded(result, sources, required.grounded)
        return sources, {}
    rejected = rejections(result, sources, required.grounded)
    for path, why in rejected.items():
        if any(path == name or path.startswith(name + ".") or not name for name in required.present):
            raise JobFailure(codes.UNGROUNDED, f"{why}; it must be present too (require_present), so the item "
                                               f"fails")
    return sources, rejected


__all__ = ["Requirements", "check_present", "rejections", "require_grounded", "ground"]

"""Scorers: how well each item of a map answered, and the running score of a map as it runs.

    result = tj.map("extract.py", "reports.jsonl", "runs/reports", read=["reports"],
                    expected="answers.jsonl", scorer="json_fields")
    result.score_summary()                 # mean, passed, failed, per-field accuracy (``score_summary``)

A scorer (``exact``, ``json_fields``, ``contains`` or a Python function) gives each labelled item (``expected``)
a score from 0 to 1; ``Scoring`` scores each item as it concludes and keeps the tally and ``scores.jsonl``.
Scores are derived data, scored again each session from the run folder's results.

Design: docs/internals/fanout.md#scoringpy
"""

from __future__ import annotations

import json
import math
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from tensorjob_jupyter.abi import dumps
from tensorjob_jupyter.fanout.errors import ResumeRefused, ScoringError
from tensorjob_jupyter.fanout.expected import Expected, is_item_number, json_kind
from tensorjob_jupyter.fanout.map_folder import fsync_write  # the folder's one atomic writer
from tensorjob_jupyter.fanout.map_folder_reader import (  # every file of the folder read back through its one reader
    EXPECTED, FAILURES, LEDGER, RESULTS, SCORES, SCORING, FolderError, read_folder_json, read_ledger, read_records,
)
from tensorjob_jupyter.host.fields import field_path

SCORING_FORMAT = "tensorjob-scoring/1"
#: Characters of a scorer's error message kept for a row.
MAX_ERROR_CHARS = 300
#: Fields of one item's verdict kept (a hostile expected object cannot make a row unbounded).
MAX_FIELDS = 256
#: The largest ``scoring.json`` read back (it names a scorer and a hash).
MAX_SCORING_JSON_BYTES = 64 * 1024


@dataclass(frozen=True)
class Scored:
    """A score with the verdict of each field; what ``json_fields`` and ``contains`` give, and what a
    Python scorer may return to report fields of its own."""

    value: float
    fields: Mapping[str, bool] | None = None


@dataclass(frozen=True)
class ItemScore:
    """One item's score: ``score`` None when it could not be scored (``error`` says why)."""

    item: int
    score: float | None
    fields: dict[str, bool] | None = None
    error: str | None = None

    @property
    def passed(self) -> bool:
        return self.score is not None and self.score >= 1.0

    def to_json(self) -> dict:
        out: dict[str, Any] = {"item": self.item, "score": self.score}
        if self.fields is not None:
            out["fields"] = self.fields
        if self.error is not None:
            out["error"] = self.error
        return out

    @classmethod
    def from_json(cls, record: dict, total: int) -> "ItemScore":
        """A record of ``scores.jsonl``, checked (``ValueError`` when it is not one scoring wrote)."""
        item, score, fields, error = record.get("item"), record.get("score"), record.get("fields"), record.get("error")
        if not is_item_number(item, total):
            raise ValueError("no item number in range")
        if score is not None and not _is_score(score):
            raise ValueError("a score that is not a number from 0 to 1")
        if fields is not None and not (isinstance(fields, dict) and len(fields) <= MAX_FIELDS
                                       and all(isinstance(v, bool) for v in fields.values())):
            raise ValueError("fields that are not names and true or false")
        if error is not None and not isinstance(error, str):
            raise ValueError("an error that is not text")
        return cls(item, None if score is None else float(score), fields, error[:MAX_ERROR_CHARS] if error else error)


# --- comparing JSON values --------------------------------------------------------------------------------


def same(a: Any, b: Any) -> bool:
    """Whether two JSON values are equal as JSON: numbers by value (``1 == 1.0``), but a boolean is never a
    number (``true != 1``, which Python's ``==`` says they are)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if a is None or b is None:
        return a is None and b is None
    return type(a) is type(b) and a == b


def leaves(value: dict, path: tuple[str, ...] = ()) -> Iterator[tuple[str, tuple[str, ...], Any]]:
    """An object's leaves, as (name, path, value): a non-empty object is gone into, anything else (a list, a
    number, an empty object) is a leaf. The name is the leaf's field path (``host.fields``: keys joined by
    ``.``, a key holding ``.`` or ``\\`` escaped), so ``{"a.b": 1}`` and ``{"a": {"b": 1}}`` name two fields
    (``a\\.b`` and ``a.b``), each the one its source, confidence and table columns are named by."""
    for key, item in value.items():
        here = (*path, str(key))
        if isinstance(item, dict) and item:
            yield from leaves(item, here)
        else:
            yield field_path(here), here, item


def verdict_paths(scorer: str, expected: Any) -> dict[str, str]:
    """The field path (``host.fields``, what sources and confidence are keyed by) of each verdict name: for
    ``json_fields`` each expected leaf's -- its name, which is its path (``leaves``); for another scorer none
    (a verdict's name is then taken as a path itself)."""
    if scorer != "json_fields" or not isinstance(expected, dict):
        return {}
    return {name: field_path(path) for name, path, _value in leaves(expected)}


_MISSING = object()


def value_at(value: Any, path: Sequence[str]) -> Any:
    """The value at ``path`` in nested objects, or ``_MISSING``."""
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return _MISSING
        value = value[key]
    return value


# --- the built-in scorers ---------------------------------------------------------------------------------


def exact(result: Any, expected: Any) -> float:
    """1 when the result is the expected value (as JSON), else 0."""
    return 1.0 if same(result, expected) else 0.0


def json_fields(result: Any, expected: Any) -> Scored:
    """The share of the expected object's leaves that the result has, each exactly; every field's verdict."""
    if not isinstance(expected, dict):
        raise ValueError(f"json_fields needs an object as the expected answer, not {json_kind(expected)}")
    if isinstance(result, str):
        try:
            parsed = json.loads(result)
        except ValueError:
            parsed = None
        result = parsed if isinstance(parsed, dict) else result
    fields: dict[str, bool] = {}
    for name, path, want in leaves(expected):
        got = value_at(result, path)
        fields[name] = got is not _MISSING and same(got, want)
    if not fields:
        return Scored(1.0, {})
    return Scored(sum(fields.values()) / len(fields), fields)


def contains(result: Any, expected: Any) -> Scored:
    """The share of the expected texts found in the result (its JSON when it is not a string), ignoring case."""
    texts = [expected] if isinstance(expected, str) else expected
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise ValueError(f"contains needs a string or a list of strings as the expected answer, "
                         f"not {json_kind(expected)}")
    haystack = (result if isinstance(result, str) else dumps(result)).casefold()
    fields = {t: t.casefold() in haystack for t in texts}
    return Scored(sum(fields.values()) / len(fields), fields if len(texts) > 1 else None)


def _fields_missed(expected: Any) -> dict[str, bool] | None:
    if isinstance(expected, dict):
        return {name: False for name, _path, _value in leaves(expected)}
    return None


def _texts_missed(expected: Any) -> dict[str, bool] | None:
    if isinstance(expected, list) and len(expected) > 1 and all(isinstance(t, str) for t in expected):
        return {t: False for t in expected}
    return None


@dataclass(frozen=True)
class Scorer:
    """A scorer with its name; ``missed`` gives the fields a failed item misses (built-ins with fields)."""

    name: str
    fn: Callable[[Any, Any], Any]
    builtin: bool = False
    missed: Callable[[Any], dict[str, bool] | None] = lambda expected: None


BUILTINS: dict[str, Scorer] = {
    "exact": Scorer("exact", exact, True),
    "json_fields": Scorer("json_fields", json_fields, True, _fields_missed),
    "contains": Scorer("contains", contains, True, _texts_missed),
}
DEFAULT_SCORER = "exact"


def scorer_of(spec: "str | Callable | Scorer | None") -> Scorer:
    """A scorer by name (``exact``, ``json_fields``, ``contains``; None is ``exact``) or a Python function."""
    if isinstance(spec, Scorer):
        return spec
    if spec is None:
        return BUILTINS[DEFAULT_SCORER]
    if isinstance(spec, str):
        try:
            return BUILTINS[spec.strip()]
        except KeyError:
            raise ScoringError(f"unknown scorer {spec!r}: the built-in ones are {', '.join(BUILTINS)}, "
                               f"or pass a Python function (result, expected) -> score") from None
    if callable(spec):
        module = getattr(spec, "__module__", None) or ""
        name = getattr(spec, "__qualname__", None) or type(spec).__name__
        return Scorer(f"python:{module}.{name}" if module else f"python:{name}", spec)
    raise ScoringError(f"a scorer is a name ({', '.join(BUILTINS)}) or a function (result, expected) -> score, "
                       f"not {type(spec).__name__}")


def score_item(scorer: Scorer, item: int, completed: bool, result: Any, expected: Any) -> ItemScore:
    """One concluded item's score; never raises (a scorer's failure is the item's ``error``)."""
    if not completed:
        try:
            missed = scorer.missed(expected)
        except Exception:  # noqa: BLE001 - only the fields are lost
            missed = None
        return ItemScore(item, 0.0, missed)
    try:
        got = scorer.fn(result, expected)
    except Exception as e:  # noqa: BLE001 - the scorer's failure is this item's, never the map's
        return ItemScore(item, None, None, _clip(f"{type(e).__name__}: {e}"))
    except (SystemExit, KeyboardInterrupt) as e:
        # A scorer that calls sys.exit, or raises KeyboardInterrupt off the main thread (where no Ctrl-C can
        # land), ends its own item, not the map; a Ctrl-C on the main thread still stops everything.
        if isinstance(e, KeyboardInterrupt) and threading.current_thread() is threading.main_thread():
            raise
        return ItemScore(item, None, None, _clip(f"the scorer raised {type(e).__name__}"
                                                 + (f": {e}" if str(e) else "")))
    fields: dict[str, bool] | None = None
    if isinstance(got, Scored):
        given = got.fields
        got = got.value
        if given is not None:
            if not isinstance(given, Mapping) or not all(isinstance(v, bool) for v in given.values()):
                return ItemScore(item, None, None, "the scorer's fields are not names and True or False")
            fields = {str(k): v for k, v in list(given.items())[:MAX_FIELDS]}
    if isinstance(got, bool):
        return ItemScore(item, 1.0 if got else 0.0, fields)
    if not _is_score(got):
        return ItemScore(item, None, None, _clip(f"the scorer gave {got!r}: a score is a number from 0 to 1, "
                                                 f"or True or False"))
    return ItemScore(item, float(got), fields)


# --- the scores a run folder keeps, read back -------------------------------------------------------------


def read_scores(run_dir: Path, total: int) -> dict[int, ItemScore] | None:
    """The scores a run folder keeps, by item; None when it keeps none."""
    path = run_dir / SCORES
    if not os.path.lexists(path):
        return None
    scores: dict[int, ItemScore] = {}
    try:
        records = read_records(path, total=total)
    except FolderError as e:  # one line naming the file and the line
        raise ScoringError(str(e)) from None
    for number, record in enumerate(records, start=1):
        try:
            score = ItemScore.from_json(record, total)
        except ValueError as e:
            raise ScoringError(f"{path}: line {number} is not a score this map wrote ({e})") from None
        scores[score.item] = score
    return scores


def scorer_name(run_dir: Path) -> str | None:
    """The name of the scorer a run folder was scored with (``scoring.json``), or None."""
    try:
        info = read_folder_json(run_dir / SCORING, MAX_SCORING_JSON_BYTES)
    except FolderError:
        return None
    name = info.get("scorer") if isinstance(info, dict) else None
    return name[:200] if isinstance(name, str) else None


# --- scoring a map as it runs -----------------------------------------------------------------------------


class Scoring:
    """A map's scorer and expected answers, and the score of every concluded item so far.

    ``MapRun`` calls ``begin`` once the run folder is open (the items concluded in earlier sessions are
    scored then), ``add`` as each item concludes, and ``finish`` at the end; all on the map's thread.
    """

    def __init__(self, scorer: Scorer, expected: Expected):
        self.scorer = scorer
        self.expected = expected
        self.scores: dict[int, ItemScore] = {}
        self._tally = [0, 0.0, 0]  # scored, sum of scores, passed: kept as items are scored

    @classmethod
    def of(cls, expected: Any, scorer: Any, total: int, run_dir: str | os.PathLike | None,
           keys: "Callable[[], Sequence[str]] | None" = None, manifest_sha256: str | None = None
           ) -> "Scoring | None":
        """The scoring a map asks for. With no expected answers: those ``run_dir`` keeps (None: a folder
        started over keeps none, and a folder of another manifest -- ``manifest_sha256`` -- is not read
        here: the run folder refuses it, saying so), with ``scorer`` or else the folder's own when it is a
        built-in one (see the module doc); None when there is nothing to score against. ``keys``: the
        manifest's item keys, for expected answers given by key."""
        if expected is not None:
            return cls(scorer_of(scorer), Expected.read(expected, total, keys))
        folder = Path(run_dir).absolute() if run_dir is not None else None
        if folder is not None and manifest_sha256 is not None and not _same_manifest(folder, manifest_sha256):
            folder = None
        found = Expected.from_folder(folder, total) if folder is not None else None
        if scorer is not None:
            if found is None:
                raise ScoringError("a scorer needs expected answers (expected=, --expected FILE.jsonl)")
            return cls(scorer_of(scorer), found)
        if folder is None or found is None:
            return None
        name = scorer_name(folder)
        return cls(BUILTINS[name], found) if name in BUILTINS else None

    def begin(self, run_dir: Path) -> None:
        """Keep the expected answers in the folder, and score the items it holds already."""
        run_dir = Path(run_dir)
        if Path(self.expected.source) != run_dir / EXPECTED:
            self.expected.write(run_dir)
        fsync_write(run_dir / SCORING, json.dumps({"format": SCORING_FORMAT, "scorer": self.scorer.name,
                                                   "builtin": self.scorer.builtin,
                                                   "expected": {"source": self.expected.source,
                                                                "sha256": self.expected.sha256,
                                                                "items": len(self.expected)}}, indent=2) + "\n")
        total = self.expected.total
        for record in read_records(run_dir / RESULTS, total=total):
            self.add(record["item"], True, record.get("result"))
        for record in read_records(run_dir / FAILURES, total=total):
            if record["item"] not in self.scores:
                self.add(record["item"], False, None)

    def add(self, item: int, completed: bool, result: Any) -> ItemScore | None:
        """Score one concluded item (None: it has no expected answer)."""
        has, expected = self.expected.get(item)
        if not has:
            return None
        self._count(self.scores.get(item), -1)
        score = self.scores[item] = score_item(self.scorer, item, completed, result, expected)
        self._count(score, 1)
        return score

    def _count(self, score: ItemScore | None, sign: int) -> None:
        if score is not None and score.score is not None:
            self._tally[0] += sign
            self._tally[1] += sign * score.score
            self._tally[2] += sign * score.passed

    def tally(self) -> dict:
        """The running score, as ``MapProgress`` fields: items scored, the sum of their scores, how many passed."""
        scored, total, passed = self._tally
        return {"scored": scored, "score_sum": total if scored else 0.0, "score_passed": passed}

    def finish(self, run_dir: Path) -> None:
        fsync_write(Path(run_dir) / SCORES,
                    "".join(dumps(self.scores[i].to_json()) + "\n" for i in sorted(self.scores)))


def _same_manifest(run_dir: Path, manifest_sha256: str) -> bool:
    """Whether ``run_dir`` holds a map of this manifest (or no map at all: nothing of another one to read)."""
    if not os.path.lexists(run_dir / LEDGER):
        return True
    try:
        return read_ledger(run_dir)["manifest_sha256"] == manifest_sha256
    except ResumeRefused:
        return False  # not a ledger: the run folder says so when it is opened


def _is_score(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            and 0.0 <= value <= 1.0)


def _clip(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS - 1] + "…"


__all__ = [
    "SCORING_FORMAT", "MAX_ERROR_CHARS", "MAX_FIELDS", "MAX_SCORING_JSON_BYTES", "Scored", "ItemScore", "same",
    "leaves", "value_at", "verdict_paths", "exact", "json_fields", "contains", "Scorer", "BUILTINS", "DEFAULT_SCORER",
    "scorer_of", "score_item", "read_scores", "scorer_name", "Scoring",
]

"""Expected answers and scorers: how well each item of a map answered, item by item and in all.

    result = tj.map("extract.py", "reports.jsonl", "runs/reports", read=["reports"],
                    expected="answers.jsonl", scorer="json_fields")
    result.score_summary()                 # mean, passed, failed, per-field accuracy
    result.to_pandas()[["score", "score.facts.year"]]

**Expected answers** are one per item, numbered as the manifest numbers its items: a JSONL file whose
i-th non-blank line is item i's expected value (read and checked as a manifest is, and it must have as
many values as the manifest has items), a list in item order, or a dict ``{item: value}`` for some items.
An item with no expected answer is not scored.

**Scorers** take ``(result, expected)`` and give a score from 0 to 1:

* ``exact``: 1 when the result is the expected value, as JSON (``1`` and ``1.0`` are equal, ``true`` and
  ``1`` are not), else 0.
* ``json_fields``: the expected value is an object, and each of its leaves (``facts.year`` for
  ``{"facts": {"year": 1894}}``) is compared exactly with the result's value at the same place; the score is
  the share that match, and each field's verdict is kept (the ``score.facts.year`` columns, the per-field
  accuracy). A result that is a string holding a JSON object is parsed first.
* ``contains``: the expected text -- or each of a list of texts -- occurs in the result (a string, or the
  result as JSON), ignoring case; the score is the share found, each text a field.
* any Python function ``(result, expected) -> float | bool`` (or a ``Scored``, to report fields), run in
  this process, on the map's thread, as each item concludes: keep it quick. A score outside [0, 1], or a
  function that raises, is that item's ``score_error`` and the map goes on.

A failed item scores 0 (and misses every field). An item *passes* when its score is 1.

Scores are derived data: each session of a map scores every concluded item again from ``results.jsonl``
and ``failures.jsonl``, so a changed scorer or expected file on resume rescores the whole folder. What the
run folder keeps, written by the map's own thread:

    expected.jsonl   {"item": i, "expected": value} for each item that has an expected answer
    scoring.json     the scorer's name and the expected answers' SHA-256
    scores.jsonl     {"item": i, "score": s, "fields": {...}, "error": ...} per scored item, in item order,
                     rewritten whole as each session ends

A session given no expected answers scores with the folder's own when they were scored by a built-in
scorer (a Python function cannot be named in a file). Everything read back from these files is checked
like the rest of a run folder: it may come from anywhere.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

from tensorjob_jupyter.abi import dumps
from tensorjob_jupyter.fanout.errors import MapError, TooManyItems
from tensorjob_jupyter.fanout.folder import _fsync_write as fsync_write  # the folder's one atomic writer
from tensorjob_jupyter.fanout.folder_reader import (  # every file of the folder read back through its one reader
    FAILURES, RESULTS, SCORING_FILES, FolderError, read_folder_json, read_records,
)
from tensorjob_jupyter.fanout.manifest import read_manifest

EXPECTED, SCORING, SCORES = SCORING_FILES  # a restarted run folder loses them with the rest
SCORING_FORMAT = "tensorjob-scoring/1"
#: Characters of a scorer's error message kept for a row.
MAX_ERROR_CHARS = 300
#: Fields of one item's verdict kept (a hostile expected object cannot make a row unbounded).
MAX_FIELDS = 256
#: The largest ``scoring.json`` read back (it names a scorer and a hash).
MAX_SCORING_JSON_BYTES = 64 * 1024


class ScoringError(MapError):
    """Expected answers or a scorer that cannot be used: one line, before any item runs."""


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
        if not _is_index(item, total):
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
    """An object's leaves, as (dotted name, path, value): a non-empty object is gone into, anything else
    (a list, a number, an empty object) is a leaf."""
    for key, item in value.items():
        here = (*path, str(key))
        if isinstance(item, dict) and item:
            yield from leaves(item, here)
        else:
            yield ".".join(here), here, item


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
        raise ValueError(f"json_fields needs an object as the expected answer, not {_kind(expected)}")
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
        raise ValueError(f"contains needs a string or a list of strings as the expected answer, not {_kind(expected)}")
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
    fields = None
    if isinstance(got, Scored):
        got, fields = got.value, got.fields
        if fields is not None:
            if not isinstance(fields, Mapping) or not all(isinstance(v, bool) for v in fields.values()):
                return ItemScore(item, None, None, "the scorer's fields are not names and True or False")
            fields = {str(k): v for k, v in list(fields.items())[:MAX_FIELDS]}
    if isinstance(got, bool):
        return ItemScore(item, 1.0 if got else 0.0, fields)
    if not _is_score(got):
        return ItemScore(item, None, None, _clip(f"the scorer gave {got!r}: a score is a number from 0 to 1, "
                                                 f"or True or False"))
    return ItemScore(item, float(got), fields)


# --- expected answers -------------------------------------------------------------------------------------


class Expected:
    """One expected answer for each of some items: ``get(i)`` is (True, value) or (False, None)."""

    def __init__(self, values: Mapping[int, Any] | Sequence[Any], total: int, source: str, sha256: str):
        self._values = values
        self.total = total
        self.source = source
        self.sha256 = sha256

    def get(self, item: int) -> tuple[bool, Any]:
        if isinstance(self._values, Mapping):
            return (True, self._values[item]) if item in self._values else (False, None)
        return (True, self._values[item]) if 0 <= item < len(self._values) else (False, None)

    def items(self) -> Iterator[tuple[int, Any]]:
        if isinstance(self._values, Mapping):
            for item in sorted(self._values):
                yield item, self._values[item]
        else:
            yield from enumerate(self._values)

    def __len__(self) -> int:
        return len(self._values)

    @classmethod
    def read(cls, spec: Any, total: int) -> "Expected":
        """Expected answers for a map of ``total`` items: a JSONL file or a list (one value per item, in
        item order), or a dict {item: value}; ``ScoringError`` naming what is wrong."""
        if isinstance(spec, Expected):
            if spec.total != total:
                raise ScoringError(f"the expected answers are for {spec.total} items; this map has {total}")
            return spec
        if isinstance(spec, Mapping):
            values: dict[int, Any] = {}
            for key, value in spec.items():
                index = int(key) if isinstance(key, str) and key.strip().isdigit() else key
                if not _is_index(index, total):
                    raise ScoringError(f"expected answer for item {key!r}: the items are numbered 0 to {total - 1}")
                if index in values:
                    raise ScoringError(f"two expected answers for item {index}")
                values[index] = value
            data = _records_jsonl((i, values[i]) for i in sorted(values))
            return cls(values, total, "<dict>", hashlib.sha256(data).hexdigest())
        if isinstance(spec, (str, os.PathLike, Sequence)) and not isinstance(spec, (bytes, bytearray)):
            if isinstance(spec, Sequence) and not isinstance(spec, str) and len(spec) != total:
                raise ScoringError(f"expected answers: {len(spec)} values for a manifest of {total} items (one "
                                   f"expected value an item, in the manifest's order)")
            try:  # a file of more values than items is refused at the first extra one, the rest unread
                manifest = read_manifest(spec, max_items=total)
            except MapError as e:  # its words are a manifest's: say whose they are
                if isinstance(e, TooManyItems):
                    raise ScoringError(f"expected answers {Path(spec).absolute()}: more than {total} values for a "
                                       f"manifest of {total} items (line {e.line}; one expected value a line, in "
                                       f"the manifest's order)") from None
                raise ScoringError("expected answers: " + str(e).replace("manifest ", "", 1)) from None
            if len(manifest) != total:
                raise ScoringError(f"expected answers {manifest.source}: {len(manifest)} values for a manifest of "
                                   f"{total} items (one expected value a line, in the manifest's order)")
            return cls(manifest.items, total, manifest.source, manifest.sha256)
        raise ScoringError(f"expected answers are a JSONL file, a list or a dict {{item: value}}, "
                           f"not {type(spec).__name__}")

    @classmethod
    def from_folder(cls, run_dir: Path, total: int) -> "Expected | None":
        """The expected answers a run folder keeps (``expected.jsonl``), checked; None without them."""
        path = run_dir / EXPECTED
        if not os.path.lexists(path):
            return None
        values: dict[int, Any] = {}
        try:
            records = read_records(path, total=total)
        except FolderError as e:  # one line naming the file and the line
            raise ScoringError(str(e)) from None
        for record in records:
            item = record["item"]
            if item in values:
                raise ScoringError(f"{path}: a record that scoring did not write (item {item!r} twice)")
            values[item] = record["expected"]
        # the SHA-256 of the file as scoring writes it (the same bytes, for a file it wrote)
        return cls(values, total, str(path), hashlib.sha256(_records_jsonl(sorted(values.items()))).hexdigest())

    def write(self, run_dir: Path) -> None:
        fsync_write(run_dir / EXPECTED, _records_jsonl(self.items()).decode("utf-8"))


def _records_jsonl(pairs: Iterable[tuple[int, Any]]) -> bytes:
    return "".join(dumps({"item": i, "expected": v}) + "\n" for i, v in pairs).encode("utf-8")


# --- the summary ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ScoreSummary:
    """A map's scores in all: ``mean`` over the scored items, how many passed and failed, and each field's
    accuracy (the share of items that got it right; a failed item misses them all)."""

    scorer: str
    items: int  # items in the map
    scored: int  # concluded items with an expected answer and a score
    mean: float | None
    passed: int
    failed: int  # scored, and under 1 (failed items among them)
    errors: int  # the scorer could not score them (score_error)
    unscored: int  # no expected answer, not concluded, or an error
    fields: dict[str, float] = field(default_factory=dict)

    @classmethod
    def of(cls, scorer: str, items: int, scores: Iterable[ItemScore]) -> "ScoreSummary":
        scored = passed = errors = 0
        total = 0.0
        right: dict[str, int] = {}
        seen: dict[str, int] = {}
        for s in scores:
            if s.score is None:
                errors += 1
                continue
            scored += 1
            total += s.score
            passed += s.passed
            for name, ok in (s.fields or {}).items():
                seen[name] = seen.get(name, 0) + 1
                right[name] = right.get(name, 0) + ok
        return cls(scorer, items, scored, total / scored if scored else None, passed, scored - passed, errors,
                   items - scored, {name: right[name] / seen[name] for name in seen})

    def lines(self) -> list[str]:
        """The summary in a few lines (deterministic: no times, no paths)."""
        if not self.scored:
            return [f"score ({self.scorer}): no item scored yet ({self.unscored} of {self.items} without a score)"]
        out = [f"score ({self.scorer}): mean {self.mean:.3f} over {self.scored} items; {self.passed} passed, "
               f"{self.failed} failed" + (f", {self.errors} could not be scored" if self.errors else "")
               + (f", {self.unscored - self.errors} not scored" if self.unscored - self.errors else "")]
        out += [f"  {name}: {accuracy:.3f}" for name, accuracy in self.fields.items()]
        return out

    def to_json(self) -> dict:
        return {"scorer": self.scorer, "items": self.items, "scored": self.scored,
                "mean": None if self.mean is None else round(self.mean, 6), "passed": self.passed,
                "failed": self.failed, "errors": self.errors, "unscored": self.unscored,
                "fields": {k: round(v, 6) for k, v in self.fields.items()}}

    def __str__(self) -> str:
        return "\n".join(self.lines())


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
    def of(cls, expected: Any, scorer: Any, total: int, run_dir: str | os.PathLike | None) -> "Scoring | None":
        """The scoring a map asks for. With no expected answers: those ``run_dir`` keeps (None: a folder
        started over keeps none), with ``scorer`` or else the folder's own when it is a built-in one (see
        the module doc); None when there is nothing to score against."""
        if expected is not None:
            return cls(scorer_of(scorer), Expected.read(expected, total))
        folder = Path(run_dir).absolute() if run_dir is not None else None
        found = Expected.from_folder(folder, total) if folder is not None else None
        if scorer is not None:
            if found is None:
                raise ScoringError("a scorer needs expected answers (expected=, --expected FILE.jsonl)")
            return cls(scorer_of(scorer), found)
        name = scorer_name(folder) if found is not None else None
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


def _is_index(value: Any, total: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < total


def _is_score(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            and 0.0 <= value <= 1.0)


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number")


def _clip(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS - 1] + "…"


__all__ = [
    "SCORING_FORMAT", "MAX_ERROR_CHARS", "MAX_FIELDS", "MAX_SCORING_JSON_BYTES", "ScoringError", "Scored", "ItemScore", "same", "leaves",
    "value_at", "exact", "json_fields", "contains", "Scorer", "BUILTINS", "DEFAULT_SCORER", "scorer_of", "score_item",
    "Expected", "ScoreSummary", "read_scores", "scorer_name", "Scoring"
]

"""Expected answers and scorers: how well each item of a map answered, item by item and in all.

    result = tj.map("extract.py", "reports.jsonl", "runs/reports", read=["reports"],
                    expected="answers.jsonl", scorer="json_fields")
    result.score_summary()                 # mean, passed, failed, per-field accuracy

Expected answers are read and checked like a manifest; a scorer (``exact``, ``json_fields``, ``contains`` or a
Python function) gives each labelled item a score from 0 to 1, and ``ScoreSummary`` the mean with its interval
and a row per field. Scores are derived data, scored again each session from the run folder's results.

Design: docs/internals/fanout.md#scoringpy
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence, TypeGuard

from tensorjob_jupyter.abi import dumps
from tensorjob_jupyter.fanout.calibration import FieldSignal
from tensorjob_jupyter.fanout.errors import MapError, ResumeRefused, TooManyItems
from tensorjob_jupyter.fanout.map_folder import fsync_write  # the folder's one atomic writer
from tensorjob_jupyter.fanout.map_folder_reader import (  # every file of the folder read back through its one reader
    FAILURES, LEDGER, RESULTS, SCORING_FILES, FolderError, read_folder_json, read_ledger, read_records,
)
from tensorjob_jupyter.fanout.manifest import MAX_KEY_CHARS, read_manifest
from tensorjob_jupyter.host.fields import field_path

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


# --- expected answers -------------------------------------------------------------------------------------

#: The two shapes of a keyed expected line: by the manifest's key, or by item number (what the run folder keeps).
KEYED_SHAPES = (frozenset({"key", "expected"}), frozenset({"item", "expected"}))


def _keyed(value: Any) -> bool:
    return isinstance(value, dict) and frozenset(value) in KEYED_SHAPES


class Expected:
    """One expected answer for each of some items: ``get(i)`` is (True, value) or (False, None).

    An item is *labelled* when it has an expected answer that is not ``null``; every other item (``null``,
    no line for it, no key for it) is not labelled: not scored and not counted."""

    def __init__(self, values: Mapping[int, Any] | Sequence[Any], total: int, source: str, sha256: str):
        self._values = values
        self.total = total
        self.source = source
        self.sha256 = sha256
        if isinstance(values, Mapping):
            self._labelled = sorted(i for i, v in values.items() if v is not None)
        else:  # a manifest's items, parsed once here (and again when asked for: they are kept as bytes)
            self._labelled = [i for i, v in enumerate(values) if v is not None and i < total]

    def get(self, item: int) -> tuple[bool, Any]:
        if isinstance(self._values, Mapping):
            value = self._values.get(item)
        else:
            value = self._values[item] if 0 <= item < min(len(self._values), self.total) else None
        return (True, value) if value is not None else (False, None)

    def items(self) -> Iterator[tuple[int, Any]]:
        """The labelled items and their expected answers, in item order."""
        for item in self._labelled:
            yield item, self.get(item)[1]

    @property
    def labelled(self) -> int:
        """How many items have an expected answer (not ``null``)."""
        return len(self._labelled)

    def __len__(self) -> int:
        return len(self._labelled)

    @classmethod
    def read(cls, spec: Any, total: int, keys: "Callable[[], Sequence[str]] | None" = None) -> "Expected":
        """Expected answers for a map of ``total`` items: a JSONL file or a list -- one value per item in item
        order (``null`` and items past its end are not labelled), or one ``{"key": KEY, "expected": VALUE}``
        (or ``{"item": N, "expected": VALUE}``) a line for the items it names -- or a dict ``{item or key:
        value}``. ``keys()`` gives the manifest's item keys (``manifest.item_key``), needed only to match
        keys. ``ScoringError`` naming what is wrong."""
        if isinstance(spec, Expected):
            if spec.total != total:
                raise ScoringError(f"the expected answers are for {spec.total} items; this map has {total}")
            return spec
        if isinstance(spec, Mapping):
            lookup = _KeyLookup(keys, total, "<dict>")
            values: dict[int, Any] = {}
            for key, value in spec.items():
                if isinstance(key, str) and key.strip().isdigit():
                    index = int(key)
                elif isinstance(key, str):
                    index = lookup.item(key, f"expected answer for key {key!r}")
                else:
                    index = key
                if not _is_index(index, total):
                    raise ScoringError(f"expected answer for item {key!r}: the items are numbered 0 to {total - 1}")
                if index in values:
                    raise ScoringError(f"two expected answers for item {index}")
                values[index] = value
            data = _records_jsonl((i, values[i]) for i in sorted(values))
            return cls(values, total, "<dict>", hashlib.sha256(data).hexdigest())
        if isinstance(spec, (str, os.PathLike, Sequence)) and not isinstance(spec, (bytes, bytearray)):
            if isinstance(spec, Sequence) and not isinstance(spec, str) and len(spec) > total:
                raise ScoringError(f"expected answers: {len(spec)} values for a manifest of {total} items (one "
                                   f"expected value an item, in the manifest's order; null, or none, for an item "
                                   f"not labelled)")
            try:  # a file of more values than items is refused at the first extra one, the rest unread
                manifest = read_manifest(spec, max_items=total)
            except MapError as e:  # its words are a manifest's: say whose they are
                if isinstance(e, TooManyItems) and isinstance(spec, (str, os.PathLike)):  # a list is refused above
                    raise ScoringError(f"expected answers {Path(spec).absolute()}: more than {total} values for a "
                                       f"manifest of {total} items (line {e.line}; one expected value a line, in "
                                       f"the manifest's order; null, or no line, for an item not labelled)") from None
                raise ScoringError("expected answers: " + str(e).replace("manifest ", "", 1)) from None
            first = next((v for v in manifest.items if v is not None), None)
            if _keyed(first):
                return cls(_keyed_values(manifest, total, keys), total, manifest.source, manifest.sha256)
            if len(manifest) > total:
                raise ScoringError(f"expected answers {manifest.source}: {len(manifest)} values for a manifest of "
                                   f"{total} items (one expected value a line, in the manifest's order; null, or "
                                   f"no line, for an item not labelled)")
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
            raise ScoringError(f"{e}; the file was edited, or belongs to another map") from None
        for record in records:
            item = record["item"]
            if item in values:
                raise ScoringError(f"{path}: a record that scoring did not write (item {item!r} twice); the file "
                                   f"was edited, or belongs to another map")
            values[item] = record["expected"]
        # the SHA-256 of the file as scoring writes it (the same bytes, for a file it wrote)
        return cls(values, total, str(path), hashlib.sha256(_records_jsonl(sorted(values.items()))).hexdigest())

    def write(self, run_dir: Path) -> None:
        fsync_write(run_dir / EXPECTED, _records_jsonl(self.items()).decode("utf-8"))


class _KeyLookup:
    """The manifest's item keys, built on first use: which one item a key names."""

    def __init__(self, keys: "Callable[[], Sequence[str]] | None", total: int, source: str):
        self._keys, self._total, self._source = keys, total, source
        self._by_key: dict[str, list[int]] | None = None

    def item(self, key: Any, where: str) -> int:
        if not isinstance(key, str) or not key:
            raise ScoringError(f"{where}: a key is the item's key as text (its input's id, key, name, path, "
                               f"file or url), not {_kind(key)}")
        if self._by_key is None:
            if self._keys is None:
                raise ScoringError(f"{where}: expected answers by key need the manifest's keys here; give them "
                                   f"by item number instead")
            self._by_key = {}
            for index, name in enumerate(self._keys()):
                self._by_key.setdefault(name, []).append(index)
        found = self._by_key.get(key[:MAX_KEY_CHARS] if len(key) <= MAX_KEY_CHARS else key[:MAX_KEY_CHARS - 1] + "…")
        if not found:
            raise ScoringError(f"{where}: no item of the manifest has the key {_short(key)}")
        if len(found) > 1:
            raise ScoringError(f"{where}: the key {_short(key)} names {len(found)} items of the manifest "
                               f"({', '.join(map(str, found[:5]))}{' ...' if len(found) > 5 else ''}); key those "
                               f"lines by item number instead ({{\"item\": N, \"expected\": ...}})")
        return found[0]


def _keyed_values(manifest: Any, total: int, keys: "Callable[[], Sequence[str]] | None") -> dict[int, Any]:
    """The items a keyed expected file names (every line ``{"key"|"item": ..., "expected": ...}``, or null)."""
    lookup = _KeyLookup(keys, total, manifest.source)
    values: dict[int, Any] = {}
    line_of: dict[int, int] = {}
    for number, value in enumerate(manifest.items, start=1):
        where = f"expected answers {manifest.source}: value {number}"
        if value is None:
            continue
        if not _keyed(value):
            raise ScoringError(f"{where} is not {{\"key\": ..., \"expected\": ...}} as the first one is; a keyed "
                               f"file keys every line")
        if "key" in value:
            index = lookup.item(value["key"], where)
        else:
            index = value["item"]
            if not _is_index(index, total):
                shown = index if isinstance(index, int) and not isinstance(index, bool) else _short(index)
                raise ScoringError(f"{where}: item {shown} -- the items are numbered 0 to {total - 1}")
        if index in values:
            raise ScoringError(f"{where}: item {index} has an expected answer already (value {line_of[index]})")
        values[index], line_of[index] = value["expected"], number
    return values


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else repr(value)
    text = " ".join(text.split())
    return repr(text if len(text) <= 80 else text[:79] + "…")


def _records_jsonl(pairs: Iterable[tuple[int, Any]]) -> bytes:
    return "".join(dumps({"item": i, "expected": v}) + "\n" for i, v in pairs).encode("utf-8")


# --- the summary ------------------------------------------------------------------------------------------

#: How sure an interval is, and the normal quantile that gives it.
CONFIDENCE = 0.95
_Z = 1.959963984540054
#: How the intervals are computed, in the summary's words.
INTERVAL_METHOD = "Wilson score interval, 95%"


def wilson_interval(mean: float, n: int, z: float = _Z) -> tuple[float, float]:
    """The Wilson score interval around a share ``mean`` of ``n`` items (95% by default).

    For pass/fail it is the textbook interval; for scores between 0 and 1 it is conservative (wider than
    needed), since such scores vary at most as much as pass/fail with the same mean does."""
    if n <= 0:
        return (0.0, 1.0)
    mean = min(1.0, max(0.0, mean))
    z2 = z * z
    centre = (mean + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(mean * (1 - mean) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return (max(0.0, min(mean, centre - half)), min(1.0, max(mean, centre + half)))


@dataclass(frozen=True)
class FieldScore:
    """One field's row of a score summary: how many labelled items had it, how many got it right, the share
    (``accuracy``) and its interval. A row of columns (``COLUMNS``), so more can be added beside them."""

    name: str
    labelled: int  # scored items whose expected answer has this field
    right: int
    low: float
    high: float

    COLUMNS = ("field", "labelled", "right", "accuracy", "interval")

    @property
    def accuracy(self) -> float:
        return self.right / self.labelled if self.labelled else 0.0

    def cells(self) -> list[str]:
        return [self.name, str(self.labelled), str(self.right), f"{self.accuracy:.3f}", _interval(self.low, self.high)]

    def to_json(self) -> dict:
        return {"field": self.name, "labelled": self.labelled, "right": self.right,
                "accuracy": round(self.accuracy, 6), "interval": [round(self.low, 6), round(self.high, 6)]}


@dataclass(frozen=True)
class ScoreSummary:
    """A map's scores in all: ``mean`` over the scored items with its interval (``low``, ``high``: 95%,
    Wilson), how many passed and failed, how many items were labelled, and a row per field
    (``field_rows``: labelled, right, accuracy, interval; ``fields`` is their accuracies by name).

    ``str()`` is a few lines and a small table; in a notebook it is an HTML table (``_repr_html_``)."""

    scorer: str
    items: int  # items in the map
    scored: int  # concluded labelled items with a score
    mean: float | None
    passed: int
    failed: int  # scored, and under 1 (failed items among them)
    errors: int  # the scorer could not score them (score_error)
    unscored: int  # items without a score: not labelled, not concluded, or an error
    field_rows: tuple[FieldScore, ...] = ()
    labelled: int | None = None  # items with an expected answer (None: not known, as before labels were counted)
    low: float | None = None
    high: float | None = None
    #: Per field with grounding or confidence recorded: whether they told right from wrong (``calibration``).
    signals: tuple[FieldSignal, ...] = ()
    #: What a review certifies of the values nobody reviewed (``certify.Certificate.lines``), where one was made.
    certificate: tuple[str, ...] = ()

    @property
    def fields(self) -> dict[str, float]:
        """Each field's accuracy, by name (the share of the scored items with that field that got it right)."""
        return {row.name: row.accuracy for row in self.field_rows}

    @property
    def unlabelled(self) -> int:
        """Items with no expected answer (``null``, or none given): not scored, not counted."""
        return 0 if self.labelled is None else self.items - self.labelled

    @property
    def pending(self) -> int:
        """Labelled items not scored yet (not concluded) -- neither unlabelled nor a scorer's error."""
        return self.unscored - self.errors - self.unlabelled

    @classmethod
    def of(cls, scorer: str, items: int, scores: Iterable[ItemScore], labelled: int | None = None,
           signals: Sequence[FieldSignal] = (), certificate: Sequence[str] = ()) -> "ScoreSummary":
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
        mean = total / scored if scored else None
        low, high = wilson_interval(mean, scored) if mean is not None else (None, None)
        rows = tuple(FieldScore(name, seen[name], right[name], *wilson_interval(right[name] / seen[name], seen[name]))
                     for name in seen)
        return cls(scorer, items, scored, mean, passed, scored - passed, errors, items - scored, rows, labelled,
                   low, high, tuple(signals), tuple(certificate))

    def lines(self) -> list[str]:
        """The summary in a few lines and a table of the fields (deterministic: no times, no paths)."""
        labels = self._labels_line()
        if not self.scored:
            out = [f"score ({self.scorer}): no item scored yet ({self.unscored} of {self.items} without a score)"]
            return out + ([labels] if labels else []) + self._certificate_lines()
        assert self.low is not None and self.high is not None, "of() gives a scored summary its interval"
        head = (f"score ({self.scorer}): mean {self.mean:.3f} over {self.scored} item{'s' if self.scored != 1 else ''}"
                f" (95% interval {_interval(self.low, self.high)}); {self.passed} passed, {self.failed} failed")
        head += f", {self.errors} could not be scored" if self.errors else ""
        head += f", {self.pending} not scored yet" if self.pending else ""
        out = [head]
        if labels:
            out.append(labels)
        if self.field_rows:
            out += ["  " + line for line in _text_table(list(FieldScore.COLUMNS),
                                                        [row.cells() for row in self.field_rows])]
        out += self._signal_lines()
        if self.scored < THIN:
            out.append(f"  a mean over {self.scored} items is thin: its 95% interval is "
                       f"{self.high - self.low:.2f} wide ({INTERVAL_METHOD})")
        return out + self._certificate_lines()

    def _certificate_lines(self) -> list[str]:
        """The review's certificate: ``certified: STATEMENT``, then its fields' lines."""
        if not self.certificate:
            return []
        return [f"  certified: {self.certificate[0]}"] + ["  " + line for line in self.certificate[1:]]

    def signal_table(self) -> tuple[list[str], list[list[str]]]:
        """The trust figures as a header and rows: grounded and ungrounded answers' accuracy where any field was
        located, the most and least confident halves' and the AUROC where any had a confidence; each figure
        with the counts it rests on, ``-`` for a field without that data. ([], []) with no such data."""
        if not self.signals:
            return [], []
        grounding = any(s.has_grounding for s in self.signals)
        confidence = any(s.has_confidence for s in self.signals)
        header = ["field"]
        header += ["grounded right", "ungrounded right"] if grounding else []
        header += ["confident half right", "least confident half right", "AUROC"] if confidence else []
        body = []
        for s in self.signals:
            row = [s.name]
            if grounding:
                row += [_share(s.grounded), _share(s.ungrounded)] if s.has_grounding else ["-", "-"]
            if confidence:
                if s.has_confidence:
                    row += [_share(s.confident), _share(s.unconfident),
                            ("-" if s.auroc is None else f"{s.auroc:.3f}") + f" ({s.right} right, {s.wrong} wrong)"]
                else:
                    row += ["-", "-", "-"]
            body.append(row)
        return header, body

    def _signal_lines(self) -> list[str]:
        header, body = self.signal_table()
        if not body:
            return []
        return ["  " + self._signal_heading(header) + ":"] + ["  " + line for line in _text_table(header, body)]

    @staticmethod
    def _signal_heading(header: list[str]) -> str:
        auroc = "; AUROC of confidence for a right answer, ties 1/2" if "AUROC" in header else ""
        return f"whether to trust the evidence (right/count{auroc})"

    def _labels_line(self) -> str:
        if not self.unlabelled:
            return ""
        return (f"  labelled: {self.labelled} of {self.items} items; the {self.unlabelled} not labelled (null, or no "
                f"expected answer) are not scored and not counted")

    def to_json(self) -> dict:
        return {"scorer": self.scorer, "items": self.items, "scored": self.scored,
                "mean": None if self.mean is None else round(self.mean, 6),
                "interval": (None if self.low is None or self.high is None
                             else [round(self.low, 6), round(self.high, 6)]),
                "interval_method": INTERVAL_METHOD, "passed": self.passed, "failed": self.failed,
                "errors": self.errors, "unscored": self.unscored, "labelled": self.labelled,
                "unlabelled": self.unlabelled,
                "fields": {k: round(v, 6) for k, v in self.fields.items()},
                "field_table": [row.to_json() for row in self.field_rows],
                **({"signals": [s.to_json() for s in self.signals]} if self.signals else {}),
                **({"certificate": list(self.certificate)} if self.certificate else {})}

    def __str__(self) -> str:
        return "\n".join(self.lines())

    def __repr__(self) -> str:
        mean = "no score" if self.mean is None else f"mean {self.mean:.3f} over {self.scored}"
        return f"<ScoreSummary {self.scorer}: {mean}, {self.passed} passed>"

    def _repr_pretty_(self, printer, cycle: bool) -> None:
        """IPython shows the lines (a notebook's ``text/plain``)."""
        printer.text(str(self))

    def _repr_html_(self) -> str:
        """The summary as a small HTML table, every value escaped (a field's name comes from an expected file)."""
        from html import escape

        lines = self.lines()
        head = escape(lines[0])
        notes = "".join(f"<div>{escape(line.strip())}</div>" for line in lines[1:]
                        if not line.startswith("  ") or "labelled:" in line or "is thin" in line)
        notes += "".join(f"<div>{escape(line.strip())}</div>" for line in self._certificate_lines())
        header, rows = self.signal_table()
        signals = ""
        if rows:
            cells = "".join(f"<th>{escape(c)}</th>" for c in header)
            signals = (f"<div>{escape(self._signal_heading(header))}</div><table><thead><tr>" + cells + "</tr></thead><tbody>"
                       + "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>" for row in rows)
                       + "</tbody></table>")
        if not self.field_rows:
            return f'<div class="tj-score-summary"><div><b>{head}</b></div>{notes}{signals}</div>'
        columns = "".join(f"<th>{escape(c)}</th>" for c in FieldScore.COLUMNS)
        right = ' style="text-align:right"'
        body = "".join("<tr>" + "".join(f"<td{right if i else ''}>{escape(c)}</td>" for i, c in enumerate(row.cells()))
                       + "</tr>" for row in self.field_rows)
        return (f'<div class="tj-score-summary"><div><b>{head}</b></div>{notes}'
                f'<table><thead><tr>{columns}</tr></thead><tbody>{body}</tbody></table>{signals}</div>')


#: Scored items under which a summary says its mean is thin.
THIN = 30


def _interval(low: float | None, high: float | None) -> str:
    return "-" if low is None or high is None else f"{low:.2f}-{high:.2f}"


def _share(pair: tuple[int, int] | None) -> str:
    """``0.750 (6/8)``: a share with the counts it rests on; ``- (0/0)`` when there are none."""
    if pair is None:
        return "-"
    right, count = pair
    return f"{right / count:.3f} ({right}/{count})" if count else "- (0/0)"


def _text_table(header: list[str], body: list[list[str]]) -> list[str]:
    """Columns padded to their widest cell; text left, numbers right."""
    rows = [header, *body]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    numeric = [all(_numberish(r[i]) for r in body) for i in range(len(header))]
    return ["  ".join(c.rjust(w) if numeric[i] else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
            for r in rows]


def _numberish(text: str) -> bool:
    return bool(text) and text.replace(".", "", 1).replace("-", "", 1).isdigit()


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


def _is_index(value: Any, total: int) -> TypeGuard[int]:
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
    "value_at", "verdict_paths", "exact", "json_fields", "contains", "Scorer", "BUILTINS", "DEFAULT_SCORER", "scorer_of", "score_item",
    "KEYED_SHAPES", "Expected", "CONFIDENCE", "INTERVAL_METHOD", "THIN", "wilson_interval", "FieldScore", "ScoreSummary",
    "read_scores", "scorer_name", "Scoring"
]

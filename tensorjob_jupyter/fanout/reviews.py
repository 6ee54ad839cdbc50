"""A person's decisions on a map's values: ``reviews.jsonl`` in the run folder, appended, read back, matched.

Each decision is one line -- item, key, field path, the model's value as shown, ``accept``/``correct``/``null``/
``skip``, the corrected value, the time -- appended under an exclusive lock and flushed, so two kernels reviewing
one folder lose nothing; the model's results are never touched. It is read back through the folder's one strict
reader (``map_folder_reader.checked_records``: bounded, a bad line is one ``FolderError`` naming it). A review
counts for a value only while it is that value: matched by the item's key and the value itself, a review of a
value a replay or resume changed is ``stale`` and applies to nothing. The latest decision on a value wins; a skip
never undoes one. Decided values are labels (``labels``): the expected answers where the map was given none.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from tensorjob_jupyter.abi import dumps
from tensorjob_jupyter.fanout.errors import ReviewError
from tensorjob_jupyter.fanout.map_folder_reader import DECISIONS, REVIEWS, checked_records, shown
from tensorjob_jupyter.fanout.expected import Expected
from tensorjob_jupyter.fanout.scoring import same
from tensorjob_jupyter.host.fields import MISSING, split_path
from tensorjob_jupyter.regular_file import NotARegularFile, open_regular

ACCEPT, CORRECT, NULL, SKIP = DECISIONS
#: Decisions that say whether the model's value was right (a skip says nothing).
DECIDING = (ACCEPT, CORRECT, NULL)
_TIME = "%Y-%m-%dT%H:%M:%S%z"


@dataclass(frozen=True)
class Review:
    """One decision on one value: ``value`` is the model's value as the reviewer saw it; ``corrected`` the value a
    ``correct`` gave (``null``: None)."""

    item: int
    key: str
    field: str
    value: Any
    decision: str
    corrected: Any = None
    time: str = ""

    @property
    def final(self) -> Any:
        """The value to take: the correction for ``correct`` and ``null``, else the model's value."""
        return self.corrected if self.decision in (CORRECT, NULL) else self.value

    @property
    def right(self) -> bool | None:
        """Whether the model's value was right: True for an accept (or a correction to the same value), False
        for a correction to another value, None for a skip."""
        if self.decision == SKIP:
            return None
        return self.decision == ACCEPT or same(self.final, self.value)

    def to_json(self) -> dict[str, Any]:
        out = {"item": self.item, "key": self.key, "field": self.field, "value": self.value,
               "decision": self.decision}
        if self.decision in (CORRECT, NULL):
            out["corrected"] = self.corrected
        out["time"] = self.time
        return out

    @classmethod
    def from_json(cls, record: dict) -> "Review":
        """A record the strict reader checked (``map_folder_reader``: every field of the type it must be)."""
        decision = record["decision"]
        corrected = record.get("corrected") if decision == CORRECT else None
        return cls(record["item"], record["key"], record["field"], record["value"], decision, corrected,
                   record.get("time", ""))


def new_review(item: int, key: str, field_path: str, value: Any, decision: str, corrected: Any = None) -> Review:
    """A decision made now, checked (``ReviewError``: a decision not in ``DECISIONS``, a value that is not JSON)."""
    if decision not in DECISIONS:
        raise ReviewError(f"a decision is {', '.join(DECISIONS)}, not {decision!r}")
    review = Review(item, key, field_path, value, decision, corrected if decision == CORRECT else None,
                    time.strftime(_TIME))
    try:
        dumps(review.to_json())
    except (TypeError, ValueError) as e:
        raise ReviewError(f"a review is JSON: {e}") from None
    return review


def typed_correction(text: str, like: Any) -> Any:
    """A correction as a person types it, read as the kind of value it corrects: text for a text value (JSON
    quotes, ``"123"``, keep a text that looks like a number); for a number, a boolean or a null, the JSON number,
    ``true``/``false`` or ``null`` it spells, else the text itself."""
    text = text.strip()
    if text.startswith('"'):
        try:
            quoted = json.loads(text)
        except ValueError:
            quoted = None
        if isinstance(quoted, str):
            return quoted
    if isinstance(like, str):
        return text
    try:
        value = json.loads(text)
    except ValueError:
        return text
    ok = value is None or isinstance(value, bool) or isinstance(value, (int, float)) and math.isfinite(value)
    return value if ok else text


def append_review(run_dir: str | os.PathLike, review: Review) -> None:
    """Append one decision to ``run_dir/reviews.jsonl`` as one line, under an exclusive lock (two kernels'
    decisions interleave whole), flushed and fsynced; never through a symbolic link."""
    path = Path(run_dir) / REVIEWS
    line = (dumps(review.to_json()) + "\n").encode("utf-8")
    try:
        f = open_regular(path, flags=os.O_RDWR | os.O_CREAT | os.O_APPEND, mode="a+b", follow_symlinks=False)
    except NotARegularFile as e:
        raise ReviewError(f"{shown(path)} cannot be written: it is {e.strerror}") from None
    except OSError as e:
        raise ReviewError(f"{shown(path)} cannot be written: {e.strerror or e}") from None
    with f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            size = os.fstat(f.fileno()).st_size
            if size and os.pread(f.fileno(), 1, size - 1) != b"\n":
                f.write(b"\n")  # a torn last line (a crash mid-append) stays torn, never joined to this one
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def read_reviews(run_dir: str | os.PathLike, total: int) -> list[Review]:
    """The decisions in ``run_dir/reviews.jsonl``, in the order they were made (``[]`` without the file); a line
    that is not a review is one ``FolderError`` naming it (a torn last line is left out)."""
    path = Path(run_dir) / REVIEWS
    return [Review.from_json(record) for record, _, _ in checked_records(path, total=total)]


@dataclass
class ReviewBook:
    """Reviews matched to a map's current values: ``decided`` (the latest deciding review of each value, by
    (item, field)), ``skipped`` (values skipped and never decided) and ``stale`` (reviews of a value that is no
    longer the item's: changed, gone, or of a key no item has now)."""

    decided: dict[tuple[int, str], Review] = field(default_factory=dict)
    skipped: set[tuple[int, str]] = field(default_factory=set)
    stale: list[Review] = field(default_factory=list)

    @classmethod
    def match(cls, reviews: Iterable[Review], keys: Sequence[str],
              value_of: Callable[[int, str], Any]) -> "ReviewBook":
        """Each review matched to the value it was made on: the item its key names (the recorded item number
        where that item has the key, else the one item that has it) and the same field holding the same value
        (``scoring.same``; ``value_of(item, field)``: the value now, ``host.fields.MISSING`` where there is
        none -- a failed item, a field gone); anything else is stale."""
        by_key: dict[str, list[int]] = {}
        for index, name in enumerate(keys):
            by_key.setdefault(name, []).append(index)
        book = cls()
        for review in reviews:
            item = review.item if review.item < len(keys) and keys[review.item] == review.key else None
            if item is None and len(by_key.get(review.key, ())) == 1:
                item = by_key[review.key][0]
            now = value_of(item, review.field) if item is not None else MISSING
            if item is None or now is MISSING or not same(now, review.value):
                book.stale.append(review)
                continue
            book._apply((item, review.field), review)
        return book

    def add(self, review: Review) -> None:
        """A decision just made on the value it names (as ``match`` takes a matching one)."""
        self._apply((review.item, review.field), review)

    def _apply(self, place: tuple[int, str], review: Review) -> None:
        """``review`` decides the value at ``place``: the latest decision wins; a skip never undoes one."""
        if review.decision == SKIP:
            if place not in self.decided:
                self.skipped.add(place)
            return
        self.decided[place] = review
        self.skipped.discard(place)

    def get(self, item: int, field_path: str) -> Review | None:
        return self.decided.get((item, field_path))

    @property
    def corrected(self) -> int:
        """Decided values whose model value was wrong."""
        return sum(1 for r in self.decided.values() if not r.right)


def labels(book: ReviewBook, results: Mapping[int, Any]) -> dict[int, dict]:
    """The decided values as expected answers: per item, an object of its decided fields at their paths (the right
    value: the model's where accepted, else the correction). A field inside an array has no place in such an
    object (``json_fields`` compares objects' leaves) and is left out."""
    out: dict[int, dict] = {}
    for (item, path), review in sorted(book.decided.items()):
        parts, parent = split_path(path), results.get(item)
        for part in parts[:-1]:
            parent = parent.get(part) if isinstance(parent, dict) else None
        if not isinstance(parent, dict) or parts[-1] not in parent:
            continue  # inside an array, or a scalar result: no object to hold it
        node = out.setdefault(item, {})
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = review.final
    return out


def review_expected(book: ReviewBook, results: Mapping[int, Any], total: int) -> Expected | None:
    """The decided values as ``Expected`` answers (``labels``), named after ``reviews.jsonl``; None without any."""
    values = labels(book, results)
    if not values:
        return None
    digest = hashlib.sha256(dumps(sorted(values.items())).encode("utf-8")).hexdigest()
    return Expected(values, total, REVIEWS, digest)


__all__ = ["ACCEPT", "CORRECT", "NULL", "SKIP", "DECIDING", "Review", "new_review", "typed_correction",
           "append_review", "read_reviews", "ReviewBook", "labels", "review_expected"]

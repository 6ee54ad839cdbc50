"""The review queue: a map's values one at a time -- the doubtful first, a random sample beside them -- decided.

``ReviewQueue`` is what a terminal, a notebook widget or a bench's simulated reviewer drives: ``next()`` gives the
value to look at, ``decide()`` records accept / correct / null / skip (``reviews.jsonl``) and keeps the certificate
(``certificate.json``), ``back()`` returns to the previous one, ``progress()`` and ``certificate()`` say where it
stands. It takes turns between the doubt order (``review_rows``) and the sample's order (``certify``), so each
value the person sees looks like any other; values decided already -- here, earlier, or by another kernel on the
same folder (read again at each ``next()``) -- are never asked again, nor is a skipped one. With a target it stops
asking once the certificate reaches it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from tensorjob_jupyter.fanout.certify import (
    DEFAULT_CONFIDENCE, Certificate, Place, certify, check_share, plan_seed, sample_order, write_certificate,
)
from tensorjob_jupyter.fanout.errors import ReviewError
from tensorjob_jupyter.fanout.progress import MapResult
from tensorjob_jupyter.fanout.review_rows import ValueRow
from tensorjob_jupyter.fanout.reviews import CORRECT, DECISIONS, Review, ReviewBook, append_review, new_review
from tensorjob_jupyter.host.fields import MISSING

#: Which of the two orders a value came from: the doubt order, or the sample that certifies the rest.
DOUBT, SAMPLE = "doubt", "sample"
#: The share of turns the sample gets unless told: a quarter (bench/bench_review.py: on a map whose values are
#: mostly wrong, correcting the doubtful ones is what the certificate waits on; a half needed 10% more reviews).
DEFAULT_SAMPLE_SHARE = 0.25


def turn_for(turns: dict[str, int], sample_share: float) -> str:
    """Which order gives the next value (``DOUBT`` or ``SAMPLE``) after ``turns`` of each: the sample while it has
    had less than ``sample_share`` of the turns."""
    return SAMPLE if turns[SAMPLE] < sample_share * (sum(turns.values()) + 1) else DOUBT


@dataclass(frozen=True)
class QueueItem:
    """One value to review: its row (``ValueRow``: the value, its confidence, source and context, its reason),
    which order it came from (``pick``: ``doubt`` or ``sample``; the person need not be told) and the decision on
    it so far (``review``, after ``back()``)."""

    row: ValueRow
    pick: str
    review: Review | None = None

    @property
    def place(self) -> Place:
        return (self.row.item, self.row.field)


@dataclass(frozen=True)
class Progress:
    """How far the review is: values in all, decided (by anyone), corrected, skipped, asked in this session."""

    values: int
    reviewed: int
    corrected: int
    skipped: int
    asked: int

    def __str__(self) -> str:
        return (f"{self.reviewed} of {self.values} values reviewed, {self.corrected} corrected"
                + (f", {self.skipped} skipped" if self.skipped else ""))


class ReviewQueue:
    """A map's values to review (see the module doc). ``result``: a ``MapResult`` or its run folder;
    ``confidence``: the certificate's (0.95); ``target``: stop asking once the bound on the values nobody
    reviewed reaches it; ``sample_share``: the share of turns given to the sample (0 to 1, ``DEFAULT_SAMPLE_SHARE``);
    ``seed``: the sample's
    (default: the run folder's, drawn once and kept in ``review_plan.json``)."""

    def __init__(self, result: MapResult | str | os.PathLike, *, confidence: float = DEFAULT_CONFIDENCE,
                 target: float | None = None, sample_share: float = DEFAULT_SAMPLE_SHARE, seed: int | None = None,
                 context: bool = True):
        self.result = result if isinstance(result, MapResult) else MapResult.read(result)
        self.confidence = check_share("confidence", confidence, open_ends=True)
        self.target = None if target is None else check_share("target", target, open_ends=True)
        self.sample_share = check_share("sample_share", sample_share)
        self.rows = self.result.review_values(context=context)
        self._row = {(r.item, r.field): r for r in self.rows}
        self.seed = plan_seed(self.result.run_dir) if seed is None else seed
        self.order = sample_order(self.rows, self.seed)
        self._keys = self.result.item_keys()
        self.book = ReviewBook()
        self._history: list[QueueItem] = []  # shown in this session, oldest first
        self._at = -1  # the place in _history now shown (after back(), an earlier one)
        self._turns = {DOUBT: 0, SAMPLE: 0}
        self._certificate: Certificate | None = None
        self._reload()

    # --- what to show ---------------------------------------------------------------------------------------

    @property
    def current(self) -> QueueItem | None:
        """The value shown now (None before the first ``next()`` or after the last)."""
        return self._history[self._at] if 0 <= self._at < len(self._history) else None

    def next(self) -> QueueItem | None:
        """The next value to review, or None: every value decided or skipped, or the target reached. After
        ``back()``, the values shown since, in turn, before new ones."""
        if self._at + 1 < len(self._history):
            self._at += 1
            return self._refreshed(self._history[self._at])
        self._reload()
        if self.target is not None and self.certificate().reached:
            self._at = len(self._history)
            return None
        shown = {item.place for item in self._history}
        wanted = turn_for(self._turns, self.sample_share)
        for pick in (wanted, DOUBT if wanted == SAMPLE else SAMPLE):
            place = self._first_open(pick, shown)
            if place is not None:
                self._turns[pick] += 1
                self._history.append(QueueItem(self._row[place], pick))
                self._at = len(self._history) - 1
                return self._history[-1]
        self._at = len(self._history)
        return None

    def back(self) -> QueueItem | None:
        """The value shown before the current one, with the decision on it so far (None at the first)."""
        if self._at <= 0:
            return None
        self._at -= 1
        return self._refreshed(self._history[self._at])

    def select(self, item: int, field: str) -> QueueItem:
        """Show the value of ``item``'s ``field`` next, whatever the order (a widget's click on a row);
        ``ReviewError`` where the map has no such value."""
        row = self._row.get((item, field))
        if row is None:
            raise ReviewError(f"item {item} has no value at {field!r} to review")
        self._history.append(QueueItem(row, DOUBT, self.book.get(item, field)))
        self._at = len(self._history) - 1
        return self._history[-1]

    def _first_open(self, pick: str, shown: set[Place]) -> Place | None:
        places = (p for p in ((r.item, r.field) for r in self.rows)) if pick == DOUBT else iter(self.order)
        for place in places:
            if place not in self.book.decided and place not in self.book.skipped and place not in shown:
                return place
        return None

    def _refreshed(self, item: QueueItem) -> QueueItem:
        return QueueItem(item.row, item.pick, self.book.get(*item.place))

    def _reload(self) -> None:
        """The reviews as the folder has them now (another kernel's too)."""
        rows = self._row

        def value_of(item: int, path: str) -> Any:
            row = rows.get((item, path))
            return row.value if row is not None else MISSING

        self.book = ReviewBook.match(self.result.reviews(), self._keys, value_of)
        self._certificate = None

    # --- deciding -------------------------------------------------------------------------------------------

    def decide(self, decision: str, corrected: Any = None) -> Certificate:
        """Record ``decision`` (``accept``, ``correct`` with ``corrected``, ``null``, ``skip``) on the value shown
        now, in ``reviews.jsonl``, and keep the certificate it makes in ``certificate.json``; the certificate.
        ``ReviewError`` with no value shown, or an unknown decision."""
        shown = self.current
        if shown is None:
            raise ReviewError("no value is shown to decide on: call next() first")
        if decision not in DECISIONS:
            raise ReviewError(f"a decision is {', '.join(DECISIONS)}, not {decision!r}")
        row = shown.row
        review = new_review(row.item, row.key, row.field, row.value, decision,
                            corrected if decision == CORRECT else None)
        append_review(self.result.run_dir, review)
        self.book.add(review)
        self._history[self._at] = QueueItem(row, shown.pick, self.book.get(row.item, row.field))
        self._certificate = None
        certificate = self.certificate()
        write_certificate(self.result.run_dir, certificate)
        return certificate

    def certificate(self) -> Certificate:
        """What the review certifies now of the values nobody reviewed (overall and per field)."""
        if self._certificate is None:
            self._certificate = certify(self.rows, self.book.decided, self.book.skipped, self.seed,
                                        confidence=self.confidence, target=self.target, order=self.order)
        return self._certificate

    def progress(self) -> Progress:
        decided = self.book.decided
        return Progress(len(self.rows), len(decided), self.book.corrected, len(self.book.skipped),
                        len(self._history))

    @property
    def stale(self) -> list[Review]:
        """Reviews of values that changed since (a replay, a resume): kept in the file, applied to nothing."""
        return list(self.book.stale)


__all__ = ["DOUBT", "SAMPLE", "DEFAULT_SAMPLE_SHARE", "turn_for", "QueueItem", "Progress", "ReviewQueue"]

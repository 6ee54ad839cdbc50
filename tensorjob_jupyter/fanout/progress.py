"""What a map reports: ``MapProgress`` (a live look), ``MapResult`` (how it ended), ``ItemTimes``.

Plain values, so the notebook view, the command line's printer and the
benchmarks can hold and compare them from any thread: ``MapRun`` hands out
a fresh ``MapProgress`` per change (its ``version`` says which) and copies
of ``ItemTimes``. ``MapResult`` reads results back from the run folder's
files rather than keeping them, since the files are the record; with the
manifest's inputs it makes the table a notebook wants (``rows()``, and
``to_pandas()`` where pandas is installed: the optional extra ``[pandas]``), with each item's
expected answer and score when the map was scored (``scoring.py``), and its values one a row, doubtful
first, with what a person decided of them (``review()``: ``review_rows.py``, ``reviews.py``, ``certify.py``).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

from tensorjob_jupyter.fanout.map_folder_reader import (
    EXPECTED, FAILURES, RESULTS, REVIEWS, FolderError, RecordIndex, confirmed_items, pinned_manifest, read_ledger,
    read_records, recorded_items,
)
from tensorjob_jupyter.fanout.errors import MapError
from tensorjob_jupyter.fanout.calibration import evidence_of, field_signals
from tensorjob_jupyter.fanout.certify import Certificate, fingerprint, read_certificate
from tensorjob_jupyter.fanout.manifest import MAX_KEY_CHARS, item_key
from tensorjob_jupyter.fanout.review_rows import ValueRow, doubtful_first, value_rows
from tensorjob_jupyter.fanout.reviews import Review, ReviewBook, read_reviews, review_expected
from tensorjob_jupyter.fanout.expected import Expected
from tensorjob_jupyter.fanout.score_summary import ScoreSummary
from tensorjob_jupyter.fanout.scoring import BUILTINS, ItemScore, read_scores, score_item, scorer_name, verdict_paths
from tensorjob_jupyter.host.fields import MAX_FIELDS, MISSING, field_path, value_at
from tensorjob_jupyter.host.grounding import grounds, sources_label
from tensorjob_jupyter.record.event_checks import check_rejected, check_sources

if TYPE_CHECKING:
    import pandas  # an optional extra, imported by to_pandas

#: What ``MapResult.rows`` says of an item the map never concluded (it was cancelled first).
NOT_RUN = "not run"
#: The source ``Expected`` answers made of reviews name (``reviews.review_expected``).
REVIEWS_SOURCE = REVIEWS
#: What makes a notebook's review widget of a map: registered by the package (``tensorjob_jupyter.__init__``),
#: so that this layer never imports the views (a plugin hook; None where no view is registered).
REVIEW_VIEW: list[Callable[..., Any]] = []


def rate_text(concluded: int, elapsed_s: float) -> str:
    """How fast items conclude, as a person reads it: ``2.5 items/s``, or ``12.3 s/item`` when slower than one
    a second (never "0.0 items/s"); empty before the first item has concluded."""
    if concluded <= 0 or elapsed_s <= 0:
        return ""
    rate = concluded / elapsed_s
    return f"{rate:.1f} items/s" if rate >= 1 else f"{elapsed_s / concluded:.1f} s/item"


@dataclass(frozen=True)
class MapProgress:
    """One consistent look at a map. ``completed``/``failed`` count this
    session's items; ``skipped_*`` those concluded before it (resume)."""

    total: int
    completed: int = 0
    failed: int = 0
    running: int = 0
    skipped_completed: int = 0
    skipped_failed: int = 0
    cancelled: int = 0
    peak_running: int = 0
    elapsed_s: float = 0.0
    status: str = "running"  # running | finished | cancelled | stopped (the token budget) | error
    dashboard_link: str | None = None
    version: int = 0
    tokens: int = 0  # tokens in and out of this session's items, as each ends
    scored: int = 0  # items with a score (expected answers: the whole folder's, not only this session's)
    score_sum: float = 0.0
    score_passed: int = 0
    #: Of ``failed``: items a replay's recording could not answer (``replay_divergence``) -- they need the
    #: model, which is not the same as failing.
    needs_model: int = 0

    @property
    def mean_score(self) -> float | None:
        return self.score_sum / self.scored if self.scored else None

    @property
    def skipped(self) -> int:
        return self.skipped_completed + self.skipped_failed

    @property
    def concluded(self) -> int:
        return self.skipped + self.completed + self.failed

    @property
    def remaining(self) -> int:
        return self.total - self.concluded

    @property
    def throughput(self) -> float:
        """Items concluded per second in this session."""
        return (self.completed + self.failed) / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def rate(self) -> str:
        """``throughput`` as a person reads it (``rate_text``)."""
        return rate_text(self.completed + self.failed, self.elapsed_s)

    def to_json(self) -> dict:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        out.update(skipped=self.skipped, remaining=self.remaining, throughput=round(self.throughput, 3),
                   mean_score=None if self.mean_score is None else round(self.mean_score, 6))
        return out


@dataclass(frozen=True)
class MapResult:
    """How a map ended; counts cover the whole run folder, resumes included.

    ``results()`` and ``failures()`` read the run folder's files; ``rows()``
    joins them with the manifest's inputs, one row per item, and
    ``to_pandas()`` makes those rows a DataFrame indexed by item.
    """

    run_dir: Path
    """The run folder: ``ledger.json``, ``results.jsonl``, ``failures.jsonl``, ``jobs/``."""
    total: int
    """Items in the manifest."""
    completed: int
    """Items completed, in this session or an earlier one."""
    failed: int
    """Items failed, in this session or an earlier one."""
    skipped: int
    """Items this session did not run: concluded by an earlier one (resume)."""
    ran: int
    """Items this session ran to a conclusion."""
    status: str
    """``finished``, ``cancelled``, ``stopped`` (its token budget was spent) or ``error`` (the map itself broke:
    see ``error``)."""
    elapsed_s: float
    """This session's wall time."""
    throughput: float
    """Items this session concluded per second."""
    error: str | None = None
    """What broke the map itself (not an item: items fail in ``failures()``); None when it did not break."""
    inputs: Sequence = field(default=(), compare=False)
    """Each item's input, in manifest order (the manifest is read again on every run, so it is at hand)."""
    tokens: int = 0
    """Tokens in and out of this session's items."""

    @property
    def ok(self) -> bool:
        return self.status == "finished" and self.completed == self.total

    @property
    def results_path(self) -> Path:
        return self.run_dir / RESULTS

    @property
    def failures_path(self) -> Path:
        return self.run_dir / FAILURES

    def results(self) -> dict[int, Any]:
        """Each completed item's result, by item number."""
        return {r["item"]: r.get("result") for r in read_records(self.results_path, total=self.total)}

    def confidences(self) -> dict[int, dict[str, float | None]]:
        """Each completed item's confidence by field (``Envelope.confidence``: dotted paths, 0 to 1 or None),
        for the items whose model gave logprobs to measure it by. Read back as untrusted: a value that is not
        a number from 0 to 1 is None, a record whose confidence is not an object has none."""
        out = {}
        for r in read_records(self.results_path, total=self.total):
            confidence = record_confidence(r)
            if confidence is not None:
                out[r["item"]] = confidence
        return out

    def sources(self) -> dict[int, dict[str, list[dict]]]:
        """Each completed item's sources (``host/grounding.py``: each field's places in what the item read,
        ``[]`` for a field found nowhere), by item number; an item recorded without them is left out."""
        out = {}
        for r in read_records(self.results_path, total=self.total):
            sources = record_sources(r)
            if sources is not None:
                out[r["item"]] = sources
        return out

    def review_widget(self, **queue_options: Any) -> Any:
        """The review widget of this map in a notebook: its values one at a time, doubtful first, decided from the
        keyboard (``queue_options``: ``ReviewQueue``'s -- ``confidence``, ``target``, ``sample_share``, ``seed``)."""
        if not REVIEW_VIEW:
            raise MapError("no review widget is registered: import tensorjob_jupyter (the package) first")
        return REVIEW_VIEW[0](self, **queue_options)

    def review(self) -> list[dict[str, Any]]:
        """One row per value of the completed items -- every scalar field of each result, nulls included --
        doubtful first by the review's order score (``review_rows``: a value that claims something and is not
        grounded first, then the lowest confidence). Each row: ``item``, ``key``, ``field`` (its dotted path),
        ``value``, ``confidence``, ``found`` (``grounded``, ``elsewhere``, ``doubtful``, ``not found``; None for a
        null or a value not located), ``reason`` (``not_found``, ``elsewhere``, ``doubtful``, ``least_confidence``,
        ``unmeasured``), ``score``, ``source`` with its ``label`` and ``context`` (the text around it in its file),
        and what a review decided (``reviews.jsonl``): ``decision`` (None where none) and ``final``. Failed items
        are not answers and are left out (``failures()``)."""
        book = self.review_book()
        out = []
        for row in self.review_values():
            review = book.get(row.item, row.field)
            out.append({**row.to_json(), "decision": review.decision if review is not None else None,
                        "final": review.final if review is not None else row.value})
        return out

    def review_values(self, *, context: bool = True) -> list[ValueRow]:
        """``review()``'s values as ``ValueRow``s, in its order (``context``: read each source's file for the
        text around it)."""
        rows: list[ValueRow] = []
        for record in read_records(self.results_path, total=self.total):
            key = record["key"][:MAX_KEY_CHARS] if isinstance(record.get("key"), str) else str(record["item"])
            rows += value_rows(record["item"], key, record.get("result"), record_sources(record),
                               record_confidence(record), context=context)
        if len(self.inputs) >= self.total:  # the keys the manifest gives, as rows() has them
            rows = [dataclasses.replace(r, key=item_key(self.inputs[r.item], r.item)) for r in rows]
        return doubtful_first(rows)

    def reviews(self) -> list[Review]:
        """The decisions in the run folder's ``reviews.jsonl``, in the order they were made (``fanout/reviews.py``)."""
        return read_reviews(self.run_dir, self.total)

    def review_book(self) -> ReviewBook:
        """The reviews matched to the values as they are now: each value's latest decision, the skipped, and the
        stale (a review of a value a replay or resume changed applies to nothing)."""
        reviews = self.reviews()
        if not reviews:
            return ReviewBook()
        with RecordIndex(self.results_path, self.total) as results:
            records: dict[int, dict | None] = {}

            def value_of(item: int, path: str) -> Any:
                if item not in records:
                    records[item] = results.get(item)
                record = records[item]
                return MISSING if record is None else value_at(record.get("result"), path)

            return ReviewBook.match(reviews, self._keys(), value_of)

    def certificate(self) -> Certificate | None:
        """What the review certifies of the values nobody reviewed (``certificate.json``), ``stale`` where the
        values changed since; None before any review made one."""
        return read_certificate(self.run_dir, lambda: fingerprint(self.review_values(context=False)))

    def failures(self) -> dict[int, Any]:
        """Each failed item's error (``code``, ``message``), by item number: as recorded, so None where a
        line holds none."""
        return {r["item"]: r.get("error") for r in read_records(self.failures_path, total=self.total)}

    def scores(self) -> dict[int, ItemScore] | None:
        """Each scored item's score, by item; None when the map was not scored. A map given no expected answers
        whose values were reviewed is scored against the reviews (``json_fields`` over the decided fields)."""
        scores = read_scores(self.run_dir, self.total)
        if scores is not None or os.path.lexists(self.run_dir / EXPECTED):
            return scores
        labelled = self._review_labels()
        if labelled is None:
            return None
        results = self.results()
        return {item: score_item(BUILTINS["json_fields"], item, item in results, results.get(item), wanted)
                for item, wanted in labelled.items()}

    def expected(self) -> Expected | None:
        """The expected answers the run folder keeps; None when the map was not given any. Without them, the
        reviewed values are the expected answers (``reviews.labels``: each item's decided fields), if any."""
        kept = Expected.from_folder(self.run_dir, self.total)
        return kept if kept is not None else self._review_labels()

    def _review_labels(self) -> Expected | None:
        if os.path.lexists(self.run_dir / EXPECTED):
            return None
        book = self.review_book()
        return review_expected(book, self.results(), self.total) if book.decided else None

    def _scorer(self) -> str | None:
        """The scorer's name: the folder's, or ``json_fields`` where the reviews are the labels."""
        name = scorer_name(self.run_dir)
        if name is None and not os.path.lexists(self.run_dir / EXPECTED) and self.review_book().decided:
            return "json_fields"
        return name

    def score_summary(self) -> ScoreSummary | None:
        """The scores in all (mean and its interval, passed, failed, how many items are labelled, a row per field);
        None when the map was not scored."""
        scores = self.scores()
        if scores is None:
            return None
        expected = self.expected()
        scorer = self._scorer() or "?"
        wanted = dict(expected.items()) if expected is not None else {}
        evidence = evidence_of({i: s.fields for i, s in scores.items()},
                               lambda item: verdict_paths(scorer, wanted.get(item)), self.sources(), self.confidences())
        try:
            certificate = self.certificate()
            certified = certificate.lines() if certificate is not None else []
        except FolderError as e:  # the scores stand without it: say what is wrong with it instead
            certified = [" ".join(str(e).split())]
        shown = scorer + (" over reviews.jsonl" if expected is not None and expected.source == REVIEWS_SOURCE else "")
        return ScoreSummary.of(shown, self.total, scores.values(),
                               labelled=expected.labelled if expected is not None else None,
                               signals=field_signals(evidence), certificate=certified)

    @classmethod
    def read(cls, run_dir: str | os.PathLike) -> "MapResult":
        """The map in ``run_dir`` as its files tell it, whether it finished, stopped or still runs: the counts
        from the results files, the status from the ledger's last session, the item count as what was read
        confirms it (``map_folder_reader.confirmed_items``), and the inputs from the manifest when the file the
        ledger names is still the one it pins (else rows have no ``input`` columns). Every file is read through
        ``map_folder_reader``; ``ManifestError``/``ResumeRefused`` name what is wrong with a folder that is not a
        map's, or not as a map left it."""
        run_dir = Path(run_dir).absolute()
        ledger = read_ledger(run_dir)
        claimed, session = ledger["items"], ledger["session"]
        done = recorded_items(run_dir / RESULTS, total=claimed)
        failed = sum(item not in done for item in recorded_items(run_dir / FAILURES, total=claimed))
        manifest = pinned_manifest(ledger)
        total = confirmed_items(run_dir, ledger, len(manifest) if manifest is not None else None,
                                len(done) + failed)
        inputs = manifest.items if manifest is not None else ()  # parsed an item at a time, as asked for
        return cls(run_dir=run_dir, total=total, completed=len(done), failed=failed,
                   skipped=session.get("skipped", 0), ran=session.get("completed", 0) + session.get("failed", 0),
                   status=session.get("status", "running"), elapsed_s=session.get("elapsed_s", 0.0),
                   throughput=0.0, error=session.get("error"), inputs=inputs)

    def rows(self) -> list[dict[str, Any]]:
        """One dict per item, in item order, every one with the same keys: ``item``; ``key``, what names the
        item (``manifest.item_key``); the input's fields as ``input.NAME`` (a non-object input is ``input``);
        ``status`` (``completed``, ``failed`` or ``not run``); ``error_code`` and ``error_message``; the
        result's fields as ``result.NAME`` (a non-object result is ``result``) -- flattened one level, deeper
        values kept as they are, ``NAME`` the key spelt as a field path (``flattened``: a key ``total.amount``
        is ``result.total\\.amount``, its source ``source.total\\.amount``); each located field (its dotted
        path, ``facts.authors.1``) as ``source.FIELD`` (where it was found: ``NAME:START-END`` byte offsets,
        ``NAME#PAGE:...`` for a page's text, ``""`` found nowhere) and ``grounded.FIELD`` (True for an exact or normalised match, else False; None
        where the field was not located). A scored map adds the expected answer's fields (``expected.NAME``),
        ``score`` (0 to 1), ``passed``, each field's verdict (``score.NAME``: True or False, for ``json_fields``
        and for scorers that report fields) and ``score_error``; an item without a score has None there. A map whose
        model gave logprobs adds each result field's confidence as ``confidence.FIELD`` (``FIELD``: its dotted
        path, ``host.fields``; 0 to 1, None where no answer spelled it or the item has none). A field that
        ``--require-grounded`` rejected in any item adds ``rejected.FIELD`` (why, or None) and ``final.FIELD`` (the
        value, null where it was rejected); a field reviewed in any item (``reviews.jsonl``) adds ``reviewed.FIELD``
        (the decision on this item's value: ``accept``, ``correct`` or ``null``; None where none) and
        ``final.FIELD`` -- the correction where there is one, the model's value where it was accepted (even one
        ``--require-grounded`` rejected), else as above. A cascade (``cascade.py``) adds, after the result's fields,
        ``answered_by`` (``proxy``, ``oracle``, ``both-sampled``), ``model`` (the model that answered) and the
        proxy's answer as ``proxy.NAME`` where the oracle's replaced it; a folder where more than one model answered
        (``--mixed-models``) adds ``model``."""
        return list(self._rows())

    def iter_rows(self) -> Iterator[dict[str, Any]]:
        """``rows()`` one at a time: the same rows in the same order, made as they are asked for, so a table of
        a large map (``tensorjob runs --table``) never holds every row, nor every result, at once."""
        return self._rows()

    def _rows(self) -> Iterator[dict[str, Any]]:
        """``rows()`` one at a time. The results files are read through once for the columns (every record
        checked, each item's place kept: ``RecordIndex``) and each item's records read again for its row."""
        inputs = self.inputs
        given = min(self.total, len(inputs))
        input_keys = dict.fromkeys(key for i in range(given) for key in flattened("input", inputs[i]))
        output_keys: dict[str, None] = {}
        source_fields: dict[str, None] = {}
        confidence_keys: dict[str, None] = {}
        rejected_fields: dict[str, None] = {}
        proxy_keys: dict[str, None] = {}  # a cascade's: the proxy's answer where the oracle's replaced it
        models: dict[Any, None] = {}  # the models that answered: a column when more than one did
        tiers: dict[Any, None] = {}  # a cascade's answered_by values

        def add_tier(record: dict) -> None:  # a cascade's, or a map of mixed models (fanout/cascade.py)
            model = record.get("model")  # text from a file that may have been edited: never a key as it is
            models[model if model is None or isinstance(model, str) else str(model)[:200]] = None
            if "answered_by" in record:
                tier = record["answered_by"]
                tiers[tier if isinstance(tier, str) else str(tier)[:200]] = None
            proxy = record.get("proxy")
            if isinstance(proxy, dict) and "result" in proxy:
                proxy_keys.update(dict.fromkeys(flattened("proxy", proxy["result"])))
        book = self.review_book()
        reviewed_fields = dict.fromkeys(path for _, path in sorted(book.decided))

        def add_columns(record: dict) -> None:  # in the order the items first appear, as results() has them
            output_keys.update(dict.fromkeys(flattened("result", record.get("result"))))
            source_fields.update(dict.fromkeys(record_sources(record) or ()))
            rejected_fields.update(dict.fromkeys(record_rejected(record)))
            confidence_keys.update(dict.fromkeys(f"confidence.{path}" for path in record_confidence(record) or ()))
            add_tier(record)

        with RecordIndex(self.results_path, self.total, add_columns) as results, \
                RecordIndex(self.failures_path, self.total, add_tier) as failures:
            if results.repeated:  # an item recorded twice (an edited file): its columns are its last record's
                for columns in (output_keys, source_fields, confidence_keys, rejected_fields):
                    columns.clear()
                for first in results.first_records():
                    add_columns(first)
            scored = self._score_columns()
            keys_from_inputs = given >= self.total
            for index in range(self.total):
                record = results.get(index)
                failure = failures.get(index) if record is None or not keys_from_inputs else None
                recorded_error = failure.get("error") if failure is not None and record is None else None
                error: dict = recorded_error if isinstance(recorded_error, dict) else {}
                status = "completed" if record is not None else "failed" if failure is not None else NOT_RUN
                output = flattened("result", record.get("result")) if record is not None else {}
                value = inputs[index] if index < given else None
                flat_input = flattened("input", value) if index < given else {}
                key = item_key(value, index) if keys_from_inputs else _recorded_key(index, record, failure)
                row = {"item": index, "key": key, **{k: flat_input.get(k) for k in input_keys},
                       "status": status, "error_code": error.get("code"), "error_message": error.get("message"),
                       **{k: output.get(k) for k in output_keys}}
                if tiers or len(models) > 1:  # which model answered: a cascade's tiers, or mixed models
                    mine = record if record is not None else failures.get(index) or {}
                    if tiers:
                        row["answered_by"] = mine.get("answered_by")
                    row["model"] = mine.get("model")
                    proxy = mine.get("proxy")
                    proxied = flattened("proxy", proxy.get("result")) if isinstance(proxy, dict) else {}
                    row.update({k: proxied.get(k) for k in proxy_keys})
                if confidence_keys:
                    mine = (record_confidence(record) if record is not None else None) or {}
                    row.update({k: mine.get(k[len("confidence."):]) for k in confidence_keys})
                found = (record_sources(record) if record is not None else None) or {}
                for name in source_fields:
                    row[f"source.{name}"] = sources_label(found.get(name))
                for name in source_fields:
                    row[f"grounded.{name}"] = grounds(found.get(name))
                if rejected_fields or reviewed_fields:
                    rejected = record_rejected(record) if record is not None else {}
                    for name in rejected_fields:
                        row[f"rejected.{name}"] = rejected.get(name)
                    for name in reviewed_fields:
                        review = book.get(index, name)
                        row[f"reviewed.{name}"] = review.decision if review is not None else None
                    for name in {**rejected_fields, **reviewed_fields}:
                        review = book.get(index, name)
                        kept = value_at(record.get("result"), name) if record is not None and name not in rejected \
                            else MISSING
                        row[f"final.{name}"] = review.final if review is not None else None if kept is MISSING \
                            else kept
                if scored is not None:
                    row.update(scored(index))
                yield row

    def _score_columns(self):
        """A function giving an item's scoring columns, all rows with the same keys; None when unscored."""
        scores, expected = self.scores(), self.expected()
        if scores is None and expected is None:
            return None
        scores = scores or {}
        wanted = {}
        if expected is not None:
            wanted = {i: flattened("expected", v) for i, v in expected.items()}
        expected_keys = dict.fromkeys(key for flat in wanted.values() for key in flat)
        field_keys = dict.fromkeys(f"score.{name}" for s in scores.values() for name in (s.fields or {}))

        def columns(index: int) -> dict[str, Any]:
            s = scores.get(index)
            flat = wanted.get(index, {})
            fields = {f"score.{k}": v for k, v in (s.fields or {}).items()} if s is not None else {}
            return {**{key: flat.get(key) for key in expected_keys},
                    "score": s.score if s is not None else None, "passed": s.passed if s is not None else None,
                    **{key: fields.get(key) for key in field_keys},
                    "score_error": s.error if s is not None else None}
        return columns

    def item_keys(self) -> list[str]:
        """Each item's key (``manifest.item_key``), in item order."""
        return self._keys()

    def _keys(self) -> list[str]:
        """Each item's key: from its input where the inputs are at hand, else as the results files recorded it."""
        if len(self.inputs) >= self.total:
            return [item_key(self.inputs[i], i) for i in range(self.total)]
        with RecordIndex(self.results_path, self.total) as results, \
                RecordIndex(self.failures_path, self.total) as failures:
            return [_recorded_key(i, results.get(i), failures.get(i)) for i in range(self.total)]

    def to_pandas(self) -> pandas.DataFrame:
        """``rows()`` as a pandas DataFrame indexed by item, with pandas' nullable dtypes (needs the ``[pandas]``
        extra)."""
        try:
            import pandas  # deferred: an optional extra, and heavy
        except ImportError:
            raise ImportError("MapResult.to_pandas() needs pandas: pip install 'tensorjob-jupyter[pandas]' "
                              "(or use .rows(), a list of dicts)") from None
        # Nullable dtypes: a count stays a whole number where some items have none (not 1.0 and NaN);
        # a score stays a fraction even where every one is whole.
        columns: dict[str, list] = {}
        for row in self._rows():  # column by column: never every row as a dict and the table at once
            for key, value in row.items():
                columns.setdefault(key, []).append(value)
        return float_scores(pandas.DataFrame(columns).convert_dtypes().set_index("item"))

    def __repr__(self) -> str:
        rate = rate_text(self.ran, self.elapsed_s)
        skipped = f", {self.skipped} skipped" if self.skipped else ""
        return (f"<MapResult {self.status}: {self.total} items, {self.completed} completed, {self.failed} failed"
                f"{skipped}; {self.elapsed_s:.1f} s" + (f", {rate}" if rate else "") + ">")

    def to_json(self) -> dict:
        return {"status": self.status, "run_dir": str(self.run_dir), "results": str(self.results_path),
                "failures": str(self.failures_path), "total": self.total, "completed": self.completed,
                "failed": self.failed, "skipped": self.skipped, "ran": self.ran,
                "elapsed_s": round(self.elapsed_s, 3), "throughput": round(self.throughput, 3),
                "error": self.error, "tokens": self.tokens,
                "score": summary.to_json() if (summary := self.score_summary()) is not None else None}


def float_scores(table):
    """A table's score columns (``score``, ``score_*``) as nullable floats (``convert_dtypes`` makes scores that
    are all whole numbers integers)."""
    for column in table.columns:
        if column == "score" or column.startswith("score_") and column != "score_error":
            table[column] = table[column].astype("Float64")
    return table


def _recorded_key(index: int, record: dict | None, failure: dict | None) -> str:
    """An item's key as its records name it (a completed item's record first), else its number."""
    for r in (record, failure):
        if r is not None and isinstance(r.get("key"), str):
            return r["key"][:MAX_KEY_CHARS]
    return str(index)


def record_confidence(record: dict) -> dict[str, float | None] | None:
    """A results record's confidence by field, read as untrusted (``MapResult.confidences``); None without."""
    value = record.get("confidence")
    if not isinstance(value, dict):
        return None
    return {str(k): (float(v) if type(v) in (int, float) and 0 <= v <= 1 else None)
            for k, v in list(value.items())[:MAX_FIELDS]}


def record_rejected(record: dict) -> dict[str, str]:
    """A results record's rejected fields (``Envelope.rejected``: path -> why) when they are what a map records
    (``check_rejected``); ``{}`` otherwise."""
    rejected = record.get("rejected")
    return rejected if isinstance(rejected, dict) and check_rejected(rejected) is None else {}


def record_sources(record: dict) -> dict[str, list[dict]] | None:
    """A results record's sources when they are what a map records (``check_sources``); None otherwise."""
    sources = record.get("sources")
    return sources if isinstance(sources, dict) and check_sources(sources) is None else None


def flattened(prefix: str, value: Any) -> dict[str, Any]:
    """A value as table columns: an object's fields as ``PREFIX.NAME`` (one level), anything else as ``PREFIX``.

    ``NAME`` is the key as a field path spells it (``host.fields``: ``.`` and ``\\`` escaped with ``\\``), the
    spelling the ``source.``, ``grounded.``, ``confidence.`` and ``score.`` columns use: a key ``total.amount``
    is ``result.total\\.amount``, never the column of ``{"total": {"amount": ...}}``'s field ``total.amount``."""
    if isinstance(value, dict):
        return {f"{prefix}.{field_path((str(key),))}": item for key, item in value.items()}
    return {prefix: value}


@dataclass
class ItemTimes:
    """Where item time went, summed over this session (for benchmarks)."""

    items: int = 0
    setup_s: float = 0.0    # building the Job (grants, event stream, transcript folder)
    run_s: float = 0.0      # start -> envelope: thread, reactor, transcript close
    reactor_s: float = 0.0  # of which the reactor: instantiate, guest calls, inference
    latency_s: float = 0.0  # submitted -> outcome back in the map's thread

    def to_json(self) -> dict:
        n = self.items or 1
        return {"items": self.items, "setup_ms": 1000 * self.setup_s / n, "run_ms": 1000 * self.run_s / n,
                "reactor_ms": 1000 * self.reactor_s / n, "latency_ms": 1000 * self.latency_s / n}


__all__ = ["NOT_RUN", "rate_text", "MapProgress", "MapResult", "float_scores", "flattened", "record_confidence",
           "record_sources", "ItemTimes"]

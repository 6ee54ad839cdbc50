"""A map's scores in all, as a table: the mean with its interval, passed and failed, a row per field.

    result.score_summary()      # ScoreSummary: str() is a few lines and a table; a notebook shows HTML

``ScoreSummary.of`` counts the items' scores (``scoring.ItemScore``) once; ``lines()``, ``to_json()`` and
``_repr_html_`` only show what it counted, deterministically (no times, no paths), with the trust figures of
``calibration`` and a review's certificate beside them where there are any. Apart from the scorers: it reads
scores, whoever gave them.

Design: docs/internals/fanout.md#scoringpy
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from tensorjob_jupyter.fanout.calibration import FieldSignal
from tensorjob_jupyter.fanout.score_interval import INTERVAL_METHOD, THIN, wilson_interval
from tensorjob_jupyter.fanout.scoring import ItemScore


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
            signals = (f"<div>{escape(self._signal_heading(header))}</div><table><thead><tr>" + cells
                       + "</tr></thead><tbody>"
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


__all__ = ["FieldScore", "ScoreSummary"]

"""Two maps side by side, item by item: their results, scores, tokens and time.

    diff = tj.compare("runs/v1", "runs/v2")        # tensorjob diff --map runs/v1 runs/v2

Both maps must have mapped the same manifest, so item ``i`` is the same input in both. Each row says what
changed; the summary counts it. Everything read comes from run folders, which may come from anywhere.

Design: docs/internals/history.md#map_comparepy
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import partial
from typing import Any, Iterable

from tensorjob_jupyter.abi import dumps
from tensorjob_jupyter.fanout.errors import MapError
from tensorjob_jupyter.fanout.progress import MapResult, flattened, float_scores
from tensorjob_jupyter.fanout.score_interval import INTERVAL_METHOD, wilson_interval
from tensorjob_jupyter.fanout.scoring import same
from tensorjob_jupyter.history.maps import RecordedMap
from tensorjob_jupyter.host.fields import field_path
from tensorjob_jupyter.record.event_checks import TranscriptError
from tensorjob_jupyter.record.recording import StepReader, normalise
from tensorjob_jupyter.text import for_terminal

#: Rows ``lines()`` lists (the ones that changed first); the rest are counted.
SHOW_ROWS = 20
#: Characters of one cell of the printed table.
CELL_CHARS = 60
#: How deep ``changed_fields`` goes into nested result objects.
MAX_FIELD_DEPTH = 8
#: Changed items whose recordings are read to see whether the same prompts were answered otherwise, and
#: the steps of each compared.
MAX_PROMPT_CHECKS = 200
MAX_STEPS_COMPARED = 64


#: What ``changed_values`` gives for a field one side does not have.
ABSENT = object()


def changed_values(a: Any, b: Any, prefix: str = "", depth: int = 0) -> list[tuple[str, Any, Any]]:
    """The fields in which two result objects differ, as (dotted name, old value, new value) -- a field only
    one has counts, with ``ABSENT`` on the other side; for values that are not both objects,
    ``[(prefix or "result", a, b)]`` when they differ. Names are paths as ``host.fields`` spells them (a key
    ``"a.b"`` is ``a\\.b``), so a dotted key never meets a nested field of the same spelling."""
    if not (isinstance(a, dict) and isinstance(b, dict)) or depth >= MAX_FIELD_DEPTH:
        return [] if same(a, b) else [(prefix or "result", a, b)]
    out: list[tuple[str, Any, Any]] = []
    for key in dict.fromkeys([*a, *b]):
        name = f"{prefix}.{field_path((str(key),))}" if prefix else field_path((str(key),))
        if key not in a or key not in b:
            out.append((name, a.get(key, ABSENT), b.get(key, ABSENT)))
        elif isinstance(a[key], dict) and isinstance(b[key], dict):
            out += changed_values(a[key], b[key], name, depth + 1)
        elif not same(a[key], b[key]):
            out.append((name, a[key], b[key]))
    return out


def changed_fields(a: Any, b: Any) -> list[str]:
    """The dotted names of the fields in which two result objects differ (``changed_values``' names)."""
    return [name for name, _old, _new in changed_values(a, b)]


@dataclass(frozen=True)
class Side:
    """What one map says of one item."""

    status: str  # completed, failed, or not run
    result: Any = None
    error_code: str | None = None
    score: float | None = None
    tokens: int | None = None
    ms: int | None = None


class MapComparison:
    """Two maps of the same manifest, item by item (see the module doc)."""

    columns_a = "a"
    columns_b = "b"

    def __init__(self, a: RecordedMap, b: RecordedMap):
        if a.result.total != b.result.total or a.ledger["manifest_sha256"] != b.ledger["manifest_sha256"]:
            raise MapError(f"{a.path} and {b.path} mapped different manifests ({a.result.total} and "
                           f"{b.result.total} items); a comparison is item by item over the same manifest")
        self.a, self.b = a, b
        self.total = a.total
        self.sides = (_sides(a), _sides(b))
        self._otherwise: list[int] | None = None  # answered_otherwise(), once
        self._decoding: dict[int, list] = {}  # how those items' differing answers were decoded

    # -- one row an item -------------------------------------------------------------------------------

    def changed(self, item: int) -> bool:
        x, y = self.sides[0][item], self.sides[1][item]
        if x.status != y.status:
            return True
        if x.status == "completed":
            return not same(x.result, y.result)
        return x.error_code != y.error_code

    def row(self, item: int) -> dict[str, Any]:
        x, y = self.sides[0][item], self.sides[1][item]
        both = x.status == y.status == "completed"
        na, nb = self.columns_a, self.columns_b
        row = {"item": item, **self._input(item)}
        row.update({f"status_{na}": x.status, f"status_{nb}": y.status,
                    f"result_{na}": x.result if x.status == "completed" else x.error_code,
                    f"result_{nb}": y.result if y.status == "completed" else y.error_code,
                    "changed": self.changed(item),
                    "changed_fields": changed_fields(x.result, y.result) if both else [],
                    f"score_{na}": x.score, f"score_{nb}": y.score,
                    f"tokens_{na}": x.tokens, f"tokens_{nb}": y.tokens, f"ms_{na}": x.ms, f"ms_{nb}": y.ms})
        return row

    def _input(self, item: int) -> dict[str, Any]:
        inputs = self.a.inputs()
        return flattened("input", inputs[item]) if item < len(inputs) and inputs[item] is not None else {}

    def rows(self) -> list[dict[str, Any]]:
        """One dict per item, in item order, all with the same keys (see the module doc)."""
        rows = [self.row(i) for i in range(self.total)]
        keys = dict.fromkeys(k for r in rows for k in r)
        return [{k: r.get(k) for k in keys} for r in rows]

    def to_pandas(self):
        """``rows()`` as a pandas DataFrame indexed by item (needs pandas)."""
        try:
            import pandas  # deferred: an optional extra, and heavy
        except ImportError:
            raise ImportError("to_pandas() needs pandas: pip install 'tensorjob-jupyter[pandas]' "
                              "(or use .rows(), a list of dicts)") from None
        return float_scores(pandas.DataFrame(self.rows()).convert_dtypes().set_index("item"))

    # -- in all ----------------------------------------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        """Counts and totals (see the module doc); ``mean_score_*`` over the items both sides scored."""
        xs, ys = self.sides
        changed = [i for i in range(self.total) if self.changed(i)]
        both: list[tuple[float, float]] = []  # the scores of the items both sides scored, a's then b's
        for i in range(self.total):
            x, y = xs[i].score, ys[i].score
            if x is not None and y is not None:
                both.append((x, y))
        na, nb = self.columns_a, self.columns_b
        out = {"items": self.total, "changed": len(changed), "same": self.total - len(changed),
               f"completed_{na}": sum(s.status == "completed" for s in xs),
               f"completed_{nb}": sum(s.status == "completed" for s in ys),
               "scored_both": len(both),
               f"mean_score_{na}": _mean(x for x, _ in both),
               f"mean_score_{nb}": _mean(y for _, y in both),
               f"passed_{na}": sum(x >= 1.0 for x, _ in both),
               f"passed_{nb}": sum(y >= 1.0 for _, y in both),
               "improved": sum(y > x for x, y in both),
               "regressed": sum(y < x for x, y in both),
               f"tokens_{na}": sum(s.tokens or 0 for s in xs), f"tokens_{nb}": sum(s.tokens or 0 for s in ys),
               f"ms_{na}": sum(s.ms or 0 for s in xs), f"ms_{nb}": sum(s.ms or 0 for s in ys)}
        return out

    @property
    def same(self) -> bool:
        return not any(self.changed(i) for i in range(self.total))

    def counts_line(self, s: dict) -> str:
        """The first line: what changed, what stayed the same."""
        na, nb = self.columns_a, self.columns_b
        return (f"{s['items']} items: {s['changed']} changed, {s['same']} the same "
                f"({s[f'completed_{na}']} -> {s[f'completed_{nb}']} completed)")

    def summary_lines(self) -> list[str]:
        s = self.summary()
        na, nb = self.columns_a, self.columns_b
        out = [self.counts_line(s)]
        if s["scored_both"]:
            n = s["scored_both"]
            old, new = s[f"mean_score_{na}"], s[f"mean_score_{nb}"]
            (lo_a, hi_a), (lo_b, hi_b) = wilson_interval(old, n), wilson_interval(new, n)
            out.append(f"score: {old:.3f} -> {new:.3f} over the {n} item{'s' if n != 1 else ''} both scored "
                       f"({s[f'passed_{na}']} -> {s[f'passed_{nb}']} passed; {s['improved']} better, "
                       f"{s['regressed']} worse); 95% intervals {lo_a:.2f}-{hi_a:.2f} -> {lo_b:.2f}-{hi_b:.2f}")
            if old != new and max(lo_a, lo_b) <= min(hi_a, hi_b):
                out.append(f"  the intervals overlap: on {n} items the change in the mean may be chance "
                           f"({INTERVAL_METHOD}); label more items to tell")
        out.append(f"tokens: {s[f'tokens_{na}']} -> {s[f'tokens_{nb}']}; item time: "
                   f"{s[f'ms_{na}'] / 1000:.1f} s -> {s[f'ms_{nb}'] / 1000:.1f} s")
        same_prompts = self.answered_otherwise()
        if same_prompts:
            out.append(f"{len(same_prompts)} of the changed items asked the same prompts and got other answers "
                       f"(items {_items(same_prompts)}): {self.nondeterminism(same_prompts)}")
        return out

    #: The columns of the printed table of items.
    table_header: tuple[str, ...] = ("item", "status", "score", "changed")

    def listed(self, row: dict) -> bool:
        """Whether the printed table lists this item's row."""
        return row["changed"]

    def table_rows(self, row: dict) -> list[list[str]]:
        """The item's lines in the printed table: the first with its status and score, and one more for each
        further field that changed (``field: old -> new``)."""
        na, nb = self.columns_a, self.columns_b
        changes = self.change_texts(row) or [""]
        first = [str(row["item"]), arrow(row[f"status_{na}"], row[f"status_{nb}"]),
                 arrow(score_text(row[f"score_{na}"]), score_text(row[f"score_{nb}"])), changes[0]]
        return [first] + [["", "", "", text] for text in changes[1:]]

    def change_texts(self, row: dict) -> list[str]:
        """What changed in an item, one text a field: ``name: old -> new`` (each value clipped)."""
        na, nb = self.columns_a, self.columns_b
        x, y = self.sides[0][row["item"]], self.sides[1][row["item"]]
        if x.status == y.status == "completed":
            return [f"{name}: {arrow(_json_short(old), _json_short(new))}"
                    for name, old, new in changed_values(x.result, y.result)]
        if row["changed"]:
            return [arrow(_short(row[f"result_{na}"]), _short(row[f"result_{nb}"]))]
        return []

    def table_lines(self, max_rows: int | None = SHOW_ROWS) -> list[str]:
        """The items that changed as a small text table: at most ``max_rows`` of them (None: every one), and a
        line saying how many more there are and where to see them."""
        rows = [r for r in map(self.row, range(self.total)) if self.listed(r)]
        if not rows:
            return [self.nothing_listed]
        shown = rows if max_rows is None else rows[:max_rows]
        out = text_table(list(self.table_header), [line for r in shown for line in self.table_rows(r)])
        if len(rows) > len(shown):
            out.append(f"... and {len(rows) - len(shown)} more of the {len(rows)} listed items: "
                       f"{self.every_row_hint}")
        return out

    #: Where every row is, in the words of the place the lines are read.
    every_row_hint = "lines(max_rows=None) or the command line lists them all; to_pandas() has every column"
    nothing_listed = "no item changed"

    def lines(self, max_rows: int | None = SHOW_ROWS) -> list[str]:
        """The summary, then the table of the items listed (``table_lines``)."""
        return [_line(x) for x in self.summary_lines() + self.table_lines(max_rows)]

    # -- why the same prompt can be answered otherwise ---------------------------------------------------

    def answered_otherwise(self, limit: int = MAX_PROMPT_CHECKS) -> list[int]:
        """The changed items (at most ``limit`` looked at) whose recordings on both sides asked the model the
        same prompts, yet were answered otherwise: their change is the model's, not the guest's."""
        if self._otherwise is None:
            found = []
            for item in [i for i in range(self.total) if self.changed(i)][:limit]:
                if self._same_prompts_other_answer(item):
                    found.append(item)
            self._otherwise = found
        return self._otherwise

    def _same_prompts_other_answer(self, item: int) -> bool:
        run_a, run_b = self.a.item_run(item), self.b.item_run(item)
        if run_a is None or run_b is None:
            return False
        try:
            steps = [list(StepReader(r.path))[:MAX_STEPS_COMPARED] for r in (run_a, run_b)]
        except (OSError, TranscriptError):
            return False
        for x, y in zip(*steps):
            if normalise(x.command) != normalise(y.command):
                return False  # the guest asked otherwise first
            if x.infer is not None and y.infer is not None and x.infer.text != y.infer.text:
                self._decoding[item] = [x.infer.timing, y.infer.timing, x.infer.cached_tokens, y.infer.cached_tokens]
                return True
        return False

    def nondeterminism(self, items: list[int]) -> str:
        """Why the same prompt can be answered otherwise, from what the recordings say of how it was decoded."""
        batched, threads, cached = False, set(), False
        for item in items:
            timing_a, timing_b, cached_a, cached_b = self._decoding.get(item, [None, None, 0, 0])
            for timing in (timing_a, timing_b):
                timing = timing if isinstance(timing, dict) else {}
                batch = timing.get("batch")
                batched |= not isinstance(batch, int) or batch > 1
                if isinstance(timing.get("threads"), int):
                    threads.add(timing["threads"])
            cached |= bool(cached_a or cached_b)
        causes = []
        if batched:
            causes.append("decoded beside other items (batch composition)")
        if len(threads) > 1:
            causes.append(f"other thread counts ({', '.join(map(str, sorted(threads)))})")
        if cached:
            causes.append("a prompt prefix reused from the cache")
        said = "; ".join(causes) if causes else "the model or its build differs"
        return (f"greedy answers depend on how they are decoded -- here {said} (docs/maps.md, when answers can "
                f"differ); map with --deterministic where reruns must match")

    def to_json(self) -> dict:
        return {"a": str(self.a.path), "b": str(self.b.path), "summary": self.summary(), "rows": self.rows()}

    def __str__(self) -> str:
        return "\n".join(self.lines())

    def _repr_pretty_(self, printer, cycle: bool) -> None:
        """IPython shows the lines (a notebook's ``Out[]``)."""
        printer.text(str(self))

    def __repr__(self) -> str:
        s = self.summary()
        return f"<{type(self).__name__} {s['items']} items, {s['changed']} changed>"


def compare(a: "str | os.PathLike | MapResult | RecordedMap", b: "str | os.PathLike | MapResult | RecordedMap"
            ) -> MapComparison:
    """Compare two maps of the same manifest, each a run folder or a ``MapResult`` (see the module doc)."""
    return MapComparison(_recorded(a), _recorded(b))


def _recorded(m: Any) -> RecordedMap:
    if isinstance(m, RecordedMap):
        return m
    if isinstance(m, MapResult):
        return RecordedMap(m.run_dir)
    return RecordedMap(m)


def _sides(m: RecordedMap) -> list[Side]:
    results, failures, scores, runs = m.result.results(), m.result.failures(), m.result.scores() or {}, m.item_runs()
    out = []
    for i in range(m.total):
        run = runs.get(i)
        score = scores.get(i)
        side = partial(Side, score=score.score if score is not None else None,
                       tokens=run.tokens if run is not None else None, ms=run.duration_ms if run is not None else None)
        if i in results:
            out.append(side("completed", results[i]))
        elif i in failures:
            error = failures[i] if isinstance(failures[i], dict) else {}
            code = error.get("code")
            out.append(side("failed", None, code if isinstance(code, str) else None))
        else:
            out.append(side("not run"))
    return out


def _items(items: list[int], show: int = 20) -> str:
    return ", ".join(map(str, items[:show])) + (" ..." if len(items) > show else "")


def _mean(values: Iterable[float]) -> float | None:
    values = list(values)
    return sum(values) / len(values) if values else None


def score_text(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def arrow(a: str, b: str) -> str:
    return a if a == b else f"{a} -> {b}"


def _json_short(value: Any) -> str:
    """A value as JSON (a string quoted, so ``"1"`` and ``1`` differ), clipped; ``(none)`` for a field not there."""
    return _short(value if value is ABSENT else dumps(value))


def _short(value: Any) -> str:
    if value is ABSENT:
        return "(none)"
    text = value if isinstance(value, str) else dumps(value) if value is not None else "-"
    text = for_terminal(" ".join(text.split()), one_line=True)
    return text if len(text) <= CELL_CHARS // 2 else text[:CELL_CHARS // 2 - 1] + "…"


def text_table(header: list[str], body: list[list[str]]) -> list[str]:
    cells = [[_cell(c) for c in row] for row in [header, *body]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]


def _cell(text: str) -> str:
    text = for_terminal(text, one_line=True)
    return text if len(text) <= CELL_CHARS else text[:CELL_CHARS - 1] + "…"


def _line(text: str) -> str:
    text = for_terminal(text, one_line=True)
    return text if len(text) <= 1000 else text[:999] + "…"


__all__ = [
    "SHOW_ROWS", "CELL_CHARS", "MAX_FIELD_DEPTH", "MAX_PROMPT_CHECKS", "ABSENT", "changed_values", "changed_fields", "Side", "MapComparison", "compare", "score_text",
    "arrow", "text_table"
]

"""Maps with expected answers: the scorers, the score columns and summary, resume, the token budget.

The puppet guest (test_map.py) makes each manifest line decide its item's result, so scores are exact.
The command line runs in a subprocess, as a user runs it; the Dask path is in test_map_cluster.py, the
magic in test_kernel.py.
"""

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import tensorjob_jupyter as tj
from tensorjob_jupyter.fanout import ScoringError
from tensorjob_jupyter.fanout.expected import Expected
from tensorjob_jupyter.fanout.score_summary import ScoreSummary
from tensorjob_jupyter.fanout.scoring import (
    BUILTINS, ItemScore, Scored, contains, exact, json_fields, same, score_item, scorer_of,
)
from tensorjob_jupyter.inference import ScriptedBackend
from test_map import done, fail, infer, puppet_guest, write_manifest

ROOT = Path(__file__).resolve().parents[2]

json_values = st.recursive(st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=False,
                           allow_infinity=False) | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner,
                                                                                       max_size=4), max_leaves=12)


@pytest.fixture(scope="module")
def guest():
    return puppet_guest()


def cli(*argv, cwd, timeout=120):
    proc = subprocess.run([sys.executable, "-m", "tensorjob_jupyter.frontends.cli", *map(str, argv)], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout, proc.stderr


# --- the scorers --------------------------------------------------------------------------------------------


def test_json_equality_is_by_value_but_a_boolean_is_never_a_number():
    assert same(1, 1.0) and same({"a": [1, {"b": None}]}, {"a": [1.0, {"b": None}]})
    assert not same(True, 1) and not same(0, False) and not same(None, 0) and not same("1", 1)
    assert not same([1, 2], [2, 1]) and not same({"a": 1}, {"a": 1, "b": 2})
    assert exact({"x": True}, {"x": True}) == 1.0 and exact({"x": 1}, {"x": True}) == 0.0


def test_json_fields_scores_each_leaf_of_the_expected_object():
    got = json_fields({"path": "a", "facts": {"title": "Bridge", "year": 1894.0, "extra": 1}},
                      {"facts": {"title": "Bridge", "year": 1894, "keywords": ["x"]}})
    assert got == Scored(2 / 3, {"facts.title": True, "facts.year": True, "facts.keywords": False})
    assert json_fields('{"a": 1}', {"a": 1}) == Scored(1.0, {"a": True})  # a JSON string is parsed first
    assert json_fields("not json", {"a": 1}) == Scored(0.0, {"a": False})
    assert json_fields({"a": {}}, {"a": {}}).value == 1.0  # an empty object is a leaf
    with pytest.raises(ValueError, match="needs an object"):
        json_fields({}, [1])


def test_contains_ignores_case_and_scores_each_text():
    assert contains("The Stone BRIDGE", "bridge") == Scored(1.0, None)
    assert contains({"title": "Stone Bridge"}, ["stone", "tide"]) == Scored(0.5, {"stone": True, "tide": False})
    with pytest.raises(ValueError, match="a string or a list of strings"):
        contains("x", 3)


def test_a_python_scorer_gives_a_bool_a_number_or_a_scored_and_anything_else_is_its_error():
    def check(fn, result=1, expected=1):
        return score_item(scorer_of(fn), 7, True, result, expected)

    assert check(lambda r, e: r == e) == ItemScore(7, 1.0)
    assert check(lambda r, e: 0.25).score == 0.25
    assert check(lambda r, e: Scored(0.5, {"f": True})) == ItemScore(7, 0.5, {"f": True})
    for bad in (1.5, -0.1, math.nan, "1", None, [1]):
        s = check(lambda r, e, bad=bad: bad)
        assert s.score is None and "a score is a number from 0 to 1" in s.error
    boom = check(lambda r, e: 1 / 0)
    assert boom.score is None and boom.error == "ZeroDivisionError: division by zero"
    assert check(lambda r, e: Scored(1.0, {"f": "yes"})).error.startswith("the scorer's fields")
    assert scorer_of(check).name.startswith("python:") and not scorer_of(check).builtin


def test_a_failed_item_scores_zero_and_misses_every_field():
    s = score_item(BUILTINS["json_fields"], 0, False, None, {"a": 1, "b": {"c": 2}})
    assert s == ItemScore(0, 0.0, {"a": False, "b.c": False})
    assert score_item(BUILTINS["exact"], 0, False, None, None) == ItemScore(0, 0.0)


def test_an_unknown_scorer_is_refused_by_name():
    with pytest.raises(ScoringError, match="unknown scorer 'fuzzy'.*exact, json_fields, contains"):
        scorer_of("fuzzy")
    with pytest.raises(ScoringError, match="a name .* or a function"):
        scorer_of(3)


@given(json_values, json_values)
def test_every_builtin_scores_any_json_from_0_to_1_or_says_why_not(result, expected):
    for scorer in BUILTINS.values():
        s = score_item(scorer, 0, True, result, expected)
        assert (s.score is None) == (s.error is not None)
        assert s.score is None or 0.0 <= s.score <= 1.0
        assert s == ItemScore.from_json(json.loads(json.dumps(s.to_json())), 1)  # what scores.jsonl keeps


@given(json_values)
def test_any_value_scores_1_against_itself(value):
    assert exact(value, value) == 1.0
    if isinstance(value, dict):
        assert json_fields(value, value).value == 1.0


@given(st.dictionaries(st.sampled_from(["item", "score", "fields", "error"]), json_values))
def test_a_score_record_from_a_file_is_checked(record):
    try:
        s = ItemScore.from_json(record, 5)
    except ValueError:
        return
    assert 0 <= s.item < 5 and (s.score is None or 0 <= s.score <= 1)


# --- expected answers ---------------------------------------------------------------------------------------


def test_expected_answers_are_one_per_item_in_manifest_order_and_null_or_no_line_is_not_labelled(tmp_path):
    path = write_manifest(tmp_path / "e.jsonl", [{"a": 1}, None, "x"])
    e = Expected.read(path, 4)  # a shorter file: the items past its end are not labelled
    assert [e.get(i) for i in range(5)] == [(True, {"a": 1}), (False, None), (True, "x"), (False, None), (False, None)]
    assert e.labelled == 2 and list(e.items()) == [(0, {"a": 1}), (2, "x")]
    with pytest.raises(ScoringError, match="more than 2 values for a manifest of 2 items .line 3.*null, or no line, for an item not labelled"):
        Expected.read(path, 2)
    partial = Expected.read({"2": "x", 0: 1, 1: None}, 3)
    assert list(partial.items()) == [(0, 1), (2, "x")] and partial.get(1) == (False, None) and partial.labelled == 2
    assert Expected.read([None, 5], 2).labelled == 1
    for bad, says in [({3: 1}, "numbered 0 to 2"), ({True: 1}, "numbered 0 to 2"), ({0: 1, "0": 2}, "two expected"),
                      (tmp_path / "nope.jsonl", "No such file"), (3.5, "a JSONL file, a list or a dict")]:
        with pytest.raises(ScoringError, match=says):
            Expected.read(bad, 3)
    (tmp_path / "bad.jsonl").write_text('{"a": 1}\n{"a": NaN}\n', encoding="utf-8")
    with pytest.raises(ScoringError, match="line 2"):
        Expected.read(tmp_path / "bad.jsonl", 2)


def test_expected_answers_keyed_by_the_manifests_key_or_by_item(tmp_path):
    keys = ["emails/001.txt", "emails/002.txt", "emails/003.txt", "dup", "dup"]
    path = write_manifest(tmp_path / "e.jsonl", [{"key": "emails/003.txt", "expected": {"a": 3}}, None,
                                                 {"key": "emails/001.txt", "expected": None},
                                                 {"item": 1, "expected": "one"}])
    e = Expected.read(path, 5, lambda: keys)
    assert list(e.items()) == [(1, "one"), (2, {"a": 3})] and e.labelled == 2 and e.get(0) == (False, None)
    assert list(Expected.read({"emails/002.txt": 2}, 5, lambda: keys).items()) == [(1, 2)]
    for lines, says in [([{"key": "nope", "expected": 1}], "no item of the manifest has the key 'nope'"),
                        ([{"key": "dup", "expected": 1}], "names 2 items of the manifest .3, 4.; key those lines by "
                                                           "item number"),
                        ([{"key": 7, "expected": 1}], "a key is the item's key as text"),
                        ([{"item": 9, "expected": 1}], "item 9 -- the items are numbered 0 to 4"),
                        ([{"key": "emails/001.txt", "expected": 1}, "plain"], "value 2 is not"),
                        ([{"item": 0, "expected": 1}, {"key": "emails/001.txt", "expected": 2}],
                         "item 0 has an expected answer already .value 1.")]:
        with pytest.raises(ScoringError, match=says):
            Expected.read(write_manifest(tmp_path / "bad.jsonl", lines), 5, lambda: keys)


keyed_lines = st.lists(st.none() | json_values | st.fixed_dictionaries(
    {"key": st.sampled_from(["a", "b", "c", "", "zz"]) | json_values, "expected": json_values}) |
    st.fixed_dictionaries({"item": st.integers(-2, 6) | json_values, "expected": json_values}), max_size=8)


@given(keyed_lines)
def test_any_expected_file_is_read_or_refused_in_one_line(lines):
    try:
        e = Expected.read(lines, 5, lambda: ["a", "b", "c", "b", "4"])
    except ScoringError as error:
        assert "\n" not in str(error)
        return
    assert e.labelled == len(list(e.items())) <= 5
    assert all(0 <= i < 5 and v is not None and e.get(i) == (True, v) for i, v in e.items())


# --- a scored map -------------------------------------------------------------------------------------------

ITEMS = [done({"title": "A", "year": 1}), done({"title": "B", "year": 2}), fail("bad_item", "no"),
         done({"title": "D", "year": 4}), done({"title": "E", "year": 5})]
EXPECTED = [{"title": "A", "year": 1}, {"title": "B", "year": 20}, {"title": "C", "year": 3},
            {"title": "d", "year": 4}, {"title": "E", "year": 5}]


def test_a_scored_map_has_score_columns_a_summary_and_keeps_its_expected_answers(guest, tmp_path):
    result = tj.map(guest, ITEMS, tmp_path / "run", expected=EXPECTED, scorer="json_fields")
    summary = result.score_summary()
    assert (summary.scored, summary.passed, summary.failed, summary.errors) == (5, 2, 3, 0)
    assert summary.mean == pytest.approx((1 + 0.5 + 0 + 0.5 + 1) / 5)
    assert summary.fields == {"title": pytest.approx(3 / 5), "year": pytest.approx(3 / 5)}
    rows = result.rows()
    assert [r["score"] for r in rows] == [1.0, 0.5, 0.0, 0.5, 1.0]
    assert [r["passed"] for r in rows] == [True, False, False, False, True]
    assert [r["score.year"] for r in rows] == [True, False, False, True, True]
    assert rows[1]["expected.year"] == 20 and rows[2]["status"] == "failed"
    table = result.to_pandas()
    assert list(table["score"]) == [1.0, 0.5, 0.0, 0.5, 1.0] and table["score.title"].sum() == 3
    assert result.to_json()["score"]["passed"] == 2
    run = tmp_path / "run"
    assert {"expected.jsonl", "scoring.json", "scores.jsonl"} <= {p.name for p in run.iterdir()}
    assert json.loads((run / "scoring.json").read_text())["scorer"] == "json_fields"
    assert tj.MapResult.read(run).score_summary() == summary  # read back from the folder alone


def test_unlabelled_items_are_not_scored_and_not_counted_and_the_summary_says_so_once(guest, tmp_path):
    items = [done({"title": "A", "year": 1}), fail("bad_item", "no"), done({"title": "C"}), fail("bad_item", "no"),
             done({"title": "E", "year": 5})]
    partial = [{"title": "A", "year": 1}, None, {"title": "c"}, {"title": "D"}]  # 1 null, item 4 has no line
    result = tj.map(guest, items, tmp_path / "run", expected=partial, scorer="json_fields")
    s = result.score_summary()
    assert (s.labelled, s.unlabelled, s.scored, s.errors, s.passed) == (3, 2, 3, 0, 1)
    assert s.mean == pytest.approx((1 + 0 + 0) / 3)  # the failed unlabelled item 1 counts nowhere
    assert [r["score"] for r in result.rows()] == [1.0, None, 0.0, 0.0, None]
    assert [r["score_error"] for r in result.rows()] == [None] * 5
    text = str(s)
    assert text.count("not labelled") == 1 and "labelled: 3 of 5 items" in text and "could not" not in text
    assert s.field_rows[0].name == "title" and (s.field_rows[0].labelled, s.field_rows[0].right) == (3, 1)
    assert [row.labelled for row in s.field_rows] == [3, 1]  # only item 0's answer has a year
    assert tj.MapResult.read(tmp_path / "run").score_summary() == s
    assert [json.loads(line)["item"] for line in (tmp_path / "run" / "expected.jsonl").read_text().splitlines()] \
        == [0, 2, 3]


def test_expected_answers_by_key_score_the_items_they_name(guest, tmp_path):
    items = [{"cmd": "done", "result": i, "path": f"emails/{i:03}.txt"} for i in range(6)]
    keyed = [{"key": "emails/004.txt", "expected": 4}, {"key": "emails/001.txt", "expected": 5}]
    result = tj.map(guest, items, tmp_path / "run", expected=keyed)
    s = result.score_summary()
    assert (s.labelled, s.scored, s.passed) == (2, 2, 1)
    assert {r["key"]: r["score"] for r in result.rows() if r["score"] is not None} == {"emails/001.txt": 0.0,
                                                                                      "emails/004.txt": 1.0}


def test_an_unscored_map_has_no_score_columns(guest, tmp_path):
    result = tj.map(guest, ITEMS, tmp_path / "run")
    assert result.score_summary() is None and result.scores() is None
    assert "score" not in result.rows()[0]


def test_resume_scores_the_whole_folder_and_a_new_scorer_rescores_it(guest, tmp_path):
    run = tmp_path / "run"
    tj.map(guest, ITEMS[:2] + [done("x")] * 3, run, expected=EXPECTED, scorer="json_fields", concurrency=1)
    again = tj.map(guest, ITEMS[:2] + [done("x")] * 3, run)  # no expected answers given: the folder's, its scorer
    assert again.ran == 0 and again.score_summary().scored == 5
    strict = tj.map(guest, ITEMS[:2] + [done("x")] * 3, run, scorer="exact")  # the folder's answers, another scorer
    assert strict.score_summary().scorer == "exact" and [s.score for s in strict.scores().values()] == [1, 0, 0, 0, 0]
    restarted = tj.map(guest, ITEMS[:2] + [done("x")] * 3, run, restart=True)
    assert restarted.score_summary() is None and not (run / "expected.jsonl").exists()


def test_a_python_scorer_runs_on_the_maps_thread_and_its_failures_are_the_items(guest, tmp_path):
    seen = []

    def scorer(result, expected):
        seen.append((result, expected))
        if expected == "boom":
            raise KeyError("no such thing")
        return result == expected

    result = tj.map(guest, [done(1), done(2), done(3)], tmp_path / "run", expected=[1, 5, "boom"], scorer=scorer)
    s = result.score_summary()
    assert (s.scored, s.passed, s.errors) == (2, 1, 1) and s.scorer.startswith("python:")
    assert result.rows()[2]["score_error"] == "KeyError: 'no such thing'" and result.rows()[2]["score"] is None
    assert sorted(seen) == [(1, 1), (2, 5), (3, "boom")]
    again = tj.map(guest, [done(1), done(2), done(3)], tmp_path / "run")  # a function cannot be named in a file
    assert again.score_summary().scored == 2  # the scores kept, not rescored


def test_a_scorer_that_exits_fails_its_own_item_and_the_map_goes_on(guest, tmp_path):
    def scorer(result, expected):
        if expected == "exit":
            raise SystemExit(3)
        return result == expected

    result = tj.map(guest, [done(1), done(2), done(3)], tmp_path / "run", expected=[1, "exit", 3], scorer=scorer)
    assert result.ran == 3 and [r["status"] for r in result.rows()] == ["completed"] * 3
    s = result.score_summary()
    assert (s.scored, s.passed, s.errors) == (2, 2, 1)
    assert result.rows()[1]["score_error"] == "the scorer raised SystemExit: 3"


def test_a_keyboard_interrupt_from_a_scorer_off_the_main_thread_is_its_items_error():
    import threading

    def scorer(result, expected):
        raise KeyboardInterrupt

    box = []
    thread = threading.Thread(target=lambda: box.append(score_item(scorer_of(scorer), 4, True, 1, 1)))
    thread.start()
    thread.join()
    assert box == [ItemScore(4, None, None, "the scorer raised KeyboardInterrupt")]
    with pytest.raises(KeyboardInterrupt):  # on the main thread it may be a real Ctrl-C: it still stops everything
        score_item(scorer_of(scorer), 4, True, 1, 1)


def test_the_running_score_is_in_every_progress_and_item_event(guest, tmp_path):
    events = []
    run = tj.start_map(guest, ITEMS, tmp_path / "run", expected=EXPECTED, scorer="json_fields", concurrency=1)
    run.subscribe(events.append)
    result = run.wait()
    items = [e for e in events if e["type"].startswith("item.")]
    assert len(items) == 5 and all("score" in e for e in items)
    final = run.progress()
    assert (final.scored, final.score_passed) == (5, 2) and final.mean_score == pytest.approx(0.6)
    assert result.score_summary().mean == pytest.approx(final.mean_score)


def test_the_map_view_shows_the_running_score_escaped():
    from tensorjob_jupyter.fanout import MapProgress
    from tensorjob_jupyter.frontends.view.map_widget import item_row, render_counts, render_items

    p = MapProgress(total=4, completed=3, scored=3, score_sum=2.0, score_passed=2)
    assert "score <b>0.67</b> (2/3 passed)" in render_counts(p)
    assert "score" not in render_counts(MapProgress(total=4))
    row = item_row({"type": "item.completed", "item": 0, "input": "<b>", "result": "<i>",
                    "score": {"item": 0, "score": 0.5}})
    html = render_items([row])
    assert "tj-map-item-score" in html and ">0.50<" in html and "<b>" not in html and "&lt;i&gt;" in html


def test_scoring_files_from_anywhere_are_checked(guest, tmp_path):
    run = tmp_path / "run"
    result = tj.map(guest, ITEMS, run, expected=EXPECTED, scorer="json_fields")
    (run / "scores.jsonl").write_text('{"item": 0, "score": 7}\n', encoding="utf-8")
    with pytest.raises(ScoringError, match="line 1 is not a score this map wrote"):
        result.scores()
    (run / "expected.jsonl").write_text('{"item": 99, "expected": 1}\n', encoding="utf-8")
    with pytest.raises(ScoringError, match=r"expected.jsonl: line 1 is not a record scoring wrote \(its item 99 is not "
                                           r"one of the map's 5 items"):
        tj.map(guest, ITEMS, run)  # refused before anything runs
    assert json.loads((run / "ledger.json").read_text())["sessions"][-1]["finished_at"]


def test_expected_answers_that_do_not_fit_refuse_the_map_before_anything_runs(guest, tmp_path):
    with pytest.raises(ScoringError, match="6 values for a manifest of 5 items"):
        tj.map(guest, ITEMS, tmp_path / "run", expected=EXPECTED + [1])
    with pytest.raises(ScoringError, match="no item of the manifest has the key 'x'"):
        tj.map(guest, ITEMS, tmp_path / "run", expected=[{"key": "x", "expected": 1}])
    with pytest.raises(ScoringError, match="a scorer needs expected answers"):
        tj.map(guest, ITEMS, tmp_path / "run", scorer="exact")
    assert not (tmp_path / "run").exists()


def test_a_summary_says_what_its_mean_rests_on_and_reads_as_a_table():
    s = ScoreSummary.of("json_fields", 4, [ItemScore(0, 1.0, {"a": True}), ItemScore(1, 0.0, {"a": False}),
                                          ItemScore(2, None, None, "boom")], labelled=4)
    assert s.lines() == ["score (json_fields): mean 0.500 over 2 items (95% interval 0.09-0.91); 1 passed, 1 failed, "
                         "1 could not be scored, 1 not scored yet",
                         "  field  labelled  right  accuracy  interval",
                         "  a             2      1     0.500  0.09-0.91",
                         "  a mean over 2 items is thin: its 95% interval is 0.81 wide (Wilson score interval, 95%)"]
    assert ScoreSummary.of("exact", 3, []).lines() == ["score (exact): no item scored yet (3 of 3 without a score)"]
    assert s.fields == {"a": 0.5} and s.field_rows[0].to_json()["interval"] == [pytest.approx(0.094531, abs=1e-5),
                                                                                pytest.approx(0.905469, abs=1e-5)]
    wide = ScoreSummary.of("exact", 100, [ItemScore(i, float(i % 2)) for i in range(100)], labelled=100)
    assert not any("thin" in line for line in wide.lines()) and wide.high - wide.low < 0.2


def test_the_wilson_interval_holds_its_mean_and_narrows_as_items_grow():
    from tensorjob_jupyter.fanout.score_interval import wilson_interval

    for mean in (0.0, 0.1, 0.5, 0.73, 1.0):
        widths = []
        for n in (1, 10, 100, 1000):
            low, high = wilson_interval(mean, n)
            assert 0.0 <= low <= mean <= high <= 1.0
            widths.append(high - low)
        assert widths == sorted(widths, reverse=True)
    assert wilson_interval(0.5, 0) == (0.0, 1.0)
    low, high = wilson_interval(3 / 10, 10)  # the textbook case: 3 of 10
    assert (round(low, 3), round(high, 3)) == (0.108, 0.603)


def test_a_summary_in_a_notebook_is_an_escaped_html_table():
    s = ScoreSummary.of("python:<b>x</b>", 3, [ItemScore(0, 1.0, {"<script>": True})], labelled=1)
    html = s._repr_html_()
    assert "<table>" in html and "<th>labelled</th>" in html and "<script>" not in html and "&lt;script&gt;" in html
    assert "&lt;b&gt;x&lt;/b&gt;" in html and "labelled: 1 of 3 items" in html


# --- the token budget ---------------------------------------------------------------------------------------


def test_the_token_budget_stops_the_map_cleanly_and_a_resume_goes_on(guest, tmp_path):
    items = [infer(f"item {i}", 3) for i in range(6)]
    backend = ScriptedBackend("one two three four")  # each item: 2 prompt tokens + 3 out
    result = tj.map(guest, items, tmp_path / "run", backend=backend, concurrency=1, max_total_tokens=12)
    assert result.status == "stopped" and result.completed == 3 and result.tokens == 15
    assert json.loads((tmp_path / "run" / "ledger.json").read_text())["sessions"][-1]["status"] == "stopped"
    rest = tj.map(guest, items, tmp_path / "run", backend=backend, concurrency=1)
    assert rest.ok and rest.skipped == 3 and rest.ran == 3
    done_all = tj.map(guest, items[:2], tmp_path / "two", backend=backend, concurrency=1, max_total_tokens=10)
    assert done_all.status == "finished"  # spent exactly as the last item ended: nothing left to stop
    with pytest.raises(ValueError, match="must be a whole number of at least 1"):
        tj.map(guest, items, tmp_path / "x", max_total_tokens=0)


def test_a_slow_scorer_never_holds_a_cancel_and_the_next_session_scores_what_it_left(guest, tmp_path):
    """Once a map is cancelled, the items that conclude are recorded but not scored: its end waits at most for
    the scorer call under way (the issue measured 38 s of waiting), and the next session scores them."""
    import threading

    from tensorjob_jupyter.fanout import start_map

    calls, cancelled, release = [], threading.Event(), threading.Event()

    def slow(result, expected):
        calls.append((result, cancelled.is_set()))
        if len(calls) == 1:
            release.wait(30)  # the first score holds the map's thread while every item ends
        return float(result == expected)

    items = [done(i) for i in range(8)]
    run = start_map(guest, items, tmp_path / "run", expected=list(range(8)), scorer=slow, concurrency=4)
    while not calls:
        run.wait_done(0.01)
    run.cancel()
    cancelled.set()
    release.set()
    result = run.wait(60)
    assert result.status == "cancelled"
    assert [c for c in calls if c[1]] == [], "an item was scored after the map was cancelled"
    assert len(calls) == 1 and len(run.scoring.scores) == 1
    again = tj.map(guest, items, tmp_path / "run", scorer=slow)
    assert again.ok and again.score_summary().scored == 8 and len(calls) == 9


# --- the command line ---------------------------------------------------------------------------------------


@pytest.mark.slow  # a CLI in a subprocess, or a long search: in the full suite, not the fast loop
def test_tensorjob_map_with_expected_answers_prints_the_score(guest, tmp_path):
    (tmp_path / "g.wasm").write_bytes(guest)
    write_manifest(tmp_path / "m.jsonl", ITEMS)
    write_manifest(tmp_path / "e.jsonl", EXPECTED)
    code, out, err = cli("map", "g.wasm", "--over", "m.jsonl", "--run-dir", "run", "--expected", "e.jsonl",
                         "--scorer", "json_fields", "--quiet", cwd=tmp_path)
    assert code == 1, err  # one item failed
    assert "score (json_fields): mean 0.600 over 5 items (95% interval 0.23-0.88); 2 passed, 3 failed" in out
    assert re.search(r"\n  title +5 +3 +0\.600 +0\.23-0\.88\n", out) and re.search(r"\n  year +5 +3 +0\.600", out), out
    code, out, err = cli("map", "g.wasm", "--over", "m.jsonl", "--run-dir", "run", "--json", cwd=tmp_path)
    assert json.loads(out)["score"]["mean"] == pytest.approx(0.6)
    code, out, err = cli("map", "g.wasm", "--over", "m.jsonl", "--run-dir", "other", "--expected", "m.jsonl",
                         "--scorer", "fuzzy", cwd=tmp_path)
    assert code == 2 and err.count("\n") == 1 and "unknown scorer 'fuzzy'" in err, err


@pytest.mark.slow  # CLIs in subprocesses
def test_tensorjob_map_with_partial_labels_and_then_another_manifest_over_its_folder(guest, tmp_path):
    """As met: 40 items, 10 labelled (nulls between), then a 3-line manifest over the same folder."""
    (tmp_path / "g.wasm").write_bytes(guest)
    items = [done({"n": i}) if i % 7 else fail("bad_item", "no") for i in range(40)]
    write_manifest(tmp_path / "m.jsonl", items)
    write_manifest(tmp_path / "e.jsonl", [{"n": i} if i % 4 == 0 else None for i in range(40)])
    code, out, err = cli("map", "g.wasm", "--over", "m.jsonl", "--run-dir", "runs/v1", "--expected", "e.jsonl",
                         "--scorer", "json_fields", "--quiet", cwd=tmp_path)
    assert code == 1, err
    assert "mean 0.800 over 10 items" in out and "labelled: 10 of 40 items" in out, out
    assert out.count("not labelled") == 1 and "could not be scored" not in out and "score error" not in out
    write_manifest(tmp_path / "small.jsonl", items[:3])
    code, out, err = cli("map", "g.wasm", "--over", "small.jsonl", "--run-dir", "runs/v1", cwd=tmp_path)
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert "holds another map" in err and "of 40 items" in err and "this one of 3 items" in err, err
    assert "--run-dir" in err and "--restart" in err and "expected.jsonl" not in err, err
    code, out, err = cli("map", "g.wasm", "--over", "small.jsonl", "--run-dir", "runs/v1", "--expected", "e.jsonl",
                         cwd=tmp_path)
    assert code == 2 and "more than 3 values for a manifest of 3 items (line 4" in err, err


def test_map_scoring_refusals_are_one_line_and_exit_2(guest, tmp_path, monkeypatch):
    import io

    from tensorjob_jupyter.frontends.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "g.wasm").write_bytes(guest)
    write_manifest(tmp_path / "m.jsonl", ITEMS)
    write_manifest(tmp_path / "long.jsonl", EXPECTED * 2)
    for extra, says in [(["--expected", "long.jsonl"], "more than 5 values for a manifest of 5 items (line 6"),
                        (["--expected", "nope.jsonl"], "expected answers: cannot read"),
                        (["--scorer", "exact"], "a scorer needs expected answers"),
                        (["--max-total-tokens", "0"], "--max-total-tokens (max_total_tokens=) must be a whole number of at least 1, got 0")]:
        out, err = io.StringIO(), io.StringIO()
        assert main(["map", "g.wasm", "--over", "m.jsonl", "--run-dir", "other", *extra], out=out, err=err) == 2
        assert err.getvalue().count("\n") == 1 and says in err.getvalue(), (extra, err.getvalue())
    assert not (tmp_path / "other").exists()  # nothing started


@pytest.mark.slow  # a CLI in a subprocess, or a long search: in the full suite, not the fast loop
def test_tensorjob_map_max_total_tokens_stops_and_the_same_command_goes_on(guest, tmp_path):
    from llama_support import write_tiny_gguf

    tiny = write_tiny_gguf(tmp_path / "tiny.gguf")
    (tmp_path / "g.wasm").write_bytes(guest)
    write_manifest(tmp_path / "m.jsonl", [infer(f"the cat {i}", 2) for i in range(4)])
    argv = ["map", "g.wasm", "--over", "m.jsonl", "--run-dir", "run", "--model", tiny, "--concurrency", "1",
            "--quiet"]
    code, out, err = cli(*argv, "--max-total-tokens", "5", cwd=tmp_path)
    assert code == 1, err
    assert "-- stopped" in out and "stopped: the token budget is spent" in out and "run the same map again" in out
    code, out, err = cli(*argv, cwd=tmp_path)
    assert code == 0, err
    assert "4 items: 4 completed, 0 failed (3 ran, 1 skipped)" in out

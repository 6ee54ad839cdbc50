"""Maps with expected answers: the scorers, the score columns and summary, resume, the token budget.

The puppet guest (test_map.py) makes each manifest line decide its item's result, so scores are exact.
The command line runs in a subprocess, as a user runs it; the Dask path is in test_map_cluster.py, the
magic in test_kernel.py.
"""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import tensorjob_jupyter as tj
from tensorjob_jupyter.fanout import ScoringError
from tensorjob_jupyter.fanout.scoring import (
    BUILTINS, Expected, ItemScore, Scored, ScoreSummary, contains, exact, json_fields, same, score_item, scorer_of,
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


def test_expected_answers_are_one_per_item_in_manifest_order(tmp_path):
    path = write_manifest(tmp_path / "e.jsonl", [{"a": 1}, None, "x"])
    e = Expected.read(path, 3)
    assert [e.get(i) for i in range(4)] == [(True, {"a": 1}), (True, None), (True, "x"), (False, None)]
    with pytest.raises(ScoringError, match="3 values for a manifest of 4 items"):
        Expected.read(path, 4)
    partial = Expected.read({"2": "x", 0: 1}, 3)
    assert list(partial.items()) == [(0, 1), (2, "x")] and partial.get(1) == (False, None)
    for bad, says in [({3: 1}, "numbered 0 to 2"), ({True: 1}, "numbered 0 to 2"), ({0: 1, "0": 2}, "two expected"),
                      (tmp_path / "nope.jsonl", "No such file"), (3.5, "a JSONL file, a list or a dict")]:
        with pytest.raises(ScoringError, match=says):
            Expected.read(bad, 3)
    (tmp_path / "bad.jsonl").write_text('{"a": 1}\n{"a": NaN}\n', encoding="utf-8")
    with pytest.raises(ScoringError, match="line 2"):
        Expected.read(tmp_path / "bad.jsonl", 2)


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
    with pytest.raises(ScoringError, match="4 values for a manifest of 5 items"):
        tj.map(guest, ITEMS, tmp_path / "run", expected=EXPECTED[:4])
    with pytest.raises(ScoringError, match="a scorer needs expected answers"):
        tj.map(guest, ITEMS, tmp_path / "run", scorer="exact")
    assert not (tmp_path / "run").exists()


def test_a_summary_reads_as_lines():
    s = ScoreSummary.of("json_fields", 4, [ItemScore(0, 1.0, {"a": True}), ItemScore(1, 0.0, {"a": False}),
                                          ItemScore(2, None, None, "boom")])
    assert s.lines() == ["score (json_fields): mean 0.500 over 2 items; 1 passed, 1 failed, 1 could not be scored, "
                         "1 not scored", "  a: 0.500"]
    assert ScoreSummary.of("exact", 3, []).lines() == ["score (exact): no item scored yet (3 of 3 without a score)"]


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
    with pytest.raises(ValueError, match="max_total_tokens must be a whole number of at least 1"):
        tj.map(guest, items, tmp_path / "x", max_total_tokens=0)


# --- the command line ---------------------------------------------------------------------------------------


@pytest.mark.slow  # a CLI in a subprocess, or a long search: in the full suite, not the fast loop
def test_tensorjob_map_with_expected_answers_prints_the_score(guest, tmp_path):
    (tmp_path / "g.wasm").write_bytes(guest)
    write_manifest(tmp_path / "m.jsonl", ITEMS)
    write_manifest(tmp_path / "e.jsonl", EXPECTED)
    code, out, err = cli("map", "g.wasm", "--over", "m.jsonl", "--run-dir", "run", "--expected", "e.jsonl",
                         "--scorer", "json_fields", "--quiet", cwd=tmp_path)
    assert code == 1, err  # one item failed
    assert "score (json_fields): mean 0.600 over 5 items; 2 passed, 3 failed" in out
    assert "  title: 0.600" in out and "  year: 0.600" in out
    code, out, err = cli("map", "g.wasm", "--over", "m.jsonl", "--run-dir", "run", "--json", cwd=tmp_path)
    assert json.loads(out)["score"]["mean"] == pytest.approx(0.6)
    code, out, err = cli("map", "g.wasm", "--over", "m.jsonl", "--run-dir", "other", "--expected", "m.jsonl",
                         "--scorer", "fuzzy", cwd=tmp_path)
    assert code == 2 and err.count("\n") == 1 and "unknown scorer 'fuzzy'" in err, err


def test_map_scoring_refusals_are_one_line_and_exit_2(guest, tmp_path, monkeypatch):
    import io

    from tensorjob_jupyter.frontends.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "g.wasm").write_bytes(guest)
    write_manifest(tmp_path / "m.jsonl", ITEMS)
    write_manifest(tmp_path / "short.jsonl", EXPECTED[:2])
    for extra, says in [(["--expected", "short.jsonl"], "expected answers"),
                        (["--expected", "nope.jsonl"], "expected answers: cannot read"),
                        (["--scorer", "exact"], "a scorer needs expected answers"),
                        (["--max-total-tokens", "0"], "--max-total-tokens must be at least 1")]:
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

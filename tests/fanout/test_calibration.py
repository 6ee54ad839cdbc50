"""Whether to trust the evidence: the AUROC and halves by hand, properties of the AUROC, and the figures from
real maps (a puppet guest's unread answers, a scripted model's confidence) in the summary and the CLI."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

import tensorjob_jupyter as tj
from tensorjob_jupyter.fanout.calibration import Evidence, auroc, evidence_of, field_signals, halves
from tensorjob_jupyter.fanout.score_summary import ScoreSummary
from tensorjob_jupyter.fanout.scoring import ItemScore, verdict_paths
from tensorjob_jupyter.inference import ScriptedBackend
from test_confidence import ANSWER, confident_guest
from test_map import puppet_guest, write_manifest
from test_scoring import EXPECTED, ITEMS, cli


def test_auroc_by_hand_perfect_inverted_ties_and_an_empty_class():
    assert auroc([0.1, 0.2, 0.8, 0.9], [False, False, True, True]) == 1.0
    assert auroc([0.1, 0.2, 0.8, 0.9], [True, True, False, False]) == 0.0
    assert auroc([0.5, 0.5, 0.5, 0.5], [True, False, True, False]) == 0.5
    # right at 0.9 and 0.5, wrong at 0.5 and 0.1: pairs (0.9>0.5, 0.9>0.1, 0.5=0.5 -> 1/2, 0.5>0.1) = 3.5/4
    assert auroc([0.9, 0.5, 0.5, 0.1], [True, True, False, False]) == pytest.approx(3.5 / 4)
    assert auroc([0.3, 0.9], [True, True]) is None and auroc([], []) is None


def test_halves_split_ties_by_item_number_and_give_the_middle_item_to_the_least_confident_half():
    assert halves([(0, 0.5, True), (1, 0.5, False), (2, 0.5, False), (3, 0.5, True)]) == ((1, 2), (1, 2))
    assert halves([(2, 0.9, True), (0, 0.1, False), (1, 0.5, True)]) == ((1, 1), (1, 2))
    assert halves([(0, 0.9, True)]) is None


def pairwise(conf, correct):
    right = [c for c, ok in zip(conf, correct) if ok]
    wrong = [c for c, ok in zip(conf, correct) if not ok]
    wins = sum((r > w) + 0.5 * (r == w) for r in right for w in wrong)
    return wins / (len(right) * len(wrong))


scores = st.lists(st.tuples(st.floats(0, 1), st.booleans()), min_size=1, max_size=60)


@given(scores)
def test_auroc_is_the_pairwise_share_in_0_1_mirrored_by_negation_and_blind_to_monotone_transforms(pairs):
    conf, correct = [p[0] for p in pairs], [p[1] for p in pairs]
    got = auroc(conf, correct)
    if all(correct) or not any(correct):
        assert got is None
        return
    assert 0.0 <= got <= 1.0 and got == pytest.approx(pairwise(conf, correct))
    assert auroc([-c for c in conf], correct) == pytest.approx(1 - got)
    ranks = {c: i for i, c in enumerate(sorted(set(conf)))}  # strictly increasing, exact in floats
    assert auroc([ranks[c] ** 3 + 7.0 for c in conf], correct) == pytest.approx(got)


def test_a_field_without_grounding_or_confidence_has_no_figures_and_the_summary_no_such_columns():
    evidence = {"a": [Evidence(0, True), Evidence(1, False)], "b": [Evidence(0, True, True), Evidence(1, False, False)]}
    signals = field_signals(evidence)
    assert [s.name for s in signals] == ["b"] and signals[0].grounded == (1, 1) and signals[0].ungrounded == (0, 1)
    summary = ScoreSummary.of("json_fields", 2, [ItemScore(0, 1.0, {"a": True, "b": True}),
                                                 ItemScore(1, 0.0, {"a": False, "b": False})], 2, signals)
    text = str(summary)
    assert "grounded right" in text and "AUROC" not in text and "confident half" not in text
    assert "auroc" not in json.dumps(summary.to_json()["signals"])
    plain = ScoreSummary.of("json_fields", 2, [ItemScore(0, 1.0, {"a": True})], 2, field_signals({"a": evidence["a"]}))
    assert "whether to trust" not in str(plain) and "signals" not in plain.to_json()


def test_a_verdict_path_meets_the_confidence_path_that_escapes_a_dot_in_a_key():
    # a verdict is named by its field's path (a key "a.b" escaped), so it never meets {"a": {"b": ...}}'s
    paths = verdict_paths("json_fields", {"a.b": 1, "c": {"d": 2}})
    assert paths == {"a\\.b": "a\\.b", "c.d": "c.d"}
    found = evidence_of({0: {"a\\.b": True, "c.d": False}}, lambda item: paths,
                        {0: {"a\\.b": [{"match": "exact"}], "c.d": []}}, {0: {"a\\.b": 0.9, "c.d": 0.2}})
    assert found == {"a\\.b": [Evidence(0, True, True, 0.9)], "c.d": [Evidence(0, False, False, 0.2)]}


def test_the_html_summary_escapes_field_names_in_the_trust_table():
    signals = field_signals({"<b>x</b>": [Evidence(0, True, False, 0.4), Evidence(1, False, False, 0.6)]})
    summary = ScoreSummary.of("json_fields", 2, [ItemScore(0, 1.0, {"<b>x</b>": True}),
                                                 ItemScore(1, 0.0, {"<b>x</b>": False})], 2, signals)
    html = summary._repr_html_()
    assert "<b>x</b>" not in html and "&lt;b&gt;x&lt;/b&gt;" in html and "0.000 (0 right" not in html
    assert "<td>0.000 (1 right, 1 wrong)</td>" in html  # the wrong answer was the more confident one


def test_a_real_map_with_scripted_confidence_gives_halves_and_auroc_with_their_counts(tmp_path):
    expected = [{"name": "Ada", "age": 36}, {"name": "Ada", "age": 99}, {"name": "Ada", "age": 36},
                {"name": "Bob", "age": 99}]
    result = tj.map(confident_guest(), [{"id": i} for i in range(4)], tmp_path / "run", expected=expected,
                    scorer="json_fields", backend=ScriptedBackend(ANSWER, logprobs=-0.1))
    assert result.completed == 4
    summary = result.score_summary()
    by_name = {s.name: s for s in summary.signals}
    age = by_name["age"]  # every item as sure: ties, split by item number
    assert (age.right, age.wrong, age.auroc) == (2, 2, 0.5)
    assert age.confident == (1, 2) and age.unconfident == (1, 2)
    name = by_name["name"]  # item 3 wrong: the least confident half by item number
    assert (name.right, name.wrong, name.auroc, name.confident, name.unconfident) == (3, 1, 0.5, (2, 2), (1, 2))
    text = str(summary)
    assert re.search(r"\n  age +.*0\.500 \(1/2\) +0\.500 \(1/2\) +0\.500 \(2 right, 2 wrong\)", text), text
    assert re.search(r"\n  name +.*1\.000 \(2/2\) +0\.500 \(1/2\) +0\.500 \(3 right, 1 wrong\)", text), text
    assert tj.MapResult.read(tmp_path / "run").score_summary() == summary
    assert result.to_json()["score"]["signals"][0]["auroc_right"] in (2, 3)


@pytest.mark.slow  # a CLI in a subprocess
def test_tensorjob_map_prints_the_trust_figures_with_their_counts(tmp_path):
    (tmp_path / "g.wasm").write_bytes(puppet_guest())
    write_manifest(tmp_path / "m.jsonl", ITEMS)
    write_manifest(tmp_path / "e.jsonl", EXPECTED)
    code, out, err = cli("map", "g.wasm", "--over", "m.jsonl", "--run-dir", "run", "--expected", "e.jsonl",
                         "--scorer", "json_fields", "--quiet", cwd=tmp_path)
    assert code == 1, err
    assert "whether to trust the evidence" in out and "ungrounded right" in out, out
    # the puppet's answers are read from no window: all four completed items are ungrounded, 3 of them right
    assert re.search(r"\n  title +- \(0/0\) +0\.750 \(3/4\)\n", out), out
    code, out, err = cli("map", "g.wasm", "--over", "m.jsonl", "--run-dir", "run", "--json", cwd=tmp_path)
    signals = json.loads(out)["score"]["signals"]
    assert signals[0]["ungrounded"] == {"right": 3, "count": 4, "accuracy": 0.75}

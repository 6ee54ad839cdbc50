"""A cascade run as a user runs it: ``guests/examples/extract.c`` (a real wasm guest) over notes, a scripted
"small" model (wrong, and unsure, on every fourth note) as the proxy and a scripted "big" one (always right) as
the oracle; the tiers recorded per row, the run folder's ``cascade.json``, resume after an interruption in each
phase, the item scores, and every bad input as one line or the documented fallback."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import tensorjob_jupyter as tj
from tensorjob_jupyter.fanout import ResumeRefused
from tensorjob_jupyter.fanout.cascade import ORACLE, PROXY, SAMPLED, read_cascade
from tensorjob_jupyter.fanout.cascade_score import item_score, matches, parse_fields
from tensorjob_jupyter.inference import ScriptedBackend

ROOT = Path(__file__).resolve().parents[2]
EXTRACT = ROOT / "guests" / "examples" / "extract.c"
SCHEMA = {"type": "object", "properties": {"customer": {"type": "string"}, "order": {"type": "integer"}},
          "required": ["customer", "order"], "additionalProperties": False}
N = 60


@pytest.fixture(scope="module")
def notes(tmp_path_factory):
    """N notes, each naming a customer and an order; every fourth is "hard" (the proxy gets it wrong)."""
    folder = tmp_path_factory.mktemp("notes")
    items, truth = [], []
    for i in range(N):
        name, order = f"Ada{i} Okafor", 10000 + i
        hard = " (hard)" if i % 4 == 0 else ""
        (folder / f"n{i}.txt").write_text(f"Customer {name} wrote about order {order}{hard}.")
        items.append({"path": str(folder / f"n{i}.txt"), "schema": SCHEMA, "max_tokens": 48})
        truth.append({"customer": name, "order": order})
    return folder, items, truth


def answer(prompt: str, *, proxy: bool) -> str:
    m = re.search(r"Customer (\S+ \S+) wrote about order (\d+)( \(hard\))?", prompt)
    name, order, hard = m.group(1), int(m.group(2)), bool(m.group(3))
    return json.dumps({"customer": "Zed Wrong" if proxy and hard else name, "order": order})


def small(**kwargs) -> ScriptedBackend:
    """The proxy: wrong on the hard notes, and unsure of those answers' words."""
    return ScriptedBackend(lambda p: answer(p, proxy=True), model_name="small",
                           logprobs=lambda i, piece: -2.5 if "Zed" in piece or "Wrong" in piece else -0.01, **kwargs)


def big(**kwargs) -> ScriptedBackend:
    return ScriptedBackend(lambda p: answer(p, proxy=False), model_name="big", logprobs=-0.01, **kwargs)


def cascade(notes, run_dir, proxy, oracle, **kwargs):
    folder, items, truth = notes
    kwargs.setdefault("target", 0.8)
    kwargs.setdefault("cascade_sample", 30)
    return tj.map(EXTRACT, items, run_dir, read=[folder], backend=proxy, cascade=oracle, **kwargs)


def right(row, truth) -> bool:
    return row["status"] == "completed" and row["result.facts"] == truth[row["item"]]


def test_a_cascade_answers_doubtful_items_on_the_oracle_and_records_who_answered_each(notes, tmp_path):
    proxy, oracle = small(), big()
    result = cascade(notes, tmp_path / "run", proxy, oracle, expected=[{"facts": t} for t in notes[2]],
                     scorer="json_fields")
    assert result.status == "finished" and result.completed == N, result
    state = read_cascade(tmp_path / "run")
    sample, cert = state["sample"]["items"], state["certificate"]
    assert state["phase"] == "done" and len(sample) == 30 and state["settings"]["target"] == 0.8
    assert cert["threshold"] is not None and cert["bound"] >= 0.8 and cert["steps"][-1]["passed"] is False
    rows = result.rows()
    tiers = {r["item"]: r["answered_by"] for r in rows}
    assert set(tiers.values()) == {PROXY, ORACLE, SAMPLED}
    assert [i for i, t in tiers.items() if t == SAMPLED] == sample
    for row in rows:  # every row names its model; the proxy's answer is kept where the oracle's replaced it
        assert row["model"] == ("small" if row["answered_by"] == PROXY else "big")
        assert (row["proxy.facts"] is None) == (row["answered_by"] == PROXY)
    assert all(right(r, notes[2]) for r in rows)  # every wrong proxy answer was unsure, so went to the oracle
    calls = state["answered"]["oracle_calls"]
    assert calls == len(oracle.scripted.prompts) == 30 + state["oracle_items"] < N
    assert len(proxy.scripted.prompts) == N
    assert result.score_summary().mean == 1.0  # scored again on the final answers


def test_a_replay_with_no_model_gives_back_both_tiers_answers(notes, tmp_path):
    from tensorjob_jupyter.host import Overrides

    result = cascade(notes, tmp_path / "run", small(), big())
    replay = tj.replay_map(tmp_path / "run", EXTRACT, overrides=Overrides(read=(str(notes[0]),)))
    summary = replay.summary()
    assert summary["needs_model"] == 0 and summary["changed"] == 0 and summary["same"] == N
    assert replay.replayed.results() == result.results()  # the oracle's answers where it answered, word for word


def asked(backend) -> set[int]:
    """The notes a scripted model was asked about, by item."""
    return {int(re.search(r"Ada(\d+) ", p).group(1)) for p in backend.scripted.prompts}


def concluded(folder: Path) -> set[int]:
    return {json.loads(line)["item"] for name in ("results.jsonl", "failures.jsonl") if (folder / name).exists()
            for line in (folder / name).read_text().splitlines()}


def test_resuming_an_interrupted_cascade_in_any_phase_neither_redoes_nor_loses_an_item(notes, tmp_path):
    clean = cascade(notes, tmp_path / "clean", small(), big())
    expected_rows = [(r["item"], r["answered_by"], r["result.facts"]) for r in clean.rows()]
    run_dir = tmp_path / "run"
    for phase in ("proxy", "sample", "oracle", None):  # cancelled at its first item of each phase, then to the end
        done_before = concluded(run_dir), concluded(run_dir / "oracle")
        proxy, oracle = small(token_delay_s=0.002), big(token_delay_s=0.002)
        folder, items, _ = notes
        run = tj.start_map(EXTRACT, items, run_dir, read=[folder], backend=proxy, cascade=oracle, target=0.8,
                           cascade_sample=30, concurrency=2)
        if phase is not None:
            run.subscribe(lambda e, run=run, phase=phase: run.cancel()
                          if e.get("phase") == phase and e["type"].startswith("item.") else None)
        result = run.wait(120)
        assert result.status == ("cancelled" if phase else "finished"), (phase, result)
        assert not asked(proxy) & done_before[0] and not asked(oracle) & done_before[1], phase  # none redone
    state = read_cascade(run_dir)
    assert len(concluded(run_dir / "oracle")) == state["answered"]["oracle_calls"]
    assert [(r["item"], r["answered_by"], r["result.facts"]) for r in result.rows()] == expected_rows
    proxy, oracle = small(), big()
    again = cascade(notes, run_dir, proxy, oracle)  # a finished cascade run again: nothing to do, nothing moves
    assert [(r["item"], r["answered_by"], r["result.facts"]) for r in again.rows()] == expected_rows
    assert not proxy.scripted.prompts and not oracle.scripted.prompts


def test_an_oracle_that_fails_every_item_is_one_error_and_the_proxys_answers_stand(notes, tmp_path):
    result = cascade(notes, tmp_path / "run", small(), big(fail="the oracle's model file is damaged"))
    assert result.status == "error" and "answered none of the 30 sampled items" in result.error
    assert "\n" not in result.error and "damaged" in result.error
    rows = result.rows()
    assert all("answered_by" not in r for r in rows) and result.completed == N  # nothing merged
    assert read_cascade(tmp_path / "run")["phase"] == "sample"


def test_an_item_the_oracle_fails_is_failed_never_a_silent_proxy_answer(notes, tmp_path):
    folder, items, _ = notes
    flaky = ScriptedBackend(lambda p: "not json" if "Ada4 " in p else answer(p, proxy=False), model_name="big",
                            logprobs=-0.01)
    result = cascade(notes, tmp_path / "run", small(), flaky, cascade_sample=60)  # item 4 goes to the oracle
    row = result.rows()[4]
    assert row["status"] == "failed" and row["answered_by"] == SAMPLED and row["model"] == "big"
    assert row["proxy.facts"] == {"customer": "Zed Wrong", "order": 10004}
    assert read_cascade(tmp_path / "run")["answered"]["oracle_failed"] == 1


def test_a_finished_cascade_run_again_keeps_the_proxys_answer_where_the_oracle_failed(notes, tmp_path):
    flaky = ScriptedBackend(lambda p: "not json" if "Ada4 " in p else answer(p, proxy=False), model_name="big",
                            logprobs=-0.01)
    cascade(notes, tmp_path / "run", small(), flaky, cascade_sample=60)
    again = cascade(notes, tmp_path / "run", small(), flaky, cascade_sample=60)  # the same map into its folder
    row = again.rows()[4]
    assert row["answered_by"] == SAMPLED and row["proxy.facts"] == {"customer": "Zed Wrong", "order": 10004}


def test_an_edited_cascade_record_is_one_error_never_a_crash_or_a_sample_taken_on_trust(notes, tmp_path):
    import json as _json
    from tensorjob_jupyter.fanout.map_folder_reader import FolderError
    cascade(notes, tmp_path / "run", small(), big())
    path = tmp_path / "run" / "cascade.json"
    state = _json.loads(path.read_text())
    for edit in ({"settings": [1]}, {"certificate": {"threshold": "x"}}, {"sample": {"items": 5}}):
        path.write_text(_json.dumps({**state, **edit}))
        with pytest.raises(FolderError, match="is not a cascade's record"):
            read_cascade(tmp_path / "run")
    path.write_text(_json.dumps({**state, "phase": "sample", "sample": {**state["sample"], "items": [0, 1, 999]}}))
    result = cascade(notes, tmp_path / "run", small(), big())
    assert result.status == "error" and "not the one its settings draw" in result.error


def test_a_proxy_with_no_confidence_sends_every_item_to_the_oracle_and_says_why(notes, tmp_path):
    blind = ScriptedBackend(lambda p: answer(p, proxy=True), model_name="small")  # no logprobs
    result = cascade(notes, tmp_path / "run", blind, big())
    state = read_cascade(tmp_path / "run")
    assert state["certificate"]["threshold"] is None and "no item has a proxy score" in state["certificate"]["reason"]
    assert {r["answered_by"] for r in result.rows()} == {ORACLE, SAMPLED}
    assert all(right(r, notes[2]) for r in result.rows())


def test_cascade_on_restricts_the_score_and_the_agreement_to_the_fields_named(notes, tmp_path):
    # on the order alone the proxy is always right and sure: every unsampled item stays with it
    result = cascade(notes, tmp_path / "run", small(), big(), cascade_on="order", target=0.9, cascade_sample=40)
    state = read_cascade(tmp_path / "run")
    assert state["settings"]["fields"] == ["order"] and state["agreement"]["agree"] == 40
    assert {r["answered_by"] for r in result.rows()} == {PROXY, SAMPLED}


def test_a_target_against_expected_answers_measures_the_proxys_accuracy(notes, tmp_path):
    wrong_oracle = ScriptedBackend(lambda p: answer(p, proxy=True), model_name="big", logprobs=-0.01)
    result = cascade(notes, tmp_path / "run", small(), wrong_oracle, target_against="expected",
                     expected=[{"facts": t} for t in notes[2]], scorer="json_fields")
    state = read_cascade(tmp_path / "run")
    hard = [i for i in state["sample"]["items"] if i % 4 == 0]
    assert state["agreement"]["disagree"] == hard  # against the labels, not the (here just as wrong) oracle
    assert result.status == "finished"


@pytest.mark.parametrize("keywords, message", [
    (dict(target=0), "--target 0: the share"), (dict(target=1.5), "--target 1.5"),
    (dict(delta=0), "--delta 0: the chance"), (dict(delta=1), "--delta 1"),
    (dict(cascade_score="best"), "--cascade-score 'best': not a score"),
    (dict(cascade_sample=5), "--cascade-sample 5: the bound needs at least 22"),
    (dict(target_against="expected"), "--target-against expected needs expected answers"),
    (dict(target_against="labels"), "--target-against 'labels'"),
])
def test_a_bad_setting_is_one_line_before_anything_runs(notes, tmp_path, keywords, message):
    folder, items, _ = notes
    with pytest.raises(ValueError, match=re.escape(message)):
        tj.start_map(EXTRACT, items, tmp_path / "run", read=[folder], backend=small(), cascade=big(), **keywords)
    assert not (tmp_path / "run").exists()


def test_a_cascade_setting_without_cascade_and_a_missing_oracle_are_refused(notes, tmp_path):
    folder, items, _ = notes
    with pytest.raises(ValueError, match="--target goes with --cascade"):
        tj.start_map(EXTRACT, items, tmp_path / "run", read=[folder], backend=small(), target=0.9)
    with pytest.raises(ValueError, match="--cascade: .*not found"):
        tj.start_map(EXTRACT, items, tmp_path / "run", read=[folder], backend=small(), cascade="/no/model.gguf")


def test_a_cascade_too_small_to_certify_gives_every_item_to_the_oracle_and_says_so(notes, tmp_path):
    folder, items, truth = notes
    result = tj.map(EXTRACT, items[:12], tmp_path / "run", read=[folder], backend=small(), cascade=big())
    state = read_cascade(tmp_path / "run")
    assert "every item goes to the oracle" in state["certificate"]["reason"]
    assert all(r["answered_by"] in (ORACLE, SAMPLED) and right(r, truth) for r in result.rows())


def test_changing_a_cascades_settings_after_its_sample_is_refused(notes, tmp_path):
    cascade(notes, tmp_path / "run", small(), big())
    with pytest.raises(ResumeRefused, match="cascade changed: .* target 0.8, this one asks for 0.9"):
        cascade(notes, tmp_path / "run", small(), big(), target=0.9)


# --- the item score -------------------------------------------------------------------------------------------


def test_the_item_scores_read_the_weakest_answered_field_and_grounding():
    confidence = {"path": None, "facts.vendor": 0.9, "facts.total": 0.4}
    found = {"facts.vendor": [{"match": "exact"}], "facts.total": []}
    assert item_score(confidence, found, "min_confidence") == 0.4
    assert item_score(confidence, found, "min_confidence_grounded") == pytest.approx(0.4 - 1)
    assert item_score(confidence, found, "min_confidence", ("vendor",)) == 0.9
    assert item_score(confidence, found, "min_confidence_grounded", ("vendor",)) == 0.9
    assert item_score(confidence, found, "mean_confidence") == pytest.approx(0.65)
    assert item_score(confidence, found, "product_confidence") == pytest.approx(0.36)
    assert item_score(confidence, found, "grounded_share") == 0.5
    assert item_score(None, found, "grounded_share") == 0.5  # grounding alone needs no logprobs
    assert item_score(None, None, "min_confidence") is None and item_score({"a": None}, {}, "min_confidence") is None
    with pytest.raises(ValueError, match="not a score; the scores are min_confidence_grounded"):
        item_score(confidence, found, "best")


def test_a_field_name_matches_its_path_its_last_parts_or_a_field_above_it():
    assert matches("facts.vendor", ("vendor",)) and matches("facts.vendor", ("facts",))
    assert matches("facts.vendor", ("facts.vendor",)) and not matches("facts.vendor", ("total",))
    assert not matches("facts.vendors", ("vendor",)) and matches("anything", ())
    assert parse_fields("vendor, total,vendor") == ("vendor", "total") and parse_fields(None) == ()


# --- the command line ---------------------------------------------------------------------------------------------


def cli(*argv, cwd):
    return subprocess.run([sys.executable, "-m", "tensorjob_jupyter.frontends.cli", *argv], capture_output=True,
                          text=True, cwd=cwd, timeout=300, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("flags, message", [
    (["--cascade", "big.gguf", "--target", "1.5"], "--target 1.5: the share of items that must agree"),
    (["--cascade", "big.gguf", "--delta", "1"], "--delta 1.0: the chance the guarantee may fail"),
    (["--cascade", "missing.gguf"], "--cascade: "),
    (["--target", "0.9"], "--target goes with --cascade MODEL"),
    (["--cascade", "big.gguf", "--cascade-sample", "3"], "--cascade-sample 3: the bound needs at least 22"),
])
def test_the_command_line_says_a_bad_cascade_in_one_line(notes, tmp_path, flags, message):
    folder, items, _ = notes
    (tmp_path / "m.jsonl").write_text("".join(json.dumps(i) + "\n" for i in items))
    (tmp_path / "big.gguf").write_bytes(b"GGUF not loaded unless a job infers")
    done = cli("map", str(EXTRACT), "--over", "m.jsonl", "--run-dir", "run", "--read", str(folder), *flags,
               cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and message in done.stderr, done.stderr


def test_runs_table_shows_who_answered_and_the_cascades_threshold(notes, tmp_path):
    cascade(notes, tmp_path / "run", small(), big())
    done = cli("runs", "--table", str(tmp_path / "run"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "completed (both-sampled)" in done.stdout and "completed (proxy)" in done.stdout
    assert "threshold: " in done.stdout and "certified" in done.stdout and "oracle calls" in done.stdout


@pytest.mark.slow
def test_a_cascade_on_the_embedded_model_as_both_proxy_and_oracle_from_the_command_line(tmp_path):
    from tensorjob_jupyter.inference.models import default_model_path

    (tmp_path / "notes").mkdir()
    lines = []
    for i in range(16):
        path = tmp_path / "notes" / f"n{i}.txt"
        path.write_text(f"Order {20000 + i} arrived late; signed, Ada{i} Okafor.", encoding="utf-8")
        lines.append(json.dumps({"path": str(path), "schema": SCHEMA, "max_tokens": 48}))
    (tmp_path / "m.jsonl").write_text("\n".join(lines) + "\n")
    done = cli("map", str(EXTRACT), "--over", "m.jsonl", "--run-dir", "run", "--read", "notes", "--cascade",
               str(default_model_path()), "--target", "0.5", "--cascade-sample", "8", cwd=tmp_path)
    assert done.returncode in (0, 1), done.stderr
    assert "cascade: 8 of 16 items sampled" in done.stderr and "answered: " in done.stdout
    state = read_cascade(tmp_path / "run")
    assert state["phase"] == "done" and state["agreement"]["sampled"] == 8
    assert state["answered"]["oracle_calls"] == 8 + state["oracle_items"]
    rows = [json.loads(line) for line in (tmp_path / "run" / "results.jsonl").read_text().splitlines()]
    tiers = {r["item"]: r["answered_by"] for r in rows}
    assert [i for i, t in tiers.items() if t == SAMPLED] == state["sample"]["items"]
    assert {r["model"] for r in rows if r["answered_by"] != PROXY} == {str(default_model_path())}


def test_an_edited_results_file_s_model_or_tier_is_shown_as_text_never_a_crash(notes, tmp_path):
    import json as _json
    cascade(notes, tmp_path / "run", small(), big())
    path = tmp_path / "run" / "results.jsonl"
    lines = path.read_text().splitlines()
    lines[0] = _json.dumps({**_json.loads(lines[0]), "model": ["x"], "answered_by": {"a": 1}})
    path.write_text("\n".join(lines) + "\n")
    rows = tj.MapResult.read(tmp_path / "run").rows()
    assert len(rows) == N and rows[0]["status"] == "completed"

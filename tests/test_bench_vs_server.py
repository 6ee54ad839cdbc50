"""``bench/bench_map.py --vs-server``: without a llama-server binary it says how to build one and skips (exit 0);
the map's per-token timings are read from its transcripts' delta events as recorded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def bench(env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "bench" / "bench_map.py"), "--vs-server"], capture_output=True,
                          text=True, timeout=300, cwd=ROOT, env=env)


@pytest.mark.parametrize("binary", ["unset", "not executable"])
def test_without_a_server_binary_the_row_is_skipped_with_how_to_build_it(tmp_path, binary):
    env = {k: v for k, v in os.environ.items() if k != "LLAMA_SERVER"}
    if binary == "not executable":
        path = tmp_path / "llama-server"
        path.write_text("#!/bin/sh\n")
        path.chmod(0o644)
        env["LLAMA_SERVER"] = str(path)
    proc = bench(env)
    assert proc.returncode == 0, proc.stderr
    assert "--vs-server: skipped" in proc.stdout
    assert "cmake --build build --target llama-server" in proc.stdout
    assert "pip download --no-deps --no-binary :all: llama-cpp-python==" in proc.stdout
    assert "round" not in proc.stdout  # nothing was run


def write_job(run: Path, name: str, created_at: float, asked_ms: int, deltas_ms: list[int]) -> None:
    folder = run / "jobs" / name
    folder.mkdir(parents=True)
    events = [{"type": "job.created", "t_ms": 0, "created_at": created_at},
              {"type": "response.created", "t_ms": asked_ms}]
    events += [{"type": "response.output_text.delta", "t_ms": t, "delta": "x"} for t in deltas_ms]
    (folder / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))


def test_the_maps_token_times_come_from_its_transcripts(tmp_path):
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        from map_vs_server import map_token_times
    finally:
        sys.path.remove(str(ROOT / "bench"))
    # the first item waits for the model (its first token at 1000 + 5.0 s); the second is asked after that
    write_job(tmp_path, "a", 1000.0, 100, [5000, 5020, 5060])
    write_job(tmp_path, "b", 1006.0, 0, [300, 310])
    times = map_token_times(tmp_path)
    assert times["ttft_med_ms"] == pytest.approx((4900 + 300) / 2)
    assert times["ttft_p95_ms"] == pytest.approx(4900)
    assert times["loaded_items"] == 1
    assert times["ttft_loaded_med_ms"] == pytest.approx(300)
    assert times["gap_med_ms"] == pytest.approx(20)  # gaps 20, 40, 10
    assert times["gap_p95_ms"] == pytest.approx(40)

"""Shared fixtures: an isolated runs folder, the WAT guest builders, a healthy job check."""

import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

sys.path.insert(0, str(Path(__file__).parent))

import wat  # noqa: E402  (tests/wat.py)

import tensorjob_jupyter as tj  # noqa: E402

# Property tests: a fixed, short search in CI; `--hypothesis-profile=deep` for long local runs.
settings.register_profile("ci", max_examples=60, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("deep", max_examples=5000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci")


@pytest.fixture(autouse=True)
def _runs_dir(tmp_path, monkeypatch):
    """Every job in a test writes its transcript under the test's tmp dir."""
    monkeypatch.setenv("TENSORJOB_RUNS", str(tmp_path / "runs"))


def assert_host_healthy():
    """After any failure, the next job on the same process still runs normally."""
    env = tj.run(wat.script_guest([{"cmd": "emit", "progress": 1}, {"cmd": "done", "result": "ok"}]), timeout=30)
    assert env.ok and env.result == "ok", env


@pytest.fixture
def healthy():
    yield
    assert_host_healthy()

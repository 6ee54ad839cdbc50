"""Shared fixtures: an isolated runs folder, the WAT guest builders, a healthy job check,
and the guard that keeps the real model out of the fast loop.

The suite runs with Ctrl-C and hang-ups as a terminal delivers them: a suite started in
the background of a script (``cmd &``) inherits SIGINT ignored, and under ``nohup``
SIGHUP too, and so would every process it starts -- the command line then rightly leaves
Ctrl-C alone, and the tests of what Ctrl-C and a hang-up do would fail for the way the
suite was launched. Ignored ones are set back to their defaults at import, before any
test starts a process (handlers are reset to the default across ``exec``).

``pytest -m "not slow"`` must run in well under a minute, so a test that
loads the real model (the embedded SmolLM2) must be marked ``slow``: every
test not so marked runs with a guard that fails it if the default model is
loaded in this process during it, whether by the test or by a job it runs.
(The tiny random-weight GGUFs of tests/llama_support.py load in
milliseconds and are allowed.)
"""

import signal
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
if signal.getsignal(signal.SIGHUP) == signal.SIG_IGN:
    signal.signal(signal.SIGHUP, signal.SIG_DFL)

sys.path.insert(0, str(Path(__file__).parent))

import openresponses  # noqa: E402  (tests/openresponses.py)
import wat  # noqa: E402  (tests/wat.py)

import tensorjob_jupyter as tj

# Property tests: a fixed, short search in CI; `--hypothesis-profile=deep` for long local runs.
settings.register_profile("ci", max_examples=60, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("deep", max_examples=5000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci")


_real_model_loads: list[str] = []


@pytest.fixture(scope="session", autouse=True)
def _watch_real_model_loads():
    """Record every engine built on the default model, by the test that was running."""
    from tensorjob_jupyter.inference import llama, models

    try:
        default = models.default_model_path()
    except Exception:  # noqa: BLE001 - no default model installed: nothing to watch
        yield
        return
    original = llama.LlamaEngine.__init__

    def watched(self, model_path, *args, **kwargs):
        if Path(model_path).expanduser().resolve() == default:
            _real_model_loads.append(str(model_path))
        original(self, model_path, *args, **kwargs)

    llama.LlamaEngine.__init__ = watched
    yield
    llama.LlamaEngine.__init__ = original


@pytest.fixture(autouse=True)
def _real_model_only_in_slow_tests(request):
    """A test that loads the real model must be marked slow, so the fast loop never pays for it."""
    before = len(_real_model_loads)
    yield
    if request.node.get_closest_marker("slow") is None and len(_real_model_loads) > before:
        pytest.fail(f"{request.node.nodeid} loaded the real model ({_real_model_loads[-1]}) "
                    "but is not marked @pytest.mark.slow", pytrace=False)


@pytest.fixture(autouse=True)
def _open_responses_schema(monkeypatch):
    """Every response.* and error event any test publishes must validate against the openai SDK's models."""
    from tensorjob_jupyter.record.events import EventStream

    publish = EventStream.publish
    invalid: list[str] = []

    def checked(self, type, **fields):
        event = publish(self, type, **fields)
        if openresponses.is_open_responses(type):
            try:
                openresponses.validate(event)
            except Exception as e:  # noqa: BLE001 - reported by the test, not by the job it ran in
                invalid.append(f"{type}: {e}")
        return event

    monkeypatch.setattr(EventStream, "publish", checked)
    yield
    assert not invalid, "events that do not validate against the openai SDK:\n" + "\n".join(invalid[:5])


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

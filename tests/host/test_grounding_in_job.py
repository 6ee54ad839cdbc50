"""The locator as part of its job (host/reactor.py -> host/grounding.py): the job's deadline and cancel reach it,
and a field it could not search is never reported as found.

Each test holds the locator at its start (a wrapper around ``locate`` where ``host/requirements.py`` calls it) so that the job's cancel or
deadline comes while it runs, whatever the machine's speed: no test depends on how long locating takes.
"""

import threading
import time

import pytest

import tensorjob_jupyter as tj
from tensorjob_jupyter.abi import JobStatus, codes
from tensorjob_jupyter.host import grounding, requirements

import wat

#: Text whose folded form differs in length from it (see test_grounding.IRREGULAR), 1 MiB and more of it.
IRREGULAR = "ﬁﬂﬃＡＢＣßẞe\u0301o\u0308\u0323ǅﷺⅫ"


def reading_job(tmp_path, **kwargs):
    doc = tmp_path / "irregular.txt"
    doc.write_text("".join(IRREGULAR[i % len(IRREGULAR)] for i in range(400_000)), encoding="utf-8")
    size = doc.stat().st_size
    result = {f"field{i}": f"a value nowhere in it {i}" for i in range(20)}
    commands = [{"cmd": "open", "path": str(doc)}, {"cmd": "slice", "handle": 0, "offset": 0, "len": size},
                {"cmd": "done", "result": result}]
    return tj.Job(wat.script_guest(commands), read=[tmp_path],
                  limits=tj.Limits(max_window_bytes=size, **kwargs.pop("limits", {})), **kwargs)


@pytest.fixture
def locating(monkeypatch):
    """``started`` is set as the locator starts; ``hold`` (seconds) delays it there; it runs without a time
    budget of its own, so only the job's check can end it early."""
    started, hold = threading.Event(), {"seconds": 0.0}
    real = grounding.locate

    def held(*args, **kwargs):
        started.set()
        time.sleep(hold["seconds"])
        kwargs["bounds"] = grounding.Bounds(max_seconds=3600, fuzzy_budget_chars=64 * 1024 * 1024)
        return real(*args, **kwargs)

    monkeypatch.setattr(requirements, "locate", held)
    return started, hold


def test_a_cancel_while_the_result_is_located_cancels_the_job(tmp_path, locating):
    started, _ = locating
    job = reading_job(tmp_path).start()
    assert started.wait(60), "the guest should have finished and locating begun"
    job.cancel()
    job.wait(60)
    assert job.status is JobStatus.CANCELLED and job.envelope.error.code == codes.CANCELLED
    assert job.envelope.sources is None and job.result is None


def test_a_job_past_its_deadline_while_locating_fails_timeout(tmp_path, locating):
    started, hold = locating
    hold["seconds"] = 3.0
    job = reading_job(tmp_path, limits={"job_timeout_s": 2.5}).start()
    job.wait(60)
    assert started.is_set()
    assert job.status is JobStatus.FAILED and job.envelope.error.code == codes.TIMEOUT


def test_a_field_not_searched_in_time_has_no_source_and_is_rejected(tmp_path, monkeypatch):
    real = grounding.locate
    monkeypatch.setattr(requirements, "locate",
                        lambda *a, **kw: real(*a, **{**kw, "bounds": grounding.Bounds(max_seconds=0)}))
    job = reading_job(tmp_path, require_grounded=["field3"]).start()
    job.wait(60)
    assert job.envelope.ok and job.result["field3"] and job.envelope.sources == {}
    assert list(job.envelope.rejected) == ["field3"]
    assert "could not be looked for within the locator's bounds" in job.envelope.rejected["field3"]
    failing = reading_job(tmp_path, require_grounded=["field3"], fail_item=True).start()
    failing.wait(60)
    assert failing.envelope.error.code == codes.UNGROUNDED

"""Maps on a Dask cluster, in process: worker processes on this machine (one LocalCluster per module).

The test process holds a client for the cluster, but never a *default* one:
a default client would hide every place where the map forgot to pass its
own (the original bug of ``--cluster ADDRESS`` from a terminal). Each test
checks that none exists. The black-box tests -- a scheduler and workers as
separate processes, the CLI, the magic in a kernel -- are in test_map_cluster.py.
"""

import functools
import json
import os
import signal
import time

import pytest

distributed = pytest.importorskip("distributed")

from tensorjob_jupyter import fanout
from tensorjob_jupyter.fanout import map as tj_map, start_map
from tensorjob_jupyter.fanout.items import process_backend_count
from tensorjob_jupyter.fanout.dask import error_outcome
from tensorjob_jupyter.inference import ScriptedBackend
from tensorjob_jupyter.inference.providers import ModelRef

from test_map import MIXED, done, infer, job_dirs, puppet_guest, sorted_lines, write_manifest  # noqa: E402

FACTORY = functools.partial(ScriptedBackend, "a b c")

pytestmark = pytest.mark.slow  # a Dask cluster in this process: seconds each


@pytest.fixture(scope="module")
def client():
    cluster = distributed.LocalCluster(n_workers=2, processes=True, threads_per_worker=1,
                                       dashboard_address=":0", silence_logs=40)
    client = distributed.Client(cluster, set_as_default=False)
    yield client
    client.close()
    cluster.close()


@pytest.fixture(autouse=True)
def no_default_client():
    """No test here may run with a default client: it would hide a forgotten ``client=``."""
    assert_no_default_client()
    yield
    assert_no_default_client()


def assert_no_default_client():
    with pytest.raises(ValueError, match="No clients found"):
        distributed.default_client()


@pytest.fixture(scope="module")
def guest():
    return puppet_guest()


def items_in(path):
    return sorted(json.loads(line)["item"] for line in sorted_lines(path))


def test_the_files_are_the_same_as_a_local_run(client, guest, tmp_path):
    manifest = write_manifest(tmp_path / "m.jsonl", MIXED + [done(i) for i in range(10)])
    local = tj_map(guest, manifest, tmp_path / "local", backend=FACTORY)
    run = start_map(guest, manifest, tmp_path / "dask", backend=FACTORY, cluster=client)
    remote = run.wait(60)

    assert remote.status == "finished" and (remote.completed, remote.failed) == (local.completed, local.failed)
    assert sorted_lines(remote.results_path) == sorted_lines(local.results_path)
    assert sorted_lines(remote.failures_path) == sorted_lines(local.failures_path)
    assert run.dashboard_link == client.dashboard_link and run.progress().dashboard_link
    # a worker builds the backend once, on its first item, and keeps it for the rest
    # (these items are quick: one worker may have run them all)
    built = list(client.run(process_backend_count).values())
    assert set(built) <= {0, 1} and sum(built) >= 1


def test_a_scheduler_address_works_and_resume_is_the_same(client, guest, tmp_path):
    manifest = write_manifest(tmp_path / "m.jsonl", [done(i) for i in range(6)])
    tj_map(guest, manifest, tmp_path / "run", backend=FACTORY)  # locally first
    lines = (tmp_path / "run" / "results.jsonl").read_text().splitlines(keepends=True)
    (tmp_path / "run" / "results.jsonl").write_text("".join(lines[:2]))
    result = tj_map(guest, manifest, tmp_path / "run", backend=FACTORY, cluster=client.scheduler.address)
    assert (result.ran, result.skipped, result.completed) == (4, 2, 6)
    assert items_in(result.results_path) == list(range(6))


def test_a_worker_killed_mid_run_loses_nothing(client, guest, tmp_path):
    n = 16
    slow = functools.partial(ScriptedBackend, "a b c", token_delay_s=0.08)
    manifest = write_manifest(tmp_path / "m.jsonl", [infer(str(i)) for i in range(n)])
    victim, pid = next(iter(client.run(os.getpid).items()))
    run = start_map(guest, manifest, tmp_path / "run", backend=slow, cluster=client)
    progress = run.wait_for_update()
    while progress.completed < 3:
        progress = run.wait_for_update(progress.version, timeout=20)
    deadline = time.monotonic() + 10
    while not client.run(_executing, workers=[victim])[victim] and time.monotonic() < deadline:
        time.sleep(0.01)
    at_kill = run.progress()
    os.kill(pid, signal.SIGKILL)  # mid-item
    result = run.wait(60)

    assert result.ok and (result.completed, result.failed) == (n, 0)
    assert items_in(result.results_path) == list(range(n))  # every item recorded exactly once
    assert (tmp_path / "run" / "failures.jsonl").read_text() == ""
    assert job_dirs(tmp_path / "run") > n  # the killed item ran again elsewhere
    assert len({r["pid"] for r in run.recent}) >= 2
    submitted_later = [r for r in run.recent if r["item"] >= at_kill.completed + at_kill.running]
    assert submitted_later and pid not in {r["pid"] for r in submitted_later}
    client.wait_for_workers(2, timeout=30)


def _executing(dask_worker):
    return dask_worker.state.executing_count


def test_cancel_reaches_the_workers_and_resume_finishes(client, guest, tmp_path):
    n = 20
    slow = functools.partial(ScriptedBackend, "a b c", token_delay_s=0.1)
    manifest = write_manifest(tmp_path / "m.jsonl", [infer(str(i)) for i in range(n)])
    run = start_map(guest, manifest, tmp_path / "run", backend=slow, cluster=client)
    progress = run.wait_for_update()
    while progress.completed < 2:
        progress = run.wait_for_update(progress.version, timeout=20)
    cancelled_at = time.monotonic()
    run.cancel()
    first = run.wait(30)
    assert time.monotonic() - cancelled_at < 5
    assert first.status == "cancelled" and first.completed < n
    assert (tmp_path / "run" / "failures.jsonl").read_text() == ""

    second = tj_map(guest, manifest, tmp_path / "run", backend=FACTORY, cluster=client)
    assert second.ok and second.ran == n - first.completed
    assert items_in(second.results_path) == list(range(n))


def test_an_item_that_keeps_killing_workers_fails_as_worker_lost():
    from distributed.scheduler import KilledWorker

    outcome = error_outcome(7, KilledWorker("tensorjob-item-x-7", "tcp://w", 3))
    assert outcome["item"] == 7 and outcome["error"]["code"] == fanout.WORKER_LOST
    assert "died 4 times" in outcome["error"]["message"]


def test_the_map_view_links_the_dask_dashboard(client, guest, tmp_path):
    from tensorjob_jupyter.frontends.view.map_widget import MapView

    manifest = write_manifest(tmp_path / "m.jsonl", [done(i) for i in range(4)])
    run = start_map(guest, manifest, tmp_path / "run", backend=FACTORY, cluster=client)
    view = MapView(run, "puppet", refresh_hz=20).start()
    run.wait(60)
    view.join(10)
    assert f'href="{client.dashboard_link}"' in view.header.value and "Dask dashboard" in view.header.value
    assert "<b>4</b> / 4" in view.counts.value


def test_the_worker_check_names_what_is_missing(tmp_path, monkeypatch):
    """The probe ``check_workers`` sends to every worker, run here, and how its reports read."""
    import cloudpickle

    from tensorjob_jupyter import __version__
    from tensorjob_jupyter.fanout.dask import worker_problem, worker_probe

    probe = worker_probe()
    model = tmp_path / "m.gguf"
    assert "model_error" in probe({"kind": "file", "name": str(model)}, True, None)
    model.write_bytes(b"GGUF")
    assert "model_error" not in probe({"kind": "file", "name": str(model)}, True, None)
    report = probe({"kind": "embedded", "name": ""}, False, cloudpickle.dumps(FACTORY))
    assert report["version"] == __version__ and not {"package_error", "factory_error", "model_error"} & set(report)
    assert "factory_error" in probe({"kind": "embedded", "name": ""}, False, b"not a pickle")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # a hf: model not in the worker's cache, and no download tried
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert "model_error" in probe({"kind": "hf", "name": "hf:no-such-org/no-such-repo"}, True, None)

    spec = fanout.BackendSpec.of(None, ModelRef.parse(str(model)))
    assert worker_problem("tcp://w:1", report, __version__, spec) is None
    assert "has tensorjob-jupyter 0.0.1, this process " + __version__ in worker_problem(
        "tcp://w:1", {"version": "0.0.1"}, __version__, spec)
    assert "cannot import tensorjob_jupyter (ModuleNotFoundError" in worker_problem(
        "tcp://w:1", {"package_error": "ModuleNotFoundError: x"}, __version__, spec)
    assert f"model file {model} not found on worker tcp://w:1" in worker_problem(
        "tcp://w:1", {"version": __version__, "model_error": "no such file"}, __version__, spec)


def test_a_blank_cluster_address_is_a_cluster_error(guest, tmp_path):
    # (an unreachable scheduler: test_map_cluster.py, from the command and from a kernel)
    with pytest.raises(fanout.ClusterError, match="needs a scheduler address"):
        start_map(guest, [done(1)], tmp_path / "run", backend=FACTORY, cluster=" ")
    assert not (tmp_path / "run").exists()


def test_a_cluster_without_workers_is_refused_after_a_wait():
    from tensorjob_jupyter.fanout.dask import check_workers

    with distributed.LocalCluster(n_workers=0, processes=False, dashboard_address=":0", silence_logs=40) as cluster, \
            distributed.Client(cluster, set_as_default=False) as empty:
        with pytest.raises(fanout.ClusterError, match="no workers are connected .* add one with `dask worker "):
            check_workers(empty, fanout.BackendSpec.of(FACTORY), cluster.scheduler_address, timeout=0.5)


def test_sources_confidence_and_require_grounded_on_a_cluster(client, tmp_path):
    """A map on Dask gives each item's sources and confidence as a local one does, rejects a planted value alone
    when its field is required to be grounded, and fails its item with ``ungrounded`` under ``fail_item``."""
    from test_confidence import ANSWER, confident_guest
    from test_sources import GUEST, LINES
    docs = tmp_path / "docs"
    docs.mkdir()
    for i, line in enumerate(LINES):
        (docs / f"d{i}.txt").write_text(f"{line}\n", encoding="utf-8")
    claims = ["ACME Corp", "zoë  ångström", "The product named, or null,"]  # exact, normalised, planted
    manifest = write_manifest(tmp_path / "m.jsonl", [{"path": str(docs / f"d{i}.txt"), "claim": c}
                                                     for i, c in enumerate(claims)])
    grounded = tj_map(GUEST, manifest, tmp_path / "grounded", read=[docs], backend=FACTORY, cluster=client)
    assert grounded.status == "finished" and grounded.completed == 3
    assert [grounded.sources()[i]["claim"] != [] for i in range(3)] == [True, True, False]
    assert [row["item"] for row in grounded.review()][0] == 2
    rejecting = tj_map(GUEST, manifest, tmp_path / "rejecting", read=[docs], backend=FACTORY, cluster=client,
                       require_grounded=["claim"])
    assert (rejecting.completed, rejecting.failed) == (3, 0)
    assert [row["rejected.claim"] is not None for row in rejecting.rows()] == [False, False, True]
    strict = tj_map(GUEST, manifest, tmp_path / "strict", read=[docs], backend=FACTORY, cluster=client,
                    require_grounded=["claim"], fail_item=True)
    assert (strict.completed, strict.failed) == (2, 1) and strict.failures()[2]["code"] == "ungrounded"

    sure = functools.partial(ScriptedBackend, ANSWER, logprobs=-0.05)
    confident = tj_map(confident_guest(), write_manifest(tmp_path / "c.jsonl", [{"n": i} for i in range(3)]),
                       tmp_path / "confident", backend=sure, cluster=client)
    assert confident.completed == 3
    assert all(0.5 < c["name"] <= 1 for c in confident.confidences().values())
    assert all(0.5 < v <= 1 for v in confident.to_pandas()["confidence.name"])

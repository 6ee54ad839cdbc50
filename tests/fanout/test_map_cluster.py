"""Maps on a real Dask cluster, black box: every entry point from a process with no Dask client.

The scheduler and the workers are separate processes (``dask scheduler``,
``dask worker ADDRESS``, as a user starts them: tests/dask_procs.py); the
map runs from another fresh process -- the ``tensorjob`` command, a Jupyter
kernel running ``%tensorjob map``, or a Python script calling ``tj.map`` --
and this test process holds no client at all, so nothing can hide a place
where the map leans on a default client. The in-process tests, with a
``LocalCluster``, are in test_map_dask.py.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

pytest.importorskip("distributed")
psutil = pytest.importorskip("psutil")

from dask_procs import ProcessCluster, worker_env  # noqa: E402

pytestmark = pytest.mark.slow  # schedulers and workers as processes: seconds each
from test_map import MIXED, done, fail, infer, job_dirs, puppet_guest, sorted_lines, write_manifest  # noqa: E402

#: A script run as its own process: ``tj.map`` on a cluster, a scripted model; prints the summary.
PY_MAP = """
import functools, json, sys
import distributed
import tensorjob_jupyter as tj
from tensorjob_jupyter.inference import ScriptedBackend

guest, manifest, run_dir, cluster, delay = sys.argv[1:6]
factory = functools.partial(ScriptedBackend, "a b c", token_delay_s=float(delay))
result = tj.map(guest, manifest, run_dir, cluster=None if cluster == "local" else cluster, backend=factory)
try:
    distributed.default_client()
    default = True
except ValueError:
    default = False
print(json.dumps({**result.to_json(), "default_client": default}))
"""


@pytest.fixture(autouse=True)
def no_client_here():
    """This process never holds a Dask client: the map under test runs elsewhere."""
    yield
    if "distributed" in sys.modules:
        from distributed.client import _global_clients

        assert not _global_clients


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with ProcessCluster(tmp_path_factory.mktemp("cluster"), workers=2) as c:
        yield c


@pytest.fixture
def guest(tmp_path):
    path = tmp_path / "puppet.wasm"
    path.write_bytes(puppet_guest())
    return path


@pytest.fixture
def data(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_text("hello", encoding="utf-8")
    (tmp_path / "secret.txt").write_text("no", encoding="utf-8")
    return tmp_path / "docs"


def tensorjob(*argv, cwd, timeout=120):
    """``tensorjob ARGV`` as its own process; (exit code, stdout, stderr, seconds)."""
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "tensorjob_jupyter.frontends.cli", *map(str, argv)], cwd=cwd,
                          env=worker_env(), capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout, proc.stderr, time.monotonic() - started


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def items_in(path):
    return sorted(json.loads(line)["item"] for line in sorted_lines(path))


def statuses(run_dir):
    """The status of every item's job transcript that has its envelope (written as the job ends)."""
    found = []
    for path in run_dir.glob("jobs/*/envelope.json"):
        try:
            found.append(json.loads(path.read_text())["status"])
        except (OSError, ValueError, KeyError):
            pass  # being written
    return found


def sessions(run_dir):
    return json.loads((run_dir / "ledger.json").read_text())["sessions"]


def assert_one_line_error(err, *fragments):
    assert err.count("\n") == 1 and err.startswith("tensorjob: error: "), err
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in err, err


# --- the command line --------------------------------------------------------------------------


def test_the_command_on_a_cluster_in_another_process_writes_what_a_local_run_writes(cluster, guest, data, tmp_path):
    # no infer: the files must be byte-identical, and no model is loaded (a guest that never infers needs none)
    items = ([done({"n": 0}), fail("bad_item", "item 1 is bad"), done([1, "ü"]), "not a command"]
             + [{"cmd": "open", "path": str(data / "a.txt")}, {"cmd": "open", "path": str(tmp_path / "secret.txt")},
                {"cmd": "open", "path": str(data / "absent.txt")}] + [done(i) for i in range(8)])
    manifest = write_manifest(tmp_path / "m.jsonl", items)
    n = len(items)
    code, out, err, _ = tensorjob("map", guest, "--over", manifest, "--read", data, "--run-dir", "local",
                                  cwd=tmp_path)
    assert code == 1, err
    code, out, err, _ = tensorjob("map", guest, "--over", manifest, "--read", data, "--run-dir", "remote",
                                  "--cluster", cluster.address, cwd=tmp_path)
    assert code == 1, err  # some items fail, as they do locally
    assert f"{n} items: {n - 4} completed, 4 failed ({n} ran, 0 skipped)" in out and f"{n}/{n}" in err
    assert "No clients found" not in err and "Traceback" not in err
    local, remote = tmp_path / "local", tmp_path / "remote"
    assert sorted_lines(remote / "results.jsonl") == sorted_lines(local / "results.jsonl")
    assert sorted_lines(remote / "failures.jsonl") == sorted_lines(local / "failures.jsonl")
    codes = sorted(json.loads(line)["error"]["code"] for line in sorted_lines(remote / "failures.jsonl"))
    assert codes == ["bad_item", "capability_denied", "not_found", "wasm_trap"]
    assert job_dirs(remote) == n  # the workers wrote each item's transcript into the run folder
    assert sessions(remote)[0]["where"] == f"dask {cluster.address}"


def test_an_unreachable_scheduler_is_one_line_naming_it_within_seconds(guest, tmp_path):
    manifest = write_manifest(tmp_path / "m.jsonl", [done(1)])
    address = f"tcp://127.0.0.1:{closed_port()}"
    code, out, err, seconds = tensorjob("map", guest, "--over", manifest, "--run-dir", "run", "--cluster", address,
                                        cwd=tmp_path)
    assert code == 2 and out == ""
    assert_one_line_error(err, f"cannot reach the Dask scheduler at {address}")
    assert seconds < 15  # the 5 s connect timeout, not Dask's 30 s
    assert not (tmp_path / "run").exists()


def test_a_model_path_missing_on_the_workers_is_named_before_anything_runs(cluster, guest, tmp_path):
    manifest = write_manifest(tmp_path / "m.jsonl", [infer("x", 2)])
    model = tmp_path / "models" / "absent.gguf"
    code, out, err, _ = tensorjob("map", guest, "--over", manifest, "--run-dir", "run", "--model", model,
                                  "--cluster", cluster.address, cwd=tmp_path)
    assert code == 2 and out == ""
    assert_one_line_error(err, f"model file {model} not found on worker tcp://127.0.0.1:",
                          "must exist on every worker")
    assert err.count("not found on worker") == 2  # both workers named
    assert not (tmp_path / "run").exists()


def test_workers_without_the_package_are_refused_with_a_message_saying_so(guest, tmp_path, tmp_path_factory):
    """A worker in a Python environment that has Dask but not tensorjob-jupyter, as on a machine where
    only dask was installed: this environment's packages less this one (links to every entry of
    site-packages but ours), with ``-S`` so no .pth file (an editable install) runs; cwd an empty folder."""
    bare, site = tmp_path / "bare", tmp_path / "bare-site-packages"
    bare.mkdir()
    site.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if "tensorjob_jupyter" not in entry.name and not entry.name.startswith("tensorjob-jupyter"):
            (site / entry.name).symlink_to(entry)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(site)
    probe = subprocess.run([sys.executable, "-S", "-c", "import distributed, tensorjob_jupyter.fanout"],
                           env=env, cwd=bare, capture_output=True, text=True)
    assert probe.returncode != 0 and "No module named 'tensorjob_jupyter" in probe.stderr
    with ProcessCluster(tmp_path_factory.mktemp("bare-cluster"), workers=0) as bare_cluster:
        bare_cluster.add_worker(argv=[sys.executable, "-S", "-m", "distributed.cli.dask_worker"], env=env, cwd=bare)
        bare_cluster.wait_for_workers(1)
        manifest = write_manifest(tmp_path / "m.jsonl", [done(1)])
        code, out, err, _ = tensorjob("map", guest, "--over", manifest, "--run-dir", "run",
                                      "--cluster", bare_cluster.address, cwd=tmp_path)
    assert code == 2 and out == ""
    assert_one_line_error(err, "worker tcp://127.0.0.1:", "cannot import tensorjob_jupyter",
                          "install the same tensorjob-jupyter on every worker")
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
@pytest.mark.parametrize("first", ["local", "cluster"])
def test_a_map_resumes_across_local_and_cluster_runs_on_the_real_model(cluster, guest, tmp_path, first):
    """A map run here stops part way (a crash: only some results were written), then the rest runs on
    the cluster into the same run folder -- and the reverse. Items infer on the embedded model (a few
    tokens each), in this process and on the workers."""
    n = 6
    manifest = write_manifest(tmp_path / "m.jsonl", [infer(f"{i}, {i + 1}, {i + 2},", 4) for i in range(n)])
    where = {"local": ["--concurrency", "2"], "cluster": ["--cluster", cluster.address]}
    second = "cluster" if first == "local" else "local"
    argv = ["map", guest, "--over", manifest, "--run-dir", "run"]
    code, out, err, _ = tensorjob(*argv, *where[first], cwd=tmp_path)
    assert code == 0, err
    results = tmp_path / "run" / "results.jsonl"
    lines = results.read_text(encoding="utf-8").splitlines(keepends=True)
    results.write_text("".join(lines[:3]) + lines[3][:10], encoding="utf-8")  # 3 durable, 1 torn

    code, out, err, _ = tensorjob(*argv, *where[second], cwd=tmp_path)
    assert code == 0, err
    assert f"{n} items: {n} completed, 0 failed (3 ran, 3 skipped)" in out
    assert items_in(results) == list(range(n))  # each item recorded exactly once
    for line in sorted_lines(results):
        result = json.loads(line)["result"]
        assert result["event"] == "infer_done" and 0 < result["tokens_out"] <= 4
    assert [s["where"].split()[0] for s in sessions(tmp_path / "run")] == (
        ["local", "dask"] if first == "local" else ["dask", "local"])


# --- tj.map from a fresh Python process ----------------------------------------------------------


def py_map(*argv, **popen):
    return subprocess.Popen([sys.executable, "-c", PY_MAP, *map(str, argv)], env=worker_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


def test_python_map_from_a_fresh_process_with_a_scripted_model(cluster, guest, tmp_path):
    manifest = write_manifest(tmp_path / "m.jsonl", MIXED + [done(i) for i in range(6)])
    proc = py_map(guest, manifest, tmp_path / "run", cluster.address, 0.0)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    summary = json.loads(out)
    assert (summary["status"], summary["completed"], summary["failed"]) == ("finished", 9, 2)
    assert summary["default_client"] is False  # the map used its own client and left none behind
    records = [json.loads(line) for line in sorted_lines(tmp_path / "run" / "results.jsonl")]
    results = {r["item"]: r["result"] for r in records}
    assert results[4] == {"event": "infer_done", "text": "a b", "tokens_out": 2}  # the factory reached the workers


#: A script run as its own process: a scored ``tj.map`` on a cluster; the scorer records where it ran.
PY_SCORED_MAP = """
import json, os, sys
import tensorjob_jupyter as tj

guest, manifest, run_dir, cluster, expected = sys.argv[1:6]
where = set()

def year_and_title(result, expected):  # a closure over this process: it never travels to a worker
    where.add(os.getpid())
    return tj.Scored(sum(result[k] == expected[k] for k in expected) / len(expected),
                     {k: result[k] == expected[k] for k in expected})

fields = tj.map(guest, manifest, run_dir, cluster=cluster, expected=expected, scorer="json_fields").to_pandas()
mine = tj.map(guest, manifest, run_dir + "-2", cluster=cluster, expected=expected, scorer=year_and_title)
print(json.dumps({"score": fields["score"].tolist(), "year": fields["score.year"].tolist(),
                  "summary": mine.score_summary().to_json(), "scored_here": sorted(where) == [os.getpid()],
                  "ledger_where": json.load(open(os.path.join(run_dir, "ledger.json")))["sessions"][-1]["where"]}))
"""


def test_a_scored_map_on_the_cluster_has_its_score_columns_and_scores_on_the_maps_side(cluster, guest, tmp_path):
    items = [done({"title": "A", "year": 1}), done({"title": "B", "year": 2}), done({"title": "C", "year": 3})]
    manifest = write_manifest(tmp_path / "m.jsonl", items)
    expected = write_manifest(tmp_path / "e.jsonl", [{"title": "A", "year": 1}, {"title": "B", "year": 9},
                                                     {"title": "X", "year": 9}])
    proc = subprocess.run([sys.executable, "-c", PY_SCORED_MAP, str(guest), str(manifest), str(tmp_path / "run"),
                           cluster.address, str(expected)], env=worker_env(), capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["ledger_where"].startswith("dask ")
    assert out["score"] == [1.0, 0.5, 0.0] and out["year"] == [True, False, False]
    assert out["summary"]["passed"] == 1 and out["summary"]["fields"] == {"title": 0.666667, "year": 0.333333}
    assert out["scored_here"]  # the Python scorer ran in the map's process, never on a worker


@pytest.mark.slow
def test_a_worker_killed_mid_item_loses_nothing_and_the_map_resumes(guest, tmp_path, tmp_path_factory):
    """Two workers without nannies (a worker that dies stays dead, like a machine); one is killed
    with SIGKILL while it runs an item (its open transcript says so); every item still completes."""
    n = 8
    manifest = write_manifest(tmp_path / "m.jsonl", [infer(str(i)) for i in range(n)])
    run_dir = tmp_path / "run"
    with ProcessCluster(tmp_path_factory.mktemp("kill-cluster"), workers=2, nanny=False) as kill_cluster:
        proc = py_map(guest, manifest, run_dir, kill_cluster.address, 0.2)  # ~0.6 s an item
        victim = psutil.Process(kill_cluster.workers[0].pid)
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the worker never ran an item"
            running = [f.path for f in victim.open_files() if f.path.startswith(str(run_dir / "jobs"))]
            if running and (run_dir / "results.jsonl").exists():
                break
            time.sleep(0.02)
        victim.kill()  # SIGKILL, mid-item
        out, err = proc.communicate(timeout=120)
        survivor_alive = kill_cluster.workers[1].poll() is None
    assert proc.returncode == 0, err
    summary = json.loads(out)
    assert (summary["status"], summary["completed"], summary["failed"]) == ("finished", n, 0), summary
    assert items_in(run_dir / "results.jsonl") == list(range(n))  # every item, each recorded once
    assert (run_dir / "failures.jsonl").read_text() == ""
    killed_job = Path(running[0]).parent
    assert not (killed_job / "envelope.json").exists()  # the item the worker died in ...
    assert job_dirs(run_dir) > n  # ... ran again elsewhere
    assert survivor_alive

    # resumable: the folder is whole, so running the map again runs nothing
    from tensorjob_jupyter.fanout import map as tj_map

    again = tj_map(guest.read_bytes(), manifest, run_dir)
    assert (again.ran, again.skipped, again.completed) == (0, n, n)


def test_ctrl_c_stops_a_cluster_map_and_it_finishes_locally(cluster, guest, tmp_path):
    n = 10
    manifest = write_manifest(tmp_path / "m.jsonl", [infer(str(i)) for i in range(n)])
    run_dir = tmp_path / "run"
    proc = py_map(guest, manifest, run_dir, cluster.address, 0.3)  # ~1 s an item
    deadline = time.monotonic() + 60
    while not ((run_dir / "results.jsonl").exists() and (run_dir / "results.jsonl").read_text().count("\n") >= 2):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the map made no progress"
        time.sleep(0.02)
    interrupted = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert time.monotonic() - interrupted < 10
    first = json.loads(out)
    assert first["status"] == "cancelled" and 2 <= first["completed"] < n
    deadline = time.monotonic() + 10  # the map does not wait for the workers' items to wind down
    while "cancelled" not in statuses(run_dir):
        assert time.monotonic() < deadline, "the cancel never reached the items running on the workers"
        time.sleep(0.05)
    assert (run_dir / "failures.jsonl").read_text() == ""  # cancelled items are not failures

    proc = py_map(guest, manifest, run_dir, "local", 0.0)
    out, err = proc.communicate(timeout=60)
    second = json.loads(out)
    k = first["completed"]
    assert (second["status"], second["ran"], second["skipped"]) == ("finished", n - k, k)
    assert items_in(run_dir / "results.jsonl") == list(range(n))


# --- %tensorjob map in a fresh kernel --------------------------------------------------------------


@pytest.fixture
def kernel(tmp_path):
    from jupyter_client.manager import start_new_kernel

    env = worker_env(TENSORJOB_RUNS=str(tmp_path / "kernel-runs"))
    km, kc = start_new_kernel(kernel_name="python3", env=env, cwd=str(tmp_path))
    try:
        yield kc
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_the_magic_in_a_fresh_kernel_maps_on_the_cluster(cluster, guest, data, kernel, tmp_path):
    from test_kernel import run, stdout, widget_states

    items = [done(i) for i in range(5)] + [{"cmd": "open", "path": str(data / "absent.txt")}]
    write_manifest(tmp_path / "m.jsonl", items)
    run(kernel, "%load_ext tensorjob_jupyter")
    reply, messages = run(kernel, f"r = %tensorjob map {guest.name} --over m.jsonl --read docs --run-dir remote "
                                  f"--cluster {cluster.address}", timeout=120)
    assert reply["content"]["status"] == "ok", reply["content"]
    # the live view shows the map (no text summary under it: the result is shown once); the value says how it went
    reply, value = run(kernel, "print(r.status, r.completed, r.failed, r.skipped)")
    assert stdout(value).split() == ["finished", "5", "1", "0"]
    headers = [v for v in (s.get("value") for s in widget_states(messages).values())
               if isinstance(v, str) and "<b>tensorjob map</b>" in v]
    assert headers and "Dask dashboard" in headers[-1]  # the live map view links the cluster's dashboard

    reply, messages = run(kernel, "%tensorjob map puppet.wasm --over m.jsonl --read docs --run-dir local --quiet")
    assert reply["content"]["status"] == "ok"
    for name in ("results.jsonl", "failures.jsonl"):
        assert sorted_lines(tmp_path / "remote" / name) == sorted_lines(tmp_path / "local" / name)

    reply, messages = run(kernel, "import distributed\ntry:\n    distributed.default_client()\n    print('default')\n"
                                  "except ValueError:\n    print('none')")
    assert stdout(messages).strip() == "none"  # the magic's map left no default client in the kernel

    address = f"tcp://127.0.0.1:{closed_port()}"
    started = time.monotonic()
    reply, messages = run(kernel, f"%tensorjob map puppet.wasm --over m.jsonl --run-dir nowhere --cluster {address}")
    assert time.monotonic() - started < 15
    content = reply["content"]
    assert content["status"] == "error" and content["ename"] == "UsageError"
    assert f"cannot reach the Dask scheduler at {address}" in content["evalue"] and "\n" not in content["evalue"]
    assert not (tmp_path / "nowhere").exists()


# --- a Python guest on the cluster ----------------------------------------------------------------


def test_a_python_guest_maps_on_the_cluster_and_the_workers_reuse_the_compiled_interpreter(tmp_path,
                                                                                             tmp_path_factory):
    """``tensorjob map wordcount.py --cluster ADDR``: the guest travels as bytes, each worker runs it in its own
    CPython-in-wasm, and finds the interpreter already built and compiled in its cache dir (``TENSORJOB_CACHE``,
    shared by every process on a machine) instead of building it again (a minute, once per machine).

    The workers' cache dir is a copy of this machine's interpreter files, apart from the one the command itself
    uses, so what happens there is the workers' alone: every worker's first Python guest takes the cache's lock
    (``build.lock`` appears) and leaves the built and compiled files exactly as they were."""
    from tensorjob_jupyter.sandbox.python import interpreter

    interpreter.ensure(False)  # this machine's interpreter (no-op when cached); the command checks syntax with it
    source = interpreter.cache_root()
    workers_cache = tmp_path / "workers-cache"
    (workers_cache / "python").mkdir(parents=True)
    key = interpreter.build_key()
    for f in source.glob(f"interpreter-{key}*"):
        shutil.copy2(f, workers_cache / "python" / f.name)

    def files():
        return {p.name: (p.stat().st_ino, p.stat().st_size, p.stat().st_mtime_ns)
                for p in (workers_cache / "python").iterdir()}

    before = files()
    assert any(name.endswith("-nofuel.cwasm") for name in before), before

    data = tmp_path / "docs"
    data.mkdir()
    texts = {f"d{i}.txt": " ".join(f"w{j}" for j in range(i * 37 + 1)) + "\n" * i for i in range(8)}
    for name, text in texts.items():
        (data / name).write_text(text, encoding="utf-8")
    manifest = write_manifest(tmp_path / "m.jsonl", [{"path": str(data / name), "window": 64} for name in texts])
    guest = Path(__file__).resolve().parents[2] / "guests" / "examples" / "wordcount.py"

    env = worker_env(TENSORJOB_CACHE=str(workers_cache))
    with ProcessCluster(tmp_path_factory.mktemp("py-cluster"), workers=2, env=env) as cluster:
        code, out, err, seconds = tensorjob("map", guest, "--over", manifest, "--read", data, "--run-dir", "run",
                                            "--cluster", cluster.address, cwd=tmp_path, timeout=600)
        worker_logs = "\n".join(cluster.log(f"worker-{i}")[-1500:] for i in range(2))
    assert code == 0, err + worker_logs
    n = len(texts)
    assert f"{n} items: {n} completed, 0 failed ({n} ran, 0 skipped)" in out, out
    assert sessions(tmp_path / "run")[0]["where"] == f"dask {cluster.address}"
    results = {json.loads(line)["item"]: json.loads(line)["result"]
               for line in sorted_lines(tmp_path / "run" / "results.jsonl")}
    for i, (name, text) in enumerate(texts.items()):
        assert results[i] == {"path": str(data / name), "words": len(text.split()), "bytes": len(text.encode())}
    assert job_dirs(tmp_path / "run") == n
    # The workers used their cache dir, and built and compiled nothing: the files are the same files.
    after = files()
    assert "build.lock" in after, after
    assert {k: v for k, v in after.items() if k != "build.lock"} == before, (before, after)

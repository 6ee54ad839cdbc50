"""``tensorjob_jupyter.fanout``: mapping a guest over a manifest in this process.

Most tests use the *puppet* guest: its input is its first command, and it
answers any event with ``done`` carrying that event. So each manifest line
decides what its item does -- complete with a value, fail with a code,
infer, open a file -- and the results depend on the input.
"""

import functools
import hashlib
import io
import json
import threading
import time

import pytest
import wasmtime

import tensorjob_jupyter as tj
from tensorjob_jupyter import fanout
from tensorjob_jupyter.fanout import ManifestError, ResumeRefused, map as tj_map, read_manifest, start_map
from tensorjob_jupyter.fanout import concurrency
from tensorjob_jupyter.inference import ModelRef
from tensorjob_jupyter.frontends.cli import main as cli_main
from tensorjob_jupyter.inference.topology import physical_cores
from tensorjob_jupyter.inference import ScriptedBackend

# --- the puppet guest ----------------------------------------------------------------

_HEAP = 0x10000
_DESC = 0x100
_PREFIX = b'{"cmd":"done","result":'


def _literal(data: bytes) -> str:
    return "".join(f"\\{b:02x}" for b in data)


PUPPET_WAT = f"""(module
  (memory (export "memory") 2)
  ;; '{{"cmd":"done","result":' sits just below the heap, where the host writes each message
  (data (i32.const {_HEAP - len(_PREFIX)}) "{_literal(_PREFIX)}")
  (func (export "cf_alloc") (param $n i32) (result i32)
    (local $need i32)
    (local.set $need (i32.shr_u (i32.add (i32.add (i32.const {_HEAP + 1}) (local.get $n)) (i32.const 65535))
                                (i32.const 16)))
    (if (i32.gt_u (local.get $need) (memory.size))
      (then (drop (memory.grow (i32.sub (local.get $need) (memory.size))))))
    (i32.const {_HEAP}))
  ;; cf_init: the input itself is the command
  (func (export "cf_init") (param $p i32) (param $n i32) (result i32)
    (i32.store (i32.const {_DESC}) (local.get $p))
    (i32.store (i32.const {_DESC + 4}) (local.get $n))
    (i32.const {_DESC}))
  ;; cf_step: prefix + event + '}}' = done with the event as the result
  (func (export "cf_step") (param $p i32) (param $n i32) (result i32)
    (i32.store8 (i32.add (local.get $p) (local.get $n)) (i32.const 125))
    (i32.store (i32.const {_DESC}) (i32.sub (local.get $p) (i32.const {len(_PREFIX)})))
    (i32.store (i32.const {_DESC + 4}) (i32.add (local.get $n) (i32.const {len(_PREFIX) + 1})))
    (i32.const {_DESC})))"""


def puppet_guest() -> bytes:
    return bytes(wasmtime.wat2wasm(PUPPET_WAT))


def done(value):
    return {"cmd": "done", "result": value}


def fail(code, message):
    return {"cmd": "fail", "code": code, "message": message}


def infer(prompt="p", max_tokens=8):
    return {"cmd": "infer", "prompt": prompt, "max_tokens": max_tokens}


def write_manifest(path, items):
    path.write_text("".join(json.dumps(i) + "\n" for i in items), encoding="utf-8")
    return path


def sorted_lines(path):
    return sorted(path.read_text(encoding="utf-8").splitlines())


def job_dirs(run_dir):
    jobs = run_dir / "jobs"
    return len(list(jobs.iterdir())) if jobs.exists() else 0


def slow_backend(delay=0.03):
    return ScriptedBackend("one two three", token_delay_s=delay)


@pytest.fixture(scope="module")
def guest():
    return puppet_guest()


MIXED = [done({"n": 0}), fail("bad_item", "item 1 is bad"), done([1, "ü"]), "not a command", infer("hi", 2)]


# --- mapping ------------------------------------------------------------------------------


def test_results_and_failures_files_are_exact(guest, tmp_path):
    manifest = write_manifest(tmp_path / "m.jsonl", MIXED)
    result = tj_map(guest, manifest, tmp_path / "run", backend=ScriptedBackend("a b c"))

    assert (result.total, result.completed, result.failed, result.ran, result.skipped) == (5, 3, 2, 5, 0)
    assert result.status == "finished" and not result.ok
    assert result.results_path.read_text(encoding="utf-8").splitlines() == [  # in manifest order
        '{"item":0,"key":"0","result":{"n":0},"sources":{"n":[]},"model":"scripted"}',  # found nowhere: read nothing
        '{"item":2,"key":"2","result":[1,"ü"],"sources":{"0":[],"1":[]},"model":"scripted"}',
        '{"item":4,"key":"4","result":{"event":"infer_done","text":"a b","tokens_out":2},'
        '"sources":{"event":[],"text":[],"tokens_out":[]},"model":"scripted"}',  # each record names its model
    ]
    failures = [json.loads(line) for line in result.failures_path.read_text(encoding="utf-8").splitlines()]
    assert failures[0] == {"item": 1, "key": "1", "error": {"code": "bad_item", "message": "item 1 is bad"},
                           "model": "scripted"}
    assert failures[1]["item"] == 3 and failures[1]["error"]["code"] == "wasm_trap"
    assert result.results() == {0: {"n": 0}, 2: [1, "ü"],
                                4: {"event": "infer_done", "text": "a b", "tokens_out": 2}}
    ledger = json.loads((tmp_path / "run" / "ledger.json").read_text())
    assert ledger["manifest"]["sha256"] == hashlib.sha256(manifest.read_bytes()).hexdigest()
    assert ledger["manifest"]["items"] == 5
    assert ledger["sessions"][0]["completed"] == 3 and ledger["sessions"][0]["finished_at"]
    assert job_dirs(tmp_path / "run") == 5  # every item is an ordinary job with its transcript


def test_results_are_in_manifest_order_with_each_item_s_key_whatever_order_items_finish(guest, tmp_path):
    # item 0 generates for a while; the others end at once and finish first
    items = [{**infer("slow", 8), "path": "reports/a.txt"}, {**done(1), "id": 17}, {**done(2), "name": "third"},
             {**fail("bad", "no"), "url": "https://example.org/d"}, done(4)]
    manifest = write_manifest(tmp_path / "m.jsonl", items)
    finished = []
    run = start_map(guest, manifest, tmp_path / "run", backend=slow_backend(0.05), concurrency=5)
    run.subscribe(lambda event: finished.append(event.get("item")))
    result = run.wait(60)
    assert finished.index(0) > finished.index(1)  # the files were appended out of order...
    records = [json.loads(line) for line in result.results_path.read_text(encoding="utf-8").splitlines()]
    assert [(r["item"], r["key"]) for r in records] == [(0, "reports/a.txt"), (1, "17"), (2, "third"), (4, "4")]
    [failure] = [json.loads(line) for line in result.failures_path.read_text(encoding="utf-8").splitlines()]
    assert (failure["item"], failure["key"]) == (3, "https://example.org/d")
    rows = result.rows()  # ...and the table has the keys too
    assert [row["key"] for row in rows] == ["reports/a.txt", "17", "third", "https://example.org/d", "4"]
    again = fanout.MapResult.read(tmp_path / "run")  # read back from the folder alone
    assert (again.total, again.completed, again.failed, again.status) == (5, 4, 1, "finished")
    assert [row["key"] for row in again.rows()] == [row["key"] for row in rows]
    assert [row["status"] for row in again.rows()] == ["completed"] * 3 + ["failed", "completed"]


def test_item_numbers_count_only_non_blank_lines(guest, tmp_path):
    manifest = tmp_path / "m.jsonl"
    manifest.write_text('\n{"cmd":"done","result":"a"}\n\n   \n{"cmd":"done","result":"b"}\r\n', encoding="utf-8")
    result = tj_map(guest, manifest, tmp_path / "run")
    assert result.results() == {0: "a", 1: "b"}


def test_a_list_of_inputs_is_a_manifest_too(guest, tmp_path):
    result = tj_map(guest, [done(i) for i in range(3)], tmp_path / "run")
    assert result.ok and result.results() == {0: 0, 1: 1, 2: 2}


def test_an_item_travels_as_checked_bytes_and_its_job_still_counts_its_values(guest, tmp_path):
    """An item reaches its job as the bytes the manifest checked (parsed there once); the job's own
    ``max_command_values`` still bounds it, as it bounds an input given directly."""
    big = done(list(range(50)))
    result = tj_map(guest, [done("small"), big], tmp_path / "run", max_command_values=20)
    assert result.results() == {0: "small"}
    assert result.failures()[1]["code"] == "limit_exceeded"
    assert "more than the 20 allowed" in result.failures()[1]["message"]
    with pytest.raises(ValueError, match="more than the 20 allowed"):  # given directly: refused before it starts
        tj.run(guest, input=big, max_command_values=20)


def test_every_item_gets_the_same_grants_and_limits(guest, tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.txt").write_text("hello")
    (tmp_path / "secret.txt").write_text("no")
    items = [{"cmd": "open", "path": str(tmp_path / "data" / "a.txt")},
             {"cmd": "open", "path": str(tmp_path / "secret.txt")}, infer("x", 50)]
    limits = tj.Limits(max_tokens=2)
    result = tj_map(guest, items, tmp_path / "run", read=[tmp_path / "data"], limits=limits,
                    backend=ScriptedBackend("w1 w2 w3 w4"))
    results = result.results()
    assert results[0]["event"] == "opened" and results[0]["len"] == 5
    assert results[2] == {"event": "infer_done", "text": "w1 w2", "tokens_out": 2}
    assert result.failures()[1]["code"] == "capability_denied"


def test_concurrency_runs_n_items_at_once_on_one_shared_backend(guest, tmp_path):
    backend = slow_backend()
    run = start_map(guest, [infer()] * 8, tmp_path / "run", backend=backend, concurrency=3)
    result = run.wait(30)
    assert result.ok
    assert run.progress().peak_running == 3
    assert backend.requests_served == 8  # one model, shared by every item

    run = start_map(guest, [infer()] * 4, tmp_path / "run1", backend=backend, concurrency=1)
    run.wait(30)
    assert run.progress().peak_running == 1


def test_a_backend_factory_is_built_once_per_process(guest, tmp_path):
    factory = functools.partial(ScriptedBackend, "made by a factory")
    tj_map(guest, [infer()], tmp_path / "a", backend=factory)
    built = fanout.process_backend(fanout.BackendSpec.of(factory))
    result = tj_map(guest, [infer()], tmp_path / "b", backend=factory)
    assert fanout.process_backend(fanout.BackendSpec.of(factory)) is built
    assert built.requests_served == 2
    assert result.results()[0]["text"] == "made by a factory"


# --- resume ----------------------------------------------------------------------------------


def test_resume_skips_concluded_items_and_reruns_a_torn_line(guest, tmp_path):
    manifest = write_manifest(tmp_path / "m.jsonl", [done(i) for i in range(6)] + [fail("bad", "no")])
    run_dir = tmp_path / "run"
    first = tj_map(guest, manifest, run_dir)
    assert (first.completed, first.failed) == (6, 1)

    # a crash after two results were durable and a third was half-written
    lines = (run_dir / "results.jsonl").read_text().splitlines(keepends=True)
    (run_dir / "results.jsonl").write_text(lines[0] + lines[1] + lines[2][:7])
    before = job_dirs(run_dir)

    second = tj_map(guest, manifest, run_dir)
    assert job_dirs(run_dir) - before == 4  # only the 4 unfinished items ran again
    assert (second.ran, second.skipped, second.completed, second.failed) == (4, 3, 6, 1)
    assert sorted(json.loads(line)["item"] for line in sorted_lines(run_dir / "results.jsonl")) == list(range(6))
    assert len(sorted_lines(run_dir / "failures.jsonl")) == 1

    third = tj_map(guest, manifest, run_dir)
    assert third.ran == 0 and third.skipped == 7 and job_dirs(run_dir) - before == 4
    assert len(json.loads((run_dir / "ledger.json").read_text())["sessions"]) == 3


def test_retry_failed_runs_only_the_failed_items_again(guest, tmp_path):
    manifest = write_manifest(tmp_path / "m.jsonl", [done(0), fail("flaky", "try again"), done(2)])
    run_dir = tmp_path / "run"
    tj_map(guest, manifest, run_dir)
    before = job_dirs(run_dir)
    again = tj_map(guest, manifest, run_dir, retry_failed=True)
    assert job_dirs(run_dir) - before == 1 and again.ran == 1 and again.skipped == 2
    assert [json.loads(line)["item"] for line in sorted_lines(run_dir / "failures.jsonl")] == [1]


def test_a_cancelled_map_resumes_where_it_stopped(guest, tmp_path):
    manifest = write_manifest(tmp_path / "m.jsonl", [infer(str(i)) for i in range(12)])
    run_dir = tmp_path / "run"
    run = start_map(guest, manifest, run_dir, backend=slow_backend(0.05), concurrency=2)
    progress = run.wait_for_update()
    while progress.completed < 2:
        progress = run.wait_for_update(progress.version, timeout=10)
    run.cancel()
    first = run.wait(10)
    assert first.status == "cancelled" and 2 <= first.completed < 12
    assert (run_dir / "failures.jsonl").read_text() == ""  # cancelled items are not failures

    second = tj_map(guest, manifest, run_dir, backend=slow_backend(0.0))
    assert second.ok and second.ran == 12 - first.completed
    items = [json.loads(line)["item"] for line in sorted_lines(run_dir / "results.jsonl")]
    assert sorted(items) == list(range(12))


def test_a_changed_manifest_is_refused(guest, tmp_path):
    manifest = write_manifest(tmp_path / "m.jsonl", [done(1), done(2)])
    tj_map(guest, manifest, tmp_path / "run")
    write_manifest(manifest, [done(1), done(3)])
    before = job_dirs(tmp_path / "run")
    with pytest.raises(ResumeRefused, match="manifest changed"):
        tj_map(guest, manifest, tmp_path / "run")
    assert job_dirs(tmp_path / "run") == before


def test_a_changed_guest_is_refused(guest, tmp_path):
    tj_map(guest, [done(1)], tmp_path / "run")
    other = bytes(wasmtime.wat2wasm(PUPPET_WAT.replace("(memory (export \"memory\") 2)",
                                                       "(memory (export \"memory\") 3)")))
    with pytest.raises(ResumeRefused, match="guest changed") as info:
        tj_map(other, [done(1)], tmp_path / "run")
    assert "--restart" in str(info.value) and "restart=True" in str(info.value)


def test_restart_starts_a_refused_folder_over_and_touches_nothing_else(guest, tmp_path):
    manifest = write_manifest(tmp_path / "m.jsonl", [done(1), fail("bad", "no")])
    tj_map(guest, manifest, tmp_path / "run")
    (tmp_path / "run" / "notes.txt").write_text("mine")
    write_manifest(manifest, [done(7)])
    with pytest.raises(ResumeRefused, match="--restart"):
        tj_map(guest, manifest, tmp_path / "run")
    result = tj_map(guest, manifest, tmp_path / "run", restart=True)
    assert (result.total, result.completed, result.failed, result.skipped) == (1, 1, 0, 0)
    assert result.results() == {0: 7} and result.failures() == {}
    assert job_dirs(tmp_path / "run") == 1 and (tmp_path / "run" / "notes.txt").read_text() == "mine"
    with pytest.raises(ResumeRefused, match="in use"):  # never while another map holds the folder
        run = start_map(guest, [infer()] * 4, tmp_path / "busy", backend=slow_backend(0.05), concurrency=1)
        try:
            start_map(guest, [infer()] * 4, tmp_path / "busy", restart=True)
        finally:
            run.cancel()
            run.wait(10)


def test_item_events_carry_the_input_and_the_result_or_error(guest, tmp_path):
    events = []
    run = start_map(guest, [done({"a": 1}), fail("bad", "no")], tmp_path / "run")
    run.subscribe(events.append)
    run.wait(10)
    items = sorted((e for e in events if e["type"].startswith("item.")), key=lambda e: e["item"])
    assert items[0]["result"] == {"a": 1} and items[0]["input"] == done({"a": 1})
    assert items[1]["error"]["code"] == "bad" and "result" not in items[1]


def test_a_run_folder_in_use_is_refused(guest, tmp_path):
    run = start_map(guest, [infer()] * 6, tmp_path / "run", backend=slow_backend(0.05), concurrency=1)
    try:
        with pytest.raises(ResumeRefused, match="in use"):
            start_map(guest, [infer()] * 6, tmp_path / "run")
    finally:
        run.cancel()
        run.wait(10)


def test_a_broken_run_folder_ends_the_map_as_an_error_not_a_hang(guest, tmp_path, monkeypatch):
    def disk_full(self, outcome, key):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(fanout.MapFolder, "record", disk_full)
    started = time.monotonic()
    result = tj_map(guest, [infer()] * 8, tmp_path / "run", backend=slow_backend(0.2), concurrency=4)
    assert result.status == "error" and "No space left" in result.error
    assert time.monotonic() - started < 5  # the other running items were cancelled, not waited out
    assert json.loads((tmp_path / "run" / "ledger.json").read_text())["sessions"][0]["status"] == "error"


# --- bad manifests fail before any item runs -------------------------------------------------


def _no_job_ran(guest, manifest, run_dir):
    before = len(tj.jobs())
    with pytest.raises(ManifestError) as info:
        tj_map(guest, manifest, run_dir)
    assert len(tj.jobs()) == before and not run_dir.exists()
    return info.value


def test_bad_json_on_line_3_names_line_3(guest, tmp_path):
    manifest = tmp_path / "m.jsonl"
    manifest.write_text('{"cmd":"done","result":1}\n\n{"cmd": "done", oops}\n{"cmd":"done","result":2}\n')
    error = _no_job_ran(guest, manifest, tmp_path / "run")
    assert error.line == 3 and "line 3 is not valid JSON" in str(error)


def test_a_line_that_is_not_utf8_is_named(guest, tmp_path):
    manifest = tmp_path / "m.jsonl"
    manifest.write_bytes(b'"ok"\n"caf\xe9"\n')
    error = _no_job_ran(guest, manifest, tmp_path / "run")
    assert error.line == 2 and "line 2 is not UTF-8" in str(error)


def test_an_empty_manifest_is_refused(guest, tmp_path):
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("\n  \n")
    assert "no items" in str(_no_job_ran(guest, manifest, tmp_path / "run"))


def test_nan_is_not_json():
    with pytest.raises(ManifestError, match="line 1"):
        fanout.parse_manifest(b'{"x": NaN}\n')


def test_a_missing_manifest_or_grant_is_an_error(guest, tmp_path):
    with pytest.raises(ManifestError, match="cannot read manifest"):
        read_manifest(tmp_path / "absent.jsonl")
    with pytest.raises(FileNotFoundError, match="read grant"):
        tj_map(guest, [done(1)], tmp_path / "run", read=[tmp_path / "absent"])


def test_a_backend_object_cannot_go_to_a_cluster(guest, tmp_path):
    with pytest.raises(ValueError, match="factory"):
        start_map(guest, [done(1)], tmp_path / "run", backend=ScriptedBackend(), cluster="tcp://127.0.0.1:1")


# --- live state -------------------------------------------------------------------------------


def test_live_progress_and_subscribers(guest, tmp_path):
    events, lock = [], threading.Lock()

    def on_event(event):
        with lock:
            events.append(event)

    run = start_map(guest, [infer()] * 5 + [fail("x", "y")], tmp_path / "run", backend=slow_backend(0.01))
    run.subscribe(on_event)  # items may have ended already: each event still comes once
    run.subscribe(lambda e: 1 / 0)  # a broken subscriber harms nothing
    result = run.wait(30)
    progress = run.progress()
    assert result.completed == 5 and result.failed == 1
    assert (progress.completed, progress.failed, progress.running, progress.status) == (5, 1, 0, "finished")
    assert progress.throughput > 0 and progress.remaining == 0 and progress.dashboard_link is None
    kinds = [e["type"] for e in events]  # complete by the time wait() returns
    assert kinds[-1] == "map.finished" and kinds.count("item.failed") == 1 and kinds.count("item.completed") == 5
    late = []
    run.subscribe(late.append)  # a late subscriber (a view shown once the map runs) gets the items it missed
    assert [e["type"] for e in late][-1] == "map.finished" and len(late) == 7
    assert sorted(e["item"] for e in late[:-1]) == list(range(6))
    assert {e["item"] for e in events if e["type"].startswith("item.")} <= set(range(6))
    assert json.dumps(progress.to_json())  # the view can ship it as is


# --- the command line --------------------------------------------------------------------------


def run_cli(*argv):
    out, err = io.StringIO(), io.StringIO()
    code = cli_main(["map", *argv], out=out, err=err)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def guest_file(tmp_path, guest):
    path = tmp_path / "puppet.wasm"
    path.write_bytes(guest)
    return str(path)


def test_cli_exits_zero_when_every_item_completed(guest_file, tmp_path):
    manifest = write_manifest(tmp_path / "m.jsonl", [done(1), done(2)])
    code, out, err = run_cli(guest_file, "--over", str(manifest), "--run-dir", str(tmp_path / "run"))
    assert code == 0, err
    assert "2 items: 2 completed, 0 failed" in out and "2/2" in err


def test_cli_exits_one_when_some_failed_and_json_is_the_summary(guest_file, tmp_path):
    manifest = write_manifest(tmp_path / "m.jsonl", [done(1), fail("bad", "nope")])
    code, out, err = run_cli(guest_file, "--over", str(manifest), "--run-dir", str(tmp_path / "run"),
                             "--json", "--concurrency", "1")
    summary = json.loads(out)
    assert code == 1
    assert (summary["completed"], summary["failed"], summary["status"]) == (1, 1, "finished")
    assert "item 1: bad: nope" in err


def test_cli_usage_errors_are_one_line_and_exit_two(guest_file, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('1\n2\n{oops\n')
    code, out, err = run_cli(guest_file, "--over", str(bad), "--run-dir", str(tmp_path / "run"))
    assert code == 2 and out == "" and err.count("\n") == 1 and "line 3" in err

    code, _, err = run_cli(str(tmp_path / "absent.wasm"), "--over", str(bad), "--run-dir", str(tmp_path / "r"))
    assert code == 2 and "guest file not found" in err

    ok = write_manifest(tmp_path / "ok.jsonl", [done(1)])
    for bad_number in ("0", "-2", "many", "2.5"):
        out, err = io.StringIO(), io.StringIO()
        code = cli_main(["map", guest_file, "--over", str(ok), "--run-dir", str(tmp_path / "r"), "--concurrency",
                         bad_number], out=out, err=err)
        assert code == 2 and err.getvalue().count("\n") == 1, err.getvalue()
        assert "--concurrency" in err.getvalue() and "neither auto nor a whole number" in err.getvalue()


def test_concurrency_auto_is_the_model_s_width_at_most_twice_the_cores(guest, tmp_path, monkeypatch):
    def ledger_concurrency(run_dir):
        return json.loads((run_dir / "ledger.json").read_text())["sessions"][-1]["concurrency"]

    backend = ScriptedBackend("a b")
    tj_map(guest, [done(1)], tmp_path / "default", backend=backend)
    assert ledger_concurrency(tmp_path / "default") == concurrency.auto_concurrency() == min(4, 2 * physical_cores())
    backend.slots = 2  # a backend that batches two sequences says so
    tj_map(guest, [done(1)], tmp_path / "two", backend=backend, concurrency="auto")
    assert ledger_concurrency(tmp_path / "two") == 2
    tj_map(guest, [done(1)], tmp_path / "told", backend=backend, concurrency=3)
    assert ledger_concurrency(tmp_path / "told") == 3
    assert concurrency.auto_concurrency(ModelRef.parse(slots=8)) == min(8, 2 * physical_cores())
    monkeypatch.setattr(concurrency, "physical_cores", lambda: 1)
    assert concurrency.auto_concurrency(ModelRef.parse(slots=8)) == 2 and concurrency.auto_concurrency() == 2
    for wrong in (0, -1, 2.0, True, "four"):
        with pytest.raises(ValueError, match="concurrency must be a whole number at least 1 or 'auto'"):
            tj_map(guest, [done(1)], tmp_path / "wrong", backend=backend, concurrency=wrong)


def test_cli_refuses_a_changed_manifest(guest_file, tmp_path):
    manifest = write_manifest(tmp_path / "m.jsonl", [done(1)])
    assert run_cli(guest_file, "--over", str(manifest), "--run-dir", str(tmp_path / "run"))[0] == 0
    write_manifest(manifest, [done(2)])
    code, _, err = run_cli(guest_file, "--over", str(manifest), "--run-dir", str(tmp_path / "run"))
    assert code == 2 and "manifest changed" in err and err.count("\n") == 1


# --- deterministic maps -----------------------------------------------------------------------


def test_a_deterministic_map_refuses_what_cannot_go_with_it_before_anything_starts(guest, guest_file, tmp_path):
    for kwargs, message in (({"concurrency": 4}, "runs one item at a time; concurrency=4 cannot go with it"),
                            ({"cluster": object()}, "in this process, not on a cluster"),
                            ({"model": "http://127.0.0.1:9/v1"}, "needs a local model")):
        with pytest.raises(ValueError, match=message):
            tj_map(guest, [done(1)], tmp_path / "run", deterministic=True, **kwargs)
        assert not (tmp_path / "run").exists()
    manifest = write_manifest(tmp_path / "m.jsonl", [done(1)])
    code, _, err = run_cli(guest_file, "--over", str(manifest), "--run-dir", str(tmp_path / "run"),
                           "--deterministic", "--concurrency", "3")
    assert code == 2 and "one item at a time" in err and err.count("\n") == 1, err


@pytest.mark.slow  # the real model
def test_a_deterministic_map_decodes_each_item_alone_with_fixed_threads_and_says_so_in_its_ledger(guest, tmp_path):
    from tensorjob_jupyter.fanout.start import deterministic_threads
    from tensorjob_jupyter.inference.models import get_backend

    items = [infer(f"Name a colour, item {i}:", 4) for i in range(3)]
    first = tj_map(guest, items, tmp_path / "one", backend=get_backend(), deterministic=True)
    again = tj_map(guest, items, tmp_path / "two", backend=get_backend(), deterministic=True)
    assert first.ok and again.ok and first.results() == again.results()
    threads = deterministic_threads(None)
    session = json.loads((tmp_path / "one" / "ledger.json").read_text())["sessions"][-1]
    assert session["concurrency"] == 1
    assert session["deterministic"] == {"threads": threads, "prompt_cache": False, "alone": True}
    timings = []
    for events in (tmp_path / "one" / "jobs").glob("*/events.jsonl"):
        for line in events.read_text(encoding="utf-8").splitlines():
            timing = json.loads(line).get("timing")
            if timing:
                timings.append(timing)
    assert len(timings) == 3 and all(t["batch"] == 1 and t["threads"] == threads for t in timings), timings

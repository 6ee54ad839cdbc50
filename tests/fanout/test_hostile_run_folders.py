"""A map's run folder from elsewhere (issue 38): planted FIFOs, files that never end, a forged item count,
item numbers of the wrong type, a ``jobs/`` link out of the folder. Each is met as a user meets it -- ``runs
--table``, ``diff --map`` and ``replay --map`` in a subprocess on a planted copy of a real map's folder -- and
each ends in a one-line refusal naming the file, in bounded time and memory, never a traceback or a hang. A
Hypothesis property mutates a real run folder (file kinds, truncation, types, sizes) and reads it back
through the package's readers: a one-line error or a correct answer, never another exception."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tensorjob_jupyter.fanout import MapError, map as tj_map
from tensorjob_jupyter.fanout.progress import MapResult
from tensorjob_jupyter.history.map_compare import compare
from tensorjob_jupyter.inference import ScriptedBackend

from test_map import done, puppet_guest, write_manifest

ROOT = Path(__file__).resolve().parents[2]
ITEMS = 4
#: Runs the command line, then reports its own peak RSS (as tests/record/test_hostile_transcripts.py does).
PEAK_RSS = ("import resource, sys\n"
            "from tensorjob_jupyter.frontends.cli import main\n"
            "code = main(sys.argv[1:])\n"
            "sys.stderr.write(f'PEAK_RSS_KIB {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}\\n')\n"
            "sys.exit(code)\n")
FOLDER_FILES = ("ledger.json", "results.jsonl", "failures.jsonl", "scores.jsonl", "expected.jsonl")


@pytest.fixture(scope="module")
def mapped(tmp_path_factory) -> tuple[Path, Path]:
    """A real, scored map's run folder and its guest file: (run folder, guest)."""
    where = tmp_path_factory.mktemp("mapped")
    guest = where / "puppet.wasm"
    guest.write_bytes(puppet_guest())
    items = [done({"n": i}) for i in range(ITEMS - 1)] + [{"cmd": "fail", "code": "bad_item", "message": "no"}]
    manifest = write_manifest(where / "m.jsonl", items)
    tj_map(guest, manifest, where / "run", backend=ScriptedBackend("a"), expected=[{"n": i} for i in range(ITEMS)])
    return where / "run", guest


def planted(mapped, tmp_path: Path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(mapped[0], copy, symlinks=True)
    return copy


def tensorjob(*argv, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TENSORJOB_RUNS": str(cwd / "runs")}
    return subprocess.run([sys.executable, "-c", PEAK_RSS, *map(str, argv)], env=env, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=timeout, cwd=cwd)


def peak_mib(proc: subprocess.CompletedProcess) -> float:
    return int([x for x in proc.stderr.splitlines() if x.startswith("PEAK_RSS_KIB ")][-1].split()[1]) / 1024


def said(proc: subprocess.CompletedProcess) -> list[str]:
    """What a command said besides its peak memory and a replay's lines of the grants it runs under."""
    return [x for x in proc.stderr.splitlines()
            if not x.startswith("PEAK_RSS_KIB ") and not x.startswith("replay: ")]


def commands(run: Path, guest: Path) -> list[tuple]:
    return [("runs", "--table", run), ("diff", "--map", run, run),
            ("replay", "--map", run, guest, "--run-dir", run.parent / "replayed", "-q")]


def assert_refused(proc: subprocess.CompletedProcess, baseline_mib: float, *names: str) -> None:
    lines = said(proc)
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert any(name in lines[0] for name in names), lines
    assert peak_mib(proc) - baseline_mib < 100, (peak_mib(proc), baseline_mib)


@pytest.fixture(scope="module")
def baseline_mib(mapped) -> float:
    run, _ = mapped
    proc = tensorjob("runs", "--table", run, cwd=run.parent)
    assert proc.returncode in (0, 1), proc.stderr
    return peak_mib(proc)


def plant_fifo(run: Path, name: str) -> None:
    path = run / name
    if os.path.lexists(path):
        path.unlink()
    os.mkfifo(path)


@pytest.mark.slow  # eighteen CLI processes
@pytest.mark.parametrize("name", FOLDER_FILES)
def test_a_fifo_in_the_run_folder_is_refused_at_once(mapped, baseline_mib, tmp_path, name):
    run = planted(mapped, tmp_path)
    plant_fifo(run, name)
    for argv in commands(run, mapped[1]):
        proc = tensorjob(*argv, cwd=tmp_path)
        if name == "expected.jsonl" and proc.returncode != 2:  # a command that has no need of it: not read at all
            assert "Traceback" not in proc.stderr and proc.returncode in (0, 1), proc.stderr[-2000:]
            continue
        assert_refused(proc, baseline_mib, name)


@pytest.mark.parametrize("name", ["results.jsonl", "scores.jsonl"])
def test_a_file_that_never_ends_is_refused_unread(mapped, baseline_mib, tmp_path, name):
    run = planted(mapped, tmp_path)
    (run / name).unlink()
    (run / name).symlink_to("/dev/zero")
    for argv in commands(run, mapped[1])[:2]:
        assert_refused(tensorjob(*argv, cwd=tmp_path), baseline_mib, name)


def forge_count(run: Path, items: int) -> None:
    ledger = json.loads((run / "ledger.json").read_text())
    ledger["manifest"]["items"] = items
    (run / "ledger.json").write_text(json.dumps(ledger))


@pytest.mark.slow  # eight CLI processes
@pytest.mark.parametrize("items", [10_000_000, 2 ** 53])
def test_a_forged_item_count_is_not_believed(mapped, baseline_mib, tmp_path, items):
    run = planted(mapped, tmp_path)
    forge_count(run, items)  # its manifest at hand says 4
    for argv in commands(run, mapped[1]):
        proc = tensorjob(*argv, cwd=tmp_path)
        assert_refused(proc, baseline_mib, "ledger.json")
        assert f"says the map has {items} items, but the manifest it pins" in said(proc)[0]
    ledger = json.loads((run / "ledger.json").read_text())
    ledger["manifest"]["source"] = str(tmp_path / "gone.jsonl")  # and with no manifest to confirm it
    (run / "ledger.json").write_text(json.dumps(ledger))
    proc = tensorjob("runs", "--table", run, cwd=tmp_path)
    assert_refused(proc, baseline_mib, "ledger.json")
    assert "nothing here confirms it" in said(proc)[0]


@pytest.mark.parametrize("name", ["results.jsonl", "failures.jsonl"])
def test_an_item_number_as_text_is_a_one_line_refusal(mapped, baseline_mib, tmp_path, name):
    run = planted(mapped, tmp_path)
    lines = (run / name).read_text().splitlines()
    record = json.loads(lines[0])
    record["item"] = str(record["item"])
    (run / name).write_text("\n".join([json.dumps(record), *lines[1:]]) + "\n")
    for argv in commands(run, mapped[1]):
        proc = tensorjob(*argv, cwd=tmp_path)
        assert_refused(proc, baseline_mib, name)
        assert "line 1" in said(proc)[0] and "is not an item number" in said(proc)[0]


def test_a_jobs_link_out_of_the_folder_is_refused(mapped, baseline_mib, tmp_path):
    run = planted(mapped, tmp_path)
    elsewhere = tmp_path / "elsewhere"
    shutil.move(run / "jobs", elsewhere)
    (run / "jobs").symlink_to(elsewhere)
    for argv in commands(run, mapped[1])[1:]:
        proc = tensorjob(*argv, cwd=tmp_path)
        assert_refused(proc, baseline_mib, "jobs")
        assert "symbolic link" in said(proc)[0]


# --- the property -------------------------------------------------------------------------------------


def mutate(run: Path, name: str, how: str, data: st.DataObject) -> None:
    path = run / name
    regular = path.is_file() and not path.is_symlink()  # what an earlier mutation left: never read a FIFO here
    if how in ("truncate", "value", "huge_sparse") and not regular:
        return
    if how in ("bytes",) and os.path.lexists(path) and not regular:
        path.unlink() if not path.is_dir() or path.is_symlink() else path.rmdir()
    if how == "absent":
        if path.is_dir() and not path.is_symlink():
            path.rmdir()
        elif os.path.lexists(path):
            path.unlink()
    elif how == "fifo":
        if path.is_dir() and not path.is_symlink():
            path.rmdir()
        plant_fifo(run, name)
    elif how == "zero":
        if path.is_dir() and not path.is_symlink():
            path.rmdir()
        path.unlink(missing_ok=True)
        path.symlink_to("/dev/zero")
    elif how == "folder":
        if os.path.lexists(path) and not path.is_dir():
            path.unlink()
        path.mkdir(exist_ok=True)
    elif how == "truncate":
        size = path.stat().st_size
        os.truncate(path, data.draw(st.integers(0, size)))
    elif how == "bytes":
        path.write_bytes(data.draw(st.binary(max_size=300)))
    elif how == "huge_sparse":
        with open(path, "ab") as f:
            f.truncate(1 << 36)
    elif how == "value":
        lines = path.read_text(errors="replace").splitlines() or ["{}"]
        at = data.draw(st.integers(0, len(lines) - 1))
        try:
            obj = json.loads(lines[at])
        except ValueError:
            obj = {}
        if isinstance(obj, dict) and obj:
            key = data.draw(st.sampled_from(sorted(obj)))
            obj[key] = data.draw(st.one_of(st.none(), st.booleans(), st.integers(-2 ** 70, 2 ** 70), st.text(max_size=8),
                                           st.floats(allow_nan=False), st.lists(st.integers(), max_size=3)))
        lines[at] = json.dumps(obj)
        path.write_text("\n".join(lines) + "\n")


def read_back(run: Path) -> None:
    result = MapResult.read(run)
    result.rows()
    result.scores()
    comparison = compare(run, run)
    comparison.summary()


def bounded(fn, seconds: float = 60.0):
    box: list = []

    def call() -> None:
        try:
            box.append(("value", fn()))
        except BaseException as e:  # noqa: BLE001 - handed back
            box.append(("error", e))

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(seconds)
    assert box, "reading the run folder back did not end"
    return box[0]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(data=st.data())
def test_a_mutated_run_folder_reads_back_or_is_refused_in_one_line(mapped, tmp_path_factory, data):
    run = planted(mapped, tmp_path_factory.mktemp("mutated"))
    for _ in range(data.draw(st.integers(1, 3))):
        name = data.draw(st.sampled_from(FOLDER_FILES + ("scoring.json",)))
        how = data.draw(st.sampled_from(("absent", "fifo", "zero", "folder", "truncate", "bytes", "huge_sparse",
                                         "value", "value")))
        mutate(run, name, how, data)
    outcome, value = bounded(lambda: read_back(run))
    if outcome == "error":
        assert isinstance(value, (MapError, ValueError)), repr(value)
        assert str(value) and "\n" not in str(value), repr(value)

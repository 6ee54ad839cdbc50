"""What a map keeps as it grows: its progress as bits (``ItemSet``), a resume that skips exactly the recorded
items whatever the results files hold, results put in item order without being held, ``rows()`` and
``iter_rows()`` read back an item at a time and still right, ``tensorjob runs --table`` whose memory does not
grow with the map, and job ids that never meet within a process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tensorjob_jupyter.fanout.item_set import DENSE_BYTES_PER_ITEM, MIN_DENSE_BYTES, ItemSet
from tensorjob_jupyter.fanout.manifest import item_key, read_manifest
from tensorjob_jupyter.fanout.map_folder import MapFolder, put_in_item_order
from tensorjob_jupyter.fanout.progress import NOT_RUN, MapResult, flattened
from tensorjob_jupyter.fanout.run import MapRun
from tensorjob_jupyter.host.grounding import sources_label
from tensorjob_jupyter.record import job_folder

ROOT = Path(__file__).resolve().parents[2]
GUEST_SHA256 = "0" * 64

items_numbers = st.one_of(st.integers(0, 5000), st.integers(0, 2 ** 53))


@given(st.lists(items_numbers, max_size=200))
def test_an_item_set_is_a_set_of_its_items_in_bounded_bytes(added):
    items = ItemSet()
    for item in added:
        items.add(item)
    assert len(items) == len(set(added))
    assert list(items) == sorted(set(added))
    assert all(item in items for item in added) and items == set(added)
    assert all(item not in items for item in (-1, 5001, 2 ** 53 + 1, "0", None) if item not in added)
    assert len(items._bits) <= max(MIN_DENSE_BYTES, DENSE_BYTES_PER_ITEM * len(items))  # a far number costs no bits


def test_an_item_set_of_a_large_map_is_a_bit_an_item():
    items = ItemSet(range(800_000))
    assert len(items) == 800_000 and len(items._bits) == 100_000 and not items._sparse


# --- resume: the recorded items, and only they, are skipped -----------------------------------------------


def _record_lines(records: list[dict], torn: bytes) -> bytes:
    return b"".join(orjson.dumps(r) + b"\n" for r in records) + torn


recorded = st.lists(st.integers(0, 29), unique=True, max_size=30)
torn_tail = st.sampled_from([b"", b'{"item": 3, "res', b"{"])


@given(n=st.integers(1, 30), done=recorded, failed=recorded, done_torn=torn_tail, failed_torn=torn_tail,
       retry_failed=st.booleans())
def test_a_resume_skips_exactly_the_recorded_items(n, done, failed, done_torn, failed_torn, retry_failed):
    done, failed = [i for i in done if i < n], [i for i in failed if i < n]
    with tempfile.TemporaryDirectory() as tmp:
        manifest = read_manifest([{"n": i} for i in range(n)])
        run = Path(tmp) / "run"
        first = MapFolder(run)
        first.open(manifest, GUEST_SHA256, retry_failed=False, where="local")
        first.close()
        results = _record_lines([{"item": i, "key": str(i), "result": i} for i in done], done_torn)
        failures = _record_lines([{"item": i, "key": str(i), "error": {"code": "x", "message": "y"}}
                                  for i in failed], failed_torn)
        (run / "results.jsonl").write_bytes(results)
        (run / "failures.jsonl").write_bytes(failures)
        folder = MapFolder(run)
        folder.open(manifest, GUEST_SHA256, retry_failed=retry_failed, where="local")
        try:
            still_failed = set() if retry_failed else set(failed) - set(done)
            assert folder.completed == set(done) and folder.failed == still_failed
            assert (run / "results.jsonl").read_bytes() == results[:len(results) - len(done_torn)]  # torn line cut
            todo = list(MapRun(folder, manifest, executor=object()).todo())
            assert [index for index, _ in todo] == [i for i in range(n) if i not in set(done) | still_failed]
            assert all(item.value() == {"n": index} for index, item in todo)
        finally:
            folder.close()


@given(st.lists(st.integers(0, 50), max_size=60), torn_tail, st.integers(0, 60))
def test_results_are_put_in_item_order_line_for_line(order, torn, known):
    """Whatever the order, and whatever part of the file the map knew to be in order when it began (``known``
    records, when they are: only the rest is then read)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "results.jsonl"
        records = [{"item": item, "key": str(item), "result": [k, "x" * (k % 7)]} for k, item in enumerate(order)]
        path.write_bytes(_record_lines(records, torn))
        before = os.stat(path)
        head = order[:known]
        if head == sorted(head) and head:
            put_in_item_order(path, in_order_until=len(_record_lines(records[:known], b"")), last=max(head))
        else:
            put_in_item_order(path)
        lines = path.read_bytes().splitlines(keepends=True)
        if order == sorted(order):  # already in order: the file is left as it is
            assert os.stat(path).st_ino == before.st_ino and path.read_bytes() == _record_lines(records, torn)
        else:
            assert lines == [orjson.dumps(r) + b"\n" for r in sorted(records, key=lambda r: r["item"])]  # stable


# --- rows(): each item's records read back one at a time, the same rows ------------------------------------

whole = st.integers(-(2 ** 53), 2 ** 53)  # what a JSON number holds exactly
results_values = st.one_of(st.none(), whole, st.text(max_size=8),
                           st.dictionaries(st.sampled_from(["a", "b", "c.d"]), whole, max_size=3))
sources_values = st.one_of(st.none(), st.just({"a": []}), st.just({"a": [{"file": "f.txt", "start": 0, "end": 3, "match": "exact", "score": 1.0}], "b": []}),
                           st.just("not sources"))
confidence_values = st.one_of(st.none(), st.dictionaries(st.sampled_from(["a", "b"]),
                                                         st.one_of(st.floats(0, 1), st.just(2), st.text(max_size=2)),
                                                         max_size=2))


@st.composite
def folders(draw):
    n = draw(st.integers(1, 12))
    outcome = draw(st.lists(st.sampled_from(["done", "failed", "both", "none"]), min_size=n, max_size=n))
    results, failures = [], []
    for i, kind in enumerate(outcome):
        key = draw(st.one_of(st.none(), st.text(max_size=5)))
        if kind in ("done", "both"):
            record = {"item": i, "result": draw(results_values)}
            for name, values in (("sources", sources_values), ("confidence", confidence_values)):
                value = draw(values)
                if value is not None:
                    record[name] = value
            results.append({**record, **({"key": key} if key is not None else {})})
        if kind in ("failed", "both"):
            failures.append({"item": i, "error": {"code": draw(st.sampled_from(["x", "y"])), "message": "m"},
                             **({"key": key + "!"} if key is not None else {})})
    inputs = draw(st.lists(st.one_of(whole, st.dictionaries(st.sampled_from(["id", "q"]), whole,
                                                                    max_size=2)), min_size=n, max_size=n))
    return (inputs, draw(st.permutations(results)), draw(st.permutations(failures)), draw(st.booleans()))


def expected_rows(result: MapResult, inputs_at_hand: bool) -> list[dict]:
    """rows() as the whole files read at once make them (the public dict readers), the model rows are held to."""
    results, failures, sources, confidences = (result.results(), result.failures(), result.sources(),
                                               result.confidences())
    inputs = [flattened("input", v) for v in result.inputs] if inputs_at_hand else [{}] * result.total
    input_keys = dict.fromkeys(k for flat in inputs for k in flat)
    output_keys = dict.fromkeys(k for r in results.values() for k in flattened("result", r))
    source_fields = dict.fromkeys(name for found in sources.values() for name in found)
    confidence_keys = dict.fromkeys(f"confidence.{p}" for c in confidences.values() for p in c)
    keys = [str(i) for i in range(result.total)]
    for path in (result.failures_path, result.results_path):
        for line in path.read_bytes().splitlines():
            record = json.loads(line)
            if isinstance(record.get("key"), str):
                keys[record["item"]] = record["key"]
    rows = []
    for i in range(result.total):
        error = (failures.get(i) if i not in results else None) or {}
        output = flattened("result", results[i]) if i in results else {}
        row = {"item": i, "key": item_key(result.inputs[i], i) if inputs_at_hand else keys[i],
               **{k: inputs[i].get(k) for k in input_keys},
               "status": "completed" if i in results else "failed" if i in failures else NOT_RUN,
               "error_code": error.get("code"), "error_message": error.get("message"),
               **{k: output.get(k) for k in output_keys}}
        if confidence_keys:
            row.update({k: confidences.get(i, {}).get(k[len("confidence."):]) for k in confidence_keys})
        found = sources.get(i, {})
        row.update({f"source.{name}": sources_label(found.get(name)) for name in source_fields})
        row.update({f"grounded.{name}": None if found.get(name) is None else bool(found[name])
                    for name in source_fields})
        rows.append(row)
    return rows


@given(folders())
def test_rows_read_an_item_at_a_time_are_the_rows_of_the_whole_files(folder):
    inputs, results, failures, manifest_at_hand = folder
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "manifest.jsonl"
        source.write_text("".join(json.dumps(v) + "\n" for v in inputs))
        run = Path(tmp) / "run"
        opened = MapFolder(run)
        opened.open(read_manifest(source), GUEST_SHA256, retry_failed=False, where="local")
        opened.close()
        (run / "results.jsonl").write_bytes(_record_lines(results, b""))
        (run / "failures.jsonl").write_bytes(_record_lines(failures, b""))
        if not manifest_at_hand:
            source.unlink()  # then keys come from the records
        result = MapResult.read(run)
        rows = result.rows()
        assert rows == expected_rows(result, manifest_at_hand)
        assert list(result.iter_rows()) == rows
        assert result.item_keys() == [row["key"] for row in rows]


def test_an_item_recorded_twice_is_its_last_record(tmp_path):
    """A map never records an item twice; an edited file that does is read as results() reads it: the item's
    last record, its columns in the order the items first appear."""
    source = tmp_path / "manifest.jsonl"
    source.write_text('{"n": 0}\n{"n": 1}\n')
    run = tmp_path / "run"
    folder = MapFolder(run)
    folder.open(read_manifest(source), GUEST_SHA256, retry_failed=False, where="local")
    folder.close()
    records = [{"item": 0, "result": {"a": 1}}, {"item": 1, "result": 2}, {"item": 0, "result": {"b": 3}}]
    (run / "results.jsonl").write_bytes(_record_lines(records, b""))
    rows = MapResult.read(run).rows()
    assert [{k: v for k, v in row.items() if k.startswith("result")} for row in rows] == [
        {"result.b": 3, "result": None}, {"result.b": None, "result": 2}]
    assert list(rows[0]).index("result.b") < list(rows[0]).index("result")


def test_rows_under_way_read_the_results_file_they_began_with(tmp_path):
    """A map that ends puts its results file in item order (a new file, renamed over the old): rows being
    read meanwhile are still those of the file they began with."""
    source = tmp_path / "manifest.jsonl"
    source.write_text("".join(json.dumps({"n": i}) + "\n" for i in range(5)))
    run = tmp_path / "run"
    folder = MapFolder(run)
    folder.open(read_manifest(source), GUEST_SHA256, retry_failed=False, where="local")
    folder.close()
    (run / "results.jsonl").write_bytes(_record_lines([{"item": i, "result": i} for i in (4, 2, 0, 1, 3)], b""))
    rows = MapResult.read(run).iter_rows()
    first = next(rows)
    tmp = run / "results.jsonl.new"
    tmp.write_bytes(_record_lines([{"item": i, "result": -1} for i in range(5)], b""))
    os.replace(tmp, run / "results.jsonl")
    assert [first["result"]] + [row["result"] for row in rows] == [0, 1, 2, 3, 4]


# --- tensorjob runs --table: memory that does not grow with the map ----------------------------------------

PEAK_RSS = ("import os, resource, sys\n"
            "from tensorjob_jupyter.frontends.cli import main\n"
            "start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
            "sys.stdout = open(os.devnull, 'w')\n"
            "code = main(sys.argv[1:])\n"
            "sys.stderr.write(f'GREW_KIB {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - start}\\n')\n"
            "sys.exit(code)\n")


def _finished_map(where: Path, n: int) -> Path:
    """A map's run folder of ``n`` completed items, written as a map leaves it (its ledger by ``MapFolder``)."""
    where.mkdir()
    source = where / "manifest.jsonl"
    source.write_text("".join(json.dumps({"id": f"doc-{i}", "text": "x" * 20}) + "\n" for i in range(n)))
    run = where / "run"
    folder = MapFolder(run)
    folder.open(read_manifest(source), GUEST_SHA256, retry_failed=False, where="local")
    folder.close()
    (run / "results.jsonl").write_bytes(_record_lines(
        [{"item": i, "key": f"doc-{i}", "result": {"summary": f"item {i} " * 4, "score": i}} for i in range(n)], b""))
    return run


def _table_growth_mib(run: Path, *flags: str) -> float:
    proc = subprocess.run([sys.executable, "-c", PEAK_RSS, "runs", "--table", str(run), *flags],
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=600,
                          cwd=run.parent)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return int([x for x in proc.stderr.splitlines() if x.startswith("GREW_KIB ")][-1].split()[1]) / 1024


@pytest.mark.slow  # six CLIs in subprocesses over a 40,000-item map: in the full suite, not the fast loop
def test_a_table_of_every_item_takes_memory_that_does_not_grow_with_the_map(tmp_path):
    small, large = _finished_map(tmp_path / "small", 2_000), _finished_map(tmp_path / "large", 40_000)
    for flags in ((), ("--csv",), ("--json",)):
        grew = _table_growth_mib(large, *flags) - _table_growth_mib(small, *flags)
        assert grew < 12, (flags, grew)  # every row held, as a list, was over 40 MiB more for 38,000 more items


def test_a_table_streams_the_same_lines_rows_make(tmp_path):
    from tensorjob_jupyter.frontends.table import map_table

    run = _finished_map(tmp_path / "map", 40)
    proc = subprocess.run([sys.executable, "-m", "tensorjob_jupyter.frontends.cli", "runs", "--table", str(run)],
                          env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "100"}, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    rows = MapResult.read(run).rows()
    assert proc.stdout == map_table(rows, width=100, max_rows=len(rows)) + "\n"


# --- job ids ------------------------------------------------------------------------------------------------


def test_job_ids_of_one_second_never_meet_when_their_random_digits_do(monkeypatch):
    drawn = iter(["aaaaaa", "aaaaaa", "bbbbbb", "aaaaaa", "bbbbbb", "cccccc"])
    monkeypatch.setattr(job_folder.secrets, "token_hex", lambda n: next(drawn))
    monkeypatch.setattr(job_folder.time, "strftime", lambda fmt: "20260101T000000")
    ids = [job_folder.new_job_id() for _ in range(3)]
    assert ids == ["20260101T000000-aaaaaa", "20260101T000000-bbbbbb", "20260101T000000-cccccc"]

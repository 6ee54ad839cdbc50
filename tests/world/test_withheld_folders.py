"""A folder withheld from a job's read grants (``world.grants.Withheld``): a map's run folder under ``--read .``.

Nothing beneath the folder opens, however the guest spells the path -- as given, absolute, through ``..``,
through a symlink to the folder or to a file in it, through another spelling of the granted root -- and the
answer is ``capability_denied`` naming the folder, never ``not_found``. The map's own use is tested from
outside in tests/fanout/test_run_folder_withheld.py.
"""

import os
import pickle

import pytest

from tensorjob_jupyter.abi import codes
from tensorjob_jupyter.world.grants import AccessError, Grants, Withheld

WHAT = "the map's run folder"


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "work"
    run = root / "runs" / "x"
    (run / "jobs" / "j1").mkdir(parents=True)
    (root / "doc.txt").write_text("the document\n")
    (run / "expected.jsonl").write_text('{"item":0,"expected":"the answer"}\n')
    (run / "jobs" / "j1" / "events.jsonl").write_text("{}\n")
    os.symlink("runs/x", root / "to_run")                      # a link to the folder
    os.symlink("runs/x/expected.jsonl", root / "to_answers")   # a link to a file in it
    os.symlink(str(run), root / "abs_to_run")                  # an absolute link
    os.symlink(str(root), tmp_path / "alias")                  # another spelling of the granted root
    return root, run


def denied(grants, path):
    with pytest.raises(AccessError) as e:
        os.close(grants.open_checked(path)[0])
    return e.value


@pytest.mark.parametrize("path", [
    "runs/x/expected.jsonl", "./runs/x/expected.jsonl", "runs/y/../x/expected.jsonl", "runs//x/expected.jsonl",
    "to_run/expected.jsonl", "to_answers", "abs_to_run/expected.jsonl", "runs/x/jobs/j1/events.jsonl",
    "runs/x/missing.jsonl", "runs/x",
])
def test_nothing_in_a_withheld_folder_opens_however_it_is_spelled(tree, path):
    root, run = tree
    grants = Grants.for_paths(["."], root, withheld=[Withheld(str(run), WHAT)])
    e = denied(grants, path)
    assert e.code == codes.CAPABILITY_DENIED, (path, e.message)
    assert f"it is in {WHAT} {run}" in e.message and "\n" not in e.message, e.message
    fd, opened = grants.open_checked("doc.txt")  # the rest of the grant stays granted
    os.close(fd)
    assert opened == root / "doc.txt"


def test_an_absolute_path_and_another_spelling_of_the_root_are_withheld_too(tree):
    root, run = tree
    alias = root.parent / "alias"
    grants = Grants.for_paths([root, alias], root, withheld=[Withheld(str(run), WHAT)])
    for path in (str(run / "expected.jsonl"), str(alias / "runs" / "x" / "expected.jsonl")):
        assert WHAT in denied(grants, path).message, path
    os.close(grants.open_checked(str(alias / "doc.txt"))[0])


def test_a_grant_inside_the_withheld_folder_grants_nothing_there(tree):
    root, run = tree
    for grant in (run / "jobs", run / "expected.jsonl"):
        grants = Grants.for_paths([grant], root, withheld=[Withheld(str(run), WHAT)])
        target = grant / "j1" / "events.jsonl" if grant.is_dir() else grant
        assert WHAT in denied(grants, str(target)).message, grant


def test_a_withheld_entry_among_the_paths_is_what_a_map_s_job_carries(tree):
    """``item_spec`` puts its ``Withheld`` folders in the job's ``read``: they withhold, never grant, and the
    grants travel to a Dask worker whole."""
    root, run = tree
    grants = Grants.for_paths([str(root), Withheld(str(run), WHAT)], root)
    assert grants.roots == (root,)
    again = pickle.loads(pickle.dumps(grants))
    assert WHAT in denied(again, "to_run/expected.jsonl").message
    with pytest.raises(ValueError):
        Withheld("a\0b")


def test_a_folder_withheld_before_it_exists_is_withheld_once_it_does(tree):
    root, _run = tree
    later = root / "runs" / "later"
    grants = Grants.for_paths(["."], root, withheld=[Withheld("runs/later", WHAT)])  # relative to the job's cwd
    later.mkdir()
    (later / "results.jsonl").write_text("{}\n")
    os.symlink("runs/later", root / "to_later")
    for path in ("runs/later/results.jsonl", "to_later/results.jsonl"):
        assert WHAT in denied(grants, path).message, path


def test_without_withheld_folders_the_grant_covers_the_folder(tree):
    """What a map's job had before: the run folder under ``--read .`` was the guest's to read."""
    root, run = tree
    fd, opened = Grants.for_paths(["."], root).open_checked("to_run/expected.jsonl")
    os.close(fd)
    assert opened == run / "expected.jsonl"


def test_a_single_job_cannot_read_earlier_transcripts_through_a_grant_above_the_runs_folder(tmp_path):
    import tensorjob_jupyter as tj
    import wat
    from tensorjob_jupyter.abi import codes

    runs = tmp_path / "runs"
    first = tj.Job(wat.script_guest([{"cmd": "done", "result": "the answer"}]), runs_dir=runs).start()
    first.wait(30)
    peek = [{"cmd": "open", "path": str(first.transcript_path)}, {"cmd": "done", "result": "read it"}]
    second = tj.Job(wat.script_guest(peek), read=[tmp_path], runs_dir=runs).start()
    second.wait(30)
    assert second.envelope.error.code == codes.CAPABILITY_DENIED and "the runs folder" in second.envelope.error.message
    # granted itself, the runs folder is readable: that is what was asked
    third = tj.Job(wat.script_guest(peek), read=[runs], runs_dir=runs).start()
    third.wait(30)
    assert third.envelope.ok and third.result == "read it"

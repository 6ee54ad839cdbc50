"""History, show, replay and diff: transcripts read back, with no model.

Runs are recorded with ``ScriptedBackend`` (or none) and WAT or C guests,
then listed, shown, replayed and compared -- in process, through the
``tensorjob`` command as a subprocess, and through the magics in an IPython
shell. The transcripts of cancelled, torn, envelope-less and
unknown-version runs are made by hand from real ones.
"""

from __future__ import annotations

import fcntl
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

import tensorjob_jupyter as tj
from tensorjob_jupyter import abi
from tensorjob_jupyter.frontends.cli import main
from tensorjob_jupyter.history.diff import diff_runs
from tensorjob_jupyter.host import tokens
from tensorjob_jupyter.record.events import TRANSCRIPT_VERSION
from tensorjob_jupyter.history.runs import RunError, list_runs, prune, resolve_run
from tensorjob_jupyter.inference.base import QueueFull, Sampler
from tensorjob_jupyter.inference.scripted import ScriptedBackend
from tensorjob_jupyter.history.replay import ReplayJob, replay
from tensorjob_jupyter.history.replay_setup import ReplayError
from tensorjob_jupyter.history.show import Playback
from tensorjob_jupyter.record.transcript import EventReader
from tensorjob_jupyter.record.recording import COMMANDS, Recording
from tensorjob_jupyter.record.event_checks import TranscriptError
from tensorjob_jupyter.frontends.view import render
from tensorjob_jupyter.frontends.view.state import ViewState

import wat

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "guests" / "examples"
WORDS = "one two three four five six seven eight nine ten"


def runs_dir() -> Path:
    return Path(os.environ["TENSORJOB_RUNS"])


def record(guest, *, backend=None, **kwargs) -> tj.Job:
    job = tj.Job(guest, backend=backend, **kwargs).start()
    job.wait(60)
    return job


def run_cli(*argv):
    out, err = io.StringIO(), io.StringIO()
    code = main([str(a) for a in argv], out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def infer_script(prompts, *, then=None, stop_after_tokens=None, max_tokens=20):
    commands = [{"cmd": "infer", "prompt": p, "max_tokens": max_tokens} for p in prompts]
    return wat.script_guest(commands + [then or {"cmd": "done", "result": {"n": len(prompts)}}],
                            stop_after_tokens=stop_after_tokens)


@pytest.fixture
def text_file(tmp_path):
    p = tmp_path / "data" / "doc.txt"
    p.parent.mkdir()
    p.write_text("".join(f"section{i} " + "text " * 150 for i in range(3)))
    return p


# --- the format ---------------------------------------------------------------------------------------


def test_the_transcript_records_what_replay_needs(tmp_path):
    guest = wat.script_guest([{"cmd": "emit", "progress": {"done": 1, "total": 2}},
                              {"cmd": "infer", "prompt": "say it", "max_tokens": 4},
                              {"cmd": "embed", "texts": ["a", "b"]},
                              {"cmd": "done", "result": "ok"}], stop_after_tokens=2)
    job = record(guest, backend=ScriptedBackend(WORDS))
    events = job.events
    created = events[0]
    assert created["transcript_version"] == TRANSCRIPT_VERSION == 1
    assert isinstance(created["created_at"], float) and abs(created["created_at"] - time.time()) < 60
    assert created["cwd"] == os.getcwd() and created["read"] == []
    times = [e["t_ms"] for e in events]
    assert all(isinstance(t, int) for t in times) and times == sorted(times) and 0 <= times[0] < 1000
    started = next(e for e in events if e["type"] == "response.created")
    assert started["command"] == {"cmd": "infer", "prompt": "say it", "max_tokens": 4, "images": []}
    assert started["response"]["object"] == "response"  # the Open Responses fields are intact
    end = next(e for e in events if e["type"] == "response.completed")
    assert end["guest_stopped_after"] == 2 and end["finish_reason"] == "guest_stop"
    embedded = next(e for e in events if e["type"] == "job.embedded")
    assert len(embedded["vectors"]) == 2 and len(embedded["text_sha256"]) == 2
    assert events[-1]["type"] == "job.completed" and events[-1]["ended_during"] == "done"


def test_ended_during_names_the_command_the_job_ended_on(tmp_path):
    job = record(wat.script_guest([{"cmd": "open", "path": str(tmp_path / "missing.txt")}]), read=[tmp_path])
    assert job.events[-1]["ended_during"] == "open"
    job = record(wat.spin_in_step(), call_timeout_s=0.2)
    assert job.events[-1]["ended_during"] is None


def test_every_command_maps_back_from_its_events(tmp_path, text_file):
    guest = wat.script_guest([{"cmd": "open", "path": str(text_file)},
                              {"cmd": "slice", "handle": 0, "offset": 0, "len": 100},
                              {"cmd": "slice_bytes", "handle": 0, "offset": 100, "len": 50},
                              {"cmd": "emit", "progress": None},
                              {"cmd": "infer", "prompt": "p", "max_tokens": 3},
                              {"cmd": "embed", "texts": ["x"]},
                              {"cmd": "done", "result": 1}])
    job = record(guest, backend=ScriptedBackend(WORDS), read=[text_file.parent])
    recording = Recording.read(job.run_dir)
    assert [s.command["cmd"] for s in recording.steps] == ["open", "slice", "slice_bytes", "emit", "infer", "embed"]
    assert recording.steps[1].command == {"cmd": "slice", "handle": 0, "offset": 0, "len": 100}
    assert recording.steps[4].infer.pieces == ["one", " two", " three"]
    assert recording.steps[4].infer.reason == "length"
    assert recording.end.status == "completed" and recording.end.ended_during == "done"
    assert set(COMMANDS) == {c.cmd for c in vars(abi).values() if isinstance(c, type) and hasattr(c, "cmd")
                             and hasattr(c, "to_json")}


# --- replay ---------------------------------------------------------------------------------------------


def test_a_replay_gives_the_same_result_with_no_model(text_file):
    backend = ScriptedBackend(lambda p: "saw " + p.split("<document>\n", 1)[1].split()[0] + " and more")
    job = record(EXAMPLES / "summarise.c", backend=backend, input={"path": str(text_file), "window": 1000},
                 read=[text_file.parent])
    assert job.envelope.ok
    asked = len(backend.scripted.prompts)
    report = replay(EXAMPLES / "summarise.c", job.id, read=[text_file.parent])  # a replay takes no recorded grant
    assert report.same_result and report.divergence is None and not report.guest_changed
    assert report.result == job.result
    assert report.envelope.usage.tokens_in == job.envelope.usage.tokens_in
    assert report.envelope.usage.tokens_out == job.envelope.usage.tokens_out
    assert report.envelope.usage.model == "scripted"
    assert len(backend.scripted.prompts) == asked  # the model was not asked again
    created = report.job.events[0]
    assert created["replay_of"]["run"] == job.id and created["replay_of"]["live"] is False
    deltas = lambda j: [e["delta"] for e in j.events if e["type"] == "response.output_text.delta"]  # noqa: E731
    assert deltas(report.job) == deltas(job)


def test_a_changed_guest_diverges_at_the_first_other_prompt():
    job = record(infer_script(["first", "second"]), backend=ScriptedBackend(WORDS))
    report = replay(infer_script(["first", "second, changed"]), job.id)
    assert report.guest_changed and report.stopped
    assert report.envelope.error.code == "replay_divergence"
    d = report.divergence
    assert (d.step, d.kind) == (2, "command") and d.why.startswith("another prompt (they differ from character 6)")
    assert '"second"' in d.recorded and '"second, changed"' in d.asked
    assert report.envelope.error.message == d.message()
    diverged = [e for e in report.job.events if e["type"] == "job.replay.diverged"]
    assert len(diverged) == 1 and diverged[0]["then"] == "stopped" and diverged[0]["step"] == 2
    # The first infer was answered from the recording before the divergence.
    assert report.envelope.usage.tokens_out == 10


def test_another_command_another_window_and_past_the_end(text_file):
    open_slice = [{"cmd": "open", "path": str(text_file)}, {"cmd": "slice", "handle": 0, "offset": 0, "len": 64}]
    job = record(wat.script_guest(open_slice + [{"cmd": "done", "result": 0}]), read=[text_file.parent])
    other_window = wat.script_guest(open_slice[:1] + [{"cmd": "slice", "handle": 0, "offset": 0, "len": 65},
                                                      {"cmd": "done", "result": 0}])
    d = replay(other_window, job.id, read=[text_file.parent]).divergence
    assert (d.step, d.why) == (2, "another window")
    assert d.recorded == "slice #0 from byte 0 (64 bytes)" and d.asked == "slice #0 from byte 0 (65 bytes)"
    other_command = wat.script_guest(open_slice[:1] + [{"cmd": "emit", "progress": 1}, {"cmd": "done", "result": 0}])
    assert replay(other_command, job.id, read=[text_file.parent]).divergence.why == "another command"
    longer = wat.script_guest(open_slice + [{"cmd": "emit", "progress": 1}, {"cmd": "done", "result": 0}])
    d = replay(longer, job.id, read=[text_file.parent]).divergence
    assert (d.step, d.why, d.recorded) == (3, "another command", "done (the run completed)")


def test_a_guest_that_finishes_early_keeps_its_result_and_notes_the_divergence():
    job = record(infer_script(["a", "b"]), backend=ScriptedBackend(WORDS))
    report = replay(infer_script(["a"], then={"cmd": "done", "result": "early"}), job.id)
    assert report.envelope.ok and report.result == "early" and not report.stopped
    assert not report.same_result
    assert (report.divergence.step, report.divergence.why, report.divergence.asked) == (2, "the guest finished", "done")


def test_live_falls_back_to_the_model_from_the_divergence():
    job = record(infer_script(["a", "b"]), backend=ScriptedBackend(WORDS))
    live_model = ScriptedBackend("live words here")
    report = replay(infer_script(["a", "c"], then={"cmd": "done", "result": "x"}), job.id, live=True,
                    backend=live_model)
    assert report.envelope.ok and report.live_from == 2 and not report.stopped
    assert live_model.scripted.prompts == ["c"]  # only what the recording could not answer
    texts = [e["response"]["output_text"] for e in report.job.events if e["type"] == "response.completed"]
    assert texts == [WORDS, "live words here"]
    assert [e["then"] for e in report.job.events if e["type"] == "job.replay.diverged"] == ["live"]


def test_the_recorded_stop_gives_the_recorded_text_and_an_earlier_stop_cuts_it(monkeypatch):
    monkeypatch.setattr(tokens, "LOOKAHEAD_WAIT_S", 30.0)  # at most one piece past the stop is recorded
    job = record(EXAMPLES / "stop_early.c", backend=ScriptedBackend(WORDS), input={"stop_after": 4, "stop_at": ""})
    same = replay(EXAMPLES / "stop_early.c", job.id)
    assert same.same_result and same.result == job.result
    sooner = replay(EXAMPLES / "stop_early.c", job.id, input={"stop_after": 2, "stop_at": ""})
    assert sooner.divergence is None and sooner.envelope.ok
    assert sooner.result["streamed"] == "one two" and sooner.result["text"] == "one two"
    assert sooner.result["tokens_out"] == 2


def test_a_guest_that_wants_more_than_was_recorded_diverges_or_goes_live(monkeypatch):
    # The decoder runs at most a token ahead of the guest unless the guest takes longer than the lookahead
    # wait; on a loaded machine it might, and the recording would hold more than one piece past the stop.
    monkeypatch.setattr(tokens, "LOOKAHEAD_WAIT_S", 30.0)
    job = record(EXAMPLES / "stop_early.c", backend=ScriptedBackend(WORDS), input={"stop_after": 3, "stop_at": ""})
    later = {"stop_after": 6, "stop_at": ""}
    report = replay(EXAMPLES / "stop_early.c", job.id, input=later)
    assert report.stopped and report.divergence.why == "more tokens than were recorded"
    failed = [e for e in report.job.events if e["type"] == "response.failed"]
    error = next(e for e in report.job.events if e["type"] == "error")
    assert failed and error["code"] == "replay_divergence"  # response.failed itself says server_error
    live = replay(EXAMPLES / "stop_early.c", job.id, input=later, live=True, backend=ScriptedBackend(WORDS))
    assert live.envelope.ok and live.live_from == 1
    assert live.result["streamed"] == "one two three four five six"  # the model's pieces after the recorded ones


def test_sampling_and_token_limits_must_match_the_recording():
    job = record(infer_script(["a"], max_tokens=5), backend=ScriptedBackend(WORDS))
    hotter = replay(infer_script(["a"], max_tokens=5), job.id, 
                    infer=tj.InferOptions(sampler=Sampler(temperature=0.7)))
    assert hotter.divergence.why == "other sampling settings"
    more = replay(infer_script(["a"], max_tokens=6), job.id)
    assert more.divergence.why == "another token limit"
    # An answer the model ended itself is the answer under any larger limit.
    short = record(infer_script(["a"], max_tokens=50), backend=ScriptedBackend("just three words"))
    assert replay(infer_script(["a"], max_tokens=80), short.id).same_result
    assert replay(infer_script(["a"], max_tokens=2), short.id).divergence.why == "another token limit"


def test_a_file_that_changed_since_the_run_is_a_divergence(text_file):
    guest = wat.script_guest([{"cmd": "open", "path": str(text_file)},
                              {"cmd": "slice", "handle": 0, "offset": 0, "len": 64}, {"cmd": "done", "result": 0}])
    job = record(guest, read=[text_file.parent])
    granted = [text_file.parent]  # given again: a replay takes no recorded grant
    assert replay(guest, job.id, read=granted).same_result
    text_file.write_text("something else entirely " * 100)
    d = replay(guest, job.id, read=granted).divergence
    assert (d.step, d.why, d.kind) == (1, "the world changed", "answer") and "len" in d.asked
    text_file.unlink()
    d = replay(guest, job.id, read=granted).divergence
    assert d.step == 1 and d.asked.startswith("not_found")


def test_an_embed_is_answered_with_the_recorded_vectors():
    guest = wat.script_guest([{"cmd": "embed", "texts": ["alpha", "beta"]}, {"cmd": "done", "result": 0}])
    job = record(guest, backend=ScriptedBackend(WORDS))
    report = replay(guest, job.id)
    recorded = next(e for e in job.events if e["type"] == "job.embedded")["vectors"]
    assert next(e for e in report.job.events if e["type"] == "job.embedded")["vectors"] == recorded
    other = wat.script_guest([{"cmd": "embed", "texts": ["alpha", "gamma"]}, {"cmd": "done", "result": 0}])
    assert replay(other, job.id).divergence.why == "other texts"


def test_staged_input_bytes_must_be_given_again_and_match():
    job = record(EXAMPLES / "stream.c", input={"lines": 3}, input_bytes=b"staged\n")
    with pytest.raises(ReplayError, match="staged 7 bytes for read-input"):
        ReplayJob(EXAMPLES / "stream.c", job.id)
    with pytest.raises(ReplayError, match="not the ones the run staged"):
        ReplayJob(EXAMPLES / "stream.c", job.id, input_bytes=b"other\n")
    assert replay(EXAMPLES / "stream.c", job.id, input_bytes=b"staged\n").same_result


def test_a_recorded_input_past_the_replay_s_value_limit_is_one_line_not_a_traceback(tmp_path):
    guest = wat.script_guest([{"cmd": "done", "result": 0}])
    job = record(guest, input={"items": list(range(40))})
    code, _, err = run_cli("replay", _wasm(tmp_path, guest), "--from", job.id, "--max-command-values", "10")
    assert code == 2 and "more than the 10 allowed" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err


def test_grants_that_do_not_exist_here_must_be_given_again(tmp_path, text_file):
    guest = wat.script_guest([{"cmd": "open", "path": str(text_file)}, {"cmd": "done", "result": 0}])
    job = record(guest, read=[text_file.parent])
    moved = tmp_path / "moved"
    text_file.parent.rename(moved)
    with pytest.raises(ReplayError, match="does not exist here.*--read"):  # asked for, the recorded ones must exist
        ReplayJob(guest, job.id, recorded_grants=True)
    code, _, err = run_cli("replay", _wasm(tmp_path, guest), "--from", job.id)  # none taken: it says which it needs
    assert code == 1 and f"capability_denied: replay: step 1 opens {text_file}" in err
    assert f"give --read {text_file} to let it" in err
    moved.rename(text_file.parent)
    code, out, _ = run_cli("replay", _wasm(tmp_path, guest), "--from", job.id, "--read", text_file.parent)
    assert code == 0 and json.loads(out) == 0


def _wasm(tmp_path: Path, guest: bytes) -> Path:
    p = tmp_path / f"g{abs(hash(guest))}.wasm"
    p.write_bytes(guest)
    return p


# --- cancelled, torn, envelope-less, unknown-version transcripts ----------------------------------------


def test_a_cancelled_run_replays_as_cancelled_at_the_same_token():
    backend = ScriptedBackend(" ".join(f"w{i}" for i in range(200)), token_delay_s=0.01)
    guest = infer_script(["go"], max_tokens=200)
    job = tj.Job(guest, backend=backend).start()
    deadline = time.monotonic() + 10
    while sum(e["type"] == "response.output_text.delta" for e in job.events) < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    job.cancel()
    env = job.wait(10)
    assert env.status == tj.JobStatus.CANCELLED
    report = replay(guest, job.id)
    assert report.status == "cancelled" and report.same_result and report.reproduced_end
    assert report.envelope.error.message.endswith("(as recorded)")
    delivered = lambda j: sum(e["type"] == "response.output_text.delta" for e in j.events)  # noqa: E731
    assert delivered(report.job) == delivered(job)
    assert report.envelope.usage.tokens_out == env.usage.tokens_out
    code, _, err = run_cli("replay", _wasm(Path(job.run_dir).parent, guest), "--from", job.id)
    assert code == 130 and "the same result" in err


def test_a_run_cancelled_inside_the_guest_replays_as_cancelled_where_the_recording_stops():
    job = tj.Job(wat.spin_in_init(), backend=None).start()
    time.sleep(0.2)
    job.cancel()
    assert job.wait(10).status == tj.JobStatus.CANCELLED
    assert job.events[-1]["ended_during"] is None
    # A changed guest that does return a command where the recorded one was cancelled:
    report = replay(wat.script_guest([{"cmd": "emit", "progress": 1}, {"cmd": "done", "result": 1}]), job.id)
    assert report.status == "cancelled" and report.reproduced_end and report.same_result


def _torn(run_dir: Path, *, drop_envelope: bool, keep: int | None = None) -> None:
    lines = (run_dir / "events.jsonl").read_bytes().splitlines(keepends=True)
    lines = lines[:keep] if keep is not None else lines[:-1]
    (run_dir / "events.jsonl").write_bytes(b"".join(lines) + b'{"type":"response.output_text.de')
    if drop_envelope:
        (run_dir / "envelope.json").unlink()


def test_a_torn_transcript_without_its_envelope_is_shown_listed_and_replayed_to_its_end():
    guest = infer_script(["a", "b"])
    job = record(guest, backend=ScriptedBackend(WORDS))
    run_dir = Path(job.run_dir)
    keep = next(i for i, e in enumerate(job.events) if e["type"] == "response.created" and e["infer_index"] == 1)
    _torn(run_dir, drop_envelope=True, keep=keep)
    reader = EventReader(run_dir)
    assert len(list(reader)) == keep and reader.torn and reader.terminal is None
    recording = Recording.read(run_dir)
    assert recording.torn and recording.end is None and recording.status == "interrupted"
    assert [r.status for r in list_runs()] == ["interrupted"]
    code, out, err = run_cli("show", job.id)
    assert code == 0 and out == "" and "✗ interrupted" in err and "last line was torn" in err
    report = replay(guest, job.id)
    d = report.divergence
    assert (d.step, d.why, d.kind) == (2, "the transcript ends here", "end") and "torn" in d.recorded
    assert report.recorded is None and report.stopped and not report.same_result


def test_a_transcript_cut_inside_an_answer_stops_there_or_goes_live():
    guest = infer_script(["a"])
    job = record(guest, backend=ScriptedBackend(WORDS))
    run_dir = Path(job.run_dir)
    keep = [i for i, e in enumerate(job.events) if e["type"] == "response.output_text.delta"][4]
    _torn(run_dir, drop_envelope=True, keep=keep + 1)
    report = replay(guest, job.id)
    assert report.divergence.why == "the transcript ends inside this answer" and report.stopped
    live = replay(guest, job.id, live=True, backend=ScriptedBackend(WORDS))
    assert live.envelope.ok and live.live_from == 1
    assert next(e for e in live.job.events if e["type"] == "response.completed")["response"]["output_text"] == WORDS


def test_a_damaged_line_inside_a_transcript_is_one_error(tmp_path):
    job = record(infer_script(["a"]), backend=ScriptedBackend(WORDS))
    path = Path(job.run_dir) / "events.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    lines[3] = b"{not json\n"
    path.write_bytes(b"".join(lines))
    for argv in (("show", job.id), ("replay", _wasm(tmp_path, infer_script(["a"])), "--from", job.id),
                 ("diff", job.id, job.id)):
        code, _, err = run_cli(*argv)
        assert code == 2 and err.count("\n") == 1 and "line 4 of events.jsonl is not JSON" in err, argv


def test_an_unknown_version_is_refused_with_a_clear_message(tmp_path):
    job = record(wat.script_guest([{"cmd": "done", "result": 1}]))
    path = Path(job.run_dir) / "events.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    created = orjson.loads(lines[0])
    created["transcript_version"] = 99
    path.write_bytes(orjson.dumps(created) + b"\n" + b"".join(lines[1:]))
    for argv in (("show", job.id), ("replay", _wasm(tmp_path, wat.script_guest([{"cmd": "done", "result": 1}])),
                                    "--from", job.id)):
        code, _, err = run_cli(*argv)
        assert code == 2 and "transcript format version 99 is not one this tensorjob reads (0 to 1)" in err
    with pytest.raises(TranscriptError, match="version 99"):
        Recording.read(job.run_dir)
    assert [r.status for r in list_runs()] == ["unreadable"]


def test_a_version_0_transcript_is_shown_but_not_replayed(tmp_path):
    job = record(infer_script(["a"]), backend=ScriptedBackend(WORDS))
    path = Path(job.run_dir) / "events.jsonl"
    events = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    for e in events:  # as the host wrote them before format version 1
        for key in ("transcript_version", "created_at", "t_ms", "command", "guest_stopped_after", "ended_during",
                    "read", "cwd"):
            e.pop(key, None)
    path.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in events))
    code, out, err = run_cli("show", job.id)
    assert code == 0 and json.loads(out) == {"n": 1} and WORDS in err
    with pytest.raises(ReplayError, match="predates format version 1"):
        replay(infer_script(["a"]), job.id)


# --- history --------------------------------------------------------------------------------------------


def test_runs_are_listed_newest_first_with_limit_and_status():
    ok = record(wat.script_guest([{"cmd": "done", "result": 1}]))
    time.sleep(0.01)
    bad = record(wat.script_guest([{"cmd": "fail", "code": "not_found", "message": "x"}]))
    listing = list_runs()
    assert [r.id for r in listing] == [bad.id, ok.id]
    assert [r.status for r in listing] == ["failed", "completed"] and listing[0].error == "not_found"
    assert [r.id for r in list_runs(limit=1)] == [bad.id]
    assert [r.id for r in list_runs(status="completed")] == [ok.id]
    table = listing.table().splitlines()
    assert table[0].split() == ["ID", "GUEST", "STATUS", "TOKENS", "IN/OUT", "DURATION", "STARTED"]
    assert table[1].startswith(bad.id) and "failed (not_found)" in table[1]
    with pytest.raises(RunError, match="not a status"):
        list_runs(status="nope")


def test_the_html_listing_escapes_guest_names():
    record(wat.script_guest([{"cmd": "done", "result": 1}]), name="<script>x</script>\x1b[31m")
    listing = list_runs()
    html = listing._repr_html_()
    assert "<script>" not in html and "&lt;script&gt;" in html and "\x1b" not in html
    assert "\x1b" not in listing.table()


def test_a_run_is_found_by_id_prefix_path_or_job(tmp_path):
    job = record(wat.script_guest([{"cmd": "done", "result": 1}]))
    assert resolve_run(job.id) == Path(job.run_dir)
    assert resolve_run(job.id[:-2]) == Path(job.run_dir)
    assert resolve_run(str(job.run_dir)) == Path(job.run_dir)
    assert resolve_run(job) == Path(job.run_dir)
    record(wat.script_guest([{"cmd": "done", "result": 2}]))
    with pytest.raises(RunError, match="matches 2 runs"):
        resolve_run(job.id[:4])
    with pytest.raises(RunError, match="no run nope"):
        resolve_run("nope")
    with pytest.raises(RunError, match="not a tensorjob run"):
        resolve_run(str(tmp_path))


def test_prune_keeps_the_newest_and_deletes_only_finished_run_folders(tmp_path):
    jobs = []
    for i in range(4):
        jobs.append(record(wat.script_guest([{"cmd": "done", "result": i}])))
        time.sleep(0.01)
    runs = runs_dir()
    # Things in the runs folder that prune must never touch:
    outside = tmp_path / "precious"
    outside.mkdir()
    (outside / "events.jsonl").write_bytes((Path(jobs[0].run_dir) / "events.jsonl").read_bytes())
    (runs / "link").symlink_to(outside, target_is_directory=True)  # a symlink to a run-like folder
    (runs / "notes").mkdir()
    (runs / "notes" / "todo.txt").write_text("keep me")  # not a run folder at all
    copied = runs / "copied"  # a run's files under another name: not its own transcript
    copied.mkdir()
    for f in Path(jobs[0].run_dir).iterdir():
        (copied / f.name).write_bytes(f.read_bytes())
    os.utime(copied / "events.jsonl", (0, 0))  # prune goes by the file system's times: written long ago
    (Path(jobs[1].run_dir) / "notes.txt").write_text("mine")  # a run folder holding someone's file
    held = open(Path(jobs[0].run_dir) / "events.jsonl", "rb")  # as a job in another process holds it
    fcntl.flock(held.fileno(), fcntl.LOCK_EX)
    try:
        report = prune(1)
    finally:
        held.close()
    assert report.removed == [jobs[2].id]
    assert dict(report.skipped) == {jobs[1].id: "it holds files a job does not write (notes.txt)",
                                    "copied": "its events.jsonl is not this folder's own transcript",
                                    jobs[0].id: "its job is still running"}
    assert report.kept == 4 and report.bytes_freed > 0
    assert not Path(jobs[2].run_dir).exists() and Path(jobs[3].run_dir).exists()
    assert (outside / "events.jsonl").exists() and (runs / "link").is_symlink()
    assert (runs / "notes" / "todo.txt").read_text() == "keep me"
    assert (copied / "events.jsonl").exists()
    report = prune(0)
    assert jobs[0].id in report.removed and jobs[3].id in report.removed
    assert Path(jobs[1].run_dir).exists()


def test_prune_never_removes_a_running_job_of_this_process():
    job = tj.Job(infer_script(["go"], max_tokens=500),
                 backend=ScriptedBackend(" ".join(["w"] * 500), token_delay_s=0.01)).start()
    try:
        report = prune(0)
        assert report.removed == [] and report.skipped == [(job.id, "its job is still running")]
        assert [r.status for r in list_runs()] == ["running"]
        code, _, err = run_cli("show", job.id)
        assert code == 0 and "… running: the job is still running" in err
    finally:
        job.cancel()
        job.wait(10)


# --- show -----------------------------------------------------------------------------------------------


def test_show_prints_exactly_what_run_printed(monkeypatch, guest_with_everything):
    from tensorjob_jupyter.inference import ModelRef

    monkeypatch.setattr(ModelRef, "backend", lambda self: ScriptedBackend(WORDS))  # the embedded model's place
    code, out, err = run_cli("run", guest_with_everything)
    run_id = list_runs()[0].id
    shown = run_cli("show", run_id)
    assert code == 0 and shown == (0, out, err)
    assert "· infer:" in err and WORDS in err and "✓ completed" in err
    code, out, _ = run_cli("show", run_id, "--json", "--quiet")
    assert json.loads(out)["status"] == "completed"


@pytest.fixture
def guest_with_everything(tmp_path):
    return _wasm(tmp_path, wat.script_guest([{"cmd": "emit", "progress": {"done": 1, "total": 2}},
                                             {"cmd": "infer", "prompt": "go", "max_tokens": 10},
                                             {"cmd": "emit", "progress": "a log line"},
                                             {"cmd": "done", "result": {"ok": True}}]))


def test_show_at_recorded_speed_takes_the_recorded_time():
    job = record(infer_script(["a"]), backend=ScriptedBackend(WORDS, token_delay_s=0.1))
    recorded_s = job.events[-1]["t_ms"] / 1000
    assert recorded_s >= 0.9  # long enough that a loaded machine's start-up cannot pass for the recorded pace
    started = time.monotonic()
    assert run_cli("show", job.id)[0] == 0
    assert time.monotonic() - started < recorded_s / 2
    started = time.monotonic()
    assert run_cli("show", job.id, "--speed", "1")[0] == 0
    assert time.monotonic() - started >= recorded_s * 0.9
    started = time.monotonic()
    assert run_cli("show", job.id, "--speed", "4")[0] == 0
    assert time.monotonic() - started < recorded_s * 0.6


def test_a_shown_run_folds_into_the_same_view_state_as_the_live_one():
    job = record(infer_script(["a", "b"], stop_after_tokens=3), backend=ScriptedBackend(WORDS, token_delay_s=0.002))
    events = job.events
    clock = [0.0]
    live = ViewState(job.name, clock=lambda: clock[0])
    for e in events:
        clock[0] = e["t_ms"] / 1000
        live.apply(e)
    playback = Playback(job.run_dir)
    shown = ViewState(playback.name, clock=playback.clock)
    for e in playback.subscribe():
        shown.apply(e)
    for section, renderer in render.RENDERERS.items():
        assert renderer(shown) == renderer(live), section
    assert shown.elapsed_s == events[-1]["t_ms"] / 1000 and shown.status == "completed"
    assert shown.tokens == sum(e["type"] == "response.output_text.delta" for e in events)


def test_cancel_skips_a_paced_show_to_the_end():
    job = record(infer_script(["a"]), backend=ScriptedBackend(WORDS, token_delay_s=0.05))
    playback = Playback(job.run_dir, speed=0.1)  # would take about 5 s
    sub = playback.subscribe()
    assert sub.get(timeout=0.05)["type"] == "job.created"
    playback.cancel()
    started = time.monotonic()
    rest = list(sub)
    assert time.monotonic() - started < 1 and rest[-1]["type"] == "job.completed"


# --- diff -----------------------------------------------------------------------------------------------


def test_diff_of_two_runs_of_the_same_guest_is_the_same():
    a = record(infer_script(["a"]), backend=ScriptedBackend(WORDS))
    b = record(infer_script(["a"]), backend=ScriptedBackend(WORDS))
    result = diff_runs(a.id, b.id)
    assert result.same and result.parting is None
    code, out, _ = run_cli("diff", a.id, b.id)
    assert code == 0 and "commands: the same 1 step, and the same end" in out and "result: the same" in out


def test_diff_names_the_first_divergence_answer_and_result():
    a = record(infer_script(["a", "b"]), backend=ScriptedBackend(WORDS))
    b = record(infer_script(["a", "c"]), backend=ScriptedBackend("other words"))
    result = diff_runs(a.id, b.id)
    assert not result.same and (result.parting.step, result.common) == (2, 1)
    assert result.answer.step == 1 and result.answer.why == "another answer from the model"
    code, out, _ = run_cli("diff", a.id, b.id, "--json")
    data = json.loads(out)
    assert code == 1 and data["divergence"]["step"] == 2 and data["first_different_answer"]["step"] == 1
    code, out, _ = run_cli("diff", a.id, b.id)
    assert "they part at step 2 (another prompt (they differ from character 0))" in out
    assert "usage: tokens in" in out


# --- the command line as a subprocess ------------------------------------------------------------------


@pytest.mark.slow
def test_the_commands_from_a_terminal(tmp_path, text_file):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TENSORJOB_RUNS": str(tmp_path / "cli-runs")}

    def tensorjob(*argv):
        return subprocess.run([sys.executable, "-m", "tensorjob_jupyter.frontends.cli", *map(str, argv)], env=env,
                              capture_output=True, text=True, timeout=120, cwd=tmp_path)

    wc = EXAMPLES / "wordcount.c"
    done = tensorjob("run", wc, "--read", text_file.parent, "--input", json.dumps({"path": str(text_file)}))
    assert done.returncode == 0, done.stderr
    listed = tensorjob("runs", "--json")
    (run,) = [json.loads(line) for line in listed.stdout.splitlines()]
    assert run["status"] == "completed" and run["guest"] == "wordcount.c"
    same = tensorjob("replay", wc, "--from", run["id"], "--read", text_file.parent)
    assert same.returncode == 0 and json.loads(same.stdout) == json.loads(done.stdout)
    assert "replay: the same result as the recorded run" in same.stderr
    other = tensorjob("replay", wc, "--from", run["id"], "--read", text_file.parent,
                      "--input", json.dumps({"path": str(text_file), "window": 99}))
    assert other.returncode == 1 and "replay diverged at step 2 (another window)" in other.stderr
    report = tensorjob("replay", wc, "--from", run["id"], "--read", text_file.parent, "--json")
    assert json.loads(report.stdout)["same_result"] is True
    shown = tensorjob("show", run["id"][:-1])  # a unique prefix
    assert shown.returncode == 0 and shown.stdout == done.stdout and shown.stderr == done.stderr
    table = tensorjob("runs", "--status", "failed")
    assert table.returncode == 0 and "replay_divergence" in table.stdout and len(table.stdout.splitlines()) == 2
    pruned = tensorjob("runs", "--prune", "1")
    assert pruned.returncode == 0 and pruned.stdout.startswith("removed 3 runs")
    bad = tensorjob("show", "nope")
    assert bad.returncode == 2 and bad.stderr.startswith("tensorjob: error: no run nope") and bad.stderr.count("\n") == 1
    bad = tensorjob("runs", "--status", "nope")
    assert bad.returncode == 2 and "not a status" in bad.stderr


# --- the magics -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ip():
    from IPython.testing import globalipapp

    globalipapp.start_ipython()
    shell = globalipapp.get_ipython()
    shell.run_line_magic("load_ext", "tensorjob_jupyter")
    yield shell


def test_the_magics_list_show_and_replay(ip, tmp_path, capsys):
    from IPython.core.error import UsageError

    guest = _wasm(tmp_path, infer_script(["a"]))
    job = record(infer_script(["a"]), backend=ScriptedBackend(WORDS))
    listing = ip.run_line_magic("tensorjob", "runs")
    assert [r.id for r in listing] == [job.id] and "<table" in listing._repr_html_()
    ip.user_ns["recorded"] = job
    capsys.readouterr()
    assert ip.run_line_magic("tensorjob", "show $recorded").result == {"n": 1}  # the value is the envelope
    out = capsys.readouterr().out
    assert out.startswith("tensorjob ") and "completed" in out and "tokens: 1 in, 10 out" in out
    report = ip.run_line_magic("tensorjob", f"replay {guest} --from $recorded")
    assert report.same_result and repr(report) == "<ReplayReport completed, the same result, no divergence>"
    assert "replay: the same result as the recorded run" in capsys.readouterr().out
    changed = _wasm(tmp_path, infer_script(["b"]))
    report = ip.run_line_magic("tensorjob", f"replay {changed} --from {job.id} --quiet")
    assert report.stopped and report.divergence.step == 1
    assert capsys.readouterr().out == ""
    with pytest.raises(UsageError, match="no run nope"):
        ip.run_line_magic("tensorjob", "show nope")
    with pytest.raises(UsageError, match="replay needs a guest"):
        ip.run_line_magic("tensorjob", "replay --from x")
    print(ip.run_line_magic("tensorjob", "runs --prune 0"))
    assert "removed" in capsys.readouterr().out


# --- the real model --------------------------------------------------------------------------------------


@pytest.mark.slow  # the real model records the run; the replay runs with none
def test_a_real_model_run_replays_to_the_same_result_with_no_model_loaded(tmp_path):
    from tensorjob_jupyter.inference.models import get_backend

    data = ROOT / "examples" / "data"
    job = record(EXAMPLES / "summarise.c", backend=get_backend(), read=[data],
                 input={"path": str(data / "lighthouse.txt"), "max_tokens": 24})
    assert job.envelope.ok and job.envelope.usage.tokens_out > 0
    script = ("import json, sys\n"
              "from tensorjob_jupyter.frontends.cli import main\n"
              "import io\n"
              "out = io.StringIO()\n"
              f"code = main(['replay', {str(EXAMPLES / 'summarise.c')!r}, '--from', {str(job.run_dir)!r}, '--read', "
              f"{str(data)!r}, '--json'],"
              " out=out, err=io.StringIO())\n"
              "print(json.dumps({'code': code, 'report': json.loads(out.getvalue()),"
              " 'llama_cpp_loaded': 'llama_cpp' in sys.modules}))\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout.splitlines()[-1])
    assert answer["code"] == 0 and not answer["llama_cpp_loaded"]
    report = answer["report"]
    assert report["same_result"] and report["divergence"] is None
    assert report["envelope"]["result"] == job.result
    assert report["envelope"]["usage"]["tokens_out"] == job.envelope.usage.tokens_out


# --- the live view, from a transcript -------------------------------------------------------------------


def test_the_widget_shows_a_past_run_as_it_showed_it_live(text_file):
    from tensorjob_jupyter.frontends.view.widget import JobView

    job = tj.Job(wat.script_guest([{"cmd": "open", "path": str(text_file)},
                                   {"cmd": "slice", "handle": 0, "offset": 0, "len": 64},
                                   {"cmd": "emit", "progress": {"done": 1, "total": 2}},
                                   {"cmd": "infer", "prompt": "p", "max_tokens": 8},
                                   {"cmd": "done", "result": {"ok": True}}]),
                 read=[text_file.parent], backend=ScriptedBackend("summary words here", token_delay_s=0.02))
    live = JobView(job, refresh_hz=20).start()
    job.start().wait(30)
    live.join(10)
    shown = JobView(Playback(job.run_dir), refresh_hz=20).start()
    shown.join(10)
    for name in ("log", "tokens", "files", "output", "result", "usage"):
        assert getattr(shown, name).value == getattr(live, name).value, name
    assert (shown.progress.value, shown.progress.bar_style) == (live.progress.value, live.progress.bar_style)
    assert 'class="tj-status">completed<' in shown.header.value
    recorded_s = job.events[-1]["t_ms"] / 1000
    assert f"{recorded_s:.1f} s" in shown.header.value and "3 tokens" in shown.header.value
    assert shown.cancel_button.disabled and shown.cancel_button.description == "Completed"
    # At recorded speed, the view's Cancel button skips to the end.
    paced = Playback(job.run_dir, speed=0.05)
    view = JobView(paced, refresh_hz=20).start()
    time.sleep(0.2)
    view.cancel_button.click()
    view.join(5)
    assert not view._thread.is_alive() and view.state.status == "completed"


def test_a_listing_reads_a_large_result_s_envelope_only_at_its_ends():
    from tensorjob_jupyter.record.transcript import read_envelope_summary

    job = record(wat.script_guest([{"cmd": "done", "result": 1}]))
    big = tj.Envelope(tj.JobStatus.COMPLETED, job.envelope.usage, result={"text": "x" * 200_000})
    (Path(job.run_dir) / "envelope.json").write_bytes(abi.encode_json(big.to_json()) + b"\n")
    summary = read_envelope_summary(Path(job.run_dir))
    assert summary == {"status": "completed", "usage": job.envelope.usage.to_json()}
    (info,) = list_runs()
    assert (info.status, info.tokens_out, info.duration_ms) == ("completed", 0, job.envelope.usage.duration_ms)


def test_relative_paths_resolve_against_the_run_s_directory(tmp_path, text_file, monkeypatch):
    monkeypatch.chdir(text_file.parent.parent)
    guest = wat.script_guest([{"cmd": "open", "path": "data/doc.txt"}, {"cmd": "done", "result": 1}])
    job = record(guest, read=["data"])
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    # the guest's "data/doc.txt" is the run's directory's; the grant is given again, as a path of this one's
    assert replay(guest, job.id, read=["../data"]).same_result
    code, out, err = run_cli("replay", _wasm(tmp_path, guest), "--from", job.id, "--read", text_file.parent)
    assert code == 0 and "the same result" in err


def test_a_malformed_setup_in_a_transcript_is_one_error(tmp_path):
    guest = wat.script_guest([{"cmd": "done", "result": 1}])
    job = record(guest)
    path = Path(job.run_dir) / "events.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    created = orjson.loads(lines[0])
    created["limits"] = {"max_steps": "many"}
    created["infer"] = {"lora": [{"nope": 1}]}
    path.write_bytes(orjson.dumps(created) + b"\n" + b"".join(lines[1:]))
    code, _, err = run_cli("replay", _wasm(tmp_path, guest), "--from", job.id)
    assert code == 2 and "its job.created cannot be replayed" in err and err.count("\n") == 1


def _json_infer(**extra):
    return {"cmd": "infer", "prompt": "p", "max_tokens": 8, "format": {"type": "json_object"}, **extra}


LONG_JSON = '{"a": 1, "b": 2, "c": 3}'  # six pieces for the scripted model


def test_live_continues_a_constrained_answer_from_its_middle_when_the_model_repeats_it(tmp_path):
    # Recorded: the guest stopped a JSON answer after 2 tokens. Replayed: it wants more. The one token
    # loop asks the model again and skips the two pieces the guest already judged -- checking them.
    stop_after_two = wat.script_guest([_json_infer(), {"cmd": "done", "result": 1}], stop_after_tokens=2)
    job = tj.Job(stop_after_two, backend=ScriptedBackend(LONG_JSON), runs_dir=tmp_path / "runs")
    job.start().wait(30)
    wants_more = wat.script_guest([_json_infer(), {"cmd": "done", "result": 1}], stop_after_tokens=5)
    report = replay(wants_more, job.run_dir, live=True, backend=ScriptedBackend(LONG_JSON))
    assert not report.stopped and report.live_from == 1 and report.status == "completed", report.lines()
    deltas = [e["delta"] for e in report.job.events if e["type"] == "response.output_text.delta"]
    # the recorded two, then the model's three (and at most the one piece it had made before the stop landed)
    assert "".join(deltas).startswith('{"a": 1, "b": 2, "c":') and 5 <= len(deltas) <= 6
    done = [e for e in report.job.events if e["type"] == "response.completed"]
    assert done and done[0]["guest_stopped_after"] == 5


def test_live_stops_where_the_model_no_longer_repeats_the_recorded_answer(tmp_path):
    stop_after_two = wat.script_guest([_json_infer(), {"cmd": "done", "result": 1}], stop_after_tokens=2)
    job = tj.Job(stop_after_two, backend=ScriptedBackend('{"a": 1}'), runs_dir=tmp_path / "runs")
    job.start().wait(30)
    wants_more = wat.script_guest([_json_infer(), {"cmd": "done", "result": 1}], stop_after_tokens=5)
    report = replay(wants_more, job.run_dir, live=True, backend=ScriptedBackend('{"b": 2}'))
    assert report.envelope.error.code == "replay_divergence"
    assert "the model answered otherwise" in report.envelope.error.message


def test_live_never_continues_a_sampled_answer_from_its_middle(tmp_path):
    # A temperature above 0 cannot be repeated, so the replay stops at the divergence.
    stop_after_two = wat.script_guest([_json_infer(temperature=0.7), {"cmd": "done", "result": 1}],
                                      stop_after_tokens=2)
    job = tj.Job(stop_after_two, backend=ScriptedBackend('{"a": 1}'), runs_dir=tmp_path / "runs")
    job.start().wait(30)
    wants_more = wat.script_guest([_json_infer(temperature=0.7), {"cmd": "done", "result": 1}],
                                  stop_after_tokens=5)
    report = replay(wants_more, job.run_dir, live=True, backend=ScriptedBackend('{"a": 1}'))
    assert report.stopped and "only greedy answers repeat" in report.divergence.asked
    assert report.envelope.error.code == "replay_divergence"


# --- --live runs through the one token loop: cancel and a full queue as in a live job ---------------------


def _recorded_two_of_many(tmp_path):
    stop_after_two = wat.script_guest([{"cmd": "infer", "prompt": "p", "max_tokens": 64},
                                       {"cmd": "done", "result": 1}], stop_after_tokens=2)
    words = " ".join(f"w{i}" for i in range(40))
    job = tj.Job(stop_after_two, backend=ScriptedBackend(words), runs_dir=tmp_path / "runs")
    job.start().wait(30)
    wants_all = wat.script_guest([{"cmd": "infer", "prompt": "p", "max_tokens": 64},
                                  {"cmd": "done", "result": 1}])
    return job, wants_all, words


def test_a_cancel_during_replay_live_ends_cancelled(tmp_path):
    job, wants_all, words = _recorded_two_of_many(tmp_path)
    slow = ScriptedBackend(words, token_delay_s=0.05)
    replaying = ReplayJob(wants_all, job.run_dir, live=True, backend=slow, runs_dir=tmp_path / "runs").start()
    sub = replaying.subscribe()
    for event in sub:  # cancel once the model streams the live rest of the answer
        if event["type"] == "response.output_text.delta" and event["delta"].strip() == "w4":
            replaying.cancel()
            break
    envelope = replaying.wait(30)
    assert envelope.status.value == "cancelled" and envelope.error.code == "cancelled", envelope
    assert envelope.error.message == "cancelled during inference"
    ends = [e for e in replaying.events if e["type"].startswith("response.") and e["type"] in (
        "response.completed", "response.incomplete", "response.failed")]
    assert ends and ends[-1]["finish_reason"] == "cancelled"


class _FullQueue(ScriptedBackend):
    def generate_stream(self, request, on_token):
        raise QueueFull("the model's request queue is full (64 waiting); try again shortly")


def test_a_full_queue_during_replay_live_is_busy_too_many_requests(tmp_path):
    job, wants_all, words = _recorded_two_of_many(tmp_path)
    replaying = ReplayJob(wants_all, job.run_dir, live=True, backend=_FullQueue(words), runs_dir=tmp_path / "runs")
    envelope = replaying.start().wait(30)
    assert envelope.status.value == "failed" and envelope.error.code == "busy", envelope
    errors = [e for e in replaying.events if e["type"] == "error"]
    assert errors and errors[-1]["error_type"] == "too_many_requests" and errors[-1]["code"] == "busy"
    failed = [e for e in replaying.events if e["type"] == "response.failed"]
    assert failed and failed[-1]["response"]["error"]["code"] == "rate_limit_exceeded"


# --- an infer replays through the live path's own plan and checks -----------------------------------------

ECHO_GUEST = Path(__file__).resolve().parents[1] / "guests" / "infer_echo.c"
WEATHER_TOOL = {"type": "function", "name": "get_weather", "description": "The weather in a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40},
                                                               "unit": {"enum": ["C", "F"]}},
                               "required": ["city", "unit"]}}


def test_a_tool_call_replays_with_its_call_and_its_id(tmp_path):
    call = '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}'
    guest_input = {"prompt": "hi", "max_tokens": 64, "options": {"tools": [WEATHER_TOOL], "tool_choice": "required"}}
    job = record(ECHO_GUEST, backend=ScriptedBackend(call), input=guest_input, runs_dir=tmp_path / "runs")
    calls = job.result["event"]["tool_calls"]
    assert calls and calls[0]["name"] == "get_weather"
    report = replay(ECHO_GUEST, job.run_dir)
    assert report.same_result and report.divergence is None, report.lines()
    assert report.result["event"]["tool_calls"] == calls  # the same call id the guest saw
    assert report.result["streamed"] == job.result["streamed"]  # every piece through cf_on_token again
    kinds = [e["type"] for e in report.job.events if e["type"].startswith("response.function_call")]
    assert "response.function_call_arguments.done" in kinds


def test_a_json_answer_cut_at_its_limit_replays_as_it_failed(tmp_path):
    guest = wat.script_guest([{"cmd": "infer", "prompt": "p", "max_tokens": 3, "format": {"type": "json_object"}},
                              {"cmd": "done", "result": 1}])
    job = record(guest, backend=ScriptedBackend('{"a": 1, "b": 2, "c": 3}'), runs_dir=tmp_path / "runs")
    assert job.envelope.error.code == "limit_exceeded"
    report = replay(guest, job.run_dir)
    assert report.same_result and report.envelope.error.code == "limit_exceeded", report.lines()


@pytest.mark.parametrize("change, why", [
    ({"format": {"type": "json_schema", "name": "b", "schema": {"type": "object"}}}, "another format"),
    ({"seed": 7}, "another seed"),
    ({"temperature": 0.5}, "another temperature"),
])
def test_an_infer_with_another_format_or_sampling_of_its_own_diverges(tmp_path, change, why):
    first = {"cmd": "infer", "prompt": "p", "max_tokens": 8, "format": {"type": "json_object"}}
    job = record(wat.script_guest([first, {"cmd": "done", "result": 1}]), backend=ScriptedBackend('{"a": 1}'),
                 runs_dir=tmp_path / "runs")
    changed = wat.script_guest([{**first, **change}, {"cmd": "done", "result": 1}])
    report = replay(changed, job.run_dir)
    assert report.stopped and report.divergence.why == why, report.lines()


def test_live_diverges_where_the_model_now_ends_before_the_recorded_pieces(tmp_path):
    job, wants_all, words = _recorded_two_of_many(tmp_path)
    report = replay(wants_all, job.run_dir, live=True, backend=ScriptedBackend("w0"))
    assert report.envelope.error.code == "replay_divergence"
    assert "the model's answer ends there" in report.envelope.error.message

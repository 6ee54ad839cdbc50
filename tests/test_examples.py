"""The example guests in guests/examples/, run through the real host.

Each example is compiled from source by the host (``tj.run`` / ``tj.Job``
take a ``.c`` or ``.zig`` path) and run against files under the test's tmp
dir, with ``ScriptedBackend`` standing in for the model where one is needed.
The word counters are checked against Python's ``str.split``, and their
memory is checked to stay flat: the same peak for a 1 MiB and a 64 MiB file.
The classifier labels each line with one of its labels, or a label held to a
regex or a grammar; its Python twin makes the same commands.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import tensorjob_jupyter as tj
from tensorjob_jupyter.inference.scripted import ScriptedBackend

EXAMPLES = Path(__file__).resolve().parent.parent / "guests" / "examples"
WORDCOUNTERS = ["wordcount.c", "wordcount.zig"]

LOREM = ("Lorem ipsum dolor sit amet,\tconsectetur adipiscing elit; sed do eiusmod\n"
         "tempor incididunt ut labore  et dolore magna aliqua.\r\n\n   Ut enim ad minim veniam\x0b\x0c quis\n")


def _job(guest: str, tmp_path: Path, **kwargs) -> tj.Job:
    kwargs.setdefault("read", [str(tmp_path)])
    kwargs.setdefault("runs_dir", tmp_path / "runs")
    return tj.Job(EXAMPLES / guest, **kwargs)


def _run(guest: str, tmp_path: Path, **kwargs):
    job = _job(guest, tmp_path, **kwargs)
    env = job.start().wait(timeout=60)
    return job, env


def _write_repeated(path: Path, block: bytes, size: int) -> None:
    """``size`` bytes of ``block`` repeated, written in large pieces (fast)."""
    piece = block * max(1, (1 << 20) // len(block))
    with open(path, "wb") as f:
        left = size
        while left > 0:
            f.write(piece[:left])
            left -= min(left, len(piece))


# --- word counting --------------------------------------------------------------------


@pytest.mark.parametrize("guest", WORDCOUNTERS)
def test_wordcount_small_file(guest, tmp_path):
    p = tmp_path / "small.txt"
    p.write_bytes(LOREM.encode())
    job, env = _run(guest, tmp_path, input={"path": str(p)})
    assert env.status == tj.JobStatus.COMPLETED, env
    assert env.result == {"path": str(p), "words": len(LOREM.split()), "bytes": len(LOREM.encode())}


@pytest.mark.parametrize("guest", WORDCOUNTERS)
def test_wordcount_empty_file(guest, tmp_path):
    p = tmp_path / "empty.txt"
    p.write_bytes(b"")
    _, env = _run(guest, tmp_path, input={"path": str(p)})
    assert env.result == {"path": str(p), "words": 0, "bytes": 0}


@pytest.mark.parametrize("guest", WORDCOUNTERS)
def test_wordcount_larger_file_emits_progress(guest, tmp_path):
    p = tmp_path / "larger.txt"
    data = ("".join(f"w{i} " + ("\n" if i % 17 == 0 else "") for i in range(200_000))).encode()
    p.write_bytes(data)
    job, env = _run(guest, tmp_path, input={"path": str(p), "window": 16384})
    assert env.status == tj.JobStatus.COMPLETED, env
    assert env.result["words"] == len(data.split()) == 200_000
    assert env.result["bytes"] == len(data)
    progress = [e["progress"] for e in job.events if e["type"] == "job.progress"]
    windows = -(-len(data) // 16384)
    assert len(progress) == -(-(windows - 1) // 16)  # after window 1, 17, 33, ...
    assert all(set(p) == {"done", "total"} and p["total"] == len(data) for p in progress)
    assert [p["done"] for p in progress] == sorted(p["done"] for p in progress)
    assert progress[0]["done"] == 16384


@pytest.mark.parametrize("guest", WORDCOUNTERS)
def test_wordcount_multibyte_characters_straddling_windows(guest, tmp_path):
    # Windows of 1000 bytes land inside 2-, 3- and 4-byte characters; the host
    # cuts each back to a boundary and the guest resumes from next_offset.
    text = "".join(f"é日本{i}😀 ñ\u2028x𝄞語 " if i % 3 else f"ü{i}\n" for i in range(5000))
    p = tmp_path / "utf8.txt"
    p.write_text(text, encoding="utf-8")
    job, env = _run(guest, tmp_path, input={"path": str(p), "window": 1000})
    assert env.status == tj.JobStatus.COMPLETED, env
    expected_words = len(re.split(r"[ \t\n\r\x0b\x0c]+", text.strip()))
    assert env.result["words"] == expected_words
    assert env.result["bytes"] == len(text.encode())
    assert job.stats.steps > len(text.encode()) // 1000


@pytest.fixture(scope="module")
def big_files(tmp_path_factory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("big")
    block = LOREM.encode() * 50
    one, sixty_four = d / "1mib.txt", d / "64mib.txt"
    _write_repeated(one, block, 1 << 20)
    _write_repeated(sixty_four, block, 64 << 20)
    return one, sixty_four


@pytest.mark.parametrize("guest", WORDCOUNTERS)
def test_wordcount_memory_is_flat(guest, big_files, tmp_path):
    peaks, results = [], []
    for p in big_files:
        job, env = _run(guest, tmp_path, input={"path": str(p)}, read=[str(p.parent)])
        assert env.status == tj.JobStatus.COMPLETED, env
        peaks.append(job.stats.peak_memory_bytes)
        results.append(env.result)
    one_words = len(big_files[0].read_bytes().split())
    assert results[0]["words"] == one_words and results[0]["bytes"] == 1 << 20
    assert results[1]["bytes"] == 64 << 20
    assert peaks[0] == peaks[1], f"peak memory grew with the file: {peaks}"
    assert peaks[0] <= 2 << 20


def test_wordcount_outside_the_grants_is_denied(tmp_path):
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    other = tmp_path / "secret.txt"
    other.write_text("no")
    _, env = _run("wordcount.c", tmp_path, input={"path": str(other)}, read=[str(allowed)])
    assert env.status == tj.JobStatus.FAILED
    assert env.error.code == "capability_denied"


def test_wordcount_without_a_path_fails_cleanly(tmp_path):
    _, env = _run("wordcount.c", tmp_path, input={"file": "x"})
    assert env.status == tj.JobStatus.FAILED
    assert env.error.code == "schema_validation_failed"


# --- the summariser -------------------------------------------------------------------------


def test_summarise_infers_once_per_window(tmp_path):
    sections = [f"section{i} " + "text " * 150 for i in range(5)]
    p = tmp_path / "doc.txt"
    p.write_text("".join(sections))
    size = p.stat().st_size

    def reply(prompt: str) -> str:
        window = prompt.split("<document>\n", 1)[1].split("\n</document>", 1)[0]
        return "saw " + window.split()[0] + " and more words"

    backend = ScriptedBackend(reply=reply)
    job, env = _run("summarise.c", tmp_path, input={"path": str(p), "window": 1000}, backend=backend)
    assert env.status == tj.JobStatus.COMPLETED, env
    n = -(-size // 1000)
    assert env.result["path"] == str(p)
    assert env.result["windows"] == n == len(backend.scripted.prompts)
    lines = env.result["summary"].split("\n")
    assert len(lines) == n and all(line.startswith("saw ") for line in lines)
    assert lines[0] == "saw section0 and more words"
    # Every prompt quotes its window, and together the windows are the file.
    windows = [q.split("<document>\n", 1)[1].split("\n</document>", 1)[0] for q in backend.scripted.prompts]
    assert "".join(windows) == p.read_text()
    assert str(p) in backend.scripted.prompts[0]
    progress = [e["progress"] for e in job.events if e["type"] == "job.progress"]
    assert progress == [{"done": i, "total": n} for i in range(1, n + 1)]
    assert env.usage.tokens_out == 5 * n


def test_summarise_respects_max_tokens_and_utf8_windows(tmp_path):
    p = tmp_path / "doc.txt"
    p.write_text("日本語のテキスト。" * 200, encoding="utf-8")  # 27 bytes a sentence
    backend = ScriptedBackend(reply="one two three four five")
    job, env = _run("summarise.c", tmp_path, input={"path": str(p), "window": 100, "max_tokens": 2},
                    backend=backend)
    assert env.status == tj.JobStatus.COMPLETED, env
    lines = env.result["summary"].split("\n")
    assert set(lines) == {"one two"}
    windows = [q.split("<document>\n", 1)[1].split("\n</document>", 1)[0] for q in backend.scripted.prompts]
    assert "".join(windows) == p.read_text(encoding="utf-8")
    progress = [e["progress"] for e in job.events if e["type"] == "job.progress"]
    assert progress[-1] == {"done": env.result["windows"], "total": env.result["windows"]}


# --- stopping early ---------------------------------------------------------------------------

LONG_REPLY = "Hello there friend. " + " ".join(f"w{i}" for i in range(50))


def test_stop_early_at_the_first_full_stop(tmp_path):
    backend = ScriptedBackend(reply=LONG_REPLY)
    job, env = _run("stop_early.c", tmp_path, input={"prompt": "Say hello", "max_tokens": 40}, backend=backend)
    assert env.status == tj.JobStatus.COMPLETED, env
    r = env.result
    assert r["stopped"] is True
    assert r["streamed"] == "Hello there friend."
    assert r["tokens_seen"] == 3
    # The verdict travels back to the decoder; a token or two may still come.
    assert r["text"].startswith("Hello there friend.")
    assert 3 <= r["tokens_out"] <= 5 < 40
    assert backend.scripted.prompts == ["Say hello"]
    kinds = [e["type"] for e in job.events]
    assert "response.incomplete" in kinds or "response.completed" in kinds


def test_stop_early_after_n_tokens(tmp_path):
    backend = ScriptedBackend(reply="a b c d e f g h i j k l m n o p")
    _, env = _run("stop_early.c", tmp_path, input={"stop_after": 4, "stop_at": ""}, backend=backend)
    r = env.result
    assert (r["stopped"], r["tokens_seen"], r["streamed"]) == (True, 4, "a b c d")
    assert r["text"].startswith("a b c d") and r["tokens_out"] <= 6


def test_stop_early_lets_a_short_answer_finish(tmp_path):
    _, env = _run("stop_early.c", tmp_path, input={"max_tokens": 3},
                  backend=ScriptedBackend(reply="no full stop here at all"))
    r = env.result
    assert (r["stopped"], r["text"], r["tokens_out"]) == (False, "no full stop", 3)


# --- streaming output --------------------------------------------------------------------------


def test_stream_echoes_staged_input_then_numbered_lines(tmp_path):
    staged = ("staged input é😀\n" * 500).encode()
    job, env = _run("stream.c", tmp_path, input={"lines": 200, "chunk": 4096}, input_bytes=staged)
    assert env.status == tj.JobStatus.COMPLETED, env
    lines = "".join(f"line {i}\n" for i in range(1, 201)).encode()
    chunks = [e for e in job.events if e["type"] == "job.chunk"]
    import base64

    streamed = b"".join(base64.b64decode(c["bytes_base64"]) for c in chunks)
    assert streamed == staged + lines
    assert env.result == {"bytes": len(staged) + len(lines), "chunks": len(chunks), "input_bytes": len(staged)}
    assert all(len(base64.b64decode(c["bytes_base64"])) <= 4096 for c in chunks)
    progress = [e["progress"] for e in job.events if e["type"] == "job.progress"]
    assert progress[-1] == {"done": len(staged) + len(lines), "total": len(staged) + len(lines)}
    assert job.stats.stream_bytes == len(staged) + len(lines)


def test_stream_with_nothing_to_say(tmp_path):
    job, env = _run("stream.c", tmp_path, input={})
    assert env.result == {"bytes": 0, "chunks": 0, "input_bytes": 0}
    assert not [e for e in job.events if e["type"] == "job.chunk"]


# --- replayed runs: the examples again, against their own recordings, with no model ------------------


def test_summarise_replays_to_the_same_summary_without_a_model(tmp_path):
    p = tmp_path / "doc.txt"
    p.write_text("".join(f"section{i} " + "text " * 150 for i in range(4)))
    backend = ScriptedBackend(reply=lambda prompt: "saw " + prompt.split("<document>\n", 1)[1].split()[0])
    job, env = _run("summarise.c", tmp_path, input={"path": str(p), "window": 1000}, backend=backend)
    asked = len(backend.scripted.prompts)
    report = tj.replay(EXAMPLES / "summarise.c", job.id, runs_dir=tmp_path / "runs", read=[tmp_path])
    assert report.same_result and report.result == env.result and report.divergence is None
    assert len(backend.scripted.prompts) == asked
    # A change to the guest's window shows where it first leaves the recording: its first slice.
    changed = tj.replay(EXAMPLES / "summarise.c", job.id, runs_dir=tmp_path / "runs", read=[tmp_path],
                        input={"path": str(p), "window": 800})
    assert changed.stopped and (changed.divergence.step, changed.divergence.why) == (2, "another window")


def test_stop_early_replays_its_stop_verdict_token_by_token(tmp_path):
    job, env = _run("stop_early.c", tmp_path, input={"prompt": "Say hello", "max_tokens": 40},
                    backend=ScriptedBackend(reply=LONG_REPLY))
    report = tj.replay(EXAMPLES / "stop_early.c", job.id, runs_dir=tmp_path / "runs")
    assert report.same_result and report.result == env.result
    assert report.result["streamed"] == "Hello there friend."


@pytest.mark.parametrize("guest", WORDCOUNTERS)
def test_wordcount_replays_reading_its_file_live(guest, tmp_path):
    p = tmp_path / "small.txt"
    p.write_bytes(LOREM.encode() * 50)
    job, env = _run(guest, tmp_path, input={"path": str(p), "window": 512})
    report = tj.replay(EXAMPLES / guest, job.id, runs_dir=tmp_path / "runs", read=[tmp_path])
    assert report.same_result and report.result == env.result
    p.write_bytes(LOREM.encode() * 49)  # the file changed since the run: seen where it is read
    assert tj.replay(EXAMPLES / guest, job.id, runs_dir=tmp_path / "runs",
                     read=[tmp_path]).divergence.why == "the world changed"


def test_stream_replays_with_its_staged_bytes(tmp_path):
    staged = b"staged input\n" * 10
    job, env = _run("stream.c", tmp_path, input={"lines": 20, "chunk": 64}, input_bytes=staged)
    report = tj.replay(EXAMPLES / "stream.c", job.id, runs_dir=tmp_path / "runs", input_bytes=staged)
    assert report.same_result
    chunks = lambda j: [e["bytes_base64"] for e in j.events if e["type"] == "job.chunk"]  # noqa: E731
    assert chunks(report.job) == chunks(job)


# --- the classifier: a label for each line, held to choices, a regex or a grammar ------------------------------

REVIEWS = "The soup was wonderful.\n\nService was slow and the bread stale.\r\nIt is a restaurant.\n"


def _label_by_words(prompt: str) -> str:
    line = prompt.rsplit("\n\n", 1)[1]
    return "negative" if "slow" in line else "positive" if "wonderful" in line else "neutral"


def test_classify_labels_each_non_blank_line_with_one_of_the_labels(tmp_path):
    p = tmp_path / "reviews.txt"
    p.write_text(REVIEWS)
    backend = ScriptedBackend(reply=_label_by_words)
    job, env = _run("classify.c", tmp_path, input={"path": str(p)}, backend=backend)
    assert env.status == tj.JobStatus.COMPLETED, env
    assert env.result == {"path": str(p), "lines": [{"line": 1, "label": "positive"}, {"line": 3, "label": "negative"},
                                                    {"line": 4, "label": "neutral"}],
                          "counts": {"positive": 1, "negative": 1, "neutral": 1}}
    task = "What is the sentiment of this line? Answer with one of: positive, negative, neutral."
    assert backend.scripted.prompts == [f"{task}\n\nThe soup was wonderful.",
                                        f"{task}\n\nService was slow and the bread stale.",  # without its \r
                                        f"{task}\n\nIt is a restaurant."]
    commands = [e["command"] for e in job.events if e["type"] == "response.created"]
    assert all(c["choices"] == ["positive", "negative", "neutral"] and c["max_tokens"] == len("positive") + 4
               for c in commands)
    progress = [e["progress"] for e in job.events if e["type"] == "job.progress"]
    assert progress[-1] == {"done": len(REVIEWS.encode()), "total": len(REVIEWS.encode())}


@pytest.mark.parametrize("asked, reply", [({"regex": "[1-5]", "task": "Rate it."}, "4"),
                                          ({"grammar": 'start: ("yes" | "no") " " /[a-z]+/'}, "no reason"),
                                          ({"labels": ["food", "service"], "max_lines": 2}, "food")],
                         ids=["regex", "grammar", "labels"])
def test_classify_holds_each_label_to_the_regex_grammar_or_labels_given(asked, reply, tmp_path):
    p = tmp_path / "reviews.txt"
    p.write_text(REVIEWS)
    backend = ScriptedBackend(reply=reply)
    job, env = _run("classify.c", tmp_path, input={"path": str(p), **asked}, backend=backend)
    assert env.status == tj.JobStatus.COMPLETED, env
    n = asked.get("max_lines", 3)
    assert env.result["lines"] == [{"line": i, "label": reply} for i in (1, 3, 4)[:n]]
    assert env.result["counts"] == {reply: n}
    created = [e for e in job.events if e["type"] == "response.created"]
    kind = next(k for k in ("regex", "grammar", "labels") if k in asked)
    field = "choices" if kind == "labels" else kind
    assert [e["command"][field] for e in created] == [asked[kind]] * n  # each infer held to what was asked
    assert [e["response"][field] for e in created] == [asked[kind]] * n  # and the response says so
    if "task" in asked:
        assert backend.scripted.prompts[0] == "Rate it.\n\nThe soup was wonderful."


def test_classify_fails_when_the_model_answers_outside_the_labels(tmp_path):
    """The host checks every finished answer: a model that could not be held to the choices is caught."""
    p = tmp_path / "reviews.txt"
    p.write_text(REVIEWS)
    _, env = _run("classify.c", tmp_path, input={"path": str(p)}, backend=ScriptedBackend(reply="mixed"))
    assert env.status == tj.JobStatus.FAILED
    assert env.error.code == "schema_validation_failed" and "choices" in env.error.message


def test_classify_refuses_two_kinds_of_label_at_once(tmp_path):
    p = tmp_path / "reviews.txt"
    p.write_text(REVIEWS)
    _, env = _run("classify.c", tmp_path, input={"path": str(p), "regex": "[0-9]", "labels": ["a"]},
                  backend=ScriptedBackend(reply="a"))
    assert (env.error.code, env.error.message) == ("schema_validation_failed", "give one of labels, regex and grammar")


def test_classify_reads_lines_across_windows_and_labels_a_line_longer_than_a_window_by_its_start(tmp_path):
    lines = [f"line {i} " + "é" * (300 + i) for i in range(1, 121)]
    lines[60] = "long " + "x" * 100_000  # over the 64 KiB window: labelled by its first window, the rest skipped
    p = tmp_path / "many.txt"
    p.write_text("\n".join(lines) + "\n")
    backend = ScriptedBackend(reply="neutral")
    job, env = _run("classify.c", tmp_path, input={"path": str(p), "max_lines": 1000}, backend=backend)
    assert env.status == tj.JobStatus.COMPLETED, env
    assert [line["line"] for line in env.result["lines"]] == list(range(1, 121))
    seen = [prompt.split("\n\n", 1)[1] for prompt in backend.scripted.prompts]
    assert seen[:60] == lines[:60] and seen[61:] == lines[61:]
    assert seen[60] == lines[60][:65536]
    assert job.stats.peak_memory_bytes <= 2 << 20


def test_classify_py_and_classify_c_make_the_same_commands_and_replay_each_others_runs(tmp_path):
    from python_guest_support import ensure_interpreter

    ensure_interpreter()
    p = tmp_path / "reviews.txt"
    p.write_text(REVIEWS)
    runs = {}
    for name in ("classify.c", "classify.py"):
        backend = ScriptedBackend(reply=_label_by_words)
        job, env = _run(name, tmp_path, input={"path": str(p), "labels": ["positive", "negative", "neutral"]},
                        backend=backend)
        assert env.status == tj.JobStatus.COMPLETED, env
        runs[name] = (job, env.result, backend.scripted.prompts,
                      [e["progress"] for e in job.events if e["type"] == "job.progress"])
    assert runs["classify.py"][1:] == runs["classify.c"][1:]
    report = tj.replay(EXAMPLES / "classify.py", runs["classify.c"][0].run_dir, read=[tmp_path])
    assert report.divergence is None and report.same_result

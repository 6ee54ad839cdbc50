"""Every job option, through every entry point: one table, the same meaning everywhere.

Each entry point -- ``tensorjob run`` and ``tensorjob map`` (as a subprocess),
``%%tensorjob``, ``%tensorjob run`` and ``%tensorjob map`` (in an IPython
shell), and ``tj.Job``/``tj.map`` (Python keywords) -- is given every option
of ``options.OPTIONS`` at once, each with a value other than its default, and
the job's own record of what it ran under (the ``job.created`` event of its
transcript) must show every one of them. ``--cflags`` is seen in the result:
the guest returns a number the flag defines. ``--debug`` and ``--break-on``
are seen in ``job.created``'s ``debug``; the job starts paused, so each entry
point is driven past the pause: a terminal's stdin is closed (the prompt then
lets the job run on), a magic's prompt is answered ``c`` (continue), and
Python calls ``job.resume()``.
"""

import dataclasses
import hashlib
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from IPython.core.error import UsageError
from IPython.testing import globalipapp

import tensorjob_jupyter as tj
from tensorjob_jupyter import limits as limits_table
from tensorjob_jupyter.record.transcript import read_run as load_transcript
from tensorjob_jupyter.frontends.cli import main as cli_main
from tensorjob_jupyter.frontends.options import BY_NAME, OPTIONS, JobOptions, OptionError, parse_bytes

GUEST_C = """#include "tensorjob.h"
tj_cmd guest_init(tj_json input) { return tj_done(tj_jsonf("{\\"answer\\":%d}", ANSWER)); }
tj_cmd guest_step(tj_event ev) { return tj_done(tj_jsonf("null")); }
"""


def distinct_limits() -> dict:
    """A valid value other than the default for every limit."""
    out = {}
    for name, f in limits_table.FIELDS.items():
        default = f.default
        if default is None:
            out[name] = 10**9
        elif f.metadata["unit"] == limits_table.SECONDS:
            out[name] = default + 1.5
        else:
            out[name] = default + 1
    return out


LIMITS = distinct_limits()


@pytest.fixture
def world(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_text("hello")
    (tmp_path / "staged.bin").write_bytes(b"staged bytes")
    (tmp_path / "other.gguf").write_bytes(b"GGUF not loaded unless a job infers")
    (tmp_path / "style.gguf").write_bytes(b"GGUF an adapter, not loaded unless a job infers")
    (tmp_path / "guest.c").write_text(GUEST_C)
    (tmp_path / "m.jsonl").write_text('{"i": 0}\n')
    return tmp_path


def flags(world, *, one_job: bool = True) -> list[str]:
    """Every option, as flags, each with a value other than its default."""
    argv = ["--read", str(world / "docs"), "--fetch", "http://127.0.0.1:9/docs", "--input-file", str(world / "staged.bin"),
            "--model", str(world / "other.gguf"), "--chat", "--temperature", "0.25", "--seed", "7",
            "--top-p", "0.5", "--repeat-penalty", "1.3", "--lora", f"style={world / 'style.gguf'}:0.5",
            "--no-prompt-cache",
            "--runs", str(world / "runs"), "--cflags=-DANSWER=42", "--zigflags=-fno-strip", "--force"]
    if one_job:
        argv += ["--input", '{"x": [1, "two"]}', "--debug", "--break-on", "infer,open", "--break-on", "fail"]
    for name, value in LIMITS.items():
        argv += [BY_NAME[name].flag, str(value)]
    return argv


def covered_by_flags() -> set[str]:
    return {o.name for o in OPTIONS}


def test_the_flags_above_name_every_option(world):
    given = {a.split("=")[0] for a in flags(world)}
    given |= {"--model-name", "--api-key-env"}  # a served model's (--model URL): tests/inference/test_served.py
    given |= {"--require-grounded", "--require-present", "--fail-item"}  # tests/frontends/test_sources.py
    assert {o.flag for o in OPTIONS} <= given  # a new option must be added to this test


#: A map's cascade flags (``flags.CASCADE_FLAGS``): tests/fanout/test_cascade.py runs them; here, that each is
#: in both option tables and reaches the map from both the command line and the magic.
CASCADE = {"--cascade": "big.gguf", "--target": "0.9", "--delta": "0.1", "--cascade-on": "vendor,total",
           "--cascade-score": "min_confidence", "--cascade-sample": "30", "--target-against": "oracle",
           "--mixed-models": None}


def test_the_cascade_flags_are_listed_documented_and_reach_the_map_everywhere(ip, world, monkeypatch):
    from tensorjob_jupyter.frontends.flags import CASCADE_FLAGS

    assert [f.flag for f in CASCADE_FLAGS] == list(CASCADE)  # a new flag must be added to this test
    root = Path(__file__).resolve().parents[2]
    for page in (root / "README.md", root / "docs" / "notebook.md"):
        table = page.read_text(encoding="utf-8")
        assert all(f"`{flag}" in table for flag in CASCADE), page
    monkeypatch.chdir(world)
    for flag, value in CASCADE.items():
        if flag in ("--cascade", "--mixed-models"):
            continue
        given = [flag, value]  # without --cascade, the map names the flag it cannot use alone
        out, err = io.StringIO(), io.StringIO()
        argv = ["map", "guest.c", "--over", "m.jsonl", "--run-dir", "run", "--cflags=-DANSWER=1", *given]
        assert cli_main(argv, out=out, err=err) == 2, err.getvalue()
        assert f"{flag} goes with --cascade MODEL" in err.getvalue()
        with pytest.raises(UsageError, match=f"{flag} goes with --cascade MODEL"):
            ip.run_line_magic("tensorjob", " ".join(argv[:-2] + [flag, value]))


def check_created(created: dict, world, *, one_job: bool = True) -> None:
    """The job's record shows every option's value."""
    assert created["limits"] == {**tj.Limits().to_json(), **LIMITS}
    assert created["grants"] == [str((world / "docs").resolve())]
    assert created["fetch"] == ["http://127.0.0.1:9/docs"]
    assert created["input_bytes"] == {"bytes": 12, "sha256": hashlib.sha256(b"staged bytes").hexdigest()}
    assert created["model"] == "other"
    assert created["infer"]["chat"] is True
    sampler = created["infer"]["sampler"]
    assert sampler["temperature"] == 0.25 and sampler["seed"] == 7
    assert sampler["top_p"] == 0.5 and sampler["repeat_penalty"] == 1.3
    assert created["infer"]["lora"] == [{"name": "style", "scale": 0.5}]
    assert created["infer"]["cache_prompt"] is False
    if one_job:
        assert created["input"] == {"x": [1, "two"]}
        assert created["debug"] == {"start_paused": True, "break_on": ["fail", "infer", "open"],
                                    "max_paused_s": LIMITS["max_paused_s"]}
    else:
        assert "debug" not in created  # a map does not debug its items


def transcripts(runs: Path) -> list[dict]:
    """The job.created event of every transcript under ``runs``."""
    return [load_transcript(d)[0][0] for d in sorted(runs.iterdir()) if (d / "events.jsonl").exists()]


def cli(*argv, cwd):
    return subprocess.run([sys.executable, "-m", "tensorjob_jupyter.frontends.cli", *argv], capture_output=True, text=True,
                          cwd=cwd, timeout=300, stdin=subprocess.DEVNULL)


@pytest.mark.slow
def test_every_option_through_tensorjob_run(world):
    done = cli("run", str(world / "guest.c"), *flags(world), "--json", cwd=world)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["result"] == {"answer": 42}
    [created] = transcripts(world / "runs")
    check_created(created, world)


@pytest.mark.slow
def test_every_option_through_tensorjob_map(world):
    done = cli("map", str(world / "guest.c"), "--over", str(world / "m.jsonl"), "--run-dir", str(world / "run"),
               *flags(world, one_job=False), "--quiet", cwd=world)
    assert done.returncode == 0, done.stderr
    assert json.loads((world / "run" / "results.jsonl").read_text())["result"] == {"answer": 42}
    [created] = transcripts(world / "runs")  # --runs: the items' transcripts go there
    check_created(created, world, one_job=False)


@pytest.fixture(scope="module")
def ip():
    globalipapp.start_ipython()  # once per process; later calls do nothing
    shell = globalipapp.get_ipython()
    shell.run_line_magic("load_ext", "tensorjob_jupyter")
    return shell


def magic_line(world, *, one_job=True) -> str:
    return " ".join(f"'{a}'" if " " in a or "{" in a else a for a in flags(world, one_job=one_job))


@pytest.fixture
def answer_continue(monkeypatch):
    """The magics' debug prompt (no widgets here) is answered ``c``: continue."""
    from tensorjob_jupyter.frontends import magic

    answers = []
    monkeypatch.setattr(magic, "_input_line", lambda: answers.append("c") or "c")
    return answers


def test_every_option_through_the_cell_magic(ip, world, monkeypatch, answer_continue):
    monkeypatch.chdir(world)
    value = ip.run_cell_magic("tensorjob", magic_line(world) + " --quiet", GUEST_C)
    assert value.result == {"answer": 42}  # the value is the envelope (issue 23)
    [created] = transcripts(world / "runs")
    check_created(created, world)
    assert answer_continue == ["c"]  # paused once, before cf_init


def test_every_option_through_the_line_magics(ip, world, monkeypatch, answer_continue):
    monkeypatch.chdir(world)
    assert ip.run_line_magic("tensorjob", f"run guest.c {magic_line(world)} --quiet").result == {"answer": 42}
    result = ip.run_line_magic("tensorjob", f"map guest.c --over m.jsonl --run-dir run "
                                            f"{magic_line(world, one_job=False)} --quiet")
    assert result.completed == 1
    run_created, map_created = sorted(transcripts(world / "runs"), key=lambda e: "[" in e["name"])
    check_created(run_created, world)
    check_created(map_created, world, one_job=False)


def test_traitlets_give_the_defaults_and_flags_override_them(ip, world, monkeypatch):
    monkeypatch.chdir(world)
    magics = ip.magics_manager.registry["TensorJob"]
    monkeypatch.setattr(magics, "max_steps", 77)
    monkeypatch.setattr(magics, "runs_dir", str(world / "runs"))
    assert ip.run_cell_magic("tensorjob", "--cflags=-DANSWER=1 --max-handles 9 --quiet", GUEST_C).result == {"answer": 1}
    [created] = transcripts(world / "runs")
    assert created["limits"]["max_steps"] == 77 and created["limits"]["max_handles"] == 9


def test_every_option_as_a_python_keyword(world, monkeypatch):
    monkeypatch.chdir(world)
    options = JobOptions(read=(str(world / "docs"),), fetch=("http://127.0.0.1:9/docs",), input={"x": [1, "two"]}, input_file=str(world / "staged.bin"),
                         model=str(world / "other.gguf"), chat=True, temperature=0.25, seed=7, top_p=0.5,
                         repeat_penalty=1.3, lora=(f"style={world / 'style.gguf'}:0.5",), no_prompt_cache=True,
                         runs=str(world / "runs"), cflags=("-DANSWER=42",), limits=tj.Limits(**LIMITS))
    assert options.spec(options.guest(world / "guest.c")).debug is False
    options = dataclasses.replace(options, debug=True, break_on=("infer", "open", "fail"))
    job = tj.Job(options.spec(options.guest(world / "guest.c"))).start()
    assert job.wait_paused(30)["step"] == 0
    job.resume()
    envelope = job.wait(30)
    assert envelope.result == {"answer": 42}
    # ...and limits as plain keywords, without building a Limits.
    job = tj.Job(options.guest(world / "guest.c"), runs_dir=world / "runs", **LIMITS)
    assert job.limits == tj.Limits(**LIMITS)
    tj.map(options.map_spec(options.guest(world / "guest.c")), [{"i": 0}], world / "run")
    created = transcripts(world / "runs")
    [run_created] = [e for e in created if "[" not in e["name"] and e["grants"]]
    [map_created] = [e for e in created if "[" in e["name"]]
    check_created(run_created, world)
    check_created(map_created, world, one_job=False)


def test_an_unknown_keyword_names_the_limits():
    with pytest.raises(TypeError, match="max_tokens"):
        tj.Job(b"\0asm\1\0\0\0", max_tokenz=3)


@pytest.mark.parametrize("flag, value, message", [
    ("--max-tokens", "0", "--max-tokens must be a positive number"),
    ("--max-tokens", "many", "--max-tokens: 'many' is not a whole number"),
    ("--timeout", "-1", "--timeout must be a positive number"),
    ("--memory-bytes", "lots", "--memory-bytes: 'lots' is not a size"),
    ("--call-timeout", "0", "--call-timeout must be a positive number"),
    ("--input", "{nope", "--input is not valid JSON"),
    ("--break-on", "infer,inferr", "--break-on: 'inferr' is not a command"),
    ("--input", '"\\ud800"', "not valid Unicode"),
    ("--read", "/no/such", "--read /no/such: no such file or directory"),
    ("--model", "/no/model.gguf", "--model /no/model.gguf: model file not found"),
    ("--model", "hf:nope", "--model: 'hf:nope': the repository must be ORG/REPO"),
    ("--top-p", "0", "--top-p 0.0: must be over 0 and at most 1"),
    ("--temperature", "-1", "--temperature -1.0: must be at least 0"),
    ("--lora", "nonsense", "--lora nonsense: expected NAME=PATH or NAME=PATH:SCALE"),
    ("--lora", "a=/no/adapter.gguf", "--lora a=/no/adapter.gguf: adapter file not found"),
])
def test_a_bad_option_is_the_same_one_line_everywhere(ip, world, monkeypatch, flag, value, message):
    monkeypatch.chdir(world)
    # the command line in this process, as tests/frontends/test_cli.py runs it (a subprocess per row costs seconds;
    # the console script as a subprocess is tested there and by the every-option tests above)
    out, err = io.StringIO(), io.StringIO()
    code = cli_main(["run", "guest.c", flag, value], out=out, err=err)
    assert code == 2 and out.getvalue() == ""
    assert err.getvalue().count("\n") == 1 and message in err.getvalue()
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace("\\u", "\\\\u")):
        ip.run_cell_magic("tensorjob", f"{flag} '{value}'", GUEST_C)


def test_sizes_take_binary_units():
    assert parse_bytes("4096") == 4096 and parse_bytes("64KiB") == 65536 and parse_bytes("1.5MiB") == 1572864
    assert parse_bytes("2G") == 2 << 30
    with pytest.raises(ValueError):
        parse_bytes("1.0000001KiB")


def test_a_notebook_variable_is_an_input_only_in_a_notebook(ip, world):
    ip.user_ns["params"] = {"n": 3}
    args = type("A", (), {"input": "$params"})()
    assert JobOptions.from_args(args, variables=ip.user_ns).input == {"n": 3}
    with pytest.raises(OptionError, match="only in a notebook"):
        JobOptions.from_args(args)

"""The magics in a real (terminal) IPython shell: options, values, summaries, compile errors."""


import pytest
from IPython.core.error import UsageError
from IPython.testing import globalipapp

import tensorjob_jupyter as tj
from tensorjob_jupyter.sandbox import compile as tj_compile
from tensorjob_jupyter.frontends.magic import TensorJob
from tensorjob_jupyter.frontends.outcome import GuestDoesNotCompile, JobFailed

import wat


@pytest.fixture(scope="module")
def ip():
    globalipapp.start_ipython()  # once per process; later calls do nothing
    shell = globalipapp.get_ipython()
    shell.run_line_magic("load_ext", "tensorjob_jupyter")
    yield shell


def echo_wat() -> str:
    """A WAT guest whose result is its input: cf_init returns done wrapping the input bytes."""
    prefix = b'{"cmd":"done","result":'
    p_hex = "".join(f"\\{b:02x}" for b in prefix)
    return f"""(module
  (memory (export "memory") 2)
  (data (i32.const 64) "{p_hex}")
  (func (export "cf_alloc") (param $n i32) (result i32) (i32.const {64 + len(prefix)}))
  (func (export "cf_init") (param $p i32) (param $n i32) (result i32)
    (i32.store8 (i32.add (local.get $p) (local.get $n)) (i32.const 125))
    (i32.store (i32.const 16) (i32.const 64))
    (i32.store (i32.const 20) (i32.add (local.get $n) (i32.const {len(prefix) + 1})))
    (i32.const 16))
  (func (export "cf_step") (param i32 i32) (result i32) (i32.const 16)))"""


def test_a_cell_runs_and_its_value_is_the_envelope(ip, capsys):
    value = ip.run_cell_magic("tensorjob", '--input \'{"n": [1, 2]}\'', echo_wat())
    assert isinstance(value, tj.Envelope) and value.ok and value.result == {"n": [1, 2]}
    out = capsys.readouterr().out
    assert out.startswith("tensorjob cell.wat: completed\n")
    assert '"n": [' in out
    assert "tokens" not in out  # the job never asked the model anything


def test_input_from_a_notebook_variable(ip):
    ip.user_ns["params"] = {"path": "x.txt", "depth": 3}
    assert ip.run_cell_magic("tensorjob", "--input $params --quiet", echo_wat()).result == {"path": "x.txt", "depth": 3}


def test_out_stores_the_envelope(ip):
    ip.run_cell_magic("tensorjob", '--input \'"stored"\' --out answer --quiet', echo_wat())
    assert ip.user_ns["answer"].result == "stored"


def test_bg_returns_the_job_at_once(ip):
    job = ip.run_cell_magic("tensorjob", "--bg --quiet --out later", wat.script_wat([{"cmd": "done", "result": 7}]))
    assert isinstance(job, tj.Job)
    assert job.wait(10).result == 7
    assert ip.user_ns["later"].result == 7


def test_two_background_jobs_run_at_once(ip):
    jobs = [ip.run_cell_magic("tensorjob", "--bg --quiet", wat.script_wat([{"cmd": "emit", "progress": 1},
                                                                           {"cmd": "done", "result": i}]))
            for i in range(2)]
    assert [j.wait(10).result for j in jobs] == [0, 1]


def test_a_failed_job_shows_its_error_then_raises_a_short_one(ip, capsys):
    failing = wat.script_wat([{"cmd": "fail", "code": "not_found", "message": "gone"}])
    with pytest.raises(JobFailed) as info:
        ip.run_cell_magic("tensorjob", "--out kept", failing)
    assert "failed\nerror: not_found: gone\n" in capsys.readouterr().out  # the summary (the view) first
    assert info.value._render_traceback_() == ["JobFailed: cell.wat failed: not_found: gone"]
    assert info.value.code == "not_found" and isinstance(info.value, tj.abi.JobFailure)
    assert ip.user_ns["kept"].error.message == "gone"  # --out is set whatever the outcome
    value = ip.run_cell_magic("tensorjob", "--no-raise --quiet", failing)
    assert value.status is tj.JobStatus.FAILED and value.error.code == "not_found"


@pytest.mark.parametrize("line, fragment", [
    ("--bogus", "unrecognized arguments: --bogus"),
    ("--input {nope", "--input is not valid JSON"),
    ("--input $missing_var", "no variable named 'missing_var'"),
    ("--read /no/such/place", "--read /no/such/place: no such file or directory"),
    ("--max-tokens -4", "--max-tokens must be a positive number"),
    ("--model /no/model.gguf", "model file not found"),
    ("--lang fortran", "invalid choice: 'fortran'"),
])
def test_bad_options_are_one_usage_error(ip, line, fragment):
    with pytest.raises(UsageError) as info:
        ip.run_cell_magic("tensorjob", line, echo_wat())
    assert fragment in str(info.value)


def test_line_magic_runs_a_file_lists_and_cancels(ip, tmp_path, capsys):
    guest = tmp_path / "g.wat"
    guest.write_text(wat.script_wat([{"cmd": "done", "result": "from file"}]))
    assert ip.run_line_magic("tensorjob", f"run {guest} --quiet").result == "from file"
    ip.run_line_magic("tensorjob", "jobs")
    assert "completed  g.wat" in capsys.readouterr().out
    spin = tmp_path / "spin.wasm"
    spin.write_bytes(wat.spin_in_step())
    job = ip.run_line_magic("tensorjob", f"run {spin} --bg --quiet")
    ip.run_line_magic("tensorjob", f"cancel {job.id}")
    assert job.wait(5).status is tj.JobStatus.CANCELLED
    with pytest.raises(UsageError, match="no job with id"):
        ip.run_line_magic("tensorjob", "cancel nope")
    with pytest.raises(UsageError, match="guest file not found"):
        ip.run_line_magic("tensorjob", "run /no/guest.wasm")


def test_compile_errors_show_the_cells_own_line_numbers(ip, capsys):
    cell = "#include <tensorjob.h>\nint x = ;\n"
    with pytest.raises(GuestDoesNotCompile) as info:
        ip.run_cell_magic("tensorjob", "--lang c", cell)
    err = capsys.readouterr().err
    assert "cell.c:3:" in err  # line 1 of the cell is the %%tensorjob line
    assert "Traceback" not in err
    assert info.value._render_traceback_() == [
        "GuestDoesNotCompile: the guest does not compile (the compiler's message is above)"]


def test_an_unchanged_cell_reuses_the_compiled_guest(ip):
    cell = wat.script_wat([{"cmd": "done", "result": "cached"}]) + "\n;; unique 8c1f"
    ip.run_cell_magic("tensorjob", "--quiet", cell)
    hits = tj_compile.stats.cache_hits
    assert ip.run_cell_magic("tensorjob", "--quiet", cell).result == "cached"
    assert tj_compile.stats.cache_hits == hits + 1


def test_configuration_through_traitlets(ip):
    ip.run_line_magic("config", "TensorJob.max_tokens = 1234")
    magics = ip.magics_manager.registry["TensorJob"]
    assert magics.max_tokens == 1234
    ip.run_line_magic("config", "TensorJob.max_tokens = 32768")
    names = TensorJob.class_trait_names(config=True)
    for name in ("model_path", "runs_dir", "refresh_hz", "call_timeout_s", "job_timeout_s", "memory_bytes",
                 "max_tokens"):
        assert name in names


def test_help_is_real(ip):
    doc = TensorJob.tensorjob_cell.__doc__
    for option in ("--read", "--input", "--max-tokens", "--timeout", "--model", "--chat", "--out", "--bg",
                   "--quiet", "--lang"):
        assert option in doc
    assert "run PATH" in TensorJob.tensorjob_line.__doc__
    assert ip.find_magic("tensorjob", "cell").__doc__ == doc
    # %tensorjob? and %%tensorjob? show the usage under the names people type
    assert "\n  %tensorjob [" in TensorJob.tensorjob_line.__doc__ and "tensorjob_line" not in TensorJob.tensorjob_line.__doc__
    assert "\n  %%tensorjob [" in doc and "tensorjob_cell" not in doc


def test_map_from_the_magic_with_its_summary(ip, tmp_path, capsys):
    guest = tmp_path / "g.wat"
    guest.write_text(wat.script_wat([{"cmd": "done", "result": "item"}]))
    manifest = tmp_path / "m.jsonl"
    manifest.write_text('{"a": 1}\n\n{"a": 2}\n{"a": 3}\n')
    result = ip.run_line_magic("tensorjob", f"map {guest} --over {manifest} --run-dir {tmp_path / 'run'}")
    assert result.ok and result.completed == 3
    assert capsys.readouterr().out == ("tensorjob map g.wat: finished\n"
                                       "items: 3 (3 completed, 0 failed, 0 skipped before this run)\n")
    again = ip.run_line_magic("tensorjob", f"map {guest} --over {manifest} --run-dir {tmp_path / 'run'} --quiet")
    assert again.skipped == 3 and again.completed == 3
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"a": 1}\n{oops\n')
    with pytest.raises(UsageError, match="line 2"):
        ip.run_line_magic("tensorjob", f"map {guest} --over {bad} --run-dir {tmp_path / 'run2'}")
    with pytest.raises(UsageError, match="--over MANIFEST and --run-dir"):
        ip.run_line_magic("tensorjob", f"map {guest}")


def test_fetch_grants_from_the_magic(ip):
    cell = wat.script_wat([{"cmd": "fetch", "url": "https://example.org.evil/"}, {"cmd": "done", "result": 1}])
    job = ip.run_cell_magic("tensorjob", "--fetch https://example.org/ --bg --quiet", cell)
    env = job.wait(30)
    assert env.error.code == "capability_denied" and job.events[0]["fetch"] == ["https://example.org/"]
    with pytest.raises(UsageError, match="--fetch: fetch grant 'ftp://x/'"):
        ip.run_cell_magic("tensorjob", "--fetch ftp://x/", cell)


def test_the_history_subcommands_check_what_the_commands_check(ip):
    """``%tensorjob runs|show|replay`` do their work through history_cli's functions: the same checks, the same
    one-line errors as ``tensorjob runs|show|replay``."""
    import io

    from tensorjob_jupyter.frontends.cli import main

    for argv, line in [(["show", "x", "--speed", "-1"], "show x --speed -1"),
                       (["runs", "--limit", "-1"], "runs --limit -1")]:
        err = io.StringIO()
        assert main(argv, out=io.StringIO(), err=err) == 2
        with pytest.raises(UsageError) as info:
            ip.run_line_magic("tensorjob", line)
        assert err.getvalue() == f"tensorjob: error: {info.value}\n"

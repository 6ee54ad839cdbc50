"""A map's and a replay's flags, one table (``frontends/flags.py``), two doors: ``tensorjob`` and ``%tensorjob``.

Every row of the table is parsed through both doors -- the argparse parser ``tensorjob map``/``replay`` builds
(``cli.build_parser``) and the magic's (``TensorJob.tensorjob_line.parser``) -- with a value other than its
default, and the namespaces must hold the same value. Each door's flags are the table's plus a short list of its
own, so a flag added to one door only fails here. And a flag given where it does not belong (``--run-dir`` on a
replay without ``--map``, a map's flag on a run) is refused by both doors, or by neither.
"""

from __future__ import annotations

import argparse
import io
import re

import pytest
from IPython.core.error import UsageError
from IPython.testing import globalipapp

from tensorjob_jupyter.abi import OptionError
from tensorjob_jupyter.frontends.cli import build_parser
from tensorjob_jupyter.frontends.cli import main as cli_main
from tensorjob_jupyter.frontends.flags import (
    CASCADE_FLAGS, FLAGS, MAP, REPLAY, REPLAY_MAP, REPLAY_MAP_LIVE, Flag, add_arguments, of_command,
)
from tensorjob_jupyter.frontends.magic import TensorJob
from tensorjob_jupyter.frontends.options import add_job_arguments

GUEST = "missing.wasm"  # never loaded: a flag is read, and refused or not, before the guest
#: The least each place needs (a map its manifest and folder, a replay its recording), by where a flag belongs.
BASE = {MAP: ["map", GUEST, "--over", "m.jsonl", "--run-dir", "run"], REPLAY: ["replay", GUEST, "--from", "r"],
        REPLAY_MAP: ["replay", GUEST, "--map", "rd"], REPLAY_MAP_LIVE: ["replay", GUEST, "--map", "rd", "--live"]}

#: What each door has besides the table and the job options (``options.OPTIONS``): its output, its other actions.
CLI_OWN = {"map": {"-h", "--help", "--json", "--quiet", "-q"},
           "replay": {"-h", "--help", "--events", "--json", "--quiet", "-q"}}
MAGIC_OWN = {"-h", "--help", "--speed", "--limit", "--table", "--status", "--prune",  # runs, show, review
             "--lang", "--out", "--bg", "--quiet", "--no-raise"}  # magic.shared_arguments


@pytest.fixture(scope="module")
def ip():
    globalipapp.start_ipython()  # once per process; later calls do nothing
    shell = globalipapp.get_ipython()
    shell.run_line_magic("load_ext", "tensorjob_jupyter")
    return shell


def sample(f: Flag) -> list[str]:
    """A value other than ``f``'s default, as the flag and its text."""
    if f.switch:
        return [f.flag]
    if f.choices:
        return [f.flag, f.choices[-1]]
    return [f.flag, {int: "7", float: "0.25", None: f"some-{f.name}"}.get(f.type, "3")]


def argv(where: str, given: list[str]) -> list[str]:
    """``BASE[where]`` with ``given`` (a base flag given again replaces the base's value)."""
    base = BASE[where]
    if given and given[0] in base:
        i = base.index(given[0])
        base = base[:i] + base[i + 2:]
    return base + given


def cli_parse(line: list[str]) -> argparse.Namespace:
    return build_parser().parse_args(line)


def magic_parse(line: list[str]) -> argparse.Namespace:
    return TensorJob.tensorjob_line.parser.parse_args(line)


def subparser(command: str) -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[command]


def flags_of(parser: argparse.ArgumentParser) -> set[str]:
    return {s for action in parser._actions for s in action.option_strings}


def job_flags() -> set[str]:
    """Every job option's flags (``options.OPTIONS``: ``--chat`` and ``--no-chat``, ...)."""
    parser = argparse.ArgumentParser(add_help=False)
    add_job_arguments(parser)
    return flags_of(parser)


JOB_FLAGS = job_flags()


def off_table(parser: argparse.ArgumentParser, own: set[str], table: set[str]) -> tuple[set[str], set[str]]:
    """The parser's flags that are neither the table's, the job options' nor its own; the table's it lacks."""
    have = flags_of(parser) - JOB_FLAGS - own
    return have - table, table - have


CASES = [(where, f) for f in FLAGS for where in f.where]


@pytest.mark.parametrize("where,f", CASES, ids=[f"{w.replace(' ', '_')}:{f.flag}" for w, f in CASES])
def test_every_flag_reads_the_same_through_both_doors(where, f):
    line = argv(where, sample(f))
    cli, magic = cli_parse(line), magic_parse(line)
    value = getattr(cli, f.name)
    assert value is not f.default, (line, value)  # the flag was read, not left at its default
    assert value == getattr(magic, f.name) and type(value) is type(getattr(magic, f.name)), (line, value)


@pytest.mark.parametrize("where", list(BASE))
def test_every_flag_a_door_leaves_out_has_the_same_default_in_both(where):
    cli, magic = cli_parse(BASE[where]), magic_parse(BASE[where])
    for f in of_command(where.split()[0]):
        assert getattr(cli, f.name) == getattr(magic, f.name), f.flag


@pytest.mark.parametrize("where,value", [(MAP, "auto"), (REPLAY_MAP, "auto"), (REPLAY_MAP, "2")])
def test_concurrency_takes_auto_or_a_number_through_both_doors(where, value):
    line = argv(where, ["--concurrency", value])
    assert cli_parse(line).concurrency == magic_parse(line).concurrency == (value if value == "auto" else 2)


TYPED = [(where, f) for where, f in CASES if f.type is not None or f.choices]


@pytest.mark.parametrize("where,f", TYPED, ids=[f"{w.replace(' ', '_')}:{f.flag}" for w, f in TYPED])
def test_a_bad_value_is_refused_by_both_doors(where, f):
    line = argv(where, [f.flag, "0" if f.flag == "--concurrency" else "not-a-value"])
    with pytest.raises(OptionError, match=f.flag):
        cli_parse(line)
    with pytest.raises(UsageError, match=f.flag):
        magic_parse(line)


def test_each_door_s_map_and_replay_flags_are_the_table_s():
    table = {command: {f.flag for f in of_command(command)} for command in ("map", "replay")}
    assert table["map"] and table["replay"] and table["map"] | table["replay"] == {f.flag for f in FLAGS}
    for command in ("map", "replay"):
        assert off_table(subparser(command), CLI_OWN[command], table[command]) == (set(), set()), command
    assert off_table(TensorJob.tensorjob_line.parser, MAGIC_OWN, {f.flag for f in FLAGS}) == (set(), set())


def test_a_flag_added_to_one_door_only_is_caught():
    planted = argparse.ArgumentParser()
    add_arguments(planted, "map")
    add_job_arguments(planted, one_job=False)
    assert off_table(planted, CLI_OWN["map"], {f.flag for f in of_command("map")}) == (set(), set())
    planted.add_argument("--one-door-only")
    assert off_table(planted, CLI_OWN["map"], {f.flag for f in of_command("map")}) == ({"--one-door-only"}, set())
    bare = argparse.ArgumentParser()
    add_arguments(bare, "map", CASCADE_FLAGS)  # a door that forgot the rest of the table
    assert "--over" in off_table(bare, set(), {f.flag for f in of_command("map")})[1]


def test_the_magic_s_help_says_where_each_flag_belongs_and_a_command_s_help_does_not_repeat_it():
    magic = " ".join((TensorJob.tensorjob_line.__doc__ or "").split())  # the help, unwrapped
    assert "map: where results.jsonl" in magic and "replay --map: the replay's own run folder" in magic
    assert "replay: the recorded run" in magic
    run_dir = next(f for f in FLAGS if f.flag == "--run-dir")
    assert run_dir.help_for("map").startswith("where results.jsonl") and "replay" not in run_dir.help_for("map")
    assert run_dir.help_for("replay").startswith("replay --map: the replay's own")
    assert next(f for f in FLAGS if f.flag == "--live").help_for("replay").startswith("from the first divergence")


# --- a flag where it does not belong: both doors refuse it, or neither --------------------------------------

#: Where a flag may be given, as each door's line; ``run`` takes none of the table's flags.
PLACES = {"run": ["run", GUEST], "map": BASE[MAP], "replay --from": BASE[REPLAY], "replay --map": BASE[REPLAY_MAP]}


def cli_refusal(line: list[str]) -> str:
    out, err = io.StringIO(), io.StringIO()
    assert cli_main(line, out=out, err=err) != 0, line  # the guest is missing: nothing runs either way
    return err.getvalue()


def magic_refusal(ip, line: list[str]) -> str:
    with pytest.raises(UsageError) as refused:
        ip.run_line_magic("tensorjob", " ".join(line))
    return str(refused.value)


def refused_for_its_place(message: str, flag: str) -> bool:
    """``message`` refuses ``flag`` where it was given (flags.check_placed's words, or argparse's); a flag's
    other checks (``--recorded-grants`` without ``--live``) are not about its place."""
    return re.search(rf"{flag} is for (map|replay)\b", message) is not None or \
        ("unrecognized arguments" in message and flag in message)


@pytest.mark.parametrize("place", list(PLACES))
def test_a_flag_out_of_its_place_is_refused_by_both_doors_or_neither(ip, place, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for f in FLAGS:
        line = PLACES[place] + (sample(f) if sample(f)[0] not in PLACES[place] else [])
        cli, magic = cli_refusal(line), magic_refusal(ip, line)
        assert refused_for_its_place(cli, f.flag) == refused_for_its_place(magic, f.flag), (line, cli, magic)
        belongs = {"run": False, "map": MAP in f.where, "replay --from": REPLAY in f.where,
                   "replay --map": bool({REPLAY, REPLAY_MAP, REPLAY_MAP_LIVE} & set(f.where))}[place]
        assert refused_for_its_place(magic, f.flag) == (not belongs), (line, magic)


REPLAY_MAP_ONLY = [f for f in FLAGS if REPLAY not in f.where and {REPLAY_MAP, REPLAY_MAP_LIVE} & set(f.where)]


@pytest.mark.parametrize("f", REPLAY_MAP_ONLY, ids=[f.flag for f in REPLAY_MAP_ONLY])
def test_a_replay_without_map_refuses_a_map_replay_s_flag_in_the_same_words_in_both_doors(ip, f, tmp_path,
                                                                                             monkeypatch):
    monkeypatch.chdir(tmp_path)
    line = BASE[REPLAY] + sample(f)
    says = f"{f.flag} is for replay --map RUN_DIR" + (" --live" if REPLAY_MAP_LIVE in f.where else "")
    cli = cli_refusal(line)
    assert cli == f"tensorjob: error: {says}\n"
    assert magic_refusal(ip, line) == says


def test_the_map_replay_only_flags_are_the_ones_the_issue_names():
    assert {f.flag for f in REPLAY_MAP_ONLY} >= {"--run-dir", "--concurrency", "--deterministic", "--fail-under",
                                                 "--expected", "--scorer", "--rerun"}


@pytest.mark.parametrize("missing", ["--over", "--run-dir"])
def test_a_map_without_what_it_needs_is_refused_by_both_doors(ip, missing, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    line = [a for i, a in enumerate(BASE[MAP]) if missing not in BASE[MAP][max(i - 1, 0):i + 1]]
    assert missing not in line and len(line) == len(BASE[MAP]) - 2
    assert missing in cli_refusal(line)
    assert "map needs --over MANIFEST and --run-dir DIR" in magic_refusal(ip, line)

"""README claims only what the code has: every limit, option and error code it names is real, and back."""

import re
from pathlib import Path

from tensorjob_jupyter import abi
from tensorjob_jupyter.limits import FIELDS
from tensorjob_jupyter.frontends.options import OPTIONS

README = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")


def section(title: str) -> str:
    return README.split(f"## {title}", 1)[1].split("\n## ", 1)[0]


def test_the_limits_table_is_the_limits_dataclass():
    table = section("Limits and the security model")
    named = set(re.findall(r"^\| `(\w+)`(?: / `(\w+)`)?", table, re.M))
    named = {n for pair in named for n in pair if n}
    assert named == set(FIELDS)


def test_every_job_option_is_documented():
    options = section("In a notebook")
    for opt in OPTIONS:
        if not opt.is_limit:
            assert f"`{opt.flag}" in options, opt.flag


def test_the_error_codes_listed_are_the_codes():
    text = section("Limits and the security model")
    listed = set(re.findall(r"`([a-z_]+)`", text.split("Error codes are", 1)[1].split("\n\n", 1)[0]))
    assert abi.ERROR_CODES <= listed

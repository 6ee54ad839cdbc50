"""README claims only what the code has: every option it names is real (and back), every model reference
parses, every page it links to exists. The limits and error codes moved to docs/limits.md with the reference
sections; tests/test_docs.py checks them there."""

import re
from pathlib import Path

from tensorjob_jupyter.frontends.options import OPTIONS
from tensorjob_jupyter.inference import hub

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def section(title: str) -> str:
    return README.split(f"## {title}", 1)[1].split("\n## ", 1)[0]


def test_every_job_option_is_documented():
    options = section("In a notebook")
    for opt in OPTIONS:
        if not opt.is_limit:
            assert f"`{opt.flag}" in options, opt.flag


def test_the_models_it_names_are_references_the_host_reads():
    named = set(re.findall(r"`(hf:[^`]+)`", section("The model: tiny by default, a better one in one step")))
    assert len(named) == 3
    for ref in named:
        assert hub.parse_ref(ref).selector == "Q4_K_M"


def test_every_page_it_links_to_is_there():
    linked = re.findall(r"\]\((docs/[^)#]+)\)", README)
    assert len(set(linked)) >= 9
    for path in linked:
        assert (ROOT / path).is_file(), path


NUMBER_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
                "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen", "twenty"]


def test_the_tutorials_listed_are_the_notebooks_in_order_and_no_page_miscounts_them():
    notebooks = sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))
    listed = re.findall(r"^\d+\. \[[^\]]+\]\(notebooks/([^)]+\.ipynb)\)", README, re.M)
    assert listed == notebooks
    for path in [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "binder").glob("*")]:
        text = path.read_text(encoding="utf-8", errors="replace").lower()
        for number in re.findall(r"\b(\w+) (?:tutorials|tutorial notebooks)\b", text):
            if number in NUMBER_WORDS or number.isdigit():
                count = NUMBER_WORDS.index(number) if number in NUMBER_WORDS else int(number)
                assert count == len(notebooks), f"{path.name} says {number} tutorials; there are {len(notebooks)}"


def test_it_stays_a_front_door_under_350_lines():
    """Detail belongs in docs/: the README says what the project is, how to start and where to read on."""
    lines = README.count("\n")
    assert lines < 350, f"README.md has {lines} lines; move detail into docs/"

"""The documentation site: it builds with every warning an error, and claims only what the code has.

``docs/`` is a MkDocs site (``mkdocs.yml`` at the root; the Python API page is
made from the docstrings by mkdocstrings). A broken link between pages, a
page missing from the navigation or a docstring mkdocstrings cannot read is
a warning, and ``mkdocs build --strict`` fails on it. The reference pages
moved there from README carry README's old checks: the limits table is the
``Limits`` dataclass, and the error codes listed are the codes.
"""

import html
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tensorjob_jupyter import abi
from tensorjob_jupyter.frontends.options import OPTIONS
from tensorjob_jupyter.limits import FIELDS

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


@pytest.mark.slow  # a full site build: several seconds
def test_the_site_builds_with_warnings_as_errors(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    api = (tmp_path / "site" / "api" / "index.html").read_text(encoding="utf-8")
    for name in ("tensorjob_jupyter.run", "tensorjob_jupyter.Job", "tensorjob_jupyter.MapResult"):
        assert f'id="{name}"' in api, name  # the API page is made from the docstrings
    assert "to_pandas" in api and (tmp_path / "site" / "limits" / "index.html").exists()
    text = re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", api)))
    # the reference is rendered, not empty: Job's keywords, the envelope's, usage's and the map result's fields
    # with what each means, and every limit with its default
    for keyword in ("guest", "input", "read", "fetch", "backend", "model", "model_options", "limits", "infer",
                    "input_bytes", "runs_dir", "cwd", "name", "debug", "break_on"):
        assert f"{keyword} :" in text or f"{keyword} =" in text, keyword
    for field, says in [("status", "completed , failed or cancelled"), ("tokens_in", "Prompt tokens"),
                        ("result", "The guest's done value"), ("total", "Items in the manifest"),
                        ("skipped", "Items this session did not run"), ("throughput", "Items this session concluded per second")]:
        assert re.search(rf"{field}\b[^¶]*¶ {re.escape(says)}", text), field
    for name, f in FIELDS.items():
        assert f"{name} " in text and f.metadata["help"] in text, name


def test_every_page_is_in_the_navigation():
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert {p.name for p in DOCS.glob("*.md")} == set(re.findall(r":\s*(\w+\.md)\s*$", nav, re.M))


def test_the_limits_table_is_the_limits_dataclass():
    table = (DOCS / "limits.md").read_text(encoding="utf-8")
    named = set(re.findall(r"^\| `(\w+)`(?: / `(\w+)`)?", table, re.M))
    named = {n for pair in named for n in pair if n}
    assert named == set(FIELDS)


def test_the_error_codes_listed_are_the_codes():
    text = (DOCS / "limits.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"`([a-z_]+)`", text.split("Error codes are", 1)[1].split("\n\n", 1)[0]))
    assert abi.ERROR_CODES <= listed


def test_every_job_option_is_documented_on_the_notebook_page():
    page = (DOCS / "notebook.md").read_text(encoding="utf-8")
    for opt in OPTIONS:
        if not opt.is_limit:
            assert f"`{opt.flag}" in page, opt.flag

"""The tutorials hold under another llama.cpp thread count, checked exactly as nbval checks them.

The suite's own nbval run executes notebooks/ with the default thread count.
Greedy text is deterministic on one machine, build and thread count, not
across them, so the notebooks compare only what must hold anywhere (cells
whose output carries the model's words are tagged ``nbval-ignore-output``
and followed by a compared cell with the shape: statuses, counts, bounds).
This test proves that by running nbval again, in a fresh process and fresh
kernels, with ``TENSORJOB_THREADS`` set to another count: the same command
line and options (pyproject's ``addopts``), so the same comparison. It also
checks that the notebooks stay that way: every ignored cell is followed by
one that is compared.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tensorjob_jupyter.inference.topology import THREADS_ENV, default_threads, threads_setting

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
IGNORE = "nbval-ignore-output"


def _code_cells(path: Path) -> list[dict]:
    return [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]


def test_every_cell_whose_output_nbval_ignores_is_followed_by_one_it_compares():
    for path in NOTEBOOKS:
        cells = _code_cells(path)
        for i, cell in enumerate(cells):
            assert "NBVAL_IGNORE_OUTPUT" not in "".join(cell["source"]), f"{path.name}: use the cell tag {IGNORE}"
            if IGNORE not in cell.get("metadata", {}).get("tags", []):
                continue
            rest = [c for c in cells[i + 1:] if IGNORE not in c.get("metadata", {}).get("tags", [])]
            assert rest and rest[0].get("outputs"), (
                f"{path.name}: code cell {i} has its output ignored, but no compared cell with output follows it")


def test_no_notebook_finds_a_command_on_the_kernel_s_path():
    """A kernel started as ``.venv/bin/jupyter lab`` without activating has no ``tensorjob`` on its PATH: a shell
    cell calls the command through the kernel's own interpreter (``!{sys.executable} -m tensorjob_jupyter``)."""
    for path in NOTEBOOKS:
        for i, cell in enumerate(_code_cells(path)):
            for line in "".join(cell["source"]).splitlines():
                shell = re.match(r"(?:\w+\s*=\s*)?!(.*)", line)  # at the start of a line: a shell escape
                assert shell is None or shell[1].startswith("{sys.executable}"), f"{path.name} cell {i}: {line}"


def test_the_command_runs_through_the_interpreter_with_no_path(tmp_path):
    done = subprocess.run([sys.executable, "-m", "tensorjob_jupyter", "--version"], capture_output=True, text=True,
                          env={**os.environ, "PATH": str(tmp_path)}, timeout=120)
    assert done.returncode == 0 and done.stdout.strip(), done.stderr


@pytest.mark.slow  # runs every notebook again, on the real model
def test_the_notebooks_pass_nbval_with_another_llama_cpp_thread_count(tmp_path):
    current = threads_setting() or default_threads()[0]  # what the suite's own nbval run uses
    other = 1 if current != 1 else 2
    env = dict(os.environ)
    env[THREADS_ENV] = str(other)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env["TENSORJOB_RUNS"] = str(tmp_path / "runs")
    # pyproject's addopts give --nbval --nbval-current-env: the kernels inherit TENSORJOB_THREADS.
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *map(str, NOTEBOOKS)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    tail = (proc.stdout + proc.stderr)[-6000:]
    assert proc.returncode == 0, f"nbval failed with {THREADS_ENV}={other} (the suite's run uses {current}):\n{tail}"
    cells = sum(len(_code_cells(path)) for path in NOTEBOOKS)
    assert f"{cells} passed" in proc.stdout, tail

"""The package's types hold: mypy over ``tensorjob_jupyter`` (``[tool.mypy]`` in pyproject.toml) finds nothing,
and a caller who gets a typed name wrong is told so -- the package ships ``py.typed``, so its annotations are
what a user's checker reads.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def mypy(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mypy", *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)


def test_the_package_type_checks():
    proc = mypy()  # files and settings from pyproject.toml
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (ROOT / "tensorjob_jupyter" / "py.typed").is_file()


def test_a_caller_who_gets_a_type_wrong_is_told(tmp_path):
    planted = tmp_path / "caller.py"
    planted.write_text("import tensorjob_jupyter as tj\n\n"
                       "spec: tj.JobSpec = tj.JobSpec.of(b'', max_tokens=1)\n"
                       "spec.merge(tj.Overrides(model=3))\n"
                       "spec.merge('not overrides')\n", encoding="utf-8")
    proc = mypy("--config-file", str(ROOT / "pyproject.toml"), str(planted))
    assert proc.returncode == 1, proc.stdout
    assert proc.stdout.count("error:") == 2 and '"model"' in proc.stdout and '"merge"' in proc.stdout

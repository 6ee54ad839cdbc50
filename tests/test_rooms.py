"""Every room is on its floor's plan: each module of a package folder is named in that folder's ``__init__``.

A folder's ``__init__`` docstring is where a newcomer starts (what the folder owns, what it may import:
``tests/test_layers.py``); a module it does not name is one they never hear of. So every module (``name.py``)
and every sub-package (``name/``) of every package folder under ``tensorjob_jupyter/`` must appear in that
folder's docstring as a literal: ``name``, ``name.py`` or ``name/``. The package root is left out: its
docstring is the user's introduction to the API, not a plan of the floors. The model's room, being split
into modules of one concern each, is also held to modules a newcomer can read at a sitting.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "tensorjob_jupyter"
#: The most lines a module of ``inference/`` may have (issue 58: rooms of one concern).
MAX_ROOM_LINES = 600


def package_folders(package: Path) -> list[Path]:
    """Every folder under ``package`` that is a package (holds an ``__init__.py``), ``package`` itself left out."""
    return sorted(init.parent for init in package.rglob("__init__.py")
                  if init.parent != package and "__pycache__" not in init.parts)


def rooms(folder: Path) -> list[str]:
    """The modules of ``folder`` (``__init__`` aside) and its sub-packages, by name."""
    modules = [p.stem for p in folder.glob("*.py") if p.name != "__init__.py"]
    packages = [p.name for p in folder.iterdir() if p.is_dir() and (p / "__init__.py").is_file()]
    return sorted(modules + packages)


def unnamed(folder: Path) -> list[str]:
    """The rooms of ``folder`` that its ``__init__`` docstring does not name as a literal."""
    doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text(encoding="utf-8"))) or ""
    return [name for name in rooms(folder) if not re.search(rf"``{re.escape(name)}(\.py|/)?``", doc)]


def _folder_id(folder: Path) -> str:
    return folder.relative_to(PACKAGE).as_posix()


@pytest.mark.parametrize("folder", package_folders(PACKAGE), ids=_folder_id)
def test_every_module_is_named_in_its_folder_s_docstring(folder):
    missing = unnamed(folder)
    assert not missing, (f"tensorjob_jupyter/{_folder_id(folder)}/__init__.py's docstring does not name "
                         + ", ".join(f"``{name}``" for name in missing) + ": say what each is for there")


def test_a_module_left_out_of_its_folder_s_docstring_is_caught(tmp_path):
    package = tmp_path / "pkg"
    floor = package / "floor"
    (floor / "wing").mkdir(parents=True)
    (package / "__init__.py").write_text('"""The root: not a plan."""\n')
    (floor / "__init__.py").write_text('"""floor.\n\nOwns: ``kept`` (one room), ``wing/`` and ``listed.py``."""\n')
    (floor / "wing" / "__init__.py").write_text('"""The wing: ``a``."""\n')
    for name in ("kept.py", "listed.py", "forgotten.py", "wing/a.py"):
        (floor / name).write_text('"""A room."""\n')
    (floor / "keptsake.py").write_text('"""Named only as part of another name: not named."""\n')
    assert package_folders(package) == [floor, floor / "wing"]
    assert rooms(floor) == ["forgotten", "kept", "keptsake", "listed", "wing"]
    assert unnamed(floor) == ["forgotten", "keptsake"] and unnamed(floor / "wing") == []


def test_no_module_of_the_model_s_room_is_longer_than_a_sitting():
    long = {p.name: n for p in sorted((PACKAGE / "inference").glob("*.py"))
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_ROOM_LINES}
    assert not long, f"split these into modules of one concern each: {long}"

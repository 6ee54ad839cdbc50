"""Exported notebooks show each finished view as static HTML even when widget state was saved.

A notebook runs as nbclient, papermill and ``nbconvert --execute`` run it --
a fresh kernel, widget state stored in the notebook (nbclient's default) --
with a job and a map; then ``tensorjob export`` and ``jupyter nbconvert --to
tensorjob-html``, each in a subprocess as a user runs them, make the HTML:
each view is there as its static HTML, with the job's result, the map's
counts and every status, and no widget for JavaScript to draw.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import wat

pytestmark = pytest.mark.slow  # a kernel, a notebook run and three exports

ROOT = Path(__file__).resolve().parents[2]
WIDGET_SCRIPT = '<script type="application/vnd.jupyter.widget-view+json">'


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    """A notebook with a finished job and a finished map, executed with widget state saved."""
    import nbformat
    from nbclient import NotebookClient

    folder = tmp_path_factory.mktemp("export")
    guest = folder / "echo.wasm"
    guest.write_bytes(wat.script_guest([{"cmd": "done", "result": {"answer": "<b>forty-two</b>"}}]))
    (folder / "items.jsonl").write_text('{"path": "a.txt"}\n{"path": "b.txt"}\n', encoding="utf-8")
    job = "%%tensorjob --no-raise\n" + wat.script_wat([
        {"cmd": "emit", "progress": {"done": 1, "total": 2}},
        {"cmd": "done", "result": {"answer": "<img src=x onerror=alert(1)>"}}])
    cells = ["%load_ext tensorjob_jupyter", job,
             f"result = %tensorjob map {guest} --over items.jsonl --run-dir run"]
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    env_path = os.pathsep.join([str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])
    os.environ["PYTHONPATH"], before = env_path, os.environ.get("PYTHONPATH")
    try:
        NotebookClient(notebook, timeout=120, kernel_name="python3",
                       resources={"metadata": {"path": str(folder)}}).execute()  # store_widget_state: the default
    finally:
        os.environ.pop("PYTHONPATH") if before is None else os.environ.__setitem__("PYTHONPATH", before)
    assert notebook.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    path = folder / "report.ipynb"
    nbformat.write(notebook, path)
    return path


def run(*argv, cwd):
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=180,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])})


def check_static(html: str) -> None:
    assert WIDGET_SCRIPT not in html  # nothing left that only the widget's JavaScript can draw
    job = html[html.index('class="tensorjob-view tj-static"'):]
    assert "completed" in job and "1 / 2" in job
    assert "&lt;img src=x onerror=alert(1)&gt;" in job and "<img src=x" not in html  # escaped, inert
    maps = html[html.index('class="tensorjob-map-view tj-static"'):]
    assert "2 done" in maps and "finished" in maps and "a.txt" in maps and "forty-two" in maps
    assert "<b>forty-two</b>" not in html


def test_nbconvert_alone_shows_the_widget_a_saved_state_holds(executed):
    """Why the export exists: with widget state saved, plain nbconvert picks the widget, not the static view."""
    import nbformat
    from nbconvert import HTMLExporter

    html, _ = HTMLExporter().from_notebook_node(nbformat.read(executed, as_version=4))
    assert WIDGET_SCRIPT in html and 'class="tensorjob-view tj-static"' not in html


def test_tensorjob_export_writes_the_static_views(executed, tmp_path):
    proc = run(sys.executable, "-m", "tensorjob_jupyter.frontends.cli", "export", str(executed), "-o",
               str(tmp_path / "report.html"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(tmp_path / "report.html")
    check_static((tmp_path / "report.html").read_text(encoding="utf-8"))
    proc = run(sys.executable, "-m", "tensorjob_jupyter.frontends.cli", "export", str(executed), "--to", "ipynb",
               "-o", str(tmp_path / "static.ipynb"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    outputs = [o for cell in json.loads((tmp_path / "static.ipynb").read_text())["cells"]
               for o in cell.get("outputs", [])]
    views = [o for o in outputs if "text/html" in o.get("data", {}) and "tj-static" in "".join(o["data"]["text/html"])]
    assert len(views) == 2 and not any("application/vnd.jupyter.widget-view+json" in o["data"] for o in views)


def test_nbconvert_to_tensorjob_html_writes_the_static_views(executed, tmp_path):
    proc = run(sys.executable, "-m", "jupyter", "nbconvert", "--to", "tensorjob-html", str(executed), "--output-dir",
               str(tmp_path), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    check_static((tmp_path / "report.html").read_text(encoding="utf-8"))


def test_a_bad_notebook_is_one_line(tmp_path):
    (tmp_path / "broken.ipynb").write_text("{not a notebook", encoding="utf-8")
    for name in ("broken.ipynb", "missing.ipynb"):
        proc = run(sys.executable, "-m", "tensorjob_jupyter.frontends.cli", "export", name, cwd=tmp_path)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and name in proc.stderr, proc.stderr


def forged_notebook(path: Path, html: str) -> Path:
    """A notebook as someone else may send it: an output that says it is a finished view, with this HTML."""
    import nbformat

    output = nbformat.v4.new_output("display_data", data={"text/html": html, "application/vnd.jupyter.widget-view+json":
                                                          {"model_id": "m", "version_major": 2, "version_minor": 0}},
                                    metadata={"tensorjob_static_view": True})
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("%%tensorjob", outputs=[output])]), path)
    return path


def test_a_forged_view_exports_inert_and_a_huge_one_is_cut(tmp_path):
    forged = forged_notebook(tmp_path / "forged.ipynb", '<div class="tensorjob-view tj-static">shown'
                             '<script>document.title="pwned"</script><img src=x onerror="alert(1)">'
                             '<a href="javascript:alert(2)">link</a><span style="background:url(//evil)">s</span></div>')
    covering = forged_notebook(tmp_path / "covering.ipynb", '<div class="tensorjob-view tj-static">shown <a '
                               'href="https://elsewhere.example/" style="position:fixed;top:0;left:0;width:100%;'
                               'height:100%;z-index:99999;color:red">link</a></div>')
    huge = forged_notebook(tmp_path / "huge.ipynb", '<div class="tensorjob-view tj-static">'
                           + "<span>0123456789</span>" * 1_200_000 + "</div>")  # 26 MiB of view, 27,600,044 characters
    for argv, written in (
            (["-m", "tensorjob_jupyter.frontends.cli", "export", "forged.ipynb"], "forged.html"),
            (["-m", "jupyter", "nbconvert", "--to", "tensorjob-html", "forged.ipynb"], "forged.html"),
            (["-m", "tensorjob_jupyter.frontends.cli", "export", "covering.ipynb"], "covering.html"),
            (["-m", "jupyter", "nbconvert", "--to", "tensorjob-html", "covering.ipynb"], "covering.html"),
            (["-m", "tensorjob_jupyter.frontends.cli", "export", "huge.ipynb"], "huge.html")):
        proc = run(sys.executable, *argv, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        page = (tmp_path / written).read_text(encoding="utf-8")
        assert WIDGET_SCRIPT not in page
        view = page[page.index('class="tensorjob-view tj-static'):]
        view = view[:view.index("</div>")]
        assert "pwned" not in page and "onerror" not in page and "javascript:" not in page and "//evil" not in page
        if written == "forged.html":  # markup the views never write: the view is left out, saying why
            assert "a finished tensorjob view was left out" in view and "&lt;script&gt;" in view
        elif written == "covering.html":  # the views' own markup: kept, the link in its place
            assert "shown" in view and 'style="width:100%;height:100%;color:red"' in view and "position" not in view
        else:
            assert "this view was cut" in page and "27,600,044" in page and len(page) < (5 << 20)
    assert forged.exists() and covering.exists() and huge.exists()

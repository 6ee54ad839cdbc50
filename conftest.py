"""Markers for the whole suite, tests/ and the notebooks nbval collects alike.

``pytest -m "not slow"`` is the contributors' fast loop: no real model, no
notebook, no browser. The notebooks are collected by nbval from notebooks/,
where no test module can mark them, so this root conftest marks each of
their cells slow (they load the model and start kernels); the browser test
is slow too. Tests that load the real model carry ``@pytest.mark.slow``
themselves, and tests/conftest.py fails any unmarked test that loads it.

nbval compares every output's ``text/plain`` but not its ``text/html``: a
finished job's view adds its static HTML to its output with a display update,
which nbval ignores, so the HTML a notebook stores is never what nbval sees
(the view's ``text/plain`` line is, and is compared).

The fast loop runs in parallel: ``pytest -m "not slow"`` starts pytest-xdist
workers by itself (``pytest_cmdline_main`` below; ``-n 0`` runs it in one
process, ``-n N`` picks the count). The full suite and CI stay in one process
(the notebooks' kernels and the browser are slow and timing-sensitive). Every
test is independent of the others and of where it runs: its files under its
own ``tmp_path``, its ports from the OS. What here makes it quick:

* ``-n auto`` starts a worker more than there are cores
  (``pytest_xdist_auto_num_workers``): much of the suite waits -- on timeouts
  it tests, subprocesses, servers -- rather than computes (on 2 cores: 2
  workers 52 s, 3 workers 48 s, 4 workers 54 s for the same 826 tests).
* ``--dist worksteal``: an idle worker takes tests queued for a busy one.
  xdist's default hands each worker a quarter of its share up front, in
  file order, so one worker could hold all of test_hostile_world and
  test_compile and end 10 s after the others.
* Bytecode is cached even where ``PYTHONDONTWRITEBYTECODE`` is set (as in some
  containers): without it every run, and every worker, compiles the package
  and rewrites every test module's asserts again (about 7 s of CPU a process).
  The cache goes under ``.pytest_cache/pycache`` (``sys.pycache_prefix``), not
  next to the sources, and the Python processes the tests start share it.
* A module marked slow as a whole is not imported, and what collection built
  is frozen out of the garbage collector's full passes (``gc.freeze``).
"""

import gc
import os
import re
import sys
from pathlib import Path

import pytest

# nbval is loaded here (``-p no:nbval`` in addopts keeps its entry point out), after rfc3987_syntax is hidden:
# nbval imports nbformat, which imports jsonschema, which imports every format checker's library it finds,
# and rfc3987_syntax (the ``iri`` format, which nothing here checks) builds a parser as it loads -- about 2 s
# of CPU in each pytest process, four in the fast loop. The package hides it the same way for a job's first
# schema check (``host/schemas.py``). Once every plugin is loaded, it is importable again.
_HIDE_IRI = "rfc3987_syntax" not in sys.modules and "jsonschema" not in sys.modules
if _HIDE_IRI:
    sys.modules["rfc3987_syntax"] = None  # type: ignore[assignment]  # its import raises ImportError
pytest_plugins = ["nbval.plugin"]

if sys.dont_write_bytecode:
    sys.pycache_prefix = sys.pycache_prefix or str(Path(__file__).resolve().parent / ".pytest_cache" / "pycache")
    sys.dont_write_bytecode = False
    # and in the Python processes the tests start (the CLI, kernels, document engines, servers)
    os.environ["PYTHONPYCACHEPREFIX"] = sys.pycache_prefix
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)


FAST_LOOP = "not slow"


def pytest_configure(config):
    if _HIDE_IRI and sys.modules.get("rfc3987_syntax", False) is None:
        del sys.modules["rfc3987_syntax"]


#: Options under which the fast loop stays in one process: a debugger needs the terminal (a worker's stdin is
#: not it), a listing or plan runs no test, and ``--tx`` names its own workers.
_ONE_PROCESS_OPTIONS = ("collectonly", "usepdb", "trace", "showfixtures", "show_fixtures_per_test", "setupplan",
                        "setuponly", "tx")


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """The fast loop (``-m "not slow"``, nothing else selecting workers) runs on pytest-xdist's ``-n auto``;
    a run of named tests only (``path::test``) stays in one process, where it starts at once."""
    if (config.getoption("markexpr", "").strip() != FAST_LOOP or hasattr(config, "workerinput")
            or not config.pluginmanager.hasplugin("xdist") or config.getoption("numprocesses", None) is not None
            or any(config.getoption(name, None) for name in _ONE_PROCESS_OPTIONS)
            or config.getoption("capture", "fd") == "no"
            or (config.args and all("::" in arg for arg in config.args))):
        return
    config.option.numprocesses = "auto"
    if config.getoption("dist", "no") == "no":
        config.option.dist = "worksteal"


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    """``-n auto``: a worker a core, and one more; ``PYTEST_XDIST_AUTO_NUM_WORKERS`` decides when set."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # pytest-xdist's own hook reads it
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return cores + 1


_SLOW_MODULE = re.compile(r"^pytestmark = pytest\.mark\.slow\b", re.MULTILINE)


def pytest_ignore_collect(collection_path, config):
    """The fast loop never parses the notebooks, nor imports a test module marked slow as a whole
    (a line ``pytestmark = pytest.mark.slow``): every test of theirs is deselected anyway,
    and importing them (Dask, distributed) costs each worker process a third of a second."""
    if config.getoption("markexpr", "").strip() != FAST_LOOP:
        return None
    if collection_path.suffix == ".ipynb":
        return True
    if collection_path.suffix == ".py" and collection_path.name.startswith("test_"):
        try:
            text = collection_path.read_text(encoding="utf-8")
        except OSError:
            return None
        if _SLOW_MODULE.search(text):
            return True
    return None


def pytest_collectstart(collector):
    if collector.path is not None and collector.path.suffix == ".ipynb" and hasattr(collector, "skip_compare"):
        collector.skip_compare += ("text/html",)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.suffix == ".ipynb" or item.get_closest_marker("browser") is not None:
            item.add_marker(pytest.mark.slow)


def pytest_collection_finish(session):
    """What collection built (modules, test items, fixtures) lives to the end: set it aside from the garbage
    collector, whose full passes would otherwise walk it again and again while the tests run."""
    gc.collect()
    gc.freeze()

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
"""

import pytest


def pytest_collectstart(collector):
    if collector.path is not None and collector.path.suffix == ".ipynb" and hasattr(collector, "skip_compare"):
        collector.skip_compare += ("text/html",)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.suffix == ".ipynb" or item.get_closest_marker("browser") is not None:
            item.add_marker(pytest.mark.slow)

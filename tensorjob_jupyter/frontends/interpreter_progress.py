"""The Python interpreter's first build, shown while it happens: a line in a terminal, a widget in a notebook.

A Python guest runs in CPython compiled to WebAssembly, which is built and
compiled once per machine (``sandbox/python/interpreter.py``: about a minute
on two cores, then never again). Nothing waits for it at start-up -- the
kernel and the command line start at once -- and the first Python guest
shows where the build is instead of hanging silently: in a terminal, one line
rewritten in place (one line per stage when stderr is not a terminal); in a
notebook, a widget line that goes away when the interpreter is ready.
``load_guest`` calls ``prepare`` for a Python guest; once the interpreter is
ready it returns at once.
"""

from __future__ import annotations

import html
import threading
import time
from typing import TextIO

from tensorjob_jupyter.host import python_interpreter as interpreter

TICK_S = 0.5


def _build(stage: list[str], done: threading.Event, errors: list[BaseException]) -> None:
    try:
        interpreter.ensure(False, lambda text, fraction: stage.__setitem__(0, text))
    except BaseException as e:  # noqa: BLE001 - the guest's loader reports it
        errors.append(e)
    finally:
        done.set()


def prepare(err: TextIO, *, notebook: bool = False) -> None:
    """Make the interpreter ready, showing progress if it has to be built; errors surface at load."""
    if interpreter.is_ready():
        return
    stage, done = ["preparing the Python interpreter"], threading.Event()
    errors: list[BaseException] = []
    threading.Thread(target=_build, args=(stage, done, errors), name="tensorjob-python-build", daemon=True).start()
    show = _Widget() if notebook else _Line(err)
    started = time.monotonic()
    try:
        while not done.wait(TICK_S):
            show.update(stage[0], time.monotonic() - started)
    finally:
        show.close(time.monotonic() - started, ok=not errors)


class _Line:
    """One status line on a terminal (rewritten in place), or a line per stage otherwise."""

    def __init__(self, err: TextIO):
        self.err = err
        self.tty = bool(getattr(err, "isatty", lambda: False)())
        self.last = ""

    def update(self, stage: str, elapsed: float) -> None:
        text = f"· {stage} (first Python guest on this machine) {elapsed:.0f} s"
        if self.tty:
            self.err.write("\r" + text.ljust(len(self.last)))
            self.last = text
        elif stage != self.last:
            self.err.write(f"· {stage} (first Python guest on this machine)\n")
            self.last = stage
        self.err.flush()

    def close(self, elapsed: float, *, ok: bool) -> None:
        if self.tty and self.last:
            self.err.write("\r" + " " * len(self.last) + "\r")
        if ok:
            self.err.write(f"· the Python interpreter is ready ({elapsed:.0f} s, once per machine)\n")
        self.err.flush()


class _Widget:
    """A widget line in the notebook, removed when the interpreter is ready."""

    def __init__(self):
        try:
            import ipywidgets
            from IPython.display import display
        except ImportError:  # pragma: no cover - a notebook without widgets
            self.widget = None
            return
        self.widget = ipywidgets.HTML()
        display(self.widget)

    def update(self, stage: str, elapsed: float) -> None:
        if self.widget is not None:
            self.widget.value = (f"<span>⏳ {html.escape(stage)} &mdash; the first Python guest on this machine "
                                 f"waits for it once ({elapsed:.0f} s)</span>")

    def close(self, elapsed: float, *, ok: bool) -> None:
        if self.widget is not None:
            self.widget.close()


__all__ = ["TICK_S", "prepare"]

"""A command a test starts the way a terminal starts it: Ctrl-C (SIGINT) at its default.

A test run in the background of a script (``cmd &``, ``nohup``) inherits SIGINT ignored, and so does every
process it starts; the command line then rightly leaves Ctrl-C alone, and a test of what Ctrl-C does would fail
for the way the suite was launched. Give ``preexec_fn=as_in_a_terminal`` to ``subprocess.Popen``.
"""

from __future__ import annotations

import signal


def as_in_a_terminal() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)

"""How a cell that ran a job ends: its value, shown once, or a short error that stops "Run All".

A ``%%tensorjob`` cell always returns the job's envelope, as a ``CellEnvelope`` that displays nothing as the
value of the cell that made it, since the view has already shown the job. A job that failed or was cancelled
then raises ``JobFailed`` (and a guest that does not compile ``GuestDoesNotCompile``), which IPython shows as one
line, so running a notebook top to bottom stops there.

Design: docs/internals/frontends.md#outcomepy
"""

from __future__ import annotations

from typing import Any

from IPython import get_ipython

from tensorjob_jupyter.abi import Envelope, JobFailure, JobStatus, codes, TensorjobError
from tensorjob_jupyter.frontends.view.summary import error_text
from tensorjob_jupyter.text import clip, for_terminal

#: Characters of the error line a failed cell shows (a guest's ``fail`` message may be 16 KiB).
MAX_LINE_CHARS = 300


class CellEnvelope(Envelope):
    """The envelope a magic returns: not shown again as the ``Out[]`` of the cell whose view showed it."""

    _shown_in: int | None = None  # the execution count of the cell that showed it

    @classmethod
    def of(cls, envelope: Envelope, *, shown_in: int | None) -> "CellEnvelope":
        value = cls(status=envelope.status, usage=envelope.usage, result=envelope.result, error=envelope.error)
        value._shown_in = shown_in
        return value

    @property
    def _ipython_display_(self):
        """IPython's hook, present only while this is the value of the cell whose view showed it: then it
        displays nothing. Anywhere else it is absent, and the envelope is shown as any value is (``Out[]``)."""
        shell = get_ipython()
        if shell is not None and self._shown_in is not None and shell.execution_count == self._shown_in:
            return _show_nothing
        return None

    def __repr__(self) -> str:
        if self.ok:
            return f"Envelope(completed, result={self.result!r})"
        error = f", error={self.error.code}: {self.error.message}" if self.error is not None else ""
        return f"Envelope({self.status.value}{error})"

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, Envelope) and (self.status, self.usage, self.result, self.error) == \
            (other.status, other.usage, other.result, other.error)

    __hash__ = None  # type: ignore[assignment]  # as Envelope's: a mutable dataclass


def _show_nothing() -> None:
    """What a cell's own envelope displays as its ``Out[]``: nothing (its view has shown it)."""


class CellError(TensorjobError):
    """An error a cell shows as one line (``Name: message``), without the host's traceback."""

    def _render_traceback_(self) -> list[str]:
        return [f"{type(self).__name__}: {for_terminal(str(self), one_line=True)}"]


class JobFailed(CellError, JobFailure):
    """The cell's job failed or was cancelled; ``envelope`` says how (``--no-raise`` returns it instead)."""

    def __init__(self, name: str, envelope: Envelope):
        error = envelope.error
        code, message = (error.code, error.message) if error is not None else (codes.INTERNAL_ERROR, "no error given")
        JobFailure.__init__(self, code, message)
        self.envelope = envelope
        text = clip(error_text(code, message), MAX_LINE_CHARS)  # the whole message is in .envelope
        status = "" if envelope.status.value in text.split() else f" {envelope.status.value}"
        self.args = (f"{name}{status}: {text}",)  # "g.c failed: timeout: ...", "g.c: job cancelled"

    @property
    def cancelled(self) -> bool:
        return self.envelope.status is JobStatus.CANCELLED


class GuestDoesNotCompile(CellError):
    """The cell's (or the file's) guest did not compile; the compiler's message was printed just before."""


class GateFailed(CellError):
    """A map replay's regression gate did not pass (``--fail-under``); ``replay`` is the ``MapReplay``."""

    def __init__(self, line: str, replay):
        super().__init__(line)
        self.replay = replay


__all__ = ["MAX_LINE_CHARS", "CellEnvelope", "CellError", "JobFailed", "GuestDoesNotCompile", "GateFailed"]

"""The plain, deterministic text form of a finished job, and how its error reads.

Shown where no widget front end renders the live view (terminal IPython, a
``--quiet``-less cell with ``TensorJob.view = "text"``): status, the result
as JSON, token counts when the model was used, and the error if any. It
never contains timings, job ids or paths of run folders, so a notebook's
stored output compares equal on every run of a greedy model.

``error_text`` is the one way an error reads, here, in the view, in the
terminal printer and in the short error a failed cell raises: a cancelled
job says "cancelled during inference", not "cancelled: cancelled during
inference".
"""

from __future__ import annotations

from tensorjob_jupyter.abi import Envelope
from tensorjob_jupyter.text import for_terminal, json_text


def error_text(code: str, message: str) -> str:
    """``code: message``, or only the message where one of its words is the code already
    ("cancelled during inference", "job cancelled")."""
    return message if code in message.split() else f"{code}: {message}"


def used_the_model(envelope: Envelope) -> bool:
    """Whether the job asked the model anything (a job that never did shows no token counts)."""
    return bool(envelope.usage.tokens_in or envelope.usage.tokens_out)


def summary(name: str, envelope: Envelope, *, with_result: bool = True) -> str:
    u = envelope.usage
    lines = [for_terminal(f"tensorjob {name}: {envelope.status.value}", one_line=True)]
    if envelope.error is not None:
        lines.append(for_terminal(f"error: {error_text(envelope.error.code, envelope.error.message)}",
                                  one_line=True))
    if with_result and envelope.ok:
        lines.append("result: " + json_text(envelope.result))
    if used_the_model(envelope):
        lines.append(f"tokens: {u.tokens_in} in, {u.tokens_out} out")
    return "\n".join(lines)


def map_summary(name: str, result) -> str:
    """A finished map in plain, deterministic text (no times, no paths)."""
    lines = [f"tensorjob map {name}: {result.status}",
             f"items: {result.total} ({result.completed} completed, {result.failed} failed, "
             f"{result.skipped} skipped before this run)"]
    if result.error:
        lines.append(f"error: {result.error}")
    return "\n".join(for_terminal(line, one_line=True) for line in lines)


__all__ = ["error_text", "used_the_model", "summary", "map_summary"]

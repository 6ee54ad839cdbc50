"""The plain, deterministic text form of a finished job.

Shown where no widget front end renders the live view (terminal IPython,
nbconvert, nbval): status, the result as JSON, token counts, and the error
if any. It never contains timings, job ids or paths of run folders, so a
notebook's stored output compares equal on every run of a greedy model.
"""

from __future__ import annotations

from ..abi import Envelope
from ..text import for_terminal, json_text


def summary(name: str, envelope: Envelope, *, with_result: bool = True) -> str:
    u = envelope.usage
    lines = [for_terminal(f"tensorjob {name}: {envelope.status.value}", one_line=True)]
    if envelope.error is not None:
        lines.append(for_terminal(f"error: {envelope.error.code}: {envelope.error.message}", one_line=True))
    if with_result and envelope.ok:
        lines.append("result: " + json_text(envelope.result))
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

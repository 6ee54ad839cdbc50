"""How a replay went: where it first left its recording, and its end beside the recorded one.

``Divergence`` is the first command the recording could not answer (or the
first answer the world gave otherwise); ``divergence_line`` is its
``job.replay.diverged`` event as one inert line, for the view and the
terminal. ``ReplayReport`` is a finished replay: its envelope, the recorded
envelope, the divergence, and a few deterministic lines saying how it went.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tensorjob_jupyter import abi
from tensorjob_jupyter.abi import Envelope
from tensorjob_jupyter.text import for_terminal

#: Characters of a divergence line a view keeps.
MAX_LINE_CHARS = 1000


@dataclass(frozen=True)
class Divergence:
    """The first place a replay left its recording."""

    step: int  # 1-based: the guest's first command is step 1
    why: str
    recorded: str  # one inert line each
    asked: str
    kind: str = "command"  # command: the guest asked otherwise; answer: the world answered otherwise; end

    def message(self) -> str:
        verb = "now" if self.kind == "answer" else "the guest asked"
        return f"replay diverged at step {self.step} ({self.why}): the run recorded {self.recorded}; {verb} {self.asked}"

    def to_json(self) -> dict:
        return {"step": self.step, "why": self.why, "recorded": self.recorded, "asked": self.asked,
                "kind": self.kind}

    @classmethod
    def from_json(cls, obj: dict) -> "Divergence":
        return cls(int(obj["step"]), str(obj["why"]), str(obj["recorded"]), str(obj["asked"]),
                   str(obj.get("kind", "command")))


def divergence_line(event: dict) -> str:
    """A ``job.replay.diverged`` event as one inert line (the view's log, the terminal)."""
    try:
        text = Divergence.from_json(event).message()
    except (KeyError, TypeError, ValueError):
        text = "replay diverged"
    then = event.get("then")
    if then == "live":
        text += " -- the model answers from here (live)"
    elif then == "finished":
        text += " -- the guest finished there"
    text = for_terminal(text, one_line=True)
    return text if len(text) <= MAX_LINE_CHARS else text[:MAX_LINE_CHARS] + "…"


@dataclass
class ReplayReport:
    """A finished replay: its envelope beside the recorded one, and where (if anywhere) it diverged."""

    job: Any  # the ReplayJob
    envelope: Envelope
    recorded: dict | None  # the recorded run's envelope (None: the run never ended)
    divergence: Divergence | None
    stopped: bool  # the replay stopped at the divergence
    live_from: int | None  # the step from which the model answered (live)
    reproduced_end: bool  # the replay ended as the recorded run did (cancelled, timed out, ...)

    @property
    def result(self) -> Any:
        return self.envelope.result

    @property
    def status(self) -> str:
        return self.envelope.status.value

    @property
    def guest_changed(self) -> bool:
        return self.job.guest_changed

    @property
    def same_result(self) -> bool:
        """The replay ended as the run did: the same status, and the same result or error code."""
        if self.recorded is None:
            return False
        mine = self.envelope.to_json()
        if mine["status"] != self.recorded.get("status"):
            return False
        if mine["status"] == "completed":
            return abi.encode_json(mine.get("result")) == abi.encode_json(self.recorded.get("result"))
        return (mine.get("error") or {}).get("code") == (self.recorded.get("error") or {}).get("code")

    def lines(self) -> list[str]:
        """The replay in a few plain lines, with no ids, paths or timings (deterministic)."""
        if self.stopped and self.divergence is not None:
            return [f"replay: stopped at step {self.divergence.step}, the first command the recording cannot answer"]
        out = []
        if self.recorded is None:
            out.append("replay: the recorded run never ended, so there is no result to compare")
        elif self.same_result:
            out.append("replay: the same result as the recorded run" + (" (its end reproduced from the recording)"
                                                                        if self.reproduced_end else ""))
        else:
            was = self.recorded.get("status")
            out.append(f"replay: the result differs from the recorded run ({was} then, {self.status} now)")
        if self.divergence is not None:
            out.append(for_terminal(self.divergence.message(), one_line=True))
        if self.live_from is not None:
            out.append(f"replay: the model answered from step {self.live_from} on (live)")
        return out

    def to_json(self) -> dict:
        return {"status": self.status, "same_result": self.same_result, "guest_changed": self.guest_changed,
                "divergence": self.divergence.to_json() if self.divergence else None, "stopped": self.stopped,
                "live_from": self.live_from, "reproduced_end": self.reproduced_end, "run": self.job.recording.id,
                "replay": self.job.id, "envelope": self.envelope.to_json(), "recorded": self.recorded}

    def __repr__(self) -> str:
        where = f"diverged at step {self.divergence.step}" if self.divergence else "no divergence"
        same = "the same result" if self.same_result else "a different result"
        return f"<ReplayReport {self.status}, {same}, {where}>"


__all__ = ["MAX_LINE_CHARS", "Divergence", "divergence_line", "ReplayReport"]

"""Compare two recorded runs: where their command sequences part, and how their ends differ.

``diff_runs(a, b)`` walks both transcripts side by side a step at a time (``record.recording.StepReader``),
so comparing two long runs costs the memory of two steps. It reports the first divergence, the first
different answer, the results and the usage; ``RunDiff.lines()`` is what ``tensorjob diff`` prints. Both
transcripts come from files, so every value is checked and every line printed made inert and clipped.

Design: docs/internals/history.md#diffpy
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from tensorjob_jupyter.abi import encode_json
from tensorjob_jupyter.text import for_terminal, json_text
from tensorjob_jupyter.record.recording import End, Step, StepReader, compare_commands
from tensorjob_jupyter.record.event_checks import TranscriptError
from tensorjob_jupyter.history.runs import resolve_run

#: Characters of one line ``lines()`` prints at most.
MAX_LINE_CHARS = 1000


@dataclass(frozen=True)
class Parting:
    """Where two runs part: the step, why, and what each run did there."""

    step: int
    why: str
    a: str
    b: str

    def to_json(self) -> dict:
        return {"step": self.step, "why": self.why, "a": self.a, "b": self.b}


@dataclass(frozen=True)
class Side:
    """One of the two runs, as a comparison names it: who it is, how many steps, how it ended."""

    id: str
    path: Path
    name: str
    status: str
    steps: int
    guest_sha256: str | None
    model: str | None
    envelope: dict | None

    @classmethod
    def of(cls, reader: StepReader) -> "Side":
        """The run ``reader`` has read to its end."""
        created = reader.events.created or {}
        end = reader.end
        sha = (created.get("guest") or {}).get("sha256")
        return cls(str(created.get("job_id", reader.events.run_dir.name)), reader.events.run_dir,
                   str(created.get("name", "?")), end.status if end is not None else "interrupted", reader.count,
                   sha if isinstance(sha, str) else None, created.get("model"),
                   end.envelope if end is not None else None)

    def to_json(self) -> dict:
        return {"id": self.id, "path": str(self.path), "name": self.name, "status": self.status,
                "steps": self.steps, "guest_sha256": self.guest_sha256, "envelope": self.envelope}


def _end_command(end: End | None) -> dict:
    """How a run's command sequence ends, as one more pseudo-command."""
    if end is None:
        return {"cmd": "(the transcript stops here: the run was interrupted)"}
    if end.ended_during == "done" or end.status == "completed":
        return {"cmd": "done"}
    if end.ended_during == "fail":
        return {"cmd": "fail", "code": (end.error or {}).get("code")}
    error = end.error or {}
    return {"cmd": f"(the run {end.status} here: {error.get('code')})"}


def _answer(step: Step) -> Any:
    if step.infer is not None:
        return {"text": step.infer.text if step.infer.text is not None else "".join(step.infer.pieces),
                "status": step.infer.status, "reason": step.infer.reason}
    if isinstance(step.outcome.get("vectors"), list):  # an embed's vectors, compared by their digest
        vectors = step.outcome["vectors"]
        digest = hashlib.sha256(b"".join(v.tobytes() for v in vectors)).hexdigest()
        return {**step.outcome, "vectors": f"{len(vectors)} vectors, SHA-256 {digest[:16]}"}
    return step.outcome


def _shown(value: Any, limit: int = 160) -> str:
    text = value if isinstance(value, str) else encode_json(value).decode("utf-8", "replace")
    text = for_terminal(text, one_line=True)
    return text if len(text) <= limit else text[:limit] + "…"


def _line(text: str) -> str:
    text = for_terminal(text, one_line=True)
    return text if len(text) <= MAX_LINE_CHARS else text[:MAX_LINE_CHARS] + "…"


@dataclass
class RunDiff:
    a: Side
    b: Side
    common: int  # leading steps with the same command (the end counts as one)
    parting: Parting | None
    answer: Parting | None

    @property
    def same_result(self) -> bool:
        ea, eb = self.a.envelope, self.b.envelope
        if ea is None or eb is None:
            return ea is eb
        keys = ("status", "result", "error")
        return all(encode_json(ea.get(k)) == encode_json(eb.get(k)) for k in keys)

    @property
    def same(self) -> bool:
        return self.parting is None and self.answer is None and self.same_result

    def lines(self) -> list[str]:
        """What ``tensorjob diff`` prints: each line inert (no control, escape or bidi character) and clipped."""
        a, b = self.a, self.b
        out = [f"A {a.id}: {a.name} ({a.status}, {_steps(a.steps)}, guest {(a.guest_sha256 or '?')[:12]})",
               f"B {b.id}: {b.name} ({b.status}, {_steps(b.steps)}, guest {(b.guest_sha256 or '?')[:12]})"]
        if self.parting is None:
            out.append(f"commands: the same {_steps(self.common - 1)}, and the same end")
        else:
            p = self.parting
            out += [f"commands: the same for {_steps(self.common)}; they part at step {p.step} ({p.why})",
                    f"  A: {p.a}", f"  B: {p.b}"]
        if self.answer is not None:
            p = self.answer
            out += [f"answers: the first that differs is at step {p.step} ({p.why})", f"  A: {p.a}", f"  B: {p.b}"]
        else:
            out.append("answers: the same in every shared step")
        ea, eb = a.envelope, b.envelope
        if self.same_result:
            out.append("result: the same" + (f" ({ea.get('status')})" if ea else " (neither run ended)"))
        else:
            out += ["result: differs", f"  A: {_end_text(ea)}", f"  B: {_end_text(eb)}"]
        ua, ub = (ea or {}).get("usage") or {}, (eb or {}).get("usage") or {}
        out.append(f"usage: tokens in {ua.get('tokens_in', '-')} / {ub.get('tokens_in', '-')}, "
                   f"out {ua.get('tokens_out', '-')} / {ub.get('tokens_out', '-')}, "
                   f"{ua.get('duration_ms', '-')} ms / {ub.get('duration_ms', '-')} ms")
        ma, mb = ua.get("model", a.model), ub.get("model", b.model)
        if ma != mb:
            out.append(f"model: {ma} / {mb}")
        return [_line(line) for line in out]

    def to_json(self) -> dict:
        return {"a": self.a.to_json(), "b": self.b.to_json(), "common_steps": self.common,
                "divergence": self.parting.to_json() if self.parting else None,
                "first_different_answer": self.answer.to_json() if self.answer else None,
                "same_result": self.same_result, "same": self.same}


def _steps(n: int) -> str:
    return f"{n} step" if n == 1 else f"{n} steps"


def _end_text(envelope: dict | None) -> str:
    if envelope is None:
        return "no end (interrupted)"
    if envelope.get("status") == "completed":
        return "completed: " + _shown(json_text(envelope.get("result"), pretty=False), 300)
    error = envelope.get("error") or {}
    return _shown(f"{envelope.get('status')}: {error.get('code')}: {error.get('message')}", 300)


def _walk(a: StepReader, b: StepReader) -> tuple[int, Parting | None, Parting | None]:
    """Both runs' steps side by side, one of each held at a time: (commands in common, where they
    part, the first shared step answered otherwise). Each run is read to its end (its step count)."""
    steps_a: Iterator[Step] = iter(a)
    steps_b: Iterator[Step] = iter(b)
    common, parting, answer = 0, None, None
    while True:
        sa, sb = next(steps_a, None), next(steps_b, None)  # a run out of steps has read its end
        ca = sa.command if sa is not None else _end_command(a.end)
        cb = sb.command if sb is not None else _end_command(b.end)
        differs = compare_commands(ca, cb)
        if differs is not None:
            parting = Parting(common + 1, *differs)
            break
        common += 1
        if sa is None or sb is None:
            break  # both at their (same) end
        if answer is None:
            va, vb = _answer(sa), _answer(sb)
            if encode_json(va) != encode_json(vb):
                what = "another answer from the model" if sa.infer is not None else "another answer from the host"
                answer = Parting(sa.number, what, _shown(va), _shown(vb))
    for _ in steps_a:  # read on to count the steps (and find the end), holding none of them
        pass
    for _ in steps_b:
        pass
    return common, parting, answer


def diff_runs(a: Any, b: Any, *, runs: str | os.PathLike | None = None) -> RunDiff:
    """Compare two runs, each an id, a unique prefix of one, a run folder or a ``Job``."""
    readers = [StepReader(resolve_run(a, runs)), StepReader(resolve_run(b, runs))]
    common, parting, answer = _walk(*readers)
    for reader in readers:
        if reader.events.version < 1:
            raise TranscriptError(f"{for_terminal(reader.events.run_dir.name, one_line=True)}: its transcript "
                                  f"predates format version 1 and records no prompts, so it cannot be compared "
                                  f"command by command")
    return RunDiff(Side.of(readers[0]), Side.of(readers[1]), common, parting, answer)


__all__ = ["MAX_LINE_CHARS", "Parting", "Side", "RunDiff", "diff_runs"]

"""Compare two recorded runs: where their command sequences part, and how their ends differ.

``diff_runs(a, b)`` reads both transcripts (``transcript.Recording``) and
walks their steps side by side. Each run's sequence ends with how it ended
(``done``, ``fail``, or the host's end), so a run that stopped early parts
from one that went on. It reports:

* the first **divergence**: the first step whose command differs -- another
  command, another prompt, another window -- with both commands, or None
  when the sequences are the same;
* the first **different answer** among the steps both share: an infer whose
  text differs (another model, another machine), a window whose content
  changed, other vectors;
* the **result**: the two envelopes' status, result or error;
* the **usage**: tokens in and out, duration, model.

``RunDiff.lines()`` is the text ``tensorjob diff`` prints; ``to_json()`` the
same as data. Guest and model text is made inert and clipped.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from .abi import encode_json
from .text import for_terminal, json_text
from .transcript import Recording, Step, TranscriptError, compare_commands, describe


@dataclass(frozen=True)
class Parting:
    """Where two runs part: the step, why, and what each run did there."""

    step: int
    why: str
    a: str
    b: str

    def to_json(self) -> dict:
        return {"step": self.step, "why": self.why, "a": self.a, "b": self.b}


def _end_command(recording: Recording) -> dict:
    """How a run's command sequence ends, as one more pseudo-command."""
    end = recording.end
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
    return step.outcome


def _clip(value: Any, limit: int = 160) -> str:
    text = value if isinstance(value, str) else encode_json(value).decode("utf-8", "replace")
    text = for_terminal(text, one_line=True)
    return text if len(text) <= limit else text[:limit] + "…"


@dataclass
class RunDiff:
    a: Recording
    b: Recording
    common: int  # leading steps with the same command
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
        a, b = self.a, self.b
        out = [for_terminal(f"A {a.id}: {a.name} ({a.status}, {_steps(len(a.steps))}, guest "
                            f"{str(a.guest.get('sha256', '?'))[:12]})", one_line=True),
               for_terminal(f"B {b.id}: {b.name} ({b.status}, {_steps(len(b.steps))}, guest "
                            f"{str(b.guest.get('sha256', '?'))[:12]})", one_line=True)]
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
            out.append(for_terminal(f"model: {ma} / {mb}", one_line=True))
        return out

    def to_json(self) -> dict:
        def run(r: Recording) -> dict:
            return {"id": r.id, "path": str(r.path), "name": r.name, "status": r.status, "steps": len(r.steps),
                    "guest_sha256": r.guest.get("sha256"), "envelope": r.envelope}

        return {"a": run(self.a), "b": run(self.b), "common_steps": self.common,
                "divergence": self.parting.to_json() if self.parting else None,
                "first_different_answer": self.answer.to_json() if self.answer else None,
                "same_result": self.same_result, "same": self.same}


def _steps(n: int) -> str:
    return f"{n} step" if n == 1 else f"{n} steps"


def _end_text(envelope: dict | None) -> str:
    if envelope is None:
        return "no end (interrupted)"
    if envelope.get("status") == "completed":
        return "completed: " + _clip(json_text(envelope.get("result"), pretty=False), 300)
    error = envelope.get("error") or {}
    return _clip(f"{envelope.get('status')}: {error.get('code')}: {error.get('message')}", 300)


def diff_recordings(a: Recording, b: Recording) -> RunDiff:
    for r in (a, b):
        if r.version < 1:
            raise TranscriptError(f"{for_terminal(r.id, one_line=True)}: its transcript predates format version 1 "
                                  f"and records no prompts, so it cannot be compared command by command")
    seq_a = [s.command for s in a.steps] + [_end_command(a)]
    seq_b = [s.command for s in b.steps] + [_end_command(b)]
    common, parting = 0, None
    for i, (ca, cb) in enumerate(zip(seq_a, seq_b)):
        differs = compare_commands(ca, cb)
        if differs is not None:
            parting = Parting(i + 1, differs[0], differs[1], differs[2])
            break
        common += 1
    if parting is None and len(seq_a) != len(seq_b):  # pragma: no cover - each ends with its end
        i = common
        parting = Parting(i + 1, "one run goes on", describe(seq_a[i] if i < len(seq_a) else None),
                          describe(seq_b[i] if i < len(seq_b) else None))
    answer = None
    for i in range(min(common, len(a.steps), len(b.steps))):
        sa, sb = a.steps[i], b.steps[i]
        va, vb = _answer(sa), _answer(sb)
        if encode_json(va) != encode_json(vb):
            what = "another answer from the model" if sa.infer is not None else "another answer from the host"
            answer = Parting(sa.number, what, _clip(va), _clip(vb))
            break
    return RunDiff(a, b, common, parting, answer)


def diff_runs(a: Any, b: Any, *, runs: str | os.PathLike | None = None) -> RunDiff:
    """Compare two runs, each an id, a unique prefix of one, a run folder or a ``Job``."""
    from .history import resolve_run

    return diff_recordings(Recording.read(resolve_run(a, runs)), Recording.read(resolve_run(b, runs)))

"""Who carries out a guest's commands: the live world, or a recording -- the reactor takes one.

The reactor steps the guest and owns what every job has (limits, clock, cancel, debugger, events); an
``Answerer`` carries out each command it returns and hands back the answering event. ``LiveWorld`` answers
from the world, ``history.replay.RecordedWorld`` from a recording. Both reach the job only through
``JobContext``, so an answer from a recording passes the same checks and publishes the same events as a live one.

Design: docs/internals/host.md#answererpy
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence

from tensorjob_jupyter import abi


class JobContext(Protocol):
    """What an answerer may use of its job (``reactor.Reactor`` is the one implementation)."""

    stream: Any  # the job's event stream (record.events.EventStream)
    limits: Any
    usage: abi.Usage
    stats: Any
    cancel: Any  # a threading.Event
    infer_options: Any
    pending_command: str | None

    def check_running(self) -> None: ...

    def carry_out(self, command: abi.Command) -> abi.Event: ...

    def model_backend(self) -> Any: ...

    def plan_infer(self, cmd: abi.Infer) -> Any: ...

    def open_response(self, cmd: abi.Infer, plan: Any, model: str, *, call_id: str | None = None) -> Any: ...

    def token_loop(self, response: Any, publish: Any) -> Any: ...

    def answer_infer(self, plan: Any, router: Any, response: Any, result: Any, delivery: Any, *,
                     already: Sequence[str] = ()) -> abi.Event: ...

    def count_tokens(self, tokens_in: int, tokens_out: int) -> None: ...


class Answerer(Protocol):
    """Carries out the commands of one job's guest."""

    def answer(self, command: abi.Command, job: "JobContext") -> abi.Event:
        """The event that answers ``command`` (never ``done`` or ``fail``); a ``JobFailure`` ends the job."""

    def determinism(self, job: "JobContext") -> Any:
        """A Python guest's seed, clock origin and clock readings: None for new ones, or the recorded ones."""

    def finished(self, job: "JobContext") -> None:
        """The guest has returned ``done`` or ``fail`` (``job.pending_command`` says which)."""


class LiveWorld:
    """The live world: every command carried out for real (``Reactor.carry_out``)."""

    def answer(self, command: abi.Command, job: "JobContext") -> abi.Event:
        return job.carry_out(command)

    def determinism(self, job: "JobContext") -> Any:
        return None

    def finished(self, job: "JobContext") -> None:
        pass


__all__ = ["Answerer", "JobContext", "LiveWorld"]

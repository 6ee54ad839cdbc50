"""Who carries out a guest's commands: the live world, or a recording -- the reactor takes one.

The reactor (``reactor.py``) steps the guest and owns what every job has: its
limits, clock, cancel, debugger and event stream. An ``Answerer`` carries out
each command the guest returns and hands back the event that answers it --
beside the token loop's token source (``tokens.py``), which does the same for
one answer's pieces:

* ``LiveWorld`` answers from the world: files under the job's grants, fetch,
  documents and the model, through ``Reactor.carry_out``;
* ``history.replay.RecordedWorld`` answers from a run's recording, comparing
  each command with the recorded one first, and from a divergence on falls
  back to the live world (``--live``) or stops the job.

What an answerer may use of the job is ``JobContext``, the reactor's public
face: its stream, limits, usage, stats and cancel, ``carry_out``, and the
steps of one infer -- plan it, open its response, run its token loop, check
and close its answer -- so an answer from a recording goes through the same
checks and publishes the same events as a live one.
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

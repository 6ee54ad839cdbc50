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

What an answerer may use of the job is the reactor's public face: its
``stream``, ``limits``, ``usage``, ``stats``, ``cancel`` and
``check_running``, ``carry_out``, and the steps of one infer --
``plan_infer``, ``open_response``, ``token_loop``, ``answer_infer``,
``count_tokens``, ``model_backend`` -- so an answer from a recording goes
through the same checks and publishes the same events as a live one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from tensorjob_jupyter import abi

if TYPE_CHECKING:  # the reactor imports this module
    from tensorjob_jupyter.host.reactor import Reactor


class Answerer(Protocol):
    """Carries out the commands of one job's guest."""

    def answer(self, command: abi.Command, job: "Reactor") -> abi.Event:
        """The event that answers ``command`` (never ``done`` or ``fail``); a ``JobFailure`` ends the job."""

    def determinism(self, job: "Reactor") -> Any:
        """A Python guest's seed, clock origin and clock readings: None for new ones, or the recorded ones."""

    def finished(self, job: "Reactor") -> None:
        """The guest has returned ``done`` or ``fail`` (``job.pending_command`` says which)."""


class LiveWorld:
    """The live world: every command carried out for real (``Reactor.carry_out``)."""

    def answer(self, command: abi.Command, job: "Reactor") -> abi.Event:
        return job.carry_out(command)

    def determinism(self, job: "Reactor") -> Any:
        return None

    def finished(self, job: "Reactor") -> None:
        pass


__all__ = ["Answerer", "LiveWorld"]

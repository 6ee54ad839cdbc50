"""Helpers for the Python-guest tests: the interpreter, a minimal reactor, and sources.

``drive(source)`` runs a ``PythonGuest`` the way the reactor does -- ``init``,
then ``step`` per command, ``on_token`` per token of an infer -- answering
each command from a small table, so the sandbox's own guarantees are tested
without a model, files or a transcript. The jobs tests (``tj.Job``, the CLI)
use the real reactor.
"""

from __future__ import annotations

import json
import textwrap
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from tensorjob_jupyter import abi
from tensorjob_jupyter.limits import Limits
from tensorjob_jupyter.sandbox.guest import GuestTrap
from tensorjob_jupyter.sandbox.python import interpreter
from tensorjob_jupyter.sandbox.python.guest import Determinism, PythonGuest
from tensorjob_jupyter.sandbox.python.program import PythonProgram

TOKENS = ["The", " quick", " brown", " fox", " jumps", "."]


def ensure_interpreter() -> None:
    """Build and compile the interpreter once for the test session (minutes on a cold cache)."""
    interpreter.ensure(False)


def src(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


@dataclass
class Outcome:
    command: abi.Command | None = None
    trap: GuestTrap | None = None
    commands: list = field(default_factory=list)
    events: list = field(default_factory=list)
    judged: list = field(default_factory=list)  # tokens the guest was offered, per infer
    guest: PythonGuest | None = None
    seconds: float = 0.0

    @property
    def result(self) -> Any:
        assert isinstance(self.command, abi.Done), (self.command, self.trap)
        return self.command.result

    @property
    def failure(self) -> abi.Fail:
        assert isinstance(self.command, abi.Fail), (self.command, self.trap)
        return self.command

    def log_lines(self, stream: str = "stdout") -> list[str]:
        return [line for t, f in self.events if t == "job.log" and f["stream"] == stream for line in f["lines"]]


def answer(cmd: abi.Command) -> abi.Event:
    if isinstance(cmd, abi.Emit):
        return abi.Emitted()
    if isinstance(cmd, abi.Embed):
        return abi.Embedded([[float(len(t)), 1.0] for t in cmd.texts])
    if isinstance(cmd, abi.Open):
        return abi.Opened(7, 11, abi.TEXT)
    if isinstance(cmd, abi.Slice):
        data = "hello world"[cmd.offset:cmd.offset + cmd.len]
        return abi.Sliced(data, cmd.offset + len(data.encode()))
    raise AssertionError(f"no answer for {cmd!r}")


def drive(source: str, input: Any = None, *, limits: Limits | None = None, tokens: list[str] = TOKENS,
          respond: Callable[[abi.Command], abi.Event] = answer, deadline: float | None = None,
          determinism: Determinism | None = None, cancel_after: float | None = None,
          filename: str = "cell.py", input_bytes: bytes = b"") -> Outcome:
    out = Outcome()
    publish = lambda type, **fields: out.events.append((type, fields))  # noqa: E731
    imports = []
    if input_bytes:
        from tensorjob_jupyter.sandbox.streaming import StreamingHost
        imports.append(StreamingHost(limits or Limits(), lambda b: out.events.append(("job.chunk", {"data": b})),
                                     input_bytes))
    started = time.monotonic()
    guest = PythonGuest(PythonProgram(src(source), filename), limits or Limits(call_timeout_s=5), imports,
                        deadline=deadline, publish=publish, determinism=determinism)
    out.guest = guest
    timer = None
    if cancel_after is not None:
        timer = threading.Timer(cancel_after, guest.interrupt)
        timer.start()
    try:
        cmd = guest.init(json.dumps(input).encode())
        while not isinstance(cmd, (abi.Done, abi.Fail)):
            out.commands.append(cmd)
            if isinstance(cmd, abi.Infer):
                offered = []
                for piece in tokens[:cmd.max_tokens]:
                    offered.append(piece)
                    if not guest.on_token(piece):
                        break
                out.judged.append(offered)
                text = "".join(tokens[:cmd.max_tokens])
                event = abi.InferDone(text, min(len(tokens), cmd.max_tokens))
            else:
                event = respond(cmd)
            cmd = guest.step(event)
        out.command = cmd
    except GuestTrap as e:
        out.trap = e
    finally:
        if timer is not None:
            timer.cancel()
        guest.close()
        out.seconds = time.monotonic() - started
    return out

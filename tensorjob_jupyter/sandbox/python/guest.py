"""``PythonGuest``: a Python guest, run by CPython-in-wasm, that the reactor drives like any guest.

A Python guest's ``main(input)`` is ordinary blocking code, so the interpreter runs on a thread of
its own and every guest-API call hands one command to the reactor's thread and waits for its
answer. The host still sees every command before it is carried out (grants, limits, the debugger,
the transcript), and the two threads strictly alternate, so the wasmtime ``Store`` is only used by
the interpreter's thread. Deadlines, fuel and memory are the job's; nothing of the host is
granted, and the clock and random source are the host's, recorded for replay. It is longer than
most rooms because it is the whole adapter: the interpreter's thread, the hand-over of each
command, the host calls it serves and the deadline it arms all change together.

Design: docs/internals/sandbox.md#pythonguestpy
"""

from __future__ import annotations

import hashlib
import json
import queue
import random
import re
import threading
import time
from typing import Any, Callable, Iterable

import wasmtime
from wasmtime import _ffi as ffi
from wasmtime import component

from tensorjob_jupyter import abi
from tensorjob_jupyter.abi import codes, event_types
from tensorjob_jupyter.limits import Limits
from tensorjob_jupyter.sandbox.engines import EpochTicked, PoolShape, SharedEngine, engine_for
from tensorjob_jupyter.sandbox.guest import GuestTrap, PoolRefused
from tensorjob_jupyter.sandbox.python import hostcall, interpreter
from tensorjob_jupyter.sandbox.python.program import MAX_SOURCE_BYTES, PythonProgram, format_syntax_error
from tensorjob_jupyter.sandbox.streaming import DISABLED, DISCONNECTED, OK, REFUSED, StreamingHost

WASI = "@0.2.9"
HOST = "tensorjob:python/host@0.1.0"
#: Fuel the interpreter may use before the guest's own code starts (instantiation,
#: setting up, compiling the guest's source); the job's ``fuel`` counts from there.
STARTUP_FUEL = 5_000_000_000
#: Extra wall-clock time the reactor waits, past a call's deadline, for the
#: interpreter thread to report the trap before it gives up on it.
GRACE_S = 2.0
#: The job's log: characters per line, and bytes of lines per job (then lines are counted, not kept).
MAX_LOG_LINE_CHARS = 2_000
MAX_LOG_BYTES = 1024 * 1024
#: Clock readings a job records; later readings advance by 1 us each (deterministic, unrecorded).
MAX_CLOCK_READINGS = 100_000
#: Random bytes one WASI call may ask for (CPython asks for at most 256 at a time).
MAX_RANDOM_BYTES = 64 * 1024
#: Most staged input one read-input call returns.
MAX_READ_INPUT = 4 * 1024 * 1024
EVENT_LOG, EVENT_CLOCK, EVENT_INTERPRETER = event_types.JOB_LOG, event_types.JOB_CLOCK, event_types.JOB_INTERPRETER

_CLOSE = "tensorjob: the job has ended"


class _Protocol(Exception):
    pass


class Determinism:
    """The values a Python guest gets from its world: a random seed, a wall-clock origin, clock readings.

    A new job draws a seed and reads the real clock; a replay gives the
    recorded seed, origin and readings back, in order, then goes on from the
    last reading with the real clock. Either way every reading is published
    (``job.clock``), so a replay's own transcript replays too.
    """

    def __init__(self, seed: int | None = None, wall_origin_ns: int | None = None,
                 readings: Iterable[int] | None = None):
        self.seed = random.SystemRandom().getrandbits(63) if seed is None else int(seed)
        self.wall_origin_ns = time.time_ns() if wall_origin_ns is None else int(wall_origin_ns)
        self.replaying = readings is not None
        self._recorded = list(readings or ())
        self._next = 0
        self._mono0 = time.monotonic_ns()
        self._offset = 0  # added to real readings after the recorded ones run out
        self._last = 0
        self.count = 0
        self.pending: list[int] = []  # readings not yet published

    @classmethod
    def from_events(cls, events: Iterable[dict]) -> "Determinism | None":
        """What a recorded run's Python guest got (``job.interpreter``, ``job.clock``), for its replay.

        The events are untrusted (a transcript may come from anywhere): a
        value of the wrong type or range is ignored, the readings are capped
        at ``MAX_CLOCK_READINGS`` and kept non-decreasing. None when the run
        had no Python guest.
        """
        def integer(value: Any, top: int) -> int | None:
            ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value < top
            return value if ok else None

        seed = origin = None
        readings: list[int] = []
        for event in events:
            kind = event.get("type") if isinstance(event, dict) else None
            if kind == EVENT_INTERPRETER and seed is None:
                seed = integer(event.get("seed"), 2**63)
                origin = integer(event.get("wall_origin_ns"), 2**63)
            elif kind == EVENT_CLOCK and isinstance(event.get("readings"), list):
                for value in event["readings"]:
                    value = integer(value, 2**63)
                    if value is not None and len(readings) < MAX_CLOCK_READINGS:
                        readings.append(max(value, readings[-1]) if readings else value)
        if seed is None:
            return None
        return cls(seed, origin, readings)

    def reading(self) -> int:
        """Monotonic nanoseconds since the guest started (recorded, or replayed)."""
        self.count += 1
        if self._next < len(self._recorded):
            value = self._recorded[self._next]
            self._next += 1
            if self._next == len(self._recorded):
                self._offset = value - (time.monotonic_ns() - self._mono0)
            self._last = max(self._last, value)
            self.pending.append(value)  # a replay's transcript records them too: it replays again
            return value
        if self.count > MAX_CLOCK_READINGS:
            self._last += 1000
            return self._last
        value = max(self._last, time.monotonic_ns() - self._mono0 + self._offset)
        self._last = value
        self.pending.append(value)
        return value


def _set_fuel(store: Any, fuel: int) -> None:
    """``Store.set_fuel`` for a store or a host function's store context."""
    err = ffi.wasmtime_context_set_fuel(store._context(), fuel)
    if err:
        raise wasmtime.WasmtimeError._from_ptr(err)


def _record(**fields: Any) -> component.Record:
    r = component.Record()
    r.__dict__.update(fields)
    return r


#: In a trap's wasm backtrace: the interpreter's binding runtime (componentize-py's, Rust) panicked...
_RUNTIME_PANIC = re.compile(r"componentize_py_runtime\.wasm!(?:core::panicking|core::result::unwrap_failed|"
                            r"std::panicking)")
#: ... and not because an allocation failed (that abort is the job's memory running out).
_ALLOCATION_FAILED = re.compile(r"alloc_error|rust_oom|handle_alloc_error")
#: The host function whose adapter was running: ``<unknown>!adapter log``.
_ADAPTER = re.compile(r"!adapter ([a-z][a-z0-9-]{0,40})")


def _binding_panic(text: str) -> bool:
    """Whether a trap's backtrace shows the binding runtime rejecting a value (a raw WIT binding called
    with an argument out of its type's range: a guest's error, not the memory limit)."""
    return _RUNTIME_PANIC.search(text) is not None and _ALLOCATION_FAILED.search(text) is None


def _binding_name(text: str) -> str | None:
    match = _ADAPTER.search(text)
    return match.group(1) if match else None


def _first_error_line(e: BaseException) -> str:
    text = str(e)
    for line in text.splitlines():
        if "wasm trap:" in line:
            return line[line.index("wasm trap:") + len("wasm trap:"):].strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if "Caused by:" in lines:
        rest = lines[lines.index("Caused by:") + 1:]
        if rest:
            last = rest[-1]
            return last.split(":", 1)[-1].strip() if last[:1].isdigit() else last
    return lines[0] if lines else type(e).__name__


class PythonGuest(EpochTicked):
    """A live Python guest: the interface of ``sandbox.guest.Guest``, for CPython-in-wasm."""

    def __init__(self, program: PythonProgram | bytes, limits: Limits | None = None,
                 imports: Iterable[Any] = (), *, deadline: float | None = None,
                 publish: Callable[..., Any] | None = None, determinism: Determinism | None = None,
                 progress: interpreter.Progress | None = None):
        if not isinstance(program, PythonProgram):
            program = PythonProgram.from_bytes(program)
        self.program = program
        self.limits = limits or Limits()
        self.deadline = deadline
        self.digest = hashlib.sha256(program.to_bytes()).hexdigest()
        self.peak_memory_bytes = 0  # a component does not show its linear memory to the host
        self.determinism = determinism or Determinism()
        self._publish = publish or (lambda *a, **k: None)
        self._streaming = next((i for i in imports if isinstance(i, StreamingHost)), None)
        self._interrupted = False
        self._closed = False
        self._dead = False  # the interpreter thread has ended (a trap or the final command)
        self._host_error: BaseException | None = None  # a host failure inside a host function
        self._to_guest: queue.SimpleQueue = queue.SimpleQueue()
        self._to_host: queue.SimpleQueue = queue.SimpleQueue()
        self._expect = "command"  # what the guest may call next: "command" or "verdict"
        self._stream_infer = False  # the infer being carried out is streamed to the guest
        self._thread: threading.Thread | None = None
        self._cause = "call"
        self._export = "start-up"
        self._log_bytes = 0
        self._log_dropped = 0
        self._log_partial = {1: "", 2: ""}
        self._log_extra = {1: 0, 2: 0}
        self.fuel = self.limits.fuel is not None

        if len(program.source.encode("utf-8")) > MAX_SOURCE_BYTES:
            raise GuestTrap(codes.WASM_TRAP, f"the Python guest is over {MAX_SOURCE_BYTES} bytes")
        try:
            self.interpreter = interpreter.ensure(self.fuel, progress)
        except interpreter.InterpreterError as e:
            raise GuestTrap(codes.UNSUPPORTED, f"cannot run a Python guest: {e}") from None
        self._rng = random.Random(self.determinism.seed)
        try:
            run, check = self._start(pooled=True)
        except PoolRefused:  # a pool's own limits, or its room, refused what the on-demand engine allows
            run, check = self._start(pooled=False)
        if run is None or check is None:
            self.close()
            raise GuestTrap(codes.WASM_TRAP, "the Python interpreter lacks its run/check exports")
        self._run, self._check = run, check
        self._publish(EVENT_INTERPRETER, interpreter=self.interpreter.describe(), filename=program.filename,
                      source_sha256=hashlib.sha256(program.source.encode("utf-8")).hexdigest(),
                      seed=self.determinism.seed, wall_origin_ns=self.determinism.wall_origin_ns)

    def _start(self, *, pooled: bool) -> tuple[Any, Any]:
        """The interpreter's instance in a store of its own, on the pooled engine of these settings where it may
        (``engines.engine_for``), else on demand; its ``run`` and ``check`` exports. ``PoolRefused`` where a
        pooled engine refused it for its own limits or room (no guest code has run), to start it on demand."""
        self._closed, self._stopped = False, None
        try:
            self._shared, comp, linker = _prepared(self.interpreter, self.fuel, self.limits.stack_bytes,
                                                    self.limits.memory_bytes, pooled=pooled)
        except interpreter.InterpreterError as e:
            raise GuestTrap(codes.UNSUPPORTED, f"cannot run a Python guest: {e}") from None
        self._store = wasmtime.Store(self._shared.engine)
        self._store.set_wasi(wasmtime.WasiConfig())  # nothing granted: no dirs, env, args, network
        self._store.set_limits(memory_size=self.limits.memory_bytes, table_elements=1_000_000)
        if self.fuel:
            self._store.set_fuel(STARTUP_FUEL)
        self._watch(self._store)
        self._start_ticks()
        _CURRENT.guest = self
        try:
            self._arm(self._store)
            instance = linker.instantiate(self._store, comp)
            run = instance.get_func(self._store, "run")
            check = instance.get_func(self._store, "check")
        except wasmtime.WasmtimeError as e:
            self.close()
            message = _first_error_line(e)
            if "memory" in message and ("limit" in message or "minimum" in message):
                raise GuestTrap(codes.LIMIT_EXCEEDED, f"the Python interpreter needs more memory than the job's "
                                                      f"memory_bytes ({self.limits.memory_bytes}): {message}") from None
            if self._shared.pooled and self._stopped is None:
                raise PoolRefused(message) from None
            raise GuestTrap(codes.WASM_TRAP, f"could not start the Python interpreter: {message}") from None
        finally:
            _CURRENT.guest = None
        return run, check

    # -- the host functions (run on the interpreter's thread, inside a guest call) ---------------

    def _guarded(self, fn: Callable, store: Any, *args: Any) -> Any:
        """A host function's call: a failure ends the guest's call with a ``WasmtimeError``, never an
        exception into wasmtime's process-wide error slot."""
        try:
            return fn(store, *args)
        except wasmtime.WasmtimeError:
            raise
        except _Protocol as e:
            raise wasmtime.WasmtimeError(f"tensorjob: the guest broke the host protocol: {e}") from None
        except BaseException as e:  # noqa: BLE001 - never into wasmtime's process-wide error slot
            if self._host_error is None:
                self._host_error = e
            raise wasmtime.WasmtimeError(f"tensorjob: host failure: {type(e).__name__}: {e}") from None

    def _h_random_u64(self, store: Any) -> int:
        return self._rng.getrandbits(64)

    def _h_insecure_seed(self, store: Any) -> tuple[int, int]:
        return self._rng.getrandbits(64), self._rng.getrandbits(64)

    def _h_command(self, store: Any, text: str, stream: bool) -> str:
        if self._expect != "command":
            raise _Protocol("it sent a command while the host waited for its verdict on a token")
        data = text.encode("utf-8", "surrogatepass")
        if len(data) > self.limits.max_command_bytes:
            return (f"X a {len(data)}-byte command is over the {self.limits.max_command_bytes}-byte limit "
                    f"(max_command_bytes)")
        try:
            command = abi.parse_command(data, max_values=self.limits.max_command_values)
        except abi.AbiError as e:
            return f"X{e}"
        self._hand_over(store, ("cmd", command, bool(stream) and isinstance(command, abi.Infer)))
        return self._answer(store)

    def _h_verdict(self, store: Any, stop: bool) -> str:
        if self._expect != "verdict":
            raise _Protocol("it sent a token verdict while no token was waiting")
        self._hand_over(store, ("verdict", not stop))
        return self._answer(store)

    def _hand_over(self, store: Any, message: tuple) -> None:
        """Give the turn to the reactor (the guest waits for the answer next)."""
        self._publish_clock()
        self._to_host.put(message)

    def _answer(self, store: Any) -> str:
        """Wait for the reactor's answer; re-arm the deadline before the guest runs again."""
        while True:
            try:
                message = self._to_guest.get(timeout=1.0)
                break
            except queue.Empty:
                if self._closed:
                    raise wasmtime.WasmtimeError(_CLOSE) from None
        kind = message[0]
        if kind == "close":
            raise wasmtime.WasmtimeError(_CLOSE)
        self._arm(store)
        if kind == "event":
            self._expect = "command"
            return "E" + message[1]
        self._expect = "verdict"
        return "T" + message[1]

    def _h_ready(self, store: Any) -> None:
        self._export = "main"
        fuel = self.limits.fuel
        if fuel is not None:  # self.fuel
            _set_fuel(store, fuel)

    def _h_log(self, store: Any, stream: int, text: str) -> None:
        stream = 2 if stream == 2 else 1
        lines = text.split("\n")
        last = lines.pop()  # the start of a line not yet ended
        complete = []
        for part in lines:
            complete.append(self._line_part(stream, part, end=True))
        self._line_part(stream, last, end=False)
        self._publish_lines(stream, complete)

    def _line_part(self, stream: int, part: str, *, end: bool) -> str:
        """Add ``part`` to the stream's open line (kept to MAX_LOG_LINE_CHARS, the rest counted)."""
        kept = self._log_partial[stream]
        room = MAX_LOG_LINE_CHARS - len(kept)
        if room > 0:
            kept += part[:room]
        self._log_extra[stream] += max(0, len(part) - max(room, 0))
        if not end:
            self._log_partial[stream] = kept
            return ""
        extra = self._log_extra[stream]
        self._log_partial[stream], self._log_extra[stream] = "", 0
        return f"{kept}... ({extra} more characters)" if extra else kept

    def _publish_lines(self, stream: int, lines: list[str]) -> None:
        kept = []
        for line in lines:
            size = len(line.encode("utf-8", "replace")) + 1
            if self._log_bytes + size > MAX_LOG_BYTES:
                self._log_dropped += 1
                continue
            self._log_bytes += size
            kept.append(line.encode("utf-8", "replace").decode("utf-8"))
        if kept:
            self._publish(EVENT_LOG, stream="stderr" if stream == 2 else "stdout", lines=kept)

    def _finish_log(self) -> None:
        for stream in (1, 2):
            if self._log_partial[stream] or self._log_extra[stream]:
                self._publish_lines(stream, [self._line_part(stream, "", end=True)])
        if self._log_dropped:
            self._publish(EVENT_LOG, stream="stderr", lines=[], dropped=self._log_dropped)
            self._log_dropped = 0

    def _h_emit_chunk(self, store: Any, data: str) -> int:
        s = self._streaming
        if s is None or not s.enabled:
            return DISABLED
        if len(data) > s.limits.max_chunk_bytes:
            return REFUSED
        try:
            raw = data.encode("latin-1")
        except UnicodeEncodeError:
            return REFUSED
        if s.bytes_emitted + len(raw) > s.limits.max_stream_bytes:
            return REFUSED
        if not s._listening():
            return DISCONNECTED
        s.bytes_emitted += len(raw)
        s.chunks += 1
        s._on_chunk(raw)
        return OK

    def _h_flush(self, store: Any) -> int:
        s = self._streaming
        if s is None or not s.enabled:
            return DISABLED
        s._on_flush()
        return OK

    def _h_input_len(self, store: Any) -> int:
        s = self._streaming
        return min(len(s.input_bytes), 2**32 - 1) if s is not None else 0

    def _h_read_input(self, store: Any, offset: int, length: int) -> str:
        s = self._streaming
        if s is None:
            return ""
        length = min(length, MAX_READ_INPUT)
        return s.input_bytes[offset:offset + length].decode("latin-1")

    def _h_sleep(self, store: Any, nanoseconds: int) -> None:
        seconds = nanoseconds / 1e9
        budget = self._budget()[0]
        if seconds > budget:
            raise wasmtime.WasmtimeError(f"tensorjob: time.sleep({seconds:g}) is longer than the "
                                         f"{budget:.3g} s the guest's call has left (call_timeout_s)")
        end = time.monotonic() + seconds
        while not self._interrupted and not self._closed:
            left = end - time.monotonic()
            if left <= 0:
                break
            time.sleep(min(left, 0.05))
        if self._interrupted or self._closed:
            raise wasmtime.WasmtimeError(_CLOSE)

    def _h_wall_now(self, store: Any) -> component.Record:
        ns = self.determinism.wall_origin_ns + self.determinism.reading()
        return _record(seconds=ns // 1_000_000_000, nanoseconds=ns % 1_000_000_000)

    def _h_monotonic_now(self, store: Any) -> int:
        return self.determinism.reading()

    def _h_random_bytes(self, store: Any, n: int) -> bytes:
        if n > MAX_RANDOM_BYTES:
            raise wasmtime.WasmtimeError(f"tensorjob: the guest asked for {n} random bytes at once "
                                         f"(at most {MAX_RANDOM_BYTES})")
        return self._rng.randbytes(n)

    def _publish_clock(self) -> None:
        pending = self.determinism.pending
        if pending:
            self.determinism.pending = []
            self._publish(EVENT_CLOCK, readings=pending)

    # -- deadlines and interruption ------------------------------------------------------------

    def _budget(self) -> tuple[float, str]:
        budget, cause = self.limits.call_timeout_s, "call"
        if self.deadline is not None:
            remaining = self.deadline - time.monotonic()
            if remaining < budget:
                budget, cause = max(remaining, 0.0), "job"
        return budget, cause

    def _arm(self, store: Any) -> None:
        """Set the deadline for the stretch of guest code about to run (any store context)."""
        if self._interrupted:
            raise wasmtime.WasmtimeError(_CLOSE)
        budget, cause = self._budget()
        if self.deadline is not None and budget <= 0:
            raise wasmtime.WasmtimeError("tensorjob: the job ran past its time limit")
        self._arm_until(store, budget, cause)

    def _classify(self, e: BaseException) -> GuestTrap:
        """The GuestTrap for an error that ended the interpreter's call."""
        text = str(e)
        where = "the guest's Python code" if self._export == "main" else "the Python interpreter's start-up"
        if self._interrupted:
            return GuestTrap(codes.CANCELLED, "job cancelled")
        if "wasm trap: interrupt" in text or "ran past its time limit" in text:
            if self._cause == "job":
                return GuestTrap(codes.TIMEOUT, f"the job ran past its time limit of {self.limits.job_timeout_s} s "
                                                f"(inside {where})")
            return GuestTrap(codes.TIMEOUT, f"{where} ran for more than {self.limits.call_timeout_s} s without "
                                            f"returning to the host (call_timeout_s)")
        if "all fuel consumed" in text:
            if self._export != "main":
                return GuestTrap(codes.TIMEOUT, f"the Python interpreter's start-up used up its allowance of "
                                                f"{STARTUP_FUEL} fuel")
            return GuestTrap(codes.TIMEOUT, f"the guest used up its fuel ({self.limits.fuel}) inside {where}")
        if "call stack exhausted" in text:
            return GuestTrap(codes.WASM_TRAP, f"stack overflow in {where} (recursion deeper than the "
                                              f"{self.limits.stack_bytes}-byte wasm stack; raise stack_bytes)")
        if "host protocol" in text or "a guest cannot" in text or "random bytes" in text or "time.sleep" in text:
            return GuestTrap(codes.WASM_TRAP, _first_error_line(e).removeprefix("tensorjob: "))
        if "unreachable" in text and _binding_panic(text):
            name = _binding_name(text)
            return GuestTrap(codes.WASM_TRAP, f"the guest called a raw host binding{f' (`{name}`)' if name else ''} "
                                              f"with a value it cannot take, and the Python interpreter aborted in "
                                              f"{where}")
        if "unreachable" in text:
            return GuestTrap(codes.LIMIT_EXCEEDED,
                             f"the Python interpreter aborted in {where} (out of memory: memory_bytes is "
                             f"{self.limits.memory_bytes}), or the guest broke the interpreter")
        return GuestTrap(codes.WASM_TRAP, f"{where} trapped: {_first_error_line(e)}")

    # -- the interpreter's thread ------------------------------------------------------------------

    def _thread_main(self, input_text: str) -> None:
        store = self._store
        message: tuple
        _CURRENT.guest = self
        try:
            self._export = "start-up"
            self._arm(store)
            out = self._run(store, self.program.source, self.program.filename, input_text)
            self._run.post_return(store)
            message = ("final", out)
        except wasmtime.WasmtimeError as e:
            message = ("trap", self._classify(e)) if _CLOSE not in str(e) or self._interrupted else ("closed",)
        except BaseException as e:  # noqa: BLE001 - a host bug: reported, never lost
            message = ("trap", GuestTrap(codes.INTERNAL_ERROR, f"the Python guest's host thread failed: "
                                                               f"{type(e).__name__}: {e}"))
        finally:
            self._dead = True
            _CURRENT.guest = None
        try:
            if message[0] == "final":
                self._finish_log()
                self._publish_clock()
        except BaseException as e:  # noqa: BLE001
            if self._host_error is None:
                self._host_error = e
        self._to_host.put(message)
        self._release_store()

    def _release_store(self) -> None:
        store = self.__dict__.pop("_store", None)
        for attr in ("_run", "_check"):
            self.__dict__.pop(attr, None)
        if store is not None:
            store.close()

    # -- the reactor's side ----------------------------------------------------------------------

    def _wait(self) -> tuple:
        """The interpreter's next message; raises the GuestTrap that ended it."""
        waited_past = None
        while True:
            budget, _ = self._budget()
            try:
                message = self._to_host.get(timeout=min(max(budget, 0.05), 0.5))
                break
            except queue.Empty:
                thread = self._thread
                if thread is None or not thread.is_alive():
                    if not self._to_host.empty():
                        continue
                    raise GuestTrap(codes.INTERNAL_ERROR, "the Python guest's thread ended without an answer")
                if budget <= 0:
                    now = time.monotonic()
                    if waited_past is None:
                        waited_past = now
                        self._kick()  # the deadline passed: the guest's call stops at once
                    elif now - waited_past > GRACE_S:
                        raise GuestTrap(codes.TIMEOUT, "the Python guest did not stop at its deadline")
        kind = message[0]
        if kind == "trap":
            if self._host_error is not None:
                raise self._host_error
            raise message[1]
        if kind == "closed":
            raise GuestTrap(codes.CANCELLED, "job cancelled")
        if self._host_error is not None:
            raise self._host_error
        return message

    def _command(self, message: tuple) -> abi.Command:
        kind = message[0]
        if kind == "cmd":
            self._stream_infer = message[2]
            return message[1]
        if kind == "final":
            data = message[1].encode("utf-8", "surrogatepass")
            if len(data) > self.limits.max_command_bytes:
                raise GuestTrap(codes.LIMIT_EXCEEDED,
                                f"main() returned {len(data)} bytes of JSON, over the "
                                f"{self.limits.max_command_bytes}-byte limit (max_command_bytes); stream large "
                                f"output with tj.emit_chunk")
            try:
                return abi.parse_command(data, max_values=self.limits.max_command_values)
            except abi.AbiError as e:
                raise GuestTrap(codes.SCRIPT_ERROR, f"main() returned a value the host cannot take: {e}") from None
        raise GuestTrap(codes.WASM_TRAP, f"the Python guest answered out of turn ({kind})")

    def init(self, input_json: bytes) -> abi.Command:
        if self._interrupted:
            raise GuestTrap(codes.CANCELLED, "job cancelled")
        if self._thread is not None:
            raise RuntimeError("init() was already called")
        text = bytes(input_json).decode("utf-8")
        self._thread = threading.Thread(target=self._thread_main, args=(text,), daemon=True,
                                        name=f"tensorjob-python-{self.digest[:8]}")
        self._thread.start()
        return self._command(self._wait())

    def step(self, event: abi.Event | bytes) -> abi.Command:
        if self._dead:
            raise GuestTrap(codes.WASM_TRAP, "the Python guest has already ended")
        if self._interrupted:
            raise GuestTrap(codes.CANCELLED, "job cancelled")
        data = event if isinstance(event, (bytes, bytearray)) else abi.encode_event(event)
        self._stream_infer = False
        self._to_guest.put(("event", bytes(data).decode("utf-8")))
        return self._command(self._wait())

    @property
    def judges_tokens(self) -> bool:
        """Whether ``on_token`` can stop the answer under way: the guest streams this infer."""
        return self._stream_infer

    def on_token(self, token: str) -> bool:
        """Offer one token to a guest that streams this infer; True means continue."""
        if not self._stream_infer:
            return True
        if self._dead:
            raise GuestTrap(codes.WASM_TRAP, "the Python guest has already ended")
        self._to_guest.put(("token", token))
        message = self._wait()
        if message[0] != "verdict":
            raise GuestTrap(codes.WASM_TRAP, f"the Python guest answered a token with {message[0]}")
        if not message[1]:
            self._stream_infer = False
        return message[1]

    @property
    def memory_bytes(self) -> int:
        return self.peak_memory_bytes

    def check_syntax(self) -> str:
        """"" or the SyntaxError as JSON (on the calling thread; before ``init`` only)."""
        if self._thread is not None:
            raise RuntimeError("check_syntax() runs before init()")
        self._arm(self._store)
        _CURRENT.guest = self
        try:
            out = self._check(self._store, self.program.source, self.program.filename)
            self._check.post_return(self._store)
        finally:
            _CURRENT.guest = None
        return out

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stop_ticks()
        thread = self._thread
        if thread is not None and thread.is_alive():
            self._to_guest.put(("close",))
            thread.join(timeout=1.0)
            if thread.is_alive():  # still running guest code: stop it
                self.interrupt()
                thread.join(timeout=GRACE_S)
        elif thread is None:
            self._release_store()

    def __enter__(self) -> "PythonGuest":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# --- what every Python guest on an engine shares ---------------------------------------------------

#: The Python guest whose interpreter is running on this thread: the host functions, linked once per
#: engine, serve it (a store is used by one thread at a time).
_CURRENT = threading.local()


def _current() -> "PythonGuest":
    guest = getattr(_CURRENT, "guest", None)
    if guest is None:
        raise wasmtime.WasmtimeError("tensorjob: a host function was called outside a Python guest's call")
    return guest


def _serve(name: str) -> Callable:
    """The host function ``name`` of the calling guest (a ``PythonGuest`` method), guarded."""
    def call(store: Any, *args: Any) -> Any:
        guest = _current()
        return guest._guarded(getattr(guest, name), store, *args)
    return call


def _refuse(what: str) -> Callable:
    def fn(store: Any, *args: Any) -> Any:
        raise wasmtime.WasmtimeError(f"tensorjob: a guest cannot {what}")
    return fn


def _define_shared(linker: component.Linker) -> None:
    """Every function the interpreter imports, once per engine: each serves the calling guest."""
    with linker.root() as root:
        with root.add_instance(HOST) as h:  # the hot ones through hostcall (fixed signatures)
            hostcall.add_func(h, "command", _serve("_h_command"), ("string", "bool"), "string")
            hostcall.add_func(h, "verdict", _serve("_h_verdict"), ("bool",), "string")
            hostcall.add_func(h, "log", _serve("_h_log"), ("u8", "string"))
            hostcall.add_func(h, "emit-chunk", _serve("_h_emit_chunk"), ("string",), "s32")
            hostcall.add_func(h, "flush", _serve("_h_flush"), (), "s32")
            hostcall.add_func(h, "input-len", _serve("_h_input_len"), (), "u32")
            hostcall.add_func(h, "read-input", _serve("_h_read_input"), ("u32", "u32"), "string")
            hostcall.add_func(h, "sleep", _serve("_h_sleep"), ("u64",))
            hostcall.add_func(h, "ready", _serve("_h_ready"))
        with root.add_instance("wasi:clocks/wall-clock" + WASI) as w:
            w.add_func("now", _serve("_h_wall_now"))
            w.add_func("resolution", lambda store: _record(seconds=0, nanoseconds=1000))
        with root.add_instance("wasi:clocks/monotonic-clock" + WASI) as m:
            hostcall.add_func(m, "now", _serve("_h_monotonic_now"), (), "u64")
            m.add_func("resolution", lambda store: 1000)
            m.add_func("subscribe-instant", _refuse("wait on a timer (time.sleep is a host call)"))
            m.add_func("subscribe-duration", _refuse("wait on a timer (time.sleep is a host call)"))
        with root.add_instance("wasi:random/random" + WASI) as r:
            hostcall.add_func(r, "get-random-bytes", _serve("_h_random_bytes"), ("u64",), "bytes")
            hostcall.add_func(r, "get-random-u64", _serve("_h_random_u64"), (), "u64")
        with root.add_instance("wasi:random/insecure" + WASI) as r:
            hostcall.add_func(r, "get-insecure-random-bytes", _serve("_h_random_bytes"), ("u64",), "bytes")
            hostcall.add_func(r, "get-insecure-random-u64", _serve("_h_random_u64"), (), "u64")
        with root.add_instance("wasi:random/insecure-seed" + WASI) as r:
            r.add_func("insecure-seed", _serve("_h_insecure_seed"))
        with root.add_instance("wasi:cli/environment" + WASI) as e:
            e.add_func("get-environment", lambda store: [])
            e.add_func("get-arguments", lambda store: [])
            e.add_func("initial-cwd", lambda store: None)
        with root.add_instance("wasi:cli/exit" + WASI) as x:
            x.add_func("exit", _refuse("exit the interpreter (return from main, or tj.fail)"))
        with root.add_instance("wasi:filesystem/preopens" + WASI) as p:
            p.add_func("get-directories", lambda store: [])
        with root.add_instance("wasi:sockets/tcp-create-socket" + WASI) as s:
            s.add_func("create-tcp-socket", lambda store, family: "access-denied")
        with root.add_instance("wasi:sockets/udp-create-socket" + WASI) as s:
            s.add_func("create-udp-socket", lambda store, family: "access-denied")


#: What the interpreter's component holds in a pooled engine's slots: 14 core instances, one memory and two tables
#: (``tests/sandbox/test_python_guest.py`` starts one on a pool of exactly this shape), with room to spare; the
#: interpreter touches about 32 MiB of its memory starting (kept: 115 starts a second on this host without, 178
#: with).
_POOL_SHAPE = PoolShape(core_instances=16, memories=2, tables=4, keep_resident_bytes=32 * 1024 * 1024,
                        component=True)


def _prepared(interp: interpreter.Interpreter, fuel: bool, stack_bytes: int, memory_bytes: int, *, pooled: bool
              ) -> tuple[SharedEngine, component.Component, component.Linker]:
    """The engine for these settings (``engines.engine_for``; with ``pooled`` false, the on-demand one), the
    interpreter's component loaded into it once, and its linker with the host's functions defined once
    (``InterpreterError`` if the component cannot be loaded)."""
    shared, _ = engine_for(("python", interpreter.engine_key(fuel), stack_bytes),
                           lambda: interpreter.engine_config(fuel, stack_bytes), _POOL_SHAPE, memory_bytes,
                           pooled=pooled)
    comp, _ = shared.prepared(("component", interp.sha256), lambda: interpreter.load_component(shared.engine, interp))

    def make_linker() -> component.Linker:
        linker = component.Linker(shared.engine)
        linker.add_wasip2()
        linker.allow_shadowing = True
        _define_shared(linker)
        return linker

    linker, _ = shared.prepared(("linker",), make_linker)
    return shared, comp, linker


def check_syntax(source: str, filename: str = "cell.py", *, progress: interpreter.Progress | None = None) -> None:
    """Raise ``PythonSyntaxError`` (line and column) if ``source`` does not compile in the guest's Python."""
    with PythonGuest(PythonProgram(source, filename), progress=progress) as guest:
        out = guest.check_syntax()
    if out:
        raise format_syntax_error(filename, json.loads(out))


__all__ = [
    "WASI", "HOST", "STARTUP_FUEL", "GRACE_S", "MAX_LOG_LINE_CHARS", "MAX_LOG_BYTES", "MAX_CLOCK_READINGS",
    "MAX_RANDOM_BYTES", "MAX_READ_INPUT", "EVENT_LOG", "EVENT_CLOCK", "EVENT_INTERPRETER", "Determinism",
    "PythonGuest", "check_syntax"
]

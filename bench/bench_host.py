"""Host overhead benchmarks: what the reactor costs on top of the raw work.

Run from the repository root::

    python bench/bench_host.py            # full: ~20,000 steps, a 1 GiB file
    python bench/bench_host.py --quick    # smoke run: 5,000 steps, 128 MiB
    python bench/bench_host.py --profile  # also print cProfile's top host functions

Two figures, each a *ratio* against a baseline measured in the same process,
because the machines this runs on are shared and noisy: absolute numbers
drift from run to run, a ratio of interleaved runs much less. Each benchmark
alternates baseline and host runs several times and reports the medians.

1. **Steps per second of an emit-only guest** through the whole host
   (``tj.Job`` on its thread: grants, limits, epoch deadlines, strict command
   parsing, ``job.progress`` published to the event stream and appended to a
   transcript in a temporary runs folder), against a *bare loop* of the
   wasmtime-py calls every step needs, on the same module and the same Engine
   configuration (the host's own ``_engine_config``: epoch interruption on):
   ``set_epoch_deadline`` + ``cf_alloc``, copy the event in, ``set_epoch_deadline``
   + ``cf_step``, read the 8-byte descriptor, read the payload, ``json.loads``.
   The guest does nothing (it answers every call with the same constant
   command until it has made N of them, N parsed from its input), so the
   figure is pure per-step host overhead. Goal: host >= 0.5 x bare loop.

2. **Throughput of reading a file through ``slice`` in 1 MiB windows into
   guest memory**, against plain ``readinto`` of the same 1 MiB windows into a
   preallocated ``bytearray``. The file is ASCII text written in large blocks
   (not sparse, so it is served from the page cache) and deleted at the end.
   The guest has the path and length baked into its data segment: it opens
   the file, then asks for ``{"cmd":"slice","handle":0,"offset":N,"len":1048576}``
   with N advancing by 1 MiB (an itoa in WAT writes the offset), then
   ``done``. It never looks at the text, so what is measured is the host's
   path for a window: pread, UTF-8 validation and decoding, JSON encoding of
   the ``sliced`` event, cf_alloc + memmove into guest memory, the
   ``job.file.sliced`` publish, and parsing the guest's next command. A
   separate instrumented run (``time.perf_counter`` around those host
   functions, patched in for that run only) prints where the time goes.

The last line of output is a one-line JSON summary of every number.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import statistics
import struct
import sys
import tempfile
import time
from importlib.metadata import version as _version
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import wasmtime  # noqa: E402

import tensorjob_jupyter as tj
from tensorjob_jupyter import abi
from tensorjob_jupyter.record import events
from tensorjob_jupyter.world import files
from tensorjob_jupyter.sandbox import guest as guest_mod
from tensorjob_jupyter.host import reactor as runner

KiB = 1024
MiB = 1024 * KiB
WINDOW = 1 * MiB
BASE_PASSES = 5  # readinto passes per baseline sample in benchmark 2
HEAP = 0x10000  # where cf_alloc puts host writes; the guest's own data lives below
_DESC = struct.Struct("<II")


# --- WAT helpers --------------------------------------------------------------------------


def _lit(data: bytes) -> str:
    return "".join(f"\\{b:02x}" for b in data)


def _json(value) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


ALLOC = f"""
  (func (export "cf_alloc") (param $n i32) (result i32)
    (local $need i32)
    (local.set $need (i32.shr_u (i32.add (i32.add (i32.const {HEAP}) (local.get $n)) (i32.const 65535))
                                (i32.const 16)))
    (if (i32.gt_u (local.get $need) (memory.size))
      (then (drop (memory.grow (i32.sub (local.get $need) (memory.size))))))
    (i32.const {HEAP}))
  (func $desc (param $p i32) (param $l i32) (result i32)
    (i32.store (i32.const 0x80) (local.get $p))
    (i32.store (i32.const 0x84) (local.get $l))
    (i32.const 0x80))"""


def emit_guest() -> bytes:
    """Answers cf_init and each cf_step with an emit until it has sent N, then done.

    N is the job input, a bare JSON number (parsed by a small atoi), so one
    module serves the warm-up and the measured runs.
    """
    emit = _json({"cmd": "emit", "progress": {"i": 1}})
    done = _json({"cmd": "done", "result": "ok"})
    e_at, d_at = 0x100, 0x100 + len(emit)
    return bytes(wasmtime.wat2wasm(f"""(module
  (memory (export "memory") 2)
  (global $n (mut i32) (i32.const 0))
  (global $sent (mut i32) (i32.const 0))
  (data (i32.const {e_at}) "{_lit(emit + done)}")
  {ALLOC}
  (func $answer (result i32)
    (if (result i32) (i32.lt_u (global.get $sent) (global.get $n))
      (then (global.set $sent (i32.add (global.get $sent) (i32.const 1)))
            (call $desc (i32.const {e_at}) (i32.const {len(emit)})))
      (else (call $desc (i32.const {d_at}) (i32.const {len(done)})))))
  (func (export "cf_init") (param $p i32) (param $l i32) (result i32)
    (local $end i32) (local $c i32)
    (local.set $end (i32.add (local.get $p) (local.get $l)))
    (block $out (loop $digits
      (br_if $out (i32.ge_u (local.get $p) (local.get $end)))
      (local.set $c (i32.sub (i32.load8_u (local.get $p)) (i32.const 48)))
      (br_if $out (i32.gt_u (local.get $c) (i32.const 9)))
      (global.set $n (i32.add (i32.mul (global.get $n) (i32.const 10)) (local.get $c)))
      (local.set $p (i32.add (local.get $p) (i32.const 1)))
      (br $digits)))
    (call $answer))
  (func (export "cf_step") (param i32 i32) (result i32) (call $answer))
)"""))


def slice_guest(path: str, size: int, window: int = WINDOW) -> bytes:
    """Opens ``path``, slices it front to back in ``window``-byte steps, then done."""
    opn = _json({"cmd": "open", "path": path})
    done = _json({"cmd": "done", "result": "ok"})
    prefix = b'{"cmd":"slice","handle":0,"offset":'
    suffix = b',"len":%d}' % window
    o_at = 0x100
    d_at = o_at + len(opn)
    p_at = d_at + len(done)
    s_at = p_at + len(prefix)
    buf = 0x8000
    assert s_at + len(suffix) < buf, "path too long for the data area"
    return bytes(wasmtime.wat2wasm(f"""(module
  (memory (export "memory") 2)
  (global $off (mut i64) (i64.const 0))
  (data (i32.const {o_at}) "{_lit(opn + done + prefix + suffix)}")
  {ALLOC}
  (func $itoa (param $dst i32) (param $v i64) (result i32)
    (local $t i64) (local $n i32) (local $i i32)
    (local.set $t (local.get $v))
    (local.set $n (i32.const 1))
    (block $counted (loop $count
      (br_if $counted (i64.lt_u (local.get $t) (i64.const 10)))
      (local.set $t (i64.div_u (local.get $t) (i64.const 10)))
      (local.set $n (i32.add (local.get $n) (i32.const 1)))
      (br $count)))
    (local.set $i (i32.add (local.get $dst) (local.get $n)))
    (local.set $t (local.get $v))
    (loop $write
      (local.set $i (i32.sub (local.get $i) (i32.const 1)))
      (i32.store8 (local.get $i)
                  (i32.add (i32.const 48) (i32.wrap_i64 (i64.rem_u (local.get $t) (i64.const 10)))))
      (local.set $t (i64.div_u (local.get $t) (i64.const 10)))
      (br_if $write (i64.ne (local.get $t) (i64.const 0))))
    (i32.add (local.get $dst) (local.get $n)))
  (func (export "cf_init") (param i32 i32) (result i32)
    (call $desc (i32.const {o_at}) (i32.const {len(opn)})))
  (func (export "cf_step") (param i32 i32) (result i32)
    (local $q i32)
    (if (i64.ge_u (global.get $off) (i64.const {size}))
      (then (return (call $desc (i32.const {d_at}) (i32.const {len(done)})))))
    (memory.copy (i32.const {buf}) (i32.const {p_at}) (i32.const {len(prefix)}))
    (local.set $q (call $itoa (i32.const {buf + len(prefix)}) (global.get $off)))
    (memory.copy (local.get $q) (i32.const {s_at}) (i32.const {len(suffix)}))
    (global.set $off (i64.add (global.get $off) (i64.const {window})))
    (call $desc (i32.const {buf}) (i32.sub (i32.add (local.get $q) (i32.const {len(suffix)})) (i32.const {buf}))))
)"""))


# --- small utilities ------------------------------------------------------------------------


def med(xs: list[float]) -> float:
    return statistics.median(xs)


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]

    def line(cells: list[str]) -> str:  # first column left-aligned, numbers right-aligned
        return "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    return "\n".join([line(headers), line(["-" * w for w in widths])] + [line(r) for r in rows])


def run_job(wasm: bytes, runs_dir: Path, **kwargs) -> tuple[tj.Job, tj.Envelope, float]:
    """One job through the whole host; returns it, its envelope and its wall time."""
    t0 = time.perf_counter()
    job = tj.Job(wasm, runs_dir=runs_dir, **kwargs)
    env = job.start().wait(timeout=600)
    elapsed = time.perf_counter() - t0
    if not env.ok:
        raise SystemExit(f"benchmark job failed: {env.to_json()}")
    return job, env, elapsed


class profiled_reactor:
    """cProfile the reactor on the job's own thread (the profiler is per-thread)."""

    def __init__(self):
        import cProfile

        self.profile = cProfile.Profile()
        self._orig = runner.Reactor.run

    def __enter__(self):
        prof, orig = self.profile, self._orig

        def run(reactor):
            prof.enable()
            try:
                return orig(reactor)
            finally:
                prof.disable()

        runner.Reactor.run = run
        return self

    def __exit__(self, *exc):
        runner.Reactor.run = self._orig

    def print(self, title: str, top: int = 15) -> None:
        import io
        import pstats

        out = io.StringIO()
        pstats.Stats(self.profile, stream=out).sort_stats("tottime").print_stats(top)
        text = out.getvalue()
        start = text.find("   ncalls")
        print(f"\ncProfile, {title} (top {top} by own time):")
        print(text[start:].rstrip() if start >= 0 else text)


# --- 1: emit-only steps per second -------------------------------------------------------------


def bare_emit_loop(wasm: bytes, n: int) -> tuple[int, float]:
    """The wasmtime-py calls one emit step needs, with nothing around them."""
    limits = tj.Limits()
    cfg = guest_mod._engine_config(limits)  # the host's own Engine configuration (its on-demand engine)
    engine = wasmtime.Engine(cfg)
    module = wasmtime.Module(engine, wasm)
    store = wasmtime.Store(engine)
    store.set_limits(memory_size=limits.memory_bytes, table_elements=1_000_000, instances=1, tables=4, memories=1)
    deadline = max(1, int(limits.call_timeout_s / guest_mod.TICK_S)) + 1
    store.set_epoch_deadline(deadline)
    ex = wasmtime.Linker(engine).instantiate(store, module).exports(store)
    memory, alloc, init, step = ex["memory"], ex["cf_alloc"], ex["cf_init"], ex["cf_step"]
    memmove, string_at, addressof, unpack = ctypes.memmove, ctypes.string_at, ctypes.addressof, _DESC.unpack
    loads = json.loads
    event = b'{"event":"emitted"}'

    def call(func, data: bytes) -> dict:
        k = len(data)
        store.set_epoch_deadline(deadline)
        ptr = alloc(store, k)
        memmove(addressof(memory.data_ptr(store).contents) + ptr, data, k)
        store.set_epoch_deadline(deadline)
        desc = func(store, ptr, k)
        base = addressof(memory.data_ptr(store).contents)  # the call may have grown memory
        p, length = unpack(string_at(base + desc, 8))
        return loads(string_at(base + p, length))

    t0 = time.perf_counter()
    command = call(init, str(n).encode())
    calls = 1
    while command["cmd"] != "done":
        command = call(step, event)
        calls += 1
    elapsed = time.perf_counter() - t0
    store.close()
    return calls, elapsed


def host_emit(wasm: bytes, n: int, runs_dir: Path) -> tuple[int, float]:
    job, env, elapsed = run_job(wasm, runs_dir, input=n, name="bench-emit")
    assert env.result == "ok" and job.stats.steps == n + 1, (env.to_json(), job.stats)
    lines = job.transcript_path.read_bytes().count(b"\n")
    assert lines == n + 2, f"transcript has {lines} lines, expected {n + 2}"  # created, n x progress, completed
    return job.stats.steps, elapsed


def bench_emit(n: int, reps: int, tmp: Path, profile: bool) -> dict:
    wasm = emit_guest()
    runs = tmp / "runs"
    host_emit(wasm, 200, runs)  # warm: compile into the module cache, start the epoch clock
    bare_emit_loop(wasm, 200)
    host_rates, bare_rates = [], []
    for _ in range(reps):
        calls, t = bare_emit_loop(wasm, n)
        bare_rates.append(calls / t)
        steps, t = host_emit(wasm, n, runs)
        host_rates.append(steps / t)
    ratios = [h / b for h, b in zip(host_rates, bare_rates)]
    h, b = med(host_rates), med(bare_rates)
    ratio = h / b
    print(f"\n[1] emit-only guest, {n} steps per run, {reps} interleaved runs each (medians)")
    print(table(["", "steps/s", "us/step", "min..max steps/s"], [
        ["bare wasmtime-py loop", f"{b:,.0f}", f"{1e6 / b:.1f}", f"{min(bare_rates):,.0f}..{max(bare_rates):,.0f}"],
        ["host (tj.Job, events+transcript)", f"{h:,.0f}", f"{1e6 / h:.1f}",
         f"{min(host_rates):,.0f}..{max(host_rates):,.0f}"],
    ]))
    met = ratio >= 0.5
    print(f"ratio host/bare = {ratio:.2f} (per-pair ratios {min(ratios):.2f}..{max(ratios):.2f}); "
          f"goal >= 0.50: {'met' if met else 'NOT met'}; host overhead {1e6 / h - 1e6 / b:.1f} us/step")
    if profile:
        with profiled_reactor() as p:
            host_emit(wasm, n, runs)
        p.print(f"host, emit guest, {n} steps (profiled, slower than above)")
    return {"steps": n, "reps": reps, "bare_steps_per_s": round(b), "host_steps_per_s": round(h),
            "bare_us_per_step": round(1e6 / b, 2), "host_us_per_step": round(1e6 / h, 2),
            "ratio": round(ratio, 3), "ratio_min": round(min(ratios), 3), "ratio_max": round(max(ratios), 3),
            "goal": 0.5, "goal_met": met}


# --- 2: slice throughput -----------------------------------------------------------------------


def make_text_file(path: Path, size: int) -> float:
    """``size`` bytes of ASCII lines, written in 8 MiB blocks; returns seconds taken."""
    t0 = time.perf_counter()
    line = b"The quick brown fox jumps over the lazy dog, 0123456789 times.\n"
    block = (line * (8 * MiB // len(line) + 1))[: 8 * MiB]
    with open(path, "wb", buffering=0) as f:
        left = size
        while left:
            k = min(left, len(block))
            f.write(block[:k] if k < len(block) else block)
            left -= k
        os.fsync(f.fileno())  # so background writeback does not run during the measurements
    return time.perf_counter() - t0


def readinto_pass(path: Path, window: int = WINDOW) -> tuple[int, float]:
    buf = bytearray(window)
    total = 0
    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while True:
            k = f.readinto(buf)
            if not k:
                break
            total += k
    return total, time.perf_counter() - t0


def host_slice(wasm: bytes, path: Path, size: int, runs_dir: Path) -> tuple[tj.Job, float]:
    limits = tj.Limits(max_window_bytes=max(WINDOW, tj.Limits().max_window_bytes))
    job, env, elapsed = run_job(wasm, runs_dir, read=[path], limits=limits, name="bench-slice")
    assert env.result == "ok" and job.stats.bytes_read == size, (env.to_json(), job.stats)
    return job, elapsed


class PhaseTimer:
    """Wraps host functions with perf_counter for one instrumented run, then restores them."""

    def __init__(self):
        self.secs: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self._undo: list = []

    def _add(self, label: str, dt: float) -> None:
        self.secs[label] = self.secs.get(label, 0.0) + dt
        self.calls[label] = self.calls.get(label, 0) + 1

    def wrap(self, owner, name: str, label: str) -> None:
        orig = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
        add, clock = self._add, time.perf_counter

        if isinstance(orig, property):
            fget = orig.fget

            def timed_get(obj):
                t0 = clock()
                try:
                    return fget(obj)
                finally:
                    add(label, clock() - t0)

            new = property(timed_get)
        else:
            def new(*args, **kwargs):
                t0 = clock()
                try:
                    return orig(*args, **kwargs)
                finally:
                    add(label, clock() - t0)

        setattr(owner, name, new)
        self._undo.append((owner, name, orig))

    def wrap_calls(self) -> None:
        """``Guest._call`` timed per export name (cf_alloc, cf_step, cf_init)."""
        orig = guest_mod.Guest._call
        add, clock = self._add, time.perf_counter

        def _call(self_, name, func, *args):
            t0 = clock()
            try:
                return orig(self_, name, func, *args)
            finally:
                add("call:" + name, clock() - t0)

        guest_mod.Guest._call = _call
        self._undo.append((guest_mod.Guest, "_call", orig))

    def restore(self) -> None:
        for owner, name, orig in reversed(self._undo):
            setattr(owner, name, orig)
        self._undo.clear()


def slice_breakdown(wasm: bytes, path: Path, size: int, runs_dir: Path) -> tuple[list, float]:
    pt = PhaseTimer()
    pt.wrap(files.Handles, "_read", "pread")
    pt.wrap(files, "utf8_prefix", "utf8_validate")
    pt.wrap(abi, "encode_event", "json_encode")
    pt.wrap(guest_mod.Guest, "write", "write")
    pt.wrap(guest_mod.Guest, "_read_command", "read_command")
    pt.wrap(events.EventStream, "publish", "publish")
    pt.wrap_calls()
    try:
        _, total = host_slice(wasm, path, size, runs_dir)
    finally:
        pt.restore()
    s, c = pt.secs, pt.calls
    alloc = s.get("call:cf_alloc", 0.0)
    phases = [
        ("pread (os.pread, new bytes)", s.get("pread", 0.0), c.get("pread", 0)),
        ("UTF-8 check + decode (utf8_prefix)", s.get("utf8_validate", 0.0), c.get("utf8_validate", 0)),
        ("JSON encode `sliced` event (+ .encode)", s.get("json_encode", 0.0), c.get("json_encode", 0)),
        ("cf_alloc call", alloc, c.get("call:cf_alloc", 0)),
        ("memmove into guest memory", s.get("write", 0.0) - alloc, c.get("write", 0)),
        ("publish job.file.sliced (+transcript)", s.get("publish", 0.0), c.get("publish", 0)),
        ("cf_step call (guest builds next cmd)", s.get("call:cf_step", 0.0), c.get("call:cf_step", 0)),
        ("read + parse guest command", s.get("read_command", 0.0), c.get("read_command", 0)),
    ]
    accounted = sum(p[1] for p in phases)
    phases.append(("other (reactor loop, job setup/teardown)", total - accounted, 0))
    return phases, total


def bench_slice(size: int, reps: int, tmp: Path, profile: bool) -> dict:
    path = tmp / "big.txt"
    made = make_text_file(path, size)
    try:
        wasm = slice_guest(str(path), size)
        runs = tmp / "runs"
        readinto_pass(path)  # warm: the file is in the page cache from writing it; this touches it once more
        host_rates, base_rates = [], []
        for _ in range(reps):
            passes = []  # a readinto pass is ~50x shorter than a host run: take the median of a few
            for _ in range(BASE_PASSES):
                total, t = readinto_pass(path)
                assert total == size
                passes.append(size / t)
            base_rates.append(med(passes))
            _, t = host_slice(wasm, path, size, runs)
            host_rates.append(size / t)
        h, b = med(host_rates), med(base_rates)
        ratio = h / b
        windows = size // WINDOW
        print(f"\n[2] slice a {size // MiB} MiB ASCII file in 1 MiB windows into guest memory "
              f"({windows} windows; file written+fsynced in {made:.1f} s), {reps} interleaved runs each (medians)")
        print(table(["", "MB/s", "ms/window", "min..max MB/s"], [
            ["readinto 1 MiB windows", f"{b / 1e6:,.0f}", f"{1e3 * WINDOW / b:.3f}",
             f"{min(base_rates) / 1e6:,.0f}..{max(base_rates) / 1e6:,.0f}"],
            ["host slice -> guest memory", f"{h / 1e6:,.0f}", f"{1e3 * WINDOW / h:.3f}",
             f"{min(host_rates) / 1e6:,.0f}..{max(host_rates) / 1e6:,.0f}"],
        ]))
        print(f"ratio host/readinto = {ratio:.3f}  (MB = 10^6 bytes)")

        phases, total = slice_breakdown(wasm, path, size, runs)
        print(f"\nwhere the time goes (one instrumented host run: {total:.2f} s, "
              f"{size / total / 1e6:,.0f} MB/s with the timers on):")
        print(table(["phase", "seconds", "%", "us/window"], [
            [name, f"{sec:.3f}", f"{100 * sec / total:.1f}", f"{1e6 * sec / windows:,.0f}"]
            for name, sec, _ in phases]))
        if profile:
            with profiled_reactor() as p:
                host_slice(wasm, path, size, runs)
            p.print(f"host, slice guest, {size // MiB} MiB (profiled)")
        return {"bytes": size, "window": WINDOW, "reps": reps, "readinto_MBps": round(b / 1e6, 1),
                "host_MBps": round(h / 1e6, 1), "ratio": round(ratio, 4),
                "breakdown_s": {name: round(sec, 4) for name, sec, _ in phases},
                "breakdown_total_s": round(total, 3)}
    finally:
        path.unlink(missing_ok=True)


# --- main ----------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run (< 30 s)")
    ap.add_argument("--profile", action="store_true", help="also print cProfile's top host functions")
    args = ap.parse_args(argv)
    if args.quick:
        n, emit_reps, size, slice_reps = 5_000, 5, 128 * MiB, 5
    else:
        n, emit_reps, size, slice_reps = 20_000, 7, 1024 * MiB, 5

    t0 = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="tj-bench-"))
    try:
        print(f"bench_host: {'quick' if args.quick else 'full'} mode, python {sys.version.split()[0]}, "
              f"wasmtime-py {_version('wasmtime')}, {os.cpu_count()} CPUs")
        emit = bench_emit(n, emit_reps, tmp, args.profile)
        slc = bench_slice(size, slice_reps, tmp, args.profile)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    wall = time.perf_counter() - t0
    print(f"\ntotal {wall:.1f} s")
    print(json.dumps({"bench": "bench_host", "mode": "quick" if args.quick else "full", "wall_s": round(wall, 1),
                      "emit": emit, "slice": slc}, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())

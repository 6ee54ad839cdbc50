"""What a hostile guest can cost the host: memory kept and peak memory, and an ``open`` of a huge path.

Run from the repository root::

    python bench/bench_limits.py           # jobs publishing 1, 4, 16 and 64 MiB of events
    python bench/bench_limits.py --quick   # 1, 4 and 16 MiB

1. **Memory kept after a job, against the bytes of events it published.**
   A guest emits ``[{},{},...]`` progress payloads (the costliest JSON to hold
   parsed: about 25 bytes of memory per byte) until it has published N MiB,
   then finishes. Python memory is traced (``tracemalloc``) before the job
   and after it has ended and been collected; the job stays referenced and
   registered, as a notebook would keep it. Goal: what is kept is a constant
   under 16 MB, whatever was published. Also the peak traced memory during
   the job, against the job's ``max_event_bytes`` (what the guest was allowed
   to publish), and the resident set after ``malloc_trim``.
2. **Host time to answer ``open`` on a 16 MiB path**, through a whole job
   (the 16 MiB command parsed, the path refused) and as the bare
   ``Grants.open_checked`` call, against the same for a short missing path
   measured in the same run. Goal: under 0.1 s.
3. **The world's bounds** (issue 21). *Bytes held by handles*: a guest that
   fetches a large body (or crops an incompressible image) again and again,
   with ``max_handle_bytes`` at a quarter of ``max_handles`` x the body against
   the old bound (``max_handles`` alone) in the same run: bytes the handles
   held and the peak growth of the system's shared memory (memfd pages), and
   the ratio. *Fetch*: servers that answer ``100 Continue`` forever, trickle
   the status line, or go silent after the headers, against
   ``fetch_timeout_s``: when each job ends (as a multiple of the limit), how
   long its helper thread lingers after, and threads, sockets and server-side
   connections left after all of them, with the CPU the process uses in an
   idle second after them against one before. *The engine*: ``tensorjob run``
   SIGKILLed while its engine renders a page for minutes, the time until the
   engine is gone, against SIGKILLing the engine itself; and a spinning engine
   against ``document_cpu_s=1``.
4. **Transcripts and manifests from elsewhere** (issue 21). The peak resident
   set of ``tensorjob show`` and ``tensorjob diff``, each in a fresh process,
   on a transcript whose one line is past ``MAX_LINE_BYTES`` (300 MiB;
   ``--quick`` 100 MiB: refused, never held) and just under it (63 MiB;
   ``--quick`` 16 MiB: read), against ``show`` of a small run in the same
   run; ``diff`` of two runs of 10,000 and of 100,000 events (``--quick``
   5,000 and 50,000): how much the peak grows against how much the files do
   (holding every step was about 11 x). And ``read_manifest`` of 500,000
   ``{}`` lines (``--quick`` 100,000): traced peak per byte of file, against
   holding every item parsed (the old way, about 44 x), and its time.

5. **The shared model's bounds** (issues 21 and 28, structured output on
   llguidance). *Hostile schemas* (the round-2 cases): the issue-21 pattern
   ``^((a?){0,256}){0,256}$``, a nested repetition, a 1,024-value enum,
   nesting 300 deep and a ``$ref`` chain of 3,000 definitions (under the
   128 KiB cap; it overflows an 8 MiB thread stack in llguidance's compiler):
   how long the host's check takes, what it says, and what compiling it for
   the model costs. *Per token*: one token's mask over SmolLM2's vocabulary
   where the grammar is widest (inside a string, an enum, 64 alike strings,
   the pattern). *An ended job*: a constrained generation that takes the
   whole mask every token, its job ended half-way through a token: how long
   until the engine has answered it, against one token's time. *Memory*: the
   1,024-value enum of 15 KB strings as found (refused by the size cap; what
   caches bounded in entries held for one such job, times eight), and eight
   jobs with the largest schemas allowed on the tiny model: what stays after
   them, against the memos' bounds. *The time limit*: a job with a JSON
   format and ``job_timeout_s=2`` in a fresh process, against a plain one: how
   far past the limit each ends. *Beside other jobs* (issue 38): an innocent 120-token chat alone and started
   with an ambiguous grammar's job (``x: x x | x x x``) or ``(a{1000}){1000}``'s: its seconds against alone,
   and when and with what the hostile one ends (before: 13.8-14.2 s against 1.2-2.0 s alone, the masks
   computed on the decode thread and bounded in work only).

6. **A served model's and ``tensorjob serve``'s bounds** (issue 31;
   ``--only served``). A hostile model server (tests/hostile_http.py, its own
   process) against ``tensorjob run`` in a fresh process: a ``/v1/models``
   that never ends -- the peak resident set and the seconds until the run
   ends (the bench kills it at 1.5 GiB or 30 s), against the same run on an
   honest server; one that trickles a byte every half second -- how long
   ``tj.Job(...)`` takes to return (given up at 40 s) and when a job with
   ``job_timeout_s=2`` ends; a usage count of 10**4000 and of 2**63 and a
   500,000-character model id -- whether the run ends with an envelope and
   ``tensorjob show`` reads it back; an error quoting the key after 180
   characters -- the longest run of the key left in the message. Twelve
   finished jobs with 15 MB inputs: what stays in memory against what
   ``jobs()`` counts. ``tensorjob serve`` in its own process (a tiny model):
   400 clients that send half their headers -- file descriptors the server
   holds at once and 12 s later (the header deadline is 10 s); 100 uploads of
   4 MiB that stall before their last byte -- the server's memory growth. And
   on the embedded model (one llama.cpp thread: on a loaded machine more
   threads stall at their barriers): an innocent 4-token chat sent just
   after an ``/embeddings`` request of 8 texts of 1,500 words whose client
   left after 0.3 s -- how long the chat waits, against the same chat alone
   (goal: under 1 s more), and in pieces of an embed (an embed of one
   text of one piece's length, ``EMBED_PIECE_TOKENS``, timed in the same run); and how long a 32-text request
   takes to be answered.
   Run on the code before issue 31 the same way, from a copy of the
   repository at that commit, for the before -> after table.

7. **A map's run folder from elsewhere** (issue 38; ``--only run-folders``). A real map of four items,
   planted copies of its folder -- a FIFO as ``ledger.json``, ``results.jsonl``, ``failures.jsonl`` and
   ``scores.jsonl``; ``results.jsonl`` linked to ``/dev/zero``; a ledger claiming 10,000,000 and 2**53 items;
   an item number as text -- each read by ``tensorjob runs --table``, ``diff --map`` and ``replay --map`` in a
   fresh process (killed at 1.5 GiB or 30 s): exit status, seconds and peak MiB, against the same commands on
   the untouched folder. Before (the code ahead of issue 38, as the issue measured it): a FIFO hung each
   command until killed; ``/dev/zero`` grew past 3 GiB in 3-8 s; a forged count reached 2.7-3 GiB or ran past
   120 s; an item as text ended in a traceback.

Ratios are against baselines measured in the same process. The last line is
a one-line JSON summary.
"""

from __future__ import annotations

import argparse
import copy
import ctypes
import gc
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import psutil  # noqa: E402

import tensorjob_jupyter as tj
from tensorjob_jupyter.world.grants import AccessError, Grants

import hostile_http  # noqa: E402  (tests/hostile_http.py: a server that breaks HTTP)
import pdfgen  # noqa: E402  (tests/pdfgen.py: a page that takes minutes to render)
import wat  # noqa: E402  (tests/wat.py: the input-script guest)

MiB = 1024 * 1024


def rss_trimmed() -> int:
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:  # pragma: no cover - not glibc
        pass
    return psutil.Process().memory_info().rss


def bulky_emits(total: int) -> bytes:
    one = b'{"cmd":"emit","progress":[' + b"{}," * 20_000 + b"{}]}"
    return wat.pack_commands([one] * max(1, total // len(one)) + [b'{"cmd":"done","result":"ok"}'])


def memory_after_jobs(sizes_mib: list[int], runs_dir: str) -> list[dict]:
    guest = wat.input_script_guest()
    limits = tj.Limits()
    rows = []
    kept_jobs = []
    for mib in sizes_mib:
        staged = bulky_emits(mib * MiB)
        gc.collect()
        rss_before = rss_trimmed()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        job = tj.Job(guest, input_bytes=staged, backend=None, runs_dir=runs_dir, limits=limits)
        del staged
        job.start().wait()
        assert job.envelope.ok, job.envelope
        peak = tracemalloc.get_traced_memory()[1] - before
        kept_jobs.append(job)  # kept, as a notebook keeps its jobs
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        rss_after = rss_trimmed()
        published = job.stream.bytes
        rows.append({"published_mib": published / MiB, "kept_mib": kept / MiB, "kept_over_published": kept / published,
                     "peak_mib": peak / MiB, "peak_over_max_event_bytes": peak / limits.max_event_bytes,
                     "rss_growth_mib": (rss_after - rss_before) / MiB})
        print(f"published {published / MiB:6.1f} MiB  kept {kept / MiB:6.2f} MiB ({kept / published:.4f} of it)  "
              f"peak {peak / MiB:7.1f} MiB ({peak / limits.max_event_bytes:.2f} x max_event_bytes)  "
              f"RSS growth after trim {(rss_after - rss_before) / MiB:6.1f} MiB", flush=True)
    return rows


def time_it(fn, repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def open_huge_path(runs_dir: str) -> dict:
    guest = wat.input_script_guest()
    with tempfile.TemporaryDirectory() as tmp:
        granted = Path(tmp) / "data"
        granted.mkdir()
        grants = Grants.for_paths([granted])
        huge = str(granted) + "/" + "a/" * (8 * MiB - 64)
        short = str(granted) + "/missing.txt"

        def bare(path):
            def call():
                try:
                    grants.open_checked(path)
                except AccessError:
                    pass
            return call

        def job(path):
            staged = wat.pack_commands([json.dumps({"cmd": "open", "path": path}).encode()])

            def call():
                envelope = tj.Job(guest, input_bytes=staged, read=[granted], backend=None, runs_dir=runs_dir).start().wait()
                assert envelope.error is not None and envelope.error.code in ("capability_denied", "not_found")
            return call

        out = {"path_bytes": len(huge)}
        for name, make in (("bare_open_checked", bare), ("whole_job", job)):
            short_s, huge_s = time_it(make(short), 5), time_it(make(huge), 5)
            out[name] = {"short_s": short_s, "huge_s": huge_s, "ratio": huge_s / short_s}
            print(f"open of a {len(huge) / MiB:.0f} MiB path, {name}: {huge_s * 1000:.2f} ms "
                  f"(short path {short_s * 1000:.3f} ms, ratio {huge_s / short_s:.1f})", flush=True)
    return out


# --- issue 21: the world's bounds (fetch, the document engine, bytes held by handles) ---------------


def shmem_bytes() -> int:
    """The system's shared memory (memfd pages live there: fetched bodies, page images)."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("Shmem:"):
                return int(line.split()[1]) * 1024
    return 0


def peak_shmem_during(fn) -> tuple[object, int]:
    """Run ``fn()``; return its value and the peak growth of shared memory while it ran."""
    base = shmem_bytes()
    peak = [0]
    done = threading.Event()

    def sample():
        while not done.wait(0.01):
            peak[0] = max(peak[0], shmem_bytes() - base)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        value = fn()
    finally:
        done.set()
        sampler.join()
    return value, peak[0]


def handle_bytes(port: int, tmp: Path, runs_dir: str, quick: bool) -> dict:
    """Bytes a hoarding guest holds: with max_handle_bytes against the old bound (max_handles x per-handle cap)."""
    from PIL import Image

    handles, body = (16, 8 * MiB) if quick else (32, 16 * MiB)
    noise = tmp / "noise.png"
    Image.frombytes("RGB", (1000, 1000), os.urandom(1000 * 1000 * 3)).save(noise)
    crop = {"cmd": "image_op", "handle": 0, "op": {"op": "crop", "x": 0, "y": 0, "width": 1000, "height": 1000}}
    cases = {  # name: (script, event, grants, bytes one handle holds)
        "fetch": ([{"cmd": "fetch", "url": hostile_http.url(port, f"/body/{body}")}], "job.fetch", {}, body),
        "image_op": ([{"cmd": "open", "path": str(noise)}, crop], "job.image.created", {"read": [tmp]},
                     noise.stat().st_size),
    }
    out = {}
    for name, (script, kind, grants, each) in cases.items():
        row = {}
        budget = handles * each // 4
        for bound, max_bytes in (("old", 4 * handles * each), ("new", budget)):
            limits = tj.Limits(max_handles=handles, max_handle_bytes=max_bytes)

            def run():
                job = tj.Job(wat.script_guest(script), backend=None, fetch=[hostile_http.url(port, "/")],
                             runs_dir=runs_dir, limits=limits, **grants).start()
                job.wait(300)
                return job

            started = time.perf_counter()
            job, peak = peak_shmem_during(run)
            held = sum(e["len"] for e in job.events if e["type"] == kind)
            row[bound] = {"max_handle_bytes": max_bytes, "held_mib": held / MiB, "peak_shmem_mib": peak / MiB,
                          "seconds": time.perf_counter() - started, "error": job.envelope.error.message[:80]}
        row["held_ratio_new_over_old"] = row["new"]["held_mib"] / max(row["old"]["held_mib"], 1e-9)
        print(f"bytes held, {name}, max_handles={handles}: old bound {row['old']['held_mib']:.0f} MiB "
              f"(peak shmem +{row['old']['peak_shmem_mib']:.0f} MiB), max_handle_bytes={budget / MiB:.1f} MiB: "
              f"{row['new']['held_mib']:.0f} MiB (peak shmem +{row['new']['peak_shmem_mib']:.0f} MiB); "
              f"ratio {row['held_ratio_new_over_old']:.2f}", flush=True)
        out[name] = row
    return out


def process_cpu_s() -> float:
    t = psutil.Process().cpu_times()
    return t.user + t.system


def fetch_leftovers(port: int, runs_dir: str, quick: bool) -> dict:
    """Hostile servers against fetch_timeout_s: time to end, and what is left (threads, sockets, CPU) after."""
    repeat, timeout_s = (2, 0.5) if quick else (5, 0.5)
    warm = tj.Job(wat.script_guest([{"cmd": "fetch", "url": hostile_http.url(port, "/body/10")}, {"cmd": "done", "result": "ok"}]),
                  backend=None, fetch=[hostile_http.url(port, "/")], runs_dir=runs_dir).start()
    assert warm.wait(60).ok, warm.envelope
    time.sleep(0.2)
    threads_before = len(os.listdir("/proc/self/task"))
    sockets_before = sum(os.readlink(f"/proc/self/fd/{fd}").startswith("socket:") for fd in os.listdir("/proc/self/fd")
                         if os.path.exists(f"/proc/self/fd/{fd}"))
    idle0 = process_cpu_s()
    time.sleep(1.0)
    idle_cpu = process_cpu_s() - idle0
    out = {}
    for path in ("/continue", "/trickle", "/silent"):
        walls, lingers = [], []
        for _ in range(repeat):
            guest = wat.script_guest([{"cmd": "fetch", "url": hostile_http.url(port, path)}, {"cmd": "done", "result": "ok"}])
            started = time.perf_counter()
            job = tj.Job(guest, backend=None, fetch=[hostile_http.url(port, "/")], runs_dir=runs_dir,
                         limits=tj.Limits(fetch_timeout_s=timeout_s)).start()
            env = job.wait(60)
            ended = time.perf_counter()
            assert env.error is not None and env.error.code == "timeout", env
            while any(t.name == "tensorjob-fetch" for t in threading.enumerate()) and time.perf_counter() - ended < 10:
                time.sleep(0.001)
            lingers.append(time.perf_counter() - ended)
            walls.append(ended - started)
        out[path] = {"wall_over_fetch_timeout": statistics.median(walls) / timeout_s,
                     "thread_linger_ms": max(lingers) * 1000}
        print(f"fetch {path:9s}: ends at {statistics.median(walls) / timeout_s:.2f} x fetch_timeout_s "
              f"({statistics.median(walls) * 1000:.0f} ms); its thread is gone {max(lingers) * 1000:.1f} ms "
              f"after the job (worst of {repeat})", flush=True)
    time.sleep(0.2)
    after0 = process_cpu_s()
    time.sleep(1.0)
    after_cpu = process_cpu_s() - after0
    out["threads_left"] = len(os.listdir("/proc/self/task")) - threads_before
    out["sockets_left"] = sum(os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
                              for fd in os.listdir("/proc/self/fd") if os.path.exists(f"/proc/self/fd/{fd}")) \
        - sockets_before
    out["open_at_server"] = hostile_http.open_connections(port)
    out["idle_cpu_s_before"], out["idle_cpu_s_after"] = idle_cpu, after_cpu
    print(f"after {3 * repeat} hostile fetch jobs: {out['threads_left']} threads, {out['sockets_left']} sockets "
          f"left, {out['open_at_server']} connections open at the server; CPU in the idle second after "
          f"{after_cpu * 1000:.0f} ms vs {idle_cpu * 1000:.0f} ms before", flush=True)
    return out


def _engine_of(host: subprocess.Popen) -> psutil.Process:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for child in psutil.Process(host.pid).children():
            if any("docworker" in part for part in child.cmdline()):
                if sum(child.cpu_times()[:2]) > 0.5:  # rendering
                    return child
        time.sleep(0.02)
    raise RuntimeError("the document engine never started rendering")


def _gone(p: psutil.Process) -> bool:
    try:
        return not p.is_running() or p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def engine_death(tmp: Path, quick: bool) -> dict:
    """Host killed mid-render: time until its engine is gone, against killing the engine itself."""
    (tmp / "bomb.pdf").write_bytes(pdfgen.render_bomb_pdf())
    guest = tmp / "render.wasm"
    guest.write_bytes(wat.script_guest([{"cmd": "open", "path": str(tmp / "bomb.pdf")},
                                        {"cmd": "page_image", "handle": 0, "page": 0}, {"cmd": "done", "result": "ok"}]))
    samples: dict[str, list[float]] = {"host_killed": [], "engine_killed": []}
    for _ in range(1 if quick else 3):
        for case in samples:
            host = subprocess.Popen([sys.executable, "-m", "tensorjob_jupyter.frontends.cli", "run", str(guest),
                                     "--read", str(tmp), "--quiet"], stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, cwd=tmp)
            try:
                engine = _engine_of(host)
                started = time.perf_counter()
                (host if case == "host_killed" else engine).send_signal(signal.SIGKILL)
                while not _gone(engine) and time.perf_counter() - started < 30:
                    time.sleep(0.0005)
                samples[case].append(time.perf_counter() - started)
            finally:
                host.kill()
                host.wait()
    host_ms = statistics.median(samples["host_killed"]) * 1000
    engine_ms = statistics.median(samples["engine_killed"]) * 1000
    print(f"engine gone {host_ms:.1f} ms after its host is SIGKILLed mid-render (killing the engine itself: "
          f"{engine_ms:.1f} ms; ratio {host_ms / engine_ms:.1f})", flush=True)
    return {"host_killed_ms": host_ms, "engine_killed_ms": engine_ms, "ratio": host_ms / engine_ms}


def engine_cpu_limit(tmp: Path, runs_dir: str) -> dict:
    """A spinning engine against document_cpu_s=1: how long until the job ends."""
    from tensorjob_jupyter.world.docworker import FAULT_ENV

    (tmp / "doc.pdf").write_bytes(pdfgen.text_pdf())
    os.environ[FAULT_ENV] = "hang:render"
    try:
        started = time.perf_counter()
        env = tj.Job(wat.script_guest([{"cmd": "open", "path": str(tmp / "doc.pdf")},
                                       {"cmd": "page_image", "handle": 0, "page": 0}, {"cmd": "done", "result": "ok"}]),
                     read=[tmp], backend=None, runs_dir=runs_dir,
                     limits=tj.Limits(document_cpu_s=1, document_timeout_s=120)).start().wait(120)
        wall = time.perf_counter() - started
    finally:
        del os.environ[FAULT_ENV]
    assert env.error is not None and env.error.code == "limit_exceeded", env
    print(f"a spinning engine with document_cpu_s=1 ends its job after {wall:.2f} s of wall time "
          f"({wall:.2f} x the limit, engine start-up included)", flush=True)
    return {"wall_s": wall, "wall_over_limit": wall / 1.0}


def world_bounds(runs_dir: str, quick: bool) -> dict:
    with tempfile.TemporaryDirectory() as tmp, hostile_http.serve() as port:
        return {"handle_bytes": handle_bytes(port, Path(tmp), runs_dir, quick),
                "fetch": fetch_leftovers(port, runs_dir, quick),
                "engine_death": engine_death(Path(tmp), quick),
                "engine_cpu": engine_cpu_limit(Path(tmp), runs_dir)}


#: Runs ``tensorjob`` in its own process and reports that process's peak resident set on stderr.
PEAK_RSS_CLI = ("import resource, sys\n"
                "from tensorjob_jupyter.frontends.cli import main\n"
                "code = main(sys.argv[1:])\n"
                "sys.stderr.write(f'PEAK_RSS_KIB {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}\\n')\n"
                "sys.exit(code)\n")


def _cli_peak_mib(*argv) -> tuple[int, float, float]:
    """(exit status, peak RSS in MiB, seconds) of one ``tensorjob`` command in a fresh process."""
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", PEAK_RSS_CLI, *map(str, argv)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}, timeout=600)
    line = [x for x in proc.stderr.splitlines() if x.startswith("PEAK_RSS_KIB ")][-1]
    return proc.returncode, int(line.split()[1]) / 1024, time.perf_counter() - started


def _planted_run(real: Path, where: Path, write_middle) -> Path:
    """A copy of the run ``real`` at ``where`` whose events between the first and the last are
    ``write_middle(file, job_id)``'s."""
    import orjson

    where.mkdir(parents=True)
    lines = [orjson.loads(x) for x in (real / "events.jsonl").read_bytes().splitlines()]
    with open(where / "events.jsonl", "wb") as f:
        f.write(orjson.dumps({**lines[0], "job_id": where.name}) + b"\n")
        count = write_middle(f, where.name)
        f.write(orjson.dumps({**lines[-1], "job_id": where.name, "sequence_number": count + 1}) + b"\n")
    (where / "envelope.json").write_bytes((real / "envelope.json").read_bytes())
    return where


def transcript_bounds(tmp: Path, quick: bool) -> dict:
    """Memory of ``tensorjob show`` and ``diff`` on transcripts from elsewhere -- a line past the cap, a
    line just under it, many events -- and of reading a manifest of many small lines (issue 21)."""
    from tensorjob_jupyter.fanout import read_manifest
    from tensorjob_jupyter.inference.scripted import ScriptedBackend
    from tensorjob_jupyter.record.event_checks import MAX_LINE_BYTES

    guest = wat.script_guest([{"cmd": "emit", "progress": "x"}, {"cmd": "infer", "prompt": "go", "max_tokens": 8},
                              {"cmd": "done", "result": 1}])
    job = tj.Job(guest, backend=ScriptedBackend("one two three"), runs_dir=tmp / "recorded").start()
    assert job.wait(60).ok
    real = Path(job.run_dir)
    out: dict = {}
    code, base_mib, _ = _cli_peak_mib("show", real, "--quiet")
    assert code == 0
    out["baseline_show_mib"] = base_mib
    print(f"transcripts: `tensorjob show` of a small run peaks at {base_mib:.0f} MiB (the baseline below)", flush=True)

    def one_line_of(size: int):
        def write(f, job_id):
            f.write(b'{"type":"job.progress","sequence_number":1,"job_id":"' + job_id.encode() + b'","t_ms":1,'
                    b'"progress":"')
            for _ in range(size // MiB):
                f.write(b"a" * MiB)
            f.write(b'"}\n')
            return 1
        return write

    over = (100 if quick else 300) * MiB
    under = MAX_LINE_BYTES - MiB if not quick else 16 * MiB
    for name, size in (("line_past_the_cap", over), ("line_under_the_cap", under)):
        run = _planted_run(real, tmp / name, one_line_of(size))
        row = {"line_mib": size / MiB}
        for command, argv in (("show", ("show", run, "--quiet")), ("diff", ("diff", run, run))):
            code, peak, seconds = _cli_peak_mib(*argv)
            row[command] = {"exit": code, "peak_mib": peak, "over_baseline_mib": peak - base_mib,
                            "over_baseline_per_line_byte": (peak - base_mib) * MiB / size, "seconds": seconds}
            print(f"  {command} of a {size / MiB:.0f} MiB line ({'refused' if code == 2 else 'read'}): peak "
                  f"{peak:.0f} MiB, {peak - base_mib:+.0f} MiB over the baseline = "
                  f"{(peak - base_mib) * MiB / size:.2f} x the line, {seconds:.1f} s", flush=True)
        out[name] = row
        shutil.rmtree(run)

    def progress_events(count: int):
        def write(f, job_id):
            import orjson

            for i in range(1, count + 1):
                f.write(orjson.dumps({"type": "job.progress", "sequence_number": i, "job_id": job_id, "t_ms": i,
                                      "progress": {"done": i, "total": count}}) + b"\n")
            return count
        return write

    counts = (5_000, 50_000) if quick else (10_000, 100_000)
    rows = []
    for count in counts:
        pair = [_planted_run(real, tmp / f"events-{count}-{x}", progress_events(count)) for x in "ab"]
        size = sum((p / "events.jsonl").stat().st_size for p in pair)
        code, peak, seconds = _cli_peak_mib("diff", *pair)
        assert code == 0
        rows.append({"events": count, "files_mib": size / MiB, "peak_mib": peak, "seconds": seconds})
        print(f"  diff of two runs of {count} events ({size / MiB:.1f} MiB of transcript): peak {peak:.0f} MiB, "
              f"{seconds:.1f} s", flush=True)
    growth = (rows[1]["peak_mib"] - rows[0]["peak_mib"]) / (rows[1]["files_mib"] - rows[0]["files_mib"])
    out["many_events"] = {"rows": rows, "peak_growth_per_file_growth": growth}
    print(f"  diff: peak memory grew {growth:.2f} x as much as the transcripts did (all steps held: about 11 x)",
          flush=True)

    lines = 100_000 if quick else 500_000
    manifest = tmp / "manifest.jsonl"
    manifest.write_bytes(b"{}\n" * lines)
    size = manifest.stat().st_size
    gc.collect()
    tracemalloc.start()
    held = [json.loads(line) for line in manifest.read_bytes().splitlines()]  # the old way: every item parsed
    parsed_peak = tracemalloc.get_traced_memory()[1]
    del held
    tracemalloc.stop()
    started = time.perf_counter()
    read = read_manifest(manifest)  # timed untraced: tracing slows each small allocation
    seconds = time.perf_counter() - started
    del read
    gc.collect()
    tracemalloc.start()
    read = read_manifest(manifest)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert len(read) == lines
    out["manifest"] = {"lines": lines, "file_mib": size / MiB, "peak_per_byte": peak / size,
                       "parsed_peak_per_byte": parsed_peak / size, "ratio": peak / parsed_peak, "seconds": seconds}
    print(f"  manifest of {lines} `{{}}` lines ({size / MiB:.1f} MiB): read_manifest peaks at {peak / size:.1f} x the "
          f"file, holding every item parsed {parsed_peak / size:.1f} x (ratio {peak / parsed_peak:.2f}); "
          f"{seconds:.1f} s", flush=True)
    return out


# --- issue 21: the shared model's bounds (structured output) --------------------------------------------


def _infer_schema(schema) -> "object":
    from tensorjob_jupyter import abi

    return abi.command_from_json({"cmd": "infer", "prompt": "p", "max_tokens": 1, "format": {
        "type": "json_schema", "name": "a", "schema": schema}})


def _mask_ms(engine, schema, written: bytes, repeat: int) -> tuple[float, int]:
    """One token's mask (llguidance over the whole vocabulary) where the model has written ``written`` under
    ``schema``: the median ms, and how many tokens it allows."""
    from tensorjob_jupyter.host.structured import OutputSpec
    from tensorjob_jupyter.inference.base import GenerateRequest, Sampler

    chain = engine._sampler(GenerateRequest("x", 8, Sampler(temperature=1.0),
                                            constraint=OutputSpec.of(_infer_schema(schema)).constraint), [])
    try:
        for token in engine.tokenize(written.decode(), add_bos=False):
            assert chain._matcher.consume_token(token), (schema, engine.piece(token))
        times = []
        for _ in range(repeat):
            copy = chain._matcher
            chain._matcher = copy.deep_copy()  # the mask of the same state each time
            started = time.perf_counter()
            allowed = chain._allowed()
            times.append(time.perf_counter() - started)
            chain._matcher = copy
        return statistics.median(times) * 1000, int(allowed.sum())
    finally:
        chain.close()


def grammar_work_per_token(engine, quick: bool) -> dict:
    """One token's mask on SmolLM2's vocabulary where the grammar is widest: inside a string, at the start of a
    1,024-value enum, inside 64 alike strings, inside the issue's pattern."""
    cases = {  # name: (schema, the text the model has written when the choice is made)
        "a string": ({"type": "object", "properties": {"name": {"type": "string", "maxLength": 40}},
                      "required": ["name"]}, b'{"name": "A'),
        "a 1,024-value enum": ({"enum": [f"value{i}" for i in range(1024)]}, b'"'),
        "64 alike strings": ({"anyOf": [{"type": "string", "maxLength": 10 + i} for i in range(64)]}, b'"ab'),
        "^((a?){0,256}){0,256}$": ({"type": "string", "pattern": "^((a?){0,256}){0,256}$"}, b'"aa'),
    }
    out = {}
    for name, (schema, written) in cases.items():
        ms, allowed = _mask_ms(engine, schema, written, 3 if quick else 11)
        out[name] = {"mask_ms": ms, "allowed": allowed}
        print(f"one token's mask over {engine.n_vocab} tokens, {name}: {ms:.2f} ms ({allowed} tokens allowed)",
              flush=True)
    return out


def hostile_grammars(engine) -> dict:
    """What the round-2 hostile schemas and grammars cost when checked (the host, before any token) and when
    compiled for the model, and whether the process survives a reference chain that overflows an 8 MiB stack."""
    from tensorjob_jupyter.host.schemas import SchemaError
    from tensorjob_jupyter.host.structured import OutputSpec
    from tensorjob_jupyter.inference.base import GenerateRequest, Sampler

    def chain_of_refs(n):
        defs = {f"a{i}": {"anyOf": [{"$ref": f"#/$defs/a{i + 1}"}, {"type": "null"}]} for i in range(n)}
        return {"$ref": "#/$defs/a0", "$defs": {**defs, f"a{n}": {"type": "integer"}}}

    cases = {
        "^((a?){0,256}){0,256}$": {"type": "string", "pattern": "^((a?){0,256}){0,256}$"},
        "((a|aa)+)+ nested": {"type": "string", "pattern": "((a|aa)+)+b"},
        "a 1,024-value enum": {"enum": [f"value-{i}" for i in range(1024)]},
        "nesting 300 deep": _nested(300),
        "a $ref chain of 3,000 (128 KiB)": chain_of_refs(3000),
    }
    OutputSpec.of(_infer_schema({"type": "string"}))  # warm: the first check in a process imports jsonschema
    out = {}
    for name, schema in cases.items():
        started = time.perf_counter()
        try:
            spec = OutputSpec.of(_infer_schema(schema))
            verdict = "accepted"
        except SchemaError as e:
            spec, verdict = None, f"refused ({str(e)[:90]})"
        check_ms = (time.perf_counter() - started) * 1000
        compile_ms = None
        if spec is not None:
            started = time.perf_counter()
            engine._sampler(GenerateRequest("x", 8, Sampler(), constraint=spec.constraint), []).close()
            compile_ms = (time.perf_counter() - started) * 1000
        out[name] = {"verdict": verdict, "check_ms": check_ms, "compile_ms": compile_ms}
        shown = f"; compiled for the model in {compile_ms:.0f} ms" if compile_ms is not None else ""
        print(f"{name}: {verdict} when checked in {check_ms:.0f} ms{shown}", flush=True)
    return out


def grammar_beside_others(engine) -> dict:
    """An innocent 120-token greedy chat alone, then started together with a job of an ambiguous grammar (masks
    that grow past half a second within llguidance's bounds on work) and with ``(a{1000}){1000}`` (a first mask
    of a million positions): the innocent one's seconds beside each against alone, and when and how the hostile
    one ends."""
    from tensorjob_jupyter.inference.base import Constraint, GenerateRequest, Pending, Sampler

    def request(constraint=None, max_tokens=120):
        return GenerateRequest("Write a long story about a cat.", max_tokens, Sampler(temperature=0.0), chat=True,
                               constraint=constraint, logprobs=False)

    def together(requests):
        ended, started = {}, time.perf_counter()
        items = [Pending(r, lambda _: True, lambda res, err, i=i: ended.__setitem__(
            i, (time.perf_counter() - started, res, err))) for i, r in enumerate(requests)]
        rest = iter(items[1:])
        engine.serve(items[0], lambda *_: next(rest, None))
        return ended

    alone = together([request()])[0][0]
    print(f"an innocent 120-token chat alone: {alone:.2f} s", flush=True)
    out = {"alone_s": alone}
    for name, constraint in (("ambiguous", Constraint(lark="start: x\nx: x x | x x x | /[a-z ]/\n")),
                             ("(a{1000}){1000}", Constraint(regex="(a{1000}){1000}"))):
        ended = together([request(constraint, 300), request()])
        (hostile_s, _, error), (innocent_s, result, _) = ended[0], ended[1]
        out[name] = {"hostile_s": hostile_s, "hostile_error": str(error)[:120], "innocent_s": innocent_s,
                     "innocent_tokens": result.usage.completion_tokens}
        print(f"beside {name}: the innocent chat {innocent_s:.2f} s ({innocent_s / alone:.2f}x alone, "
              f"{result.usage.completion_tokens} tokens); the hostile one ended after {hostile_s:.2f} s: "
              f"{str(error)[:70]}", flush=True)
    return out


def _nested(depth: int) -> dict:
    node: dict = {"type": "integer"}
    for _ in range(depth):
        node = {"type": "array", "items": node}
    return node


def abandon_latency(engine, quick: bool) -> dict:
    """A constrained generation whose every token takes the whole mask, its job ended mid-way: the time until the
    engine has answered it, against one token's time in the same generation."""
    from tensorjob_jupyter import abi
    from tensorjob_jupyter.host.structured import OutputSpec
    from tensorjob_jupyter.inference import grammar as g
    from tensorjob_jupyter.inference.base import Constraint, GenerateRequest, Pending, Sampler

    # 64 alike strings that must run long (no early end)
    schema = {"anyOf": [{"type": "string", "minLength": 100, "maxLength": 110 + i} for i in range(64)]}
    infer = abi.command_from_json({"cmd": "infer", "prompt": "p", "max_tokens": 1, "format": {
        "type": "json_schema", "name": "a", "schema": schema}})
    constraint = Constraint(OutputSpec.of(infer).constraint.schema)
    g.GrammarSampler.check_first = False  # every token: the whole mask
    try:
        samples, token_s = [], []
        for _ in range(2 if quick else 5):
            ended = threading.Event()
            times: list[float] = []
            box: list = []

            marked: list[float] = []

            def end_job() -> None:
                marked.append(time.perf_counter())
                ended.set()

            def on_token(piece: str) -> bool:
                times.append(time.perf_counter())
                if len(times) == 4:
                    threading.Timer(0.5 * (times[-1] - times[-2]), end_job).start()  # mid-token
                return True

            pending = Pending(GenerateRequest("Write a story.", 200, Sampler(temperature=1.0), chat=False,
                                              constraint=constraint), on_token,
                              lambda r, e: box.append((time.perf_counter(), r, e)), abandoned=ended.is_set)
            engine.serve(pending)  # returns once the request is answered
            assert box and box[0][1] is not None and box[0][1].finish_reason == "cancelled", box
            token_s.append(statistics.median(b - a for a, b in zip(times, times[1:])))
            samples.append(box[0][0] - marked[0])
        latency, token = statistics.median(samples), statistics.median(token_s)
    finally:
        g.GrammarSampler.check_first = True
    print(f"an ended job's constrained request answered {latency * 1000:.1f} ms after its job ended mid-token "
          f"(one token of it: {token * 1000:.1f} ms; ratio {latency / token:.2f})", flush=True)
    return {"latency_ms": latency * 1000, "token_ms": token * 1000, "ratio": latency / token}


def schema_memory(runs_dir: str, tiny_model: Path) -> dict:
    """Eight jobs with the largest schemas allowed: memory kept after them, against the memos' bounds and against
    what caches bounded in entries held for the same schemas (the old way: each kept parsed)."""
    from tensorjob_jupyter.host import schemas, structured
    from tensorjob_jupyter.inference import grammar as g
    from tensorjob_jupyter.inference.models import get_backend
    from tensorjob_jupyter.sandbox.compile import GuestSource

    echo = GuestSource.from_file(Path(__file__).resolve().parents[1] / "tests" / "guests" / "infer_echo.c")
    backend = get_backend(str(tiny_model), n_ctx=256)

    def largest(i):
        count = 1024
        width = (schemas.MAX_SCHEMA_BYTES - 2048) // count - 4
        return {"enum": [f"{i:02d}-{j:05d}-" + "x" * (width - 10) for j in range(count)]}

    def run(schema):
        options = {"format": {"type": "json_schema", "name": "a", "schema": schema}}
        return tj.Job(echo, input={"prompt": "hi", "max_tokens": 3, "options": options}, backend=backend,
                      runs_dir=runs_dir).start().wait(300)

    found = {"enum": ["x" * 15_000 + str(i) for i in range(1024)]}
    started = time.perf_counter()
    env = run(found)
    refused_ms = (time.perf_counter() - started) * 1000
    assert env.error is not None and env.error.code == "schema_validation_failed", env
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    parsed = json.loads(json.dumps(found))
    one_found_parsed = tracemalloc.get_traced_memory()[0] - before
    del parsed
    run({"type": "string"})  # warm
    gc.collect()
    before = tracemalloc.get_traced_memory()[0]
    for i in range(8):
        run(largest(i))
    gc.collect()
    kept = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    # what the entry-bounded caches (64 and 128 entries) kept for one job with the schema as found: the cache
    # key and a deep copy of the checked spec, and a validator keyed by the schema's text (its grammar was
    # refused as too large, so not kept); measured for one job, the eighth job's worth is eight of them
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    key = json.dumps({"format": {"type": "json_schema", "name": "a", "schema": found}, "tools": [],
                      "tool_choice": "none"})
    spec = copy.deepcopy(json.loads(key)["format"]["schema"])
    schema_json = json.dumps(spec, sort_keys=True)
    old_entries = (key, spec, schema_json, schemas._make_validator(schema_json, True))
    gc.collect()
    old_one = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    del old_entries, spec, key, schema_json
    memos = {"specs": structured.SPECS, "validators": schemas.VALIDATORS, "grammars": g.GRAMMARS}
    bound = sum(m.max_bytes for m in memos.values())
    out = {"found_refused_ms": refused_ms, "found_parsed_mib": one_found_parsed / MiB,
           "entry_bounded_eight_found_mib": 8 * old_one / MiB, "kept_mib": kept / MiB, "memo_bound_mib": bound / MiB,
           "ratio": kept / (8 * old_one), "memos_mib": {k: m.bytes / MiB for k, m in memos.items()}}
    print(f"a 1,024-value enum of 15 KB strings: refused in {refused_ms:.0f} ms; entry-bounded caches kept "
          f"{old_one / MiB:.0f} MiB for one job with it, {8 * old_one / MiB:.0f} MiB for eight", flush=True)
    print(f"eight jobs with the largest schemas now allowed ({schemas.MAX_SCHEMA_BYTES // 1024} KiB each) keep "
          f"{kept / MiB:.1f} MiB (memos bounded at {bound / MiB:.0f} MiB in all; ratio to eight as found "
          f"{kept / (8 * old_one):.3f})", flush=True)
    return out


def time_past_limit(quick: bool) -> dict:
    """A constrained job with a 2 s limit in a fresh process (as ``tensorjob run`` starts one), against a plain one
    in the same run: how long past the limit each ends."""
    script = f"""
import sys, time
sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})
import tensorjob_jupyter as tj
from tensorjob_jupyter.sandbox.compile import GuestSource
echo = GuestSource.from_file({str(Path(__file__).resolve().parents[1] / "tests" / "guests" / "infer_echo.c")!r})
schema = {{"type": "object", "properties": {{"stories": {{"type": "array", "minItems": 4, "maxItems": 4,
          "items": {{"type": "string", "minLength": 400, "maxLength": 512}}}}}}, "required": ["stories"]}}
options = {{"format": {{"type": "json_schema", "name": "a", "schema": schema}}}} if sys.argv[1] == "json" else {{}}
started = time.monotonic()
env = tj.Job(echo, input={{"prompt": "Write a long story.", "max_tokens": 2000, "options": options}},
             job_timeout_s=2.0).start().wait(300)
if env.error is None:  # the model ended its answer before the limit came: no figure from this run
    print("nan")
else:
    assert env.error.code == "timeout", env
    print(time.monotonic() - started - 2.0)
"""
    out: dict = {"exit_codes": []}
    for kind in ("plain", "json"):
        past = []
        for _ in range(1 if quick else 3):
            # the exit code is kept, not checked: a process that exits while its model's worker thread is
            # still in llama.cpp can crash on the way out, after it has printed its figure
            done = subprocess.run([sys.executable, "-c", script, kind], capture_output=True, text=True, timeout=600)
            out["exit_codes"].append(done.returncode)
            figure = done.stdout.split()[-1:] or ["nan"]
            past.append(float(figure[0]))
        past = [p for p in past if p == p]  # a run whose answer ended first gives none
        out[kind] = statistics.median(past) if past else None

    def shown(kind: str) -> str:
        return "-- (every answer ended before the limit)" if out[kind] is None else f"{out[kind]:.2f} s"
    print(f"a job with job_timeout_s=2 in a fresh process ends {shown('json')} past it with a JSON format "
          f"(its schema forces hundreds of tokens), {shown('plain')} without one (its first schema check "
          f"imports jsonschema on the job's thread: 13 s under load while that import built rfc3987_syntax's "
          f"parser)", flush=True)
    return out


# --- 6. a served model's and tensorjob serve's bounds (issue 31) ----------------------------------------

CLI = [sys.executable, "-m", "tensorjob_jupyter.frontends.cli"]
HOSTILE_KEY = "sk-bench-0123456789abcdefghijKLMNOP"


def _watched(argv: list[str], limit_bytes: int, limit_s: float, env: dict | None = None) -> dict:
    """Run ``argv``, sampling its resident set: exit status, peak MiB, seconds (killed past the limits)."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), **(env or {})})
    peak, killed = 0, False
    while proc.poll() is None:
        try:
            peak = max(peak, psutil.Process(proc.pid).memory_info().rss)
        except psutil.Error:
            pass
        if peak > limit_bytes or time.perf_counter() - started > limit_s:
            proc.kill()
            killed = True
        time.sleep(0.02)
    out, err = proc.communicate()
    return {"exit": proc.returncode, "peak_mib": peak / MiB, "seconds": time.perf_counter() - started,
            "killed": killed, "stdout": out, "stderr": err}


def _longest_key_run(text: str, key: str) -> int:
    best = 0
    for i in range(len(key)):
        for j in range(i + best + 1, len(key) + 1):
            if key[i:j] not in text:
                break
            best = j - i
    return best


def hostile_model_server(tmp: Path) -> dict:
    guest = tmp / "infer.wasm"
    guest.write_bytes(wat.script_guest([{"cmd": "infer", "prompt": "hi", "max_tokens": 4},
                                        {"cmd": "done", "result": "ok"}]))
    env = {"OPENAI_API_KEY": HOSTILE_KEY}
    out: dict = {}
    with hostile_http.serve() as port:
        def run(mode: str, **limits) -> dict:
            return _watched([*CLI, "run", str(guest), "--model", hostile_http.model_url(port, mode), "--json",
                             "--runs", str(tmp / "runs" / mode)], **limits, env=env)

        honest = run("honest", limit_bytes=3 << 30, limit_s=120)
        endless = run("models-endless", limit_bytes=3 << 29, limit_s=30)
        out["listing_endless"] = {"peak_mib": endless["peak_mib"], "seconds": endless["seconds"],
                                  "killed_by_the_bench": endless["killed"], "honest_peak_mib": honest["peak_mib"],
                                  "honest_seconds": honest["seconds"]}
        print(f"served: `tensorjob run` on an endless /v1/models: peak {endless['peak_mib']:.0f} MiB "
              f"({endless['peak_mib'] / honest['peak_mib']:.2f} x an honest server's {honest['peak_mib']:.0f} MiB), "
              f"{endless['seconds']:.1f} s{' (killed by the bench)' if endless['killed'] else ''}", flush=True)

        url = hostile_http.model_url(port, "models-trickle")
        box: list = []
        started = time.perf_counter()
        maker = threading.Thread(target=lambda: box.append(tj.Job(wat.script_guest([
            {"cmd": "infer", "prompt": "hi", "max_tokens": 4}, {"cmd": "done", "result": "ok"}]), model=url,
            runs_dir=str(tmp / "runs" / "trickle"), job_timeout_s=2.0)), daemon=True)
        maker.start()
        maker.join(40)
        created_s = time.perf_counter() - started
        ended_s = None
        if box:
            box[0].start().wait(60)
            ended_s = time.perf_counter() - started
        out["listing_trickle"] = {"job_created_s": created_s, "given_up": not box, "job_ended_s": ended_s}
        print(f"served: a /v1/models trickling a byte every {hostile_http.MODELS_TRICKLE_S} s: tj.Job(...) returned "
              f"after {created_s:.1f} s{' (given up: it was still blocked)' if not box else ''}; the job with "
              f"job_timeout_s=2 ended at {ended_s if ended_s is None else round(ended_s, 1)} s", flush=True)

        for mode in ("usage-huge", "usage-big", "long-id"):
            r = run(mode, limit_bytes=3 << 30, limit_s=120)
            runs = list((tmp / "runs" / mode).iterdir())
            show = subprocess.run([*CLI, "show", str(runs[0]), "--quiet"], capture_output=True, text=True,
                                  timeout=120) if runs else None
            enveloped = r["stdout"].lstrip().startswith("{")
            readable = show is not None and show.returncode == 0
            out[mode] = {"exit": r["exit"], "envelope": enveloped, "traceback": "Traceback" in r["stderr"],
                         "show_reads_it": readable}
            print(f"served: {mode:10s}: `tensorjob run` exit {r['exit']}, envelope {'yes' if enveloped else 'NO'}"
                  f"{', a traceback' if 'Traceback' in r['stderr'] else ''}; `tensorjob show` "
                  f"{'reads it' if readable else 'calls it damaged'}", flush=True)
        r = run("key-echo", limit_bytes=3 << 30, limit_s=120)
        longest = _longest_key_run(r["stdout"] + r["stderr"], HOSTILE_KEY)
        out["key_echo"] = {"longest_key_run": longest, "key_chars": len(HOSTILE_KEY)}
        print(f"served: an error quoting the key after {hostile_http.KEY_ECHO_PAD} characters: the longest run of "
              f"the key left in what `tensorjob run` printed: {longest} of {len(HOSTILE_KEY)} characters", flush=True)
    return out


def finished_jobs_kept(tmp: Path) -> dict:
    from tensorjob_jupyter.host import jobs as jobs_module

    guest = wat.script_guest([{"cmd": "done", "result": "ok"}])
    tj.Job(guest, backend=None, runs_dir=str(tmp)).start().wait(60)
    gc.collect()
    rss_before = rss_trimmed()
    for i in range(12):
        job = tj.Job(guest, backend=None, runs_dir=str(tmp), input="x" * 15_000_000)
        job.start().wait(120)
    del job
    gc.collect()
    kept = (rss_trimmed() - rss_before) / MiB
    finished = [j for j in jobs_module.jobs() if j.done]
    accounted = sum(j.retained_bytes for j in finished) / MiB
    print(f"jobs(): after 12 jobs with 15 MB inputs, {len(finished)} finished jobs kept; resident set +{kept:.0f} MiB, "
          f"counted {accounted:.1f} MiB", flush=True)
    return {"kept_mib": kept, "counted_mib": accounted, "finished_jobs": len(finished)}


def _serve(*args: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([*CLI, "serve", "--port", "0", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    line = proc.stdout.readline()
    if not line.startswith("serving at "):
        proc.kill()
        raise RuntimeError(f"tensorjob serve did not start: {line!r} {proc.stderr.read()[-2000:]}")
    url = line.split()[2]
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # listening (the code before issue 31 printed the line first)
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.05)
    return proc, url


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def _post(url: str, path: str, body: dict, timeout: float) -> tuple[int | None, float]:
    import urllib.error
    import urllib.request

    started = time.perf_counter()
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            r.read()
            status = r.status
    except urllib.error.HTTPError as e:
        status = e.code
    except OSError:
        status = None
    return status, time.perf_counter() - started


def serve_connections(tmp: Path) -> dict:
    from llama_support import write_tiny_gguf  # tests/llama_support.py

    proc, url = _serve("--model", str(write_tiny_gguf(tmp / "tiny.gguf")), "--threads", "1")
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    server = psutil.Process(proc.pid)
    out: dict = {}
    try:
        base = server.num_fds()
        socks = []
        for _ in range(400):
            try:
                s = socket.create_connection(("127.0.0.1", port), timeout=5)
                s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-")
                socks.append(s)
            except OSError:
                pass
        time.sleep(0.5)
        at_once = server.num_fds() - base
        time.sleep(12)
        later = server.num_fds() - base
        for s in socks:
            s.close()
        out["half_sent_headers"] = {"fds_at_once": at_once, "fds_after_12_s": later}
        print(f"serve: 400 clients sending half their headers: {at_once} file descriptors held at once, {later} "
              f"after 12 s", flush=True)
        time.sleep(1)
        rss = server.memory_info().rss
        size = 4 * MiB
        head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                f"Content-Length: {size}\r\n\r\n").encode()
        body = b" " * (size - 1)
        stalled: list = []

        def stall() -> None:
            try:
                s = socket.create_connection(("127.0.0.1", port), timeout=10)
                stalled.append(s)
                s.sendall(head + body)
            except OSError:
                pass

        senders = [threading.Thread(target=stall) for _ in range(100)]
        for t in senders:
            t.start()
        for t in senders:
            t.join(30)
        time.sleep(0.5)
        grown = (server.memory_info().rss - rss) / MiB
        for s in stalled:
            s.close()
        out["stalled_uploads"] = {"rss_growth_mib": grown}
        print(f"serve: 100 uploads of 4 MiB stalled before their last byte: the server grew {grown:.0f} MiB",
              flush=True)
    finally:
        _stop(proc)
    return out


def abandoned_embed_wait(quick: bool) -> dict:
    words = " ".join(f"lighthouse{i % 97} keeper watched the sea" for i in range(300))  # 1,500 words
    proc, url = _serve("--threads", "1")
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    chat = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4}
    out: dict = {}
    try:
        _post(url, "/chat/completions", chat, 120)  # warm
        alone = statistics.median(_post(url, "/chat/completions", chat, 120)[1] for _ in range(3))
        piece = " ".join(words.split()[:45])  # about 64 tokens: one piece of an embed (EMBED_PIECE_TOKENS)
        _post(url, "/embeddings", {"input": [piece]}, 120)
        piece_s = statistics.median(_post(url, "/embeddings", {"input": [piece]}, 120)[1] for _ in range(3))
        waits = []
        rounds = 1 if quick else 3
        for round_ in range(rounds):
            body = json.dumps({"input": [words] * 8}).encode()
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            s.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n" % len(body) + body)
            time.sleep(0.3)
            s.close()
            status, waited = _post(url, "/chat/completions", chat, 180)
            waits.append(waited if status == 200 else float("inf"))
            if round_ + 1 < rounds:
                _post(url, "/embeddings", {"input": ["settle"]}, 600)  # whatever is left of it, before the next
        wait = statistics.median(waits)
        out["innocent_chat"] = {"alone_s": alone, "behind_abandoned_embed_s": wait, "extra_s": wait - alone,
                                "ratio": wait / alone, "one_piece_s": piece_s,
                                "extra_in_pieces": (wait - alone) / piece_s}
        print(f"serve: a 4-token chat just after an abandoned /embeddings of 8 x 1,500 words: {wait:.2f} s, against "
              f"{alone:.2f} s alone ({wait / alone:.1f} x; {wait - alone:+.2f} s; goal: under 1 s more); an embed of "
              f"one 64-token text takes {piece_s:.2f} s here, so the chat waited {(wait - alone) / piece_s:.1f} of "
              f"those", flush=True)
        status, seconds = _post(url, "/embeddings", {"input": [words] * 32}, 10)
        out["embed_32_texts"] = {"status": status, "seconds": seconds}
        print(f"serve: /embeddings of 32 x 1,500 words: "
              f"{'HTTP %s after %.2f s' % (status, seconds) if status else 'no answer within 10 s'}", flush=True)
    finally:
        _stop(proc)
    return out


def served_bounds(quick: bool) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        out = hostile_model_server(tmp)
        (tmp / "kept").mkdir()
        out["jobs"] = finished_jobs_kept(tmp / "kept")
        out["serve"] = serve_connections(tmp)
        out["serve"].update(abandoned_embed_wait(quick))
    return out


def model_bounds(runs_dir: str, quick: bool) -> dict:
    from tensorjob_jupyter.inference.llama import LlamaEngine
    from tensorjob_jupyter.inference.models import default_model_path

    from llama_support import write_tiny_gguf  # tests/llama_support.py: the tiny random-weight model

    engine = LlamaEngine(default_model_path(), n_ctx=512)
    try:
        out = {"hostile": hostile_grammars(engine), "per_token": grammar_work_per_token(engine, quick),
               "abandon": abandon_latency(engine, quick), "beside": grammar_beside_others(engine)}
    finally:
        engine.close()
    with tempfile.TemporaryDirectory() as tmp:
        out["memory"] = schema_memory(runs_dir, write_tiny_gguf(Path(tmp) / "tiny.gguf"))
    out["time_past_limit"] = time_past_limit(quick)
    return out


def run_folder_bounds(tmp: Path) -> dict:
    """``runs --table``, ``diff --map`` and ``replay --map`` on planted copies of a real map's run folder: exit
    status, seconds and peak MiB of each, against the untouched folder (issue 38)."""
    from tensorjob_jupyter.fanout import map as tj_map
    from tensorjob_jupyter.inference.scripted import ScriptedBackend

    guest = tmp / "guest.wasm"
    guest.write_bytes(wat.script_guest([{"cmd": "done", "result": {"n": 1}}]))
    manifest = tmp / "m.jsonl"
    manifest.write_text("".join(json.dumps({"i": i}) + "\n" for i in range(4)))
    real = tmp / "run"
    tj_map(guest, manifest, real, backend=ScriptedBackend("a"), expected=[{"n": 1}] * 4)

    def fifo(run: Path, name: str) -> None:
        (run / name).unlink()
        os.mkfifo(run / name)

    def zero(run: Path, name: str) -> None:
        (run / name).unlink()
        (run / name).symlink_to("/dev/zero")

    def forged(items: int):
        def plant(run: Path, _name: str) -> None:
            ledger = json.loads((run / "ledger.json").read_text())
            ledger["manifest"]["items"] = items
            (run / "ledger.json").write_text(json.dumps(ledger))
        return plant

    def as_text(run: Path, name: str) -> None:
        lines = (run / name).read_text().splitlines()
        first = json.loads(lines[0])
        first["item"] = str(first["item"])
        (run / name).write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")

    cases = [("untouched", None, None)] + [(f"FIFO {n}", fifo, n) for n in
                                           ("ledger.json", "results.jsonl", "failures.jsonl", "scores.jsonl")]
    cases += [("results.jsonl -> /dev/zero", zero, "results.jsonl"),
              ("ledger claims 10,000,000 items", forged(10_000_000), None),
              ("ledger claims 2**53 items", forged(2 ** 53), None), ("item as text", as_text, "results.jsonl")]
    rows, base = [], {}
    for label, plant, name in cases:
        run = tmp / f"case-{len(rows)}"
        shutil.copytree(real, run, symlinks=True)
        if plant is not None:
            if name and not (run / name).exists():
                (run / name).write_text("")
            plant(run, name)
        for command in (["runs", "--table", run], ["diff", "--map", run, run],
                        ["replay", "--map", run, guest, "--run-dir", tmp / f"replayed-{len(rows)}", "-q"]):
            got = _watched([*CLI, *map(str, command)], int(1.5 * 1024 * MiB), 30)
            lines = [x for x in got["stderr"].splitlines() if x.strip()]
            row = {"case": label, "command": " ".join(map(str, command[:2])), "exit": got["exit"],
                   "seconds": round(got["seconds"], 2), "peak_mib": round(got["peak_mib"], 1),
                   "killed": got["killed"], "traceback": "Traceback" in got["stderr"], "stderr_lines": len(lines)}
            if plant is None:
                base[row["command"]] = row
            b = base[row["command"]]
            print(f"run-folders: {label:32} {row['command']:14} exit {row['exit']:>3}  {row['seconds']:5.2f} s "
                  f"({row['seconds'] / max(b['seconds'], 1e-3):.2f}x untouched)  {row['peak_mib']:6.1f} MiB "
                  f"({row['peak_mib'] - b['peak_mib']:+.1f} MiB)  {'KILLED ' if row['killed'] else ''}"
                  f"{'TRACEBACK ' if row['traceback'] else ''}{lines[-1][:90] if lines and plant else ''}",
                  flush=True)
            rows.append(row)
    return {"rows": rows}


SECTIONS = ("memory", "open", "world", "transcripts", "model", "served", "run-folders")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", choices=SECTIONS, action="append", help="run only these sections (repeatable)")
    args = parser.parse_args()
    only = set(args.only or SECTIONS)
    sizes = [1, 4, 16] if args.quick else [1, 4, 16, 64]
    print(f"cores: {psutil.cpu_count()}, load: {open('/proc/loadavg').read().split()[:3]}")
    summary: dict = {}
    with tempfile.TemporaryDirectory() as runs_dir:
        if "memory" in only:
            summary["memory"] = memory_after_jobs(sizes, runs_dir)
            kept = [row["kept_mib"] for row in summary["memory"]]
            print(f"kept after a job: {min(kept):.2f} to {max(kept):.2f} MiB while published grew "
                  f"{summary['memory'][0]['published_mib']:.0f} -> {summary['memory'][-1]['published_mib']:.0f} MiB")
        if "open" in only:
            summary["open"] = open_huge_path(runs_dir)
        if "world" in only:
            summary["world"] = world_bounds(runs_dir, args.quick)
        if "transcripts" in only:
            with tempfile.TemporaryDirectory() as tmp:
                summary["transcripts"] = transcript_bounds(Path(tmp), args.quick)
        if "model" in only:
            summary["model"] = model_bounds(runs_dir, args.quick)
        if "served" in only:
            summary["served"] = served_bounds(args.quick)
        if "run-folders" in only:
            with tempfile.TemporaryDirectory() as tmp:
                summary["run-folders"] = run_folder_bounds(Path(tmp))
    print(f"load at the end: {open('/proc/loadavg').read().split()[:3]}")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()

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

Ratios are against baselines measured in the same process. The last line is
a one-line JSON summary.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import shutil
import signal
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    sizes = [1, 4, 16] if args.quick else [1, 4, 16, 64]
    print(f"cores: {psutil.cpu_count()}, load: {open('/proc/loadavg').read().split()[:3]}")
    with tempfile.TemporaryDirectory() as runs_dir:
        summary = {"memory": memory_after_jobs(sizes, runs_dir), "open": open_huge_path(runs_dir)}
        summary["world"] = world_bounds(runs_dir, args.quick)
        with tempfile.TemporaryDirectory() as tmp:
            summary["transcripts"] = transcript_bounds(Path(tmp), args.quick)
    kept = [row["kept_mib"] for row in summary["memory"]]
    print(f"kept after a job: {min(kept):.2f} to {max(kept):.2f} MiB while published grew "
          f"{summary['memory'][0]['published_mib']:.0f} -> {summary['memory'][-1]['published_mib']:.0f} MiB")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()

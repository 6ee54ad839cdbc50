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

Ratios are against baselines measured in the same process. The last line is
a one-line JSON summary.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import psutil  # noqa: E402

import tensorjob_jupyter as tj
from tensorjob_jupyter.world.grants import AccessError, Grants

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    sizes = [1, 4, 16] if args.quick else [1, 4, 16, 64]
    print(f"cores: {psutil.cpu_count()}, load: {open('/proc/loadavg').read().split()[:3]}")
    with tempfile.TemporaryDirectory() as runs_dir:
        summary = {"memory": memory_after_jobs(sizes, runs_dir), "open": open_huge_path(runs_dir)}
    kept = [row["kept_mib"] for row in summary["memory"]]
    print(f"kept after a job: {min(kept):.2f} to {max(kept):.2f} MiB while published grew "
          f"{summary['memory'][0]['published_mib']:.0f} -> {summary['memory'][-1]['published_mib']:.0f} MiB")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()

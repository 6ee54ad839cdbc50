"""What this machine offers llama.cpp: CPUs, cores, a thread setting, a GPU.

llama.cpp runs fastest with one generation thread per *physical* core (two
threads on hyperthread siblings fight over one core's units) and with prompt
processing on every CPU the process may use. "May use" is the narrow reading:
the CPU affinity mask first, then any cgroup CPU quota (a container limited
to two CPUs on a 64-CPU host must not start 64 threads). These facts change
with the machine, not with the engine, so they live apart from it.

``TENSORJOB_THREADS`` overrides both thread counts for every model a process
builds with ``get_backend`` (the CLI, the magic, ``tj.run`` and map workers
all do). It exists because greedy output is deterministic on one machine,
build and thread count, not across them: the test suite runs the tutorials
and the model tests under two thread counts to prove that nothing it checks
depends on the model's exact words. It is also how to keep a job from using
every core.

GPU offload is a property of the llama.cpp build (CUDA, Metal, Vulkan, ...),
asked of the library itself.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from tensorjob_jupyter.inference.base import ModelError
from tensorjob_jupyter.inference.library import llama_cpp_library

THREADS_ENV = "TENSORJOB_THREADS"


def available_cpus() -> list[int]:
    """The CPUs in this process's affinity mask."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return list(range(os.cpu_count() or 1))


def _cgroup_cpu_limit() -> int | None:
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            return max(1, math.ceil(int(quota) / int(period)))
    except (OSError, ValueError):
        pass
    return None


def logical_cpus() -> int:
    """CPUs this process may use (affinity, then any cgroup quota)."""
    n = len(available_cpus())
    limit = _cgroup_cpu_limit()
    return max(1, min(n, limit) if limit else n)


def physical_cores() -> int:
    """Physical cores this process may run on (hyperthread siblings counted once)."""
    cores = set()
    for cpu in available_cpus():
        base = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            cores.add((base.joinpath("physical_package_id").read_text().strip(),
                       base.joinpath("core_id").read_text().strip()))
        except OSError:
            cores.add(("cpu", cpu))
    n = max(1, len(cores))
    limit = _cgroup_cpu_limit()
    return min(n, limit) if limit else n


def threads_setting() -> int | None:
    """``TENSORJOB_THREADS`` as a positive thread count, or None when unset or empty."""
    raw = os.environ.get(THREADS_ENV, "").strip()
    if not raw:
        return None
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n < 1:
        raise ModelError(f"{THREADS_ENV} must be a positive whole number of threads, not {raw!r}")
    return n


def default_threads() -> tuple[int, int]:
    """(generation threads, prompt threads) for an engine given none: the
    physical cores, and every CPU this process may use for prompts."""
    cores = physical_cores()
    return cores, max(cores, logical_cpus())


def load_per_core() -> float | None:
    """The one-minute load average over the CPUs this process may use (about 1 when they are all busy);
    None where the platform has no load average."""
    try:
        return os.getloadavg()[0] / logical_cpus()
    except (AttributeError, OSError):  # pragma: no cover - not Unix
        return None


def gpu_offload_supported() -> bool:
    """Whether the installed llama.cpp build can offload layers to a GPU."""
    return bool(llama_cpp_library().llama_supports_gpu_offload())


__all__ = [
    "THREADS_ENV", "available_cpus", "logical_cpus", "physical_cores", "threads_setting", "default_threads",
    "load_per_core", "gpu_offload_supported"
]

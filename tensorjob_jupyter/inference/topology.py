"""What this machine offers llama.cpp: CPUs, cores, a thread setting, a GPU.

llama.cpp runs fastest with one generation thread per physical core and prompt processing on every
CPU the process may use (the affinity mask, then any cgroup quota). These facts change with the
machine, not with the engine, so they live apart from it. ``TENSORJOB_THREADS`` overrides both
counts (greedy output is deterministic only for one machine, build and thread count), ``CpuShare``
measures what other work takes of this process's CPUs so the engine can fit its threads to the
cores actually free, and GPU offload is asked of the llama.cpp build itself.

Design: docs/internals/inference.md#topologypy
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Callable

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
    cores: set[tuple[str, str | int]] = set()  # (package, core), or ("cpu", n) where the topology is unreadable
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
        return os.getloadavg()[0] / _logical_cpus_lately()
    except (AttributeError, OSError):  # pragma: no cover - not Unix
        return None


_LATELY: list[float] = [-math.inf, 1]  # when logical_cpus() was last read, and what it said


def _logical_cpus_lately(max_age_s: float = 1.0) -> int:
    """``logical_cpus()`` as read within the last ``max_age_s`` (every answer's timing asks for it)."""
    now = time.monotonic()
    if now - _LATELY[0] > max_age_s:
        _LATELY[:] = [now, logical_cpus()]
    return int(_LATELY[1])


#: The columns of a ``/proc/stat`` CPU line that are busy time (user, nice, system, irq, softirq, steal).
_BUSY_COLUMNS = (0, 1, 2, 5, 6, 7)


def busy_seconds(cpus: list[int], stat_text: str | None = None) -> float | None:
    """Seconds the CPUs ``cpus`` have been busy since boot, by anyone (``/proc/stat``); None where it cannot be
    read (not Linux)."""
    try:
        text = Path("/proc/stat").read_text() if stat_text is None else stat_text
    except OSError:
        return None
    wanted = {f"cpu{c}" for c in cpus}
    ticks = 0
    for line in text.splitlines():
        name, _, rest = line.partition(" ")
        if name in wanted:
            fields = rest.split()
            ticks += sum(int(fields[i]) for i in _BUSY_COLUMNS if i < len(fields))
    return ticks / os.sysconf("SC_CLK_TCK")


def own_seconds() -> float:
    """CPU seconds this process has used, every thread of it."""
    t = os.times()
    return t.user + t.system


class CpuShare:
    """How many of this process's CPUs the rest of the machine kept busy, over windows of ``window_s``.

    ``others()`` is None until a window has passed, then the cores others used on average over it (the CPUs'
    busy time less this process's own, per second of the clock), and starts the next window."""

    def __init__(self, window_s: float = 2.0, *, busy: Callable[[], float | None] | None = None,
                 own: Callable[[], float] = own_seconds, clock: Callable[[], float] = time.monotonic):
        cpus = available_cpus()
        self._busy = busy or (lambda: busy_seconds(cpus))
        self._own, self._clock, self.window_s = own, clock, window_s
        self._start = self._sample()

    def _sample(self) -> tuple[float, float | None, float]:
        return self._clock(), self._busy(), self._own()

    def others(self) -> float | None:
        now = self._clock()
        if now - self._start[0] < self.window_s:
            return None
        start, end = self._start, self._sample()
        self._start = end
        if start[1] is None or end[1] is None or end[0] <= start[0]:
            return None
        return max(0.0, (end[1] - start[1]) - (end[2] - start[2])) / (end[0] - start[0])


def fitting_threads(most: int, cpus: int, others: float) -> int:
    """The generation threads that fit: the CPUs others leave free (rounded to the nearest), at least one and
    at most ``most``."""
    return max(1, min(most, int(cpus - others + 0.5)))


def gpu_offload_supported() -> bool:
    """Whether the installed llama.cpp build can offload layers to a GPU."""
    return bool(llama_cpp_library().llama_supports_gpu_offload())


__all__ = [
    "THREADS_ENV", "available_cpus", "logical_cpus", "physical_cores", "threads_setting", "default_threads",
    "load_per_core", "busy_seconds", "own_seconds", "CpuShare", "fitting_threads", "gpu_offload_supported"
]

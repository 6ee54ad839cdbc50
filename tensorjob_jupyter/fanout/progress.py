"""What a map reports: ``MapProgress`` (a live look), ``MapResult`` (how it ended), ``ItemTimes``.

Plain values, so the notebook view, the command line's printer and the
benchmarks can hold and compare them from any thread: ``MapRun`` hands out
a fresh ``MapProgress`` per change (its ``version`` says which) and copies
of ``ItemTimes``. ``MapResult`` reads results back from the run folder's
files rather than keeping them, since the files are the record.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .folder import FAILURES, RESULTS, _read_records


@dataclass(frozen=True)
class MapProgress:
    """One consistent look at a map. ``completed``/``failed`` count this
    session's items; ``skipped_*`` those concluded before it (resume)."""

    total: int
    completed: int = 0
    failed: int = 0
    running: int = 0
    skipped_completed: int = 0
    skipped_failed: int = 0
    cancelled: int = 0
    peak_running: int = 0
    elapsed_s: float = 0.0
    status: str = "running"  # running | finished | cancelled | error
    dashboard_link: str | None = None
    version: int = 0

    @property
    def skipped(self) -> int:
        return self.skipped_completed + self.skipped_failed

    @property
    def concluded(self) -> int:
        return self.skipped + self.completed + self.failed

    @property
    def remaining(self) -> int:
        return self.total - self.concluded

    @property
    def throughput(self) -> float:
        """Items concluded per second in this session."""
        return (self.completed + self.failed) / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def to_json(self) -> dict:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        out.update(skipped=self.skipped, remaining=self.remaining, throughput=round(self.throughput, 3))
        return out


@dataclass(frozen=True)
class MapResult:
    """How a map ended; counts cover the whole run folder, resumes included."""

    run_dir: Path
    total: int
    completed: int
    failed: int
    skipped: int
    ran: int
    status: str
    elapsed_s: float
    throughput: float
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "finished" and self.completed == self.total

    @property
    def results_path(self) -> Path:
        return self.run_dir / RESULTS

    @property
    def failures_path(self) -> Path:
        return self.run_dir / FAILURES

    def results(self) -> dict[int, Any]:
        """Each completed item's result, by item number."""
        return {r["item"]: r["result"] for r in _read_records(self.results_path)}

    def failures(self) -> dict[int, dict]:
        """Each failed item's error (``code``, ``message``), by item number."""
        return {r["item"]: r["error"] for r in _read_records(self.failures_path)}

    def to_json(self) -> dict:
        return {"status": self.status, "run_dir": str(self.run_dir), "results": str(self.results_path),
                "failures": str(self.failures_path), "total": self.total, "completed": self.completed,
                "failed": self.failed, "skipped": self.skipped, "ran": self.ran,
                "elapsed_s": round(self.elapsed_s, 3), "throughput": round(self.throughput, 3),
                "error": self.error}


@dataclass
class ItemTimes:
    """Where item time went, summed over this session (for benchmarks)."""

    items: int = 0
    setup_s: float = 0.0    # building the Job (grants, event stream, transcript folder)
    run_s: float = 0.0      # start -> envelope: thread, reactor, transcript close
    reactor_s: float = 0.0  # of which the reactor: instantiate, guest calls, inference
    latency_s: float = 0.0  # submitted -> outcome back in the map's thread

    def to_json(self) -> dict:
        n = self.items or 1
        return {"items": self.items, "setup_ms": 1000 * self.setup_s / n, "run_ms": 1000 * self.run_s / n,
                "reactor_ms": 1000 * self.reactor_s / n, "latency_ms": 1000 * self.latency_s / n}

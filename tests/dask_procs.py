"""A Dask scheduler and workers as separate processes, started the way a user starts them.

    with ProcessCluster(tmp_path, workers=2, env=env) as cluster:
        subprocess.run(["tensorjob", "map", ..., "--cluster", cluster.address])

``dask scheduler`` writes its address to a scheduler file; each worker is
``dask worker ADDRESS`` (the way a user adds a machine). Readiness is read
from the scheduler's own log ("Register worker"), so the process that starts
the cluster never holds a Dask client: a client here would be exactly the
shared state the black-box tests must not have. Used by
tests/fanout/test_map_cluster.py and bench/bench_map.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DASK = Path(sys.executable).with_name("dask")  # the `dask` command of this environment


def dask_command(what: str) -> list[str]:
    """``dask scheduler`` / ``dask worker`` of this Python's environment."""
    if DASK.exists():
        return [str(DASK), what]
    return [sys.executable, "-m", f"distributed.cli.dask_{what}"]


def worker_env(**extra: str) -> dict:
    """This environment, with the repository first on PYTHONPATH (workers import this checkout)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(ROOT), env.get("PYTHONPATH", "")] if p)
    env.update(extra)
    return env


class ProcessCluster:
    """``dask scheduler`` plus ``dask worker ADDRESS`` processes; close() ends them."""

    def __init__(self, folder: str | os.PathLike, *, workers: int = 2, nthreads: int = 1, nanny: bool = True,
                 env: dict | None = None, timeout: float = 60.0):
        self.folder = Path(folder).absolute()
        self.folder.mkdir(parents=True, exist_ok=True)
        self.env = env if env is not None else worker_env()
        self.timeout = timeout
        self.address = ""
        self.scheduler: subprocess.Popen | None = None
        self.workers: list[subprocess.Popen] = []
        self._logs: list = []
        try:
            self._start_scheduler()
            for _ in range(workers):
                self.add_worker(nthreads=nthreads, nanny=nanny)
            self.wait_for_workers(workers)
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> "ProcessCluster":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _popen(self, argv: list[str], name: str, env: dict, cwd: str | os.PathLike | None = None) -> subprocess.Popen:
        log = open(self.folder / f"{name}.log", "wb")
        self._logs.append(log)
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd or self.folder,
                                start_new_session=True)

    def _start_scheduler(self) -> None:
        scheduler_file = self.folder / "scheduler.json"
        self.scheduler = self._popen([*dask_command("scheduler"), "--host", "127.0.0.1", "--port", "0",
                                      "--dashboard-address", "127.0.0.1:0", "--scheduler-file", str(scheduler_file)],
                                     "scheduler", self.env)
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                self.address = json.loads(scheduler_file.read_text())["address"]
                return
            except (OSError, ValueError, KeyError):
                pass
            if self.scheduler.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"dask scheduler did not start:\n{self.log('scheduler')}")
            time.sleep(0.05)

    def add_worker(self, *, nthreads: int = 1, nanny: bool = True, env: dict | None = None,
                   argv: list[str] | None = None, cwd: str | os.PathLike | None = None) -> subprocess.Popen:
        """Start one more worker; ``argv`` replaces ``dask worker`` (e.g. another Python)."""
        command = (argv or dask_command("worker")) + [self.address, "--nthreads", str(nthreads), "--no-dashboard",
                                                     "--nanny" if nanny else "--no-nanny"]
        proc = self._popen(command, f"worker-{len(self.workers)}", env if env is not None else self.env, cwd)
        self.workers.append(proc)
        return proc

    def registered(self) -> int:
        """Workers connected now, as the scheduler's log tells it."""
        text = self.log("scheduler")
        return text.count("Register worker addr:") - text.count("Remove worker addr:")

    def wait_for_workers(self, n: int) -> None:
        deadline = time.monotonic() + self.timeout
        while self.registered() < n:
            if time.monotonic() > deadline:
                logs = "\n".join(self.log(f"worker-{i}")[-2000:] for i in range(len(self.workers)))
                raise RuntimeError(f"{n} dask workers did not register:\n{logs}")
            time.sleep(0.05)

    def log(self, name: str) -> str:
        try:
            return (self.folder / f"{name}.log").read_text(errors="replace")
        except OSError:
            return ""

    def close(self) -> None:
        for proc in [*self.workers, self.scheduler]:
            if proc is not None and proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for proc in [*self.workers, self.scheduler]:
            if proc is None:
                continue
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(10)
        for log in self._logs:
            log.close()
        self._logs.clear()

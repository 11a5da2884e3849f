"""Real ``celery worker`` subprocesses for tests (threads pool), each in its own process group.

    with CeleryWorkers(redis.url, count=3, env={"IRBENCH_CLAIM_TTL_S": "3"}) as workers:
        ...
        workers.kill(0)            # SIGKILL the whole group of worker 0
        workers.ensure_running()   # restart any dead worker (waits until it is ready)

Readiness is read from the worker's log file ("ready."). ``stop()`` sends SIGTERM to each group,
then SIGKILL; it also runs on ``__exit__`` whatever happened in the test.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Protocol

__all__ = ["CeleryWorkers", "CeleryWorkersError", "WorkerCommand"]

REPO = Path(__file__).resolve().parents[1]


class CeleryWorkersError(RuntimeError):
    pass


class WorkerProcess(Protocol):
    """What ``subprocess.Popen`` gives that the workers use."""

    pid: int

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


Spawn = Callable[..., WorkerProcess]  # ``subprocess.Popen``'s signature: argv, then its keywords


@dataclass(frozen=True)
class WorkerCommand:
    """Which ``celery worker`` each process is: the Celery ``app`` module (``-A``; a benchmark's
    reference app, say), the comma-separated ``queues`` it consumes (``-Q``), its ``log_level``."""

    app: str = "orchestrator.distributed.worker_app"
    queues: str = "irbench"
    log_level: str = "INFO"


class CeleryWorkers:
    """``count`` workers of ``command`` on ``broker_url`` with ``concurrency`` threads each, each
    ready within ``start_timeout_s`` seconds of its start; ``spawn`` starts a process as
    ``subprocess.Popen`` does (a test suite may fork its workers from a pre-loaded process)."""

    def __init__(
        self,
        broker_url: str,
        *,
        count: int = 3,
        concurrency: int = 4,
        command: WorkerCommand = WorkerCommand(),
        env: Mapping[str, str] | None = None,
        start_timeout_s: float = 30.0,
        spawn: Spawn = subprocess.Popen,
    ) -> None:
        self.broker_url = broker_url
        self.command = command
        self.count = count
        self.concurrency = concurrency
        self.env = dict(env or {})
        self.start_timeout_s = start_timeout_s
        self._tmp = tempfile.TemporaryDirectory(prefix="irbench-celery-")
        self.log_dir = Path(self._tmp.name)
        self._popen = spawn
        self.procs: list[WorkerProcess | None] = [None] * count
        self._generation = [0] * count

    def log_path(self, i: int) -> Path:
        return self.log_dir / f"w{i}-{self._generation[i]}.log"

    def _spawn(self, i: int) -> None:
        self._generation[i] += 1
        env = {**os.environ, **self.env, "IRBENCH_BROKER_URL": self.broker_url, "PYTHONUNBUFFERED": "1"}
        argv = [
            sys.executable, "-m", "celery", "-A", self.command.app, "worker",
            "-P", "threads", "-c", str(self.concurrency), "-Q", self.command.queues,
            "-n", f"w{i}-{self._generation[i]}@%h", "--without-gossip", "--without-mingle", "--without-heartbeat",
            "--loglevel", self.command.log_level, "-f", str(self.log_path(i)),
        ]
        self.procs[i] = self._popen(
            argv, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True
        )

    def _wait_ready(self, idx: list[int]) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        pending = set(idx)
        while pending:
            for i in list(pending):
                p = self.procs[i]
                if p is None or p.poll() is not None:
                    raise CeleryWorkersError(f"worker {i} exited during startup:\n{self.tail(i)}")
                path = self.log_path(i)
                if path.exists() and " ready." in path.read_text(errors="replace"):
                    pending.discard(i)
            if time.monotonic() > deadline:
                raise CeleryWorkersError(f"workers {sorted(pending)} not ready in {self.start_timeout_s}s:\n"
                                         + "\n".join(self.tail(i) for i in pending))
            time.sleep(0.05)

    def start(self) -> CeleryWorkers:
        for i in range(self.count):
            self._spawn(i)
        self._wait_ready(list(range(self.count)))
        return self

    def alive(self, i: int) -> bool:
        p = self.procs[i]
        return p is not None and p.poll() is None

    def ensure_running(self) -> None:
        dead = [i for i in range(self.count) if not self.alive(i)]
        for i in dead:
            self._reap(i)
            self._spawn(i)
        if dead:
            self._wait_ready(dead)

    def kill(self, i: int, sig: int = signal.SIGKILL) -> None:
        p = self.procs[i]
        if p is None:
            return
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            pass
        if sig == signal.SIGKILL:
            p.wait(10)

    def _reap(self, i: int) -> None:
        p = self.procs[i]
        if p is not None:
            try:
                p.wait(0.1)
            except subprocess.TimeoutExpired:
                pass
        self.procs[i] = None

    def stop(self) -> None:
        for p in self.procs:
            if p is not None and p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 5.0
        for i, p in enumerate(self.procs):
            if p is None:
                continue
            try:
                p.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait(5)
            self.procs[i] = None

    def tail(self, i: int, lines: int = 40) -> str:
        path = self.log_path(i)
        if not path.exists():
            return f"(no log for worker {i})"
        return f"--- worker {i} log ---\n" + "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in sorted(self.log_dir.glob("*.log")))

    def close(self) -> None:
        self.stop()
        self._tmp.cleanup()

    def __enter__(self) -> CeleryWorkers:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

"""The launcher's processes (stdlib only): start one in its own process group, tell whether a
recorded one still runs (pid and kernel start time, so a reused pid is not taken for it), stop
them tier by tier; plus a free port and a Redis PING over a bare socket.

Used by ``local_cluster`` (also as a script: ``python3 deploy/local_cluster.py`` finds this file
beside it) and ``redis_server``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self


@dataclass(frozen=True)
class ProcInfo:
    """One started process: its pid (== its process-group id) and kernel start time."""

    name: str
    role: str  # "redis" | "worker" | "beat"
    pid: int
    start_ticks: int | None
    argv: list[str]
    log: str


# ---------------------------------------------------------------------------------------- processes


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks) from /proc, or None if the pid does not exist."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()  # the command name may contain spaces and ')'
    return fields[0], int(fields[19])


def _reap(pid: int) -> None:
    """Collect the exit status if ``pid`` is our child, so it does not linger as a zombie."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def is_alive(info: ProcInfo) -> bool:
    """True if the recorded process still runs (same pid AND same start time: not a reused pid)."""
    _reap(info.pid)
    if Path("/proc").is_dir():
        st = _proc_stat(info.pid)
        if st is None or st[0] in ("Z", "X"):
            return False
        return info.start_ticks is None or st[1] == info.start_ticks
    try:  # no /proc (macOS): best effort, trusts the pid
        os.kill(info.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _signal_group(info: ProcInfo, sig: int) -> None:
    # Each process leads its own group (start_new_session), so killpg also reaches pool children
    # and Redis' background save/rewrite child.
    try:
        os.killpg(info.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def spawn(name: str, role: str, argv: list[str], log: Path, env: Mapping[str, str]) -> ProcInfo:
    log.parent.mkdir(parents=True, exist_ok=True)
    if log.exists():  # keep one previous run's log, but readiness must only see this run's lines
        os.replace(log, log.with_name(log.name + ".prev"))
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT, env=dict(env), start_new_session=True
        )
    st = _proc_stat(proc.pid)
    return ProcInfo(name=name, role=role, pid=proc.pid, start_ticks=st[1] if st else None, argv=argv, log=str(log))


def stop_processes(procs: Sequence[ProcInfo], grace_s: float, out=sys.stderr) -> list[str]:
    """SIGTERM beat, then workers, then Redis (each tier waits up to ``grace_s``), SIGKILL leftovers.

    Returns the names of processes that needed SIGKILL."""
    killed: list[str] = []
    for tier in (("beat",), ("worker",), ("redis",)):
        group = [p for p in procs if p.role in tier and is_alive(p)]
        for p in group:
            _signal_group(p, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(is_alive(p) for p in group):
            time.sleep(0.05)
        for p in group:
            if is_alive(p):
                print(f"{p.name} (pid {p.pid}) still alive after {grace_s:g}s; sending SIGKILL", file=out)
                _signal_group(p, signal.SIGKILL)
                killed.append(p.name)
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline and any(is_alive(p) for p in group):
            time.sleep(0.05)
    return killed


# ------------------------------------------------------------------------------------------ network


def stop_child(proc: subprocess.Popen[bytes], *, kill: bool = False, grace_s: float = 5.0) -> None:
    """Stop a child process: SIGKILL if ``kill``, else SIGTERM and SIGKILL after ``grace_s``."""
    if kill:
        proc.kill()
    else:
        proc.terminate()
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)


class ChildServer:
    """What a test server wrapping one child process shares: ``running``, ``close()`` (stop, then
    drop the temporary directory) and the context manager. Subclasses set ``_proc`` and
    ``_tmp`` and define ``start()`` and ``stop()``."""

    _proc: subprocess.Popen[bytes] | None
    _tmp: tempfile.TemporaryDirectory[str]

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self, *, kill: bool = False) -> None:
        raise NotImplementedError

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def close(self) -> None:
        self.stop()
        self._tmp.cleanup()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS reports free right now (it may be taken later; the caller retries)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def redis_ping(host: str, port: int, timeout_s: float = 0.3) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False

"""Start a real, private ``redis-server`` for a test, on a free loopback port.

    with RedisServer() as srv:            # no persistence: --save '' --appendonly no
        client = redis.Redis.from_url(srv.url)
        ...
        srv.restart()                     # same port, same data dir (use aof=True to keep data)

Never uses the machine's shared Redis on 6379. Stops the server (SIGTERM, then SIGKILL) on exit.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from deploy.processes import ChildServer, free_port, redis_ping, stop_child

__all__ = ["RedisServer", "RedisServerError", "free_port"]


class RedisServerError(RuntimeError):
    pass


class RedisServer(ChildServer):
    """One redis-server subprocess. ``aof=True`` enables append-only persistence (fsync always)
    in a temp dir so ``restart()`` keeps data; ``extra_args`` are passed through verbatim."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        aof: bool = False,
        extra_args: tuple[str, ...] = (),
        binary: str = "redis-server",
        start_timeout_s: float = 10.0,
    ) -> None:
        exe = shutil.which(binary)
        if exe is None:
            raise RedisServerError(f"{binary!r} not found on PATH; install it (apt-get install redis-server)")
        self.binary = exe
        self.host = host
        self.port = port or free_port(host)
        self.aof = aof
        self.extra_args = extra_args
        self.start_timeout_s = start_timeout_s
        self._tmp = tempfile.TemporaryDirectory(prefix="irbench-redis-")
        self.data_dir = Path(self._tmp.name)
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    def _argv(self) -> list[str]:
        argv = [self.binary, "--port", str(self.port), "--bind", self.host, "--dir", str(self.data_dir), "--save", ""]
        if self.aof:
            argv += ["--appendonly", "yes", "--appendfsync", "always"]
        else:
            argv += ["--appendonly", "no"]
        return argv + ["--daemonize", "no", "--logfile", str(self.data_dir / "redis.log"), *self.extra_args]

    def _ping(self) -> bool:
        return redis_ping(self.host, self.port, timeout_s=0.2)

    def start(self) -> RedisServer:
        if self._proc is not None:
            raise RedisServerError("already running")
        self._proc = subprocess.Popen(self._argv(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                err = (self._proc.stderr.read() if self._proc.stderr else b"").decode(errors="replace")
                log = self.data_dir / "redis.log"
                self._proc = None
                raise RedisServerError(
                    f"redis-server exited on port {self.port}: {err.strip()} {log.read_text() if log.exists() else ''}"
                )
            if self._ping():
                return self
            time.sleep(0.02)
        self.stop()
        raise RedisServerError(f"redis-server did not answer PING on {self.host}:{self.port} in {self.start_timeout_s}s")

    def stop(self, *, kill: bool = False) -> None:
        """Stop the server (SIGKILL if ``kill``, else SIGTERM with a SIGKILL fallback)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        stop_child(proc, kill=kill)
        if proc.stderr:
            proc.stderr.close()

    def restart(self, *, kill: bool = False) -> None:
        """Stop and start again on the same port and data dir."""
        self.stop(kill=kill)
        self.start()

    def send_signal(self, sig: int) -> None:
        """Send ``sig`` to the server (SIGSTOP / SIGCONT: a stalled broker, not a closed one)."""
        if self._proc is None:
            raise RedisServerError("redis-server is not running")
        self._proc.send_signal(sig)

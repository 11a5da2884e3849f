"""Run the simulated endpoint: blocking (CLI), in a background thread (tests), or as a subprocess.

``serve`` blocks until interrupted. ``start_background`` runs uvicorn on a real loopback socket
in a daemon thread and returns once it accepts connections. ``start_subprocess`` runs
``python -m simulator.server`` in its own process (another core), reading back the bound port.
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import uvicorn

from simulator.app import SimApp
from simulator.config import SimConfig, load_sim_config
from simulator.process import stop_process
from storage.errors import ConfigError


def _uvicorn_config(app: SimApp, host: str, port: int, graceful_shutdown_s: float) -> uvicorn.Config:
    # Lean request path: no access log, warnings only; graceful shutdown bounded so a
    # hanging simulated request cannot hold up stop().
    return uvicorn.Config(
        app.app, host=host, port=port, log_level="warning", access_log=False, lifespan="off",
        timeout_graceful_shutdown=graceful_shutdown_s,  # type: ignore[arg-type]  # annotated int; asyncio.timeout takes a float
    )


def serve(config: SimConfig, host: str, port: int, *, ready_line: bool = False) -> None:
    """Serve ``config`` on ``host:port`` until interrupted (Ctrl-C / SIGTERM).

    With ``ready_line`` the bound port is printed as ``LISTENING <port>`` once listening (port 0
    picks a free one).
    """
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Accepted sockets inherit TCP_NODELAY; without it uvicorn's separate header/body writes
    # meet the client's delayed ACK and every response takes ~40 ms on loopback (measured).
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    server = uvicorn.Server(_uvicorn_config(SimApp(config), host, sock.getsockname()[1], 2.0))
    if ready_line:
        def announce() -> None:
            while not server.started and not server.should_exit:
                time.sleep(0.01)
            print(f"LISTENING {sock.getsockname()[1]}", flush=True)
        threading.Thread(target=announce, daemon=True).start()
    server.run(sockets=[sock])


@dataclass
class RunningSimulator:
    """A simulator serving in a daemon thread. Use as a context manager or call ``stop()``."""

    host: str
    port: int
    app: SimApp
    _server: uvicorn.Server = field(repr=False)
    _thread: threading.Thread = field(repr=False)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def stop(self, timeout_s: float = 10.0) -> None:
        self._server.should_exit = True
        self._thread.join(timeout_s)

    def __enter__(self) -> RunningSimulator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_background(
    config: SimConfig, host: str = "127.0.0.1", port: int = 0, *, startup_timeout_s: float = 10.0,
    graceful_shutdown_s: float = 1.0,
) -> RunningSimulator:
    """Start serving ``config`` in a daemon thread; returns when the socket accepts connections."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Accepted sockets inherit TCP_NODELAY; without it uvicorn's separate header/body writes
    # meet the client's delayed ACK and every response takes ~40 ms on loopback (measured).
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    bound = sock.getsockname()[1]
    app = SimApp(config)
    server = uvicorn.Server(_uvicorn_config(app, host, bound, graceful_shutdown_s))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True,
                              name=f"irbench-sim-{bound}")
    thread.start()
    deadline = time.monotonic() + startup_timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError(f"simulator did not start on {host}:{bound} within {startup_timeout_s} s")
        time.sleep(0.005)
    return RunningSimulator(host, bound, app, server, thread)


@dataclass
class SubprocessSimulator:
    """A simulator in its own process (``python -m simulator.server``)."""

    host: str
    port: int
    process: subprocess.Popen = field(repr=False)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def stop(self, timeout_s: float = 10.0) -> None:
        stop_process(self.process, timeout_s)

    def __enter__(self) -> SubprocessSimulator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_subprocess(config_path: str | Path, port: int = 0, host: str = "127.0.0.1",
                     *, startup_timeout_s: float = 20.0) -> SubprocessSimulator:
    """Run the simulator for the TOML at ``config_path`` in a child process; waits until it listens."""
    load_sim_config(config_path)  # fail fast, in this process, with a ConfigError
    proc = subprocess.Popen(
        [sys.executable, "-m", "simulator.server", "--config", str(config_path), "--host", host,
         "--port", str(port)],
        stdout=subprocess.PIPE, text=True,
    )
    result: list[str] = []
    reader = threading.Thread(target=lambda: result.append(proc.stdout.readline() if proc.stdout else ""),
                              daemon=True)
    reader.start()
    reader.join(startup_timeout_s)
    line = result[0].strip() if result else ""
    if not line.startswith("LISTENING "):
        proc.kill()
        proc.wait()
        raise RuntimeError(f"simulator subprocess did not start within {startup_timeout_s} s (said {line!r})")
    return SubprocessSimulator(host, int(line.split()[1]), proc)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m simulator.server", description="irbench simulated endpoint")
    parser.add_argument("--config", required=True, help="simulator TOML file")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port (printed as LISTENING <port>)")
    args = parser.parse_args(argv)
    try:
        cfg = load_sim_config(args.config)
    except ConfigError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    serve(cfg, args.host, args.port, ready_line=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A pre-loaded Python for the suite's processes: one fork per command instead of one start.

Starting ``irbench`` imports typer, pydantic, rich and structlog, and a campaign then imports
pyarrow, numpy, httpx and aiohttp; a ``celery worker`` imports Celery and kombu besides. That is
most of a CPU-second per process, and the suite starts hundreds of them on two cores. The zygote
imports all of that once, in a process of its own that starts no thread, and forks a child per
command. The child takes the working directory, environment, arguments, standard streams and
session that ``exec`` would give it and runs its module as ``python -m MODULE`` does
(``runpy``), so it exits, flushes and waits for its threads like a fresh interpreter. What it
cannot give is a fresh interpreter's start-up and memory: tests that time the start, read what a
command does while it loads, or measure its resident memory ``exec`` it.

Protocol, over a Unix socket: the client sends one JSON line ``{"module", "argv", "cwd", "env",
"new_session", "default_sigint"}`` with its stdin, stdout and stderr descriptors attached
(``SCM_RIGHTS``); the zygote forks a waiter, the waiter forks the command, writes ``{"pid": N}``
and, once the command ends, ``{"rc": N, "cpu_s": S}`` (a negative ``rc`` is the signal that
ended it, as ``Popen.returncode`` says; ``cpu_s`` is the command's CPU time, its waited-for
children's included).
"""

from __future__ import annotations

import gc
import json
import os
import signal
import socket
import sys
from dataclasses import dataclass

# What a campaign, an analysis, a report and a worker import; the child finds them loaded. Not the
# Celery app module: it reads the broker's address from the environment as it loads.
PRELOAD = (
    "orchestrator.cli.app", "numpy", "pyarrow", "pyarrow.parquet", "pyarrow.compute", "httpx",
    "aiohttp", "scipy.stats", "celery", "celery.bin.celery", "celery.worker", "redis",
    "orchestrator.campaign.plan", "storage.runs", "analysis.pipeline", "matplotlib.figure",
    "matplotlib.backends.backend_agg",
)


@dataclass(frozen=True)
class Command:
    """One command as the client asked for it: ``python -m module argv...`` in ``cwd`` with the
    whole ``env``, in a session of its own if ``new_session``, with Python's Ctrl-C handler if
    ``default_sigint`` (else with the zygote's, which a backgrounded test run ignores)."""

    module: str
    argv: list[str]
    cwd: str
    env: dict[str, str]
    new_session: bool = False
    default_sigint: bool = False


def _preload() -> None:
    import importlib

    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:  # an optional extra: the child imports it, or says why not, itself
            pass


def _reply(conn: socket.socket, **fields: float) -> None:
    conn.sendall((json.dumps(fields) + "\n").encode())


def _receive(conn: socket.socket) -> tuple[Command, list[int]]:
    msg, fds, _flags, _addr = socket.recv_fds(conn, 1 << 20, 3)
    while not msg.endswith(b"\n"):
        more = conn.recv(1 << 20)
        if not more:
            raise ConnectionError("the client hung up mid-request")
        msg += more
    return Command(**json.loads(msg)), list(fds)


def _become(cmd: Command, fds: list[int]) -> None:
    """In the command's process: what ``exec`` would have set up."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    if cmd.new_session:
        os.setsid()
    if cmd.default_sigint:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(cmd.cwd)
    os.environ.clear()
    os.environ.update(cmd.env)
    sys.argv = [cmd.module, *cmd.argv]


def _wait_and_report(conn: socket.socket, pid: int) -> None:
    _reply(conn, pid=pid)
    _pid, status, usage = os.wait4(pid, 0)
    _reply(conn, rc=os.waitstatus_to_exitcode(status), cpu_s=usage.ru_utime + usage.ru_stime)


def _fork_command(listener: socket.socket, conn: socket.socket, cmd: Command, fds: list[int]) -> bool:
    """Forks the waiter and, from it, the command; True in the command's process only."""
    sys.stdout.flush()
    sys.stderr.flush()
    if os.fork() != 0:
        return False
    listener.close()
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    pid = os.fork()
    if pid == 0:
        conn.close()
        _become(cmd, fds)
        return True
    for fd in fds:
        os.close(fd)
    try:
        _wait_and_report(conn, pid)
    finally:
        os._exit(0)


def serve(path: str) -> Command:
    """Answers requests on ``path`` until killed; returns only in a forked command's process."""
    _preload()
    gc.freeze()  # the preloaded heap stays out of the children's collections (and their pages shared)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # waiters are reaped by the kernel
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    print("ready", flush=True)
    while True:
        conn, _ = listener.accept()
        cmd, fds = _receive(conn)
        if _fork_command(listener, conn, cmd, fds):
            return cmd
        conn.close()
        for fd in fds:
            os.close(fd)


def _exit_status(exc: SystemExit) -> int:
    """The status the interpreter gives ``sys.exit(code)``."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


def run_command(cmd: Command) -> None:
    """The command's process: ``python -m MODULE``, then the interpreter's exit without its teardown.

    An exiting interpreter joins non-daemon threads, runs ``atexit`` and flushes the streams; it
    then frees every module, which in a process holding the zygote's imports costs more than the
    command. So this does the first three and leaves the rest to ``_exit``.
    """
    import atexit
    import runpy
    import threading
    import traceback

    # ``python -m`` runs a module that nothing has imported yet: the preloaded copy goes, so the
    # module runs once as ``__main__`` and a later import of it loads it afresh, as there
    sys.modules.pop(cmd.module, None)
    status = 0
    try:
        runpy.run_module(cmd.module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        status = _exit_status(exc)
    except KeyboardInterrupt:
        traceback.print_exc()
        status = -signal.SIGINT
    except BaseException:
        traceback.print_exc()
        status = 1
    threading._shutdown()  # type: ignore[attr-defined]  # what the interpreter's exit calls
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken pipe: the interpreter ignores it too
            pass
    if status == -signal.SIGINT:  # an uncaught Ctrl-C ends the process by the signal, as Python does
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(status & 0xFF)


if __name__ == "__main__":
    run_command(serve(sys.argv[1]))

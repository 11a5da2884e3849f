"""Processes forked from the suite's zygote (``tests.support.zygote``), with ``subprocess``'s API.

``spawn`` is ``subprocess.Popen([sys.executable, "-m", module, *argv], ...)`` and ``run`` is
``subprocess.run(..., capture_output=True, text=True)``: the same process boundary, streams,
environment, signals and exit status, without a second of imports per process. The zygote
starts on first use, one per test process, and is killed at its exit. ``IRBENCH_TEST_EXEC=1``
makes both ``exec`` instead, to rule the zygote out when a test misbehaves;
``IRBENCH_TEST_CPU_LOG=FILE`` appends each forked command's CPU seconds to FILE.
"""

from __future__ import annotations

import atexit
import functools
import io
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

REPO = Path(__file__).resolve().parents[2]
Stream = int | IO[Any] | None  # subprocess.PIPE / DEVNULL / STDOUT (stderr only), a file, or inherit


def exec_instead() -> bool:
    return os.environ.get("IRBENCH_TEST_EXEC") == "1"


class _Zygote:
    """The zygote process of this test process."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="irbench-zygote-")
        self.path = os.path.join(self.dir, "sock")
        pythonpath = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.support.zygote", self.path], cwd=REPO,
                                     env={**os.environ, "PYTHONPATH": pythonpath}, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        ready = self.proc.stdout.readline()
        assert ready.strip() == "ready", f"the test zygote did not start: {ready!r}"
        atexit.register(self.close)

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        os.rmdir(self.dir)

    def request(self, module: str, argv: Sequence[str], env: Mapping[str, str], cwd: str, fds: Sequence[int],
                new_session: bool, default_sigint: bool) -> socket.socket:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(self.path)
        line = json.dumps({"module": module, "argv": list(argv), "cwd": cwd, "env": dict(env),
                           "new_session": new_session, "default_sigint": default_sigint}) + "\n"
        socket.send_fds(conn, [line.encode()], list(fds))
        return conn


@functools.cache
def _zygote() -> _Zygote:
    return _Zygote()


class _Ends:
    """The three descriptors a child gets, and the parent's ends of the pipes among them."""

    def __init__(self, stdin: Stream, stdout: Stream, stderr: Stream) -> None:
        self.child: list[int] = []
        self.parent: list[int | None] = []
        self._owned: list[int] = []
        for i, spec in enumerate((stdin, stdout, stderr)):
            if spec == subprocess.STDOUT and i == 2:
                self.child.append(self.child[1])
                self.parent.append(None)
            elif spec == subprocess.PIPE:
                r, w = os.pipe()
                self.child.append(r if i == 0 else w)
                self.parent.append(w if i == 0 else r)
                self._owned.append(self.child[-1])
            elif spec == subprocess.DEVNULL:
                self.child.append(os.open(os.devnull, os.O_RDONLY if i == 0 else os.O_WRONLY))
                self.parent.append(None)
                self._owned.append(self.child[-1])
            else:
                self.child.append(i if spec is None else (spec if isinstance(spec, int) else spec.fileno()))
                self.parent.append(None)

    def close_child_ends(self) -> None:
        for fd in self._owned:
            os.close(fd)


class ForkedProcess:
    """What ``subprocess.Popen`` returns, for a process forked by the zygote (it is not our child:
    its exit status arrives over the zygote's socket)."""

    def __init__(self, module: str, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
                 cwd: str | os.PathLike[str] | None = None, stdin: Stream = None, stdout: Stream = None,
                 stderr: Stream = None, text: bool = False, start_new_session: bool = False,
                 default_sigint: bool = False) -> None:
        self.args = [sys.executable, "-m", module, *argv]
        self.returncode: int | None = None
        self.cpu_s: float | None = None
        ends = _Ends(stdin, stdout, stderr)
        where = os.fspath(cwd) if cwd is not None else os.getcwd()
        try:
            self._conn = _zygote().request(module, argv, dict(os.environ if env is None else env), where,
                                           ends.child, start_new_session, default_sigint)
        finally:
            ends.close_child_ends()
        self.stdin, self.stdout, self.stderr = (
            None if fd is None else io.open(fd, ("w" if i == 0 else "r") + ("" if text else "b"),
                                            encoding="utf-8" if text else None, buffering=-1 if text or i == 0 else 0)
            for i, fd in enumerate(ends.parent)
        )
        self._replies = self._conn.makefile("r")
        self.pid: int = json.loads(self._replies.readline())["pid"]
        self._done = threading.Event()
        threading.Thread(target=self._await_exit, daemon=True).start()

    def _await_exit(self) -> None:
        try:
            line = self._replies.readline()
            done = json.loads(line) if line else {"rc": -signal.SIGKILL, "cpu_s": 0.0}  # the zygote died
        finally:
            self._conn.close()
        self.cpu_s = done["cpu_s"]
        self.returncode = done["rc"]
        if log := os.environ.get("IRBENCH_TEST_CPU_LOG"):  # a profiling aid: each command's CPU time
            with open(log, "a") as fh:
                fh.write(f"{done['cpu_s']:.3f}\t{self.args[2]}\t{' '.join(self.args[3:4])}\n")
        self._done.set()

    def poll(self) -> int | None:
        return self.returncode if self._done.is_set() else None

    def wait(self, timeout: float | None = None) -> int:
        if not self._done.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if not self._done.is_set():  # once reaped, the pid may be another process's
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, input: Any = None, timeout: float | None = None) -> tuple[Any, Any]:
        if input is not None and self.stdin is not None:
            self.stdin.write(input)
        if self.stdin is not None:
            self.stdin.close()
        chunks: dict[int, list[Any]] = {1: [], 2: []}
        readers = [threading.Thread(target=lambda f=f, into=chunks[i]: into.append(f.read()), daemon=True)
                   for i, f in ((1, self.stdout), (2, self.stderr)) if f is not None]
        for t in readers:
            t.start()
        self.wait(timeout)
        for t in readers:
            t.join(timeout)
        empty = "" if isinstance(self.stdout or self.stderr, io.TextIOBase) else b""
        out = tuple(empty.join(chunks[i]) if f is not None else None
                    for i, f in ((1, self.stdout), (2, self.stderr)))
        return out[0], out[1]

    def __enter__(self) -> ForkedProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        for f in (self.stdin, self.stdout, self.stderr):
            if f is not None:
                f.close()
        self.wait()


def spawn(module: str, argv: Sequence[str], **popen: Any) -> ForkedProcess | subprocess.Popen[Any]:
    """``python -m module argv...`` as ``subprocess.Popen`` with ``popen``'s keywords would start it
    (``env``, ``cwd``, ``stdin``, ``stdout``, ``stderr``, ``text``, ``start_new_session``)."""
    if exec_instead():
        return subprocess.Popen([sys.executable, "-m", module, *argv], **popen)
    return ForkedProcess(module, argv, **popen)


def popen(argv: Sequence[str], **popen_kw: Any) -> ForkedProcess | subprocess.Popen[Any]:
    """A drop-in ``subprocess.Popen``: ``python -m MODULE ...``, bare or through
    ``tests.support.terminal.with_default_sigint``, is forked; any other command is exec'd."""
    from tests.support.terminal import unwrap_default_sigint

    inner, default_sigint = unwrap_default_sigint(argv)
    if exec_instead() or len(inner) < 3 or inner[0] != sys.executable or inner[1] != "-m":
        return subprocess.Popen(list(argv), **popen_kw)
    return ForkedProcess(inner[2], inner[3:], default_sigint=default_sigint, **popen_kw)


def run(module: str, argv: Sequence[str], *, env: Mapping[str, str] | None = None, timeout_s: float = 300,
        cwd: str | os.PathLike[str] | None = None, check: bool = False) -> subprocess.CompletedProcess:
    """``subprocess.run([sys.executable, "-m", module, *argv], capture_output=True, text=True)`` with
    an empty stdin; the child is killed past ``timeout_s`` (``TimeoutExpired``)."""
    proc = spawn(module, argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                 stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(30)
        raise
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    if check:
        done.check_returncode()
    return done

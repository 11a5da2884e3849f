"""Which process owns a loopback TCP client port: polled from /proc while a test runs, so a
request seen on the wire (by its client port) can be traced to the worker that sent it.

Linux only; a connection opened and closed between two polls stays unknown (``None``).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from types import TracebackType


def _socket_inodes(pid: int) -> set[str]:
    out: set[str] = set()
    try:
        for fd in os.scandir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(fd.path)
            except OSError:
                continue
            if target.startswith("socket:["):
                out.add(target[8:-1])
    except OSError:
        pass
    return out


def _local_ports_by_inode(pid: int) -> dict[str, int]:
    """inode -> local port of the IPv4 TCP sockets in ``pid``'s network namespace."""
    out: dict[str, int] = {}
    try:
        lines = Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return out
    for line in lines:
        cols = line.split()
        if len(cols) > 9:
            out[cols[9]] = int(cols[1].rsplit(":", 1)[1], 16)
    return out


class PortOwners:
    """Poll every ``interval_s`` which of ``pids`` holds each local TCP port; use as a context
    manager, then :meth:`owner` of a port (the last pid seen holding it)."""

    def __init__(self, pids: list[int], interval_s: float = 0.05) -> None:
        self._pids, self._interval_s = pids, interval_s
        self._owners: dict[int, int] = {}
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, name="port-owners", daemon=True)

    def poll(self) -> None:
        for pid in self._pids:
            inodes = _socket_inodes(pid)
            for inode, port in _local_ports_by_inode(pid).items():
                if inode in inodes:
                    self._owners[port] = pid

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.poll()

    def owner(self, port: int) -> int | None:
        return self._owners.get(port)

    def __enter__(self) -> PortOwners:
        self.poll()
        self._t.start()
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        self._t.join(5)
        self.poll()

"""Artificial CPU starvation for the benchmarks, and the load average it reaches.

    with cpu_hogs(12) as hogs, LoadSampler() as load:
        ...                      # the measured work, competing with 12 busy loops
    print(load.summary())        # load average (1 min) at start / min / max / end

The hogs are ``python -c 'while 1: pass'`` processes at nice 0 (the same priority as the
workers); they are stopped by pid on exit, whatever happened.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from types import TracebackType


@contextlib.contextmanager
def cpu_hogs(n: int) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``n`` busy-loop processes for the duration of the block (none if ``n`` <= 0)."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for _ in range(max(n, 0)):
            procs.append(subprocess.Popen([sys.executable, "-c", "while 1: pass"],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        yield procs
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait(10)


class LoadSampler:
    """Samples the 1-minute load average every ``every_s`` seconds in a daemon thread."""

    def __init__(self, every_s: float = 1.0) -> None:
        self.every_s = every_s
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, name="load-sampler", daemon=True)

    def _run(self) -> None:
        while True:
            self.samples.append(os.getloadavg()[0])
            if self._stop.wait(self.every_s):
                return

    def summary(self) -> str:
        s = self.samples or [os.getloadavg()[0]]
        return (f"load average (1 min): start {s[0]:.2f}, min {min(s):.2f}, mean {sum(s) / len(s):.2f}, "
                f"max {max(s):.2f}, end {s[-1]:.2f}; now {' '.join(f'{x:.2f}' for x in os.getloadavg())}")

    def __enter__(self) -> LoadSampler:
        self._t.start()
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        self._t.join(5)
        self.samples.append(os.getloadavg()[0])

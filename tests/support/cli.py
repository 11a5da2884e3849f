"""The ``irbench`` command line as a user runs it: a process of its own, wide output, and never a
traceback on stderr.

``run_cli`` and ``spawn_cli`` fork the command from the suite's pre-loaded zygote
(``tests.support.forked``): the same process boundary, streams, environment, signals and exit
status as ``exec``, without a CPU-second of imports per command. ``IRBENCH`` is the command to
``exec`` where a test needs a fresh interpreter (it times the start, or interrupts the load).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from tests.support import forked

IRBENCH = [sys.executable, "-m", "orchestrator.cli.app"]
MODULE = "orchestrator.cli.app"


def run_cli(args: Sequence[str], *, env: Mapping[str, str] | None = None, timeout_s: float = 300,
            cwd: str | os.PathLike[str] | None = None, check: bool = False) -> subprocess.CompletedProcess:
    """``irbench ARGS`` as ``subprocess.run([*IRBENCH, *args], capture_output=True, text=True)`` runs
    it: ``env`` is the whole environment (this process's by default), stdin is empty,
    ``TimeoutExpired`` past ``timeout_s``, ``CalledProcessError`` on a failure if ``check``."""
    return forked.run(MODULE, args, env=env, timeout_s=timeout_s, cwd=cwd, check=check)


def spawn_cli(args: Sequence[str], **popen: Any) -> forked.ForkedProcess | subprocess.Popen[Any]:
    """``irbench ARGS`` as ``subprocess.Popen([*IRBENCH, *args], **popen)`` starts it."""
    return forked.spawn(MODULE, args, **popen)


def run_irbench(*args: str, env: Mapping[str, str] | None = None, timeout_s: float = 300,
                cwd: str | os.PathLike[str] | None = None) -> subprocess.CompletedProcess:
    """``irbench ARGS`` with ``env`` over this process's environment and wide output; asserts no
    traceback."""
    out = run_cli(args, env={**os.environ, "COLUMNS": "250", **(env or {})}, timeout_s=timeout_s, cwd=cwd)
    assert "Traceback" not in out.stderr, out.stderr
    return out

"""The ``irbench`` command line as a user runs it: a subprocess of this Python, wide output, and
never a traceback on stderr."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping

IRBENCH = [sys.executable, "-m", "orchestrator.cli.app"]


def run_irbench(*args: str, env: Mapping[str, str] | None = None, timeout_s: float = 300) -> subprocess.CompletedProcess:
    """``irbench ARGS`` with ``env`` over this process's environment; asserts no traceback."""
    out = subprocess.run([*IRBENCH, *args], capture_output=True, text=True, timeout=timeout_s,
                         env={**os.environ, "COLUMNS": "250", **(env or {})})
    assert "Traceback" not in out.stderr, out.stderr
    return out

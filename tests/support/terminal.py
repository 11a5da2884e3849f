"""Start a command with the SIGINT disposition a terminal gives it, whatever the test runner has.

A shell without job control starts a background job (``make test > log &``, a CI runner's
script) with SIGINT ignored, and an ignored signal stays ignored across ``exec``: every process
such a pytest starts inherits it, and Python then leaves SIGINT ignored. A test that sends
SIGINT to stand for a terminal's Ctrl-C would see the command run on as if it never came
(``irbench run`` exiting 0 instead of 130, or not exiting at all while it waits for a worker).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

# exec keeps a SIG_DFL disposition, so the command starts as a terminal would start it; the
# pid stays the same, so the caller's Popen.send_signal reaches the command itself
_EXEC_WITH_DEFAULT_SIGINT = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])"
)


def with_default_sigint(argv: Sequence[str]) -> list[str]:
    """``argv`` (``argv[0]`` an absolute path, e.g. ``sys.executable``) run through a tiny
    launcher that resets SIGINT to its default before it execs the command."""
    return [sys.executable, "-c", _EXEC_WITH_DEFAULT_SIGINT, *argv]


def unwrap_default_sigint(argv: Sequence[str]) -> tuple[list[str], bool]:
    """The command ``with_default_sigint`` wraps, and whether ``argv`` was so wrapped."""
    if len(argv) > 3 and list(argv[:3]) == [sys.executable, "-c", _EXEC_WITH_DEFAULT_SIGINT]:
        return list(argv[3:]), True
    return list(argv), False

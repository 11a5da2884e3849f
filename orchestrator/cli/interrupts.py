"""How every way a Ctrl-C ends ``irbench`` is reported: exit 130 and one line saying what to do.

Standard library only: the console script (``orchestrator.cli.launch``) needs it before the CLI is
loaded, and ``orchestrator.cli.app`` after a command was interrupted.
"""

from __future__ import annotations

import sys
from typing import NoReturn

INTERRUPTED_EXIT_CODE = 130  # 128 + SIGINT, what a shell reports for a Ctrl-C'd command
INTERRUPTED_MESSAGE = "interrupted: the runs stored so far are kept; run the same command again to resume"


def interrupted() -> NoReturn:
    """Say what to do after a Ctrl-C and exit 130."""
    sys.stderr.write(INTERRUPTED_MESSAGE + "\n")
    sys.stderr.flush()
    sys.exit(INTERRUPTED_EXIT_CODE)

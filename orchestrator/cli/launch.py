"""The ``irbench`` console script: loads the command line inside a Ctrl-C guard.

Loading the CLI (typer, rich, pydantic, ...) takes a noticeable part of a second, several
seconds on a loaded machine; a Ctrl-C in that window must end like any other interrupted
command (exit 130 and one line saying what to do), not with an import traceback. So this module
imports nothing heavy, and the console script enters here rather than in ``orchestrator.cli.app``.
"""

from __future__ import annotations

from orchestrator.cli.interrupts import interrupted


def main() -> None:
    """Console-script entry point: ``orchestrator.cli.app.main`` once the CLI is loaded."""
    try:
        from orchestrator.cli.app import main as cli_main
    except KeyboardInterrupt:
        interrupted()
    cli_main()

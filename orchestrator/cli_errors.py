"""How every ``irbench`` command reports a user error: one line on stderr, exit code 2.

The message is printed verbatim (rich markup in it is escaped: a prompt's ``[conditionRef=X]`` is
text, not a style) and never wrapped, so it stays one line whatever the terminal width.
"""

from __future__ import annotations

from typing import NoReturn

import typer
from rich.console import Console
from rich.markup import escape

__all__ = ["fail"]


def fail(exc: BaseException | str) -> NoReturn:
    """Print ``error: <exc>`` as one line on stderr and exit with code 2 (no traceback)."""
    Console(stderr=True, soft_wrap=True).print(f"[bold red]error:[/] {escape(str(exc))}")
    raise typer.Exit(code=2) from None

"""How a user error reaches the terminal: one line per problem on stderr, exit code 2.

Every CLI verb ends its ``except IrbenchError`` with :func:`fail`; ``orchestrator.cli.app.main``
routes usage errors (bad option, missing file) and OS errors (disk full, permission denied)
through :func:`print_error` as well, so no user error ever shows a traceback. Lines are written
plainly (no Rich markup or wrapping): a message that holds ``[...]`` or is wider than the
terminal still comes out as exactly one line.
"""

from __future__ import annotations

import errno
import sys
from typing import NoReturn, TextIO

import typer

from workers.errors import ConfigError

USER_ERROR_EXIT_CODE = 2


def error_lines(exc: BaseException) -> list[str]:
    """One line per problem of ``exc`` (a ``ConfigError`` may carry several)."""
    if isinstance(exc, ConfigError) and len(exc.problems) >= 1 and str(exc) != exc.problems[0]:
        problems = exc.problems
    elif isinstance(exc, OSError) and not isinstance(exc, ConnectionError):
        problems = [os_error_text(exc)]
    else:
        problems = [str(exc) or type(exc).__name__]
    return [" ".join(p.split()) for p in problems]  # newlines inside a problem never split it


def os_error_text(exc: OSError) -> str:
    """A sentence for an OS error, naming the file and what to do (disk full above all)."""
    where = f" ({exc.filename})" if exc.filename else ""
    if exc.errno == errno.ENOSPC:
        return (f"no space left on the device{where}; free some space and run the same command again "
                "(stored runs are kept, the rest resume)")
    if exc.errno in (errno.EACCES, errno.EPERM):
        return f"permission denied{where}; check the owner and mode of the path"
    if exc.errno == errno.EROFS:
        return f"read-only file system{where}; point --data at a writable directory"
    return f"{exc.strerror or exc}{where}"


def print_error(exc: BaseException | str, stream: TextIO | None = None) -> None:
    """Write ``error: <problem>`` lines to ``stream`` (default stderr)."""
    stream = stream or sys.stderr
    lines = [" ".join(exc.split())] if isinstance(exc, str) else error_lines(exc)
    for line in lines:
        stream.write(f"error: {line}\n")
    stream.flush()


def fail(exc: BaseException | str) -> NoReturn:
    """Print ``exc`` as a user error and leave the command with exit code 2."""
    print_error(exc)
    raise typer.Exit(code=USER_ERROR_EXIT_CODE)

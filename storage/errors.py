"""The root of irbench's exception tree, and the errors every layer may raise.

``storage`` imports nothing of ours, so the root lives here, at the bottom of the dependency
graph, with the two errors any layer may raise: ``ConfigError`` (a spec, corpus, option or
simulator config is wrong) and ``StorageError``. Each layer adds its own branch below
``IrbenchError`` in its own module (``workers.errors``: providers, limiter, gate;
``analysis.errors``: ``AnalysisError``, ``ReportInputError``) and re-exports nothing it does not
own except these, so ``except IrbenchError`` catches everything irbench raises on purpose and the
CLI turns it into one line and exit code 2.
"""

from __future__ import annotations


class IrbenchError(Exception):
    """Root of every error irbench raises on purpose."""


class ConfigError(IrbenchError):
    """Bad configuration. ``problems`` lists one human-readable line per problem."""

    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        self.problems = problems or [message]
        super().__init__(message if problems is None else message + "\n" + "\n".join(f"  - {p}" for p in self.problems))


class StorageError(IrbenchError):
    """The dataset cannot be read or written.

    Messages name the file or partition involved and say what to do about it.
    """

"""The analysis branch of irbench's exception tree (the root is ``storage.errors.IrbenchError``).

    IrbenchError
    └── AnalysisError          an analysis function got input it cannot use (wrong shape, empty
        │                      panel, unknown option value); the message names the input and the fix
        └── ReportInputError   ``irbench report`` cannot read the analysis outputs it was given

``AnalysisError`` is also a ``ValueError`` (it is one: a wrong value), so numpy-style callers that
catch ``ValueError`` keep working. Reading the store raises ``storage.errors.StorageError``
(``pipeline.CorruptDataError``, ``pipeline.NoRunsError``). The CLI prints any ``IrbenchError``
as one line and exits with code 2.
"""

from __future__ import annotations

from storage.errors import IrbenchError

__all__ = ["AnalysisError", "ReportInputError"]


class AnalysisError(IrbenchError, ValueError):
    """Input an analysis function cannot use; the message says which and what to pass instead."""


class ReportInputError(AnalysisError):
    """The report's input (an analysis output directory) is missing or unreadable."""

"""Which models may still be called in this campaign.

A 410 retires a model for the campaign; N consecutive auth/not-found/client errors disable it.
Once closed, the remaining runs are recorded as ``cancelled`` with the reason, never attempted.
``MemoryGate`` serves the local executor; the distributed executor has a Redis twin.
"""

from __future__ import annotations

import threading
from typing import Protocol

from storage.records import Outcome
from workers.retry import DISABLING


class ModelGate(Protocol):
    def closed_reason(self, model: str) -> str | None:
        """None while the model may be called; otherwise why not (e.g. ``retired``)."""
        ...

    def observe(self, model: str, outcome: Outcome, detail: str | None = None) -> None:
        """Feed one attempt's outcome; may close the gate for the model."""
        ...

    def cancel_all(self, reason: str) -> None:
        """Close every model (campaign cancelled)."""
        ...

    def close(self, model: str, reason: str) -> None:
        """Close one model before dispatch (e.g. an availability check found it retired)."""
        ...


class MemoryGate:
    """Thread-safe in-process gate."""

    def __init__(self, disable_after_consecutive: int = 3) -> None:
        self._limit = disable_after_consecutive
        self._lock = threading.Lock()
        self._closed: dict[str, str] = {}
        self._streak: dict[str, int] = {}
        self._all: str | None = None

    def closed_reason(self, model: str) -> str | None:
        with self._lock:
            return self._all or self._closed.get(model)

    def observe(self, model: str, outcome: Outcome, detail: str | None = None) -> None:
        with self._lock:
            if outcome is Outcome.RETIRED:
                self._closed.setdefault(model, "retired" + (f": {detail}" if detail else ""))
            elif outcome in DISABLING:
                self._streak[model] = self._streak.get(model, 0) + 1
                if self._streak[model] >= self._limit:
                    self._closed.setdefault(
                        model,
                        f"disabled after {self._streak[model]} consecutive {outcome.value} outcomes"
                        + (f" (last: {detail})" if detail else ""),
                    )
            else:
                self._streak[model] = 0

    def cancel_all(self, reason: str) -> None:
        with self._lock:
            self._all = reason

    def close(self, model: str, reason: str) -> None:
        with self._lock:
            self._closed.setdefault(model, reason)

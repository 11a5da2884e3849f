"""Fixtures the orchestrator tests share by name."""

from tests.support.distributed import live  # noqa: F401  (a fixture: pytest finds it here by name)

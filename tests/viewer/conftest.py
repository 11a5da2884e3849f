"""Fixtures the viewer tests share by name."""

from tests.analysis.test_report_browser import chromium  # noqa: F401  (a fixture: pytest finds it here by name)

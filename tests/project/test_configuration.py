"""The configuration table is current and names every ``IRBENCH_*`` variable the packages read."""

from __future__ import annotations

import re
from pathlib import Path

from orchestrator.cli.config_table import DOC, configuration_markdown, knobs

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("storage", "workers", "orchestrator", "analysis", "simulator", "viewer", "deploy")
_NAME = re.compile(r"\bIRBENCH_[A-Z][A-Z0-9_]*[A-Z0-9]\b")


def _names_in_code() -> set[str]:
    names: set[str] = set()
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            names |= set(_NAME.findall(path.read_text(encoding="utf-8")))
    return names


def test_the_committed_table_is_the_generated_one() -> None:
    assert DOC.read_text(encoding="utf-8") == configuration_markdown(), (
        "docs/configuration.md is stale: run python -m orchestrator.cli.config_table")


def test_every_variable_the_code_names_is_in_the_table() -> None:
    documented = {k.env for k in knobs()}
    missing = sorted(_names_in_code() - documented)
    assert not missing, f"IRBENCH_* variables read but not in docs/configuration.md: {missing}"


def test_defaults_in_the_table_are_the_objects_defaults() -> None:
    from orchestrator.distributed.options import CeleryOptions
    from workers.celery.runtime import WorkerSettings

    rows = {(k.env, k.read_by): k.default for k in knobs()}
    assert any(env == "IRBENCH_RUN_SLOTS" and d == str(WorkerSettings(redis_url="").run_slots) for (env, _), d in rows.items())
    assert any(env == "IRBENCH_MAX_OUTSTANDING" and d == str(CeleryOptions().max_outstanding) for (env, _), d in rows.items())

"""What every command shares: the console, logging set-up, the broker URL rule and stderr warnings."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from workers.errors import ConfigError
from workers.logs import Redactor, configure_logging

if TYPE_CHECKING:
    from orchestrator.campaign.prepared import PreparedCampaign

__all__ = ["broker_url", "console", "no_store_note", "report_corpus", "setup_logging", "warn"]

console = Console(width=None if sys.stdout.isatty() else 120)


def broker_url(cli_value: str | None, spec_value: str | None) -> str:
    """``--broker`` (or IRBENCH_BROKER_URL), else the campaign's ``executor.broker``."""
    url = cli_value or spec_value
    if not url:
        raise ConfigError("no broker given: pass --broker redis://HOST:6379/0 or set IRBENCH_BROKER_URL")
    return url


def setup_logging(log_file: Path | None, verbose: bool) -> Redactor:
    """JSON logs appended to ``log_file``, else warnings (or debug with ``verbose``) on stderr."""
    level = "DEBUG" if verbose else "INFO"
    if log_file is not None:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        stream = open(log_file, "a", encoding="utf-8")
        return configure_logging(json=True, level=level, stream=stream)
    return configure_logging(level="DEBUG" if verbose else "WARNING")


def warn(text: str) -> None:
    sys.stderr.write(f"warning: {text}\n")
    sys.stderr.flush()


def report_corpus(prepared: PreparedCampaign) -> None:
    """One line: the prompts loaded, duplicates collapsed and files rejected (each with why)."""
    corpus = prepared.corpus
    console.print(f"corpus: {len(corpus.prompts)} prompts", end="")
    if corpus.duplicates:
        console.print(f", {len(corpus.duplicates)} duplicates collapsed", end="")
    if corpus.rejected:
        console.print(f", {len(corpus.rejected)} rejected:", end="")
        for path, reason in corpus.rejected:
            console.print(f"\n  - {path}: {reason}", end="")
    console.print()


def no_store_note(data: Path) -> str | None:
    """The warning for a ``--data`` that holds no store (no ``runs/`` folder), else None."""
    if (Path(data) / "runs").is_dir():
        return None
    return (f"{data} holds no irbench store (no runs/ folder): nothing has run with this --data yet, "
            "or it points at another directory")

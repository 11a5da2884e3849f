"""Typer command functions for the probe and availability commands (registered by ``cli.py``).

Register with::

    from orchestrator.cli.ops import availability_app, probe_command
    app.command("probe")(probe_command)
    app.add_typer(availability_app, name="availability")   # check, history

Each function parses options, calls the library (``orchestrator.jobs.probe``,
``orchestrator.jobs.availability``) and prints; an ``IrbenchError`` becomes a red message and exit
code 2.
"""

from __future__ import annotations

import datetime as dt
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from orchestrator.cli.data_option import store_root
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from orchestrator.cli.user_errors import fail as _fail
from workers.errors import ConfigError, IrbenchError
from workers.logs import configure_logging

if TYPE_CHECKING:
    from orchestrator.local.executor import ExecutionSummary


def _console() -> Console:
    return Console(width=None if sys.stdout.isatty() else 160)


def _endpoint_urls(values: list[str] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for v in values or []:
        name, sep, url = v.partition("=")
        if not sep or not name or not url:
            raise ConfigError(f"--endpoint-url {v!r}: write NAME=URL, e.g. sim=http://127.0.0.1:8766")
        out[name] = url
    return out


def _probe_executor(executor: str, broker: str | None) -> Callable[..., tuple[int, ExecutionSummary]] | None:
    """None (the local executor) or the Celery executor on ``broker``; ConfigError otherwise."""
    if executor == "local":
        return None
    if executor != "celery":
        raise ConfigError(f"--executor {executor!r}: use 'local' or 'celery'")
    if not broker:
        raise ConfigError("--executor celery needs --broker redis://HOST:PORT/DB")
    from orchestrator.distributed.executor import celery_execute

    return celery_execute(broker)  # workers read keys from their own environment


def probe_command(
    probe: Annotated[Path, typer.Argument(help="Probe TOML (a campaign with >= 2 budgets).", exists=True, dir_okay=False)],
    data: Annotated[Path, typer.Option("--data", parser=store_root, envvar="IRBENCH_DATA", help="Dataset root (runs/, probes/).")] = Path("data"),
    reference_timeout: Annotated[float, typer.Option(help="Total timeout (s) whose effect is attributed, e.g. the study's 60 s.")] = 60.0,
    works_min_share: Annotated[float, typer.Option(help="Share of usable runs for a model × budget cell to count as working.")] = 0.5,
    endpoint_url: Annotated[Optional[list[str]], typer.Option(help="Override an endpoint's base_url: NAME=URL (repeatable).")] = None,
    executor: Annotated[str, typer.Option(help="'local' (in-process) or 'celery'.")] = "local",
    broker: Annotated[Optional[str], typer.Option(help="Redis broker URL for --executor celery.")] = None,
    out: Annotated[Optional[Path], typer.Option(help="Where to write probes.parquet (default DATA/probes.parquet).")] = None,
    progress: Annotated[bool, typer.Option(help="Show a progress bar per model.")] = True,
    retry_failed: Annotated[bool, typer.Option(help="Also execute again runs whose latest execution failed "
                                               "transiently (see `irbench run --help`).")] = False,
    outcomes: Annotated[Optional[str], typer.Option(help="With --retry-failed: classes to retry (default 'transient').")] = None,
) -> None:
    """Run a failure-attribution probe: models × token budgets × runs, then attribute each model
    (budget_bound, timeout_bound, works_under_both, fails_under_both) with the evidence.

    Example: irbench probe examples/probe.toml --data data/ --reference-timeout 60
    (examples/probe.toml calls the probe simulator: irbench simulate --config examples/sim_probe.toml --port 8766)
    """
    from analysis.tables.probes import ProbeSettings
    from orchestrator.campaign.retry import rerun_outcomes
    from orchestrator.jobs.probe import ProbeExecution, attribution_lines, probe_rich_table, run_probe
    from orchestrator.local.progress import ModelBars

    console = _console()
    configure_logging(level="WARNING")  # per-run log lines (INFO) stay off stdout, which holds the results
    try:
        retry_outcomes = rerun_outcomes(retry_failed, outcomes)
        settings = ProbeSettings(reference_timeout_s=reference_timeout, works_min_share=works_min_share)
        execute = _probe_executor(executor, broker)
        with ModelBars(enabled=progress and executor == "local") as bars:
            execution = ProbeExecution(execute=execute, on_progress=bars.update, retry_outcomes=retry_outcomes)
            result = run_probe(probe, data, settings=settings, base_urls=_endpoint_urls(endpoint_url),
                               execution=execution, out_path=out)
    except (IrbenchError, ValueError) as exc:
        _fail(exc)
        return
    console.print(probe_rich_table(result.table, f"probe {result.campaign}"))
    for line in attribution_lines(result.table):
        console.print(f"  {line}")
    console.print(
        f"{result.planned} runs planned, {result.skipped} already stored, {result.executed} executed now; "
        f"summary in {result.parquet_path} and {Path(data) / 'probes'}/"
    )
    unreachable = _unreachable_share(result.table)
    if unreachable:
        Console(stderr=True).print(
            f"[yellow]{unreachable} of the latest runs never reached the endpoint[/] (connect errors or connect "
            "timeouts): start it (for examples/probe.toml: irbench simulate --config examples/sim_probe.toml "
            "--port 8766 &) and run the same command with --retry-failed", soft_wrap=True)


def _unreachable_share(table) -> str | None:
    """'n/N' runs whose latest execution never reached the endpoint, or None when none."""
    total = unreachable = 0
    for outcomes, runs in zip(table.column("outcomes").to_pylist(), table.column("runs").to_pylist()):
        total += runs
        for part in (outcomes or "").split(","):
            name, _, n = part.strip().partition("=")
            if name in ("connect_error", "timeout_connect") and n.isdigit():
                unreachable += int(n)
    return f"{unreachable}/{total}" if unreachable else None


def _split(values: list[str] | None) -> list[str]:
    return [m.strip() for v in values or [] for m in v.split(",") if m.strip()]


def availability_check_command(
    models: Annotated[Optional[list[str]], typer.Option("--models", help="Model ids (comma-separated or repeated).")] = None,
    campaign: Annotated[Optional[Path], typer.Option(help="Check every model of this campaign TOML.", exists=True, dir_okay=False)] = None,
    base_url: Annotated[Optional[str], typer.Option(help="Endpoint of --models (without --campaign).")] = None,
    wire_format: Annotated[str, typer.Option(help="'openai' or 'ollama' (with --base-url).")] = "openai",
    api_key_env: Annotated[Optional[str], typer.Option(help="NAME of the environment variable holding the key.")] = None,
    data: Annotated[Path, typer.Option("--data", parser=store_root, envvar="IRBENCH_DATA", help="Dataset root (availability/ is written here).")] = Path("data"),
    max_tokens: Annotated[int, typer.Option(help="Token cap of the minimal call.")] = 5,
    timeout: Annotated[float, typer.Option(help="Total timeout (s) of each minimal call.")] = 60.0,
) -> None:
    """List each endpoint's models and make one minimal call per model; store the statuses
    (available, retired, not_listed, not_found, auth_error, timeout, error) by check date.

    Example: irbench availability check --campaign examples/demo.toml --data data/
    Example: irbench availability check --models gpt-oss:20b,gemma3:12b --base-url https://host/v1 --api-key-env HOST_KEY
    """
    from orchestrator.jobs.availability import CheckSettings, CheckTarget, check_availability, targets_from_campaign
    from orchestrator.campaign.spec import load_campaign
    from storage.availability import AvailabilityStore
    from workers.runtask import EndpointRef, TimeoutPolicy

    console = _console()
    try:
        names = _split(models)
        if campaign is not None:
            targets = targets_from_campaign(load_campaign(campaign))
            if names:
                targets = [CheckTarget(t.endpoint, tuple(m for m in t.models if m in names)) for t in targets]
                unknown = sorted(set(names) - {m for t in targets for m in t.models})
                if unknown:
                    raise ConfigError(f"--models {unknown} are not models of {campaign.name}")
        elif names and base_url:
            targets = [CheckTarget(EndpointRef(name="cli", base_url=base_url, wire_format=wire_format,  # type: ignore[arg-type]
                                               api_key_env=api_key_env), tuple(names))]
        else:
            raise ConfigError("say what to check: --campaign FILE, or --models A,B with --base-url URL")
        settings = CheckSettings(
            max_tokens=max_tokens,
            timeouts=TimeoutPolicy(connect_timeout_s=min(10.0, timeout), read_timeout_s=timeout, total_timeout_s=timeout),
        )
        records = check_availability(targets, AvailabilityStore(data), settings=settings)
    except IrbenchError as exc:
        _fail(exc)
        return
    table = Table(title=f"availability check {records[0].checked_at:%Y-%m-%d %H:%M} UTC" if records else "availability check")
    for col in ("endpoint", "model", "status", "listed", "HTTP", "latency ms", "retired on", "reference"):
        table.add_column(col)
    table.add_column("message", overflow="fold")
    for r in records:
        table.add_row(r.endpoint, r.model, r.status.value, "?" if r.listed is None else ("yes" if r.listed else "no"),
                      str(r.http_status or "–"), f"{r.latency_ms:.0f}" if r.latency_ms is not None else "–",
                      r.retired_on or "", r.reference or "", escape(r.message or ""))
    console.print(table)
    for r in records:  # what the endpoint said, for every model that did not answer
        if r.status.value != "available" and r.message:
            console.print(f"{r.model} ({r.status.value}): {r.message}", markup=False, highlight=False)
    console.print(f"stored in {Path(data) / 'availability'}/")


def _d(value: dt.date | None) -> str:
    return value.isoformat() if value else "–"


def availability_history_command(
    data: Annotated[Path, typer.Option("--data", parser=store_root, envvar="IRBENCH_DATA", help="Dataset root holding availability/.")] = Path("data"),
    models: Annotated[Optional[list[str]], typer.Option("--models", help="Only these models (comma-separated or repeated).")] = None,
) -> None:
    """Print each model's availability timeline: first seen, last available, first missing,
    retirement date and reference, latest status.

    Example: irbench availability history --data data/ --models gemma3:12b
    """
    from storage.availability import AvailabilityStore

    console = _console()
    try:
        names = _split(models)
        lines = AvailabilityStore(data).timelines(names or None)
    except IrbenchError as exc:
        _fail(exc)
        return
    if not lines and names and AvailabilityStore(data).timelines():
        known = ", ".join(t.model for t in AvailabilityStore(data).timelines())
        console.print(f"--models {', '.join(names)} matched no checked model in {Path(data) / 'availability'}/ "
                      f"(checked: {known})", soft_wrap=True)
        return
    if not lines:
        console.print(f"no availability checks in {Path(data) / 'availability'}/ (run `irbench availability check` "
                      "or `irbench import-artifact`)")
        return
    table = Table(title="model availability history (UTC check dates)")
    for col in ("model", "checks", "first seen", "last available", "first missing", "retired on", "reference",
                "latest"):
        table.add_column(col)
    for t in lines:
        table.add_row(t.model, str(t.checks), _d(t.first_seen), _d(t.last_available), _d(t.first_missing),
                      t.retired_on or "", t.reference or "", f"{t.latest_status.value} ({_d(t.latest_check)})")
    console.print(table)


availability_app = typer.Typer(help="Re-check which models can still be measured, and show their history.",
                               no_args_is_help=True)
availability_app.command("check")(availability_check_command)
availability_app.command("history")(availability_history_command)

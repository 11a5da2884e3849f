"""The ``irbench`` command line: a thin shell that parses options and calls library functions."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import click
import typer
from rich.console import Console

from orchestrator.campaign.limits import DEFAULT_MAX_PLANNED_RUNS
from orchestrator.cli.distributed import (
    ClaimTtlOpt,
    LeaseTtlOpt,
    MaxFailuresOpt,
    ReconcileOpt,
    RunsPerMessageOpt,
    SpoolAgeOpt,
    RunSlotsOpt,
    CpuPolicyOpt,
    SpoolRowsOpt,
    VisibilityOpt,
    celery_options,
    worker_settings,
)
from orchestrator.cli.interrupts import INTERRUPTED_EXIT_CODE, interrupted
from orchestrator.cli.user_errors import USER_ERROR_EXIT_CODE, fail, print_error
from workers.celery import DEFAULT_THREADS
from workers.errors import ConfigError, IrbenchError
from workers.logs import Redactor, configure_logging

app = typer.Typer(
    name="irbench",
    help="Reproducibility audits of LLM-inferred prompt structure: run crossed campaigns, keep every raw "
    "response in Parquet, and analyse how stable the answers and the rankings are.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console(width=None if sys.stdout.isatty() else 120)

DataOpt = Annotated[
    Path, typer.Option("--data", envvar="IRBENCH_DATA", help="Dataset root (runs are stored under DATA/runs/; or IRBENCH_DATA).")
]
BrokerWaitOpt = Annotated[
    float,
    typer.Option("--broker-wait-s", envvar="IRBENCH_BROKER_WAIT_S", min=0,
                 help="How long to wait for Redis to answer before giving up (a countdown shows on stderr)."),
]
MaxRunsOpt = Annotated[
    int,
    typer.Option("--max-planned-runs", envvar="IRBENCH_MAX_PLANNED_RUNS", min=1,
                 help="Refuse a campaign that plans more runs than this (a typo in `runs` must not hang planning)."),
]
BrokerOpt = Annotated[
    Optional[str],
    typer.Option("--broker", envvar="IRBENCH_BROKER_URL", help="Redis URL of the Celery broker (or IRBENCH_BROKER_URL)."),
]


def _broker_url(cli_value: str | None, spec_value: str | None) -> str:
    url = cli_value or spec_value
    if not url:
        raise ConfigError("no broker given: pass --broker redis://HOST:6379/0 or set IRBENCH_BROKER_URL")
    return url


def _examples_dir() -> Path:
    return Path(__file__).resolve().parents[2] / "examples"


def _setup_logging(log_file: Path | None, verbose: bool) -> Redactor:
    level = "DEBUG" if verbose else "INFO"
    if log_file is not None:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        stream = open(log_file, "a", encoding="utf-8")
        return configure_logging(json=True, level=level, stream=stream)
    return configure_logging(level="DEBUG" if verbose else "WARNING")


@app.command()
def run(
    campaign: Annotated[
        Optional[Path], typer.Argument(help="Campaign TOML file (or describe one with --model/--base-url/--prompts).",
                                       exists=True, dir_okay=False)
    ] = None,
    data: DataOpt = Path("data"),
    executor: Annotated[
        Optional[str], typer.Option(help="'local' (in-process) or 'celery'; default: the campaign's executor.kind.")
    ] = None,
    broker: BrokerOpt = None,
    analyze: Annotated[
        bool, typer.Option(help="With --executor celery: enqueue the analysis when every run is stored.")
    ] = True,
    progress: Annotated[bool, typer.Option(help="Show a progress bar per model.")] = True,
    log_file: Annotated[Optional[Path], typer.Option(help="Write JSON logs here instead of stderr.")] = None,
    verbose: bool = False,
    model: Annotated[Optional[str], typer.Option(help="Ad-hoc run (no TOML): the model id to call.")] = None,
    base_url: Annotated[Optional[str], typer.Option(help="Ad-hoc run: the endpoint, e.g. http://127.0.0.1:8765.")] = None,
    wire_format: Annotated[str, typer.Option(help="Ad-hoc run: 'openai' or 'ollama'.")] = "openai",
    api_key_env: Annotated[Optional[str], typer.Option(help="Ad-hoc run: NAME of the variable holding the key (.env is read).")] = None,
    prompts: Annotated[Optional[Path], typer.Option(help="Ad-hoc run: folder of prompt files.")] = None,
    runs: Annotated[int, typer.Option(help="Ad-hoc run: runs per prompt.")] = 1,
    max_tokens: Annotated[Optional[int], typer.Option(help="Ad-hoc run: token cap (default: none).")] = None,
    temperature: Annotated[float, typer.Option(help="Ad-hoc run: sampling temperature.")] = 0.0,
    name: Annotated[Optional[str], typer.Option(help="Ad-hoc run: campaign name (default: derived from the flags).")] = None,
    retry_failed: Annotated[bool, typer.Option(help="Also execute again the runs whose latest execution failed "
                                               "in one of --outcomes (earlier executions stay stored).")] = False,
    outcomes: Annotated[Optional[str], typer.Option(help="With --retry-failed: classes to retry, comma-separated "
                                                    "(default 'transient': rate_limited, server_error, connect_error, "
                                                    "timeouts, protocol_error, cancelled).")] = None,
    claim_ttl_s: ClaimTtlOpt = None,
    reconcile_interval_s: ReconcileOpt = None,
    max_task_failures: MaxFailuresOpt = None,
    max_planned_runs: MaxRunsOpt = DEFAULT_MAX_PLANNED_RUNS,
    broker_wait_s: BrokerWaitOpt = 10.0,
    runs_per_message: RunsPerMessageOpt = None,
    visibility_timeout_s: VisibilityOpt = None,
) -> None:
    """Run (or resume) a campaign: only runs without a stored record are executed.

    With --retry-failed, runs whose latest execution ended in a transient failure run again.

    Example: irbench run examples/demo.toml --data data/
    Example: irbench run examples/demo.toml --data data/ --retry-failed --outcomes rate_limited,timeouts
    Example: irbench run --model sim-steady --base-url http://127.0.0.1:8765 --prompts examples/prompts --runs 3 --data data/
    (an ad-hoc run writes its campaign file to DATA/campaigns/; the same command again resumes it)
    """
    from orchestrator.campaign.prepared import prepare, resolve_secrets
    from orchestrator.local.campaign import run_campaign_local
    from orchestrator.local.progress import ModelBars
    from orchestrator.campaign.spec import load_campaign
    from storage.runs import RunStore

    from orchestrator.campaign.adhoc import campaign_file_for
    from orchestrator.campaign.retry import parse_outcomes, retryable

    redactor = _setup_logging(log_file, verbose)
    try:
        if outcomes is not None and not retry_failed:
            raise ConfigError("--outcomes only goes with --retry-failed")
        retry_outcomes = parse_outcomes(outcomes) if retry_failed else frozenset()
        campaign = campaign_file_for(campaign, data, model=model, base_url=base_url, wire_format=wire_format,
                                     api_key_env=api_key_env, prompts=prompts, runs=runs, max_tokens=max_tokens,
                                     temperature=temperature, name=name)
        spec = load_campaign(campaign)
        kind = executor or spec.executor.kind
        if kind not in ("local", "celery"):
            raise ConfigError(f"--executor {kind!r}: use 'local' or 'celery'")
        prepared = prepare(spec, max_planned_runs=max_planned_runs, source=campaign.name)
        store = RunStore(data)
        _report_corpus(prepared)
        again = retryable(prepared, store, retry_outcomes) if retry_outcomes else None
        if kind == "celery":
            from orchestrator.distributed.executor import run_campaign_celery

            url = _broker_url(broker, spec.executor.broker)
            options = celery_options(analyze, claim_ttl_s, reconcile_interval_s, max_task_failures, runs_per_message,
                                     visibility_timeout_s)
            watch = _start_worker_watch(url, data, options.queue, broker_wait_s)
            done_before = len(store.completed_run_ids(spec.name) & {t.run_id for t in prepared.tasks})
            try:
                with ModelBars(enabled=progress) as bars:
                    summary = run_campaign_celery(
                        prepared,
                        store,
                        url,
                        on_progress=bars.update,
                        options=options,
                        on_analysis=lambda job: console.print(f"analysis enqueued; outputs will land in {job.out_dir}"),
                        retry_outcomes=retry_outcomes,
                    )
            finally:
                watch.stop()
            skipped = done_before - (again.total if again else 0)
        else:
            secrets = resolve_secrets(spec)
            for value in secrets.values():
                redactor.add_secret(value)
            with ModelBars(enabled=progress) as bars:
                skipped, summary = run_campaign_local(prepared, store, secrets, on_progress=bars.update,
                                                      retry_outcomes=retry_outcomes)
    except IrbenchError as exc:
        fail(exc)
        return
    retried = f", {again.total} retried (latest execution: {again.describe()})" if again and again.total else ""
    console.print(
        f"campaign [bold]{spec.name}[/]: {len(prepared.tasks)} runs planned, {skipped} already stored{retried}, "
        f"{summary.executed} executed now{' (interrupted)' if summary.interrupted else ''}; data in {data}/runs/"
    )
    if summary.interrupted:
        raise typer.Exit(code=INTERRUPTED_EXIT_CODE)  # main() says what to do


def _start_worker_watch(url: str, data: Path, queue: str, wait_s: float):
    """Redis reachable, no worker on another store, then a watch that warns on stderr when no
    worker consumes ``queue`` (after ``IRBENCH_NO_WORKER_WARN_S``, default 10 s)."""
    from orchestrator.distributed.worker_checks import WorkerWatch, celery_preflight

    client, store_id = celery_preflight(url, data, queue, wait_s=wait_s, stream=sys.stderr)
    warn_after_s = float(os.environ.get("IRBENCH_NO_WORKER_WARN_S", "10"))
    return WorkerWatch(client, url, data, store_id, queue, warn=_warn, warn_after_s=warn_after_s).start()


def _warn(text: str) -> None:
    sys.stderr.write(f"warning: {text}\n")
    sys.stderr.flush()


def _report_corpus(prepared) -> None:
    corpus = prepared.corpus
    console.print(f"corpus: {len(corpus.prompts)} prompts", end="")
    if corpus.duplicates:
        console.print(f", {len(corpus.duplicates)} duplicates collapsed", end="")
    if corpus.rejected:
        console.print(f", {len(corpus.rejected)} rejected:", end="")
        for path, reason in corpus.rejected:
            console.print(f"\n  - {path}: {reason}", end="")
    console.print()


@app.command()
def status(
    campaign: Annotated[Path, typer.Argument(help="Campaign TOML file.", exists=True, dir_okay=False)],
    data: DataOpt = Path("data"),
    broker: BrokerOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object (planned, stored, executions, "
                                          "attempts, outcomes per model and in total) and nothing else.")] = False,
    max_planned_runs: MaxRunsOpt = DEFAULT_MAX_PLANNED_RUNS,
    broker_wait_s: BrokerWaitOpt = 10.0,
    skip_corrupt: Annotated[
        bool, typer.Option("--skip-corrupt", help="Count without unreadable Parquet files (named on stderr).")
    ] = False,
) -> None:
    """Show planned vs stored runs per model and outcome (plus live Redis state with --broker).

    Works from any machine that sees the dataset. Example: irbench status examples/demo.toml --data data/
    """
    from rich.table import Table

    if as_json:
        from orchestrator.cli.status_report import print_status_json

        print_status_json(campaign, data, max_planned_runs=max_planned_runs, skip_corrupt=skip_corrupt)
        return

    from orchestrator.campaign.status import campaign_status

    from orchestrator.campaign.prepared import prepare
    from orchestrator.campaign.spec import load_campaign
    from storage.runs import RunStore

    _setup_logging(None, False)
    try:
        prepared = prepare(load_campaign(campaign), max_planned_runs=max_planned_runs, source=campaign.name)
        st = campaign_status(prepared, RunStore(data), skip_corrupt=skip_corrupt)
        live = None
        if broker:
            from orchestrator.distributed.executor import campaign_status_celery
            from orchestrator.distributed.worker_checks import wait_with_countdown

            wait_with_countdown(broker, broker_wait_s, sys.stderr)
            live = campaign_status_celery(prepared, RunStore(data), broker, skip_corrupt=skip_corrupt)
    except IrbenchError as exc:
        fail(exc)
        return
    for path in st.skipped_files:
        _warn(f"skipped unreadable file {path}")
    table = Table(title=f"campaign {prepared.spec.name}: {st.stored}/{st.planned} runs stored")
    for col in ("model", "planned", "stored", "outcomes"):
        table.add_column(col)
    for model, planned in st.planned_by_model.items():
        outcomes = st.stored_by_model.get(model, {})
        table.add_row(
            model,
            str(planned),
            str(sum(outcomes.values())),
            ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())) or "-",
        )
    console.print(table)
    _print_retryable(prepared, RunStore(data), campaign, data, skip_corrupt)
    if live is not None:
        from orchestrator.cli.rates import model_rates, rates_table

        remaining = {m: n - sum(st.stored_by_model.get(m, {}).values()) for m, n in st.planned_by_model.items()}
        rates = model_rates(RunStore(data), prepared.spec.name, remaining)
        console.print(rates_table(rates, {m: p.in_flight for m, p in live.progress.items()}))
        console.print(f"outstanding (dispatched, not done): {live.outstanding}")
        if live.cancel_reason:
            console.print(f"cancelled: {live.cancel_reason}")
        for model, reason in live.closed_models.items():
            console.print(f"closed model {model}: {reason}")


def _print_retryable(prepared, store, campaign: Path, data: Path, skip_corrupt: bool) -> None:
    from orchestrator.campaign.retry import retry_command, retryable

    again = retryable(prepared, store, skip_corrupt=skip_corrupt)
    if again.total:
        console.print(f"{again.total} runs retryable (latest execution {again.describe()}): "
                      f"{retry_command(campaign, data)}", soft_wrap=True)


@app.command()
def resume(
    campaign: Annotated[Path, typer.Argument(help="Campaign TOML file.", exists=True, dir_okay=False)],
    data: DataOpt = Path("data"),
    executor: Annotated[Optional[str], typer.Option(help="'local' or 'celery' (default: the campaign's).")] = None,
    broker: BrokerOpt = None,
    progress: Annotated[bool, typer.Option(help="Show a progress bar per model.")] = True,
    max_planned_runs: MaxRunsOpt = DEFAULT_MAX_PLANNED_RUNS,
) -> None:
    """Pick up exactly the runs without a stored outcome (the same as running the campaign again).

    Example: irbench resume examples/demo.toml --data data/ --executor celery --broker redis://127.0.0.1:6379/0
    """
    run(
        campaign=campaign, data=data, executor=executor, broker=broker, analyze=True, progress=progress,
        log_file=None, verbose=False, claim_ttl_s=None, reconcile_interval_s=None, max_task_failures=None,
        max_planned_runs=max_planned_runs, broker_wait_s=10.0, runs_per_message=None, visibility_timeout_s=None,
    )


@app.command()
def cancel(
    campaign: Annotated[Path, typer.Argument(help="Campaign TOML file.", exists=True, dir_okay=False)],
    broker: BrokerOpt = None,
    reason: Annotated[str, typer.Option(help="Recorded as each cancelled run's cancel_reason.")] = "cancelled by user",
) -> None:
    """Stop a distributed campaign: no further dispatch; remaining runs are recorded as cancelled.

    Example: irbench cancel examples/demo.toml --broker redis://127.0.0.1:6379/0
    """
    from orchestrator.distributed.executor import cancel_campaign
    from orchestrator.campaign.spec import load_campaign
    from orchestrator.distributed.worker_checks import wait_with_countdown

    _setup_logging(None, False)
    try:
        spec = load_campaign(campaign)
        url = _broker_url(broker, spec.executor.broker)
        wait_with_countdown(url, float(os.environ.get("IRBENCH_BROKER_WAIT_S", "10")), sys.stderr)
        cancel_campaign(spec.name, url, reason=reason)
    except IrbenchError as exc:
        fail(exc)
        return
    console.print(f"campaign {spec.name}: cancelled ({reason}); workers record the remaining runs as cancelled")


@app.command()
def worker(
    broker: BrokerOpt = None,
    data: DataOpt = Path("data"),
    concurrency: Annotated[int, typer.Option(help="Threads: broker messages in work at once in this worker "
                                             "process (its concurrent calls are --run-slots, 64 by default).")] = DEFAULT_THREADS,
    queues: Annotated[str, typer.Option(help="Comma-separated queues to consume.")] = "irbench",
    loglevel: Annotated[str, typer.Option(help="Celery log level.")] = "INFO",
    claim_ttl_s: ClaimTtlOpt = None,
    lease_ttl_s: LeaseTtlOpt = None,
    spool_max_rows: SpoolRowsOpt = None,
    spool_max_age_s: SpoolAgeOpt = None,
    visibility_timeout_s: VisibilityOpt = None,
    run_slots: RunSlotsOpt = None,
    cpu_policy: CpuPolicyOpt = None,
) -> None:
    """Start a Celery worker that executes runs (wraps `celery worker -P threads`).

    API keys are read from this machine's environment, by the variable names the campaign gives.
    Example: irbench worker --broker redis://127.0.0.1:6379/0 --data /shared/irbench-data --concurrency 8
    """
    from orchestrator.distributed.worker_app import run_worker

    try:
        url = _broker_url(broker, None)
        settings = worker_settings(url, claim_ttl_s=claim_ttl_s, lease_ttl_s=lease_ttl_s,
                                   spool_max_rows=spool_max_rows, spool_max_age_s=spool_max_age_s,
                                   visibility_timeout_s=visibility_timeout_s, run_slots=run_slots,
                                   cpu_policy=cpu_policy)
    except IrbenchError as exc:
        fail(exc)
        return
    run_worker(url, concurrency=concurrency, queues=tuple(q for q in queues.split(",") if q),
               data_dir=str(data.resolve()), loglevel=loglevel, settings=settings)


@app.command()
def compact(
    data: DataOpt = Path("data"),
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Also one row per date partition.")] = False,
) -> None:
    """Merge the small Parquet files of every date partition into one, deduplicated by run_id.

    Example: irbench compact --data data/
    """
    from orchestrator.cli.summary_tables import compaction_tables
    from storage.runs import RunStore

    _setup_logging(None, False)
    for part in compaction_tables(RunStore(data).compact(), verbose=verbose):
        console.print(part)


@app.command()
def simulate(
    config: Annotated[Path, typer.Option("--config", help="Simulator TOML.", exists=True, dir_okay=False)],
    port: Annotated[int, typer.Option(help="TCP port on 127.0.0.1.")] = 8765,
    host: Annotated[str, typer.Option(help="Interface to bind.")] = "127.0.0.1",
) -> None:
    """Serve simulated models over the OpenAI (/v1/chat/completions) and Ollama (/api/chat) wire formats.

    Example: irbench simulate --config examples/sim.toml --port 8765
    """
    from simulator.config import load_sim_config
    from simulator.server import serve

    try:
        cfg = load_sim_config(config)
    except (IrbenchError, ValueError) as exc:
        fail(exc)
        return
    console.print(f"simulating {len(cfg.models)} models on http://{host}:{port} (Ctrl-C to stop)")
    serve(cfg, host, port)


@app.command()
def demo(
    workdir: Annotated[Path, typer.Option(help="Where data, analysis outputs and logs go.")] = Path("irbench-demo"),
    examples: Annotated[Path, typer.Option(help="Folder with demo.toml, sim.toml and prompts/.")] = _examples_dir(),
    progress: Annotated[bool, typer.Option(help="Show a progress bar per model.")] = True,
) -> None:
    """Start the simulator, run the demo campaign in-process, analyse it and print the table.

    Needs no services and no network. Example: irbench demo --workdir irbench-demo
    """
    from orchestrator.cli.demo import run_demo

    _setup_logging(workdir / "irbench.log", False)
    try:
        run_demo(workdir, examples, console, progress=progress)
    except IrbenchError as exc:
        fail(exc)


def _register_more_commands() -> None:
    """Verbs whose bodies live in their own modules (one module per area)."""
    from orchestrator.cli.audit import analyze_command, import_artifact_command
    from orchestrator.cli.ops import availability_app, probe_command
    from orchestrator.cli.real import demo_real_command
    from orchestrator.cli.report import report_command
    from orchestrator.cli.view import view_command

    app.command("analyze")(analyze_command)
    app.command("import-artifact")(import_artifact_command)
    app.command("report")(report_command)
    app.command("probe")(probe_command)
    app.add_typer(availability_app, name="availability")
    app.command("view")(view_command)
    app.command("demo-real")(demo_real_command)


_register_more_commands()


# typer >= 0.20 carries its own click; older ones raise click's exceptions
_USAGE_ERRORS = tuple(
    t for t in (getattr(getattr(typer, "exceptions", None), "TyperException", None), click.ClickException) if t
)


def main() -> None:
    """Console-script entry point."""
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    try:
        from orchestrator.cli.envfile import load_env_file

        load_env_file(Path.cwd() / ".env")
        configure_logging(level="WARNING")  # stderr; commands that log more configure their own
        code = app(standalone_mode=False)
    except (KeyboardInterrupt, click.exceptions.Abort, typer.Abort):
        code = INTERRUPTED_EXIT_CODE
    except _USAGE_ERRORS as exc:  # a bad option or argument: one line, no usage box
        message = exc.format_message()
        if not message:  # `irbench` alone: the help is the answer
            exc.show()
            sys.exit(exc.exit_code)
        print_error(f"{message} (see irbench --help)")
        sys.exit(USER_ERROR_EXIT_CODE)
    except OSError as exc:  # disk full, permission denied, ...: what to do, not a traceback
        print_error(exc)
        sys.exit(USER_ERROR_EXIT_CODE)
    if code == INTERRUPTED_EXIT_CODE:
        # one message for every way Ctrl-C ends a command: typer turns a KeyboardInterrupt raised
        # inside a command (e.g. while the store is read, before any run) into a silent Exit(130)
        interrupted()
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()

"""The ``irbench`` command line: a thin shell that parses options and calls library functions."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import click
import typer

from orchestrator.campaign.limits import DEFAULT_MAX_PLANNED_RUNS
from orchestrator.cli.distributed import (
    ClaimTtlOpt,
    LeaseTtlOpt,
    MaxFailuresOpt,
    ReconcileOpt,
    RunsPerMessageOpt,
    SpoolAgeOpt,
    MemoryBudgetOpt,
    RunSlotsOpt,
    CpuPolicyOpt,
    SpoolRowsOpt,
    VisibilityOpt,
    worker_settings,
)
from orchestrator.campaign.adhoc import AdhocFlags
from orchestrator.campaign.waves import WaveRequest
from orchestrator.cli.data_option import DataOpt, worker_data_dir
from orchestrator.cli.run_command import CeleryFlags, RunRequest, run_request
from orchestrator.cli.shell import broker_url, console, setup_logging
from orchestrator.cli.interrupts import INTERRUPTED_EXIT_CODE, interrupted
from orchestrator.cli.user_errors import USER_ERROR_EXIT_CODE, fail, print_error
from workers.celery import DEFAULT_THREADS
from workers.errors import IrbenchError
from workers.logs import configure_logging

app = typer.Typer(
    name="irbench",
    help="Reproducibility audits of LLM-inferred prompt structure: run crossed campaigns, keep every raw "
    "response in Parquet, and analyse how stable the answers and the rankings are.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

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

NewWaveOpt = Annotated[bool, typer.Option("--new-wave", help="Measure every planned run again as the campaign's "
                                          "next wave (the earlier waves stay stored).")]
WaveLabelOpt = Annotated[Optional[str], typer.Option(help="With --new-wave: a note naming the wave "
                                                     "(e.g. 'after the provider update').")]


def _examples_dir() -> Path:
    return Path(__file__).resolve().parents[2] / "examples"


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
    wire_format: Annotated[Optional[str], typer.Option(help="Ad-hoc run: 'openai' or 'ollama' (default 'openai').")] = None,
    api_key_env: Annotated[Optional[str], typer.Option(help="Ad-hoc run: NAME of the variable holding the key (.env is read).")] = None,
    prompts: Annotated[Optional[Path], typer.Option(help="Ad-hoc run: folder of prompt files.")] = None,
    runs: Annotated[Optional[int], typer.Option(help="Ad-hoc run: runs per prompt (default 1).")] = None,
    max_tokens: Annotated[Optional[int], typer.Option(help="Ad-hoc run: token cap (default: none).")] = None,
    temperature: Annotated[Optional[float], typer.Option(help="Ad-hoc run: sampling temperature (default 0.0).")] = None,
    name: Annotated[Optional[str], typer.Option(help="Ad-hoc run: campaign name (default: derived from the flags).")] = None,
    retry_failed: Annotated[bool, typer.Option(help="Also execute again the runs whose latest execution failed "
                                               "in one of --outcomes (earlier executions stay stored).")] = False,
    outcomes: Annotated[Optional[str], typer.Option(help="With --retry-failed: classes to retry, comma-separated "
                                                    "(default 'transient': rate_limited, server_error, connect_error, "
                                                    "timeouts, protocol_error, cancelled, worker_died).")] = None,
    claim_ttl_s: ClaimTtlOpt = None,
    reconcile_interval_s: ReconcileOpt = None,
    max_task_failures: MaxFailuresOpt = None,
    max_planned_runs: MaxRunsOpt = DEFAULT_MAX_PLANNED_RUNS,
    broker_wait_s: BrokerWaitOpt = 10.0,
    runs_per_message: RunsPerMessageOpt = None,
    visibility_timeout_s: VisibilityOpt = None,
    new_wave: NewWaveOpt = False,
    wave_label: WaveLabelOpt = None,
) -> None:
    """Run (or resume) a campaign: only runs without a stored record are executed.

    With --retry-failed, runs whose latest execution ended in a transient failure run again.
    With --new-wave, every run is measured again as the next wave; without it, the latest wave resumes.

    Example: irbench run examples/demo.toml --data data/
    Example: irbench run examples/demo.toml --data data/ --new-wave --wave-label "one month later"
    Example: irbench run --model sim-steady --base-url http://127.0.0.1:8765 --prompts examples/prompts --runs 3 --data data/
    (an ad-hoc run writes its campaign file to DATA/campaigns/; the same command again resumes it)
    """
    run_request(RunRequest(
        campaign=campaign, data=data, executor=executor, broker=broker, progress=progress, log_file=log_file,
        verbose=verbose, retry_failed=retry_failed, outcomes=outcomes, max_planned_runs=max_planned_runs,
        wave=WaveRequest(new=new_wave, label=wave_label),
        adhoc=AdhocFlags(model=model, base_url=base_url, wire_format=wire_format, api_key_env=api_key_env,
                         prompts=prompts, runs=runs, max_tokens=max_tokens, temperature=temperature, name=name),
        celery=CeleryFlags(analyze=analyze, claim_ttl_s=claim_ttl_s, reconcile_interval_s=reconcile_interval_s,
                           max_task_failures=max_task_failures, runs_per_message=runs_per_message,
                           visibility_timeout_s=visibility_timeout_s, broker_wait_s=broker_wait_s),
    ))


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
    from orchestrator.cli.status_command import StatusRequest, show_status

    show_status(StatusRequest(campaign=campaign, data=data, broker=broker, as_json=as_json,
                              max_planned_runs=max_planned_runs, broker_wait_s=broker_wait_s, skip_corrupt=skip_corrupt))


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
    run_request(RunRequest(campaign=campaign, data=data, executor=executor, broker=broker, progress=progress,
                           max_planned_runs=max_planned_runs))


@app.command()
def cancel(
    campaign: Annotated[Path, typer.Argument(help="Campaign TOML file.", exists=True, dir_okay=False)],
    broker: BrokerOpt = None,
    reason: Annotated[str, typer.Option(help="Recorded as each cancelled run's cancel_reason.")] = "cancelled by user",
    broker_wait_s: BrokerWaitOpt = 10.0,
) -> None:
    """Stop a distributed campaign: no further dispatch; remaining runs are recorded as cancelled.

    Example: irbench cancel examples/demo.toml --broker redis://127.0.0.1:6379/0
    """
    from orchestrator.distributed.executor import cancel_campaign
    from orchestrator.campaign.spec import load_campaign
    from orchestrator.distributed.worker_checks import wait_with_countdown

    setup_logging(None, False)
    try:
        spec = load_campaign(campaign)
        url = broker_url(broker, spec.executor.broker)
        wait_with_countdown(url, broker_wait_s, sys.stderr)
        cancel_campaign(spec.name, url, reason=reason)
    except IrbenchError as exc:
        fail(exc)
        return
    console.print(f"campaign {spec.name}: cancelled ({reason}); workers record the remaining runs as cancelled")


@app.command()
def worker(
    broker: BrokerOpt = None,
    data: Annotated[str, typer.Option("--data", envvar="IRBENCH_DATA", help="Dataset root: a directory, or "
                                      "s3://BUCKET/PREFIX (the spool stays local: --spool-dir).")] = "data",
    spool_dir: Annotated[Optional[Path], typer.Option("--spool-dir", envvar="IRBENCH_SPOOL_DIR", help="With an "
                         "s3:// store: the local directory of this worker's spool and of files not yet uploaded "
                         "(default: one per store under ~/.local/state/irbench/spool).")] = None,
    concurrency: Annotated[int, typer.Option(help="Threads: broker messages in work at once in this worker "
                                             "process (its concurrent calls are what --memory-budget holds).")] = DEFAULT_THREADS,
    queues: Annotated[str, typer.Option(help="Comma-separated queues to consume.")] = "irbench",
    loglevel: Annotated[str, typer.Option(help="Celery log level.")] = "INFO",
    claim_ttl_s: ClaimTtlOpt = None,
    lease_ttl_s: LeaseTtlOpt = None,
    spool_max_rows: SpoolRowsOpt = None,
    spool_max_age_s: SpoolAgeOpt = None,
    visibility_timeout_s: VisibilityOpt = None,
    run_slots: RunSlotsOpt = None,
    memory_budget: MemoryBudgetOpt = None,
    cpu_policy: CpuPolicyOpt = None,
) -> None:
    """Start a Celery worker that executes runs (wraps `celery worker -P threads`).

    API keys are read from this machine's environment, by the variable names the campaign gives.
    Example: irbench worker --broker redis://127.0.0.1:6379/0 --data /shared/irbench-data --concurrency 8
    """
    from orchestrator.distributed.worker_app import run_worker
    from workers.celery.app import WorkerCommand

    try:
        url = broker_url(broker, None)
        settings = worker_settings(url, claim_ttl_s=claim_ttl_s, lease_ttl_s=lease_ttl_s,
                                   spool_max_rows=spool_max_rows, spool_max_age_s=spool_max_age_s,
                                   visibility_timeout_s=visibility_timeout_s, run_slots=run_slots,
                                   memory_budget_mib=memory_budget, cpu_policy=cpu_policy,
                                   spool_dir=str(spool_dir) if spool_dir else None)
        data_dir = worker_data_dir(data)
    except IrbenchError as exc:
        fail(exc)
        return
    command = WorkerCommand(concurrency=concurrency, queues=tuple(q for q in queues.split(",") if q), loglevel=loglevel)
    run_worker(url, command=command, data_dir=data_dir, settings=settings)


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

    setup_logging(None, False)
    for part in compaction_tables(RunStore(data).compact(), verbose=verbose):
        console.print(part)


@app.command()
def simulate(
    config: Annotated[Path, typer.Option("--config", help="Simulator TOML.", exists=True, dir_okay=False)],
    port: Annotated[int, typer.Option(min=1, max=65535, help="TCP port on 127.0.0.1.")] = 8765,
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

    setup_logging(workdir / "irbench.log", False)
    try:
        run_demo(workdir, examples, console, progress=progress)
    except IrbenchError as exc:
        fail(exc)


def _register_more_commands() -> None:
    """Verbs whose bodies live in their own modules (one module per area)."""
    from orchestrator.cli.audit import analyze_command, import_artifact_command
    from orchestrator.cli.ops import availability_app, probe_command
    from orchestrator.cli.schedule_command import schedule_command
    from orchestrator.cli.waves_command import waves_command
    from orchestrator.cli.plan_command import plan_command
    from orchestrator.cli.real import demo_real_command
    from orchestrator.cli.report import report_command
    from orchestrator.cli.view import view_command

    app.command("analyze")(analyze_command)
    app.command("import-artifact")(import_artifact_command)
    app.command("report")(report_command)
    app.command("plan")(plan_command)
    app.command("probe")(probe_command)
    app.add_typer(availability_app, name="availability")
    app.command("view")(view_command)
    app.command("schedule")(schedule_command)
    app.command("waves")(waves_command)
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

"""``irbench run``'s work: load (or write) the campaign, execute it on the chosen executor, print
the one-line summary. The typer command in ``app`` only gathers its flags into a ``RunRequest``."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from orchestrator.campaign.adhoc import AdhocFlags
from orchestrator.campaign.waves import WaveRequest
from orchestrator.cli.data_option import bucket_of, store_url
from orchestrator.cli.interrupts import INTERRUPTED_EXIT_CODE
from orchestrator.cli.shell import broker_url, console, report_corpus, setup_logging, warn
from orchestrator.cli.user_errors import fail
from workers.errors import ConfigError, IrbenchError
from workers.logs import Redactor

if TYPE_CHECKING:
    from orchestrator.campaign.prepared import PreparedCampaign
    from orchestrator.campaign.retry import Retryable
    from orchestrator.distributed.worker_checks import WorkerWatch
    from orchestrator.local.executor import ExecutionSummary
    from storage.records import Outcome
    from storage.runs import RunStore

__all__ = ["CeleryFlags", "RunRequest", "run_request"]


@dataclass(frozen=True)
class CeleryFlags:
    """``--executor celery`` knobs as given (None = the environment's, else the default)."""

    analyze: bool = True
    claim_ttl_s: float | None = None
    reconcile_interval_s: float | None = None
    max_task_failures: int | None = None
    runs_per_message: int | None = None
    visibility_timeout_s: float | None = None
    broker_wait_s: float = 10.0


@dataclass(frozen=True)
class RunRequest:
    """Everything ``irbench run`` was asked: the campaign (a file, or ``adhoc`` flags), where its
    data goes, the executor and its knobs, and what to retry."""

    campaign: Path | None
    data: Path
    adhoc: AdhocFlags = AdhocFlags()
    celery: CeleryFlags = CeleryFlags()
    executor: str | None = None
    broker: str | None = None
    progress: bool = True
    log_file: Path | None = None
    verbose: bool = False
    retry_failed: bool = False
    outcomes: str | None = None
    max_planned_runs: int | None = None
    wave: WaveRequest = WaveRequest()


@dataclass(frozen=True)
class _Ran:
    prepared: PreparedCampaign
    skipped: int
    summary: ExecutionSummary
    again: Retryable | None


def run_request(req: RunRequest) -> None:
    """Execute ``req``; exits 2 on a user error (one line), 130 when interrupted."""
    from orchestrator.campaign.adhoc import campaign_file_for
    from orchestrator.campaign.limits import DEFAULT_MAX_PLANNED_RUNS
    from orchestrator.campaign.retry import rerun_outcomes, retryable
    from orchestrator.campaign.spec import load_campaign
    from orchestrator.campaign.waves import prepare_wave, start_new_wave
    from storage.runs import RunStore

    redactor = setup_logging(req.log_file, req.verbose)
    try:
        req.wave.check_flags(req.retry_failed)
        retry_outcomes = rerun_outcomes(req.retry_failed, req.outcomes)
        chosen = campaign_file_for(req.campaign, req.data, req.adhoc)
        campaign = chosen.path
        if chosen.changes:
            warn(f"this ad-hoc run changes campaign {campaign.stem} ({'; '.join(chosen.changes)}); "
                 f"{campaign} now says so")
        spec = load_campaign(campaign)
        kind = req.executor or spec.executor.kind
        if kind not in ("local", "celery"):
            raise ConfigError(f"--executor {kind!r}: use 'local' or 'celery'")
        bound = req.max_planned_runs or DEFAULT_MAX_PLANNED_RUNS
        prepared = prepare_wave(spec, req.data, max_planned_runs=bound, source=campaign.name)  # the latest wave
        store = RunStore(req.data)
        if req.wave.new:
            wave = start_new_wave(prepared, store, req.wave.label)
            prepared = prepare_wave(spec, req.data, max_planned_runs=bound, source=campaign.name, wave=wave)
        report_corpus(prepared)
        again = retryable(prepared, store, retry_outcomes)
        if kind == "celery":
            skipped, summary = _run_celery(req, prepared, store, retry_outcomes)
            skipped -= again.total
        else:
            skipped, summary = _run_local(req, prepared, store, retry_outcomes, redactor)
    except IrbenchError as exc:
        fail(exc)
    _print_summary(req, _Ran(prepared, skipped, summary, again))
    _exit_on_spend_cap(prepared, store)
    _exit_on_failed_runs(prepared, store)


def _run_local(req: RunRequest, prepared: PreparedCampaign, store: RunStore, retry_outcomes: frozenset[Outcome],
               redactor: Redactor) -> tuple[int, ExecutionSummary]:
    from orchestrator.campaign.prepared import resolve_secrets
    from orchestrator.local.campaign import run_campaign_local
    from orchestrator.local.progress import ModelBars

    secrets = resolve_secrets(prepared.spec)
    for value in secrets.values():
        redactor.add_secret(value)
    with ModelBars(enabled=req.progress) as bars:
        return run_campaign_local(prepared, store, secrets, on_progress=bars.update, retry_outcomes=retry_outcomes,
                                  on_wait=warn)


def _run_celery(req: RunRequest, prepared: PreparedCampaign, store: RunStore, retry_outcomes: frozenset[Outcome]
                ) -> tuple[int, ExecutionSummary]:
    """Dispatch to the workers and follow them; returns (runs stored before, summary)."""
    from orchestrator.cli.distributed import celery_options
    from orchestrator.distributed.executor import CeleryRun, run_campaign_celery
    from orchestrator.local.progress import ModelBars
    from workers.state.broker_watch import BrokerWatch, broker_warn_after_s

    flags = req.celery
    url = broker_url(req.broker, prepared.spec.executor.broker)
    options = celery_options(flags.analyze, flags.claim_ttl_s, flags.reconcile_interval_s, flags.max_task_failures,
                             flags.runs_per_message, flags.visibility_timeout_s)
    watch = _start_worker_watch(url, req.data, options.queue, flags.broker_wait_s)
    broker = BrokerWatch(url, warn, warn_after_s=broker_warn_after_s()).start()  # a stalled broker is said
    from orchestrator.campaign.plan_state import stored_bitmap

    done_before = stored_bitmap(prepared.plan, store).count()
    try:
        with ModelBars(enabled=req.progress) as bars:
            run_as = CeleryRun(
                options=options, retry_outcomes=retry_outcomes, on_progress=bars.update, bucket=bucket_of(req.data),
                on_analysis=lambda job: console.print(f"analysis enqueued; outputs will land in {job.out_dir}"))
            summary = run_campaign_celery(prepared, store, url, run_as)
    finally:
        broker.stop()
        watch.stop()
    return done_before, summary


def _start_worker_watch(url: str, data: Path, queue: str, wait_s: float) -> WorkerWatch:
    """Redis reachable, no worker on another store, then a watch that warns on stderr when no
    worker consumes ``queue`` (after ``IRBENCH_NO_WORKER_WARN_S``, default 10 s)."""
    from orchestrator.distributed.worker_checks import WorkerWatch, celery_preflight

    session = bucket_of(data)
    client, store_id = celery_preflight(url, data, queue, wait_s=wait_s, stream=sys.stderr,
                                        store_url=session.url if session else None)
    warn_after_s = float(os.environ.get("IRBENCH_NO_WORKER_WARN_S", "10"))
    return WorkerWatch(client, url, data, store_id, queue, warn=warn, warn_after_s=warn_after_s).start()


def _print_summary(req: RunRequest, ran: _Ran) -> None:
    again, summary = ran.again, ran.summary
    retried = f", {again.total} retried (latest execution: {again.describe()})" if again and again.total else ""
    wave = ran.prepared.wave.number
    console.print(
        f"campaign [bold]{ran.prepared.spec.name}[/]{f' wave {wave}' if wave > 1 else ''}: "
        f"{len(ran.prepared.tasks)} runs planned, {ran.skipped} already "
        f"stored{retried}, {_executed(summary)}{' (interrupted)' if summary.interrupted else ''}; "
        f"data in {store_url(req.data) if bucket_of(req.data) else req.data}/runs/"
    )
    if summary.interrupted:
        raise typer.Exit(code=INTERRUPTED_EXIT_CODE)  # main() says what to do


def _executed(summary: ExecutionSummary) -> str:
    """``N executed now (ok A, failed F)`` for the runs this command executed, then ``, O executed
    by another orchestrator`` for those another ``irbench run`` on the same campaign executed
    meanwhile, then ``, C cancelled`` for the runs stored during this command that never reached
    the endpoint: a cancel or a closed model is not work done."""
    from collections import Counter

    from storage.outcomes import Outcome

    counts: Counter[str] = Counter()
    for outcomes in summary.by_model.values():
        counts.update(outcomes)
    counts.subtract(summary.by_others)
    others = sum(summary.by_others.values())
    cancelled, ok = counts[Outcome.CANCELLED.value], counts[Outcome.OK.value]
    called = summary.executed - cancelled - others
    text = f"{called} executed now" + (f" (ok {ok}, failed {called - ok})" if called else "")
    text += f", {others} executed by another orchestrator" if others else ""
    return text + (f", {cancelled} cancelled" if cancelled else "")


def _exit_on_spend_cap(prepared: PreparedCampaign, store: RunStore) -> None:
    """One stderr line and exit 5 when a spend cap cancelled planned runs (they resume once it is raised)."""
    from orchestrator.campaign.spend_cap import SPEND_CAP_EXIT_CODE, spend_cap_stop

    spec = prepared.spec
    if not (spec.spend_cap().capped or any(m.spend_cap().capped for m in spec.models.values())):
        return  # no cap: no read of the store
    stop = spend_cap_stop(store, prepared.plan)
    if stop is None:
        return
    reason, runs = stop
    sys.stderr.write(f"{reason} ({runs} runs cancelled, not sent)\n")
    sys.stderr.flush()
    raise typer.Exit(code=SPEND_CAP_EXIT_CODE)


def _exit_on_failed_runs(prepared: PreparedCampaign, store: RunStore) -> None:
    """One stderr line per model with failed runs (class counts, first error), then exit 3 when
    some planned runs failed, 4 when all did (``orchestrator.campaign.outcome``)."""
    from orchestrator.campaign.outcome import campaign_outcome

    outcome = campaign_outcome(prepared, store)
    if outcome.exit_code == 0:
        return
    for model in outcome.models:
        sys.stderr.write(f"failed: {model.line()}\n")
    sys.stderr.write(f"{outcome.failed}/{outcome.planned} planned runs failed; `irbench status` lists them, "
                     "`--retry-failed` executes the transient ones again\n")
    sys.stderr.flush()
    raise typer.Exit(code=outcome.exit_code)

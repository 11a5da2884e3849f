"""``irbench analyze --executor celery``: each part of the run store (a file group of one date
partition, or a hash shard of its cells) is a map task on the workers that computes everything
per cell and per run there; one reduce task merges the parts' compact summaries and does the
cross-part work, writing the same outputs as the local path (``analysis.pipeline.run_analysis``)
without reading a run file. Protocol and files: ``orchestrator.jobs.analysis_tasks``; which files
each part reads: ``orchestrator.jobs.analysis_plan``; the summaries and their merge:
``analysis.tables.part_summaries``.

A cell's runs can sit in several parts (a campaign crossing midnight UTC, a resume on a later
day), and its Jaccard/ID-stability/drift need every pair of its runs, so per-part cell
aggregates do not merge. The plan keeps cells whole where it can and lists the rest ("split"
cells); their runs travel to the reduce, which computes them there — exactly the local tables.

Planning needs the dataset root at the same path as the workers see it (as for campaigns).
"""

from __future__ import annotations

import datetime as dt
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from analysis.outputs import AnalysisResult, PanelResult, panel_dirname
from analysis.options import AnalysisOptions
from analysis.progress import Reporter, Stage, silent
from analysis.tables.models import ModelTable
from storage.clock import utc_now
from orchestrator.jobs.analysis_plan import plan_analysis
from storage.parquet.atomic import write_parquet_atomic
from orchestrator.jobs.analysis_tasks import (
    MAP_TASK,
    REDUCE_TASK,
    done_path,
    error_path,
    jobs_dir,
    parts_done,
    scratch_dir,
    split_path,
)
from workers.celery import DEFAULT_QUEUE
from workers.errors import IrbenchError

if TYPE_CHECKING:
    from celery import Celery

log = structlog.get_logger("irbench.analysis_jobs")


class AnalysisJobError(IrbenchError, ValueError):
    """A map or reduce task failed; the message is the task's error (and which stage)."""


class AnalysisJobTimeout(IrbenchError, TimeoutError):
    """The job did not finish in time; the workers may still finish it (outputs appear later)."""


@dataclass(frozen=True)
class AnalysisJob:
    """An enqueued analysis: ``parts`` map tasks, then one reduce, outputs under ``out_dir``."""

    job_id: str
    data_dir: Path
    out_dir: Path
    parts: int
    files: int
    message: dict[str, Any] = field(repr=False)  # the job description every task carries

    @property
    def done_path(self) -> Path:
        return done_path(self.message)

    @property
    def error_path(self) -> Path:
        return error_path(self.message)

    @property
    def scratch_dir(self) -> Path:
        return scratch_dir(self.message)


@dataclass(frozen=True)
class JobQueue:
    """Where an analysis job's tasks go: ``queue`` on the broker at ``broker_url``, sent through
    ``app`` (``None``: a Celery app made for ``broker_url``)."""

    broker_url: str
    queue: str = DEFAULT_QUEUE
    app: Celery | None = None

    def celery_app(self) -> Celery:
        from workers.celery.app import make_celery_app  # lazy: the local analysis loads no Celery

        return self.app or make_celery_app(self.broker_url)


@dataclass(frozen=True)
class JobWait:
    """How a caller waits for a job: at most ``timeout_s`` seconds (``None``: no limit), looking
    for its done file every ``poll_interval_s`` seconds."""

    timeout_s: float | None = None
    poll_interval_s: float = 0.5


def plan_parts(data_dir: Path, options: AnalysisOptions, max_files_per_part: int = 64,
               min_parts: int = 8) -> list[list[str]]:
    """File lists of the map tasks (``orchestrator.jobs.analysis_plan.plan_analysis``): per date
    partition, files sharing a cell kept together, packed into about ``min_parts`` parts."""
    return plan_analysis(data_dir, options, max_files_per_part, min_parts).parts


def enqueue_analysis(
    data_dir: Path,
    out_dir: Path,
    options: AnalysisOptions | None,
    to: JobQueue,
    *,
    max_files_per_part: int = 64,
    job_id: str | None = None,
) -> AnalysisJob:
    """Send the map tasks (or, with no run file, the reduce) to ``to`` and return at once."""
    queue = to.queue
    options = options or AnalysisOptions()
    data_dir, out_dir = Path(data_dir).resolve(), Path(out_dir).resolve()
    if not data_dir.is_dir():
        raise AnalysisJobError(f"data directory {data_dir} does not exist; pass the dataset root the workers share")
    plan = plan_analysis(data_dir, options, max_files_per_part)
    parts = plan.parts
    job_id = job_id or utc_now().strftime("%Y%m%dT%H%M%SZ-") + uuid.uuid4().hex[:8]
    message = {"job_id": job_id, "data_dir": str(data_dir), "out_dir": str(out_dir),
               "options": options.model_dump(mode="json"), "parts": len(parts), "queue": queue}
    jobs_dir(out_dir).mkdir(parents=True, exist_ok=True)
    scratch_dir(message).mkdir(parents=True, exist_ok=True)
    write_parquet_atomic(plan.split, split_path(message))
    (scratch_dir(message) / "job.json").write_text(json.dumps({**message, "files": parts}, indent=1), encoding="utf-8")
    app = to.celery_app()
    with app.producer_or_acquire() as producer:
        if not parts:
            app.send_task(REDUCE_TASK, args=(message,), queue=queue, producer=producer)
        for i, (files, shard) in enumerate(zip(parts, plan.shards)):
            app.send_task(MAP_TASK, args=(message, i, files, None if shard is None else list(shard)),
                          queue=queue, producer=producer)
    log.info("analysis_enqueued", job=job_id, parts=len(parts), files=sum(map(len, parts)), out_dir=str(out_dir))
    return AnalysisJob(job_id, data_dir, out_dir, len(parts), sum(map(len, parts)), message)


def wait_analysis(
    job: AnalysisJob,
    *,
    wait: JobWait = JobWait(),
    on_progress: Callable[[int, int], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """Wait for the reduce's done file; returns its content. ``on_progress(parts_done, parts)``.

    Raises :class:`AnalysisJobError` with the task's message when a task failed, and
    :class:`AnalysisJobTimeout` after ``wait.timeout_s``."""
    timeout_s, poll_interval_s = wait.timeout_s, wait.poll_interval_s
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    last = -1
    while True:
        if job.error_path.exists():
            err = json.loads(job.error_path.read_text(encoding="utf-8"))
            raise AnalysisJobError(f"analysis job {job.job_id} failed in {err['stage']}: "
                                   f"{err['error_type']}: {err['message']}")
        if job.done_path.exists():
            return json.loads(job.done_path.read_text(encoding="utf-8"))
        done = parts_done(job.message)
        if on_progress is not None and done != last:
            on_progress(done, job.parts)
            last = done
        if deadline is not None and time.monotonic() > deadline:
            raise AnalysisJobTimeout(
                f"analysis job {job.job_id}: {done}/{job.parts} parts done after {timeout_s:g} s; are workers "
                f"consuming queue {job.message['queue']!r}? The job continues; its outputs will land in {job.out_dir}")
        sleep(poll_interval_s)


def load_result(out_dir: Path, data_dir: Path, options: AnalysisOptions, done: dict[str, Any]) -> AnalysisResult:
    """An :class:`AnalysisResult` read back from the written outputs (what the CLI prints)."""
    import pyarrow.parquet as pq

    panels: dict[str, PanelResult] = {}
    for name in done.get("panels", {}):
        pdir = Path(out_dir) / panel_dirname(name)
        manifest = json.loads((pdir / "manifest.json").read_text(encoding="utf-8"))
        paths = {stem: pdir / fname for stem, fname in manifest.get("files", {}).items()}
        tables = {stem: pq.read_table(p) for stem, p in paths.items()}
        models = ModelTable(tables["models"], tables["excluded"], options.min_runs, options.min_prompts)
        panels[name] = PanelResult(
            panel=name, directory=pdir, cells_path=paths["cells"], models_path=paths["models"],
            excluded_path=paths["excluded"], manifest_path=pdir / "manifest.json", cells=tables["cells"],
            models=models, manifest=manifest, tables=tables, paths=paths)
    return AnalysisResult(data_dir=Path(data_dir), out_dir=Path(out_dir), options=options,
                          runs_read=int(done.get("runs_read", 0)), panels=panels,
                          cells_imported=int(done.get("cells_imported", 0)),
                          skipped_files=tuple(done.get("skipped_files", ())))


def analyze_distributed(
    data_dir: Path,
    out_dir: Path,
    options: AnalysisOptions | None,
    to: JobQueue,
    *,
    wait: JobWait = JobWait(),
    max_files_per_part: int = 64,
    on_progress: Callable[[int, int], None] | None = None,
) -> AnalysisResult:
    """``run_analysis`` on the Celery workers of ``to``: same outputs under ``out_dir``; blocks
    until done, or ``AnalysisJobTimeout`` after ``wait.timeout_s``.

    The job's scratch files live under ``out_dir/.jobs/<job_id>/`` (removed on success) and its
    status in ``out_dir/.jobs/<job_id>.done.json`` / ``.error.json``."""
    options = options or AnalysisOptions()
    job = enqueue_analysis(data_dir, out_dir, options, to, max_files_per_part=max_files_per_part)
    done = wait_analysis(job, wait=wait, on_progress=on_progress)
    return load_result(job.out_dir, job.data_dir, options, done)


def campaign_analysis_dir(data_dir: Path, campaign: str, day: dt.date) -> Path:
    """Where a completed campaign's analysis lands: ``DATA/analysis/<campaign>/<UTC date>/``."""
    return Path(data_dir) / "analysis" / panel_dirname(campaign) / day.isoformat()


def enqueue_campaign_analysis(
    campaign: str,
    data_dir: Path,
    broker_url: str,
    *,
    options: AnalysisOptions | None = None,
    app: Celery | None = None,
    queue: str = DEFAULT_QUEUE,
    now: Callable[[], dt.datetime] = utc_now,
) -> AnalysisJob:
    """Enqueue (not await) the analysis of ``campaign``'s runs: ``options`` (default options)
    restricted to this campaign, outputs in :func:`campaign_analysis_dir` of today (UTC)."""
    base = options or AnalysisOptions()
    scoped = base.model_copy(update={"campaigns": [campaign]})
    out = campaign_analysis_dir(data_dir, campaign, now().astimezone(dt.timezone.utc).date())
    return enqueue_analysis(Path(data_dir), out, AnalysisOptions.model_validate(scoped.model_dump()),
                            JobQueue(broker_url, queue=queue, app=app))


def analyze_with_executor(
    data_dir: Path,
    out_dir: Path,
    options: AnalysisOptions,
    *,
    executor: str = "local",
    broker_url: str | None = None,
    timeout_s: float | None = None,
    progress: Reporter = silent,
) -> AnalysisResult:
    """What ``irbench analyze`` calls: ``executor`` 'local' (in-process) or 'celery' (needs
    ``broker_url``). Raises ``ValueError`` subclasses for bad input, like ``run_analysis``.
    ``progress`` gets the local pipeline's stages (the distributed one reports dispatch only)."""
    from analysis.pipeline import run_analysis
    from workers.errors import ConfigError

    if executor == "local":
        return run_analysis(Path(data_dir), Path(out_dir), options, progress=progress)
    if executor != "celery":
        raise ConfigError(f"--executor {executor!r}: use 'local' or 'celery'")
    if not broker_url:
        raise ConfigError("--executor celery needs --broker redis://HOST:PORT/DB")
    progress(Stage("distributed", unit=f"map and reduce on the workers via {broker_url}"))
    return analyze_distributed(Path(data_dir), Path(out_dir), options, JobQueue(broker_url), wait=JobWait(timeout_s=timeout_s))

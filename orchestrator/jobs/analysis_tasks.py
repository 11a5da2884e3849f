"""Analysis as Celery jobs: one *map* task per date partition (or file group) of the run store,
one *reduce* task that merges the partial cell tables and writes every analysis output.

Only small JSON goes through Redis: the job description (paths, options), the part's file
names and the part index. Data moves through the shared filesystem (every worker sees the same
dataset root, as for campaigns):

* enqueue lists the keys of the cells whose runs sit in two or more parts
  (``OUT/.jobs/<job_id>/split-cells.parquet``, from the files' key columns only).
* map ``i`` reads its files (``analysis.inputs.read_run_files``) and computes everything per
  cell and per run there — cells, drift, stabilisation, normalised, correctness
  (``analysis.tables.part_summaries.summarise_part``) — and writes the compact summaries to the
  job's scratch directory ``OUT/.jobs/<job_id>/part-<i>.<name>.parquet``, then ``part-<i>.json``
  last (the part's done marker). The map that finds every part done sends the reduce, once (a Redis
  ``SET NX`` per job); a redelivered map whose marker exists does nothing.
* reduce reads the summaries only (no run file), ``merge_parts`` → ``run_analysis(raw_cells=...,
  precomputed=...)`` (cross-part work: merge, model tables, bootstrap, pairs, sensitivity,
  timeouts, manifest), writes
  ``OUT/.jobs/<job_id>.done.json`` and removes the scratch directory.
* any failure writes ``OUT/.jobs/<job_id>.error.json`` (first writer wins) with what was wrong;
  the waiting orchestrator (``orchestrator.jobs.analysis``) raises it.

Every output is written to a temporary name and renamed, so a re-run of a task (redelivery after
a worker died) rewrites the same files; the analysis code is imported on a worker's first job.
"""

from __future__ import annotations

import json
import os
import shutil
import traceback
from pathlib import Path
from typing import Any

import structlog

from storage.clock import utc_now

MAP_TASK = "irbench.analysis_map"
REDUCE_TASK = "irbench.analysis_reduce"
REDUCE_ONCE_PREFIX = "irbench:analysis:reduce:"
REDUCE_ONCE_TTL_S = 7 * 86400
log = structlog.get_logger("irbench.analysis_job")


def jobs_dir(out_dir: str | Path) -> Path:
    return Path(out_dir) / ".jobs"


def scratch_dir(job: dict[str, Any]) -> Path:
    return jobs_dir(job["out_dir"]) / job["job_id"]


def done_path(job: dict[str, Any]) -> Path:
    return jobs_dir(job["out_dir"]) / f"{job['job_id']}.done.json"


def error_path(job: dict[str, Any]) -> Path:
    return jobs_dir(job["out_dir"]) / f"{job['job_id']}.error.json"


SUMMARY_FILES = ("light", "cells", "split", "truth")


def part_paths(job: dict[str, Any], index: int) -> tuple[Path, Path]:
    """(base of the part's summary files ``part-<i>.<name>.parquet``, done marker) of part ``index``."""
    base = scratch_dir(job) / f"part-{index:05d}"
    return base, base.with_suffix(".json")


def split_path(job: dict[str, Any]) -> Path:
    """The keys of the cells whose runs sit in two or more parts (written when enqueued)."""
    return scratch_dir(job) / "split-cells.parquet"


def parts_done(job: dict[str, Any]) -> int:
    try:
        return sum(1 for e in os.scandir(scratch_dir(job)) if e.name.startswith("part-") and e.name.endswith(".json"))
    except FileNotFoundError:
        return 0


def write_error(job: dict[str, Any], stage: str, exc: BaseException) -> None:
    """Record the job's first failure (later ones are consequences; the first says what to fix)."""
    from storage.parquet.atomic import write_json_atomic

    path = error_path(job)
    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic({"job_id": job["job_id"], "stage": stage, "error_type": type(exc).__name__,
                       "message": str(exc), "at": utc_now().isoformat(),
                       "traceback": "".join(traceback.format_exception(exc))[-4000:]}, path)


def _options(job: dict[str, Any]) -> Any:
    from analysis.options import AnalysisOptions

    return AnalysisOptions.model_validate(job["options"])


def _summary_path(base: Path, name: str) -> Path:
    return base.with_name(f"{base.name}.{name}.parquet")


def run_map(job: dict[str, Any], index: int, files: list[str], shard: list[int] | None = None
            ) -> dict[str, Any]:
    """Everything per cell and per run of part ``index`` (``files``; with ``shard`` = ``[j, k]``
    only the cells of hash shard j of k), written as compact summaries
    (``analysis.tables.part_summaries.summarise_part``); idempotent."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from analysis.inputs import read_run_files
    from analysis.tables.audit import corpus_index
    from analysis.tables.part_summaries import shard_of, summarise_part
    from storage.parquet.atomic import write_json_atomic, write_parquet_atomic

    base, marker = part_paths(job, index)
    if marker.exists():
        return {"part": index, "skipped": True}
    options = _options(job)
    runs, bad = read_run_files(Path(job["data_dir"]), [Path(f) for f in files], options)
    if shard is not None:
        runs = runs.filter(pa.array(shard_of(runs, int(shard[1])) == int(shard[0])))
    split = pq.read_table(split_path(job))
    part = summarise_part(runs, split, options, corpus_index(options.corpus_dirs))
    marker.parent.mkdir(parents=True, exist_ok=True)
    named = {"light": part.light, "cells": part.cells, "split": part.split_runs, "truth": part.truth}
    for name, table in {**named, **part.tables}.items():
        write_parquet_atomic(table, _summary_path(base, name))
    info = {"part": index, "files": len(files), "runs": runs.num_rows, "cells": part.cells.num_rows,
            "split_runs": part.split_runs.num_rows, "tables": sorted(part.tables),
            "skipped_corrupt_files": bad, "finished_at": utc_now().isoformat()}
    write_json_atomic(info, marker)
    return info


def run_reduce(job: dict[str, Any]) -> dict[str, Any]:
    """Merge the parts' summaries and write every output of ``run_analysis`` (which reads no
    run file then: only the summaries and the imported cells); idempotent."""
    import pyarrow.parquet as pq

    from analysis.pipeline import run_analysis
    from analysis.tables.audit import corpus_index
    from analysis.tables.part_summaries import PartSummary, Precomputed, merge_parts
    from storage.parquet.atomic import write_json_atomic

    if done_path(job).exists():
        return json.loads(done_path(job).read_text(encoding="utf-8"))
    options = _options(job)
    n = int(job["parts"])
    missing = [i for i in range(n) if not part_paths(job, i)[1].exists()]
    if missing:
        raise RuntimeError(f"analysis job {job['job_id']}: parts {missing[:10]} have no output; "
                           "their map tasks did not finish (re-run the analysis)")
    parts, skipped = [], []
    for i in range(n):
        base, marker = part_paths(job, i)
        info = json.loads(marker.read_text(encoding="utf-8"))
        skipped += info.get("skipped_corrupt_files", [])
        named = {k: pq.read_table(_summary_path(base, k)) for k in SUMMARY_FILES}
        parts.append(PartSummary(light=named["light"], cells=named["cells"], split_runs=named["split"],
                                 truth=named["truth"],
                                 tables={t: pq.read_table(_summary_path(base, t)) for t in info["tables"]}))
    skipped = list(dict.fromkeys(skipped))  # shards of one file group report its files each
    raw, pre = None, None
    if parts:
        light, raw, levels = merge_parts(parts, options, corpus_index(options.corpus_dirs))
        pre = Precomputed(runs=light, run_levels=levels, skipped=tuple(skipped))
    result = run_analysis(Path(job["data_dir"]), Path(job["out_dir"]), options, raw_cells=raw,
                          precomputed=pre)
    info = {"job_id": job["job_id"], "parts": n, "runs_read": result.runs_read,
            "cells_imported": result.cells_imported, "skipped_files": list(result.skipped_files),
            "panels": {name: str(p.directory) for name, p in result.panels.items()},
            "raw_cells": None if raw is None else raw.num_rows, "finished_at": utc_now().isoformat()}
    write_json_atomic(info, done_path(job))
    shutil.rmtree(scratch_dir(job), ignore_errors=True)
    return info


def register_analysis_tasks(app: Any) -> None:
    """Register ``irbench.analysis_map`` and ``irbench.analysis_reduce`` on a Celery app."""
    from workers.state.connect import sync_redis

    def send_reduce_once(job: dict[str, Any]) -> bool:
        client = sync_redis(app.conf.broker_url)
        try:
            if not client.set(REDUCE_ONCE_PREFIX + job["job_id"], "sent", nx=True, ex=REDUCE_ONCE_TTL_S):
                return False
        finally:
            client.close()
        app.send_task(REDUCE_TASK, args=(job,), queue=job.get("queue") or app.conf.task_default_queue)
        return True

    @app.task(name=MAP_TASK, ignore_result=True, acks_late=True, shared=False)
    def analysis_map(job: dict, index: int, files: list, shard: list | None = None) -> dict:
        with structlog.contextvars.bound_contextvars(analysis_job=job["job_id"], part=index):
            try:
                info = run_map(job, int(index), [str(f) for f in files], shard)
            except Exception as exc:
                write_error(job, f"map part {index}", exc)
                log.warning("analysis_part_failed", error=f"{type(exc).__name__}: {exc}")
                return {"part": index, "error": str(exc)}
            if parts_done(job) >= int(job["parts"]) and send_reduce_once(job):
                log.info("analysis_reduce_sent", parts=job["parts"])
            log.info("analysis_part_done", **{k: v for k, v in info.items() if k != "part"})
            return info

    @app.task(name=REDUCE_TASK, ignore_result=True, acks_late=True, shared=False)
    def analysis_reduce(job: dict) -> dict:
        with structlog.contextvars.bound_contextvars(analysis_job=job["job_id"]):
            try:
                info = run_reduce(job)
            except Exception as exc:
                write_error(job, "reduce", exc)
                log.warning("analysis_reduce_failed", error=f"{type(exc).__name__}: {exc}")
                return {"error": str(exc)}
            log.info("analysis_done", panels=sorted(info.get("panels", {})), runs_read=info.get("runs_read"))
            return info

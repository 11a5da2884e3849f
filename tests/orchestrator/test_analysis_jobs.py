"""Analysis as Celery jobs: real redis-server, real `celery worker` subprocesses, real Parquet.

The distributed path (a map task per partition / file group, one reduce) must write exactly the
local path's tables; the data is built so that cells span partitions and one run is stored
twice in two partitions, which a naive concatenation of per-part cells gets wrong (checked too).
"""

from __future__ import annotations

import datetime as dt
import json
import random
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from analysis.inputs import read_run_files
from analysis.pipeline import run_analysis
from analysis.tables.partial import partial_cells
from analysis.tables.cells import build_cells
from analysis.options import AnalysisOptions
from orchestrator.jobs.analysis import (
    AnalysisJobError,
    JobQueue,
    JobWait,
    analyze_distributed,
    analyze_with_executor,
    campaign_analysis_dir,
    plan_parts,
    wait_analysis,
)
from orchestrator.campaign.prepared import prepare
from orchestrator.distributed.executor import CeleryOptions, CeleryRun, run_campaign_celery
from orchestrator.campaign.spec import load_campaign
from simulator.config import SimConfig, SimModel
from simulator.server import start_background
from storage.runs import RunStore
from tests.support.workers import CeleryWorkers
from deploy.redis_server import RedisServer
from tests.analysis.test_analyze import record
from tests.support.distributed import WORKER_ENV, make_campaign

pytestmark = pytest.mark.timeout(120)
NOW = dt.datetime(2026, 6, 1, 12, 0, tzinfo=dt.UTC)
DAYS = [dt.date(2026, 3, 1), dt.date(2026, 3, 2), dt.date(2026, 3, 4)]
OPTIONS = AnalysisOptions(replicates=300, seed=7, min_prompts=3)


@pytest.fixture(scope="module")
def broker() -> Iterator[str]:
    with RedisServer() as srv, CeleryWorkers(srv.url, count=2, concurrency=2, env=WORKER_ENV):
        yield srv.url


def build_store(root: Path) -> None:
    """2 panels; 5 models × 6 prompts × 4 runs in panel main on random days (cells span
    partitions), failures, two budgets, a re-stored run, many small files per partition."""
    rng = random.Random(11)
    recs = []
    vocab = ["RULE:a", "RULE:b", "STEP:c", "STEP:d", "META:e"]
    for m in ("alpha-1", "alpha-2", "beta", "gamma", "delta"):
        for p in range(6):
            for r in range(4):
                ids = None if rng.random() < 0.1 else sorted(rng.sample(vocab, rng.randint(1, 4)))
                rec = record(panel="main", campaign="c1", model=m, prompt=f"p{p}", run_index=r, ids=ids,
                             day=rng.choice(DAYS))
                if p == 5:
                    rec = rec.model_copy(update={"budget_max_tokens": 1500})
                recs.append(rec)
    for p in range(3):
        for r in range(3):
            recs.append(record(panel="side", campaign="c2", model="alpha-1", prompt=f"s{p}", run_index=r,
                               ids=["x", "y"][: 1 + (r % 2)], day=DAYS[r % 2]))
    store = RunStore(root, fsync=False)
    for i in range(0, len(recs), 9):
        store.write(recs[i : i + 9])
    # the same run executed again on a later day (a redelivery across midnight): the latest wins
    again = recs[0].model_copy(update={"measured_at": recs[0].measured_at + dt.timedelta(days=5),
                                       "measurement_date": DAYS[-1] + dt.timedelta(days=1),
                                       "node_ids": ["ZZZ"], "node_count": 1})
    store.write([again])


def _tables(panel_dir: Path) -> dict[str, pa.Table]:
    return {p.stem: pq.read_table(p) for p in sorted(panel_dir.glob("*.parquet"))}


def _manifest(panel_dir: Path) -> dict:
    m = json.loads((panel_dir / "manifest.json").read_text())
    m.pop("generated_at")
    return m


def test_distributed_outputs_equal_local(tmp_path: Path, broker: str) -> None:
    data = tmp_path / "data"
    build_store(data)
    parts = plan_parts(data, OPTIONS, max_files_per_part=3)
    assert len(parts) >= 8  # 4 partitions split into file groups
    # the data exercises the cross-part case: per-part cells concatenated are NOT the local table
    naive = pa.concat_tables([partial_cells(read_run_files(data, [Path(f) for f in fs], OPTIONS)[0], 2)[0]
                              for fs in parts])
    local_cells = build_cells(RunStore(data).read_table(), 2)
    assert naive.num_rows > local_cells.num_rows

    local = run_analysis(data, tmp_path / "local", OPTIONS, now=lambda: NOW)
    dist = analyze_distributed(data, tmp_path / "dist", OPTIONS, JobQueue(broker), max_files_per_part=3,
                               wait=JobWait(timeout_s=90, poll_interval_s=0.2))
    assert sorted(dist.panels) == sorted(local.panels) == ["main", "side"]
    assert dist.runs_read == local.runs_read
    for name, panel in local.panels.items():
        ours, theirs = _tables(panel.directory), _tables(dist.panels[name].directory)
        assert sorted(ours) == sorted(theirs)
        for stem in ours:
            assert theirs[stem].equals(ours[stem], check_metadata=True), f"{name}/{stem}.parquet differs"
        assert _manifest(dist.panels[name].directory) == _manifest(panel.directory)
    # the duplicated run counts once, with its latest execution
    main_cells = dist.panels["main"].cells
    assert main_cells.column("runs_total").to_pylist() == local.panels["main"].cells.column("runs_total").to_pylist()
    jobs = list((tmp_path / "dist" / ".jobs").iterdir())
    assert [p.name.endswith(".done.json") for p in jobs] == [True], "scratch removed, done file kept"
    assert json.loads(jobs[0].read_text())["parts"] == len(parts)
    # the printout path the CLI uses reads the same tables back
    assert dist.panels["main"].models.included.equals(local.panels["main"].models.included)


def test_corrupt_file_fails_the_job_or_is_skipped(tmp_path: Path, broker: str) -> None:
    data = tmp_path / "data"
    build_store(data)
    bad = RunStore(data).dataset.partition_dir(DAYS[1]) / "zz-corrupt.parquet"
    bad.write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(AnalysisJobError, match=r"zz-corrupt\.parquet.*--skip-corrupt"):
        analyze_distributed(data, tmp_path / "dist", OPTIONS, JobQueue(broker), wait=JobWait(timeout_s=60, poll_interval_s=0.2))
    skip = OPTIONS.model_copy(update={"skip_corrupt": True})
    local = run_analysis(data, tmp_path / "local", skip, now=lambda: NOW)
    dist = analyze_with_executor(data, tmp_path / "dist2", skip, executor="celery", broker_url=broker,
                                 timeout_s=60)
    assert dist.skipped_files == local.skipped_files == (str(bad),)
    for stem in ("cells", "models"):
        assert pq.read_table(dist.panels["main"].paths[stem]).equals(pq.read_table(local.panels["main"].paths[stem]))


def test_completed_campaign_enqueues_its_dated_analysis(tmp_path: Path, broker: str) -> None:
    models = {"aj-steady": SimModel(), "aj-shaky": SimModel(drop_prob=0.3), "aj-mid": SimModel(drop_prob=0.1)}
    jobs = []
    with start_background(SimConfig(seed=9, models=models)) as sim:
        spec = load_campaign(make_campaign(tmp_path, "aj-camp", sim.base_url, {m: {} for m in models},
                                           prompts=4, runs=3))
        store = RunStore(tmp_path / "data")
        summary = run_campaign_celery(prepare(spec), store, broker,
                                      CeleryRun(timeout_s=60, analysis_options=OPTIONS, on_analysis=jobs.append,
                                                options=CeleryOptions(claim_ttl_s=3.0, reconcile_interval_s=1.0)))
    assert summary.executed == 36 and len(jobs) == 1
    done = wait_analysis(jobs[0], wait=JobWait(timeout_s=60, poll_interval_s=0.2))
    out = campaign_analysis_dir(tmp_path / "data", "aj-camp", dt.datetime.now(dt.UTC).date())
    assert jobs[0].out_dir == out.resolve() and done["panels"] == {"aj-camp": str(out.resolve() / "aj-camp")}
    local = run_analysis(tmp_path / "data", tmp_path / "local", OPTIONS.model_copy(update={"campaigns": ["aj-camp"]}),
                         now=lambda: NOW)
    for stem in ("cells", "models", "excluded", "pairs"):
        assert pq.read_table(out / "aj-camp" / f"{stem}.parquet").equals(local.panels["aj-camp"].tables[stem])
    assert sorted(local.panels["aj-camp"].models.included.column("model").to_pylist()) == sorted(models)

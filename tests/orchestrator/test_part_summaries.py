"""Distributed analysis without the transport: the map and reduce task bodies
(``orchestrator.jobs.analysis_tasks.run_map`` / ``run_reduce``) on the demo campaign's store and on
a store whose cells span partitions, compared table by table with the local ``run_analysis``.
The reduce runs with the run files moved away: it reads only the parts' summaries. (The same
bodies under real Celery workers: tests/orchestrator/test_analysis_jobs.py.)
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from analysis.options import AnalysisOptions
from analysis.pipeline import run_analysis
from orchestrator.jobs.analysis_plan import plan_analysis
from orchestrator.jobs.analysis_tasks import run_map, run_reduce, scratch_dir, split_path
from storage.parquet.atomic import write_parquet_atomic
from tests.orchestrator.test_analysis_jobs import NOW, build_store

OPTIONS = AnalysisOptions(seed=7, replicates=500)


@pytest.fixture(scope="module")
def demo_store(tmp_path_factory, examples_dir) -> Path:
    from orchestrator.campaign.prepared import prepare
    from orchestrator.local.campaign import run_campaign_local
    from orchestrator.local.executor import LocalOptions
    from orchestrator.campaign.spec import load_campaign
    from simulator.config import load_sim_config
    from simulator.server import start_background
    from storage.runs import RunStore

    data = tmp_path_factory.mktemp("demo") / "data"
    with start_background(load_sim_config(examples_dir / "sim.toml")) as sim:
        spec = load_campaign(examples_dir / "demo.toml").with_base_url("sim", sim.base_url)
        # batches of 16: the demo's 180 runs in ~12 files whatever the machine's speed (the
        # writer flushes by time too: a fast machine wrote them in 2), so the plans have parts
        run_campaign_local(prepare(spec), RunStore(data, fsync=False), {},
                           options=LocalOptions(flush_max_records=16, flush_interval_s=60.0))
    return data


def _distributed(data: Path, out: Path, options: AnalysisOptions, max_files_per_part: int,
                 min_parts: int) -> int:
    """Plan, run every map, move the run files away, reduce; returns the number of parts."""
    plan = plan_analysis(data, options, max_files_per_part, min_parts)
    job = {"job_id": "t", "data_dir": str(data), "out_dir": str(out),
           "options": options.model_dump(mode="json"), "parts": len(plan.parts)}
    scratch_dir(job).mkdir(parents=True)
    write_parquet_atomic(plan.split, split_path(job))
    for i, (files, shard) in enumerate(zip(plan.parts, plan.shards)):
        run_map(job, i, files, None if shard is None else list(shard))
    hidden = data.parent / (data.name + "-runs-away")
    shutil.move(data / "runs", hidden)
    try:
        run_reduce(job)
    finally:
        shutil.move(hidden, data / "runs")
    return len(plan.parts)


def _assert_same(local_out: Path, dist_out: Path) -> None:
    panels = sorted(p.name for p in local_out.iterdir() if p.is_dir())
    assert panels == sorted(p.name for p in dist_out.iterdir() if p.is_dir() and p.name != ".jobs")
    for name in panels:
        ours = {p.name: pq.read_table(p) for p in sorted((local_out / name).glob("*.parquet"))}
        theirs = {p.name: pq.read_table(p) for p in sorted((dist_out / name).glob("*.parquet"))}
        assert sorted(ours) == sorted(theirs)
        for stem, table in ours.items():
            assert theirs[stem].equals(table, check_metadata=True), f"{name}/{stem} differs"
        a, b = (json.loads((d / name / "manifest.json").read_text()) for d in (local_out, dist_out))
        a.pop("generated_at"), b.pop("generated_at")
        assert a == b


@pytest.mark.parametrize("max_files_per_part,min_parts", [(64, 8), (1, 64)])
def test_demo_store_distributed_equals_local(demo_store: Path, tmp_path: Path, max_files_per_part: int,
                                             min_parts: int) -> None:
    run_analysis(demo_store, tmp_path / "local", OPTIONS, now=lambda: NOW)
    parts = _distributed(demo_store, tmp_path / "dist", OPTIONS, max_files_per_part, min_parts)
    files = sum(1 for _ in (demo_store / "runs").rglob("*.parquet"))
    assert parts >= min(files, min_parts) // 2 and (min_parts < 64 or parts > 2), (parts, files)
    _assert_same(tmp_path / "local", tmp_path / "dist")


def test_cells_spanning_partitions_and_re_executed_runs(tmp_path: Path) -> None:
    data = tmp_path / "data"
    build_store(data)  # cells on random days, two budgets, one run stored twice days apart
    options = AnalysisOptions(replicates=300, seed=7, min_prompts=3)
    plan = plan_analysis(data, options, max_files_per_part=2, min_parts=8)
    assert plan.split.num_rows > 0 and len(plan.parts) >= 8  # the reduce has cells to rebuild
    run_analysis(data, tmp_path / "local", options, now=lambda: NOW)
    _distributed(data, tmp_path / "dist", options, 2, 8)
    _assert_same(tmp_path / "local", tmp_path / "dist")


def test_plan_keeps_every_cell_in_one_part(demo_store: Path) -> None:
    """The demo's concurrent runs spread cells over several files (a component larger than one
    part): the plan shards its cells by hash; every cell's runs land in exactly one part, sharded
    or not, no split cell. (Which files form one component depends on the order the runs
    finished: a batch that happened to hold whole cells only is a part of its own.)"""
    import pyarrow as pa

    from analysis.tables.part_summaries import shard_of
    from orchestrator.jobs.analysis_plan import file_keys

    plan = plan_analysis(demo_store, OPTIONS, max_files_per_part=1, min_parts=64)
    assert len(plan.parts) > 2 and any(s is not None for s in plan.shards), plan.shards
    seen: dict[tuple, int] = {}
    for i, (files, shard) in enumerate(zip(plan.parts, plan.shards)):
        t = pa.concat_tables([file_keys(f) for f in files])
        if shard is not None:
            t = t.filter(pa.array(shard_of(t, shard[1]) == shard[0]))
        for key in set(zip(*(t.column(c).to_pylist() for c in t.column_names))):
            assert seen.setdefault(key, i) == i, key
    assert plan.split.num_rows == 0 and len(seen) > len(plan.parts)

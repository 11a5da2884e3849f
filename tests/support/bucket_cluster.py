"""A fleet on a bucket store for the fault tests: SeaweedFS, redis-server (AOF) and two
``celery worker`` processes that share no disk (each its own spool directory), all on one
``s3://`` URL; ``orchestrate`` (``irbench run --executor celery`` on it, as a process),
``reader`` (what a new machine reads from the bucket) and ``settle`` (every execution finished
and uploaded)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from deploy.redis_server import RedisServer
from deploy.seaweed_server import SeaweedServer
from storage.objectstore.location import parse_store_url
from storage.objectstore.session import BucketOptions, BucketSession
from storage.parquet.spool import pending_rows
from storage.runs import RunStore
from tests.support.cli import spawn_cli
from tests.support.distributed import WORKER_ENV, wait_for
from tests.support.paths import REPO
from tests.support.workers import CeleryWorkers

__all__ = ["BucketCluster", "bucket_cluster", "bucket_live", "orchestrate", "reader", "settle"]


@dataclass
class BucketCluster:
    s3: SeaweedServer
    redis: RedisServer
    workers: list[CeleryWorkers]  # one process each: each its own spool directory
    spools: list[Path]
    url: str  # the store, s3://BUCKET/PREFIX

    def env(self) -> dict[str, str]:
        """The AWS variables of the object store and the workers' test settings."""
        return {**WORKER_ENV, **self.s3.env()}


@pytest.fixture(scope="module")
def bucket_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BucketCluster]:
    tmp = tmp_path_factory.mktemp("bucket-cluster")
    url = "s3://irbench/faults"
    with SeaweedServer() as s3, RedisServer(aof=True) as redis_srv:
        spools = [tmp / "spool-a", tmp / "spool-b"]
        base = {**WORKER_ENV, **s3.env(), "IRBENCH_DATA": url}
        workers = [CeleryWorkers(redis_srv.url, count=1, concurrency=4, env={**base, "IRBENCH_SPOOL_DIR": str(spool)})
                   for spool in spools]
        with workers[0], workers[1]:
            yield BucketCluster(s3, redis_srv, workers, spools, url)


@pytest.fixture
def bucket_live(bucket_cluster: BucketCluster) -> Iterator[BucketCluster]:
    """The module's fleet with everything up (a previous test may have stopped a part)."""
    if not bucket_cluster.s3.running:
        bucket_cluster.s3.start()
    if not bucket_cluster.redis.running:
        bucket_cluster.redis.start()
    for w in bucket_cluster.workers:
        w.ensure_running()
    yield bucket_cluster


def orchestrate(cluster: BucketCluster, campaign: Path, cache: Path) -> subprocess.Popen[str]:
    """``irbench run CAMPAIGN --executor celery --data URL`` with its mirror in ``cache``: the
    workers' claim TTL, and a reconciler that looks every second (a lost run is sent again
    within seconds rather than the defaults' half minute)."""
    env = {**os.environ, **cluster.env(), "IRBENCH_S3_CACHE": str(cache), "IRBENCH_S3_PUSH_S": "1",
           "IRBENCH_RECONCILE_INTERVAL_S": "1"}
    return spawn_cli(["run", str(campaign), "--executor", "celery", "--broker", cluster.redis.url, "--data", cluster.url,
                      "--no-progress", "--no-analyze"], cwd=REPO, env=env, stdout=subprocess.PIPE,
                     stderr=subprocess.PIPE, text=True)  # type: ignore[return-value]


def reader(s3: SeaweedServer, url: str, cache: Path, monkeypatch: pytest.MonkeyPatch) -> RunStore:
    """What a new machine reads from the bucket store ``url``: a mirror pulled into an empty cache."""
    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
    options = BucketOptions(cache_dir=cache, push_interval_s=0)
    return RunStore(BucketSession(parse_store_url(url), options).open().root)


def settle(cluster: BucketCluster, campaign: str, timeout_s: float = 20.0) -> None:
    """Wait until no execution of ``campaign`` is still running and every worker's spool is
    uploaded: a duplicate execution (a claim that expired under load) may still be finishing when
    the orchestrator returns, and its call must be matched by its stored attempts."""
    import redis as _redis

    from workers.state.campaign_state import CampaignState

    def uploaded(spool: Path) -> bool:
        return pending_rows(RunStore(spool).dataset) == 0 and not any(
            not f.name.startswith(".") for f in (spool / "runs").rglob("*.parquet"))

    client = _redis.Redis.from_url(cluster.redis.url)
    try:
        state = CampaignState(client, campaign)
        wait_for(lambda: not state.claims.running() and all(uploaded(s) for s in cluster.spools), timeout_s,
                 "executions settled and uploaded")
    finally:
        client.close()

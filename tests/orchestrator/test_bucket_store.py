"""A campaign on a bucket store (``--data s3://…``) against real components: SeaweedFS on
loopback, redis-server, ``celery worker`` processes that share no disk (each its own spool
directory), the simulator. Every run stored once, every call an attempt, through a worker
SIGKILL and an object store SIGKILLed and restarted mid-campaign."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from deploy.celery_workers import CeleryWorkers
from deploy.redis_server import RedisServer
from deploy.seaweed_server import SeaweedServer
from orchestrator.campaign.prepared import prepare
from orchestrator.campaign.spec import load_campaign
from simulator.config import SimModel
from storage.objectstore.location import S3Location
from storage.objectstore.session import BucketOptions, BucketSession
from storage.runs import RunStore
from tests.support.distributed import (
    WORKER_ENV,
    assert_calls_equal_attempts,
    assert_every_run_stored,
    make_campaign,
    sim,
    stats,
    wait_for,
)
from tests.support.paths import REPO

pytestmark = pytest.mark.timeout(180)


def _fresh_copy(s3: SeaweedServer, url: str, cache: Path, monkeypatch: pytest.MonkeyPatch) -> RunStore:
    """What a new machine reads from the bucket: a mirror pulled into an empty cache."""
    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
    bucket, _, prefix = url[len("s3://"):].partition("/")
    session = BucketSession(S3Location(bucket, prefix), BucketOptions(cache_dir=cache, push_interval_s=0)).open()
    return RunStore(session.root)


def _irbench(*args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "orchestrator.cli.app", *args], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_campaign_on_a_bucket_survives_a_worker_kill_and_an_object_store_crash(tmp_path, monkeypatch) -> None:
    server = sim({"slow": SimModel(latency_ms_median=60)})
    url = "s3://irbench/campaigns"
    with SeaweedServer() as s3, RedisServer(aof=True) as redis_srv:
        base = {**WORKER_ENV, **s3.env(), "IRBENCH_DATA": url}
        a = CeleryWorkers(redis_srv.url, count=1, concurrency=4, env={**base, "IRBENCH_SPOOL_DIR": str(tmp_path / "spool-a")})
        b = CeleryWorkers(redis_srv.url, count=1, concurrency=4, env={**base, "IRBENCH_SPOOL_DIR": str(tmp_path / "spool-b")})
        with a, b:
            camp = make_campaign(tmp_path, "bucketc", server.base_url, {"slow": {}}, prompts=10, runs=12)
            env = {**os.environ, **s3.env(), "IRBENCH_S3_CACHE": str(tmp_path / "cache-orch"),
                   "IRBENCH_S3_PUSH_S": "1"}
            orch = _irbench("run", str(camp), "--executor", "celery", "--broker", redis_srv.url, "--data", url,
                            "--no-progress", env=env)
            def under_way() -> bool:
                assert orch.poll() is None, orch.communicate()
                return stats(server.base_url).get("slow", {}).get("requests", 0) >= 30

            wait_for(under_way, 60, "calls under way")
            a.kill(0, signal.SIGKILL)
            s3.stop(kill=True)  # the object store dies mid-campaign: uploads wait on the spool disk
            time.sleep(2.0)
            s3.start()
            a.ensure_running()  # the same spool directory: it uploads what its predecessor left
            out, err = orch.communicate(timeout=150)
            assert orch.returncode == 0, (out, err)
            assert url in out
            time.sleep(1.5)  # the workers' uploaders drain (a duplicate execution may still finish)
        st = stats(server.base_url)
        store = _fresh_copy(s3, url, tmp_path / "cache-reader", monkeypatch)
        prepared = prepare(load_campaign(camp))
        assert_every_run_stored(store, prepared, max_duplicates=4)
        assert_calls_equal_attempts(store, "bucketc", st, ["slow"], lost=4)
        assert not list((tmp_path / "spool-a").rglob("*.parquet")) and not list((tmp_path / "spool-b").rglob("*.parquet"))

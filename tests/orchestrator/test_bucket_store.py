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

import pytest

from tests.support.workers import CeleryWorkers
from deploy.redis_server import RedisServer
from deploy.seaweed_server import SeaweedServer
from orchestrator.campaign.prepared import prepare
from orchestrator.campaign.spec import load_campaign
from simulator.config import SimModel
from tests.support.distributed import (
    WORKER_ENV,
    assert_calls_equal_attempts,
    assert_every_run_stored,
    make_campaign,
    sim,
    stats,
    wait_for,
)
from tests.support.bucket_cluster import reader
from tests.support.paths import REPO
from tests.support import forked

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]


def _irbench(*args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return forked.popen([sys.executable, "-m", "orchestrator.cli.app", *args], cwd=REPO, env=env,
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
            # the workers' claim TTL, and a reconciler that looks every second: a killed worker's
            # runs are sent again within seconds rather than the defaults' half minute
            env = {**os.environ, **WORKER_ENV, **s3.env(), "IRBENCH_S3_CACHE": str(tmp_path / "cache-orch"),
                   "IRBENCH_S3_PUSH_S": "1", "IRBENCH_RECONCILE_INTERVAL_S": "1"}
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
        store = reader(s3, url, tmp_path / "cache-reader", monkeypatch)
        prepared = prepare(load_campaign(camp))
        assert_every_run_stored(store, prepared, max_duplicates=4)
        # the killed worker's calls are worker_died attempts; a kill between an intent's fsync and
        # its send stores one the endpoint never saw (at most the runs it held: 4 duplicates above)
        assert_calls_equal_attempts(store, "bucketc", st, ["slow"], unsent=4)
        assert not list((tmp_path / "spool-a").rglob("*.parquet")) and not list((tmp_path / "spool-b").rglob("*.parquet"))


def test_every_verb_reads_and_writes_the_bucket_from_any_machine(tmp_path) -> None:
    """run (local executor) on one "machine", compact on a second, status and analyze on a third:
    each with its own cache, sharing only the bucket."""
    from tests.support.cli import run_irbench

    server = sim({"ok": SimModel()})
    url = "s3://irbench/local"
    with SeaweedServer() as s3:
        camp = make_campaign(tmp_path, "bucketl", server.base_url, {"ok": {}}, prompts=3, runs=4)

        def on(machine: str, *args: str):  # type: ignore[no-untyped-def]
            return run_irbench(*args, env={**s3.env(), "IRBENCH_S3_CACHE": str(tmp_path / machine)})

        for _ in range(2):  # the second run finds every run stored
            ran = on("m1", "run", str(camp), "--data", url, "--no-progress")
            assert ran.returncode == 0, ran.stderr
        assert "12 runs planned, 12 already stored" in ran.stdout and url in ran.stdout
        assert stats(server.base_url)["ok"]["requests"] == 12
        compacted = on("m2", "compact", "--data", url)
        assert compacted.returncode == 0, compacted.stderr
        status = on("m3", "status", str(camp), "--data", url, "--json")
        assert status.returncode == 0, status.stderr
        import json

        body = json.loads(status.stdout)
        assert body["total"]["stored"] == 12 and body["total"]["executions"] == 12, body
        analyzed = on("m3", "analyze", "--data", url, "--out", str(tmp_path / "out"))
        assert analyzed.returncode == 0, analyzed.stderr
        assert any((tmp_path / "out").iterdir())
        keys = [k for k in _list(s3, "local/runs/")]
        assert keys and all("/_spool/" not in k and not k.rsplit("/", 1)[-1].startswith(".") for k in keys)
        bad = run_irbench("status", str(camp), "--data", "s3://Bad_Bucket/x")
        assert bad.returncode == 2 and "Traceback" not in bad.stderr and "bucket name" in bad.stderr


def _list(s3: SeaweedServer, prefix: str) -> list[str]:
    import boto3

    client = boto3.client("s3", endpoint_url=s3.endpoint_url, aws_access_key_id=s3.access_key,
                          aws_secret_access_key=s3.secret_key, region_name="us-east-1")
    return [o["Key"] for o in client.list_objects_v2(Bucket=s3.bucket, Prefix=prefix).get("Contents", [])]

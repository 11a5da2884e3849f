"""The broker's visibility timeout is a knob (env ``IRBENCH_VISIBILITY_TIMEOUT_S``, flag
``--visibility-timeout-s``) of workers and orchestrator alike; a message taken by a consumer that
died before acknowledging it comes back after that long — real redis-server, real worker process.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import redis

from tests.support.workers import CeleryWorkers
from deploy.redis_server import RedisServer
from orchestrator.distributed.executor import CeleryRun, run_campaign_celery
from orchestrator.distributed.options import CeleryOptions
from orchestrator.campaign.prepared import prepare
from orchestrator.cli.distributed import worker_settings
from orchestrator.campaign.spec import load_campaign
from simulator.config import SimModel
from storage.runs import RunStore
from tests.support.distributed import WORKER_ENV, make_campaign, sim, stats, stored_count, wait_for
from tests.support.paths import REPO
from workers.celery import DEFAULT_QUEUE
from workers.celery.app import make_celery_app

pytestmark = pytest.mark.slow

# Takes every message of the queue without acknowledging it, says how many, then waits to be killed.
TAKER = """
import sys, time
from workers.celery.app import make_celery_app
app = make_celery_app(sys.argv[1])
with app.connection_for_read() as conn:
    ch = conn.default_channel
    n = 0
    while ch.basic_get(sys.argv[2], no_ack=False) is not None:
        n += 1
    print("taken", n, flush=True)
    time.sleep(600)
"""


def _transport_s(app) -> float:
    return float(app.conf.broker_transport_options["visibility_timeout"])


def test_the_knob_reaches_the_app_from_env_flag_and_options() -> None:
    url = "redis://127.0.0.1:1/0"  # nothing connects: the app is lazy
    assert _transport_s(make_celery_app(url, environ={})) == 10800.0
    assert _transport_s(make_celery_app(url, environ={"IRBENCH_VISIBILITY_TIMEOUT_S": "7"})) == 7.0
    flagged = worker_settings(url, visibility_timeout_s=9.0)  # the worker's flag over its environment
    assert _transport_s(make_celery_app(url, worker_settings=flagged, environ={})) == 9.0
    assert CeleryOptions().with_env({"IRBENCH_VISIBILITY_TIMEOUT_S": "11"}).visibility_timeout_s == 11.0
    opts = make_celery_app(url, environ={"IRBENCH_ACK_FLUSH_S": "0.2"}).conf.broker_transport_options
    assert opts["ack_flush_s"] == 0.2  # the other broker-side knob, read the same way


def test_a_bad_value_is_one_line_and_exit_2(tmp_path: Path) -> None:
    irbench = [str(Path(sys.executable).parent / "irbench")]
    for argv, env in (
        (["worker", "--visibility-timeout-s", "0", "--broker", "redis://127.0.0.1:1/0"], {}),
        (["worker", "--broker", "redis://127.0.0.1:1/0"], {"IRBENCH_VISIBILITY_TIMEOUT_S": "soon"}),
        (["worker", "--broker", "redis://127.0.0.1:1/0"], {"IRBENCH_ACK_FLUSH_S": "fast"}),
        (["worker", "--run-slots", "-1", "--broker", "redis://127.0.0.1:1/0"], {}),
        (["worker", "--broker", "redis://127.0.0.1:1/0"], {"IRBENCH_RUN_SLOTS": "many"}),
    ):
        p = subprocess.run(irbench + argv + ["--data", str(tmp_path)], cwd=REPO, capture_output=True, text=True,
                           timeout=60, env={**_env(), **env})
        assert p.returncode == 2, p.stderr
        assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr, p.stderr


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith("IRBENCH_")}


def test_messages_a_dead_consumer_took_come_back_after_the_visibility_timeout(tmp_path: Path) -> None:
    """No orchestrator runs while this happens, so nothing but the broker's redelivery (after
    the worker's 2 s visibility timeout; kombu looks every 10 s) can bring the runs back: with
    the default 10800 s they would stay in ``unacked`` and the wait below would time out."""
    with RedisServer() as srv, sim({"vt-a": SimModel(latency_ms_median=1)}) as s:
        prepared = prepare(load_campaign(make_campaign(tmp_path, "vt", s.base_url, {"vt-a": {}}, prompts=3, runs=2)))
        store = RunStore(tmp_path / "data")
        # dispatch, then give up at once: no worker yet, the messages wait in the queue
        summary = run_campaign_celery(prepared, store, srv.url,
                                      CeleryRun(timeout_s=1.0, options=CeleryOptions(analyze_on_complete=False)))
        assert summary.interrupted and summary.executed == 0
        taker = subprocess.Popen([sys.executable, "-c", TAKER, srv.url, DEFAULT_QUEUE], cwd=REPO,
                                 stdout=subprocess.PIPE, text=True)
        try:
            assert taker.stdout is not None and taker.stdout.readline().split() == ["taken", "6"]
        finally:
            taker.kill()
            taker.wait(10)
        client = redis.Redis.from_url(srv.url)
        assert client.llen(DEFAULT_QUEUE) == 0 and client.hlen("unacked") == 6  # taken, never acknowledged
        env = {**WORKER_ENV, "IRBENCH_VISIBILITY_TIMEOUT_S": "2"}
        with CeleryWorkers(srv.url, count=1, concurrency=2, env=env):
            wait_for(lambda: stored_count(store, "vt") == 6, 45, "the six runs stored after redelivery")
        st = stats(s.base_url)
        client.close()
    assert st["vt-a"]["requests"] == 6  # each run called once
    assert len(store.read_records(campaigns=["vt"])) == 6

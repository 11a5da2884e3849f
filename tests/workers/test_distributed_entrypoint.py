"""`irbench worker`'s entry point (`workers.celery.app.start_worker`) as its own process, on its
own queue and its own redis-server: it starts, takes a campaign's runs and stores them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from deploy.redis_server import RedisServer
from orchestrator.campaign.prepared import prepare
from orchestrator.distributed.executor import CeleryOptions, CeleryRun, run_campaign_celery
from orchestrator.campaign.spec import load_campaign
from simulator.config import SimModel
from storage.runs import RunStore
from tests.support.distributed import WORKER_ENV, assert_every_run_stored, make_campaign, sim, wait_for
from tests.support.paths import REPO


WORKER_MAIN = "import sys; from workers.celery.app import WorkerCommand, start_worker; " \
    "start_worker(sys.argv[1], command=WorkerCommand(concurrency=2, queues=('irbench-sw',), hostname='sw@%h'), " \
    "data_dir=sys.argv[2])"


def test_start_worker_entry_point_on_its_own_queue(tmp_path: Path) -> None:
    live = RedisServer().start()
    models = {"t9-a": SimModel(latency_ms_median=5)}
    data = tmp_path / "data"
    proc = subprocess.Popen([sys.executable, "-c", WORKER_MAIN, live.url, str(data)], cwd=REPO,
                            env={**os.environ, **WORKER_ENV}, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=open(tmp_path / "worker.log", "wb"))
    try:
        log = tmp_path / "worker.log"
        wait_for(lambda: " ready." in log.read_text(errors="replace") or proc.poll() is not None, 60, "worker ready")
        assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
        with sim(models) as s:
            prepared = prepare(load_campaign(make_campaign(tmp_path, "t9", s.base_url, {"t9-a": {}}, prompts=2, runs=3)))
            store = RunStore(data)
            summary = run_campaign_celery(prepared, store, live.url,
                                          CeleryRun(timeout_s=60, options=CeleryOptions(
                                              queue="irbench-sw", claim_ttl_s=3.0, reconcile_interval_s=1.0)))
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        live.stop()
    assert summary.by_model == {"t9-a": {"ok": 6}}, (tmp_path / "worker.log").read_text()[-3000:]
    assert_every_run_stored(store, prepared)

"""Two ``irbench run --executor celery`` on the same campaign at once, through the CLI: each
summary counts what its own messages executed and what the other's did, the two add up to the
plan, and the store holds every run once with every call an attempt."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from deploy.celery_workers import CeleryWorkers
from deploy.redis_server import RedisServer
from simulator.config import SimModel
from storage.runs import RunStore
from tests.support.distributed import WORKER_ENV, executions_per_run, make_campaign, sim, stats, wait_for

pytestmark = pytest.mark.timeout(120)
REPO = Path(__file__).resolve().parents[2]
PLANNED = 24
STORED = re.compile(r"24 runs planned, (\d+) already stored")
SUMMARY = re.compile(r"(\d+) executed now(?: \(ok (\d+), failed (\d+)\))?(?:, (\d+) executed by another orchestrator)?")


def test_two_orchestrators_count_their_own_runs_and_each_others(tmp_path: Path) -> None:
    data = tmp_path / "data"
    model = "two-a"
    env = {**WORKER_ENV, "IRBENCH_DATA": str(data)}
    with RedisServer() as srv, sim({model: SimModel(latency_ms_median=400, latency_sigma=0.05)}) as s, \
            CeleryWorkers(srv.url, count=2, concurrency=2, env=env):
        campaign = make_campaign(tmp_path, "two", s.base_url, {model: {"max_concurrency": 4}}, prompts=4, runs=6)
        argv = [sys.executable, "-m", "orchestrator.cli.app", "run", str(campaign), "--data", str(data),
                "--executor", "celery", "--broker", srv.url, "--no-progress", "--no-analyze"]
        # a few runs outstanding at a time: the second orchestrator's messages get their turn
        run_env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO), "IRBENCH_MAX_OUTSTANDING": "4"}
        procs = [subprocess.Popen([*argv, "--runs-per-message", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, cwd=REPO, env=run_env)]
        wait_for(lambda: stats(s.base_url).get(model, {}).get("requests", 0) >= 1, 30, "the first one's calls")
        procs.append(subprocess.Popen([*argv, "--runs-per-message", "2"], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, cwd=REPO, env=run_env))
        outs = [p.communicate(timeout=100) for p in procs]
        calls = stats(s.base_url)[model]["requests"]
    mine, others = [], []
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, (out, err)
        text = " ".join(out.split())
        m, before = SUMMARY.search(text), STORED.search(text)
        assert m and before, text
        own, ok, failed, by_other = int(m[1]), int(m[2] or 0), int(m[3] or 0), int(m[4] or 0)
        assert ok == own and failed == 0
        assert int(before[1]) + own + by_other == PLANNED, text  # the rest was stored during the command
        mine.append(own)
        others.append(by_other)
    assert sum(mine) == PLANNED  # each run counted once, for the orchestrator whose message ran it
    # the second one sends the runs the first has queued already, so its messages mostly find them
    # done: it says the first one's runs are not its own; the first saw every run of the second
    assert mine[0] > 0 and others[1] > 0 and others[0] == mine[1], (mine, others)
    execs = executions_per_run(RunStore(data))
    assert len(execs) == PLANNED and set(execs.values()) == {1}
    assert sum(len(r.attempts) for r in RunStore(data).read_records(campaigns=["two"])) == calls

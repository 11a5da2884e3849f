"""Two ``irbench run`` on the same campaign at once, through the CLI. On the celery executor each
summary counts what its own messages executed and what the other's did, the two add up to the
plan, and the store holds every run once with every call an attempt. On the local executor the
second waits for the first (saying so; Ctrl-C leaves it) and counts the first's runs as the
other's: no run is called twice."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.workers import CeleryWorkers
from deploy.redis_server import RedisServer
from simulator.config import SimModel
from storage.runs import RunStore
from tests.support.terminal import with_default_sigint
from tests.support.distributed import WORKER_ENV, executions_per_run, make_campaign, sim, stats, wait_for
from tests.support import forked

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]
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
        procs = [forked.popen([*argv, "--runs-per-message", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, cwd=REPO, env=run_env)]
        wait_for(lambda: stats(s.base_url).get(model, {}).get("requests", 0) >= 1, 30, "the first one's calls")
        procs.append(forked.popen([*argv, "--runs-per-message", "2"], stdout=subprocess.PIPE,
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


LOCAL_SUMMARY = re.compile(r"24 runs planned, (\d+) already stored, (\d+) executed now(?: \(ok (\d+), failed (\d+)\))?"
                           r"(?:, (\d+) executed by another orchestrator)?")


def _local_run(campaign: Path, data: Path) -> subprocess.Popen:
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO)}
    # SIGINT as a terminal gives it: a test sends Ctrl-C, and a backgrounded pytest ignores it
    argv = with_default_sigint([sys.executable, "-m", "orchestrator.cli.app", "run", str(campaign), "--data", str(data),
                                "--no-progress"])
    return forked.popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                            env=env)


def _holder_pid(data: Path, campaign: str) -> int | None:
    """The pid the campaign's lock holder wrote (``orchestrator.local.campaign_lock``), if any."""
    lock = data / "campaigns" / f"{campaign}.lock"
    text = lock.read_text() if lock.exists() else ""
    return int(text.split()[0]) if text.strip() else None


def test_two_local_orchestrators_never_call_twice_and_count_each_others_runs(tmp_path: Path) -> None:
    """The second ``irbench run`` (local executor) waits for the first, says so, then finds nothing
    left: it counts the runs the first stored meanwhile as the other's, never as its own."""
    data, model = tmp_path / "data", "two-l"
    with sim({model: SimModel(latency_ms_median=400, latency_sigma=0.05)}) as s:
        campaign = make_campaign(tmp_path, "twol", s.base_url, {model: {"max_concurrency": 2}}, prompts=4, runs=6)
        first = _local_run(campaign, data)
        # the first holds the campaign's lock and is calling: 12 rounds of 400 ms are left at most
        wait_for(lambda: _holder_pid(data, "twol") == first.pid and stats(s.base_url).get(model, {}).get("requests", 0) >= 1,
                 30, "the first one's calls")
        second = _local_run(campaign, data)
        outs = [p.communicate(timeout=100) for p in (first, second)]
        calls = stats(s.base_url)[model]["requests"]
    counts = []
    for p, (out, err) in zip((first, second), outs):
        assert p.returncode == 0, (out, err)
        m = LOCAL_SUMMARY.search(" ".join(out.split()))
        assert m, out
        before, own, ok, failed, by_other = (int(g or 0) for g in m.groups())
        assert ok == own and failed == 0 and before + own + by_other == PLANNED, out
        counts.append((before, own, by_other))
    assert counts[0] == (0, PLANNED, 0) and "another irbench run" not in outs[0][1]
    before, own, by_other = counts[1]
    assert own == 0 and by_other > 0, counts  # it started while the first was executing: it waited
    assert f"another irbench run (pid {first.pid}, since " in outs[1][1] and "this one waits" in outs[1][1], outs[1][1]
    assert calls == PLANNED  # the endpoint saw each run once
    execs = executions_per_run(RunStore(data))
    assert len(execs) == PLANNED and set(execs.values()) == {1}


def test_a_waiting_local_orchestrator_leaves_on_ctrl_c_without_a_call(tmp_path: Path) -> None:
    from orchestrator.local.campaign_lock import campaign_lock

    data, model = tmp_path / "data", "two-w"
    with sim({model: SimModel(latency_ms_median=1)}) as s:
        campaign = make_campaign(tmp_path, "twow", s.base_url, {model: {}}, prompts=2, runs=1)
        with campaign_lock(data, "twow", lambda line: None) as waited:  # another orchestrator, as far as it can tell
            assert not waited
            proc = _local_run(campaign, data)
            assert proc.stderr is not None
            line = proc.stderr.readline()  # blocks until the waiting line, or EOF if it never waits
            assert f"another irbench run (pid {os.getpid()}, since " in line and "Ctrl-C leaves" in line, line
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=30)
        assert proc.returncode == 130 and "interrupted" in err and "Traceback" not in err, (out, err)
        assert stats(s.base_url).get(model, {}).get("requests", 0) == 0
    assert RunStore(data).completed_run_ids("twow") == set()

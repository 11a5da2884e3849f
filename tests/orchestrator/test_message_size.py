"""Auto-sized broker messages (``runs_per_message`` 0, the default): the size from the live
workers' presence and the outstanding window (closed form), the presence index that finds the
workers without scanning the keyspace (real redis-server), and a campaign on real ``celery
worker`` processes with default options sending messages of the size their presence asks for —
every run called once at the endpoint and stored once."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.support.workers import CeleryWorkers
from deploy.redis_server import RedisServer
from orchestrator.campaign.prepared import prepare
from orchestrator.distributed.executor import _cancelled_records
from orchestrator.distributed.options import CeleryOptions
from orchestrator.distributed.campaign import Bundle, DistributedCampaign
from orchestrator.distributed.message_size import (
    MAX_AUTO_RUNS,
    MessageSizer,
    auto_runs_per_message,
    message_slots,
    runs_held_cap,
)
from orchestrator.campaign.spec import load_campaign
from simulator.config import SimConfig, SimModel
from simulator.server import start_background
from storage.runs import RunStore
from tests.support.campaign_files import one_endpoint, write_campaign
from tests.support.distributed import executions_per_run, stats, wait_for
from workers.celery import DEFAULT_THREADS
from workers.celery.app import make_celery_app
from workers.state.presence import PRESENCE_PREFIX, PresencePublisher, WorkerPresence, WorkerSlots, read_presence
from workers.state.connect import sync_redis
from workers.errors import ConfigError

pytestmark = pytest.mark.timeout(180)


def _presence(name: str, threads: int | None, queues: tuple[str, ...] = ("irbench",),
              run_slots: int | None = None) -> WorkerPresence:
    return WorkerPresence(name, queues, None, None, "h", 1, 0.0, threads, run_slots)


@pytest.mark.parametrize(("slots", "window", "expected"), [
    (32, 2000, 31),  # 4 workers x 8 threads, the default window: 2000 // 64
    (8, 2000, MAX_AUTO_RUNS),  # one worker: capped
    (320, 2000, 3),  # 40 workers: small messages keep every thread fed
    (32, 100, 1),  # a campaign's last runs: one each
    (32, 640, 10),
    (0, 2000, 1),  # no worker known
    (32, 0, 1),
])
def test_the_auto_size_splits_the_window_into_twice_the_workers_message_slots(slots: int, window: int,
                                                                                expected: int) -> None:
    assert auto_runs_per_message(slots, window) == expected
    if slots and window >= 2 * slots:  # the closed form: every thread one message, as many again queued
        assert expected == min(MAX_AUTO_RUNS, window // (2 * slots))
        assert expected * 2 * slots <= window


def test_message_slots_count_the_queues_consumers_and_assume_the_default_for_silent_workers() -> None:
    workers = [_presence("a", 8), _presence("b", 3), _presence("c", None), _presence("d", 50, ("other",))]
    assert message_slots(workers, "irbench") == 8 + 3 + DEFAULT_THREADS
    assert message_slots(workers, "nobody") == 0


def test_no_message_carries_more_runs_than_the_smallest_worker_can_call_with_every_thread_holding_one() -> None:
    workers = [_presence("a", 8, run_slots=2432), _presence("b", 4, run_slots=40), _presence("c", None, run_slots=24),
               _presence("old", 2), _presence("d", 1, ("other",), run_slots=1)]
    # b: 40 call slots over 4 threads; c: 24 over the default 8 threads; old and d do not count
    assert runs_held_cap(workers, "irbench") == min(40 // 4, 24 // DEFAULT_THREADS) == 3
    assert runs_held_cap(workers[:1], "irbench") == MAX_AUTO_RUNS  # 2432 // 8 = 304, above the cap
    assert runs_held_cap([_presence("tiny", 8, run_slots=3)], "irbench") == 1  # fewer slots than threads
    assert runs_held_cap(workers[3:4], "irbench") == MAX_AUTO_RUNS  # nobody says its slots
    sizer = MessageSizer(lambda: workers[:2], "irbench")
    assert sizer.size(2000) == 10  # 2000 // (2 x 12 threads) = 83, held to b's 40 // 4
    assert auto_runs_per_message(12, 2000) == 64


def test_the_sizer_reads_the_workers_at_most_every_refresh_and_keeps_the_last_figure_on_errors() -> None:
    now = [0.0]
    reads: list[float] = []
    fleet = [[_presence("a", 8)]]

    def read() -> list[WorkerPresence]:
        reads.append(now[0])
        if fleet[0] is None:
            raise redis.ConnectionError("down")
        return fleet[0]

    sizer = MessageSizer(read, "irbench", clock=lambda: now[0], refresh_s=2.0)
    assert sizer.size(2000) == 64 and reads == [0.0]
    fleet[0] = [_presence(str(i), 8) for i in range(10)]
    now[0] = 1.0
    assert sizer.size(2000) == 64 and reads == [0.0]  # not re-read within refresh_s
    now[0] = 2.5
    assert sizer.size(2000) == 2000 // 160 and len(reads) == 2
    fleet[0] = None  # Redis away
    now[0] = 5.0
    assert sizer.size(2000) == 2000 // 160 and len(reads) == 3


def test_a_negative_runs_per_message_is_a_config_error_naming_auto() -> None:
    with pytest.raises(ConfigError, match="0 for auto"):
        CeleryOptions(runs_per_message=-1)
    assert CeleryOptions().runs_per_message == 0


def test_presence_is_found_through_its_index_without_scanning_the_keyspace() -> None:
    with RedisServer() as srv:
        client = redis.Redis.from_url(srv.url)
        try:
            pipe = client.pipeline(transaction=False)
            for i in range(20_000):  # a campaign's done markers
                pipe.set(f"irbench:camp:{{c}}:done:r{i}", "ok")
            pipe.execute()
            pubs = [PresencePublisher(client, f"w{i}", ("irbench",), None, interval_s=10.0,
                                      slots=WorkerSlots(threads=4 + i, run_slots=16)) for i in range(3)]
            for p in pubs:
                p.publish_once()
            # an older worker's presence, without the slot fields, is still read
            old = {"name": "old", "queues": ["irbench"], "data_dir": None, "store_id": None, "host": "h",
                   "pid": 2, "published_at_s": time.time()}
            client.set(f"{PRESENCE_PREFIX}:old", json.dumps(old), px=600)
            client.zadd(PRESENCE_PREFIX, {"old": time.time()})
            client.config_resetstat()
            found = read_presence(client)
            calls = {k.removeprefix("cmdstat_"): v["calls"] for k, v in client.info("commandstats").items()}
            assert [(w.name, w.threads, w.run_slots) for w in found] == [
                ("old", None, None), ("w0", 4, 16), ("w1", 5, 16), ("w2", 6, 16)]
            assert "scan" not in calls and "keys" not in calls, calls
            assert sum(calls.values()) <= 3, calls  # ZRANGE, MGET (+ CONFIG RESETSTAT)
            pubs[0].stop()  # a clean stop leaves the index too
            time.sleep(0.7)  # 'old' expires by TTL; its index entry stays but reads nothing
            assert [w.name for w in read_presence(client)] == ["w1", "w2"]
            assert client.zscore(PRESENCE_PREFIX, "w0") is None
        finally:
            client.close()


@pytest.fixture(scope="module")
def workers() -> Iterator[str]:
    env = {"IRBENCH_RUN_SLOTS": "30", "IRBENCH_PRESENCE_INTERVAL_S": "0.5"}
    with RedisServer() as srv, CeleryWorkers(srv.url, count=2, concurrency=3, env=env):
        yield srv.url


def test_a_campaign_with_default_options_sends_messages_sized_to_the_live_workers(workers: str,
                                                                                    tmp_path: Path) -> None:
    client = sync_redis(workers)
    try:
        wait_for(lambda: len(read_presence(client)) == 2, 15, "both workers' presence")
        found = read_presence(client)
        assert [(w.threads, w.run_slots) for w in found] == [(3, 30), (3, 30)]  # -c 3, IRBENCH_RUN_SLOTS=30
        with start_background(SimConfig(seed=3, models={"ms-a": SimModel(latency_ms_median=5)})) as s:
            path = write_campaign(tmp_path, "ms", one_endpoint(s.base_url, "ms-a") + "max_concurrency = 8\n",
                                  runs=12, prompts=10)
            prepared = prepare(load_campaign(path))
            store = RunStore(tmp_path / "data")
            bundle = Bundle(redis=client, broker=make_celery_app(workers), store=store, clock=time.monotonic,
                            sleep=time.sleep)
            camp = DistributedCampaign(prepared, bundle, CeleryOptions(analyze_on_complete=False), _cancelled_records)
            summary = camp.run(timeout_s=120)
            calls = stats(s.base_url)["ms-a"]["requests"]
    finally:
        client.close()
    runs = len(prepared.tasks)
    assert not summary.interrupted and summary.executed == runs == 120
    # 120 runs (all fit the window) over twice the 6 message slots of 2 workers x 3 threads (and
    # no more than each worker's 30 call slots over its 3 threads)
    k = min(runs // (2 * 6), 30 // 3)
    assert k == 10 and camp.publisher.message_sizes == Counter({k: runs // k}), camp.publisher.message_sizes
    # both sides: the endpoint got each run once, the store holds each run once
    assert calls == runs
    assert executions_per_run(store) == Counter({t.run_id: 1 for t in prepared.tasks})

"""The worker process's garbage-collector policy (``workers.gc_policy``): the start-up heap frozen,
the young generation collected every ``gc_young_threshold`` allocations, cyclic garbage still
collected without anyone calling ``gc.collect()``; a real ``WorkerRuntime`` applies it."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from deploy.redis_server import RedisServer
from workers.celery.runtime import WorkerClients, WorkerRuntime, WorkerSettings
from workers.errors import ConfigError
from workers.gc_policy import tune_collector, tuned_collector


@pytest.fixture
def collector() -> Iterator[None]:
    """Whatever a test does to the collector is undone (the rest of the suite runs on defaults)."""
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def _cycle() -> weakref.ref[_Node]:
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    return weakref.ref(a)


def test_zero_leaves_the_collector_alone(collector: None) -> None:
    before = gc.get_threshold(), gc.get_freeze_count()
    assert tune_collector(0) is False
    assert (gc.get_threshold(), gc.get_freeze_count()) == before


def test_the_start_up_heap_is_frozen_and_young_cycles_are_still_collected(collector: None) -> None:
    survivor = _cycle()  # alive (reachable through the frame) when the heap is frozen
    keep = survivor()
    assert tune_collector(5000) is True
    assert gc.get_threshold() == (5000, 20, 10)
    assert gc.get_freeze_count() > 1000  # this process's imports, at least
    del keep
    young = _cycle()
    junk = [[] for _ in range(20000)]  # > the threshold of net allocations: a young collection runs
    del junk
    assert young() is None  # collected by the collector itself, no gc.collect() here
    assert survivor() is not None  # frozen: never walked, so its cycle stays (start-up objects live on anyway)


def test_a_worker_runtime_applies_its_settings(collector: None) -> None:
    with RedisServer() as srv:
        settings = WorkerSettings(redis_url=srv.url, gc_young_threshold=12345)
        rt = WorkerRuntime(settings, WorkerClients.connect(srv.url), threads=2)
        try:
            assert gc.get_threshold()[0] == 12345
            assert gc.get_freeze_count() > 1000
        finally:
            rt.close()


def test_a_negative_threshold_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="IRBENCH_GC_YOUNG_THRESHOLD"):
        WorkerSettings.from_env("redis://127.0.0.1:1/0", {"IRBENCH_GC_YOUNG_THRESHOLD": "-1"})
    with pytest.raises(ConfigError, match="not a number"):
        WorkerSettings.from_env("redis://127.0.0.1:1/0", {"IRBENCH_GC_YOUNG_THRESHOLD": "lots"})


def test_a_tuned_block_puts_the_collector_back(collector: None) -> None:
    gc.unfreeze()
    before = gc.get_threshold()
    with tuned_collector(7000):
        assert gc.get_threshold() == (7000, 20, 10) and gc.get_freeze_count() > 1000
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
    gc.freeze()  # someone else's freeze: it is theirs to undo
    frozen = gc.get_freeze_count()
    with tuned_collector(7000):
        pass
    assert gc.get_freeze_count() >= frozen > 0
    with tuned_collector(0):
        assert gc.get_threshold() == before


def test_the_local_executor_tunes_the_collector_for_a_long_execution_only(collector: None, tmp_path) -> None:
    """``run_local`` (what ``irbench run`` executes) runs a long execution with the policy and
    puts the collector back afterwards; a short one (below the writer process's threshold) is
    left alone. Seen from inside: the thresholds whenever a run starts or ends (its progress
    callback), over real loopback HTTP."""
    import asyncio

    from orchestrator.local.executor import LocalOptions, run_local
    from storage.runs import RunStore
    from tests.orchestrator.test_local_executor import _Counts, _serve, _tasks

    gc.unfreeze()
    before = gc.get_threshold()
    options = LocalOptions(writer_process_min_runs=40, gc_young_threshold=9000)

    def run(n: int, name: str) -> tuple[int, int, set[int]]:
        counts, seen = _Counts(), set()

        async def main() -> int:
            server = await _serve(counts, 0.0)
            url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
            try:
                summary = await run_local(_tasks(url, n, concurrency=4), RunStore(tmp_path / name, fsync=False),
                                          secrets={}, options=options,
                                          on_progress=lambda model, state: seen.add(gc.get_threshold()[0]))
                return summary.executed
            finally:
                server.close()
                await server.wait_closed()

        return asyncio.run(main()), counts.requests, seen

    assert run(50, "long") == (50, 50, {9000})
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
    assert run(20, "short") == (20, 20, {before[0]})


def test_the_distributed_orchestrator_reads_the_same_variable() -> None:
    from orchestrator.distributed.options import CeleryOptions

    assert CeleryOptions().gc_young_threshold == WorkerSettings(redis_url="redis://unused").gc_young_threshold
    assert CeleryOptions().with_env({"IRBENCH_GC_YOUNG_THRESHOLD": "0"}).gc_young_threshold == 0
    with pytest.raises(ConfigError, match="IRBENCH_GC_YOUNG_THRESHOLD"):
        CeleryOptions().with_env({"IRBENCH_GC_YOUNG_THRESHOLD": "-5"})

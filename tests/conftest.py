"""Shared fixtures: paths, the simulated endpoint on a real loopback socket."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.paths import ARTIFACT, REPO

EXAMPLES = REPO / "examples"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    """A skip is a failure: a missing service or data set must show in red. The one optional lane
    is ``real_model`` (the [real] extra), and only while IRBENCH_REQUIRE_REAL is not 1."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]  # pluggy's hookwrapper result
    if not report.skipped or hasattr(report, "wasxfail"):
        return
    optional = "real_model" in item.keywords and os.environ.get("IRBENCH_REQUIRE_REAL") != "1"
    if not optional:
        report.outcome = "failed"
        report.longrepr = f"skipped, and this suite allows no skips: {report.longrepr}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Files holding a ``slow`` test run first. ``make test`` hands whole files to xdist's workers
    in collection order (``--dist loadfile --no-loadscope-reorder``): a long file that started
    last would leave the other workers idle while it finishes."""
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow)  # stable: each file keeps its order


@pytest.fixture(scope="session")
def examples_dir() -> Path:
    return EXAMPLES


@pytest.fixture(scope="session")
def artifact_dir() -> Path:
    assert ARTIFACT.is_dir(), (f"the study's artifact is expected at {ARTIFACT}: clone beside the project's shared/ "
                               "folder, or set IRBENCH_SHARED_DIR to the folder that holds paper-artifact/")
    return ARTIFACT


@pytest.fixture(autouse=True)
def _structlog_config_per_test() -> Iterator[None]:
    """Each test starts with the structlog configuration the one before it found: a test that
    configured logging onto its own captured stream (closed once it ends) must not leave the
    next test's log lines going there ("I/O operation on closed file")."""
    import structlog

    before = structlog.get_config()
    yield
    structlog.configure(**before)


@pytest.fixture(autouse=True)
def _collector_as_found() -> Iterator[None]:
    """Each test starts with the garbage collector the one before it found: a worker runtime run
    in-process freezes the heap and raises the thresholds for good (``workers.gc_policy``), as a
    worker process should, and a later test that checks the collector must not see that."""
    import gc

    thresholds, frozen = gc.get_threshold(), gc.get_freeze_count()
    yield
    gc.set_threshold(*thresholds)
    if frozen == 0 and gc.get_freeze_count():
        gc.unfreeze()


@pytest.fixture(scope="module")
def redis_client() -> Iterator[object]:
    """A sync client (``workers.state.connect.sync_redis``) on a private redis-server that
    lives as long as the test module."""
    from deploy.redis_server import RedisServer
    from workers.state.connect import sync_redis

    with RedisServer() as srv:
        c = sync_redis(srv.url)
        yield c
        c.close()


@pytest.fixture
def sim_server() -> Iterator[object]:
    """A fresh simulator (examples/sim.toml) on a free port, with its own counters."""
    from simulator.config import load_sim_config
    from simulator.server import start_background

    with start_background(load_sim_config(EXAMPLES / "sim.toml")) as sim:
        yield sim

from tests.support.objectstore import s3_env, s3_location, s3_server  # noqa: E402,F401  (fixtures, found by name)

"""The distributed faults on a bucket store (``--data s3://…``): a Redis restart mid-campaign
and the object store unreachable mid-campaign. Real components (``tests.support.bucket_cluster``:
SeaweedFS, redis-server with AOF, two workers that share no disk, the simulator); every planned
run stored exactly once and every call the simulator received stored as an attempt."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator.campaign.prepared import prepare
from orchestrator.campaign.spec import load_campaign
from simulator.config import SimModel
from tests.support.bucket_cluster import (  # noqa: F401 - fixtures
    BucketCluster,
    bucket_cluster,
    bucket_live,
    orchestrate,
    reader,
    settle,
)
from tests.support.distributed import (
    assert_calls_equal_attempts,
    assert_every_run_stored,
    make_campaign,
    sim,
    stats,
    wait_for,
)

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]

MODELS = ("a", "b")


def _calls(base_url: str, name: str) -> int:
    st = stats(base_url)
    return sum(st.get(f"{name}-{m}", {}).get("requests", 0) for m in MODELS)


def _check_stored(cluster: BucketCluster, name: str, camp: Path, base_url: str, tmp_path: Path,
                  monkeypatch: pytest.MonkeyPatch) -> dict:
    """Once every execution is uploaded: each planned run once in the bucket, calls == attempts."""
    settle(cluster, name)
    st = stats(base_url)
    store = reader(cluster.s3, cluster.url, tmp_path / "cache-reader", monkeypatch)
    assert_every_run_stored(store, prepare(load_campaign(camp)))
    models = [f"{name}-{m}" for m in MODELS]
    assert_calls_equal_attempts(store, name, st, models)  # no worker died: every call is stored
    return {m: st[m]["requests"] for m in models}


def _under_way(cluster: BucketCluster, tmp_path: Path, name: str, base_url: str) -> tuple[Path, Any]:
    """A campaign of 80 runs on the bucket, its orchestrator started and 20 calls made; the
    campaign file and the orchestrator process."""
    camp = make_campaign(tmp_path, name, base_url, {f"{name}-{m}": {} for m in MODELS}, prompts=10, runs=4)
    orch = orchestrate(cluster, camp, tmp_path / "cache-orch")
    wait_for(lambda: orch.poll() is None and _calls(base_url, name) >= 20 or orch.poll() is not None, 60,
             "calls under way")
    assert orch.poll() is None, orch.communicate()
    return camp, orch


def test_redis_restart_mid_campaign_on_a_bucket(bucket_live: BucketCluster, tmp_path: Path, monkeypatch) -> None:  # noqa: F811
    name = "br"
    with sim({f"{name}-{m}": SimModel(latency_ms_median=60, latency_sigma=0.1) for m in MODELS}) as s:
        camp, orch = _under_way(bucket_live, tmp_path, name, s.base_url)
        bucket_live.redis.restart(kill=True)  # SIGKILL: AOF (fsync always) carries the campaign and the upload log
        at_restart, t_restart = _calls(s.base_url, name), time.monotonic()
        out, err = orch.communicate(timeout=120)
        recovery_s = time.monotonic() - t_restart
        assert orch.returncode == 0, (out, err)
        calls = _check_stored(bucket_live, name, camp, s.base_url, tmp_path, monkeypatch)
    assert at_restart < 80, "the restart came too late to test anything"
    print(f"Redis SIGKILL+restart on a bucket at call {at_restart}: finished {recovery_s:.1f} s later; calls {calls}")
    assert recovery_s < 30, recovery_s


def _unreachable(s3, how: str, outage_s: float, still_running) -> None:  # type: ignore[no-untyped-def]
    """The object store out of reach for ``outage_s``: "frozen" (SIGSTOP: connections open and
    requests hang, then complete) or "down" (SIGKILL: connections refused, then a restart on
    the same ports and data)."""
    if how == "frozen":
        s3.send_signal(signal.SIGSTOP)
    else:
        s3.stop(kill=True)
    try:
        time.sleep(outage_s)
        still_running()
    finally:
        if how == "frozen":
            s3.send_signal(signal.SIGCONT)
        else:
            s3.start()


# the 30 s outages are the soak lane; CI runs a 5 s one of each kind (the same paths: requests
# that hang until the store answers, and refused ones retried with a backoff)
@pytest.mark.parametrize(("how", "outage_s"), [("frozen", 5.0), ("down", 5.0),
                                               pytest.param("frozen", 30.0, marks=pytest.mark.soak),
                                               pytest.param("down", 30.0, marks=pytest.mark.soak)])
def test_object_store_unreachable_mid_campaign(bucket_live: BucketCluster, tmp_path: Path, monkeypatch, how: str,  # noqa: F811
                                               outage_s: float) -> None:
    name = f"bo-{how}{int(outage_s)}"
    with sim({f"{name}-{m}": SimModel(latency_ms_median=60, latency_sigma=0.1) for m in MODELS}) as s:
        camp, orch = _under_way(bucket_live, tmp_path, name, s.base_url)
        at_stop = _calls(s.base_url, name)

        def still_running() -> None:
            assert orch.poll() is None, "the campaign finished while no upload could reach the bucket"

        _unreachable(bucket_live.s3, how, outage_s, still_running)
        t_resume = time.monotonic()
        out, err = orch.communicate(timeout=120)
        recovery_s = time.monotonic() - t_resume
        assert orch.returncode == 0, (out, err)
        calls = _check_stored(bucket_live, name, camp, s.base_url, tmp_path, monkeypatch)
    assert at_stop < 80, "the outage came too late to test anything"
    print(f"object store {how} {outage_s:g} s from call {at_stop}: finished {recovery_s:.1f} s after it was back; "
          f"calls {calls}")
    assert recovery_s < 30, recovery_s

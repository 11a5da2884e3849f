"""``run_message`` when the message's data directory cannot hold a spool: no run is claimed or
called, each is counted as a task failure with the error's text and parked in the delayed set,
through the same Redis batch the loop's runs finish with; real ``WorkerRuntime``, real
redis-server, a counting endpoint on loopback that must see nothing."""

from __future__ import annotations

from pathlib import Path

from deploy.redis_server import RedisServer
from tests.support.raw_http import serve_fixed, serve_in_thread
from workers.state.campaign_state import CampaignState
from workers.celery.runtime import RuntimeHolder, WorkerSettings
from workers.celery.tasks import run_message
from workers.runtask import EndpointRef, ModelLimits, RunTask


def _task(run_id: str, base_url: str) -> RunTask:
    return RunTask(run_id=run_id, campaign="wm", panel="wm", model="m", run_index=0,
                   endpoint=EndpointRef(name="ep", base_url=base_url), prompt_sha256="a" * 64,
                   prompt_name="p", user_message="hello", instruction_version="v", instruction_sha256="b" * 64,
                   limits=ModelLimits(max_concurrency=4))


def test_runs_of_a_message_whose_data_dir_is_broken_fail_unclaimed_and_uncalled(tmp_path: Path) -> None:
    requests: list[bytes] = []
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the store should be")
    # a real endpoint on loopback: a run that got this far would reach it
    endpoint = serve_in_thread(lambda: serve_fixed(b"HTTP/1.1 500 x\r\ncontent-length: 0\r\n\r\n",
                                                   on_request=requests.append))
    with endpoint as base_url, RedisServer() as srv:
        holder = RuntimeHolder(srv.url, WorkerSettings(redis_url=srv.url))
        try:
            tasks = [_task(f"r{i}", base_url) for i in range(3)]
            state = CampaignState(holder.get().redis, "wm", prefix="irbench:camp")
            state.queued.record(t.run_id for t in tasks)
            assert run_message(holder, "w", tasks, str(blocker / "data")) == ["failed"] * 3
            client = holder.get().redis
            fails = {k.decode(): int(v) for k, v in client.hgetall(state.key("fails")).items()}
            texts = {v.decode() for v in client.hgetall(state.key("fail_text")).values()}
            assert fails == {"r0": 1, "r1": 1, "r2": 1}
            assert len(texts) == 1 and "not-a-dir" in texts.pop()
            assert state.delayed.count() == 3 and client.hlen(state.key("running")) == 0
            assert not client.keys(state.key("claim:*"))
        finally:
            holder.close()
    assert requests == []  # nothing was called

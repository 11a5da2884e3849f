"""The one Redis retry loop (``workers.state.redis_retry``), sync and on an event loop: a
transient error is retried with a doubling back-off until the call succeeds, and re-raised once
the budget would be exceeded; anything else is not retried."""

from __future__ import annotations

import asyncio

import pytest
from structlog.testing import capture_logs
from redis.exceptions import ConnectionError as RedisConnectionError

from workers.state.redis_retry import awith_retry, with_retry


class _Flaky:
    def __init__(self, failures: int, exc: Exception | None = None) -> None:
        self.failures, self.calls = failures, 0
        self.exc = exc or RedisConnectionError("Connection refused")

    def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.exc
        return "ok"


def test_sync_retries_with_a_doubling_backoff_then_gives_up_past_the_budget() -> None:
    now, waits = [0.0], []

    def sleep(s: float) -> None:
        waits.append(s)
        now[0] += s

    fn = _Flaky(3)
    with capture_logs() as logs:  # (and nothing written to whatever stream an earlier test left configured)
        assert with_retry(fn, "t", budget_s=10, sleep=sleep, clock=lambda: now[0]) == "ok" and fn.calls == 4
    assert waits == [0.1, 0.2, 0.4]
    assert [(e["event"], e["what"], e["retry_in_s"]) for e in logs] == [("redis_unavailable_retrying", "t", w) for w in waits]
    waits.clear()
    fn = _Flaky(100)
    with capture_logs(), pytest.raises(RedisConnectionError):
        with_retry(fn, "t", budget_s=1.0, max_backoff_s=0.4, sleep=sleep, clock=lambda: now[0])
    assert waits == [0.1, 0.2, 0.4] and fn.calls == 4  # 0.7 s waited; one more 0.4 s would pass 1.0


def test_async_retries_on_the_loop_and_gives_up_past_the_budget() -> None:
    async def main() -> tuple[str, int, int]:
        ok = _Flaky(2)

        async def call_ok() -> str:
            return ok()

        got = await awith_retry(call_ok, "t", budget_s=5)
        never = _Flaky(100)

        async def call_never() -> str:
            return never()

        with pytest.raises(RedisConnectionError):
            await awith_retry(call_never, "t", budget_s=0.25)
        return got, ok.calls, never.calls

    with capture_logs() as logs:
        assert asyncio.run(main()) == ("ok", 3, 2)
    assert len(logs) == 3  # two retries of the first call, one of the second  # waits 0.1 then 0.2 > 0.25 left: raised after 2 calls


def test_a_non_transient_error_is_not_retried() -> None:
    fn = _Flaky(1, ValueError("a bug"))
    with pytest.raises(ValueError):
        with_retry(fn, "t", budget_s=10, sleep=lambda s: None)
    assert fn.calls == 1

"""A valid ``RunRecord`` for tests: ``make_record`` (one knob per field that tests vary) and
``full_record`` (every optional field set), shared by the storage tests and their neighbours."""

from __future__ import annotations

import datetime as dt

from storage.records import Attempt, Outcome, ParseOutcome, RunRecord


UTC = dt.timezone.utc
DAY1 = dt.date(2026, 3, 1)
DAY2 = dt.date(2026, 3, 2)
DAY3 = dt.date(2026, 3, 3)


def make_record(
    i: int,
    *,
    day: dt.date = DAY1,
    model: str | None = None,
    campaign: str = "camp",
    run_id: str | None = None,
    second: float | None = None,
    **over: object,
) -> RunRecord:
    """A valid RunRecord; ``second`` offsets measured_at within ``day`` (default: i)."""
    at = dt.datetime.combine(day, dt.time(0), UTC) + dt.timedelta(seconds=i if second is None else second)
    fields: dict[str, object] = dict(
        run_id=run_id or f"run-{i:06d}",
        campaign=campaign,
        panel="panel-a",
        prompt_sha256="a" * 64,
        prompt_name=f"prompt-{i % 7}",
        model=model or f"model-{i % 3}",
        endpoint="http://127.0.0.1:9/v1",
        wire_format="openai",
        run_index=i,
        instruction_version="v1",
        instruction_sha256="b" * 64,
        measured_at=at,
        measurement_date=day,
        outcome=Outcome.OK,
        attempts=[Attempt(attempt=1, outcome=Outcome.OK, started_at=at, latency_ms=12.5)],
    )
    fields.update(over)
    return RunRecord(**fields)  # type: ignore[arg-type]


def full_record() -> RunRecord:
    """Every optional field set to a non-default value."""
    start = dt.datetime(2026, 3, 1, 23, 59, 59, 123456, tzinfo=dt.timezone(dt.timedelta(hours=-2)))
    return make_record(
        1,
        prompt_license="CC-BY-4.0",
        prompt_source="https://example.org/p",
        budget_max_tokens=512,
        max_tokens=512,
        temperature=0.7,
        reasoning_enabled=True,
        structured_output=True,
        connect_timeout_s=1.5,
        read_timeout_s=30.0,
        total_timeout_s=60.0,
        measured_at=start,
        measurement_date=dt.date(2026, 3, 2),  # the UTC date of `start`
        date_is_window=True,
        outcome=Outcome.RATE_LIMITED,
        cancel_reason="retired",
        attempts=[
            Attempt(
                attempt=1, outcome=Outcome.RATE_LIMITED, started_at=start, latency_ms=3.25,
                status_code=429, bytes_received=17, retry_after_s=2.5, error="slow down ünïcode",
            ),
            Attempt(
                attempt=2, outcome=Outcome.OK, started_at=start + dt.timedelta(seconds=3),
                latency_ms=900.0, status_code=200, bytes_received=4096,
            ),
        ],
        latency_ms=900.0,
        status_code=200,
        finish_reason="stop",
        retired_on="2026-06-01",
        response_text='{"nodes": []}',
        reasoning_text="thinking…",
        answer_chars=13,
        reasoning_chars=9,
        prompt_tokens=100,
        completion_tokens=20,
        reasoning_tokens=5,
        parse_outcome=ParseOutcome.REPAIRED,
        parse_repairs=["trailing_comma", "fence"],
        ir_json='{"nodes":[]}',
        node_ids=["a", "b"],
        node_count=2,
        duplicate_id_count=1,
        irbench_version="0.1.0",
    )

"""The Celery beat task running availability checks (``workers.availability``) on a schedule.

Scheduling (one check per interval however many beats run): beat sends
``irbench.availability_check`` every ``interval_s`` with a message expiry of one interval (a
check queued while workers were down is dropped, not replayed late); the task takes the
interval's *slot* ``floor(now / interval_s)`` with a Redis ``SET NX EX`` lock, so a second beat's
message for the same slot is skipped, and it stores its rows under the file stem
``scheduled-<slot>`` (first writer wins) as a second guard.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from storage.availability import AvailabilityStore
from storage.clock import utc_now
from workers.availability import CheckSettings, CheckTarget, check_availability
from workers.errors import ConfigError
from workers.runtask import EndpointRef, TimeoutPolicy


AVAILABILITY_TASK_NAME = "irbench.availability_check"
BEAT_ENTRY = "irbench-availability-check"
LOCK_PREFIX = "irbench:availability:"


def targets_to_json(targets: Sequence[CheckTarget]) -> list[dict[str, Any]]:
    """JSON-serialisable targets (endpoint refs name key *variables*, never keys)."""
    return [{"endpoint": t.endpoint.model_dump(mode="json"), "models": list(t.models)} for t in targets]


def targets_from_json(data: Sequence[Mapping[str, Any]]) -> list[CheckTarget]:
    try:
        return [CheckTarget(EndpointRef.model_validate(d["endpoint"]), tuple(d["models"])) for d in data]
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(
            f"availability targets must be a list of {{'endpoint': {{name, base_url, wire_format, api_key_env}}, "
            f"'models': [...]}}: {exc}"
        ) from exc


def settings_to_json(settings: CheckSettings) -> dict[str, Any]:
    return {"max_tokens": settings.max_tokens, "message": settings.message,
            "timeouts": settings.timeouts.model_dump(mode="json"), "concurrency": settings.concurrency}


def settings_from_json(data: Mapping[str, Any] | None) -> CheckSettings:
    if not data:
        return CheckSettings()
    return CheckSettings(max_tokens=int(data["max_tokens"]), message=str(data["message"]),
                         timeouts=TimeoutPolicy.model_validate(data["timeouts"]), concurrency=int(data["concurrency"]))


def slot_of(when: dt.datetime, interval_s: float) -> int:
    """The interval a check belongs to: ``floor(unix time / interval_s)``."""
    return math.floor(when.timestamp() / interval_s)


@dataclass(frozen=True)
class ScheduledCheck:
    """What the beat asks for (its message's arguments): check ``targets`` every ``interval_s``
    seconds with ``settings``, storing the rows under ``data_dir``."""

    targets: Sequence[CheckTarget]
    data_dir: Path
    interval_s: float
    settings: CheckSettings = CheckSettings()


def run_scheduled_check(
    redis_client: Any,
    check: ScheduledCheck,
    *,
    now: Callable[[], dt.datetime] = utc_now,
    secrets: Mapping[str, str] | None = None,
    owner: str = "",
) -> dict[str, Any]:
    """Run ``check`` for the current slot unless another process already took the slot.

    Returns ``{"slot", "skipped": bool, "rows", "statuses"}``. The slot lock lives for two
    intervals (``SET NX EX``); skips are counted under ``irbench:availability:skipped``.
    """
    interval_s = check.interval_s
    if interval_s <= 0:
        raise ConfigError(f"interval_s must be > 0 s, got {interval_s}")
    checked_at = now()
    slot = slot_of(checked_at, interval_s)
    key = f"{LOCK_PREFIX}slot:{interval_s:g}:{slot}"
    if not redis_client.set(key, owner or f"pid-{os.getpid()}", nx=True, ex=max(1, math.ceil(2 * interval_s))):
        redis_client.incr(f"{LOCK_PREFIX}skipped")
        return {"slot": slot, "skipped": True, "rows": 0, "statuses": {}}
    records = check_availability(check.targets, AvailabilityStore(check.data_dir), now=lambda: checked_at,
                                 secrets=secrets, settings=check.settings, stem=f"scheduled-{slot}")
    statuses: dict[str, int] = {}
    for r in records:
        statuses[r.status.value] = statuses.get(r.status.value, 0) + 1
    return {"slot": slot, "skipped": False, "rows": len(records), "statuses": statuses}


def register_availability_tasks(app: Any) -> None:
    """Register ``irbench.availability_check`` on a Celery app (arguments are JSON only)."""
    from workers.state.connect import sync_redis

    @app.task(name=AVAILABILITY_TASK_NAME, ignore_result=True, shared=False)
    def availability_check(targets: list[dict], data_dir: str, interval_s: float,
                           settings: dict | None = None) -> dict:
        client = sync_redis(app.conf.broker_url)
        try:
            check = ScheduledCheck(targets_from_json(targets), Path(data_dir), float(interval_s),
                                   settings=settings_from_json(settings))
            return run_scheduled_check(client, check)
        finally:
            client.close()


def configure_availability_beat(
    app: Any, targets: Sequence[CheckTarget], data_dir: str | Path, *, interval_s: float = 86400.0,
    settings: CheckSettings = CheckSettings(),
) -> None:
    """Add the periodic check to ``app.conf.beat_schedule`` (daily by default).

    The message expires after one interval, so a check queued while no worker ran is dropped
    instead of executed late (the next interval checks again).
    """
    if interval_s <= 0:
        raise ConfigError(f"availability interval must be > 0 s, got {interval_s}")
    schedule = dict(app.conf.beat_schedule or {})
    schedule[BEAT_ENTRY] = {
        "task": AVAILABILITY_TASK_NAME,
        "schedule": float(interval_s),
        "kwargs": {"targets": targets_to_json(targets), "data_dir": str(data_dir), "interval_s": float(interval_s),
                   "settings": settings_to_json(settings)},
        "options": {"expires": float(interval_s)},
    }
    app.conf.beat_schedule = schedule


def beat_settings_from_env(environ: Mapping[str, str]) -> tuple[list[CheckTarget], str, float] | None:
    """``IRBENCH_AVAILABILITY_TARGETS`` (a JSON file of targets), ``IRBENCH_DATA`` and
    ``IRBENCH_AVAILABILITY_INTERVAL_S`` (default 86400); ``None`` when no targets file is set."""
    path = environ.get("IRBENCH_AVAILABILITY_TARGETS")
    if not path:
        return None
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"IRBENCH_AVAILABILITY_TARGETS={path}: cannot read a JSON list of targets ({exc})") from exc
    data_dir = environ.get("IRBENCH_DATA")
    if not data_dir:
        raise ConfigError("IRBENCH_DATA is not set; the availability check needs the dataset root")
    try:
        interval = float(environ.get("IRBENCH_AVAILABILITY_INTERVAL_S", "86400"))
    except ValueError as exc:
        raise ConfigError(f"IRBENCH_AVAILABILITY_INTERVAL_S must be seconds: {exc}") from exc
    return targets_from_json(data), data_dir, interval

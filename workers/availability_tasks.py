"""Executing availability checks (the minimal call per model) and the Celery beat task that
runs them on a schedule.

Statuses (``../shared/spec/failures.md``), from the minimal call (a tiny ``max_tokens``, so a
``truncated`` 2xx still means the model answers):

==============  =================================================================
available       any 2xx answer (``listed`` says whether the listing names it)
retired         HTTP 410; ``retired_on`` and ``reference`` parsed from the body
not_listed      HTTP 404 and the endpoint's listing does not name the model
not_found       HTTP 404 although the listing names it (or the listing failed)
unknown_model   a gateway's 400/404 saying it routes no such model (its message is kept)
auth_error      HTTP 401/403 (the key is never echoed)
timeout         connect, read or total timeout of the minimal call
error           anything else (5xx, 429, connection refused, malformed answer)
==============  =================================================================

Scheduling (one check per interval however many beats run): beat sends
``irbench.availability_check`` every ``interval_s`` with a message expiry of one interval (a
check queued while workers were down is dropped, not replayed late); the task takes the
interval's *slot* ``floor(now / interval_s)`` with a Redis ``SET NX EX`` lock, so a second beat's
message for the same slot is skipped, and it stores its rows under the file stem
``scheduled-<slot>`` (first writer wins) as a second guard.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from storage.availability import Availability, AvailabilityRecord, AvailabilityStore
from storage.clock import utc_now
from workers.errors import (
    AuthFailed,
    ConfigError,
    ConnectTimeout,
    ModelNotFound,
    ModelRetired,
    ProviderError,
    ReadTimeout,
    TotalTimeout,
    UnknownModel,
)
from workers.providers.base import ChatRequest, Provider
from workers.providers.registry import make_http_client, make_provider
from workers.runtask import EndpointRef, TimeoutPolicy

MESSAGE_CHARS = 500


@dataclass(frozen=True)
class CheckTarget:
    """Models to check on one endpoint."""

    endpoint: EndpointRef
    models: tuple[str, ...]


@dataclass(frozen=True)
class CheckSettings:
    """The minimal call: ``max_tokens`` tokens of an answer to ``message``; per-call deadlines;
    at most ``concurrency`` calls in flight per endpoint."""

    max_tokens: int = 5
    message: str = "hi"
    timeouts: TimeoutPolicy = field(
        default_factory=lambda: TimeoutPolicy(connect_timeout_s=10.0, read_timeout_s=60.0, total_timeout_s=60.0)
    )
    concurrency: int = 4


def _status_of(exc: ProviderError, listed: bool | None) -> Availability:
    if isinstance(exc, ModelRetired):
        return Availability.RETIRED
    if isinstance(exc, UnknownModel):
        return Availability.UNKNOWN_MODEL
    if isinstance(exc, ModelNotFound):
        return Availability.NOT_LISTED if listed is False else Availability.NOT_FOUND
    if isinstance(exc, AuthFailed):
        return Availability.AUTH_ERROR
    if isinstance(exc, (ConnectTimeout, ReadTimeout, TotalTimeout)):
        return Availability.TIMEOUT
    return Availability.ERROR


async def check_endpoint(
    provider: Provider, target: CheckTarget, settings: CheckSettings, checked_at: dt.datetime
) -> list[AvailabilityRecord]:
    """List ``target``'s endpoint and make one minimal call per model (concurrently)."""
    listing: set[str] | None
    try:
        listing = set(await provider.list_models(settings.timeouts))
    except ProviderError:
        listing = None  # the per-model calls still say what is wrong
    gate = asyncio.Semaphore(max(settings.concurrency, 1))

    async def one(model: str) -> AvailabilityRecord:
        listed = None if listing is None else model in listing
        common = dict(
            checked_at=checked_at, endpoint=target.endpoint.name, base_url=target.endpoint.base_url,
            model=model, listed=listed,
        )
        request = ChatRequest(model=model, user_message=settings.message, timeouts=settings.timeouts,
                              max_tokens=settings.max_tokens, temperature=0.0)
        async with gate:
            try:
                reply = await provider.complete(request)
            except ProviderError as exc:
                retired_on = getattr(exc, "retired_on", None)
                reference = getattr(exc, "reference", None)
                return AvailabilityRecord(
                    **common, status=_status_of(exc, listed), http_status=exc.status_code,
                    latency_ms=exc.latency_ms, retired_on=retired_on, reference=reference,
                    message=str(exc)[:MESSAGE_CHARS],
                )
        return AvailabilityRecord(
            **common, status=Availability.AVAILABLE, http_status=reply.status_code, latency_ms=reply.latency_ms,
            message=None if listed is not False else "answers, but the endpoint's listing does not name it",
        )

    return list(await asyncio.gather(*(one(m) for m in target.models)))


def check_availability(
    targets: Sequence[CheckTarget],
    store: AvailabilityStore | None,
    *,
    now: Callable[[], dt.datetime] = utc_now,
    secrets: Mapping[str, str] | None = None,
    settings: CheckSettings = CheckSettings(),
    client: httpx.AsyncClient | None = None,
    stem: str | None = None,
) -> list[AvailabilityRecord]:
    """Check every target model once; append the rows to ``store`` (if given) and return them.

    ``secrets`` maps environment-variable names to keys (default: the process environment);
    ``now()`` stamps the check (one instant for the whole check); ``stem`` names the stored file
    (first writer wins; a scheduled check passes one per interval).
    """
    environ = os.environ if secrets is None else secrets
    checked_at = now()
    if checked_at.tzinfo is None:
        raise ConfigError("now() must return a timezone-aware UTC datetime")

    async def run() -> list[AvailabilityRecord]:
        own = client is None
        http = client or make_http_client()
        try:
            out: list[AvailabilityRecord] = []
            for target in targets:
                env = target.endpoint.api_key_env
                provider = make_provider(target.endpoint, http, environ.get(env) if env else None)
                out += await check_endpoint(provider, target, settings, checked_at)
            return out
        finally:
            if own:
                await http.aclose()

    records = asyncio.run(run())
    if store is not None:
        store.write(records, stem=stem)
    return records




# ------------------------------------------------------------------ scheduled checks (Celery beat)

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


def run_scheduled_check(
    redis_client: Any,
    targets: Sequence[CheckTarget],
    data_dir: Path,
    interval_s: float,
    *,
    now: Callable[[], dt.datetime] = utc_now,
    secrets: Mapping[str, str] | None = None,
    settings: CheckSettings = CheckSettings(),
    owner: str = "",
) -> dict[str, Any]:
    """Run the check of the current slot unless another process already took the slot.

    Returns ``{"slot", "skipped": bool, "rows", "statuses"}``. The slot lock lives for two
    intervals (``SET NX EX``); skips are counted under ``irbench:availability:skipped``.
    """
    if interval_s <= 0:
        raise ConfigError(f"interval_s must be > 0 s, got {interval_s}")
    checked_at = now()
    slot = slot_of(checked_at, interval_s)
    key = f"{LOCK_PREFIX}slot:{interval_s:g}:{slot}"
    if not redis_client.set(key, owner or f"pid-{os.getpid()}", nx=True, ex=max(1, math.ceil(2 * interval_s))):
        redis_client.incr(f"{LOCK_PREFIX}skipped")
        return {"slot": slot, "skipped": True, "rows": 0, "statuses": {}}
    records = check_availability(targets, AvailabilityStore(data_dir), now=lambda: checked_at, secrets=secrets,
                                 settings=settings, stem=f"scheduled-{slot}")
    statuses: dict[str, int] = {}
    for r in records:
        statuses[r.status.value] = statuses.get(r.status.value, 0) + 1
    return {"slot": slot, "skipped": False, "rows": len(records), "statuses": statuses}


def register_availability_tasks(app: Any) -> None:
    """Register ``irbench.availability_check`` on a Celery app (arguments are JSON only)."""
    import redis

    @app.task(name=AVAILABILITY_TASK_NAME, ignore_result=True, shared=False)
    def availability_check(targets: list[dict], data_dir: str, interval_s: float,
                           settings: dict | None = None) -> dict:
        client = redis.Redis.from_url(app.conf.broker_url)
        try:
            return run_scheduled_check(client, targets_from_json(targets), Path(data_dir), float(interval_s),
                                       settings=settings_from_json(settings))
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
    """``IRBENCH_AVAILABILITY_TARGETS`` (a JSON file of targets), ``IRBENCH_DATA_DIR`` and
    ``IRBENCH_AVAILABILITY_INTERVAL_S`` (default 86400); ``None`` when no targets file is set."""
    path = environ.get("IRBENCH_AVAILABILITY_TARGETS")
    if not path:
        return None
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"IRBENCH_AVAILABILITY_TARGETS={path}: cannot read a JSON list of targets ({exc})") from exc
    data_dir = environ.get("IRBENCH_DATA_DIR")
    if not data_dir:
        raise ConfigError("IRBENCH_DATA_DIR is not set; the availability check needs the dataset root")
    try:
        interval = float(environ.get("IRBENCH_AVAILABILITY_INTERVAL_S", "86400"))
    except ValueError as exc:
        raise ConfigError(f"IRBENCH_AVAILABILITY_INTERVAL_S must be seconds: {exc}") from exc
    return targets_from_json(data), data_dir, interval


def make_availability_app(broker_url: str, environ: Mapping[str, str] | None = None) -> Any:
    """The irbench Celery app: ``make_celery_app`` registers the availability task and, when
    ``IRBENCH_AVAILABILITY_TARGETS`` is set, its beat entry."""
    from workers import celery_app

    return celery_app.make_celery_app(broker_url, environ=environ)


def __getattr__(name: str) -> Any:
    """``celery -A workers.availability_tasks:app worker|beat`` builds the app on demand, so a
    plain import (the CLI's ``availability check``) never constructs one."""
    if name == "app":
        return make_availability_app(os.environ.get("IRBENCH_BROKER_URL", "redis://127.0.0.1:6379/0"))
    raise AttributeError(name)

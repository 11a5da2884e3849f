"""Executing availability checks: the minimal call per model, classified into a status.

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

The Celery beat task that runs these checks on a schedule is in
``workers.celery.availability_tasks``.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

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

        def record(status: Availability, http_status: int | None, latency_ms: float | None, *,
                   message: str | None, retired_on: str | None = None,
                   reference: str | None = None) -> AvailabilityRecord:
            return AvailabilityRecord(
                checked_at=checked_at, endpoint=target.endpoint.name, base_url=target.endpoint.base_url,
                model=model, listed=listed, status=status, http_status=http_status, latency_ms=latency_ms,
                retired_on=retired_on, reference=reference, message=message,
            )

        request = ChatRequest(model=model, user_message=settings.message, timeouts=settings.timeouts,
                              max_tokens=settings.max_tokens, temperature=0.0)
        async with gate:
            try:
                reply = await provider.complete(request)
            except ProviderError as exc:
                return record(
                    _status_of(exc, listed), exc.status_code, exc.latency_ms,
                    retired_on=getattr(exc, "retired_on", None), reference=getattr(exc, "reference", None),
                    message=str(exc)[:MESSAGE_CHARS],
                )
        return record(
            Availability.AVAILABLE, reply.status_code, reply.latency_ms,
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


"""Availability re-checks: list each endpoint's models, make one minimal call per model, store
what was found (``storage.availability``), and import the study's published audits.

Status of one model (``../shared/spec/failures.md``), from the minimal call (a tiny
``max_tokens``, so a ``truncated`` 2xx still means the model answers):

==============  =================================================================
available       any 2xx answer (``listed`` says whether the listing names it)
retired         HTTP 410; ``retired_on`` and ``reference`` parsed from the body
not_listed      HTTP 404 and the endpoint's listing does not name the model
not_found       HTTP 404 although the listing names it (or the listing failed)
auth_error      HTTP 401/403 (the key is never echoed)
timeout         connect, read or total timeout of the minimal call
error           anything else (5xx, 429, connection refused, malformed answer)
==============  =================================================================
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from analysis.probes import ProbeSettings, probe_input_from_study_csv, probe_table
from orchestrator.spec import CampaignSpec
from storage.availability import Availability, AvailabilityRecord, AvailabilityStore
from storage.probes import ProbeStore
from workers.errors import (
    AuthFailed,
    ConfigError,
    ConnectTimeout,
    ModelNotFound,
    ModelRetired,
    ProviderError,
    ReadTimeout,
    TotalTimeout,
)
from workers.providers._http import parse_retirement
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


def targets_from_campaign(spec: CampaignSpec) -> list[CheckTarget]:
    """Every model of a campaign, grouped by endpoint (spec order)."""
    by_endpoint: dict[str, list[str]] = {}
    for m in spec.models.values():
        by_endpoint.setdefault(m.endpoint, []).append(m.name)
    return [CheckTarget(spec.endpoints[e].to_ref(e), tuple(models)) for e, models in by_endpoint.items()]


def _utc_now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def _status_of(exc: ProviderError, listed: bool | None) -> Availability:
    if isinstance(exc, ModelRetired):
        return Availability.RETIRED
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
    now: Callable[[], dt.datetime] = _utc_now,
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


# ------------------------------------------------------------------ import of the study's audits

ARTIFACT_ENDPOINT = "study-endpoint"


def _artifact_availability(path: Path) -> list[AvailabilityRecord]:
    import csv

    with path.open(newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    need = {"audit_date", "model", "study_role", "http_status", "available", "provider_message"}
    if not rows or need - set(rows[0]):
        raise ConfigError(f"{path}: expected columns {sorted(need)}; got {sorted(rows[0]) if rows else 'no rows'}")
    out = []
    for r in rows:
        status_code = int(r["http_status"]) if r["http_status"].strip() else None
        message = r["provider_message"].strip() or None
        retired_on, reference = parse_retirement(message) if message else (None, None)
        if r["available"].strip() == "1":
            status = Availability.AVAILABLE
        elif status_code == 410:
            status = Availability.RETIRED
        elif status_code == 404:
            status = Availability.NOT_FOUND
        elif status_code in (401, 403):
            status = Availability.AUTH_ERROR
        else:
            status = Availability.ERROR
        day = dt.date.fromisoformat(r["audit_date"])
        out.append(AvailabilityRecord(
            checked_at=dt.datetime(day.year, day.month, day.day, tzinfo=dt.timezone.utc),  # only the date is known
            source="artifact", endpoint=ARTIFACT_ENDPOINT, model=r["model"], status=status,
            http_status=status_code, retired_on=retired_on, reference=reference,
            message=message[:MESSAGE_CHARS] if message else None, study_role=r["study_role"] or None,
        ))
    return out


@dataclass(frozen=True)
class ArtifactImport:
    availability_rows: int
    probe_rows: int
    retired_models: tuple[str, ...]
    notes: tuple[str, ...]


def import_availability_artifact(
    artifact_dir: Path, data_dir: Path, *, reference_timeout_s: float = 60.0,
    now: Callable[[], dt.datetime] = _utc_now,
) -> ArtifactImport:
    """Import ``results/model_availability.csv`` into ``availability/`` and
    ``results/failure_attribution.csv`` into ``probes/`` (attributed under the study's 60 s
    harness timeout). Idempotent: re-importing publishes nothing new. Missing files are
    reported in ``notes``, not assumed."""
    results = Path(artifact_dir) / "results"
    notes: list[str] = []
    avail_rows = probe_rows = 0
    retired: tuple[str, ...] = ()
    avail_csv = results / "model_availability.csv"
    if avail_csv.is_file():
        records = _artifact_availability(avail_csv)
        avail_rows = AvailabilityStore(data_dir).write(records, stem="artifact-model_availability")
        retired = tuple(r.model for r in records if r.status is Availability.RETIRED)
        if not avail_rows:
            notes.append(f"{avail_csv.name}: already imported")
    else:
        notes.append(f"{avail_csv}: not found; availability history not imported")
    probe_csv = results / "failure_attribution.csv"
    if probe_csv.is_file():
        table, audit = probe_input_from_study_csv(probe_csv)
        campaign = f"study-probe-{audit.isoformat()}"
        rows = probe_table(table, ProbeSettings(reference_timeout_s=reference_timeout_s), source="artifact",
                           campaign=campaign, probe_date=audit, computed_at=now())
        probe_rows = ProbeStore(data_dir).replace(rows, source="artifact", campaign=campaign)
    else:
        notes.append(f"{probe_csv}: not found; the study's probe not imported")
    return ArtifactImport(avail_rows, probe_rows, retired, tuple(notes))

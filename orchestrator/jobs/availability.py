"""Availability re-checks on demand (``irbench availability check``) and the import of the
study's published audits. The check itself (statuses, the minimal call) lives in
``workers.celery.availability_tasks`` so the Celery beat task can run it without importing the
orchestrator; it is re-exported here.
"""

from __future__ import annotations

import csv
import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from analysis.tables.probes import ProbeSettings, probe_input_from_study_csv, probe_table
from orchestrator.campaign.spec import CampaignSpec
from storage.availability import Availability, AvailabilityRecord, AvailabilityStore
from storage.clock import utc_now
from storage.probes import ProbeStore
from workers.availability import (
    MESSAGE_CHARS,
    CheckSettings,
    CheckTarget,
    check_availability,
    check_endpoint,
)
from workers.errors import ConfigError
from workers.providers import parse_retirement

__all__ = [
    "ArtifactImport", "CheckSettings", "CheckTarget", "check_availability", "check_endpoint",
    "import_availability_artifact", "targets_from_campaign",
]


def targets_from_campaign(spec: CampaignSpec) -> list[CheckTarget]:
    """Every model of a campaign, grouped by endpoint (spec order)."""
    by_endpoint: dict[str, list[str]] = {}
    for m in spec.models.values():
        by_endpoint.setdefault(m.endpoint, []).append(m.name)
    return [CheckTarget(spec.endpoints[e].to_ref(e), tuple(models)) for e, models in by_endpoint.items()]


# ------------------------------------------------------------------ import of the study's audits

ARTIFACT_ENDPOINT = "study-endpoint"


def _artifact_availability(path: Path) -> list[AvailabilityRecord]:
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
    now: Callable[[], dt.datetime] = utc_now,
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

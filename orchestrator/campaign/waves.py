"""Which wave a command plans: the latest one of the campaign (resume, ``--retry-failed``,
``status``), or a new one (``irbench run --new-wave``), refused when it cannot start.

A wave is a re-measurement of every planned run; its start is a row in ``DATA/waves/``
(``storage.waves``), written before its first run is sent, so an interrupted new wave is what a
plain ``irbench run`` resumes. Wave 1 needs no row (every campaign measured before waves existed).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from workers.errors import ConfigError

if TYPE_CHECKING:  # loaded on use: the CLI imports WaveRequest at start-up, before it needs pyarrow
    from orchestrator.campaign.plan import WaveStart
    from orchestrator.campaign.prepared import PreparedCampaign
    from orchestrator.campaign.spec import CampaignSpec
    from storage.runs import RunStore


@dataclass(frozen=True)
class WaveRequest:
    """What ``irbench run`` was asked about waves: ``new`` (``--new-wave``) with its ``label``."""

    new: bool = False
    label: str | None = None

    def check_flags(self, retry_failed: bool) -> None:
        """Flag combinations that mean nothing; ConfigError (one line) before anything is read."""
        if self.label is not None and not self.new:
            raise ConfigError("--wave-label names a new wave: give it together with --new-wave")
        if self.new and retry_failed:
            raise ConfigError("--new-wave measures every run again, --retry-failed only the failed runs of the "
                              "latest wave: give one of them")


def current_wave(root: Path, campaign: str) -> WaveStart:
    """The latest wave of ``campaign`` as a plan takes it (wave 1, undeclared, when it declared none)."""
    from orchestrator.campaign.plan import WaveStart
    from storage.waves import declared_waves

    declared = declared_waves(root, campaign)
    return WaveStart(declared[-1].wave, declared[-1].started_at) if declared else WaveStart()


def prepare_wave(
    spec: CampaignSpec, root: Path, *, max_planned_runs: int | None, source: str | None, wave: WaveStart | None = None
) -> PreparedCampaign:
    """``prepare`` for ``wave`` (default: the campaign's latest wave in the store at ``root``)."""
    from orchestrator.campaign.prepared import prepare

    return prepare(spec, max_planned_runs=max_planned_runs, source=source,
                   wave=wave if wave is not None else current_wave(root, spec.name))


def start_new_wave(
    latest: PreparedCampaign, store: RunStore, label: str | None, now: dt.datetime | None = None
) -> WaveStart:
    """Record the start of the wave after ``latest`` (the prepared latest wave) and return it.

    Refused (ConfigError, nothing stored) when the campaign has no stored run, or when the latest
    wave still has planned runs without a stored record (``irbench run`` finishes it first)."""
    from orchestrator.campaign.plan import WaveStart
    from storage.clock import utc_now
    from storage.waves import record_wave

    from orchestrator.campaign.plan_state import stored_rows

    name = latest.spec.name
    bitmap, rows = stored_rows(latest.plan, store)  # rows: the campaign's, of any wave
    if not rows:
        raise ConfigError(f"--new-wave: campaign {name} has no stored runs yet; run it first "
                          f"(`irbench run` without --new-wave measures its first wave)")
    planned, stored = len(latest.plan), bitmap.count()
    if stored < planned:
        raise ConfigError(f"--new-wave: wave {latest.wave.number} of {name} has {planned - stored} of "
                          f"{planned} planned runs not stored; finish it first (`irbench run` without "
                          "--new-wave resumes it)")
    number = latest.wave.number + 1
    info = record_wave(store.root, name, number, label, now or utc_now())
    return WaveStart(info.wave, info.started_at)

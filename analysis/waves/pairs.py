"""Which two waves of a campaign are compared, and the comparison of one such pair as
``irbench waves`` and the viewer's ``/waves/{campaign}`` page both compute it.

:func:`pair_of` picks the pair of one campaign from its waves (default: the latest against the one
before); :func:`compare_pair` refuses an unfinished wave (:func:`check_complete`), runs
``compare.compare_waves`` and attaches each model's availability status around the two waves. A
caller passes the runs table it holds (the viewer: its index) or lets it be read from the store.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from storage.errors import ConfigError

if TYPE_CHECKING:  # pyarrow and the statistics load when a comparison runs, not when a CLI starts
    import pyarrow as pa

    from analysis.waves.compare import CampaignWaves
    from analysis.waves.options import WaveOptions
    from storage.waves import WaveInfo

__all__ = ["WAVE_COLUMNS", "OneWaveError", "WavePair", "check_complete", "compare_pair", "pair_of",
           "read_pair"]

#: The run columns a comparison reads (those a store lacks are skipped).
WAVE_COLUMNS = ("campaign", "model", "prompt_sha256", "run_id", "parse_outcome", "ir_json", "node_ids",
                "wave", "panel", "budget_max_tokens", "outcome", "served_model", "system_fingerprint",
                "served_digest")


@dataclass(frozen=True)
class WavePair:
    """The two waves of one campaign to compare; ``to_started_at`` and ``to_ends_at`` (the start
    of the wave after ``to_wave``, None when it is the latest) bound the availability windows."""

    campaign: str
    from_wave: int
    to_wave: int
    to_started_at: dt.datetime | None = None
    to_ends_at: dt.datetime | None = None


class OneWaveError(ConfigError):
    """The campaign holds one wave: there is nothing to compare yet."""


def pair_of(name: str, held: Sequence[WaveInfo], from_wave: int | None = None,
            to_wave: int | None = None) -> WavePair:
    """The pair of campaign ``name`` whose waves are ``held``: ``to_wave`` (default the latest)
    against ``from_wave`` (default the one before). OneWaveError for a campaign of one wave,
    ConfigError for a wave it does not hold."""
    numbers = sorted(w.wave for w in held)
    if len(numbers) < 2:
        raise OneWaveError(f"campaign {name!r} has one wave: measure another with irbench run CAMPAIGN --new-wave")
    to = to_wave if to_wave is not None else numbers[-1]
    frm = from_wave if from_wave is not None else max(w for w in numbers if w < to) if to > numbers[0] else None
    for w in (frm, to):
        if w not in numbers:
            raise ConfigError(f"campaign {name!r} has waves {', '.join(map(str, numbers))}, not {w}")
    assert frm is not None
    starts = {w.wave: w.started_at for w in held}
    later = [w for w in numbers if w > to]
    return WavePair(name, frm, to, starts.get(to), starts.get(later[0]) if later else None)


def check_complete(table: pa.Table, pair: WavePair) -> None:
    """Refuse a comparison where one wave holds fewer runs of a model than the other: an
    unfinished wave would read as a change."""
    counts: dict[tuple[str, int], int] = {}
    for model, wave in zip(table["model"].to_pylist(), table["wave"].to_pylist()):
        counts[(model, wave)] = counts.get((model, wave), 0) + 1
    for model in sorted({m for m, _ in counts}):
        a, b = counts.get((model, pair.from_wave), 0), counts.get((model, pair.to_wave), 0)
        if a != b:
            raise ConfigError(f"campaign {pair.campaign!r}, model {model}: wave {pair.from_wave} holds {a} runs and "
                              f"wave {pair.to_wave} {b}; finish the wave with irbench run CAMPAIGN first")


def read_pair(data: Path, pair: WavePair) -> pa.Table:
    """The store's runs of the pair's two waves (one row per run), the columns a comparison reads."""
    from storage.runs import RunStore

    store = RunStore(Path(data), fsync=False)
    return store.read_table(campaigns=[pair.campaign], waves=[pair.from_wave, pair.to_wave],
                            columns=[c for c in WAVE_COLUMNS if c in store.dataset.spec.schema.names])


def compare_pair(data: Path, pair: WavePair, options: WaveOptions,
                 table: pa.Table | None = None) -> CampaignWaves | None:
    """The pair compared per model, with each model's availability around the two waves (None:
    neither wave holds a run). ``table``: the pair's runs in run_id order, as
    :func:`read_pair` reads them (None: read from the store at ``data``)."""
    from analysis.waves.availability import availability_changes
    from analysis.waves.compare import compare_waves
    from storage.availability import AvailabilityStore

    table = read_pair(data, pair) if table is None else table
    check_complete(table, pair)
    compared = compare_waves(table, pair.from_wave, pair.to_wave, options)
    models = sorted({m.model for c in compared.campaigns for m in c.models})
    rows = AvailabilityStore(Path(data), fsync=False).read(models=models)
    changes = availability_changes(rows, models, pair.to_started_at, pair.to_ends_at)
    found = compared.with_availability(pair.campaign, changes).campaigns
    return found[0] if found else None

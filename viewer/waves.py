"""Measurement waves in the viewer: a campaign's waves compared per model (``/waves/{campaign}``)
and one cell's runs of two waves side by side.

The comparison is ``irbench waves``'s (``analysis.waves.pairs.compare_pair`` with the default
options) over the runs the index holds, so a page shows what the command prints for the same
store. Why a cache: a comparison runs a permutation test and bootstraps per model; the index is
a snapshot of the store taken at startup, so a :class:`WaveComparisons` (one per index) compares
each pair of a campaign once and every later request reads the result.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from analysis.waves.compare import CampaignWaves, WaveSide
from analysis.waves.options import WaveOptions
from analysis.waves.pairs import WAVE_COLUMNS, OneWaveError, WavePair, compare_pair, pair_of
from storage.errors import ConfigError
from storage.waves import WaveInfo
from viewer.index import RunIndex

__all__ = ["CellWaves", "PairResult", "WaveColumn", "WaveComparisons", "WavesPage", "cell_waves"]


@dataclass(frozen=True)
class PairResult:
    """One pair compared: ``comparison`` (None when neither wave holds a run), or ``problem``,
    the one line saying why it cannot be (an unfinished wave)."""

    pair: WavePair
    comparison: CampaignWaves | None
    problem: str | None


@dataclass(frozen=True)
class WavesPage:
    """What ``/waves/{campaign}`` shows: the campaign's waves and runs held per wave; ``chosen``
    (None: one wave, nothing to compare); ``by_wave``: model -> wave -> its side, from the
    comparisons of consecutive waves (the first wave's from its comparison with the second, as
    the report reads them); ``gaps``: the consecutive pairs that could not be compared."""

    campaign: str
    waves: tuple[WaveInfo, ...]
    runs_per_wave: dict[int, int]
    chosen: PairResult | None
    by_wave: dict[str, dict[int, WaveSide]]
    gaps: tuple[PairResult, ...]

    @property
    def models(self) -> list[str]:
        return sorted(self.by_wave)


class WaveComparisons:
    """Wave comparisons over one index, computed once per (campaign, from wave, to wave)."""

    def __init__(self, index: RunIndex, data_dir: Path, options: WaveOptions | None = None) -> None:
        self.index = index
        self.data_dir = Path(data_dir)
        self.options = options or WaveOptions()
        self._lock = threading.Lock()  # one computation per pair, even under concurrent requests
        self._done: dict[tuple[str, int, int], PairResult] = {}

    def compare(self, pair: WavePair) -> PairResult:
        """``pair`` compared (cached)."""
        key = (pair.campaign, pair.from_wave, pair.to_wave)
        with self._lock:
            found = self._done.get(key)
            if found is None:
                table = self.index.wave_table(pair.campaign, [pair.from_wave, pair.to_wave],
                                              WAVE_COLUMNS)
                try:
                    found = PairResult(pair, compare_pair(self.data_dir, pair, self.options, table), None)
                except ConfigError as exc:
                    found = PairResult(pair, None, str(exc))
                self._done[key] = found
            return found

    def pair(self, campaign: str, from_wave: int | None, to_wave: int | None) -> WavePair:
        """The pair ``irbench waves --campaign C [--from N] [--to M]`` compares: KeyError for a
        campaign the index does not hold, OneWaveError / ConfigError as :func:`pair_of`."""
        held = self.index.waves.get(campaign)
        if not held:
            raise KeyError(campaign)
        return pair_of(campaign, held, from_wave, to_wave)

    def page(self, campaign: str, from_wave: int | None, to_wave: int | None) -> WavesPage:
        """The waves page of ``campaign`` (KeyError: not held; ConfigError: a wave not held)."""
        try:
            chosen: PairResult | None = self.compare(self.pair(campaign, from_wave, to_wave))
        except OneWaveError:
            chosen = None
        held = tuple(self.index.waves[campaign])
        numbers = [w.wave for w in held]
        by_wave: dict[str, dict[int, WaveSide]] = {}
        gaps = []
        for k, (a, b) in enumerate(zip(numbers, numbers[1:])):
            done = self.compare(pair_of(campaign, held, a, b))
            if done.comparison is None:
                gaps.append(done)
                continue
            for m in done.comparison.models:
                sides = by_wave.setdefault(m.model, {})
                if k == 0 or a not in sides:
                    sides[a] = m.from_side
                sides[b] = m.to_side
        return WavesPage(campaign, held, self.index.runs_per_wave(campaign), chosen, by_wave,
                         tuple(gaps))


@dataclass(frozen=True)
class WaveColumn:
    """One wave's runs of a cell: ``total`` held, ``runs`` shown."""

    info: WaveInfo
    total: int
    runs: list[dict[str, Any]]


@dataclass(frozen=True)
class CellWaves:
    """A cell's runs of two waves side by side (``columns``: one or two), rows aligned by budget
    and run number; ``waves``: every wave of the campaign (the choice of two when there are more)."""

    waves: tuple[WaveInfo, ...]
    columns: tuple[WaveColumn, ...]
    rows: list[tuple[dict[str, Any] | None, ...]]


def _pick(waves: list[int], wave_a: int | None, wave_b: int | None) -> list[int]:
    if wave_a is None and wave_b is None:
        return waves[-2:]
    for w in (wave_a, wave_b):
        if w is not None and w not in waves:
            raise ConfigError(f"this campaign has waves {', '.join(map(str, waves))}, not {w}")
    a = wave_a if wave_a is not None else max([w for w in waves if w < (wave_b or 0)] or waves[:1])
    b = wave_b if wave_b is not None else min([w for w in waves if w > a] or waves[-1:])
    return [a] if a == b else sorted([a, b])


def cell_waves(index: RunIndex, campaign: str, model: str, prompt_sha256: str, limit: int,
               wave_a: int | None = None, wave_b: int | None = None) -> CellWaves | None:
    """The runs of one cell in two waves of its campaign (default: the latest and the one
    before); None when the campaign has one wave. ConfigError for a wave it does not hold."""
    held = index.waves.get(campaign, [])
    if len(held) < 2:
        return None
    shown = _pick([w.wave for w in held], wave_a, wave_b)
    counts, rows = index.cell_wave_runs(campaign, model, prompt_sha256, limit)
    info = {w.wave: w for w in held}
    columns = tuple(WaveColumn(info[w], counts.get(w, 0), [r for r in rows if r["wave"] == w])
                    for w in shown)
    keys: dict[tuple[Any, int], list[dict[str, Any] | None]] = {}
    for k, col in enumerate(columns):
        for r in col.runs:
            keys.setdefault((r["budget_max_tokens"], r["run_index"]), [None] * len(columns))[k] = r
    order = sorted(keys, key=lambda key: (key[0] is not None, key[0] or 0, key[1]))
    return CellWaves(tuple(held), columns, [tuple(keys[key]) for key in order])

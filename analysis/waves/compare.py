"""Two waves of every campaign in a runs table, compared per model (:func:`compare_waves`).

Input: a ``pyarrow.Table`` of run rows with ``campaign``, ``model``, ``prompt_sha256``, ``run_id``,
``parse_outcome``, ``ir_json`` and ``node_ids`` (as ``storage.runs.RunStore`` stores them);
``wave`` (rows without it are wave 1), ``panel`` and ``budget_max_tokens`` (part of the prompt key
when present), ``outcome`` (retired runs are counted) and the served-identity columns
(:attr:`WaveOptions.served_identity_columns`) are optional. Rows sharing (run_id, wave) collapse
to the last one. Only successful runs (``storage.outcomes.succeeded_mask``) enter the test.

Output: :class:`WaveComparison`, one :class:`CampaignWaves` per campaign; q-values are
Benjamini–Hochberg across the tested models of one campaign; ranks are competition ranks of each
wave's mean Jaccard among the campaign's tested models (1 = most stable), over each model's usable
prompts.
"""

from __future__ import annotations

import json
import zlib
from collections import defaultdict
from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from analysis.errors import AnalysisError
from analysis.stats.bootstrap import Interval
from analysis.waves.availability import AvailabilityChange
from analysis.stats.ranks import min_ranks
from analysis.waves.fdr import bh_qvalues
from analysis.waves.mmd import DrawSettings, WaveRuns, WaveTest, wave_test
from analysis.waves.options import WaveOptions
from analysis.waves.served import ServedColumn, served_changed, served_columns
from storage.outcomes import Outcome, succeeded_mask

__all__ = ["REQUIRED_COLUMNS", "WaveSide", "ModelWaves", "CampaignWaves", "WaveComparison",
           "compare_waves"]

REQUIRED_COLUMNS = ("campaign", "model", "prompt_sha256", "run_id", "parse_outcome", "ir_json",
                    "node_ids")
_PROMPT_KEY = ("panel", "prompt_sha256", "budget_max_tokens")


@dataclass(frozen=True)
class WaveSide:
    """One model in one wave: mean Jaccard with its interval (None when untested), its rank,
    and the runs stored (``runs_total``), successful (``runs_ok``) and retired (410)."""

    wave: int
    jaccard: Interval | None
    rank: int | None
    runs_total: int
    runs_ok: int
    runs_retired: int


@dataclass(frozen=True)
class ModelWaves:
    """One model's comparison. ``changed``: q ≤ alpha; ``rank_change``: to-rank − from-rank
    (positive = fell behind); ``served``: each served-identity column holding values in either
    wave; ``served_identity_changed``: a column with values in both waves differs between them
    (None when no column has values in both); ``availability``: what the availability dataset says around the
    waves (None until :meth:`WaveComparison.with_availability` attaches it)."""

    model: str
    test: WaveTest
    q_value: float | None
    changed: bool
    from_side: WaveSide
    to_side: WaveSide
    rank_change: int | None
    served_identity_changed: bool | None
    served: tuple[ServedColumn, ...] = ()
    availability: AvailabilityChange | None = None

    @property
    def newly_retired(self) -> bool:
        """The later wave met 410s and the earlier one none: the model was retired between them."""
        return self.from_side.runs_retired == 0 and self.to_side.runs_retired > 0


@dataclass(frozen=True)
class CampaignWaves:
    campaign: str
    from_wave: int
    to_wave: int
    alpha: float
    models: tuple[ModelWaves, ...]


@dataclass(frozen=True)
class WaveComparison:
    campaigns: tuple[CampaignWaves, ...]

    def to_json(self) -> str:
        """``{"campaigns": [{"campaign", "from_wave", "to_wave", "models": [...]}]}``."""
        return json.dumps({"campaigns": [_campaign_json(c) for c in self.campaigns]}, indent=2)

    def with_availability(self, campaign: str,
                          changes: dict[str, AvailabilityChange]) -> WaveComparison:
        """This comparison with ``changes`` (by model) attached to ``campaign``'s models."""
        return WaveComparison(tuple(
            replace(c, models=tuple(replace(m, availability=changes.get(m.model, m.availability))
                                    for m in c.models)) if c.campaign == campaign else c
            for c in self.campaigns))


def _interval(iv: Interval | None) -> list[float] | None:
    return None if iv is None else [iv.low, iv.high]


def _side_json(s: WaveSide) -> dict[str, object]:
    return {"wave": s.wave, "jaccard": None if s.jaccard is None else s.jaccard.point,
            "jaccard_interval": _interval(s.jaccard), "rank": s.rank, "runs_total": s.runs_total,
            "runs_ok": s.runs_ok, "runs_retired": s.runs_retired}


def _campaign_json(c: CampaignWaves) -> dict[str, object]:
    models = [{
        "model": m.model, "changed": m.changed, "p_value": m.test.p_value, "q_value": m.q_value,
        "effect": m.test.effect, "effect_interval": _interval(m.test.effect_interval),
        "served_identity_changed": m.served_identity_changed,
        "served_identity": [s.to_json() for s in m.served], "p_mmd": m.test.p_mmd,
        "p_jaccard": m.test.p_jaccard, "p_shared": m.test.p_shared, "mmd": m.test.mmd,
        "prompts": m.test.prompts,
        "prompts_skipped": m.test.prompts_skipped, "permutations": m.test.permutations,
        "from": _side_json(m.from_side), "to": _side_json(m.to_side), "rank_change": m.rank_change,
        "retired": {"from": m.from_side.runs_retired, "to": m.to_side.runs_retired,
                    "newly_retired": m.newly_retired},
        "availability": None if m.availability is None else m.availability.to_json(),
    } for m in c.models]
    return {"campaign": c.campaign, "from_wave": c.from_wave, "to_wave": c.to_wave,
            "alpha": c.alpha, "models": models}


@dataclass(frozen=True)
class _Rows:
    """The selected rows as Python columns, one entry per row."""

    campaign: list[str]
    model: list[str]
    prompt: list[str]
    wave: np.ndarray
    ok: np.ndarray
    retired: np.ndarray
    node_ids: list[list[str] | None]
    served: dict[str, list[object]]


def _select(table: pa.Table, waves: tuple[int, int], options: WaveOptions) -> _Rows:
    missing = [c for c in REQUIRED_COLUMNS if c not in table.column_names]
    if missing:
        raise AnalysisError(f"run table lacks column(s) {missing}; pass rows as the run store "
                            "stores them")
    if "wave" not in table.column_names:
        table = table.append_column("wave", pa.array(np.ones(table.num_rows, np.int64)))
    wave = pc.fill_null(table.column("wave").cast(pa.int64()), 1)
    table = table.set_column(table.column_names.index("wave"), "wave", wave)
    table = table.filter(pc.is_in(wave, value_set=pa.array(list(waves), pa.int64())))
    last = {}  # (run_id, wave) -> last row: a re-executed run counts once
    for i, key in enumerate(zip(table.column("run_id").to_pylist(),
                                table.column("wave").to_pylist())):
        last[key] = i
    table = table.take(pa.array(sorted(last.values()), pa.int64()))
    key_cols = [c for c in _PROMPT_KEY if c in table.column_names]
    prompt = ["\x1f".join("" if v is None else str(v) for v in vals)
              for vals in zip(*(table.column(c).to_pylist() for c in key_cols))]
    retired = (np.asarray(pc.fill_null(pc.equal(table.column("outcome"), Outcome.RETIRED.value),
                                       False).to_numpy(zero_copy_only=False), bool)
               if "outcome" in table.column_names else np.zeros(table.num_rows, bool))
    return _Rows(
        campaign=[str(c) for c in table.column("campaign").to_pylist()],
        model=[str(m) for m in table.column("model").to_pylist()], prompt=prompt,
        wave=np.asarray(table.column("wave").to_numpy(), np.int64),
        ok=np.asarray(succeeded_mask(table).to_numpy(zero_copy_only=False), bool),
        retired=retired, node_ids=table.column("node_ids").to_pylist(),
        served={c: table.column(c).to_pylist() for c in options.served_identity_columns
                if c in table.column_names})


def _model_runs(rows: _Rows, idx: list[int], waves: tuple[int, int]) -> WaveRuns:
    sets: dict[str, tuple[list[frozenset[str]], list[frozenset[str]]]] = defaultdict(lambda: ([], []))
    for i in idx:
        if rows.ok[i]:
            sets[rows.prompt[i]][0 if rows.wave[i] == waves[0] else 1].append(
                frozenset(rows.node_ids[i] or ()))
    prompts = sorted(sets)
    return WaveRuns.of(prompts, [sets[p][0] for p in prompts], [sets[p][1] for p in prompts])


def _seed(options: WaveOptions, campaign: str, model: str) -> int:
    # by name, so a model's result does not depend on which other models are in the table
    ss = np.random.SeedSequence([options.seed, zlib.crc32(campaign.encode()),
                                 zlib.crc32(model.encode())])
    return int(ss.generate_state(1)[0])


def _side(rows: _Rows, idx: list[int], wave: int, jaccard: Interval | None,
          rank: int | None) -> WaveSide:
    mine = [i for i in idx if rows.wave[i] == wave]
    return WaveSide(wave=wave, jaccard=jaccard, rank=rank, runs_total=len(mine),
                    runs_ok=int(sum(rows.ok[i] for i in mine)),
                    runs_retired=int(sum(rows.retired[i] for i in mine)))


def _ranks(tests: list[WaveTest], attr: str) -> list[int | None]:
    ivs = [getattr(t, attr) for t in tests]
    tested = [k for k, iv in enumerate(ivs) if iv is not None]
    out: list[int | None] = [None] * len(tests)
    if tested:
        ranks = min_ranks(np.array([ivs[k].point for k in tested]))
        for k, r in zip(tested, ranks):
            out[k] = int(r)
    return out


def _campaign(rows: _Rows, idx: list[int], waves: tuple[int, int],
              options: WaveOptions, campaign: str) -> CampaignWaves:
    by_model: dict[str, list[int]] = defaultdict(list)
    for i in idx:
        by_model[rows.model[i]].append(i)
    names = sorted(by_model)
    tests = [wave_test(_model_runs(rows, by_model[m], waves), DrawSettings(
        options.permutations, options.bootstrap_replicates, options.level,
        _seed(options, campaign, m))) for m in names]
    tested = [k for k, t in enumerate(tests) if t.p_value is not None]
    q = bh_qvalues(np.array([tests[k].p_value for k in tested], float))
    q_of: dict[int, float] = {k: float(v) for k, v in zip(tested, q)}
    r_from, r_to = _ranks(tests, "jaccard_a"), _ranks(tests, "jaccard_b")
    models = []
    for k, m in enumerate(names):
        rf, rt = r_from[k], r_to[k]
        served = served_columns(rows.served, by_model[m], rows.wave, waves)
        models.append(ModelWaves(
            model=m, test=tests[k], q_value=q_of.get(k), changed=q_of.get(k, 1.0) <= options.alpha,
            from_side=_side(rows, by_model[m], waves[0], tests[k].jaccard_a, rf),
            to_side=_side(rows, by_model[m], waves[1], tests[k].jaccard_b, rt),
            rank_change=None if rf is None or rt is None else rt - rf,
            served_identity_changed=served_changed(served), served=served))
    return CampaignWaves(campaign=campaign, from_wave=waves[0], to_wave=waves[1],
                         alpha=options.alpha, models=tuple(models))


def compare_waves(table: pa.Table, from_wave: int, to_wave: int,
                  options: WaveOptions | None = None) -> WaveComparison:
    """Every campaign of ``table`` compared from ``from_wave`` to ``to_wave`` (wave numbers ≥ 1,
    different), per model; campaigns in name order, models in name order."""
    if from_wave < 1 or to_wave < 1 or from_wave == to_wave:
        raise AnalysisError(f"compare two different waves numbered from 1, got {from_wave} and "
                            f"{to_wave}")
    options = options or WaveOptions()
    waves = (from_wave, to_wave)
    rows = _select(table, waves, options)
    by_campaign: dict[str, list[int]] = defaultdict(list)
    for i, c in enumerate(rows.campaign):
        by_campaign[c].append(i)
    return WaveComparison(tuple(_campaign(rows, by_campaign[c], waves, options, c)
                                for c in sorted(by_campaign)))

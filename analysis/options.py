"""Every analysis choice that can move a headline, as one frozen, validated options object.

Each field states its default and its unit (``json_schema_extra={"unit": ...}``); the manifest
and report print them with :meth:`AnalysisOptions.described`. Add new options as new fields
with a default and a unit — existing callers keep working.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from storage.wave_selection import WaveSelection


def _unit(unit: str) -> dict[str, Any]:
    return {"unit": unit}


class AnalysisOptions(BaseModel):
    """Options of ``irbench analyze``. Frozen; unknown fields are rejected (typos fail loudly)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    min_runs: int = Field(
        default=2,
        ge=2,
        description="a cell enters the stability table with at least this many successful runs",
        json_schema_extra=_unit("successful runs per cell"),
    )
    min_prompts: int = Field(
        default=3,
        ge=1,
        description="a model enters the table with at least this many included prompts",
        json_schema_extra=_unit("prompts per model"),
    )
    date_from: dt.date | None = Field(
        default=None,
        description="first measurement date read (inclusive); None = from the start",
        json_schema_extra=_unit("UTC date"),
    )
    date_to: dt.date | None = Field(
        default=None,
        description="last measurement date read (inclusive); None = to the end",
        json_schema_extra=_unit("UTC date"),
    )
    campaigns: list[str] | None = Field(
        default=None,
        description="campaigns read; None = all",
        json_schema_extra=_unit("campaign names"),
    )
    models: list[str] | None = Field(
        default=None,
        description="models read; None = all",
        json_schema_extra=_unit("model names"),
    )
    waves: WaveSelection = Field(
        default_factory=WaveSelection,
        description="measurement waves read: each campaign's latest (default), one wave number, or every wave",
        json_schema_extra=_unit("wave selection"),
    )
    panel: str | None = Field(
        default=None,
        description="analyse only this panel; None = every panel, each separately",
        json_schema_extra=_unit("panel name"),
    )
    seed: int = Field(
        default=20260601,
        ge=0,
        description="seed of every resampling step (bootstrap, rank retention)",
        json_schema_extra=_unit("integer seed"),
    )
    replicates: int = Field(
        default=10_000,
        ge=1,
        description="bootstrap replicates",
        json_schema_extra=_unit("replicates"),
    )

    merge_rule: Literal["highest-budget-first", "earliest-then-top-up"] = Field(
        default="highest-budget-first",
        description="which campaign supplies a cell measured in several campaigns of a panel; "
        "the other rule is always computed in sensitivity.parquet",
        json_schema_extra=_unit("rule name"),
    )
    precedence_path: Path | None = Field(
        default=None,
        description="TOML giving campaigns' budget_rank/time_order (the import-artifact mapping "
        "format); None = precedence stored with imported cells, other campaigns budget 0 and "
        "ordered by first measurement date",
        json_schema_extra=_unit("file path"),
    )
    families_path: Path | None = Field(
        default=None,
        description="TOML [families] model = family; None = names grouped by their prefix "
        "before ':' with version/size suffixes removed",
        json_schema_extra=_unit("file path"),
    )
    pair_scope: Literal["family", "all"] = Field(
        default="family",
        description="pairs.parquet compares models within a family, or all pairs",
        json_schema_extra=_unit("scope name"),
    )
    corpus_dirs: list[Path] | None = Field(
        default=None,
        description="directories searched (recursively) for prompt files by sha256, for the "
        "correctness ground truth; runs whose prompt_source is a local file are found anyway",
        json_schema_extra=_unit("directory paths"),
    )
    skip_corrupt: bool = Field(
        default=False,
        description="skip (and name) unreadable Parquet files instead of failing",
        json_schema_extra=_unit("flag"),
    )
    timeouts_s: list[float] = Field(
        default_factory=lambda: [30.0, 60.0, 120.0, 300.0],
        min_length=1,
        description="total timeouts under which the timeout-sensitivity table recounts lost runs",
        json_schema_extra=_unit("seconds"),
    )
    interval: Literal["percentile", "bca", "studentized", "double", "betting",
                      "calibrated_betting"] = Field(
        default="calibrated_betting",
        description="method of the per-model mean intervals: calibrated_betting (the betting "
        "interval for bounded means read at the normal threshold) covers at least 0.93 at "
        "5-100 prompts on study-like data (docs/intervals.md, bench/interval_coverage.py); "
        "betting is the exact, conservative one; percentile reproduces the study's Table 1",
        json_schema_extra=_unit("method name"),
    )
    coverage_check_datasets: int = Field(
        default=400,
        ge=0,
        description="simulated datasets behind each model's coverage self-check (a parametric "
        "resample of its own cells); 0 = no check",
        json_schema_extra=_unit("datasets"),
    )
    coverage_check_max_prompts: int = Field(
        default=50,
        ge=1,
        description="models with more prompts get no coverage self-check (its cost grows with "
        "the prompts, 15 s against 3 s for 50 models of 200 prompts in bench/campaign_scale.py; "
        "the intervals' coverage error shrinks as 1/prompts)",
        json_schema_extra=_unit("prompts per model"),
    )
    level: float = Field(
        default=0.95,
        gt=0.0,
        lt=1.0,
        description="coverage of every confidence interval and rank set",
        json_schema_extra=_unit("probability"),
    )
    tol_abs_nodes: float = Field(
        default=0.05,
        ge=0.0,
        description="absolute stabilisation tolerance",
        json_schema_extra=_unit("nodes"),
    )
    blas_threads: int = Field(
        default=1,
        ge=1,
        description="threads BLAS may use for the bootstrap matrix products; the products are "
        "chunked and small, and multi-threaded OpenBLAS spin-waits on a busy machine (measured "
        "5-100x slower under load), so 1 unless the machine is idle",
        json_schema_extra=_unit("threads"),
    )
    interval_threads: int = Field(
        default=2,
        ge=1,
        le=2,
        description="threads of the interval stage: 2 runs the per-model CI bootstrap beside "
        "the joint rank bootstrap (separate seeded streams, so no result depends on it; ~60 MB "
        "more peak memory on a 100 x 10,000 panel), 1 runs them one after the other",
        json_schema_extra=_unit("threads"),
    )
    tol_rel: float = Field(
        default=0.05,
        ge=0.0,
        description="relative stabilisation tolerance",
        json_schema_extra=_unit("fraction of the long-run mean node count"),
    )

    @model_validator(mode="after")
    def _window(self) -> AnalysisOptions:
        if self.date_from and self.date_to and self.date_from > self.date_to:
            raise ValueError(
                f"date_from {self.date_from} is after date_to {self.date_to}; swap them"
            )
        for name in ("campaigns", "models", "corpus_dirs"):
            value = getattr(self, name)
            if value is not None and not value:
                raise ValueError(f"{name} is an empty list; pass None to read all {name}")
        return self

    def described(self) -> dict[str, dict[str, Any]]:
        """``{name: {"value": json-able value, "unit": str, "description": str}}`` per field."""
        out: dict[str, dict[str, Any]] = {}
        dumped = self.model_dump(mode="json")
        for name, info in type(self).model_fields.items():
            extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
            out[name] = {
                "value": dumped[name],
                "unit": extra.get("unit", ""),
                "description": info.description or "",
            }
        return out

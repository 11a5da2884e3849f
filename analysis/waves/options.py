"""The choices of a wave comparison as one frozen, validated options object."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


def _unit(unit: str) -> dict[str, Any]:
    return {"unit": unit}


class WaveOptions(BaseModel):
    """Options of a wave comparison (``irbench waves``). Frozen; unknown fields are rejected."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    alpha: float = Field(
        default=0.05, gt=0, lt=1,
        description="a model is flagged as changed when its BH q-value is at most alpha",
        json_schema_extra=_unit("false discovery rate"),
    )
    permutations: int = Field(
        default=1000, ge=19,
        description="wave-label permutations per model test (bench/wave_detection.py times them)",
        json_schema_extra=_unit("permutations"),
    )
    bootstrap_replicates: int = Field(
        default=10_000, ge=100,
        description="prompt-bootstrap replicates of the effect and wave Jaccard intervals",
        json_schema_extra=_unit("replicates"),
    )
    level: float = Field(
        default=0.95, gt=0, lt=1,
        description="coverage of the bootstrap intervals",
        json_schema_extra=_unit("probability"),
    )
    seed: int = Field(
        default=0, ge=0,
        description="seed of the permutations and bootstraps (mixed with campaign and model names)",
        json_schema_extra=_unit("integer"),
    )
    served_identity_columns: tuple[str, ...] = Field(
        default=("served_model", "system_fingerprint", "served_digest"),
        description="run columns naming what the provider says it served; absent ones are skipped",
        json_schema_extra=_unit("column names"),
    )

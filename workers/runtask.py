"""What a worker needs to execute one run: a JSON-serialisable value, never a secret.

The orchestrator plans ``RunTask`` values; the local executor and Celery tasks hand them to
``workers.execute.execute_run``. The API key is referenced by the *name* of its environment
variable (``api_key_env``) and resolved in the worker's own process.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

# The wire formats a provider client exists for: the one list (specs, tasks and the registry read it).
WireFormat = Literal["openai", "ollama"]
WIRE_FORMATS: tuple[str, ...] = get_args(WireFormat)


class TimeoutPolicy(BaseModel):
    """Per-call deadlines in seconds. ``None`` = no cap (recorded as such)."""

    model_config = ConfigDict(frozen=True)

    connect_timeout_s: float | None = 10.0
    read_timeout_s: float | None = 300.0
    total_timeout_s: float | None = 600.0


class RetryPolicy(BaseModel):
    """Which failures are retried and how long to wait (failures.md defaults)."""

    model_config = ConfigDict(frozen=True)

    max_attempts: int = Field(default=4, ge=1)
    backoff_base_s: float = Field(default=1.0, ge=0)
    backoff_cap_s: float = Field(default=60.0, ge=0)
    retry_timeouts: bool = False
    disable_after_consecutive: int = Field(
        default=3, ge=1, description="auth/not_found/client errors in a row before the model is disabled"
    )


class ModelLimits(BaseModel):
    """Per-model limits, global across every worker. ``None`` = unlimited."""

    model_config = ConfigDict(frozen=True)

    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None
    max_concurrency: int | None = Field(default=4, ge=1)


class EndpointRef(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    base_url: str
    wire_format: WireFormat = "openai"
    api_key_env: str | None = None


class RunTask(BaseModel):
    """One planned run: campaign × prompt × model × budget × run index."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    campaign: str
    panel: str
    model: str
    endpoint: EndpointRef
    limits: ModelLimits = ModelLimits()
    timeouts: TimeoutPolicy = TimeoutPolicy()
    retry: RetryPolicy = RetryPolicy()
    max_tokens: int | None = None
    budget_max_tokens: int | None = None
    temperature: float | None = 0.0
    reasoning: bool | None = None
    structured_output: bool = False
    options: dict[str, Any] = Field(default_factory=dict)
    prompt_sha256: str
    prompt_name: str
    prompt_license: str | None = None
    prompt_source: str | None = None
    run_index: int
    user_message: str = Field(description="the rendered instruction + prompt, sent as one user message")
    instruction_version: str
    instruction_sha256: str
    measured_on: dt.date | None = Field(
        default=None, description="fixed at first dispatch so a redelivery lands in the same partition"
    )

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
    max_retry_after_s: float = Field(
        default=120.0, ge=0,
        description="longest Retry-After honoured; a longer advertised wait ends the run (its value is stored)",
    )
    run_deadline_s: float | None = Field(
        default=3600.0, gt=0,
        description="wall clock for all attempts of one run: no retry wait may end past it (None = no cap)",
    )


class ModelLimits(BaseModel):
    """Per-model limits, global across every worker. ``None`` = unlimited."""

    model_config = ConfigDict(frozen=True)

    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None
    max_concurrency: int | None = Field(default=4, ge=1)


MIB = 1024 * 1024


class ResponseLimits(BaseModel):
    """Bounds on what one endpoint answer may cost us (every byte from it is hostile).

    ``max_response_bytes``: body size after content decoding; a larger body ends the attempt as
    ``protocol_error`` with its first KiB kept. ``max_json_depth``: nesting accepted in an IR
    found in the answer (deeper is ``invalid_json``); the HTTP decode is bounded by the JSON
    parser's own recursion guard. ``max_answer_chars``: longest answer the IR extraction reads
    (a longer one is ``invalid_json``, refused before any parsing; the text is still stored).
    ``max_ir_nodes``: an IR with more nodes is ``schema_invalid`` without validating them.
    The extraction defaults keep its worst case far below a second (``bench/hostile_extract.py``).
    """

    model_config = ConfigDict(frozen=True)

    max_response_bytes: int = Field(default=8 * MIB, ge=1024)
    max_json_depth: int = Field(default=64, ge=4, le=512)
    max_answer_chars: int = Field(default=1 * MIB, ge=1024)
    max_ir_nodes: int = Field(default=2000, ge=1)


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
    response: ResponseLimits = ResponseLimits()
    max_tokens: int | None = None
    budget_max_tokens: int | None = None
    temperature: float | None = 0.0
    reasoning: bool | None = None
    structured_output: bool = False
    stream: bool = False
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
    wave: int = Field(default=1, ge=1, description="the campaign's measurement wave this run belongs to")
    wave_started_at: dt.datetime | None = Field(default=None, description="UTC start of that wave (None: wave 1 undeclared)")
    spend_capped: bool = Field(default=False, description="a spend cap covers this run: each attempt reserves spend first (workers.spend)")

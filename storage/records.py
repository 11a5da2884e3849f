"""The data contract: one record per run, every attempt inside it.

A *run* is the sequence of attempts for one ``run_id`` under the retry policy; its final
class is its last attempt's (``../shared/spec/failures.md``). Records are the primary
artifact: raw answer and reasoning text, timings, token usage and request parameters are
kept for every run, failures included. Summary tables are always derived from these.

Units are in field names: ``*_ms`` milliseconds, ``*_s`` seconds, ``*_chars`` characters.
"""

from __future__ import annotations

import datetime as dt
import uuid

from pydantic import BaseModel, ConfigDict, Field

from storage.outcomes import Outcome, ParseOutcome, run_succeeded


#: 2: ``execution_id`` and ``finished_at`` (every execution of a run is its own row), and the
#: streaming columns ``stream``, ``first_token_ms``, ``stream_duration_ms``; files of version 1
#: stay readable (these columns read as null).
#: 3: the measurement wave (``wave``, ``wave_started_at``) and the served identity
#: (``served_model``, ``system_fingerprint``, ``served_digest``); rows of older versions read as
#: wave 1 with no served identity.
SCHEMA_VERSION = 3
ERROR_TEXT_MAX_CHARS = 2000
#: Longest served-identity string kept (a model name, fingerprint or digest): the endpoint chooses
#: it, so it is bounded like any answer text; real values are well under 100 characters.
SERVED_IDENTITY_MAX_CHARS = 200


class Attempt(BaseModel):
    """One HTTP call."""

    model_config = ConfigDict(frozen=True)

    attempt: int = Field(ge=1, description="1-based attempt number within the run")
    outcome: Outcome
    started_at: dt.datetime
    latency_ms: float
    status_code: int | None = None
    bytes_received: int = 0
    retry_after_s: float | None = None
    error: str | None = Field(default=None, max_length=ERROR_TEXT_MAX_CHARS)


def new_execution_id() -> str:
    """A fresh execution id (32 hex chars): one per execution of a run, never reused."""
    return uuid.uuid4().hex


class RunRecord(BaseModel):
    """Everything known about one *execution* of a run. Flat so it maps 1:1 onto the Arrow schema.

    A run (``run_id``) may be executed more than once (redelivery under at-least-once, retry of a
    failed run); every execution is stored as its own row with its own ``execution_id``, and
    readers pick one per run_id by :data:`storage.runs.EXECUTION_RULE` (the latest).
    """

    model_config = ConfigDict(frozen=True)

    schema_version: int = SCHEMA_VERSION
    run_id: str
    campaign: str
    panel: str
    # what was asked
    prompt_sha256: str
    prompt_name: str
    prompt_license: str | None = None
    prompt_source: str | None = None
    model: str
    endpoint: str
    wire_format: str
    budget_max_tokens: int | None = Field(
        default=None, description="the budget axis of the campaign; None = no budget axis"
    )
    run_index: int = Field(ge=0)
    # request parameters actually sent
    max_tokens: int | None = None
    temperature: float | None = None
    reasoning_enabled: bool | None = None
    structured_output: bool = False
    stream: bool | None = Field(default=None, description="streamed call; None in rows from before schema 2")
    connect_timeout_s: float | None = None
    read_timeout_s: float | None = None
    total_timeout_s: float | None = None
    instruction_version: str
    instruction_sha256: str
    # when
    measured_at: dt.datetime = Field(description="UTC start of the first attempt")
    measurement_date: dt.date = Field(description="UTC date of the first attempt; the partition key")
    date_is_window: bool = Field(
        default=False, description="True when only a measurement window is known (imports)"
    )
    # what happened
    outcome: Outcome
    cancel_reason: str | None = None
    attempts: list[Attempt] = Field(default_factory=list)
    latency_ms: float | None = Field(default=None, description="latency of the final attempt")
    total_latency_ms: float | None = Field(
        default=None,
        description="every attempt's latency plus the backoff waits between attempts (ms); None when no "
        "call was made (cancelled before the first attempt, imports)",
    )
    status_code: int | None = None
    finish_reason: str | None = None
    retired_on: str | None = None
    # what came back
    response_text: str | None = None
    reasoning_text: str | None = None
    answer_chars: int = 0
    reasoning_chars: int = 0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    reasoning_tokens: int | None = None
    first_token_ms: float | None = Field(
        default=None, description="streamed: final attempt's start to its first token; None = not streamed or none came"
    )
    stream_duration_ms: float | None = Field(default=None, description="streamed: first token to the last byte")
    # the IR extracted from response_text
    parse_outcome: ParseOutcome = ParseOutcome.NOT_ATTEMPTED
    parse_repairs: list[str] = Field(default_factory=list)
    ir_json: str | None = Field(default=None, description="the validated IR, canonical JSON")
    node_ids: list[str] = Field(default_factory=list, description="distinct node ids, sorted")
    node_count: int = 0
    duplicate_id_count: int = 0
    irbench_version: str = ""
    # schema version 2: which execution of the run this row is
    execution_id: str | None = Field(
        default_factory=new_execution_id,
        description="one per execution of the run; None only in rows of schema version 1",
    )
    finished_at: dt.datetime | None = Field(
        default=None, description="UTC end of the execution (None: imports, schema version 1)"
    )
    # schema version 3: which measurement wave, and what the provider says answered
    wave: int = Field(default=1, ge=1, description="measurement wave of the campaign, from 1; 1 in older rows")
    wave_started_at: dt.datetime | None = Field(
        default=None, description="UTC start of the wave (None: wave 1 of a campaign that never declared waves)"
    )
    served_model: str | None = Field(
        default=None, max_length=SERVED_IDENTITY_MAX_CHARS,
        description="the answer's own `model` field (OpenAI, Ollama): the name the provider says served it",
    )
    system_fingerprint: str | None = Field(
        default=None, max_length=SERVED_IDENTITY_MAX_CHARS,
        description="OpenAI's `system_fingerprint`: the backend configuration that served the answer",
    )
    served_digest: str | None = Field(
        default=None, max_length=SERVED_IDENTITY_MAX_CHARS,
        description="the model digest an Ollama answer carries, where it carries one",
    )

    @property
    def succeeded(self) -> bool:
        """A run that produced a parseable IR (the metrics' definition of a run)."""
        return run_succeeded(self.parse_outcome, self.ir_json)

    @property
    def failed(self) -> bool:
        """What progress and campaign state count as failed: the call did not end ``ok`` or the
        answer yielded no IR (a truncated answer that still parsed counts as failed here)."""
        return self.outcome is not Outcome.OK or not self.succeeded

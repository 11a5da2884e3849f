"""Configuration of the simulated model endpoint, loaded from TOML.

```toml
seed = 7
api_key = "sim-secret"        # optional; when set, requests need `Authorization: Bearer <key>`

[models.sim-mild]
drop_prob = 0.05
latency_ms_median = 10
```

Every ``SimModel`` field has a default, so ``[models.x]`` alone declares a perfectly stable,
instant model. Probabilities are per run (per request) unless the field says otherwise.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from storage.errors import ConfigError

#: How a 429 tells the client when to come back (one header each; gateways differ):
#: ``retry-after`` delta-seconds, ``retry-after-date`` an HTTP-date in ``Retry-After``,
#: ``retry-after-ms`` (OpenAI/Azure), ``x-ratelimit-reset-requests``/``-tokens`` as a Go
#: duration ("1s", "6m0s", "20ms"), ``llm_provider-retry-after`` (LiteLLM's pass-through).
RetryAfterForm = Literal[
    "retry-after", "retry-after-date", "retry-after-ms", "x-ratelimit-reset-requests",
    "x-ratelimit-reset-tokens", "llm_provider-retry-after",
]

DEFAULT_INFERRED_WORDS: tuple[str, ...] = (
    "overview", "context", "persona", "output_format", "examples", "constraints",
    "workflow", "edge_cases", "tone", "validation", "inputs", "summary",
)


class SimModel(BaseModel):
    """Behaviour of one simulated model. Units are in the field names."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # structure perturbation (simulator/model.py)
    drop_prob: float = Field(default=0.0, ge=0, le=1, description="each true node dropped independently per run")
    rename_prob: float = Field(default=0.0, ge=0, le=1, description="per kept node: id restyled (RULE:X -> RULE_X ...)")
    add_rate: float = Field(default=0.0, ge=0, description="Poisson mean of extra inferred nodes per run")
    inferred_pool_size: int = Field(default=6, ge=0, description="size of the per-prompt pool of candidate inferred ids")
    inferred_words: tuple[str, ...] = Field(default=DEFAULT_INFERRED_WORDS, min_length=1)
    metadata_prob: float = Field(default=0.0, ge=0, le=1, description="per node: priority/category/range changed")
    # answer formatting
    fence_prob: float = Field(default=0.0, ge=0, le=1, description="answer wrapped in a ```json fence")
    prose_prob: float = Field(default=0.0, ge=0, le=1, description="prose before/after the JSON")
    json_indent: int | None = Field(
        default=None, ge=0, description="indentation of the answer JSON; None = compact (json's fast C encoder)"
    )
    # timing and size
    latency_ms_median: float = Field(default=0.0, ge=0)
    latency_sigma: float = Field(default=0.0, ge=0, description="sigma of the lognormal latency")
    reasoning_chars_mean: float = Field(default=0.0, ge=0, description="mean reasoning length; 0 = no reasoning")
    chars_per_token: float = Field(default=4.0, gt=0)
    # failures
    rate_limit_prob: float = Field(default=0.0, ge=0, le=1)
    retry_after_s: float = Field(default=1.0, ge=0)
    retry_after_headers: tuple[RetryAfterForm, ...] = Field(
        default=("retry-after", "retry-after-ms"), description="which headers a 429 carries (RetryAfterForm)"
    )
    server_error_prob: float = Field(default=0.0, ge=0, le=1, description="500 or 503")
    hang_prob: float = Field(default=0.0, ge=0, le=1)
    hang_s: float = Field(default=30.0, ge=0, description="sleep before answering when hanging")
    retired_after_requests: int | None = Field(default=None, ge=0, description="after N requests every call is 410")
    retired_on: str | None = None
    retirement_reference: str | None = None
    replacement_model: str | None = None
    listed: bool = True
    context_tokens: int | None = Field(
        default=None, ge=1, description="context window: a longer prompt + max_tokens is a 400 as llama.cpp words it"
    )
    # streaming (``stream: true``): the latency above is the time to the first chunk
    stream_chunk_chars: int = Field(default=16, ge=1, description="answer characters per streamed chunk")
    stream_chunk_interval_ms: float = Field(default=0.0, ge=0, description="pause between streamed chunks")
    stall_prob: float = Field(default=0.0, ge=0, le=1, description="stream stalls after its first chunk")
    stall_s: float = Field(default=30.0, ge=0, description="length of a stall before the stream resumes")
    # served identity: what an answer says served it (change it between waves to simulate a revision)
    served_model: str | None = Field(default=None, description="the answer's `model` field; None = the name asked for")
    system_fingerprint: str | None = Field(
        default="fp_irbench_sim", description="OpenAI answers' `system_fingerprint`; None = the field is left out"
    )
    served_digest: str | None = Field(
        default=None, description="the digest Ollama's `/api/tags` lists for the model; None = sha256 of its name"
    )


class SimConfig(BaseModel):
    """The whole simulated endpoint. ``api_key`` is never echoed in any response."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    seed: int = 0
    api_key: str | None = Field(default=None, repr=False)
    models: dict[str, SimModel] = Field(default_factory=dict)
    unknown_model_status: Literal[400, 404] = Field(
        default=404, description="404 (a provider) or 400 with LiteLLM's wording (a gateway) for an unknown model"
    )


def load_sim_config(path: str | Path) -> SimConfig:
    """Read and validate a simulator TOML file. Raises ``ConfigError`` naming the file and field."""
    p = Path(path)
    try:
        raw = tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ConfigError(f"simulator config {p} does not exist; pass --config with an existing TOML file") from exc
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"simulator config {p} is not readable TOML: {exc}") from exc
    try:
        return SimConfig.model_validate(raw)
    except ValidationError as exc:
        problems = [f"{'.'.join(str(x) for x in e['loc'])}: {e['msg']}" for e in exc.errors()]
        raise ConfigError(f"simulator config {p} is invalid; fix these fields:", problems) from exc

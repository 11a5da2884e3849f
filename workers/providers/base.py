"""The provider interface: one async call, one classified result.

A provider turns a ``ChatRequest`` into a ``Reply`` (2xx: ok / truncated / empty) or raises a
``workers.errors.ProviderError`` subclass carrying the failure's ``Outcome``. Retrying is not
the provider's business: ``workers.execute`` owns that policy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from storage.records import Outcome
from workers.runtask import TimeoutPolicy


@dataclass(frozen=True)
class ChatRequest:
    model: str
    user_message: str
    timeouts: TimeoutPolicy
    max_tokens: int | None = None
    temperature: float | None = None
    reasoning: bool | None = None
    json_schema: dict[str, Any] | None = None  # structured-output mode when set
    stream: bool = False  # ask for a streamed answer (SSE / NDJSON); the reply then has its timings
    options: dict[str, Any] = field(default_factory=dict)
    max_response_bytes: int | None = None  # bound on the decoded body; None = unbounded


@dataclass(frozen=True)
class ServedIdentity:
    """What a 2xx answer says served it, each bounded (``_http.identity_text``); None = not given.
    ``model``: the body's ``model`` field; ``system_fingerprint``: OpenAI's; ``digest``: a model
    digest (Ollama), where the answer carries one."""

    model: str | None = None
    system_fingerprint: str | None = None
    digest: str | None = None


@dataclass(frozen=True)
class Reply:
    """A 2xx answer. ``outcome`` is OK, TRUNCATED or EMPTY."""

    outcome: Outcome
    answer_text: str
    reasoning_text: str
    latency_ms: float
    status_code: int = 200
    bytes_received: int = 0
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    reasoning_tokens: int | None = None
    first_token_ms: float | None = None  # streamed: request start to the first token
    stream_duration_ms: float | None = None  # streamed: first token to the last byte
    served: ServedIdentity = ServedIdentity()


class Provider(Protocol):
    """One wire format. Implementations take an ``_http.HttpClient`` (an ``httpx.AsyncClient``, an
    ``AioClient`` or a ``DirectClient``) in their constructor."""

    wire_format: str

    async def complete(self, request: ChatRequest) -> Reply:
        """Make one call. Raises ``ProviderError`` subclasses for every non-2xx outcome."""
        ...

    async def list_models(self, timeouts: TimeoutPolicy) -> list[str]:
        """Model names the endpoint lists (``/v1/models`` or ``/api/tags``)."""
        ...

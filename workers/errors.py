"""One exception tree for everything that can go wrong in irbench.

    IrbenchError
    ├── ConfigError            a spec, corpus or option is wrong; the message says how to fix it
    ├── StorageError           the dataset cannot be read or written
    │                          (these two live in storage.errors, so every layer may raise them)
    ├── LimiterError           a limiter could not decide
    │   ├── LimiterUnavailable     its backend (Redis) cannot be reached
    │   ├── ModelDisabled          the model was disabled (410 Gone)
    │   └── WaitBudgetExceeded     no permit within the wait budget (carries the decision)
    ├── GateClosed             the model's gate closed while a run waited for a permit
    └── ProviderError          one attempt did not yield a usable answer; carries its Outcome
        ├── ProviderUnreachable    never got an answer
        │   ├── ConnectTimeout     (timeout_connect)
        │   ├── ReadTimeout        (timeout_read)
        │   ├── TotalTimeout       (timeout_total)
        │   └── ConnectFailed      (connect_error)
        └── ProviderRejected       got an answer, and it was a refusal or garbage
            ├── RateLimited        (rate_limited, retry_after_s)
            ├── ModelRetired       (retired, retired_on, reference)
            ├── ModelNotFound      (not_found)
            │   └── UnknownModel   (not_found: a gateway's 400/404 saying it routes no such model)
            ├── AuthFailed         (auth_error; the key is never echoed)
            ├── ClientFailed       (client_error)
            ├── ServerFailed       (server_error)
            ├── ProtocolFailed     (protocol_error)
            └── ContextExceeded    (context_exceeded: the prompt does not fit the context window)

Providers translate httpx errors into these at the boundary; httpx and redis exceptions never
leave ``workers/``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from storage.errors import ConfigError, IrbenchError, StorageError
from storage.records import Outcome

if TYPE_CHECKING:  # annotation only: workers.limits imports this module at run time
    from workers.limits.base import LimitDecision

__all__ = [
    "ConfigError",
    "GateClosed",
    "IrbenchError",
    "LimiterError",
    "LimiterUnavailable",
    "ModelDisabled",
    "ProviderError",
    "StorageError",
    "WaitBudgetExceeded",
]


class LimiterError(IrbenchError):
    """A limiter could not decide."""


class LimiterUnavailable(LimiterError):
    """The limiter's backend (Redis) cannot be reached; retry the task later."""


class ModelDisabled(LimiterError):
    """The model was disabled (e.g. HTTP 410 Gone); no further calls will be admitted."""

    def __init__(self, model: str, reason: str) -> None:
        super().__init__(
            f"model {model!r} is disabled ({reason}); no further calls are admitted. "
            "Remove it from the campaign, or re-enable it with Limiter.enable() if this was a mistake."
        )
        self.model = model
        self.reason = reason


class WaitBudgetExceeded(LimiterError):
    """``acquire(max_wait_s=...)`` would have to wait past its budget; ``decision`` says how long
    and whether a slot is reserved for the holder (come back at ``decision.wait_s``)."""

    def __init__(self, model: str, decision: LimitDecision) -> None:
        super().__init__(
            f"no permit for model {model!r} within the wait budget ({decision.reason}, "
            f"next chance in {decision.wait_s:.3f} s); defer the work and retry then"
        )
        self.decision = decision


class GateClosed(IrbenchError):
    """The model was closed while this run waited for a permit; ``str()`` is the gate's reason."""


class ProviderError(IrbenchError):
    outcome: Outcome = Outcome.PROTOCOL_ERROR

    def __init__(
        self,
        message: str,
        *,
        status_code: int | None = None,
        latency_ms: float = 0.0,
        bytes_received: int = 0,
        retry_after_s: float | None = None,
        first_token_ms: float | None = None,
        body_head: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.latency_ms = latency_ms
        self.bytes_received = bytes_received
        self.retry_after_s = retry_after_s
        self.first_token_ms = first_token_ms  # streamed calls: when the first token came, if it did
        self.body_head = body_head  # the start of a body refused as too large (secrets masked)


class ProviderUnreachable(ProviderError):
    pass


class ConnectTimeout(ProviderUnreachable):
    outcome = Outcome.TIMEOUT_CONNECT


class ReadTimeout(ProviderUnreachable):
    outcome = Outcome.TIMEOUT_READ


class TotalTimeout(ProviderUnreachable):
    outcome = Outcome.TIMEOUT_TOTAL


class ConnectFailed(ProviderUnreachable):
    outcome = Outcome.CONNECT_ERROR


class ProviderRejected(ProviderError):
    pass


class RateLimited(ProviderRejected):
    outcome = Outcome.RATE_LIMITED


class ModelRetired(ProviderRejected):
    outcome = Outcome.RETIRED

    def __init__(self, message: str, *, retired_on: str | None = None, reference: str | None = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.retired_on = retired_on
        self.reference = reference


class ModelNotFound(ProviderRejected):
    outcome = Outcome.NOT_FOUND


class UnknownModel(ModelNotFound):
    """A gateway (LiteLLM, OpenRouter, ...) rejected the model name as one it does not route."""


class AuthFailed(ProviderRejected):
    outcome = Outcome.AUTH_ERROR


class ClientFailed(ProviderRejected):
    outcome = Outcome.CLIENT_ERROR


class ServerFailed(ProviderRejected):
    outcome = Outcome.SERVER_ERROR


class ProtocolFailed(ProviderRejected):
    outcome = Outcome.PROTOCOL_ERROR


class ContextExceeded(ProviderRejected):
    """The request does not fit the model's context window (the server's message is kept)."""

    outcome = Outcome.CONTEXT_EXCEEDED

"""The Redis state workers and the orchestrator share: campaign state, limiter, gate, claim permits."""

__all__ = [
    "broker_view",
    "campaign_state",
    "claim_permit",
    "connect",
    "gate",
    "limiter_waiters",
    "presence",
    "redis_limiter",
    "redis_retry",
    "script_batch",
]

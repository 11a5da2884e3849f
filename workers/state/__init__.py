"""The Redis state workers and the orchestrator share: campaign state (claims, queues, done log, gate flags), limiter, gate, claim permits, spend cap counters, wave schedules, a bucket store's upload log."""

__all__ = [
    "broker_view",
    "broker_watch",
    "campaign_keys",
    "campaign_lua",
    "campaign_state",
    "claim_permit",
    "connect",
    "done_runs",
    "gate",
    "gate_flags",
    "limiter_waiters",
    "presence",
    "published_objects",
    "redis_limiter",
    "redis_retry",
    "run_claims",
    "run_queues",
    "script_batch",
    "spend_counters",
    "wave_schedules",
]

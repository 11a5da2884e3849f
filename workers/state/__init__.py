"""The Redis state workers and the orchestrator share: campaign state (claims, queues, done log, gate flags), limiter, gate, claim permits, wave schedules."""

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
    "redis_limiter",
    "redis_retry",
    "run_claims",
    "run_queues",
    "script_batch",
    "wave_schedules",
]

"""The retry policy as pure functions: which outcomes are retried, and how long to wait.

failures.md: rate_limited, server_error and connect_error are retried with capped exponential
backoff and jitter (Retry-After honoured up to ``max_retry_after_s``: an endpoint advertising a
longer wait ends the run with that outcome, the advertised value stored with the attempt);
timeouts only if the policy says so; everything else never. No wait may end past the run's
``run_deadline_s``. ``workers.execute`` is the one loop that applies this.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from storage.outcomes import RETRIED_WITHIN_RUN, TIMEOUT_OUTCOMES
from storage.records import Outcome
from workers.runtask import RetryPolicy

# Outcomes that count towards disabling a model for the campaign (failures.md).
DISABLING = frozenset({Outcome.AUTH_ERROR, Outcome.NOT_FOUND, Outcome.CLIENT_ERROR})


@dataclass(frozen=True)
class RetryDecision:
    retry: bool
    wait_s: float = 0.0


def decide(
    outcome: Outcome,
    attempt: int,
    policy: RetryPolicy,
    retry_after_s: float | None,
    rng: random.Random,
    elapsed_s: float = 0.0,
) -> RetryDecision:
    """Whether attempt number ``attempt`` (1-based) that ended in ``outcome`` is retried.

    The wait is ``min(cap, base * 2**(attempt-1))`` with full jitter, but never shorter than
    the server's Retry-After. A Retry-After above ``policy.max_retry_after_s``, or a wait that
    would end after ``policy.run_deadline_s`` (``elapsed_s``: seconds since the run's first
    attempt started), is not retried.
    """
    retryable = outcome in RETRIED_WITHIN_RUN or (policy.retry_timeouts and outcome in TIMEOUT_OUTCOMES)
    if not retryable or attempt >= policy.max_attempts:
        return RetryDecision(False)
    if retry_after_s is not None and retry_after_s > policy.max_retry_after_s:
        return RetryDecision(False)
    backoff = min(policy.backoff_cap_s, policy.backoff_base_s * 2 ** (attempt - 1))
    wait = rng.uniform(0.0, backoff)
    if retry_after_s is not None:
        wait = max(wait, retry_after_s)
    if policy.run_deadline_s is not None and elapsed_s + wait >= policy.run_deadline_s:
        return RetryDecision(False)
    return RetryDecision(True, wait)

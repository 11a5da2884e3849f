"""The outcome vocabulary: which outcome classes count as succeeded, failed, timed out or worth
another try. Defined here once; the workers, ``status``, ``--retry-failed``, the analysis and the
viewer's SQL all read these names (``Outcome``: one class per attempt; ``ParseOutcome``: how the IR was extracted)."""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa


class Outcome(StrEnum):
    """Exactly one class per attempt (failures.md)."""

    OK = "ok"
    TRUNCATED = "truncated"
    EMPTY = "empty"
    TIMEOUT_CONNECT = "timeout_connect"
    TIMEOUT_READ = "timeout_read"
    TIMEOUT_TOTAL = "timeout_total"
    CONNECT_ERROR = "connect_error"
    RATE_LIMITED = "rate_limited"
    RETIRED = "retired"
    NOT_FOUND = "not_found"
    AUTH_ERROR = "auth_error"
    CLIENT_ERROR = "client_error"
    SERVER_ERROR = "server_error"
    PROTOCOL_ERROR = "protocol_error"
    CONTEXT_EXCEEDED = "context_exceeded"  # the prompt (+ budget) does not fit the model's context
    CANCELLED = "cancelled"
    WORKER_ERROR = "worker_error"  # the run's task raised or killed its worker N times (poison run)
    WORKER_DIED = "worker_died"  # the worker died mid-call: the call was sent, its outcome is unknown


class ParseOutcome(StrEnum):
    """How the IR was extracted from the raw answer text (ir.md)."""

    OK = "ok"
    REPAIRED = "repaired"
    INVALID_JSON = "invalid_json"
    SCHEMA_INVALID = "schema_invalid"
    EMPTY = "empty"
    TRUNCATED = "truncated"
    NOT_ATTEMPTED = "not_attempted"  # no answer text to parse (the call failed)

#: The three deadlines of a call (failures.md): connect, between bytes, whole call.
TIMEOUT_OUTCOMES: frozenset[Outcome] = frozenset({Outcome.TIMEOUT_CONNECT, Outcome.TIMEOUT_READ, Outcome.TIMEOUT_TOTAL})

#: Retried inside one run by the worker's backoff (``workers.retry``): the endpoint said "later".
RETRIED_WITHIN_RUN: frozenset[Outcome] = frozenset({Outcome.RATE_LIMITED, Outcome.SERVER_ERROR, Outcome.CONNECT_ERROR})

#: What ``irbench run --retry-failed`` executes again by default, and what ``status`` calls
#: retryable: the endpoint may answer next time. Auth, not-found, retired, client errors and
#: truncation are left out, since repeating the call cannot change them (or, for truncation,
#: would change the measurement).
RERUN_BY_DEFAULT: frozenset[Outcome] = RETRIED_WITHIN_RUN | TIMEOUT_OUTCOMES | {
    Outcome.PROTOCOL_ERROR, Outcome.CANCELLED, Outcome.WORKER_DIED}

#: Runs that never reached their end: the same ``irbench run`` again executes them, without
#: ``--retry-failed`` (a cancelled run; a run whose worker died mid-call).
UNFINISHED: frozenset[Outcome] = frozenset({Outcome.CANCELLED, Outcome.WORKER_DIED})

#: A model answering with one of these is closed for the campaign (its remaining runs are stored
#: ``cancelled``): the next call would meet the same wall, so those cancelled runs are not
#: retried by default either, until the class itself is chosen (``--outcomes not_found,cancelled``).
CLOSES_MODEL: frozenset[Outcome] = frozenset(
    {Outcome.NOT_FOUND, Outcome.AUTH_ERROR, Outcome.RETIRED, Outcome.CLIENT_ERROR})

#: Parse outcomes of a *successful run* everywhere (metrics, probes, timeouts, manifests,
#: imports, the viewer): the answer yielded a validated IR, possibly after repairs.
SUCCESS_PARSE_OUTCOMES: frozenset[str] = frozenset({ParseOutcome.OK.value, ParseOutcome.REPAIRED.value})


def run_succeeded(parse_outcome: str | None, ir_json: str | None) -> bool:
    """One run: a parsed IR is present and its parse outcome is ``ok`` or ``repaired``."""
    return ir_json is not None and parse_outcome in SUCCESS_PARSE_OUTCOMES


def succeeded_mask(runs: pa.Table) -> pa.ChunkedArray:
    """The same predicate over a runs table (columns ``parse_outcome``, ``ir_json``): a boolean
    array, one entry per row, never null."""
    import pyarrow as pa  # here, not at the top: the record types load without pyarrow
    import pyarrow.compute as pc

    outcome_ok = pc.is_in(runs.column("parse_outcome"), value_set=pa.array(sorted(SUCCESS_PARSE_OUTCOMES)))
    return pc.and_(pc.fill_null(outcome_ok, False), pc.is_valid(runs.column("ir_json")))




def succeeded_sql(parse_column: str = "parse_outcome", ir_column: str = "ir_json") -> str:
    """``run_succeeded`` as a SQL boolean expression over the named columns (DuckDB)."""
    values = ", ".join(f"'{v}'" for v in sorted(SUCCESS_PARSE_OUTCOMES))
    return f"({ir_column} IS NOT NULL AND {parse_column} IN ({values}))"


def call_failed_sql(outcome_column: str = "outcome") -> str:
    """The call ended in any class but ``ok``, as a SQL boolean expression (DuckDB); the stricter
    parsed-IR test is ``succeeded_sql``."""
    return f"({outcome_column} <> '{Outcome.OK.value}')"

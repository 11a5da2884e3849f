"""Which runs ``irbench run --retry-failed`` executes again, and how ``status`` counts them.

A run is *retryable* when its latest stored execution (``storage.runs.EXECUTION_RULE``) ended in
one of the chosen outcome classes. Retrying adds a new execution; the earlier ones stay in the
store as history, and every reader (analysis, status, resume) uses the latest.

The default classes are the transient ones (``../shared/spec/failures.md``): the endpoint may
answer next time. ``auth_error``, ``not_found``, ``retired``, ``client_error`` and ``truncated``
are not retried unless named, since repeating the call cannot change them (or, for truncated,
would change the measurement).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.campaign.prepared import PreparedCampaign
from storage.outcomes import CLOSES_MODEL, RERUN_BY_DEFAULT, TIMEOUT_OUTCOMES, UNFINISHED
from storage.records import Outcome
from storage.runs import RunStore
from storage.parquet.unreadable import RowSelection, read_checked
from workers.errors import ConfigError
from workers.runtask import RunTask

if TYPE_CHECKING:
    from orchestrator.campaign.plan import LazyPlan
    from orchestrator.campaign.plan_state import LatestRuns


#: Names accepted by ``--outcomes`` besides the outcome classes themselves.
GROUPS: Mapping[str, frozenset[Outcome]] = {"timeouts": TIMEOUT_OUTCOMES, "transient": RERUN_BY_DEFAULT}


def parse_outcomes(text: str | None) -> frozenset[Outcome]:
    """``--outcomes a,b,…`` → outcome classes (default: the transient ones).

    Accepts class names (``rate_limited``) and the groups ``timeouts`` and ``transient``;
    anything else is a ConfigError naming the valid choices.
    """
    if text is None or not text.strip():
        return RERUN_BY_DEFAULT
    chosen: set[Outcome] = set()
    unknown = []
    for name in (n.strip().lower() for n in text.split(",") if n.strip()):
        if name in GROUPS:
            chosen |= GROUPS[name]
        elif name in {o.value for o in Outcome}:
            chosen.add(Outcome(name))
        else:
            unknown.append(name)
    if unknown:
        valid = ", ".join([*GROUPS, *(o.value for o in Outcome)])
        raise ConfigError(f"--outcomes: unknown class(es) {', '.join(unknown)}; choose from {valid}")
    if Outcome.OK in chosen:
        raise ConfigError("--outcomes: 'ok' runs are not failures; run a new campaign (or --runs N) to measure again")
    return frozenset(chosen)


def rerun_outcomes(retry_failed: bool, outcomes: str | None) -> frozenset[Outcome]:
    """The classes whose stored runs a ``run`` or ``probe`` executes again: those of
    ``--retry-failed --outcomes`` (when asked), and always ``cancelled`` and ``worker_died``
    (``UNFINISHED``): such a run never reached its end, so the same command again resumes it
    (``retryable_tasks`` leaves out the cancelled runs of closed models). ConfigError for
    ``--outcomes`` without ``--retry-failed``."""
    if outcomes is not None and not retry_failed:
        raise ConfigError("--outcomes only goes with --retry-failed")
    return (parse_outcomes(outcomes) if retry_failed else frozenset()) | UNFINISHED


def latest_outcomes(prepared: PreparedCampaign, store: RunStore, *, skip_corrupt: bool = False) -> dict[str, str]:
    """run_id → outcome of its latest execution, for the planned runs that have one
    (``skip_corrupt``: unreadable files are left out, as ``irbench status --skip-corrupt`` does)."""
    planned = {t.run_id for t in prepared.tasks}
    selection = RowSelection(filters={"campaign": [prepared.spec.name]}, columns=["run_id", "outcome"])
    table, _ = read_checked(store.dataset, skip=skip_corrupt, selection=selection)
    return {r: o for r, o in zip(table.column("run_id").to_pylist(), table.column("outcome").to_pylist())
            if r in planned}


def retryable_tasks(
    tasks: Iterable[RunTask], latest: Mapping[str, str], outcomes: frozenset[Outcome]
) -> list[RunTask]:
    """The tasks whose latest execution ended in ``outcomes``, in planned order. A ``cancelled``
    run of a model that another run shows closed (``CLOSES_MODEL``, a class not in ``outcomes``)
    is left out: retrying it would meet the same wall."""
    tasks = list(tasks)
    wanted = {o.value for o in outcomes}
    walls = {o.value for o in CLOSES_MODEL - outcomes}
    closed = {t.model for t in tasks if latest.get(t.run_id) in walls}
    return [t for t in tasks if latest.get(t.run_id) in wanted
            and not (latest[t.run_id] == Outcome.CANCELLED.value and t.model in closed)]


@dataclass(frozen=True)
class Retryable:
    """Runs a ``--retry-failed`` would execute again, per latest outcome class."""

    by_outcome: Mapping[str, int]

    @property
    def total(self) -> int:
        return sum(self.by_outcome.values())

    def describe(self) -> str:
        return ", ".join(f"{k} {v}" for k, v in sorted(self.by_outcome.items()))


def retryable(
    prepared: PreparedCampaign, store: RunStore, outcomes: frozenset[Outcome] = RERUN_BY_DEFAULT, *,
    skip_corrupt: bool = False,
) -> Retryable:
    """Counts of the planned runs whose latest execution ended in ``outcomes`` (a prepared plan's
    from its indices; a hand-made task list's from its run ids)."""
    from orchestrator.campaign.plan import LazyPlan
    from orchestrator.campaign.plan_state import latest_runs

    if isinstance(prepared.tasks, LazyPlan):
        return retryable_of(prepared.tasks, latest_runs(prepared.tasks, store, skip_corrupt=skip_corrupt), outcomes)
    latest = latest_outcomes(prepared, store, skip_corrupt=skip_corrupt)
    return Retryable(dict(Counter(latest[t.run_id] for t in retryable_tasks(prepared.tasks, latest, outcomes))))


def retryable_of(plan: LazyPlan, latest: LatestRuns, outcomes: frozenset[Outcome] = RERUN_BY_DEFAULT) -> Retryable:
    """:func:`retryable` from an earlier read of the latest executions (``status`` reads once)."""
    from orchestrator.campaign.plan_state import retryable_mask

    chosen = latest.outcomes[retryable_mask(plan, latest, outcomes)]
    return Retryable(dict(Counter(str(o) for o in chosen.tolist())))


def retry_command(campaign_file: Path, data: Path, outcomes: frozenset[Outcome] = RERUN_BY_DEFAULT) -> str:
    """The command line that retries them (``--outcomes`` only when not the default)."""
    cmd = f"irbench run {campaign_file} --data {data} --retry-failed"
    if outcomes != RERUN_BY_DEFAULT:
        cmd += " --outcomes " + ",".join(sorted(o.value for o in outcomes))
    return cmd


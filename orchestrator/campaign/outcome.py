"""How a campaign stands after a command: its planned runs whose latest execution did not end
``ok``, per model, with the class and the first error message a user needs to act on.

``irbench run`` turns this into its exit code (``exit_code``) and one stderr line per failing
model, so a script or CI job can tell a campaign that failed from one that succeeded.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

from storage.outcomes import Outcome

if TYPE_CHECKING:
    from orchestrator.campaign.prepared import PreparedCampaign
    from storage.runs import RunStore

#: ``irbench run``'s exit codes beyond 0 (every planned run ok), 2 (user error) and 130 (Ctrl-C).
SOME_FAILED_EXIT_CODE = 3
ALL_FAILED_EXIT_CODE = 4
ERROR_SHOWN_MAX_CHARS = 200
_COLUMNS = ("run_id", "model", "outcome", "attempts", "cancel_reason")


@dataclass(frozen=True)
class ModelFailures:
    """One model's planned runs whose latest execution is not ``ok``.

    ``by_outcome``: failed runs per outcome class, most frequent first; ``first_error``: the
    error text of the first such run (by run id), one line, at most ``ERROR_SHOWN_MAX_CHARS``."""

    model: str
    planned: int
    failed: int
    by_outcome: tuple[tuple[str, int], ...]
    first_error: str | None

    def line(self) -> str:
        """``model: 6/12 runs failed (not_found 6): <first error>``."""
        classes = ", ".join(f"{outcome} {n}" for outcome, n in self.by_outcome)
        error = f": {self.first_error}" if self.first_error else ""
        return f"{self.model}: {self.failed}/{self.planned} runs failed ({classes}){error}"


@dataclass(frozen=True)
class CampaignOutcome:
    """The campaign's planned runs, how many are stored, and the models with failed runs."""

    planned: int
    stored: int
    failed: int
    models: tuple[ModelFailures, ...]

    @property
    def exit_code(self) -> int:
        """0 when no stored run failed, ``ALL_FAILED_EXIT_CODE`` when every planned run is
        stored and failed, else ``SOME_FAILED_EXIT_CODE``."""
        if self.failed == 0:
            return 0
        return ALL_FAILED_EXIT_CODE if self.failed == self.planned else SOME_FAILED_EXIT_CODE


def _shown(error: str | None) -> str | None:
    if not error:
        return None
    text = " ".join(error.split())
    return text if len(text) <= ERROR_SHOWN_MAX_CHARS else text[: ERROR_SHOWN_MAX_CHARS - 1] + "…"


def campaign_outcome(prepared: PreparedCampaign, store: RunStore) -> CampaignOutcome:
    """Read the latest execution of each planned run of ``prepared`` from ``store``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from orchestrator.campaign.plan import LOCATE_COLUMNS

    plan = prepared.plan
    planned_by_model = plan.planned_by_model()
    table = store.read_table(campaigns=[prepared.spec.name], columns=list(dict.fromkeys([*LOCATE_COLUMNS, *_COLUMNS])))
    table = table.filter(pa.array(plan.locate(table) >= 0))  # the planned runs (sorted by run_id still)
    stored = table.num_rows
    if stored:
        table = table.filter(pc.not_equal(table.column("outcome"), Outcome.OK.value))
    failed: dict[str, Counter[str]] = {}
    first_error: dict[str, str | None] = {}
    for _, model, outcome, attempts, cancel_reason in zip(*(table.column(c).to_pylist() for c in _COLUMNS)):
        failed.setdefault(model, Counter())[outcome] += 1
        if model not in first_error:  # rows come sorted by run_id
            first_error[model] = _shown((attempts[-1].get("error") if attempts else None) or cancel_reason)
    models = tuple(
        ModelFailures(model, planned_by_model[model], sum(counts.values()), tuple(counts.most_common()),
                      first_error.get(model))
        for model, counts in sorted(failed.items())
    )
    return CampaignOutcome(len(plan), stored, sum(m.failed for m in models), models)

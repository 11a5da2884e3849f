"""A campaign's spend cap made concrete: its checks, and the ``workers.spend.SpendPlan`` an
executor runs it under (the caps, the prices per token, what the store already holds).

``max_cost_usd`` / ``max_total_tokens`` at the top of a campaign cap the campaign; in
``[models.X]`` (or ``[defaults]``) they cap each model. What counts is every stored execution of
the wave being run (a new wave is a new measurement, and so a new purchase), retries included;
the cap is checked against it again each time the campaign runs, so raising it and running
the same command resumes, and lowering it below what was spent stops the campaign before any call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from orchestrator.campaign.cost import campaign_prices
from orchestrator.campaign.spec import CampaignSpec
from storage.prices import TOKENS_PER_MTOK, TokenPrice
from storage.runs import RunStore
from workers.spend import CAMPAIGN_SCOPE, SPEND_CAP_REASON, SpendCap, SpendPlan, Spent, UsdPerToken

if TYPE_CHECKING:
    from orchestrator.campaign.plan import LazyPlan

#: A refused reservation's exit code for ``irbench run`` (``orchestrator.cli.run_command``).
SPEND_CAP_EXIT_CODE = 5


def spend_cap_problems(fname: str, spec: CampaignSpec) -> list[str]:
    """One line per cost cap whose models have no complete price (their cost could not be counted)."""
    prices = campaign_prices(spec)
    problems = []
    if spec.max_cost_usd is not None:
        missing = sorted(m for m, p in prices.items() if not p.complete)
        if missing:
            problems.append(f"{fname}: max_cost_usd: models {', '.join(missing)} have no input_usd_per_mtok and "
                            "output_usd_per_mtok; give their prices or cap max_total_tokens instead")
    for key, model in spec.models.items():
        if model.max_cost_usd is not None and not prices[model.name].complete:
            problems.append(f"{fname}: models.{key}.max_cost_usd: the model has no input_usd_per_mtok and "
                            "output_usd_per_mtok; give its prices or cap max_total_tokens instead")
    return problems


def _per_token(price: TokenPrice) -> UsdPerToken:
    return UsdPerToken(prompt=(price.input_usd_per_mtok or 0.0) / TOKENS_PER_MTOK,
                       completion=(price.output_usd_per_mtok or 0.0) / TOKENS_PER_MTOK)


def spend_plan(spec: CampaignSpec, wave: int, store: RunStore) -> SpendPlan:
    """The caps of ``spec`` with what its ``wave`` already spent (read from the store only when
    something is capped)."""
    caps: dict[str, SpendCap] = {}
    if spec.spend_cap().capped:
        caps[CAMPAIGN_SCOPE] = spec.spend_cap()
    for model in spec.models.values():
        if model.spend_cap().capped:
            caps[model.name] = model.spend_cap()
    prices = {m: _per_token(p) for m, p in campaign_prices(spec).items()}
    if not caps:
        return SpendPlan(spec.name, caps, prices)
    spent = stored_spend(store, spec.name, wave, prices)
    scoped = {s: (sum(spent.values(), Spent()) if s == CAMPAIGN_SCOPE else spent.get(s, Spent())) for s in caps}
    return SpendPlan(spec.name, caps, prices, scoped)


def stored_spend(store: RunStore, campaign: str, wave: int, prices: dict[str, UsdPerToken]) -> dict[str, Spent]:
    """Model -> tokens and cost of every stored execution of ``campaign``'s ``wave`` (a row
    without usage counts as none), at ``prices``."""
    table = store.dataset.read(filters={"campaign": [campaign], "wave": [wave]}, dedupe="executions",
                               columns=["model", "prompt_tokens", "completion_tokens"])
    if table.num_rows == 0:
        return {}
    grouped = pa.table({
        "model": table.column("model"),
        "p": pc.fill_null(table.column("prompt_tokens"), 0).cast(pa.int64()),
        "c": pc.fill_null(table.column("completion_tokens"), 0).cast(pa.int64()),
    }).group_by(["model"]).aggregate([("p", "sum"), ("c", "sum")])
    out: dict[str, Spent] = {}
    for model, p, c in zip(*(grouped.column(k).to_pylist() for k in ("model", "p_sum", "c_sum"))):
        out[model] = Spent(p + c, prices.get(model, UsdPerToken()).cost(p, c))
    return out


def spend_cap_stop(store: RunStore, plan: LazyPlan) -> tuple[str, int] | None:
    """(a reason, runs) when some planned runs' latest execution was cancelled by a spend cap."""
    from orchestrator.campaign.plan import LOCATE_COLUMNS

    table = store.read_table(campaigns=[plan.campaign], columns=list(dict.fromkeys([*LOCATE_COLUMNS, "outcome",
                                                                                    "cancel_reason"])))
    if table.num_rows == 0:
        return None
    capped = table.filter(pc.starts_with(pc.fill_null(table.column("cancel_reason"), ""), SPEND_CAP_REASON))
    hits = np.flatnonzero(plan.locate(capped) >= 0)
    if not hits.size:
        return None
    return capped.column("cancel_reason")[int(hits[0])].as_py(), int(hits.size)

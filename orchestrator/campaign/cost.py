"""A campaign's prices resolved per model (the rule is in ``orchestrator.campaign.prices``), and
their record beside the runs (``storage.prices``), which the report, viewer and status read."""

from __future__ import annotations

from pathlib import Path

from orchestrator.campaign.prices import PRICE_FIELDS, load_price_file
from orchestrator.campaign.spec import CampaignSpec, ModelSpec
from storage.prices import TokenPrice, write_prices


def model_price(spec: CampaignSpec, model: ModelSpec, shared: dict[str, TokenPrice]) -> TokenPrice:
    """``model``'s price, each field from the model, else the price file ``shared``, else its endpoint."""
    endpoint = spec.endpoints[model.endpoint]
    filed = shared.get(model.name, TokenPrice())
    values = {}
    for name in PRICE_FIELDS:
        for source in (model, filed, endpoint):
            value = getattr(source, name)
            if value is not None:
                values[name] = value
                break
    return TokenPrice(**values)


def campaign_prices(spec: CampaignSpec) -> dict[str, TokenPrice]:
    """Model id → price for every model of ``spec`` (an empty price where none is given)."""
    shared = load_price_file(spec.prices) if spec.prices is not None else {}
    return {m.name: model_price(spec, m, shared) for m in spec.models.values()}


def record_prices(spec: CampaignSpec, data_root: Path, *, fsync: bool = True) -> Path:
    """Write ``spec``'s prices to ``data_root/prices/<campaign>.json``; returns the path."""
    return write_prices(data_root, spec.name, campaign_prices(spec), fsync=fsync)

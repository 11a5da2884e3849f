"""The ``prices/`` record: the token prices in force when a campaign ran, kept beside its runs so
readers (the report, the viewer, ``status``) can turn stored token counts into money without the
campaign file.

One JSON file per campaign, ``DATA/prices/<campaign>.json``, rewritten atomically each time the
campaign runs (the prices of the latest run are the ones shown). Prices are US dollars per million
tokens; ``None`` means "not given" (the cost of that model is then unknown, never zero).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from storage.clock import utc_now
from storage.errors import StorageError

PRICES_DIR = "prices"
#: Bytes read from one prices file at most: a record holds a few hundred bytes per model.
PRICES_FILE_MAX_BYTES = 4 * 1024 * 1024
TOKENS_PER_MTOK = 1_000_000


class TokenPrice(BaseModel):
    """One model's price: US dollars per million prompt (input) and completion (output) tokens."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    input_usd_per_mtok: float | None = Field(default=None, ge=0)
    output_usd_per_mtok: float | None = Field(default=None, ge=0)

    @property
    def complete(self) -> bool:
        return self.input_usd_per_mtok is not None and self.output_usd_per_mtok is not None

    def cost_usd(self, prompt_tokens: float, completion_tokens: float) -> float | None:
        """Dollars for these token counts; None when either price is missing."""
        if not self.complete:
            return None
        assert self.input_usd_per_mtok is not None and self.output_usd_per_mtok is not None
        return (prompt_tokens * self.input_usd_per_mtok + completion_tokens * self.output_usd_per_mtok) / TOKENS_PER_MTOK


class CampaignPrices(BaseModel):
    """The prices a campaign ran with: model id → price, and when they were recorded (UTC)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    campaign: str
    recorded_at: dt.datetime
    models: dict[str, TokenPrice] = Field(default_factory=dict)


def prices_path(root: Path, campaign: str) -> Path:
    return Path(root) / PRICES_DIR / f"{campaign}.json"


def write_prices(root: Path, campaign: str, models: Mapping[str, TokenPrice], *, fsync: bool = True) -> Path:
    """Record ``models``' prices for ``campaign`` under ``root`` (atomic replace); returns the path."""
    record = CampaignPrices(campaign=campaign, recorded_at=utc_now(), models=dict(models))
    path = prices_path(root, campaign)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(record.model_dump_json(indent=1))
            if fsync:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def read_prices(root: Path, campaign: str | None = None) -> dict[str, CampaignPrices]:
    """Campaign → recorded prices under ``root`` (one campaign, or all); an unreadable record is a
    ``StorageError`` naming the file."""
    folder = Path(root) / PRICES_DIR
    if campaign is not None:
        files = [prices_path(root, campaign)]
    else:
        files = sorted(folder.glob("*.json")) if folder.is_dir() else []
    out: dict[str, CampaignPrices] = {}
    for path in files:
        if not path.is_file():
            continue
        try:
            with path.open("rb") as fh:
                data = fh.read(PRICES_FILE_MAX_BYTES + 1)
            if len(data) > PRICES_FILE_MAX_BYTES:
                raise ValueError(f"larger than {PRICES_FILE_MAX_BYTES} bytes")
            record = CampaignPrices.model_validate(json.loads(data))
        except (OSError, ValueError, ValidationError) as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise StorageError(f"{path}: unreadable prices record ({first}); delete it and run the campaign again") from None
        out[record.campaign] = record
    return out


def price_for(prices: Mapping[str, CampaignPrices], campaign: str, model: str) -> TokenPrice | None:
    """The recorded price of ``model`` in ``campaign``, if any."""
    record = prices.get(campaign)
    return record.models.get(model) if record else None


class TokenTotals(BaseModel):
    """Tokens spent by stored executions and, where prices are known, their cost."""

    executions: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float | None = None  # None: no price for some of these tokens

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


SPEND_COLUMNS = ("campaign", "model", "prompt_tokens", "completion_tokens")


def spend_by_model(executions: pa.Table, prices: Mapping[str, CampaignPrices]) -> dict[str, TokenTotals]:
    """Model → tokens and cost of every row of ``executions`` (columns ``SPEND_COLUMNS``; pass
    every stored execution, not one per run: a run executed twice was paid twice). A row without
    usage counts as zero tokens; a model's cost is None when any of its campaigns has no price."""
    out: dict[str, TokenTotals] = {}
    if executions.num_rows == 0:
        return out
    grouped = pa.table({
        "campaign": executions.column("campaign"), "model": executions.column("model"),
        "p": pc.fill_null(executions.column("prompt_tokens"), 0).cast(pa.int64()),
        "c": pc.fill_null(executions.column("completion_tokens"), 0).cast(pa.int64()),
    }).group_by(["campaign", "model"]).aggregate([("p", "sum"), ("c", "sum"), ("p", "count")])
    for campaign, model, p, c, n in zip(*(grouped.column(k).to_pylist() for k in
                                          ("campaign", "model", "p_sum", "c_sum", "p_count"))):
        price = price_for(prices, campaign, model)
        cost = price.cost_usd(p, c) if price is not None else None
        t = out.get(model)
        if t is None:
            out[model] = TokenTotals(executions=n, prompt_tokens=p, completion_tokens=c, cost_usd=cost)
        else:
            both = None if t.cost_usd is None or cost is None else t.cost_usd + cost
            out[model] = TokenTotals(executions=t.executions + n, prompt_tokens=t.prompt_tokens + p,
                                     completion_tokens=t.completion_tokens + c, cost_usd=both)
    return dict(sorted(out.items()))


def spend_total(by_model: Mapping[str, TokenTotals]) -> TokenTotals:
    """The sum of ``by_model`` (cost None when any model's is)."""
    costs = [t.cost_usd for t in by_model.values()]
    return TokenTotals(
        executions=sum(t.executions for t in by_model.values()),
        prompt_tokens=sum(t.prompt_tokens for t in by_model.values()),
        completion_tokens=sum(t.completion_tokens for t in by_model.values()),
        cost_usd=None if not costs or any(c is None for c in costs) else sum(c for c in costs if c is not None),
    )

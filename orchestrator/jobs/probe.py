"""The failure-attribution probe: a campaign kind crossing models × token budgets × runs.

A probe file is an ordinary campaign TOML (``orchestrator.campaign.spec``) with at least two
``budgets`` (e.g. ``[1500, 8000]``) and a generous ``total_timeout_s`` for every model — above
the reference timeout being audited, so slow answers are measured instead of cut off. Its runs
are stored like any campaign's (``runs/``, so ``irbench status`` and resume work); the summary
(``analysis.tables.probes``) goes to the ``probes/`` dataset and to a flat ``probes.parquet``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from rich.console import JustifyMethod
from rich.table import Table

from analysis.tables.probes import ProbeSettings, probe_input_from_runs, probe_table
from storage.parquet.atomic import write_parquet_atomic
from orchestrator.campaign.prepared import PreparedCampaign, prepare, resolve_secrets
from orchestrator.local.campaign import run_campaign_local
from orchestrator.local.executor import ProgressCallback
from orchestrator.campaign.spec import CampaignSpec, load_campaign
from storage.clock import utc_now
from storage.probes import ProbeStore
from storage.records import Outcome
from storage.runs import RunStore
from workers.errors import ConfigError

PROBE_SOURCE = "probe"

#: ``execute(prepared, store, secrets, on_progress) -> (skipped, summary)``; the local executor
#: by default, the Celery one when the caller passes it.
Executor = Callable[..., tuple[int, object]]


def check_probe_spec(spec: CampaignSpec, settings: ProbeSettings, fname: str = "probe") -> None:
    """Raise ``ConfigError`` unless ``spec`` can attribute failures under ``settings``."""
    problems: list[str] = []
    if not spec.budgets or len(spec.budgets) < 2:
        problems.append(
            f"{fname}: budgets: a probe needs at least two token budgets (e.g. budgets = [1500, 8000]); "
            f"got {spec.budgets}"
        )
    for key, m in spec.models.items():
        t = m.total_timeout_s
        if t is not None and t <= settings.reference_timeout_s:
            problems.append(
                f"{fname}: models.{key}.total_timeout_s: {t:g} s is not above the reference timeout "
                f"{settings.reference_timeout_s:g} s, so slow answers would be cut off instead of measured; "
                f"raise it (e.g. 600) or lower --reference-timeout"
            )
    if problems:
        raise ConfigError(f"{fname}: not usable as a probe ({len(problems)} problem(s))", problems)


def load_probe(path: Path, settings: ProbeSettings, base_urls: Mapping[str, str] | None = None) -> CampaignSpec:
    """Load a probe file; ``base_urls`` overrides endpoints' base_url (e.g. a simulator's port)."""
    spec = load_campaign(Path(path))
    for name, url in (base_urls or {}).items():
        spec = spec.with_base_url(name, url)
    check_probe_spec(spec, settings, Path(path).name)
    return spec


def summarise_probe(
    store: RunStore, campaign: str, settings: ProbeSettings, *, computed_at: dt.datetime
) -> pa.Table:
    """Probe rows for the stored runs of ``campaign`` (empty table if it has none)."""
    runs = store.read_table(campaigns=[campaign])
    if runs.num_rows == 0:
        raise ConfigError(f"probe {campaign!r} has no stored runs; run it first (irbench probe PROBE.toml)")
    probe_date = pc.min(runs.column("measurement_date")).as_py()
    return probe_table(
        probe_input_from_runs(runs), settings, source=PROBE_SOURCE, campaign=campaign,
        probe_date=probe_date, computed_at=computed_at,
    )


def write_table_atomic(table: pa.Table, path: Path) -> None:
    """Write ``table`` to ``path`` via a temporary file and ``os.replace`` (no partial file)."""
    write_parquet_atomic(table, path)


@dataclass(frozen=True)
class ProbeResult:
    campaign: str
    table: pa.Table  # storage.probes.PROBE_SCHEMA rows
    planned: int
    skipped: int
    executed: int
    parquet_path: Path


@dataclass(frozen=True)
class ProbeExecution:
    """How a probe's runs are executed: by ``execute`` (``None``: the local executor) with the
    keys in ``secrets`` (``None``: the environment variables the endpoints name), reporting to
    ``on_progress``; ``retry_outcomes`` (``--retry-failed``): also execute again the runs whose
    latest execution ended in one of these outcome classes."""

    execute: Executor | None = None
    secrets: Mapping[str, str] | None = None
    on_progress: ProgressCallback | None = None
    retry_outcomes: frozenset[Outcome] = frozenset()


def run_probe(
    probe_spec_path: Path,
    data_dir: Path,
    *,
    settings: ProbeSettings = ProbeSettings(),
    base_urls: Mapping[str, str] | None = None,
    execution: ProbeExecution = ProbeExecution(),
    out_path: Path | None = None,
    now: Callable[[], dt.datetime] = utc_now,
) -> ProbeResult:
    """Run (or resume) the probe at ``probe_spec_path`` as ``execution`` says and summarise it.

    Runs go to ``data_dir/runs``; the summary replaces this probe's rows in ``data_dir/probes``
    and is written to ``out_path`` (default ``data_dir/probes.parquet``). ``base_urls``
    overrides endpoints' base_url.
    """
    data_dir = Path(data_dir)
    spec = load_probe(Path(probe_spec_path), settings, base_urls)
    prepared: PreparedCampaign = prepare(spec)
    secrets = resolve_secrets(spec) if execution.secrets is None else execution.secrets
    store = RunStore(data_dir)
    execute = execution.execute or run_campaign_local
    on_progress, retry_outcomes = execution.on_progress, execution.retry_outcomes
    if retry_outcomes:  # only then: an executor need not take the keyword
        skipped, summary = execute(prepared, store, secrets, on_progress=on_progress, retry_outcomes=retry_outcomes)
    else:
        skipped, summary = execute(prepared, store, secrets, on_progress=on_progress)
    table = summarise_probe(store, spec.name, settings, computed_at=now())
    ProbeStore(data_dir).replace(table, source=PROBE_SOURCE, campaign=spec.name)
    out_path = Path(out_path) if out_path is not None else data_dir / "probes.parquet"
    write_table_atomic(table, out_path)
    return ProbeResult(
        campaign=spec.name, table=table, planned=len(prepared.tasks), skipped=skipped,
        executed=int(getattr(summary, "executed", 0)), parquet_path=out_path,
    )


def _num(value: float | None, scale: float = 1.0, fmt: str = "{:.3g}") -> str:
    return "–" if value is None else fmt.format(value / scale)


def probe_rich_table(table: pa.Table, title: str = "failure-attribution probe") -> Table:
    """One line per model and budget: outcomes, latency (s), reasoning/answer chars, attribution."""
    ref = table.column("reference_timeout_s")[0].as_py() if table.num_rows else None
    out = Table(title=f"{title} (reference timeout {ref:g} s)" if ref is not None else title)
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("model", "left"), ("budget", "right"), ("runs", "right"), ("usable", "right"),
        ("≤ ref", "right"), ("outcomes", "left"), ("lat med s", "right"), ("lat max s", "right"),
        ("reasoning chars", "right"), ("answer chars", "right"), ("cell", "left"), ("attribution", "left"),
    )
    for col, just in columns:
        out.add_column(col, justify=just)
    for r in table.to_pylist():
        budget = "no cap" if r["budget_max_tokens"] is None else str(r["budget_max_tokens"])
        out.add_row(
            r["model"], budget, str(r["runs"]), str(r["runs_succeeded"]), str(r["succeeded_within_reference"]),
            r["outcomes"], _num(r["latency_ms_median"], 1000), _num(r["latency_ms_max"], 1000),
            _num(r["reasoning_chars_median"], fmt="{:.0f}"), _num(r["answer_chars_median"], fmt="{:.0f}"),
            r["cell_verdict"], r["attribution"],
        )
    return out


def attribution_lines(table: pa.Table) -> list[str]:
    """``model: attribution — evidence``, one line per model, in table order."""
    seen: dict[str, str] = {}
    for r in table.to_pylist():
        seen.setdefault(r["model"], f"{r['model']}: {r['attribution']} — {r['attribution_evidence']}")
    return list(seen.values())

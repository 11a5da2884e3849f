"""Command bodies of ``irbench analyze`` and ``irbench import-artifact`` (registered by cli.py).

Plain typer-compatible functions: ``app.command("analyze")(analyze_command)`` and
``app.command("import-artifact")(import_artifact_command)``. Errors the user can fix
(IrbenchError, ValueError) print one line and exit with code 2, never a traceback.
"""

from __future__ import annotations

import datetime as dt
import sys
from pathlib import Path
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from orchestrator.cli.data_option import store_root
from rich.console import Console
from rich.table import Table

from orchestrator.jobs.analysis_progress import StageProgress
from orchestrator.cli.user_errors import fail as _fail
from storage.errors import IrbenchError

if TYPE_CHECKING:
    from analysis.options import AnalysisOptions

_EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _console() -> Console:
    return Console(width=None if sys.stdout.isatty() else 140)


def _fmt(x, digits: int = 3) -> str:
    return "–" if x is None or x != x else f"{x:.{digits}f}"


def coverage_note(coverage: float | None) -> str:
    """A model's simulated interval coverage, flagged "(low)" under 0.93; "–" when not simulated."""
    if coverage is None or coverage != coverage:
        return "–"
    return f"{coverage:.2f}" + (" (low)" if coverage < 0.93 else "")


def print_panel(console: Console, name: str, panel) -> None:
    """The partition first, then the model table with intervals and rank sets."""
    m = panel.manifest
    window = m.get("data_window", {})
    rows = panel.models.included.to_pylist()
    console.print(f"[bold]panel {name}[/] — measured {window.get('first_measurement_date')} … "
                  f"{window.get('last_measurement_date')}"
                  f"{' (date windows, not stamps)' if window.get('includes_windows') else ''}")
    for label in ("clearly reproducible", "undetermined", "clearly not"):
        members = [r["model"] for r in rows if r.get("partition") == label]
        console.print(f"  {label}: {', '.join(members) if members else '—'}")
    t = Table(title=f"{m['options']['merge_rule']['value']}, {m['replicates']} replicates, "
                    f"seed {m['seed']}")
    for col in ("rank", "model", "prompts", "mean Jaccard [95% CI]", "CI coverage",
                "ID-stability [95% CI]", "node-set-perfect", "rank held", "rank CI", "rank set"):
        t.add_column(col)
    for r in rows:
        t.add_row(str(r["rank"]), r["model"], str(r["n_prompts"]),
                  f"{_fmt(r['mean_jaccard'])} [{_fmt(r['jaccard_ci_low'])}, "
                  f"{_fmt(r['jaccard_ci_high'])}]", coverage_note(r.get("jaccard_ci_coverage")),
                  f"{_fmt(r['id_stability'])} [{_fmt(r['id_ci_low'])}, {_fmt(r['id_ci_high'])}]",
                  f"{r['perfect']}/{r['n_cells']}", _fmt(r["rank_held"], 2),
                  f"{r['rank_ci_low']}–{r['rank_ci_high']}",
                  f"{r['rank_set_low']}–{r['rank_set_high']}")
    console.print(t)
    for r in panel.models.excluded.to_pylist():
        console.print(f"  excluded: {r['model']}: {r['reason']} ({r['runs_ok']} successful runs)")
    s = m.get("summary", {})
    rb = s.get("rank_bootstrap")
    if rb:
        console.print(f"  rank bootstrap: {rb['usable']}/{rb['replicates']} usable replicates "
                      f"({rb['unusable']} drew none of some model's prompts); rank set = "
                      f"simultaneous pairwise Holm; ties by point order")
    mg = s.get("merge", {})
    if mg:
        shares = mg["share_perfect"]
        console.print("  node-set-perfect share: " + ", ".join(
            f"{k} {v:.3f}" for k, v in shares.items())
            + f"; {mg['cells_changing_source']} cells change source between rules")
    d = s.get("drift") or {}
    if d.get("cells"):
        views = zip(d["classes"], d["macro_all_cells"], d["pooled_pairs"],
                    d["macro_disagreeing_cells"])
        console.print("  drift (macro all cells / pooled pairs / macro disagreeing cells): "
                      + "; ".join(f"{c} {_fmt(a, 2)}/{_fmt(b, 2)}/{_fmt(x, 2)}"
                                  for c, a, b, x in views))
    for kind, st in (s.get("stabilisation") or {}).items():
        console.print(f"  stabilisation ({kind} tolerance): {st['stabilising']}/{st['cells']} "
                      f"cells before the endpoint, median r* {st['median_r_star']}")
    ts = (m.get("summary") or {}).get("timeout_sensitivity")
    if ts:
        flagged = ", ".join(ts["models_depending_on_timeout"]) or "none"
        console.print(f"  timeout sensitivity ({', '.join(f'{t:g}' for t in ts['timeouts_s'])} s): "
                      f"models whose inclusion depends on the timeout: {flagged}")
    console.print(f"  outputs: {panel.directory}")


def execution_note(data: Path) -> str:
    """Which execution of each run the analysis used, and how many earlier ones were set aside."""
    from storage.runs import EXECUTION_RULE, RunStore

    store = RunStore(data)
    runs = store.read_table(columns=["run_id"]).num_rows
    executions = store.read_executions(columns=["run_id"]).num_rows
    return (f"the latest execution of each of {runs} runs is analysed ({EXECUTION_RULE}); "
            f"{executions - runs} earlier executions stay stored as history")


def analyze_command(
    data: Annotated[Path, typer.Option("--data", parser=store_root, envvar="IRBENCH_DATA", help="Dataset root (runs/ and cells/).")] = Path("data"),
    out: Annotated[Path, typer.Option("--out", help="Output directory (one subdirectory per panel).")] = Path("out"),
    min_runs: Annotated[int, typer.Option(help="Successful runs a cell needs to enter the table.")] = 2,
    min_prompts: Annotated[int, typer.Option(help="Distinct prompts with an included cell a model needs.")] = 3,
    seed: Annotated[int, typer.Option(help="Seed of every resampling.")] = 20260601,
    replicates: Annotated[int, typer.Option(help="Bootstrap replicates.")] = 10_000,
    panel: Annotated[Optional[str], typer.Option(help="Only this panel (default: every panel).")] = None,
    campaign: Annotated[Optional[list[str]], typer.Option("--campaign", help="Only these campaigns.")] = None,
    model: Annotated[Optional[list[str]], typer.Option("--model", help="Only these models.")] = None,
    date_from: Annotated[Optional[str], typer.Option("--from", help="First measurement date (YYYY-MM-DD).")] = None,
    date_to: Annotated[Optional[str], typer.Option("--to", help="Last measurement date (YYYY-MM-DD).")] = None,
    merge_rule: Annotated[str, typer.Option(help="highest-budget-first | earliest-then-top-up.")] = "highest-budget-first",
    precedence: Annotated[Optional[Path], typer.Option(help="TOML of campaigns' budget_rank/time_order (import mapping format).")] = None,
    families: Annotated[Optional[Path], typer.Option("--families", help="TOML [families] model = family.")] = None,
    pairs: Annotated[str, typer.Option(help="Compare models within a 'family' or 'all' pairs.")] = "family",
    corpus: Annotated[Optional[list[Path]], typer.Option("--corpus", help="Folders with prompt files (found by sha256) for correctness.")] = None,
    skip_corrupt: Annotated[bool, typer.Option("--skip-corrupt", help="Skip unreadable Parquet files (named in the output).")] = False,
    timeouts: Annotated[str, typer.Option(help="Total timeouts (s) for the timeout-sensitivity table, comma-separated.")] = "30,60,120,300",
    executor: Annotated[str, typer.Option(help="'local' (in-process) or 'celery' (map per date partition on the workers).")] = "local",
    broker: Annotated[Optional[str], typer.Option("--broker", envvar="IRBENCH_BROKER_URL", help="Redis URL for --executor celery.")] = None,
    timeout: Annotated[Optional[float], typer.Option(help="Give up on a distributed analysis after this many seconds.")] = None,
    blas_threads: Annotated[int, typer.Option("--blas-threads", help="Threads for the bootstrap matrix products (1 is fastest on a busy machine).")] = 1,
    interval: Annotated[str, typer.Option("--interval", help="Mean intervals: calibrated_betting (default; covers >= 0.93 at 5-100 prompts) | betting (exact, conservative) | studentized | double | bca | percentile (the study's).")] = "calibrated_betting",
    interval_threads: Annotated[int, typer.Option("--interval-threads", envvar="IRBENCH_INTERVAL_THREADS", help="2: the per-model CI bootstrap runs beside the joint rank bootstrap (same results); 1: one after the other (less peak memory).")] = 2,
    wave: Annotated[str, typer.Option("--wave", help="Measurement wave read: 'latest' (each campaign's), a number, or 'all'.")] = "latest",
) -> None:
    """Audit stored runs and imported cells: per panel, models with CIs, rank sets and partition,
    pairs, sensitivity, drift, stabilisation, correctness, correlations, normalised Jaccard.

    Example: irbench analyze --data data/ --out out/ --corpus examples/prompts --seed 7
    Example: irbench analyze --data data/ --out out-wave1/ --wave 1
    """
    from storage.wave_selection import WaveSelection

    try:
        options = analysis_options(
            min_runs=min_runs, min_prompts=min_prompts, seed=seed, replicates=replicates, panel=panel,
            campaigns=campaign or None, models=model or None, date_from=date_from, date_to=date_to,
            merge_rule=merge_rule, precedence_path=precedence, families_path=families, pair_scope=pairs,
            corpus_dirs=corpus or None, skip_corrupt=skip_corrupt, timeouts_s=timeouts,
            blas_threads=blas_threads, interval_threads=interval_threads, interval=interval,
            waves=WaveSelection.parse(wave),
        )
    except (IrbenchError, ValueError) as exc:
        _fail(exc)
    analyze_and_print(data, out, options, AnalyzeExecution(executor, broker, timeout))


@dataclass(frozen=True)
class AnalyzeExecution:
    """Where ``irbench analyze`` runs: in-process, or mapped on the Celery workers of ``broker_url``."""

    executor: str = "local"
    broker_url: str | None = None
    timeout_s: float | None = None


def analysis_options(**flags: Any) -> AnalysisOptions:
    """``AnalysisOptions`` from the CLI's flag values, by field name: ``date_from``/``date_to`` as
    ISO dates, ``timeouts_s`` as comma-separated seconds; pydantic validates the rest."""
    from analysis.options import AnalysisOptions

    for key in ("date_from", "date_to"):
        if flags.get(key):
            flags[key] = dt.date.fromisoformat(flags[key])
    if isinstance(flags.get("timeouts_s"), str):
        flags["timeouts_s"] = [float(t) for t in flags["timeouts_s"].split(",") if t.strip()]
    return AnalysisOptions(**flags)


def analyze_and_print(data: Path, out: Path, options: AnalysisOptions, where: AnalyzeExecution) -> None:
    """Run the analysis with stage progress, then print each panel's tables; exits 2 on a user error."""
    from orchestrator.jobs.analysis import analyze_with_executor

    try:
        with StageProgress(_console(), title="analyze") as stages:
            result = analyze_with_executor(data, out, options, executor=where.executor, broker_url=where.broker_url,
                                           timeout_s=where.timeout_s, progress=stages.report)
    except (IrbenchError, ValueError) as exc:
        _fail(exc)
    console = _console()
    console.print(f"runs: {execution_note(data)}", soft_wrap=True)
    for name in result.skipped_files:
        console.print(f"[yellow]skipped unreadable file:[/] {name}")
    for name, p in result.panels.items():
        print_panel(console, name, p)


def import_artifact_command(
    path: Annotated[Path, typer.Argument(help="The artifact's root (holds corpus/ and results/).")],
    data: Annotated[Path, typer.Option("--data", parser=store_root, envvar="IRBENCH_DATA", help="Dataset root to import into.")] = Path("data"),
    mapping: Annotated[Path, typer.Option("--mapping", help="Campaign → panel/precedence mapping TOML.")] = _EXAMPLES / "artifact_campaigns.toml",
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="List every incomplete cell and missing prompt file.")] = False,
) -> None:
    """Import the published study artifact: raw IRs as runs, stability CSVs as cell measurements.

    Also imports the availability audit and the budget probe (results/model_availability.csv,
    results/failure_attribution.csv) so availability history starts with real data.
    Idempotent: importing twice writes nothing new. Prints what was read and written and the
    coverage per panel × campaign (raw runs found vs the CSVs' successful_runs); -v lists each cell.

    Example: irbench import-artifact ../shared/paper-artifact --data data/
    """
    from orchestrator.jobs.artifact_import import import_artifact
    from orchestrator.jobs.availability import import_availability_artifact

    try:
        report = import_artifact(path, data, mapping)
        availability = import_availability_artifact(path, data)
    except (IrbenchError, ValueError, OSError) as exc:
        _fail(exc)
        return
    from orchestrator.cli.summary_tables import import_tables

    console = _console()
    for part in import_tables(report, availability, verbose=verbose):
        console.print(part)

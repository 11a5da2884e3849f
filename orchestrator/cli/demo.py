"""The embedded default: simulator + demo campaign + analysis, in one process, no services."""

from __future__ import annotations

import time
from pathlib import Path

from rich.console import Console

from analysis.pipeline import run_analysis
from analysis.options import AnalysisOptions
from analysis.report.build import build_report
from orchestrator.cli.audit import print_panel
from orchestrator.campaign.prepared import prepare
from orchestrator.local.campaign import run_campaign_local
from orchestrator.local.progress import ModelBars
from orchestrator.campaign.spec import load_campaign
from simulator.config import load_sim_config
from simulator.server import start_background
from storage.runs import RunStore
from workers.errors import ConfigError


def run_demo(workdir: Path, examples: Path, console: Console, *, progress: bool = True) -> Path:
    """Run the demo end to end; returns the analysis output directory."""
    campaign_file, sim_file = examples / "demo.toml", examples / "sim.toml"
    for f in (campaign_file, sim_file):
        if not f.is_file():
            raise ConfigError(f"{f} not found; pass --examples pointing at the repository's examples/ folder")
    workdir.mkdir(parents=True, exist_ok=True)
    data, out = workdir / "data", workdir / "out"
    sim_config = load_sim_config(sim_file)
    started = time.monotonic()
    with start_background(sim_config) as sim:
        spec = load_campaign(campaign_file).with_base_url("sim", sim.base_url)
        prepared = prepare(spec)
        console.print(
            f"simulated endpoint on {sim.base_url}; campaign [bold]{spec.name}[/]: "
            f"{len(prepared.corpus.prompts)} prompts × {len(spec.models)} models × {spec.runs} runs"
        )
        with ModelBars(enabled=progress) as bars:
            skipped, summary = run_campaign_local(prepared, RunStore(data), {}, on_progress=bars.update)
    elapsed = time.monotonic() - started
    console.print(
        f"{summary.executed} runs executed, {skipped} already stored (resume), in {elapsed:.1f} s"
    )
    result = run_analysis(data, out, AnalysisOptions())
    for name, panel in result.panels.items():
        print_panel(console, name, panel)
    report = build_report(out, workdir / "report", data_dir=data)
    console.print(f"\nraw runs (Parquet): {data / 'runs'}")
    console.print(f"analysis outputs:   {out}")
    console.print(f"report:             {report.html}  and  {report.md}")
    console.print(f"logs (JSON lines):  {workdir / 'irbench.log'}")
    console.print(f"browse the runs:    irbench view --data {data}")
    return out

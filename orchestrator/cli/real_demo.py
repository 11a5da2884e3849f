"""``irbench demo-real``: the example campaigns against a real model (SmolLM2-135M on
llama.cpp), at temperature 0 and 0.7, analysed, with the table printed.

Starts ``llama_cpp.server`` on a free loopback port (``orchestrator.cli.llama_server``), runs
``examples/real/t0.toml`` and ``t07.toml`` with the endpoint pointed at it, stops the server,
analyses the runs and prints each panel plus how many distinct answers each prompt got over
its runs (at temperature 0 a deterministic server gives exactly one).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

from analysis.pipeline import run_analysis
from analysis.options import AnalysisOptions
from orchestrator.cli.audit import print_panel
from orchestrator.campaign.prepared import prepare
from orchestrator.local.campaign import run_campaign_local
from orchestrator.cli.llama_server import LlamaServerSettings, find_smollm2_gguf, start_llama_server
from orchestrator.campaign.spec import load_campaign
from storage.records import RunRecord
from storage.runs import RunStore
from workers.errors import ConfigError

REAL_CAMPAIGNS = ("t0.toml", "t07.toml")
ENDPOINT = "llama"


def distinct_answers(records: Sequence[RunRecord]) -> dict[tuple[str, str, float | None], tuple[int, int]]:
    """Per (campaign, prompt, temperature): (distinct answer texts, answered runs)."""
    texts: dict[tuple[str, str, float | None], list[str]] = defaultdict(list)
    for r in records:
        if r.response_text is not None:
            texts[(r.campaign, r.prompt_name, r.temperature)].append(r.response_text)
    return {k: (len(set(v)), len(v)) for k, v in sorted(texts.items())}


def run_real_demo(workdir: Path, examples: Path, console: Console, *, n_ctx: int = 2048, n_threads: int = 2) -> Path:
    """Run the real-model demo end to end; returns the analysis output directory."""
    real = examples / "real"
    files = [real / name for name in REAL_CAMPAIGNS]
    for f in files:
        if not f.is_file():
            raise ConfigError(f"{f} not found; pass --examples pointing at the repository's examples/ folder")
    workdir.mkdir(parents=True, exist_ok=True)
    data, out = workdir / "data", workdir / "out"
    settings = LlamaServerSettings(model_path=find_smollm2_gguf(), n_ctx=n_ctx, n_threads=n_threads)
    console.print(f"starting llama_cpp.server with {settings.model_path.name} (n_ctx={n_ctx}) ...")
    started = time.monotonic()
    with start_llama_server(settings, log_path=workdir / "llama-server.log") as server:
        console.print(f"llama.cpp server on {server.base_url} (up in {time.monotonic() - started:.1f} s)")
        for f in files:
            spec = load_campaign(f).with_base_url(ENDPOINT, server.base_url)
            prepared = prepare(spec)
            t0 = time.monotonic()
            skipped, summary = run_campaign_local(prepared, RunStore(data), {})
            console.print(f"campaign [bold]{spec.name}[/]: {summary.executed} runs executed, {skipped} already "
                          f"stored, in {time.monotonic() - t0:.1f} s")
    records = RunStore(data).read_records()
    outcomes: dict[str, int] = defaultdict(int)
    for r in records:
        outcomes[r.outcome.value] += 1
    console.print("outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())))
    table = Table(title="distinct answers per prompt over its runs (1 = identical every run)")
    for col in ("campaign", "prompt", "temperature", "distinct", "answered runs"):
        table.add_column(col)
    for (campaign, prompt, temp), (distinct, n) in distinct_answers(records).items():
        table.add_row(campaign, prompt, f"{temp}", str(distinct), str(n))
    console.print(table)
    result = run_analysis(data, out, AnalysisOptions())
    for name, panel in result.panels.items():
        print_panel(console, name, panel)
    console.print(f"\nraw runs (Parquet): {data / 'runs'}\nanalysis outputs:   {out}\nserver log: {workdir / 'llama-server.log'}")
    return out


"""Progress of ``analyze`` and ``report``: stages with counts on a terminal, nothing otherwise."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from analysis.options import AnalysisOptions
from analysis.pipeline import run_analysis
from analysis.progress import ANALYZE_STAGES, REPORT_STAGES, Stage
from analysis.report.build import build_report
from bench.run_store import write_run_store
from orchestrator.jobs.analysis_progress import StageProgress
from tests.support.cli import run_cli


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    data = tmp_path_factory.mktemp("progress-data")
    assert write_run_store(data, models=4, prompts=6, runs=3, batch_runs=20) == 72
    return data


def test_pipeline_reports_every_stage_in_order_with_counts(store, tmp_path):
    seen: list[Stage] = []
    run_analysis(store, tmp_path / "out", AnalysisOptions(replicates=200), progress=seen.append)
    assert seen[0].name == "read" and seen[0].panel is None
    panel = [s for s in seen if s.panel == "bench"]
    assert [s.name for s in panel] == list(ANALYZE_STAGES)
    assert [s.index for s in panel] == list(range(1, len(ANALYZE_STAGES) + 1))
    assert {s.total for s in panel} == {len(ANALYZE_STAGES)}
    by = {s.name: s for s in panel}
    assert (by["cells"].count, by["run level"].count) == (72, 72)
    assert (by["merge"].count, by["merge"].unit) == (24, "cells")
    assert (by["intervals"].count, by["intervals"].unit) == (200, "replicates")


def test_terminal_shows_stages_and_counts(store, tmp_path):
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=140)
    with StageProgress(console, title="analyze") as stages:
        assert stages.enabled
        run_analysis(store, tmp_path / "out", AnalysisOptions(replicates=200),
                     progress=stages.report)
    with StageProgress(console, title="report") as stages:
        build_report(tmp_path / "out", tmp_path / "report", progress=stages.report)
    text = buf.getvalue()
    assert "analyze bench" in text and "report" in text
    assert f"{len(ANALYZE_STAGES)}/{len(ANALYZE_STAGES)}" in text  # every panel line completes
    assert f"{len(REPORT_STAGES)}/{len(REPORT_STAGES)}" in text
    assert "intervals: 200 replicates" in text or "run level: 72 runs" in text


def test_not_a_terminal_prints_nothing(store, tmp_path):
    buf = io.StringIO()
    with StageProgress(Console(file=buf, force_terminal=False), title="analyze") as stages:
        assert not stages.enabled
        run_analysis(store, tmp_path / "out", AnalysisOptions(replicates=200),
                     progress=stages.report)
    assert buf.getvalue() == ""


def test_cli_piped_output_has_no_progress(store, tmp_path):
    res = run_cli(["analyze", "--data", str(store), "--out", str(tmp_path / "out"), "--replicates", "200"], timeout_s=240, check=False)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "panel bench" in res.stdout  # the table is printed
    for stage in ANALYZE_STAGES:
        assert f"{stage}:" not in res.stdout and f"{stage}:" not in res.stderr

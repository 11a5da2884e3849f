"""docs/intervals.md's figures are the code's: the Table-1 comparison is built from the pinned
results (``tests/pinned``, themselves checked against a fresh analysis by
test_pinned_results.py), and the default's coverage rows are recomputed with the bench's
settings (the betting intervals draw no replicates, so a row costs seconds)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.interval_coverage import build_sources, coverage_row, markdown_row, sweep_line, sweep_row
from bench.interval_table1 import table1_rows
from analysis.stats.small_sample import Resampling

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "intervals.md"
PINNED = ROOT / "tests" / "pinned"


def _doc_lines() -> set[str]:
    return {line.strip() for line in DOC.read_text(encoding="utf-8").splitlines()}


def test_table1_beside_the_default_is_the_pinned_results():
    pct = json.loads((PINNED / "table1_percentile.json").read_text(encoding="utf-8"))
    default = json.loads((PINNED / "artifact.json").read_text(encoding="utf-8"))
    rows = table1_rows(pct, default["annotated"]["models"])
    assert len(rows) == 2 + 8 and "calibrated_betting (default)" in rows[0]
    missing = [r for r in rows if r not in _doc_lines()]
    assert not missing, "docs/intervals.md lacks (python bench/interval_table1.py):\n" + "\n".join(missing)


def test_table1_rows_see_a_changed_interval():
    """The check can fail: a Table-1 bound moved in the third decimal gives another line."""
    pct = json.loads((PINNED / "table1_percentile.json").read_text(encoding="utf-8"))
    default = json.loads((PINNED / "artifact.json").read_text(encoding="utf-8"))["annotated"]["models"]
    moved = [dict(r) for r in pct]
    moved[1]["jaccard_ci_low"] += 0.001
    assert set(table1_rows(moved, default)) - _doc_lines()


@pytest.fixture(scope="module")
def sources(artifact_dir):
    return build_sources(artifact_dir, 20260601, ["sim", "artifact", "shapes"])


@pytest.mark.parametrize("sizes", [[5, 8, 12, 22],
                                   pytest.param([30, 50, 100], marks=pytest.mark.soak)])
def test_default_coverage_rows_are_the_bench_output(sources, sizes):
    """The rows `python bench/interval_coverage.py --markdown --methods calibrated_betting`
    prints (seed 20260601, 1,000 samples per model and size) are the document's, every source."""
    spec = Resampling(replicates=1000, seed=20260601, inner_replicates=200)
    lines = _doc_lines()
    for source, models in sources.items():
        row = coverage_row(models, sizes, "calibrated_betting", spec, 1000)
        assert markdown_row(source, "calibrated_betting", row) in lines, (
            f"docs/intervals.md lacks: {markdown_row(source, 'calibrated_betting', row)}")


def test_threshold_sweep_rows_are_the_bench_output(sources):
    """The half-threshold row of the sweep (`--threshold-scales`) is the document's."""
    spec = Resampling(replicates=1000, seed=20260601, inner_replicates=200)
    lines = _doc_lines()
    for source, models in sources.items():
        line = sweep_line(0.65, source, sweep_row(models, [5, 8, 12, 22, 50], 0.65, spec, 1000))
        assert line in lines, f"docs/intervals.md lacks: {line}"

"""The study's Table 1 (percentile intervals) beside the default interval, as markdown rows.

Imports the study's artifact into a temporary data directory, analyses it twice with the
settings of the pinned results in ``tests/pinned`` (seed 7, 2,000 replicates): ``interval="percentile"`` (Table 1)
and the default, and prints the annotated panel's models as the table of docs/intervals.md
(rank, model, prompts, mean Jaccard, each interval with its simulated coverage, the
self-check ``jaccard_ci_coverage``). ``tests/analysis/test_intervals_doc.py`` builds the same
rows from the pinned results and checks the document against them.

Usage: python bench/interval_table1.py [--artifact DIR]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

HEADER = ("| rank | model | prompts | mean Jaccard | percentile (Table 1) | coverage "
          "| {method} (default) | coverage |\n|---|---|---|---|---|---|---|---|")


def _iv(row: dict) -> str:
    return f"[{row['jaccard_ci_low']:.3f}, {row['jaccard_ci_high']:.3f}]"


def _cov(row: dict) -> str:
    value = row.get("jaccard_ci_coverage")  # None: no check; NaN ("nan" once pinned): none run
    if value is None or value == "nan" or value != value:
        return "–"
    return f"{value:.2f}"


def table1_rows(percentile: list[dict], default: list[dict]) -> list[str]:
    """Markdown lines (header first) from the annotated panel's model rows of the two runs;
    ``default`` rows carry ``rank`` and are printed in rank order, matched by model."""
    by_model = {r["model"]: r for r in percentile}
    method = default[0]["ci_method"]
    lines = HEADER.format(method=method).splitlines()
    for d in sorted(default, key=lambda r: (r["rank"], r["model"])):
        p = by_model[d["model"]]
        lines.append(f"| {d['rank']} | {d['model']} | {d['n_prompts']} | {d['mean_jaccard']:.3f} "
                     f"| {_iv(p)} | {_cov(p)} | {_iv(d)} | {_cov(d)} |")
    return lines


def annotated_models(artifact: Path, workdir: Path, interval: str | None) -> list[dict]:
    """The annotated panel's model rows after importing ``artifact`` into ``workdir`` and
    analysing it at the pinned settings (seed 7, 2,000 replicates; ``interval`` None = the
    default method)."""
    import pyarrow.parquet as pq

    from analysis.options import AnalysisOptions
    from analysis.pipeline import run_analysis
    from orchestrator.jobs.artifact_import import import_artifact

    data, out = workdir / "data", workdir / "out"
    import_artifact(artifact, data, ROOT / "examples" / "artifact_campaigns.toml", fsync=False)
    method = {} if interval is None else {"interval": interval}
    run_analysis(data, out, AnalysisOptions(
        seed=7, replicates=2000, corpus_dirs=[artifact / "corpus" / "synthetic"], **method))
    return pq.read_table(out / "annotated" / "models.parquet").to_pylist()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--artifact", type=Path, default=ROOT.parent / "shared" / "paper-artifact")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        pct = annotated_models(args.artifact, Path(tmp) / "p", "percentile")
        default = annotated_models(args.artifact, Path(tmp) / "d", None)
    print("\n".join(table1_rows(pct, default)))


if __name__ == "__main__":
    main()

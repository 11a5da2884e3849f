"""Fingerprints of analysis outputs, to pin results for a given seed across speed work.

A fingerprint maps each Parquet file of a panel directory to its rows with floats rounded to
``DIGITS`` decimals (summation order may move the last bits; anything larger is a change), plus
the manifest's ``summary``. ``python -m tests.pinned.fingerprint`` regenerates the pinned JSON
files (only do that for an intended change, explained in the commit); ``table1_percentile.json``
holds the annotated panel's intervals under ``interval="percentile"``, the study's Table 1.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

DIGITS = 9
FULL_ROWS = 40
HERE = Path(__file__).resolve().parent
# volatile or run-order-dependent: timing columns, stabilisation (run index order follows the
# order in which concurrent requests reached the simulator), the clock (the demo's runs are
# measured today, so its cells' first/last measurement dates move with the calendar)
SKIP_FILES = {"stabilisation", "timeouts", "timeout_flags"}
SKIP_COLUMNS = {"generated_at", "computed_at", "measured_at", "first_date", "last_date", "measurement_date", "stabilises_abs", "stabilises_rel",
                "r_star_abs", "r_star_rel", "stabilising_cells", "censored_cells", "median_r_star"}


def _norm(value: Any) -> Any:
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return round(value, DIGITS) + 0.0
    if isinstance(value, (dt.date, dt.datetime)):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: _norm(v) for k, v in value.items() if k not in SKIP_COLUMNS}
    if isinstance(value, (list, tuple)):
        return [_norm(v) for v in value]
    if isinstance(value, bytes):
        return value.hex()
    return value


def fingerprint(out_dir: Path) -> dict[str, Any]:
    """{panel: {file stem: rows, "summary": manifest summary}} of an ``analyze`` output dir."""
    out: dict[str, Any] = {}
    for pdir in sorted(p for p in Path(out_dir).iterdir() if p.is_dir()):
        panel: dict[str, Any] = {}
        for f in sorted(pdir.glob("*.parquet")):
            if f.stem in SKIP_FILES:
                continue
            rows = pq.read_table(f).to_pylist()
            norm = [_norm({k: v for k, v in r.items() if k not in SKIP_COLUMNS}) for r in rows]
            # big tables as a digest (and their row count), small ones in full for readable diffs
            panel[f.stem] = norm if len(norm) <= FULL_ROWS else {
                "rows": len(norm), "sha256": hashlib.sha256(
                    json.dumps(norm, sort_keys=True).encode()).hexdigest()}
        manifest = json.loads((pdir / "manifest.json").read_text(encoding="utf-8"))
        summary = {k: v for k, v in manifest.get("summary", {}).items()
                   if k not in {"stabilisation", "timeout_sensitivity"}}
        panel["summary"] = _norm(summary)
        out[pdir.name] = panel
    return out


def diff(expected: Any, actual: Any, path: str = "") -> list[str]:
    """Human-readable differences (first few) between two fingerprints."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        out = []
        for k in sorted(set(expected) | set(actual), key=str):
            if k not in actual or k not in expected:
                out.append(f"{path}/{k}: only in {'expected' if k in expected else 'actual'}")
            else:
                out += diff(expected[k], actual[k], f"{path}/{k}")
        return out
    if isinstance(expected, list) and isinstance(actual, list):
        if len(expected) != len(actual):
            return [f"{path}: {len(expected)} rows expected, {len(actual)} found"]
        return [d for i, (e, a) in enumerate(zip(expected, actual)) for d in diff(e, a, f"{path}[{i}]")]
    return [] if expected == actual else [f"{path}: expected {expected!r}, got {actual!r}"]


def demo_outputs(workdir: Path, examples: Path) -> Path:
    """Run the demo campaign against the simulator (in-process), analyse it with seed 7 and 2,000
    replicates; the output directory."""

    from analysis.options import AnalysisOptions
    from analysis.pipeline import run_analysis
    from orchestrator.campaign.prepared import prepare
    from orchestrator.local.campaign import run_campaign_local
    from orchestrator.campaign.spec import load_campaign
    from simulator.config import load_sim_config
    from simulator.server import start_background
    from storage.runs import RunStore

    data, out = workdir / "data", workdir / "out"
    with start_background(load_sim_config(examples / "sim.toml")) as sim:
        spec = load_campaign(examples / "demo.toml").with_base_url("sim", sim.base_url)
        run_campaign_local(prepare(spec), RunStore(data, fsync=False), {})
    run_analysis(data, out, AnalysisOptions(seed=7, replicates=2000))
    return out


TABLE1_COLUMNS = ("model", "n_prompts", "mean_jaccard", "jaccard_ci_low", "jaccard_ci_high",
                  "id_stability", "id_ci_low", "id_ci_high", "ci_method", "jaccard_ci_coverage")


def table1(fp: dict[str, Any]) -> list[dict[str, Any]]:
    """The annotated panel's model rows of a fingerprint: Table 1's columns, the method, and
    the interval's simulated coverage (the self-check)."""
    return [{k: r[k] for k in TABLE1_COLUMNS} for r in fp["annotated"]["models"]]


def artifact_outputs(workdir: Path, artifact: Path, mapping: Path,
                     interval: str | None = None) -> Path:
    """Import the study's artifact and analyse every panel with seed 7 and 2,000 replicates
    (``interval``: the interval method; None = the default)."""
    from analysis.options import AnalysisOptions
    from analysis.pipeline import run_analysis
    from orchestrator.jobs.artifact_import import import_artifact

    data, out = workdir / "data", workdir / "out"
    import_artifact(artifact, data, mapping, fsync=False)
    method = {} if interval is None else {"interval": interval}
    run_analysis(data, out, AnalysisOptions(
        seed=7, replicates=2000, corpus_dirs=[artifact / "corpus" / "synthetic"], **method))
    return out


def main() -> None:
    import tempfile

    root = HERE.parents[1]
    artifact = root.parent / "shared" / "paper-artifact"
    mapping = root / "examples" / "artifact_campaigns.toml"
    with tempfile.TemporaryDirectory() as tmp:
        demo = fingerprint(demo_outputs(Path(tmp) / "demo", root / "examples"))
        art = fingerprint(artifact_outputs(Path(tmp) / "art", artifact, mapping))
        pct = table1(fingerprint(artifact_outputs(Path(tmp) / "pct", artifact, mapping,
                                                  interval="percentile")))
    for name, fp in (("demo", demo), ("artifact", art), ("table1_percentile", pct)):
        (HERE / f"{name}.json").write_text(json.dumps(fp, indent=0, sort_keys=True) + "\n",
                                           encoding="utf-8")


if __name__ == "__main__":
    main()

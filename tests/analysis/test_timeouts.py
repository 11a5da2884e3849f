"""Timeout sensitivity against hand-computed counts on a small recorded dataset (real RunStore)."""

from __future__ import annotations

import datetime as dt
import hashlib
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from analysis.errors import AnalysisError
from analysis.tables.cells import build_cells
from analysis.tables.models import model_table
from analysis.tables.timeouts import analyze_timeouts, lost_runs, timeout_lines, timeout_sensitivity
from storage.records import Attempt, Outcome, ParseOutcome, RunRecord
from storage.runs import RunStore

T0 = dt.datetime(2026, 8, 1, 9, 0, tzinfo=dt.timezone.utc)
IR = '{"version":1,"uri":"x","meta":{},"nodes":[]}'


def _sha(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()


def _run(model: str, prompt: str, k: int, outcome: str, latency_s: float | None, *,
         panel: str = "p", total_timeout_s: float = 300.0) -> RunRecord:
    ok = outcome == "ok"
    attempts = [] if latency_s is None else [
        Attempt(attempt=1, outcome=Outcome(outcome), started_at=T0, latency_ms=latency_s * 1000.0)
    ]
    return RunRecord(
        run_id=f"{panel}-{model}-{prompt}-{k}", campaign="c", panel=panel, prompt_sha256=_sha(prompt),
        prompt_name=prompt, model=model, endpoint="e", wire_format="openai", run_index=k,
        total_timeout_s=total_timeout_s, instruction_version="v1", instruction_sha256="0" * 64,
        measured_at=T0, measurement_date=T0.date(), outcome=Outcome(outcome), attempts=attempts,
        latency_ms=None if latency_s is None else latency_s * 1000.0,
        cancel_reason="test" if outcome == "cancelled" else None,
        parse_outcome=ParseOutcome.OK if ok else ParseOutcome.NOT_ATTEMPTED,
        ir_json=IR if ok else None, node_ids=["A"] if ok else [], node_count=1 if ok else 0,
    )


def _dataset() -> list[RunRecord]:
    runs = []
    for _i, p in enumerate(("P1", "P2", "P3")):  # fast: every run 10 s
        runs += [_run("fast", p, k, "ok", 10.0) for k in range(2)]
    slow = {"P1": (20, 45), "P2": (50, 70), "P3": (100, 200)}
    for p, lats in slow.items():
        runs += [_run("slowish", p, k, "ok", float(s)) for k, s in enumerate(lats)]
    # recorded under the study's 60 s cap: three runs cut at 60 s, one read timeout, one cancelled
    cut = dict(total_timeout_s=60.0)
    runs += [
        _run("cutoff", "P1", 0, "ok", 10.0, **cut), _run("cutoff", "P1", 1, "ok", 20.0, **cut),
        _run("cutoff", "P1", 2, "cancelled", None, **cut),
        _run("cutoff", "P2", 0, "ok", 30.0, **cut), _run("cutoff", "P2", 1, "timeout_total", 60.0, **cut),
        _run("cutoff", "P3", 0, "timeout_total", 60.0, **cut), _run("cutoff", "P3", 1, "timeout_total", 60.0, **cut),
        _run("cutoff", "P3", 2, "timeout_read", 15.0, **cut),
    ]
    runs += [_run("fast", "P4", k, "ok", 10.0, panel="q") for k in range(2)]  # another panel
    return runs


@pytest.fixture
def runs_table(tmp_path: Path):
    store = RunStore(tmp_path / "data", fsync=False)
    records = _dataset()
    store.write(records[:10])
    store.write(records[10:])
    return store.read_table()


def _by(result, panel: str, model: str) -> dict[float, dict]:
    return {r["timeout_s"]: r for r in result.losses.to_pylist() if r["panel"] == panel and r["model"] == model}


def test_hand_computed_losses_and_inclusion(runs_table) -> None:
    res = timeout_sensitivity(runs_table, (120, 30, 300, 60), min_runs=2, min_prompts=3)
    assert res.timeouts_s == (30.0, 60.0, 120.0, 300.0)
    fast = _by(res, "p", "fast")
    assert [fast[t]["lost"] for t in res.timeouts_s] == [0, 0, 0, 0]
    assert all(fast[t]["included"] and fast[t]["prompts_included"] == 3 for t in res.timeouts_s)

    slow = _by(res, "p", "slowish")  # latencies P1 20,45 | P2 50,70 | P3 100,200 s
    assert [slow[t]["succeeded"] for t in res.timeouts_s] == [1, 3, 5, 6]
    assert [slow[t]["lost"] for t in res.timeouts_s] == [5, 3, 1, 0]
    assert [slow[t]["prompts_included"] for t in res.timeouts_s] == [0, 1, 2, 3]
    assert [slow[t]["included"] for t in res.timeouts_s] == [False, False, False, True]

    cut = _by(res, "p", "cutoff")  # 8 runs; ok at 10, 20, 30 s; timeout_total at 60 s x3
    assert all(cut[t]["runs"] == 8 and cut[t]["succeeded_recorded"] == 3 for t in res.timeouts_s)
    assert [cut[t]["succeeded"] for t in res.timeouts_s] == [3, 3, 3, 3]  # 30 s is within 30 s
    assert [cut[t]["censored"] for t in res.timeouts_s] == [0, 0, 3, 3]  # only above the 60 s cap
    assert [cut[t]["prompts_included"] for t in res.timeouts_s] == [1, 1, 1, 1]

    other = _by(res, "q", "fast")  # panels are separate tables
    assert other[30.0]["runs"] == 2 and other[30.0]["prompts_included"] == 1 and not other[30.0]["included"]

    flags = {(r["panel"], r["model"]): r for r in res.flags.to_pylist()}
    assert res.flagged_models() == [("p", "slowish")]
    assert flags[("p", "slowish")]["note"] == "drops out of the table under 30 s, 60 s, 120 s"
    assert flags[("p", "slowish")]["included_under"] == "30 s: no, 60 s: no, 120 s: no, 300 s: yes"
    assert not flags[("p", "cutoff")]["included_recorded"] and not flags[("p", "cutoff")]["depends_on_timeout"]


def test_recorded_inclusion_matches_the_stability_table(runs_table) -> None:
    """Independent reference: analysis.tables.cells + analysis.tables.models decide inclusion as recorded."""
    res = timeout_sensitivity(runs_table, min_runs=2, min_prompts=3)
    panel = runs_table.filter(runs_table.column("panel").to_numpy(zero_copy_only=False) == "p")
    table = model_table(build_cells(panel, min_runs=2), min_prompts=3)
    expected = set(table.included.column("model").to_pylist())
    got = {r["model"] for r in res.flags.to_pylist() if r["panel"] == "p" and r["included_recorded"]}
    assert got == expected == {"fast", "slowish"}
    # a looser threshold flips the verdict as hand-computed: slowish has 2 prompts under 120 s
    loose = timeout_sensitivity(runs_table, min_runs=2, min_prompts=2)
    assert [r["included"] for r in loose.losses.to_pylist() if r["model"] == "slowish"] == [False, False, True, True]


def test_lost_runs_listing_and_wiring(runs_table, tmp_path: Path) -> None:
    lost = lost_runs(runs_table, 60)
    assert lost.column("latency_ms").to_pylist() == [200_000.0, 100_000.0, 70_000.0]
    assert set(lost.column("model").to_pylist()) == {"slowish"}
    res, paths = analyze_timeouts(runs_table, tmp_path / "out", min_runs=2, min_prompts=3)
    assert pq.read_table(paths["timeouts"]).equals(res.losses)
    assert pq.read_table(paths["timeout_flags"]).num_rows == 4
    lines = timeout_lines(res)
    assert any(line.startswith("slowish") and "⚠" in line and "30 s: 5 lost" in line for line in lines)
    assert any(line.startswith("cutoff") and "120 s: 0 lost (3 unknown)" in line for line in lines)
    assert res.summary()["models_depending_on_timeout"] == ["p/slowish"]


def test_rejects_bad_timeouts(runs_table) -> None:
    with pytest.raises(AnalysisError, match="positive"):
        timeout_sensitivity(runs_table, (0, 60))
    with pytest.raises(AnalysisError, match="run columns"):
        timeout_sensitivity(runs_table.drop_columns(["latency_ms"]))


def test_irbench_analyze_writes_the_timeout_table(tmp_path: Path) -> None:
    """End to end through run_analysis: files on disk and the manifest's flagged models."""
    import json

    from analysis.pipeline import run_analysis
    from analysis.options import AnalysisOptions

    store = RunStore(tmp_path / "data", fsync=False)
    store.write(_dataset())
    result = run_analysis(tmp_path / "data", tmp_path / "out", AnalysisOptions(replicates=200, timeouts_s=[30, 300]))
    panel = result.panels["p"]
    manifest = json.loads(panel.manifest_path.read_text())
    assert {"timeouts.parquet", "timeout_flags.parquet"} <= set(manifest["files"].values())
    ts = manifest["summary"]["timeout_sensitivity"]
    assert ts["timeouts_s"] == [30.0, 300.0] and ts["models_depending_on_timeout"] == ["p/slowish"]
    losses = pq.read_table(panel.directory / "timeouts.parquet").to_pylist()
    slow = {r["timeout_s"]: r["lost"] for r in losses if r["model"] == "slowish"}
    assert slow == {30.0: 5, 300.0: 0}

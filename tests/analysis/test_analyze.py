"""``run_analysis`` end to end on a real Parquet run store written by ``storage.runs.RunStore``."""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from pydantic import ValidationError

from analysis.outputs import panel_dirname
from analysis.pipeline import NoRunsError, run_analysis
from analysis.options import AnalysisOptions
from storage.errors import StorageError
from storage.records import Outcome, ParseOutcome, RunRecord
from storage.runs import RunStore

FIXED_NOW = dt.datetime(2026, 6, 1, 12, 0, tzinfo=dt.UTC)


def record(
    *,
    panel: str,
    campaign: str,
    model: str,
    prompt: str,
    run_index: int,
    ids: list[str] | None,
    day: dt.date,
) -> RunRecord:
    """ids=None: a failed call (read timeout, no IR)."""
    ok = ids is not None
    at = dt.datetime.combine(day, dt.time(10, run_index), tzinfo=dt.UTC)
    return RunRecord(
        run_id=f"{campaign}|{panel}|{model}|{prompt}|{run_index}",
        campaign=campaign,
        panel=panel,
        prompt_sha256=f"sha-{prompt}",
        prompt_name=f"{prompt}.prompt.rtpl",
        model=model,
        endpoint="http://127.0.0.1:1/v1",
        wire_format="openai",
        run_index=run_index,
        instruction_version="v1",
        instruction_sha256="0" * 64,
        measured_at=at,
        measurement_date=day,
        outcome=Outcome.OK if ok else Outcome.TIMEOUT_READ,
        parse_outcome=ParseOutcome.OK if ok else ParseOutcome.NOT_ATTEMPTED,
        ir_json=json.dumps({"nodes": [{"id": i} for i in ids]}) if ok else None,
        node_ids=sorted(set(ids)) if ok else [],
        node_count=len(ids) if ok else 0,
    )


D1, D2, D3 = dt.date(2026, 3, 1), dt.date(2026, 3, 2), dt.date(2026, 3, 9)


def build_store(root: Path) -> None:
    recs: list[RunRecord] = []
    # panel "main": model A stable on 3 prompts, model B drifts on 3 prompts, model C 2 prompts
    for p in ("p1", "p2", "p3"):
        for r in range(3):
            recs.append(record(panel="main", campaign="c1", model="A", prompt=p, run_index=r,
                               ids=["RULE:X", "RULE:Y"], day=D1))
            recs.append(record(panel="main", campaign="c1", model="B", prompt=p, run_index=r,
                               ids=["RULE:X"] + (["RULE:Z"] if r == 0 else []), day=D2))
    for p in ("p1", "p2"):
        for r in range(2):
            recs.append(record(panel="main", campaign="c1", model="C", prompt=p, run_index=r,
                               ids=["a"], day=D2))
    # a failed run of A on p1 and a later campaign c2 (filtered in one test)
    recs.append(record(panel="main", campaign="c1", model="A", prompt="p1", run_index=3,
                       ids=None, day=D2))
    for r in range(2):
        recs.append(record(panel="main", campaign="c2", model="A", prompt="p4", run_index=r,
                           ids=["q"], day=D3))
    # a second panel with an unsafe name
    for p in ("s1", "s2", "s3"):
        for r in range(2):
            recs.append(record(panel="real/skills v2", campaign="c3", model="A", prompt=p,
                               run_index=r, ids=["x", "y"] if r else ["x"], day=D2))
    store = RunStore(root, fsync=False)
    store.write(recs)
    store.write(recs[:5])  # a redelivered batch: duplicates must not count twice


def test_end_to_end(tmp_path: Path) -> None:
    data, out = tmp_path / "data", tmp_path / "out"
    build_store(data)
    res = run_analysis(data, out, AnalysisOptions(), now=lambda: FIXED_NOW)
    assert res.runs_read == 9 * 2 + 4 + 1 + 2 + 6
    assert set(res.panels) == {"main", "real/skills v2"}

    main = res.panels["main"]
    assert main.directory == out / "main"
    for path in (main.cells_path, main.models_path, main.excluded_path, main.manifest_path):
        assert path.is_file()
    assert not [p for p in main.directory.iterdir() if p.name.endswith(".tmp")]

    models = pq.read_table(main.models_path).to_pylist()
    assert [m["model"] for m in models] == ["A", "B"]
    a, b = models
    assert (a["rank"], a["n_prompts"], a["mean_jaccard"], a["perfect"]) == (1, 4, 1.0, 4)
    # B per prompt: runs {X,Z},{X},{X}: J = (1/2 + 1/2 + 1)/3 = 2/3, stab = 1/2
    assert b["mean_jaccard"] == pytest.approx(2 / 3)
    assert b["id_stability"] == pytest.approx(0.5)
    assert b["perfect"] == 0
    excluded = pq.read_table(main.excluded_path).to_pylist()
    assert excluded == [
        {"model": "C", "n_prompts": 2, "n_cells": 2, "runs_ok": 4,
         "reason": "2 prompts with ≥2 successful runs; needs ≥3"}
    ]
    cells = pq.read_table(main.cells_path)
    assert cells.equals(main.cells)
    a_p1 = [c for c in cells.to_pylist() if c["model"] == "A" and c["prompt_name"].startswith("p1")]
    assert [(c["runs_total"], c["runs_ok"], c["first_date"], c["last_date"]) for c in a_p1] == [
        (4, 3, D1, D2)
    ]

    m = json.loads(main.manifest_path.read_text(encoding="utf-8"))
    assert m == main.manifest
    assert m["seed"] == 20260601 and m["replicates"] == 10_000
    assert m["options"]["min_runs"] == {
        "value": 2, "unit": "successful runs per cell",
        "description": m["options"]["min_runs"]["description"],
    }
    assert set(m["options"]) >= {"min_runs", "min_prompts", "date_from", "date_to", "campaigns",
                                 "models", "panel", "seed", "replicates"}
    assert all(v["unit"] for v in m["options"].values())
    assert m["data_window"]["first_measurement_date"] == "2026-03-01"
    assert m["data_window"]["last_measurement_date"] == "2026-03-09"
    assert m["generated_at"] == "2026-06-01T12:00:00+00:00"
    assert m["irbench_version"] == importlib.metadata.version("irbench")
    assert m["input"]["runs_in_panel"] == 25
    assert m["input"]["successful_runs_in_panel"] == 24
    assert m["input"]["campaigns"] == ["c1", "c2"]
    assert m["output"] == {"cells": 9, "cells_included": 9, "models_included": 2,
                           "models_excluded": 1}

    real = res.panels["real/skills v2"]
    assert real.directory == out / panel_dirname("real/skills v2")
    assert real.directory.parent == out and "/" not in real.directory.name
    assert real.models.models == ["A"]
    assert real.manifest["data_window"]["first_measurement_date"] == "2026-03-02"


def test_filters_and_panel(tmp_path: Path) -> None:
    data = tmp_path / "data"
    build_store(data)
    res = run_analysis(
        data, tmp_path / "o1",
        AnalysisOptions(date_to=D2, campaigns=["c1"], panel="main", min_prompts=2),
    )
    assert set(res.panels) == {"main"}
    main = res.panels["main"]
    assert main.models.models == ["A", "C", "B"]  # C enters with min_prompts=2; ties by name
    assert main.manifest["data_window"]["last_measurement_date"] == "2026-03-02"
    assert main.manifest["options"]["campaigns"]["value"] == ["c1"]

    with pytest.raises(NoRunsError, match="panel 'nope'.*panels present"):
        run_analysis(data, tmp_path / "o2", AnalysisOptions(panel="nope"))
    with pytest.raises(NoRunsError, match="models"):
        run_analysis(data, tmp_path / "o3", AnalysisOptions(models=["ghost"]))


def test_no_runs_message(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    with pytest.raises(NoRunsError, match=r"empty.*irbench run") as info:
        run_analysis(empty, tmp_path / "out", AnalysisOptions())
    assert isinstance(info.value, StorageError)
    empty.mkdir()
    with pytest.raises(NoRunsError, match=str(empty)):
        run_analysis(empty, tmp_path / "out", AnalysisOptions())
    assert not (tmp_path / "out").exists()


def test_rerun_replaces_outputs(tmp_path: Path) -> None:
    data, out = tmp_path / "data", tmp_path / "out"
    build_store(data)
    first = run_analysis(data, out, AnalysisOptions(), now=lambda: FIXED_NOW)
    later = FIXED_NOW + dt.timedelta(days=1)
    second = run_analysis(data, out, AnalysisOptions(min_prompts=2), now=lambda: later)
    m = json.loads((out / "main" / "manifest.json").read_text())
    assert m["generated_at"].startswith("2026-06-02")
    assert m["options"]["min_prompts"]["value"] == 2
    assert pq.read_table(second.panels["main"].models_path).num_rows == 3
    assert first.panels["main"].models.included.num_rows == 2
    assert not list(out.rglob("*.tmp"))


def test_options_validation() -> None:
    with pytest.raises(ValidationError, match="after date_to"):
        AnalysisOptions(date_from=D3, date_to=D1)
    with pytest.raises(ValidationError):
        AnalysisOptions(min_runs=1)
    with pytest.raises(ValidationError):
        AnalysisOptions(min_run=3)  # type: ignore[call-arg]  # typo rejected
    with pytest.raises(ValidationError, match="empty list"):
        AnalysisOptions(models=[])
    opts = AnalysisOptions()
    with pytest.raises(ValidationError):
        opts.seed = 1  # type: ignore[misc]  # frozen

"""Cells and the model table: hand-built run tables, and the study's published data."""

from __future__ import annotations

import csv
import datetime as dt
import json
import re
from io import StringIO
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from rich.console import Console

from analysis.errors import AnalysisError
from analysis.tables.cells import CELL_SCHEMA, MIN_RUNS_METADATA_KEY, build_cells
from analysis.report.terminal import excluded_lines, models_rich_table
from analysis.tables.models import model_table

ARTIFACT = Path("/work/shared/paper-artifact/results")
D1 = dt.date(2026, 3, 1)


def run_table(rows: list[dict[str, Any]]) -> pa.Table:
    """A minimal run table with the columns build_cells reads; defaults fill the rest."""
    defaults: dict[str, Any] = {
        "campaign": "c1",
        "panel": "p",
        "model": "m",
        "prompt_sha256": "sha-a",
        "prompt_name": "a.prompt",
        "budget_max_tokens": None,
        "outcome": "ok",
        "parse_outcome": "ok",
        "ir_json": "{}",
        "measurement_date": D1,
    }
    full = []
    for i, r in enumerate(rows):
        row = {**defaults, "run_id": f"r{i}", "run_index": i, **r}
        ids = row.pop("ids", [])
        row.setdefault("node_ids", sorted(set(ids)))
        row.setdefault("node_count", len(ids))
        full.append(row)
    schema = pa.schema(
        [
            ("run_id", pa.string()),
            ("campaign", pa.string()),
            ("panel", pa.string()),
            ("model", pa.string()),
            ("prompt_sha256", pa.string()),
            ("prompt_name", pa.string()),
            ("budget_max_tokens", pa.int64()),
            ("run_index", pa.int64()),
            ("outcome", pa.string()),
            ("parse_outcome", pa.string()),
            ("ir_json", pa.string()),
            ("node_ids", pa.list_(pa.string())),
            ("node_count", pa.int64()),
            ("measurement_date", pa.date32()),
        ]
    )
    return pa.Table.from_pylist(full, schema=schema)


# ---------------------------------------------------------------- build_cells


def test_cell_metrics_and_success_rule() -> None:
    runs = run_table(
        [
            {"ids": ["a", "b", "c"]},
            {"ids": ["a", "b", "d"], "measurement_date": dt.date(2026, 3, 3)},
            {"ids": ["a"]},
            # failures: not counted as successful runs, but counted in runs_total and dates
            {"ids": [], "outcome": "timeout_read", "parse_outcome": "not_attempted", "ir_json": None},
            {"ids": ["z"], "parse_outcome": "invalid_json", "ir_json": None},
            {"ids": ["z"], "parse_outcome": "ok", "ir_json": None, "measurement_date": dt.date(2026, 2, 27)},
            {"ids": ["a", "b", "c"], "parse_outcome": "repaired"},  # repaired counts
        ]
    )
    cells = build_cells(runs)
    assert cells.schema.equals(CELL_SCHEMA)
    assert cells.schema.metadata[MIN_RUNS_METADATA_KEY] == b"2"
    (c,) = cells.to_pylist()
    assert (c["runs_total"], c["runs_ok"], c["included"]) == (7, 4, True)
    # ok runs {abc},{abd},{a},{abc}; pairs (1,2)=1/2 (1,3)=1/3 (1,4)=1 (2,3)=1/3 (2,4)=1/2
    # (3,4)=1/3 -> sum 3 over 6 pairs = 0.5; ID-stability |{a}| / |{a,b,c,d}| = 1/4
    assert c["mean_jaccard"] == pytest.approx(0.5)
    assert c["id_stability"] == pytest.approx(0.25)
    assert c["node_set_perfect"] is False
    # counts 3,3,1,3: mean 2.5, population SD sqrt(0.75)
    assert c["mean_nodes"] == pytest.approx(2.5)
    assert c["std_nodes"] == pytest.approx(0.75**0.5)
    # pairs: (3,3)=1 (3,1)=1/3 (3,3)=1 (3,1)=1/3 (3,3)=1 (1,3)=1/3 -> 4/6; equal share 3/6
    assert c["count_agreement"] == pytest.approx(4 / 6)
    assert c["count_equal_share"] == pytest.approx(0.5)
    assert (c["first_date"], c["last_date"]) == (dt.date(2026, 2, 27), dt.date(2026, 3, 3))


def test_cells_split_by_key_and_null_metrics_below_two_runs() -> None:
    runs = run_table(
        [
            {"ids": ["a"]},
            {"ids": ["a"]},
            {"ids": ["a"], "budget_max_tokens": 1500},  # another budget: its own cell
            {"ids": ["a"], "campaign": "c2"},
            {"ids": ["a"], "campaign": "c2", "parse_outcome": "schema_invalid", "ir_json": None},
            {"ids": ["x"], "model": "m2"},
            {"ids": ["x"], "model": "m2"},
            {"ids": ["x"], "model": "m2"},
        ]
    )
    cells = build_cells(runs, min_runs=3).to_pylist()
    keyed = {(c["campaign"], c["model"], c["budget_max_tokens"]): c for c in cells}
    assert set(keyed) == {("c1", "m", None), ("c1", "m", 1500), ("c2", "m", None), ("c1", "m2", None)}
    assert keyed[("c1", "m", None)]["included"] is False  # 2 ok < min_runs 3
    assert keyed[("c1", "m", None)]["node_set_perfect"] is True  # metrics still computed
    for k in [("c1", "m", 1500), ("c2", "m", None)]:
        assert keyed[k]["runs_ok"] == 1
        assert keyed[k]["mean_jaccard"] is None and keyed[k]["std_nodes"] is None
        assert keyed[k]["node_set_perfect"] is None
    assert keyed[("c1", "m2", None)]["included"] is True
    with pytest.raises(AnalysisError, match="min_runs"):
        build_cells(runs, min_runs=1)


def test_duplicate_run_ids_count_once() -> None:
    runs = run_table([{"ids": ["a"]}, {"ids": ["b"]}])
    doubled = pa.concat_tables([runs, runs])
    (c,) = build_cells(doubled).to_pylist()
    assert (c["runs_total"], c["runs_ok"], c["mean_jaccard"]) == (2, 2, 0.0)


def test_missing_columns_named() -> None:
    with pytest.raises(AnalysisError, match="node_ids"):
        build_cells(run_table([{"ids": ["a"]}]).drop_columns(["node_ids"]))


# ---------------------------------------------------------------- model table


def _cells_for(model: str, jaccards: list[list[list[str]]]) -> list[dict[str, Any]]:
    rows = []
    for p, runs in enumerate(jaccards):
        for ids in runs:
            rows.append({"model": model, "prompt_sha256": f"sha{p}", "prompt_name": f"p{p}", "ids": ids})
    return rows


def test_model_table_ranks_ties_and_exclusions() -> None:
    same = [["a"], ["a"]]
    half = [["a"], ["a", "b"]]  # Jaccard 0.5, ID-stability 0.5
    rows = (
        _cells_for("zeta", [same, same, same])  # 1.0
        + _cells_for("alpha", [same, same, same])  # 1.0, tie with zeta -> by name
        + _cells_for("mid", [same, half, half, half])  # (1 + 1.5)/4 = 0.625
        + _cells_for("few", [same, same])  # 2 prompts: excluded
        + _cells_for("none", [[["a"]], [["a"]], [["a"]]])  # 1 run per prompt: 0 included
    )
    runs = run_table(rows)
    mt = model_table(build_cells(runs))
    inc = mt.included.to_pylist()
    assert [r["model"] for r in inc] == ["alpha", "zeta", "mid"]
    assert [r["rank"] for r in inc] == [1, 2, 3]
    mid = inc[2]
    assert mid["mean_jaccard"] == pytest.approx(0.625)
    assert mid["id_stability"] == pytest.approx(0.625)
    assert (mid["perfect"], mid["n_prompts"], mid["n_cells"]) == (1, 4, 4)
    assert mid["mean_nodes"] == pytest.approx((1 + 1.5 * 3) / 4)
    exc = {r["model"]: r for r in mt.excluded.to_pylist()}
    assert exc["few"]["reason"] == "2 prompts with ≥2 successful runs; needs ≥3"
    assert (exc["few"]["n_prompts"], exc["few"]["runs_ok"]) == (2, 4)
    assert exc["none"]["reason"] == "0 prompts with ≥2 successful runs; needs ≥3"
    assert exc["none"]["runs_ok"] == 3

    # An exact tie on both Jaccard and ID-stability (the same run pattern with other ids and
    # another run order: J = (1 + 1/2 + 1/2)/3 = 2/3, stab = 1/2) -> the model name decides.
    tie_rows = _cells_for("b", [[["a"], ["a"], ["a", "b"]]] * 3) + _cells_for(
        "a", [[["x"], ["x", "y"], ["x"]]] * 3
    )
    t = model_table(build_cells(run_table(tie_rows)))
    assert t.models == ["a", "b"]

    # min_prompts lowers the bar; min_runs is read from the cell table
    loose = model_table(build_cells(runs, min_runs=2), min_prompts=2)
    assert "few" in loose.models
    strict = model_table(build_cells(runs, min_runs=3), min_prompts=3)
    assert strict.models == []
    assert all("with ≥3 successful runs" in r for r in strict.excluded.column("reason").to_pylist())


def test_model_table_stab_breaks_jaccard_tie() -> None:
    # Equal mean Jaccard (0.8); Y has the higher mean ID-stability, so Y ranks first although
    # the name order alone would put X first.
    cells = pa.Table.from_pylist(
        [_cell_row(m, f"s{i}", 0.8, stab) for m, stab in (("X", 0.5), ("Y", 0.7)) for i in range(3)],
        schema=CELL_SCHEMA,
    )
    assert model_table(cells).models == ["Y", "X"]


def _cell_row(model: str, sha: str, jac: float, stab: float) -> dict[str, Any]:
    return {
        "panel": "p", "campaign": "c", "model": model, "prompt_sha256": sha, "prompt_name": sha,
        "budget_max_tokens": None, "runs_total": 3, "runs_ok": 3, "included": True,
        "mean_jaccard": jac, "id_stability": stab, "node_set_perfect": False, "mean_nodes": 5.0,
        "std_nodes": 0.0, "count_agreement": 1.0, "count_equal_share": 1.0,
        "first_date": D1, "last_date": D1,
    }


def test_model_table_rejects_mixed_panels_and_extends() -> None:
    rows = _cells_for("m", [[["a"], ["a"]]] * 3)
    runs = run_table(rows + [{**r, "panel": "q"} for r in rows])
    with pytest.raises(AnalysisError, match="one panel"):
        model_table(build_cells(runs))
    mt = model_table(build_cells(run_table(rows)))
    ext = mt.with_columns(ci_low=[0.9], rank_held=pa.array([0.5]))
    assert ext.included.column_names[-2:] == ["ci_low", "rank_held"]
    assert ext.included.column("ci_low").to_pylist() == [0.9]
    with pytest.raises(AnalysisError, match="1 models"):
        mt.with_columns(bad=[1, 2])


def test_render() -> None:
    rows = _cells_for("good", [[["a"], ["a"]]] * 3) + _cells_for("few", [[["a"], ["a"]]])
    mt = model_table(build_cells(run_table(rows)))
    buf = StringIO()
    Console(file=buf, width=200, color_system=None).print(models_rich_table(mt, "Panel p"))
    text = buf.getvalue()
    assert "Panel p" in text and "good" in text and "3/3" in text and "1.000" in text
    assert "node-set-perfect" in text
    assert "perfect reproducibility" not in text.lower()
    assert excluded_lines(mt) == [
        "few: 1 prompt with ≥2 successful runs; needs ≥3 (2 successful runs in total)"
    ]


# ---------------------------------------------------------------- published data


def _load_artifact_runs() -> pa.Table:
    """Raw IRs → run table; slug = model with its first ':' as '_' (mapped back via the CSVs)."""
    slug_to_model = {}
    for f in ARTIFACT.glob("ir_stability*.csv"):
        with open(f, newline="") as fh:
            for r in csv.DictReader(fh):
                slug_to_model[r["model"].replace(":", "_", 1)] = r["model"]
    rows = []
    for path in sorted(ARTIFACT.glob("irs/*/*.json")):
        slug = path.parent.name
        m = re.fullmatch(r"(.+)_r(\d+)\.json", path.name)
        assert m, path
        with open(path, encoding="utf-8") as fh:
            ir = json.load(fh)
        ids = [n["id"] for n in ir["nodes"]]
        stem = m.group(1)  # e.g. 'code_review.prompt'; the CSV says 'code_review.prompt.rtpl'
        rows.append(
            {
                "run_id": f"{slug}/{path.name}",
                "model": slug_to_model.get(slug, slug),
                "prompt_sha256": stem,
                "prompt_name": stem + ".rtpl",
                "run_index": int(m.group(2)),
                "node_ids": sorted(set(ids)),
                "node_count": len(ids),
                "ir_json": json.dumps(ir),
            }
        )
    return run_table(rows)


def test_recompute_published_cells() -> None:
    assert ARTIFACT.is_dir(), f"paper artifact not found at {ARTIFACT}"
    cells = build_cells(_load_artifact_runs()).to_pylist()
    csv_rows = []
    for f in sorted(ARTIFACT.glob("ir_stability*.csv")):
        with open(f, newline="") as fh:  # CRLF handled by the csv module
            csv_rows += [{**r, "file": f.name} for r in csv.DictReader(fh)]
    assert csv_rows and all("\r" not in v for r in csv_rows for v in r.values())

    # CSV values are rounded: Jaccard/ID-stability to 3 decimals, node stats to 2.
    tol = {"mean_jaccard": 5e-4, "id_stability": 5e-4, "mean_nodes": 5e-3, "std_nodes": 5e-3}
    candidates = matched = 0
    by_file: dict[str, int] = {}
    unmatched = []
    for c in cells:
        if c["runs_ok"] < 2:
            continue
        cands = [
            r for r in csv_rows
            if r["model"] == c["model"] and r["prompt"] == c["prompt_name"]
            and int(r["successful_runs"]) == c["runs_ok"]
        ]
        if not cands:
            continue
        candidates += 1
        hits = [
            r for r in cands
            if all(abs(float(r[k]) - c[k]) <= t + 1e-9 for k, t in tol.items())
        ]
        if hits:
            matched += 1
            by_file[hits[0]["file"]] = by_file.get(hits[0]["file"], 0) + 1
        else:
            unmatched.append((c["model"], c["prompt_name"], c["runs_ok"], c["mean_jaccard"]))
    print(f"published cells recomputed: {matched}/{candidates} matched; by CSV: {by_file}")
    # Every cell whose persisted run count equals a CSV's successful_runs reproduces it.
    assert unmatched == []
    assert matched == candidates == 89
    # Spot check, computed by hand from the three IR files of this cell:
    # ministral-3_8b gen_003: id-stability 7/16 = 0.4375 (the CSV rounds half-to-even: 0.438)
    (spot,) = [
        c for c in cells
        if c["model"] == "ministral-3:8b" and c["prompt_name"].startswith("gen_003")
    ]
    assert spot["id_stability"] == 0.4375


def _reference_model_rows(cells: pa.Table, min_prompts: int):
    """The previous row-wise aggregation (dicts of Python lists), as an independent reference."""
    import numpy as np

    col = {c: cells.column(c).to_pylist() for c in (
        "model", "prompt_sha256", "included", "runs_ok", "mean_jaccard", "id_stability",
        "node_set_perfect", "mean_nodes")}
    by_model: dict[str, list[int]] = {}
    for i, m in enumerate(col["model"]):
        by_model.setdefault(m, []).append(i)
    inc_rows, exc = [], []
    for model, idx in by_model.items():
        inc = [i for i in idx if col["included"][i]]
        prompts = {col["prompt_sha256"][i] for i in inc}
        if len(prompts) < min_prompts:
            exc.append((model, len(prompts), len(inc), sum(col["runs_ok"][i] for i in idx)))
            continue
        def f(c: str, inc: list[int] = inc) -> float:
            return float(np.array([col[c][i] for i in inc], dtype=np.float64).mean())

        inc_rows.append((model, len(prompts), len(inc), f("mean_jaccard"), f("id_stability"),
                         sum(bool(col["node_set_perfect"][i]) for i in inc), f("mean_nodes")))
    inc_rows.sort(key=lambda r: (-r[3], -r[4], r[0]))
    exc.sort(key=lambda r: (-r[1], r[0]))
    return inc_rows, exc


@pytest.mark.parametrize("seed", [0, 1])
def test_model_table_columnwise_equals_rowwise_reference(seed: int) -> None:
    import numpy as np

    rng = np.random.default_rng(seed)
    n = 3000
    d = dt.date(2026, 1, 1)
    table = pa.table({
        "panel": ["p"] * n, "campaign": ["c"] * n,
        "model": [f"m{int(i)}" for i in rng.integers(0, 40, n)],
        "prompt_sha256": [f"{int(i):04d}" for i in rng.integers(0, 30, n)],
        "prompt_name": ["x"] * n, "budget_max_tokens": pa.nulls(n, pa.int64()),
        "runs_total": [3] * n, "runs_ok": rng.integers(0, 4, n).tolist(),
        "included": (rng.random(n) < 0.7).tolist(),
        "mean_jaccard": rng.choice([1.0, 0.1, 0.3, 0.7], n).tolist(),
        "id_stability": rng.random(n).tolist(),
        "node_set_perfect": [None if r < 0.1 else bool(r < 0.5) for r in rng.random(n)],
        "mean_nodes": [None if r < 0.05 else float(r) for r in rng.random(n)],
        "std_nodes": [0.0] * n, "count_agreement": [None] * n, "count_equal_share": [None] * n,
        "first_date": [d] * n, "last_date": [d] * n}, schema=CELL_SCHEMA)
    for min_prompts in (1, 18, 22):
        got = model_table(table, min_prompts=min_prompts, min_runs=2)
        ref_inc, ref_exc = _reference_model_rows(table, min_prompts)
        rows = [tuple(r.values())[1:] for r in got.included.to_pylist()]
        assert len(rows) == len(ref_inc)
        for a, b in zip(rows, ref_inc):  # NaN-aware exact equality
            assert a[:3] == b[:3] and a[5] == b[5]
            np.testing.assert_array_equal([a[3], a[4], a[6]], [b[3], b[4], b[6]])
        assert [tuple(r.values())[:4] for r in got.excluded.to_pylist()] == ref_exc
        assert got.included.column("rank").to_pylist() == list(range(1, len(rows) + 1))

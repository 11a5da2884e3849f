"""build_cells (vectorised, integer codes) against a plain per-cell Python reference built from
analysis.metrics.agreement, on random run tables with repeated run_ids, null budgets, failed
runs, null id lists, unordered run indices and prompt-name ties."""

from __future__ import annotations

import datetime as dt
import random
from collections import Counter
from typing import Any

import numpy as np
import pytest

from analysis.metrics.agreement import count_agreement, node_set_agreement
from analysis.tables.cells import build_cells
from storage.outcomes import run_succeeded
from tests.analysis.test_cells import run_table


def reference_cells(rows: list[dict[str, Any]], min_runs: int) -> list[dict[str, Any]]:
    last = {r["run_id"]: i for i, r in enumerate(rows)}
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for i in sorted(last.values()):
        r = rows[i]
        key = (r["panel"], r["campaign"], r["model"], r["prompt_sha256"], r["budget_max_tokens"])
        groups.setdefault(key, []).append(r)
    out = []
    for key, rs in groups.items():
        rs = sorted(rs, key=lambda r: r["run_index"])
        ok = [r for r in rs if run_succeeded(r["parse_outcome"], r["ir_json"])]
        cell = dict(zip(("panel", "campaign", "model", "prompt_sha256", "budget_max_tokens"), key))
        cell.update(prompt_name=Counter(r["prompt_name"] for r in rs).most_common(1)[0][0],
                    runs_total=len(rs), runs_ok=len(ok), included=len(ok) >= min_runs,
                    first_date=min(r["measurement_date"] for r in rs),
                    last_date=max(r["measurement_date"] for r in rs))
        metrics = dict.fromkeys(("mean_jaccard", "id_stability", "node_set_perfect", "mean_nodes",
                                 "std_nodes", "count_agreement", "count_equal_share"))
        if len(ok) >= 2:
            agg = node_set_agreement([frozenset(r["node_ids"] or ()) for r in ok])
            counts = [int(r["node_count"] or 0) for r in ok]
            ca, eq = count_agreement(counts)
            metrics.update(mean_jaccard=agg.mean_jaccard, id_stability=agg.id_stability,
                           node_set_perfect=agg.node_set_perfect,
                           mean_nodes=float(np.mean(np.array(counts, float))),
                           std_nodes=float(np.std(np.array(counts, float))),
                           count_agreement=ca, count_equal_share=eq)
        out.append({**cell, **metrics})
    out.sort(key=lambda c: (c["panel"], c["campaign"], c["model"], c["prompt_name"],
                            c["prompt_sha256"],
                            -1 if c["budget_max_tokens"] is None else c["budget_max_tokens"]))
    return out


@pytest.mark.parametrize("seed", range(40))
def test_build_cells_equals_the_per_cell_reference(seed):
    rng = random.Random(seed)
    rows = []
    for _ in range(rng.randint(1, 60)):
        row = {"run_id": f"r{rng.randint(0, 40)}", "run_index": rng.randint(0, 6),
               "model": rng.choice("mn"), "campaign": rng.choice(["c1", "c2"]),
               "prompt_sha256": rng.choice(["s1", "s2", "s3"]),
               "prompt_name": rng.choice(["a", "b", "z"]),
               "budget_max_tokens": rng.choice([None, 0, 100]),
               "parse_outcome": rng.choice(["ok", "ok", "repaired", "failed"]),
               "ir_json": rng.choice(["{}", "{}", None]),
               "ids": rng.sample(["x", "y", "w", "q", "é"], rng.randint(0, 5)),
               "measurement_date": dt.date(2026, 3, rng.randint(1, 9))}
        if rng.random() < 0.1:
            row["node_ids"], row["node_count"] = None, None
        rows.append(row)
    table = run_table(rows)
    for min_runs in (2, 3):
        assert build_cells(table, min_runs).to_pylist() == reference_cells(table.to_pylist(),
                                                                          min_runs)

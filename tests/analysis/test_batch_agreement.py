"""The batched cell metrics (analysis.metrics.batch, used by the normalised table) against the
per-cell reference functions of analysis.metrics.agreement on random cells, bit for bit."""

from __future__ import annotations

import numpy as np

from analysis.metrics.agreement import (
    count_agreement,
    node_set_agreement,
    normalised_jaccard,
)
from analysis.metrics.batch import cell_pairs, count_agreement_many, set_agreement
from analysis.tables.audit import _RawCell, normalised_table

IDS = ["RULE:a", "rule-a", "A", "section:b", "b", "", "Ünï", "unï", "c_d", "C-D", "日本", "x"]


def _random_cells(rng: np.random.Generator, n: int) -> list[list[list[str]]]:
    cells = []
    for _ in range(n):
        runs = int(rng.integers(2, 8))
        cells.append([[IDS[i] for i in rng.integers(0, len(IDS), rng.integers(0, 6))]
                      for _ in range(runs)])
    return cells


def test_set_and_count_metrics_equal_the_per_cell_functions():
    rng = np.random.default_rng(3)
    cells = _random_cells(rng, 300)
    vocab = {s: k for k, s in enumerate(IDS)}
    run_cell = np.repeat(np.arange(len(cells)), [len(c) for c in cells])
    entries = {(r, vocab[i]) for r, ids in enumerate(ids for c in cells for ids in c) for i in ids}
    er, ec = (np.array(x, np.int64) for x in zip(*sorted(entries)))
    pairs = cell_pairs(run_cell, len(cells))
    got = set_agreement(pairs, er, ec, len(run_cell))
    counts = np.array([len(ids) for c in cells for ids in c], np.int64)
    ca, eq = count_agreement_many(pairs, counts)
    for k, c in enumerate(cells):
        ref = node_set_agreement([frozenset(ids) for ids in c])
        assert got.mean_jaccard[k] == ref.mean_jaccard
        assert got.id_stability[k] == ref.id_stability
        assert bool(got.node_set_perfect[k]) == ref.node_set_perfect
        assert (ca[k], eq[k]) == count_agreement([len(ids) for ids in c])


def test_normalised_table_equals_the_per_cell_functions():
    rng = np.random.default_rng(4)
    cells = _random_cells(rng, 200)
    raw = [_RawCell("c", f"m{k}", "p", "s", [{"node_ids": ids, "node_count": len(ids) + k % 3}
                                             for ids in c]) for k, c in enumerate(cells)]
    t = normalised_table(raw).to_pylist()
    for row, c, rc in zip(t, cells, raw):
        sets = [frozenset(ids) for ids in c]
        for variant in ("ascii", "unicode"):
            ref = normalised_jaccard(sets, variant)
            assert row[f"jaccard_norm_{variant}"] == ref.mean_jaccard
            assert row[f"empty_ids_{variant}"] == ref.empty_ids
            assert row[f"collisions_{variant}"] == ref.colliding_ids
        exact = node_set_agreement(sets)
        assert (row["jaccard_exact"], row["id_stability"]) == (exact.mean_jaccard,
                                                              exact.id_stability)
        assert (row["count_agreement"], row["count_equal_share"]) == count_agreement(
            [r["node_count"] for r in rc.runs])

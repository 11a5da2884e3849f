"""Drift decomposition: label order, lenient parsing, aggregates by hand, real artifact IRs."""

import json

import numpy as np
import pytest

from tests.support.paths import ARTIFACT

from analysis.metrics.drift import (
    CLASSES,
    cell_drift,
    classify_pair,
    run_ir_from_json,
    summarise_drift,
)

IRS = ARTIFACT / "results" / "irs"


def node(i, kind="Rule", label="x", line=1, **meta):
    return {"id": i, "kind": kind, "label": label, "meta": {"inferred": False, **meta},
            "range": {"start_line": line, "start_col": 0, "end_line": line, "end_col": 5}}


def ir(*nodes):
    return run_ir_from_json(json.dumps({"version": 1, "nodes": list(nodes)}))


BASE = ir(node("A"), node("B", kind="Condition", line=2))


def test_label_order():
    # count differs AND ids differ → count (testing ids first would mislabel it)
    assert classify_pair(BASE, ir(node("A"), node("C", "Condition"), node("D"))) == ("count", False)
    # same count, different kind multiset → count
    assert classify_pair(BASE, ir(node("A"), node("B", line=2)))[0] == "count"
    # same count and kinds, ids differ → id_label
    assert classify_pair(BASE, ir(node("A"), node("b", "Condition", line=2)))[0] == "id_label"
    # same ids, range differs → metadata
    assert classify_pair(BASE, ir(node("A"), node("B", "Condition", line=3)))[0] == "metadata"
    # same ids, a meta field differs (priority 2 vs "2" counts) → metadata
    assert classify_pair(ir(node("A", priority=2)), ir(node("A", priority="2")))[0] == "metadata"
    # label text only → agree, reported as label-only
    assert classify_pair(BASE, ir(node("A", label="y"), node("B", "Condition", line=2))) == (
        "agree", True)
    assert classify_pair(BASE, ir(node("B", "Condition", line=2), node("A"))) == ("agree", False)


def test_duplicates_and_lenient_parsing():
    dup = ir(node("A"), node("A", line=4))
    assert dup.node_count == 2 and dup.ids == frozenset({"A"})
    assert classify_pair(dup, ir(node("A"), node("A", line=5)))[0] == "metadata"
    empty = run_ir_from_json('{"nodes": "oops"}')
    assert empty.node_count == 0 and empty.ids == frozenset()
    assert classify_pair(empty, run_ir_from_json("{}")) == ("agree", False)
    bare = run_ir_from_json('{"nodes": [{"id": "X"}, 3]}')
    assert bare.node_count == 1 and bare.nodes_by_id["X"][0][0] == (None, None, None, None)
    with pytest.raises(ValueError):
        run_ir_from_json("not json")


def test_cell_and_summary_by_hand():
    a = BASE
    b = ir(node("A"), node("B", "Condition", line=2))             # agrees with a
    c = ir(node("A"), node("C", "Condition", line=2))             # id drift vs a, b
    cell1 = cell_drift([a, b, c])                                 # pairs: agree, id, id
    np.testing.assert_array_equal(cell1.counts, [0, 2, 0])
    assert cell1.agree == 1 and cell1.n_pairs == 3
    np.testing.assert_allclose(cell1.shares, [0, 1, 0])
    d = ir(node("A"), node("B", "Condition", line=9))             # metadata vs a
    e = ir(node("A"))                                             # count vs a and d
    cell2 = cell_drift([a, d, e])                                 # meta, count, count
    np.testing.assert_allclose(cell2.shares, [2 / 3, 0, 1 / 3])
    cell3 = cell_drift([a, b])                                    # all agree
    np.testing.assert_allclose(cell3.shares, [0, 0, 0])
    s = summarise_drift([cell1, cell2, cell3])
    np.testing.assert_allclose(s.macro_all, [(2 / 3) / 3, 1 / 3, (1 / 3) / 3])
    np.testing.assert_allclose(s.pooled, [2 / 5, 2 / 5, 1 / 5])
    np.testing.assert_allclose(s.macro_disagreeing, [1 / 3, 1 / 2, 1 / 6])
    assert (s.n_cells, s.n_cells_disagreeing, s.n_pairs, s.n_disagreeing_pairs) == (3, 2, 7, 5)
    assert s.pooled.sum() == pytest.approx(1.0) and s.macro_disagreeing.sum() == pytest.approx(1.0)
    assert s.macro_all.sum() == pytest.approx(2 / 3)  # the agreeing cell contributes zeros
    empty = summarise_drift([])
    assert empty.n_cells == 0 and np.all(np.isnan(empty.macro_disagreeing))


@pytest.mark.usefixtures("artifact_dir")  # a clear error when the artifact is not there
def test_real_artifact_cell():
    files = sorted((IRS / "gemma3_12b").glob("content_moderation.prompt_r*.json"))
    assert len(files) == 3
    runs = [run_ir_from_json(f.read_text()) for f in files]
    cell = cell_drift(runs)
    assert cell.n_pairs == 3 and cell.counts.sum() + cell.agree == 3
    assert all(r.node_count > 0 for r in runs)
    assert len(CLASSES) == 3

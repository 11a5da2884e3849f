"""'A successful run' has one definition (storage.records); its scalar and columnar forms agree."""

from __future__ import annotations

import itertools

import pyarrow as pa

from storage.outcomes import run_succeeded, succeeded_mask
from storage.records import ParseOutcome, RunRecord


def test_scalar_and_columnar_forms_agree_on_every_combination() -> None:
    outcomes = [*(p.value for p in ParseOutcome), None]
    irs = ['{"nodes": []}', None]
    combos = list(itertools.product(outcomes, irs))
    table = pa.table({"parse_outcome": [o for o, _ in combos], "ir_json": [i for _, i in combos]})
    mask = succeeded_mask(table).to_pylist()
    scalar = [run_succeeded(o, i) for o, i in combos]
    assert mask == scalar
    # exactly ok/repaired with an IR present
    assert {c for c, ok in zip(combos, scalar, strict=True) if ok} == {("ok", '{"nodes": []}'), ("repaired", '{"nodes": []}')}


def test_the_record_property_is_the_same_predicate() -> None:
    base = RunRecord.model_construct(parse_outcome=ParseOutcome.REPAIRED, ir_json="{}")
    assert base.succeeded
    assert not RunRecord.model_construct(parse_outcome=ParseOutcome.REPAIRED, ir_json=None).succeeded
    assert not RunRecord.model_construct(parse_outcome=ParseOutcome.TRUNCATED, ir_json="{}").succeeded


def test_a_dictionary_encoded_column_works_too() -> None:
    # compacted Parquet may hand back dictionary-encoded strings
    col = pa.array(["ok", "invalid_json", "repaired"]).dictionary_encode()
    table = pa.table({"parse_outcome": col, "ir_json": ["{}", "{}", None]})
    assert succeeded_mask(table).to_pylist() == [True, False, False]


def test_failed_is_not_ok_or_no_ir() -> None:
    from storage.records import Outcome

    ok = RunRecord.model_construct(outcome=Outcome.OK, parse_outcome=ParseOutcome.OK, ir_json="{}")
    truncated_but_parsed = RunRecord.model_construct(outcome=Outcome.TRUNCATED, parse_outcome=ParseOutcome.REPAIRED, ir_json="{}")
    no_ir = RunRecord.model_construct(outcome=Outcome.OK, parse_outcome=ParseOutcome.INVALID_JSON, ir_json=None)
    assert (ok.failed, truncated_but_parsed.failed, no_ir.failed) == (False, True, True)
    assert truncated_but_parsed.succeeded  # counts for the metrics, not as a clean call

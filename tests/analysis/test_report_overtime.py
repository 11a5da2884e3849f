"""The report's "Over time" section on a two-wave store with known ground truth: one model
revised between the waves (simulated with a higher rename rate, and served under a new digest),
one unchanged (the same digest and fingerprint in both waves)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import numpy as np

from analysis.report.doc import Table
from analysis.report.overtime import load_over_time, over_time_blocks, wave_sides
from analysis.waves.options import WaveOptions
from simulator.config import SimModel
from simulator.waves import panel_truths, simulate_node_sets
from storage.records import ParseOutcome
from storage.runs import RunStore
from storage.waves import record_wave
from tests.support.run_records import make_record

UTC = dt.timezone.utc
DIGEST = {("revised", 1): "1" * 64, ("revised", 2): "2" * 64, ("steady", 1): "5" * 64, ("steady", 2): "5" * 64}


def _store(root: Path) -> None:
    base = SimModel(drop_prob=0.1, add_rate=0.3)
    revised = base.model_copy(update={"rename_prob": 0.6})
    truths = panel_truths(20)
    rng = np.random.default_rng(5)
    records, i = [], 0
    for wave in (1, 2):
        for model, params in (("steady", base), ("revised", revised if wave == 2 else base)):
            for p, runs in enumerate(simulate_node_sets(truths, params, 4, rng)):
                for r, ids in enumerate(runs):
                    records.append(make_record(
                        i, model=model, campaign="c", run_id=f"{model}-{wave}-{p}-{r}", wave=wave,
                        prompt_sha256=f"{p:064x}", run_index=r, parse_outcome=ParseOutcome.OK,
                        ir_json="{}", node_ids=sorted(ids), served_model=model,
                        system_fingerprint="fp_1", served_digest=DIGEST[model, wave]))
                    i += 1
    RunStore(root).write(records)
    record_wave(root, "c", 2, "later", dt.datetime(2026, 4, 1, tzinfo=UTC))


def test_over_time_flags_the_revised_model_only_and_renders(tmp_path: Path) -> None:
    _store(tmp_path)
    (camp,) = load_over_time(tmp_path, WaveOptions(permutations=499, bootstrap_replicates=300))
    assert camp.campaign == "c" and camp.waves == (1, 2)
    (comparison,) = camp.comparisons
    changed = {m.model: m.changed for m in comparison.models}
    assert changed == {"revised": True, "steady": False}
    sides = wave_sides(camp)
    assert set(sides) == {"revised", "steady"} and set(sides["revised"]) == {1, 2}
    j1, j2 = sides["revised"][1].jaccard, sides["revised"][2].jaccard
    assert j1 is not None and j2 is not None and j2.point < j1.point  # renames lower the overlap
    assert {m.model: m.served_identity_changed for m in comparison.models} == {"revised": True, "steady": False}
    blocks = over_time_blocks([camp])
    (revisions,) = [b for b in blocks if isinstance(b, Table) and b.table_id == "over-time-revisions-c"]
    served = {row[0].text: row[revisions.columns.index("served identity")].text for row in revisions.rows}
    assert served == {"revised": f"served_digest: {'1' * 64} → {'2' * 64}", "steady": "same"}


def test_a_single_wave_store_has_no_over_time_section(tmp_path: Path) -> None:
    RunStore(tmp_path).write([make_record(i, campaign="c") for i in range(4)])
    assert load_over_time(tmp_path) == []

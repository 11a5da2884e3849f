"""Results for a given seed stay what they were when pinned (speed work must not move them).

The demo campaign (simulator, in-process) and the study's imported artifact are analysed with
seed 7 and 2,000 replicates; every output table (floats to 9 decimals; big tables as a digest)
and the manifest summary must equal ``tests/pinned/{demo,artifact}.json``. Run-order-dependent
columns (stabilisation: concurrent requests reach the simulator in varying order) are left out.
An intended change regenerates the files (``python -m tests.pinned.fingerprint``) and says why.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.pinned.fingerprint import HERE, artifact_outputs, demo_outputs, diff, fingerprint, table1

MAPPING = Path(__file__).resolve().parents[2] / "examples" / "artifact_campaigns.toml"


def _expected(name: str):
    return json.loads((HERE / f"{name}.json").read_text(encoding="utf-8"))


def test_demo_results_pinned(tmp_path, examples_dir):
    got = fingerprint(demo_outputs(tmp_path, examples_dir))
    problems = diff(_expected("demo"), got)
    assert not problems, "\n".join(problems[:20])


@pytest.mark.slow
def test_artifact_results_pinned(tmp_path, artifact_dir):
    got = fingerprint(artifact_outputs(tmp_path, artifact_dir, MAPPING))
    problems = diff(_expected("artifact"), got)
    assert not problems, "\n".join(problems[:20])


def test_fingerprint_sees_a_changed_value():
    """The pin can fail: one model's mean moved in the 8th decimal is reported."""
    expected = _expected("demo")
    changed = json.loads(json.dumps(expected))
    row = changed["demo"]["models"][0]
    row["mean_jaccard"] = round(row["mean_jaccard"] - 1e-8, 9)
    assert diff(expected, changed) == [
        f"/demo/models[0]/mean_jaccard: expected {expected['demo']['models'][0]['mean_jaccard']!r}, "
        f"got {row['mean_jaccard']!r}"]


@pytest.mark.slow
def test_percentile_interval_reproduces_table1(tmp_path, artifact_dir):
    """``interval="percentile"`` gives the study's Table 1 intervals, every model of it."""
    got = table1(fingerprint(artifact_outputs(tmp_path, artifact_dir, MAPPING,
                                              interval="percentile")))
    expected = _expected("table1_percentile")
    assert len(expected) == 8 and all(r["ci_method"] == "percentile" for r in expected)
    problems = diff(expected, got)
    assert not problems, "\n".join(problems[:20])
